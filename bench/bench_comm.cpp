// bench_comm: flowrun's gloo collectives (our rings over gloo's unbound buffers, gloo_comm.cpp) next to
// gloo's own algorithms, between two ranks on this host (two threads, TCP over loopback).
//
//   build/bin/bench_comm [--pairs N] [--mib a,b,c]
//
// Why it exists: since df13718 the gloo communicator no longer calls gloo::allreduce / allgather /
// broadcast (their buffers are gloo's own, so a collective waiting for a frozen peer could not be
// aborted); this measures what that costs. Per item (op, size) it runs ours and gloo's interleaved
// (A B A B ..., --pairs pairs, 7 by default) and prints each side's median time and the median of the
// per-pair ratios gloo / ours with its min-max (> 1: ours is faster).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>

#include "runtime/comm/communicator.h"

using namespace flowrun;
using clk = std::chrono::steady_clock;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : (v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]));
}

// One rank's two groups: our communicator and a bare gloo context, over the same kind of TCP device.
struct rank_side {
  std::unique_ptr<comm::communicator> ours;
  std::shared_ptr<gloo::rendezvous::Context> bare;
};

rank_side join(int rank, const std::string& dir) {
  rank_side s;
  comm::gloo_options o;
  o.rank = rank;
  o.world_size = 2;
  o.store_dir = dir + "/ours";
  o.timeout = std::chrono::seconds(60);
  s.ours = comm::gloo_communicator(o);
  gloo::transport::tcp::attr attr;
  attr.hostname = "127.0.0.1";
  auto dev = gloo::transport::tcp::CreateDevice(attr);
  s.bare = std::make_shared<gloo::rendezvous::Context>(rank, 2);
  s.bare->setTimeout(std::chrono::seconds(60));
  std::filesystem::create_directories(dir + "/bare");
  gloo::rendezvous::FileStore files(dir + "/bare");
  gloo::rendezvous::PrefixStore prefixed("bench", files);
  s.bare->connectFullMesh(prefixed, dev);
  return s;
}

uint32_t g_tag[2] = {1000, 1000};

// Runs `op` on both ranks at once and returns rank 0's seconds from a shared start.
double timed(rank_side (&sides)[2], const std::function<void(rank_side&, int)>& op) {
  double secs[2] = {0, 0};
  std::thread t1([&] {
    sides[1].ours->barrier();
    auto t0 = clk::now();
    op(sides[1], 1);
    secs[1] = std::chrono::duration<double>(clk::now() - t0).count();
  });
  sides[0].ours->barrier();
  auto t0 = clk::now();
  op(sides[0], 0);
  secs[0] = std::chrono::duration<double>(clk::now() - t0).count();
  t1.join();
  return std::max(secs[0], secs[1]);
}

}  // namespace

int main(int argc, char** argv) {
  int pairs = 7;
  std::vector<int> mib = {1, 16, 64};
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--pairs" && i + 1 < argc) pairs = std::max(1, std::atoi(argv[++i]));
    else if (a == "--mib" && i + 1 < argc) {
      mib.clear();
      std::stringstream ss(argv[++i]);
      for (std::string x; std::getline(ss, x, ',');) mib.push_back(std::max(1, std::atoi(x.c_str())));
    } else {
      std::fprintf(stderr, "usage: bench_comm [--pairs N] [--mib a,b,c]\n");
      return 2;
    }
  }
  const std::string dir = (std::filesystem::temp_directory_path() / ("bench_comm." + std::to_string(::getpid()))).string();
  std::filesystem::create_directories(dir + "/ours");
  rank_side sides[2];
  {
    std::thread t1([&] { sides[1] = join(1, dir); });
    sides[0] = join(0, dir);
    t1.join();
  }
  std::printf("two ranks on this host (threads, TCP over loopback), %d interleaved pairs per item\n", pairs);
  std::printf("%-12s %8s %14s %14s %22s\n", "op", "MiB", "ours ms", "gloo's ms", "gloo / ours (min-max)");
  for (int m : mib) {
    const int64_t n = static_cast<int64_t>(m) * (1 << 20) / 4;  // f32 elements of the full tensor
    std::vector<tensor> x(2), out(2);
    for (int r = 0; r < 2; ++r) {
      x[r] = tensor::from_floats({n}, std::vector<float>(static_cast<size_t>(n), 1.0f + r));
      out[r] = tensor::zeros({2 * n});
    }
    struct item {
      const char* name;
      std::function<void(rank_side&, int)> ours, bare;
    };
    std::vector<item> items = {
        {"all_reduce", [&](rank_side& s, int r) { s.ours->all_reduce(x[r]); },
         [&](rank_side& s, int r) {
           gloo::AllreduceOptions o(s.bare);
           o.setOutput(x[r].data<float>(), static_cast<size_t>(n));
           o.setReduceFunction([](void* c, const void* a, const void* b, size_t k) {
             auto* cc = static_cast<float*>(c);
             auto* aa = static_cast<const float*>(a);
             auto* bb = static_cast<const float*>(b);
             for (size_t i = 0; i < k; ++i) cc[i] = aa[i] + bb[i];
           });
           o.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
           o.setTag(++g_tag[r]);
           gloo::allreduce(o);
         }},
        {"all_gather", [&](rank_side& s, int r) { s.ours->all_gather(x[r], out[r]); },
         [&](rank_side& s, int r) {
           gloo::AllgatherOptions o(s.bare);
           o.setInput(x[r].data<float>(), static_cast<size_t>(n));
           o.setOutput(out[r].data<float>(), static_cast<size_t>(2 * n));
           o.setTag(++g_tag[r]);
           gloo::allgather(o);
         }},
        {"broadcast", [&](rank_side& s, int r) { s.ours->broadcast(x[r], 0); },
         [&](rank_side& s, int r) {
           gloo::BroadcastOptions o(s.bare);
           o.setOutput(x[r].data<float>(), static_cast<size_t>(n));
           o.setRoot(0);
           o.setTag(++g_tag[r]);
           gloo::broadcast(o);
         }},
    };
    for (auto& it : items) {
      timed(sides, it.ours);  // warm-up, both
      timed(sides, it.bare);
      std::vector<double> a, b, ratio;
      for (int p = 0; p < pairs; ++p) {
        a.push_back(timed(sides, it.ours));
        b.push_back(timed(sides, it.bare));
        ratio.push_back(b.back() / a.back());
      }
      std::printf("%-12s %8d %14.2f %14.2f %10.2fx (%.2f-%.2f)\n", it.name, m, 1e3 * median(a), 1e3 * median(b),
                  median(ratio), *std::min_element(ratio.begin(), ratio.end()),
                  *std::max_element(ratio.begin(), ratio.end()));
      std::fflush(stdout);
    }
  }
  std::filesystem::remove_all(dir);
  return 0;
}
