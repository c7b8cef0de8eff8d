// Tests of runtime/comm: the communicator contract (all_gather,
// reduce_scatter, all_reduce, broadcast, barrier), byte counters, errors, the
// stores (memory, file and the CAF store between threads and processes), the
// inproc backend with 1-4 ranks as threads and the gloo backend with 2 and 3
// processes over the file store and the CAF store (this binary re-executes
// itself as the workers).
//
// The data are multiples of 2^-12 in [-2, 2] (rounded to the dtype), so every
// sum over <= 4 ranks is exact in f32: the float64 reference rounded once to
// the dtype must match the result bit for bit, whatever the summation order.
// A separate case checks inproc's rank-order summation where order matters.
#include <doctest/doctest.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "runtime/comm/abort_registry.h"
#include "runtime/comm/caf_store.h"
#include "runtime/comm/communicator.h"
#include "runtime/comm/store.h"
#include "runtime/tensor/device_memory.h"
#include "runtime/util/connect_budget.h"

extern char** environ;

using namespace flowrun;
using namespace flowrun::comm;
using namespace std::chrono_literals;

namespace {

// ------------------------------------------------------------------ data

uint64_t mix(uint64_t x) {  // splitmix64
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

int64_t draw(uint64_t seed, int rank, int64_t i) {  // in [-8192, 8192]
  return static_cast<int64_t>(mix(seed * 1000003u + static_cast<uint64_t>(rank) * 7919u + mix(i)) % 16385) - 8192;
}

/// Rank `rank`'s input for test `seed`: n elements of dtype t.
tensor make_input(dtype t, uint64_t seed, int rank, int64_t n) {
  if (t == dtype::i32) {
    std::vector<int32_t> v(n);
    for (int64_t i = 0; i < n; ++i) v[i] = static_cast<int32_t>(draw(seed, rank, i));
    return tensor::from_ints({n}, v);
  }
  if (t == dtype::i64) {
    auto x = tensor::empty({n}, dtype::i64);
    for (int64_t i = 0; i < n; ++i) x.data<int64_t>()[i] = draw(seed, rank, i) * (int64_t{1} << 33) + rank * 7 + i;
    return x;
  }
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<float>(draw(seed, rank, i)) / 4096.0f;
  auto f = tensor::from_floats({n}, v);
  return t == dtype::f32 ? f : f.to(t);
}

double as_double(const tensor& x, int64_t i) {
  switch (x.type()) {
    case dtype::f32:
      return x.data<float>()[i];
    case dtype::bf16:
      return bf16_to_float(x.data<uint16_t>()[i]);
    case dtype::f16:
      return f16_to_float(x.data<uint16_t>()[i]);
    case dtype::i32:
      return x.data<int32_t>()[i];
    case dtype::i64:
      return static_cast<double>(x.data<int64_t>()[i]);
  }
  return 0;
}

int64_t as_int(const tensor& x, int64_t i) {
  return x.type() == dtype::i32 ? x.data<int32_t>()[i] : x.data<int64_t>()[i];
}

bool is_int(dtype t) { return t == dtype::i32 || t == dtype::i64; }

/// A tensor of dtype t from float64 values (rounded once, by the tensor
/// library's own conversion) or int64 values.
tensor from_values(dtype t, const std::vector<double>& f, const std::vector<int64_t>& k) {
  const int64_t n = static_cast<int64_t>(is_int(t) ? k.size() : f.size());
  auto x = tensor::empty({n}, t);
  if (t == dtype::i32)
    for (int64_t i = 0; i < n; ++i) x.data<int32_t>()[i] = static_cast<int32_t>(k[i]);
  else if (t == dtype::i64)
    for (int64_t i = 0; i < n; ++i) x.data<int64_t>()[i] = k[i];
  else {
    std::vector<float> v(f.begin(), f.end());
    auto y = tensor::from_floats({n}, v);
    x = t == dtype::f32 ? y : y.to(t);
  }
  return x;
}

/// Element-wise reference over all ranks' inputs (each of n elements,
/// element offset `off`, length m): sum or max, in float64 / int64.
tensor reference(dtype t, reduce_op op, const std::vector<tensor>& inputs, int64_t off, int64_t m) {
  std::vector<double> f(is_int(t) ? 0 : m);
  std::vector<int64_t> k(is_int(t) ? m : 0);
  for (int64_t i = 0; i < m; ++i) {
    for (size_t r = 0; r < inputs.size(); ++r) {
      if (is_int(t)) {
        const int64_t v = as_int(inputs[r], off + i);
        k[i] = r == 0 ? v : (op == reduce_op::sum ? k[i] + v : std::max(k[i], v));
      } else {
        const double v = as_double(inputs[r], off + i);
        f[i] = r == 0 ? v : (op == reduce_op::sum ? f[i] + v : std::max(f[i], v));
      }
    }
  }
  return from_values(t, f, k);
}

uint64_t fnv1a(const void* p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<const unsigned char*>(p)[i]) * 1099511628211ull;
  return h;
}

// ------------------------------------------------------------------ the suite

/// Runs every collective on deterministic data and compares with a float64 /
/// int64 reference computed here (each rank knows every rank's input).
/// Cross-rank bitwise equality of the reductions is checked by all-gathering
/// a hash of each result. Returns the failures (empty when all pass). Runs
/// on any CPU backend; uses no doctest macro (ranks may be threads).
std::vector<std::string> run_suite(communicator& c) {
  std::vector<std::string> fail;
  const int N = c.world_size(), R = c.rank();
  auto tag = [&](const std::string& what, dtype t, int64_t n) {
    return "rank " + std::to_string(R) + " of " + std::to_string(N) + " " + c.backend() + ": " + what + " " +
           dtype_name(t) + " n=" + std::to_string(n);
  };
  auto same = [&](const std::string& what, const tensor& got, const tensor& want) {
    if (got.nbytes() == want.nbytes() && std::memcmp(got.raw(), want.raw(), got.nbytes()) == 0) return;
    std::string msg = what + ": differs";
    for (int64_t i = 0; i < want.numel(); ++i) {
      const size_t es = dtype_size(want.type());
      if (std::memcmp(static_cast<const char*>(got.raw()) + i * es, static_cast<const char*>(want.raw()) + i * es,
                      es) != 0) {
        msg += " at " + std::to_string(i) + ": got " + std::to_string(as_double(got, i)) + ", want " +
               std::to_string(as_double(want, i));
        break;
      }
    }
    fail.push_back(msg);
  };
  std::vector<uint64_t> hashes;  // of the reductions, compared across ranks at the end
  int64_t expect_bytes = 0;
  std::map<std::string, int64_t> expect_by_op;
  auto expect = [&](const char* op, int64_t full) {
    expect_bytes += ring_bytes_sent(op, full, N);
    expect_by_op[op] += ring_bytes_sent(op, full, N);
  };
  c.reset_stats();
  int64_t calls = 0;

  uint64_t seed = 1;
  for (dtype t : {dtype::f32, dtype::bf16, dtype::f16, dtype::i32, dtype::i64}) {
    for (int64_t n : {int64_t{1}, int64_t{3}, int64_t{257}}) {
      ++seed;
      // all_gather
      {
        auto send = make_input(t, seed, R, n);
        auto recv = tensor::zeros({N, n}, t);
        c.all_gather(send, recv);
        ++calls;
        expect("all_gather", recv.nbytes());
        for (int r = 0; r < N; ++r)
          same(tag("all_gather slot " + std::to_string(r), t, n), recv.rows(r, r + 1).view({n}),
               make_input(t, seed, r, n));
        // in place: send is this rank's slot of recv
        auto buf = tensor::zeros({N * n}, t);
        auto slot = buf.flat_view(R * n, {n});
        slot.copy_from(send);
        c.all_gather(slot, buf);
        ++calls;
        expect("all_gather", buf.nbytes());
        same(tag("all_gather in place", t, n), buf, recv.view({N * n}));
      }
      // reduce_scatter (sum), plain and in place
      {
        std::vector<tensor> inputs;
        for (int r = 0; r < N; ++r) inputs.push_back(make_input(t, seed + 100, r, N * n));
        auto want = reference(t, reduce_op::sum, inputs, R * n, n);
        auto send = inputs[R].clone();
        auto recv = tensor::zeros({n}, t);
        c.reduce_scatter(send, recv);
        ++calls;
        expect("reduce_scatter", send.nbytes());
        same(tag("reduce_scatter", t, n), recv, want);
        same(tag("reduce_scatter left send alone", t, n), send, inputs[R]);
        auto slot = send.flat_view(R * n, {n});
        c.reduce_scatter(send, slot);
        ++calls;
        expect("reduce_scatter", send.nbytes());
        same(tag("reduce_scatter in place", t, n), slot, want);
      }
      // all_reduce sum and max
      for (reduce_op op : {reduce_op::sum, reduce_op::max}) {
        std::vector<tensor> inputs;
        for (int r = 0; r < N; ++r) inputs.push_back(make_input(t, seed + 200, r, n));
        auto want = reference(t, op, inputs, 0, n);
        auto x = inputs[R].clone();
        c.all_reduce(x, op);
        ++calls;
        expect("all_reduce", x.nbytes());
        same(tag(std::string("all_reduce ") + reduce_op_name(op), t, n), x, want);
        hashes.push_back(fnv1a(x.raw(), x.nbytes()));
      }
      // broadcast from the last and from the first rank
      for (int root : {N - 1, 0}) {
        auto x = make_input(t, seed + 300, R, n);
        c.broadcast(x, root);
        ++calls;
        expect("broadcast", x.nbytes());
        same(tag("broadcast root " + std::to_string(root), t, n), x, make_input(t, seed + 300, root, n));
      }
    }
  }

  // A bigger f32 all_reduce and reduce_scatter (several gloo segments).
  {
    // 100003: several chunks; 1000003: chunks over 1 MiB, which gloo's all_reduce moves in 1 MiB
    // segments, four in flight (2 or 3 per chunk)
    for (const int64_t n : {int64_t{100003}, int64_t{1000003}}) {
      std::vector<tensor> inputs;
      for (int r = 0; r < N; ++r) inputs.push_back(make_input(dtype::f32, 999, r, n));
      auto x = inputs[R].clone();
      c.all_reduce(x);
      ++calls;
      expect("all_reduce", x.nbytes());
      same(tag("big all_reduce", dtype::f32, n), x, reference(dtype::f32, reduce_op::sum, inputs, 0, n));
      hashes.push_back(fnv1a(x.raw(), x.nbytes()));
    }
    const int64_t m = 20001;
    std::vector<tensor> rs;
    for (int r = 0; r < N; ++r) rs.push_back(make_input(dtype::bf16, 998, r, N * m));
    auto recv = tensor::empty({m}, dtype::bf16);
    c.reduce_scatter(rs[R], recv);
    ++calls;
    expect("reduce_scatter", rs[R].nbytes());
    same(tag("big reduce_scatter", dtype::bf16, m), recv, reference(dtype::bf16, reduce_op::sum, rs, R * m, m));
  }

  // bf16 sums round once: 256 + 1 + 1 + 1 is 259 -> 260 in bf16 (rounding
  // after each addition would stay at 256).
  {
    auto x = tensor::from_floats({2}, {R == 0 ? 256.0f : 1.0f, R == 0 ? -256.0f : -1.0f}).to(dtype::bf16);
    c.all_reduce(x);
    ++calls;
    expect("all_reduce", x.nbytes());
    const float s = 256.0f + static_cast<float>(N - 1);
    same(tag("bf16 rounds once", dtype::bf16, 2), x, tensor::from_floats({2}, {s, -s}).to(dtype::bf16));
    hashes.push_back(fnv1a(x.raw(), x.nbytes()));
  }

  // NaN propagates through max; empty tensors are fine.
  {
    auto x = tensor::from_floats({3}, {R == N - 1 ? NAN : 1.0f, static_cast<float>(R), -static_cast<float>(R)});
    c.all_reduce(x, reduce_op::max);
    ++calls;
    expect("all_reduce", x.nbytes());
    if (!std::isnan(x.item(0)) || x.item(1) != static_cast<float>(N - 1) || x.item(2) != 0.0f)
      fail.push_back(tag("max with NaN", dtype::f32, 3) + ": got " + std::to_string(x.item(0)) + ", " +
                     std::to_string(x.item(1)) + ", " + std::to_string(x.item(2)));
    auto e = tensor::empty({0});
    auto e2 = tensor::empty({0});
    c.all_reduce(e);
    c.all_gather(e, e2);
    calls += 2;
    expect("all_reduce", 0);
    expect("all_gather", 0);
  }

  c.barrier();
  ++calls;
  expect("barrier", 0);

  // Byte counters: the ring convention, summed over the calls above.
  const auto st = c.stats();
  if (st.bytes_sent != expect_bytes)
    fail.push_back(tag("stats.bytes_sent", dtype::f32, 0) + ": " + std::to_string(st.bytes_sent) +
                   " != " + std::to_string(expect_bytes));
  if (st.calls != calls)
    fail.push_back(tag("stats.calls", dtype::f32, 0) + ": " + std::to_string(st.calls) +
                   " != " + std::to_string(calls));
  if (st.bytes_by_op != expect_by_op) fail.push_back(tag("stats.bytes_by_op", dtype::f32, 0) + " differs");

  // Every rank got the same bytes from every reduction.
  {
    const int64_t k = static_cast<int64_t>(hashes.size());
    auto mine = tensor::empty({k}, dtype::i64);
    for (int64_t i = 0; i < k; ++i) mine.data<int64_t>()[i] = static_cast<int64_t>(hashes[i]);
    auto all = tensor::empty({N, k}, dtype::i64);
    c.all_gather(mine, all);
    for (int r = 0; r < N; ++r)
      if (std::memcmp(all.rows(r, r + 1).raw(), mine.raw(), mine.nbytes()) != 0)
        fail.push_back(tag("reductions differ from rank " + std::to_string(r), dtype::i64, k));
  }
  return fail;
}

// ------------------------------------------------------------------ threads

/// Runs body(comm) on `world` inproc ranks, one thread each; returns each
/// rank's exception message ("" when it returned normally).
std::vector<std::string> run_threads(int world, const std::function<void(communicator&)>& body,
                                     std::chrono::milliseconds timeout = 20s) {
  auto group = make_inproc_group(world);
  std::vector<std::string> errors(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      try {
        auto c = inproc_communicator(group, r, timeout);
        body(*c);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

std::string temp_dir(const std::string& name) {
  auto d = std::filesystem::temp_directory_path() /
           ("flowrun_" + name + "_" + std::to_string(::getpid()) + "_" +
            std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()));
  std::filesystem::create_directories(d);
  return d.string();
}

}  // namespace

// ====================================================================== tests

TEST_CASE("test_comm: ring byte-count convention") {
  // (N-1) * (B / N), all_reduce twice that, in exact integer arithmetic.
  CHECK(ring_bytes_sent("all_gather", 4000, 4) == 3000);
  CHECK(ring_bytes_sent("reduce_scatter", 4000, 4) == 3000);
  CHECK(ring_bytes_sent("all_reduce", 4000, 4) == 6000);
  CHECK(ring_bytes_sent("broadcast", 4000, 4) == 3000);
  CHECK(ring_bytes_sent("all_reduce", 4000, 3) == 2 * 2 * 1333);
  CHECK(ring_bytes_sent("barrier", 4000, 4) == 0);
  for (const char* op : {"all_gather", "reduce_scatter", "all_reduce", "broadcast"})
    CHECK(ring_bytes_sent(op, 12345, 1) == 0);
  CHECK_THROWS_AS(ring_bytes_sent("all_to_all", 10, 2), std::invalid_argument);
  CHECK_THROWS_AS(ring_bytes_sent("all_reduce", 10, 0), std::invalid_argument);
  CHECK(std::string(reduce_op_name(reduce_op::max)) == "max");
}

TEST_CASE("test_comm: inproc: every collective against a float64 reference, 1 to 4 ranks") {
  for (int world = 1; world <= 4; ++world) {
    CAPTURE(world);
    std::vector<std::vector<std::string>> failures(world);
    auto errors = run_threads(world, [&](communicator& c) { failures[c.rank()] = run_suite(c); });
    for (int r = 0; r < world; ++r) {
      CHECK_MESSAGE(errors[r].empty(), errors[r]);
      for (auto& f : failures[r]) FAIL_CHECK(f);
    }
  }
}

TEST_CASE("test_comm: inproc: byte counters equal the formula for known sizes") {
  auto errors = run_threads(4, [&](communicator& c) {
    auto a = tensor::zeros({1000});  // 4000 bytes
    auto s = tensor::zeros({250});
    c.all_reduce(a);
    c.all_gather(s, a);
    c.reduce_scatter(a, s);
    c.broadcast(a, 2);
    c.barrier();
    auto st = c.stats();
    if (st.bytes_sent != 6000 + 3000 + 3000 + 3000 || st.calls != 5 || st.bytes_by_op.at("all_reduce") != 6000 ||
        st.bytes_by_op.at("all_gather") != 3000 || st.bytes_by_op.at("reduce_scatter") != 3000 ||
        st.bytes_by_op.at("broadcast") != 3000 || st.bytes_by_op.at("barrier") != 0)
      throw std::runtime_error("stats: bytes_sent " + std::to_string(st.bytes_sent));
    c.reset_stats();
    if (c.stats().bytes_sent != 0 || c.stats().calls != 0 || !c.stats().bytes_by_op.empty())
      throw std::runtime_error("reset_stats did not reset");
  });
  for (auto& e : errors) CHECK_MESSAGE(e.empty(), e);
  // One rank: nothing is sent.
  auto c = inproc_communicator(make_inproc_group(1), 0);
  auto x = tensor::zeros({100});
  c->all_reduce(x);
  CHECK(c->stats().bytes_sent == 0);
  CHECK(c->stats().calls == 1);
}

TEST_CASE("test_comm: inproc: sums run in rank order 0..N-1 and are bitwise equal on every rank") {
  // Order matters here: in f32 (spacing 8 at 1e8), ((1e8 + 3) + 3) + 3 is
  // 1e8, while adding the threes first gives 1e8 + 9 -> 100000008.
  const int world = 4;
  std::vector<tensor> results(world);
  auto errors = run_threads(world, [&](communicator& c) {
    const float v = c.rank() == 0 ? 1e8f : 3.0f;
    auto x = tensor::from_floats({4}, {v, -v, v * 0.1f, 3.0f});
    c.all_reduce(x);
    results[c.rank()] = x;
  });
  for (auto& e : errors) CHECK_MESSAGE(e.empty(), e);
  volatile float want = 1e8f;
  want = want + 3.0f;
  want = want + 3.0f;
  want = want + 3.0f;
  CHECK(want == 1e8f);
  CHECK(results[0].item(0) == want);
  CHECK(results[0].item(1) == -want);
  for (int r = 1; r < world; ++r) CHECK(std::memcmp(results[r].raw(), results[0].raw(), results[0].nbytes()) == 0);
}

TEST_CASE("test_comm: inproc: argument errors name the op, the rank and the shapes") {
  auto errors = run_threads(2, [&](communicator& c) {
    auto send = tensor::zeros({3});
    auto recv = tensor::zeros({5});
    try {
      c.all_gather(send, recv);
    } catch (const std::invalid_argument& e) {
      const std::string m = e.what();
      if (!contains(m, "all_gather") || !contains(m, "rank " + std::to_string(c.rank()) + " of 2") ||
          !contains(m, "f32(5,)") || !contains(m, "f32(3,)"))
        throw std::runtime_error("bad message: " + m);
    }
    auto rs = tensor::zeros({7});
    try {
      c.reduce_scatter(rs, send);
      throw std::runtime_error("reduce_scatter size mismatch did not throw");
    } catch (const std::invalid_argument& e) {
      if (!contains(e.what(), "reduce_scatter") || !contains(e.what(), "f32(7,)")) throw;
    }
    auto h = tensor::zeros({6}).to(dtype::bf16);
    try {
      c.all_gather(send, h);
      throw std::runtime_error("dtype mismatch did not throw");
    } catch (const std::invalid_argument& e) {
      if (!contains(e.what(), "dtypes differ")) throw;
    }
    auto buf = tensor::zeros({6});
    try {  // overlapping but not the in-place slot
      c.all_gather(buf.flat_view(1, {3}), buf);
      throw std::runtime_error("overlap did not throw");
    } catch (const std::invalid_argument& e) {
      if (!contains(e.what(), "overlaps")) throw;
    }
    try {
      c.broadcast(send, 2);
      throw std::runtime_error("bad root did not throw");
    } catch (const std::invalid_argument& e) {
      if (!contains(e.what(), "root 2")) throw;
    }
    try {
      tensor undef;
      c.all_reduce(undef);
      throw std::runtime_error("undefined tensor did not throw");
    } catch (const std::invalid_argument& e) {
      if (!contains(e.what(), "undefined")) throw;
    }
    // The group still works after argument errors (nothing was published).
    c.all_reduce(send);
    if (c.stats().calls != 1) throw std::runtime_error("failed calls were counted");
  });
  for (auto& e : errors) CHECK_MESSAGE(e.empty(), e);
}

TEST_CASE("test_comm: inproc: ranks that disagree on the call all throw, naming the difference") {
  auto errors = run_threads(3, [&](communicator& c) {
    auto x = tensor::zeros({c.rank() == 2 ? 5 : 4});
    c.all_reduce(x);
  });
  for (int r = 0; r < 3; ++r) {
    CAPTURE(errors[r]);
    CHECK(contains(errors[r], "all_reduce"));
    CHECK(contains(errors[r], "rank 2 called all_reduce(f32, 5 elements"));
  }
  errors = run_threads(2, [&](communicator& c) {
    auto x = tensor::zeros({4});
    if (c.rank() == 0)
      c.broadcast(x, 0);
    else
      c.barrier();
  });
  for (auto& e : errors) CHECK(contains(e, "rank 1 called barrier"));
}

TEST_CASE("test_comm: inproc: a rank that never arrives times out, naming it") {
  auto start = std::chrono::steady_clock::now();
  auto errors = run_threads(
      3,
      [&](communicator& c) {
        auto x = tensor::zeros({8});
        if (c.rank() != 1) c.all_reduce(x);
      },
      300ms);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK(secs < 5.0);
  CHECK(errors[1].empty());
  for (int r : {0, 2}) {
    CAPTURE(errors[r]);
    CHECK(contains(errors[r], "all_reduce"));
    CHECK(contains(errors[r], "rank(s) 1"));
  }
  // After a timeout the group is broken: later calls fail at once.
  auto group = make_inproc_group(2);
  auto c0 = inproc_communicator(group, 0, 100ms);
  CHECK_THROWS_WITH_AS(c0->barrier(), doctest::Contains("rank(s) 1"), std::runtime_error);
  CHECK_THROWS_WITH_AS(c0->barrier(), doctest::Contains("broken"), std::runtime_error);
}

// A rank that fails (communicator::abort) wakes the ranks waiting for it at once, naming it: a policy
// replica that failed at init left its peer in an all_gather until comm_timeout_s (300 s).
TEST_CASE("test_comm: inproc: abort wakes the waiting ranks at once, naming the failed rank") {
  const auto start = std::chrono::steady_clock::now();
  auto errors = run_threads(
      3,
      [&](communicator& c) {
        auto x = tensor::zeros({8});
        if (c.rank() == 1) {
          std::this_thread::sleep_for(50ms);
          c.abort("its init threw");
          return;
        }
        c.all_reduce(x);
      },
      60s);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK(secs < 10.0);  // not the 60 s timeout
  for (int r : {0, 2}) {
    CAPTURE(errors[r]);
    CHECK(contains(errors[r], "all_reduce"));
    CHECK(contains(errors[r], "the inproc group is broken: rank 1 failed: its init threw"));
  }
}

TEST_CASE("test_comm: inproc: construction errors") {
  CHECK_THROWS_AS(make_inproc_group(0), std::invalid_argument);
  auto g = make_inproc_group(2);
  CHECK_THROWS_AS(inproc_communicator(g, 2), std::invalid_argument);
  CHECK_THROWS_AS(inproc_communicator(nullptr, 0), std::invalid_argument);
  {
    auto a = inproc_communicator(g, 0);
    CHECK_THROWS_WITH_AS(inproc_communicator(g, 0), doctest::Contains("already taken"), std::invalid_argument);
    CHECK(a->backend() == "inproc");
    CHECK(a->world_size() == 2);
    CHECK(a->tensor_device() == device::cpu());
  }
  auto again = inproc_communicator(g, 0);  // released by the destructor
  CHECK(again->rank() == 0);
}

TEST_CASE("test_comm: inproc: thousands of small collectives on 4 ranks") {
  const int calls = 2000;
  auto start = std::chrono::steady_clock::now();
  std::vector<double> last(4);
  auto errors = run_threads(4, [&](communicator& c) {
    auto x = tensor::zeros({16});
    auto g = tensor::zeros({64});
    for (int i = 0; i < calls; ++i) {
      x.fill_(1.0f);
      c.all_reduce(x);
      c.all_gather(x, g);
    }
    last[c.rank()] = g.item(63);
  });
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  MESSAGE("4 ranks x " << 2 * calls << " collectives: " << secs << " s");
  for (auto& e : errors) CHECK_MESSAGE(e.empty(), e);
  for (double v : last) CHECK(v == 4.0);
  CHECK(secs < 30.0);
}

TEST_CASE("test_comm: inproc: send and recv between pairs, in FIFO order, with checks") {
  std::vector<float> a_got, b_got, x_got, y_got;  // filled by ranks 1 and 2 (checked after the join)
  std::vector<int> counted(3, 0);
  auto errors = run_threads(3, [&](communicator& c) {
    const int r = c.rank();
    if (r == 0) {  // two messages to 1, one to 2
      c.send(tensor::from_floats({3}, {1, 2, 3}), 1);
      c.send(tensor::from_ints({2}, {7, 8}), 1);
      c.send(tensor::from_floats({1}, {5}), 2);
    } else if (r == 1) {
      auto a = tensor::zeros({3});
      auto b = tensor::zeros({2}, dtype::i32);
      c.recv(a, 0);
      c.recv(b, 0);
      a_got = a.to_floats();
      b_got = b.to_floats();
      c.send(a, 2);
    } else {
      auto x = tensor::zeros({1});
      auto y = tensor::zeros({3});
      c.recv(y, 1);  // the order of different senders does not matter
      c.recv(x, 0);
      x_got = x.to_floats();
      y_got = y.to_floats();
    }
    counted[r] = static_cast<int>(c.stats().bytes_by_op.count(r == 2 ? "recv" : "send"));
  });
  CHECK(a_got == std::vector<float>{1, 2, 3});
  CHECK(b_got == std::vector<float>{7, 8});
  CHECK(x_got == std::vector<float>{5});
  CHECK(y_got == std::vector<float>{1, 2, 3});
  CHECK(counted == std::vector<int>{1, 1, 1});
  for (auto& e : errors) CHECK_MESSAGE(e.empty(), e);
  auto g = make_inproc_group(2);
  auto c0 = inproc_communicator(g, 0, std::chrono::milliseconds(50));
  auto c1 = inproc_communicator(g, 1, std::chrono::milliseconds(50));
  auto x = tensor::zeros({4});
  CHECK_THROWS_WITH_AS(c0->send(x, 0), doctest::Contains("must be another rank"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(c0->send(x, 2), doctest::Contains("must be another rank"), std::invalid_argument);
  c0->send(tensor::zeros({2}), 1);
  CHECK_THROWS_WITH_AS(c1->recv(x, 0), doctest::Contains("sent f32 (2 elements)"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(c1->recv(x, 0), doctest::Contains("timed out"), std::runtime_error);
  CHECK(ring_bytes_sent("send", 400, 4) == 400);
  CHECK(ring_bytes_sent("recv", 400, 4) == 0);
}

TEST_CASE("test_comm: stores: memory_store and file_store") {
  memory_store m;
  m.set("a/b", {1, 2, 3});
  CHECK(m.contains("a/b"));
  CHECK(m.get("a/b", 10ms) == std::vector<uint8_t>{1, 2, 3});
  CHECK_THROWS_WITH_AS(m.get("missing", 20ms), doctest::Contains("missing"), std::runtime_error);
  std::thread late([&] {
    std::this_thread::sleep_for(30ms);
    m.set("late", {9});
  });
  CHECK(m.get("late", 5s) == std::vector<uint8_t>{9});
  late.join();
  m.erase("a/b");
  CHECK_FALSE(m.contains("a/b"));

  const std::string dir = temp_dir("store");
  file_store f(dir + "/sub");
  f.set("job 1/nccl id", {0, 255, 7});
  CHECK(f.contains("job 1/nccl id"));
  file_store f2(dir + "/sub");  // another rank's view of the same directory
  CHECK(f2.get("job 1/nccl id", 10ms) == std::vector<uint8_t>{0, 255, 7});
  f.set("job 1/nccl id", {});
  CHECK(f2.get("job 1/nccl id", 10ms).empty());
  CHECK_THROWS_WITH_AS(f2.get("nobody", 30ms), doctest::Contains("nobody"), std::runtime_error);
  CHECK(f.path_of("../x") != dir + "/sub/../x");
  f.erase("job 1/nccl id");
  CHECK_FALSE(f2.contains("job 1/nccl id"));
  std::filesystem::remove_all(dir);
}

std::vector<uint8_t> all_bytes() {  // 0..255 and a zero in the middle: raw bytes, not text
  std::vector<uint8_t> v(256);
  for (int i = 0; i < 256; ++i) v[i] = static_cast<uint8_t>(i);
  v.push_back(0);
  v.push_back(42);
  return v;
}

TEST_CASE("test_comm: caf store: set/get/wait between two threads") {
  auto host = host_caf_store();  // 127.0.0.1, any free port
  const caf_address addr = host->address();
  CHECK(addr.host == "127.0.0.1");
  CHECK(addr.port != 0);
  CHECK(parse_caf_address(addr.str()).port == addr.port);
  auto a = make_caf_store(addr.host, addr.port, 5s);
  auto b = open_store(addr.str(), 5s);
  std::string thread_error;
  std::thread peer([&] {
    try {
      auto v = b->get("job/ping", 10s);  // waits: set a moment later by the main thread
      v.push_back('!');
      b->set("job/pong", v);
    } catch (const std::exception& e) {
      thread_error = e.what();
    }
  });
  std::this_thread::sleep_for(100ms);
  CHECK_FALSE(a->contains("job/ping"));
  a->set("job/ping", all_bytes());
  auto pong = a->get("job/pong", 10s);
  peer.join();
  CHECK(thread_error.empty());
  auto want = all_bytes();
  want.push_back('!');
  CHECK(pong == want);
  CHECK(b->contains("job/ping"));
  CHECK(host->size() == 2);
  a->set("job/ping", {});  // replaced, and empty values travel
  CHECK(b->get("job/ping", 1s).empty());
  std::vector<uint8_t> big(1 << 20);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<uint8_t>(i * 7);
  a->set("big", big);
  CHECK(b->get("big", 5s) == big);
  a->erase("job/ping");
  a->erase("job/ping");  // absent: no error
  b->erase("job/pong");
  b->erase("big");
  CHECK_FALSE(a->contains("job/ping"));
  CHECK(host->size() == 0);
}

TEST_CASE("test_comm: caf store: a missing key times out with the address and the key") {
  auto host = host_caf_store();
  const std::string addr = host->address().str();
  auto s = open_store(addr, 5s);
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH_AS(s->get("flowrun/nccl_unique_id", 300ms),
                       doctest::Contains((addr + ": timed out after 300 ms waiting for key 'flowrun/nccl_unique_id'").c_str()),
                       std::runtime_error);
  CHECK(std::chrono::steady_clock::now() - start < 5s);
  // The store lives on: a late set answers the next get (the parked one is dropped).
  s->set("flowrun/nccl_unique_id", {1, 2});
  CHECK(s->get("flowrun/nccl_unique_id", 1s) == std::vector<uint8_t>{1, 2});
}

TEST_CASE("test_comm: caf store: a wrong address fails with a clear error") {
  uint16_t port = 0;
  {
    auto host = host_caf_store();
    port = host->address().port;
  }  // unpublished and closed: nothing listens there now
  const std::string addr = "caf://127.0.0.1:" + std::to_string(port);
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH_AS(open_store(addr, 300ms), doctest::Contains(("cannot connect to " + addr + " within 300 ms").c_str()),
                       std::runtime_error);
  CHECK(std::chrono::steady_clock::now() - start < 10s);
  CHECK_THROWS_WITH_AS(make_caf_store("127.0.0.1", 0), doctest::Contains("port 0"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(parse_caf_address("caf://localhost"), doctest::Contains("caf://HOST:PORT"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(parse_caf_address("caf://h:70000"), doctest::Contains("port out of range"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(open_store("tcp://h:1"), doctest::Contains("unknown scheme"), std::invalid_argument);
  CHECK_THROWS_AS(open_store(""), std::invalid_argument);
  CHECK_THROWS_WITH_AS(host_caf_store("203.0.113.1", 0), doctest::Contains("cannot publish the store on 203.0.113.1:0"),
                       std::runtime_error);
  auto taken = host_caf_store("127.0.0.1", 0);  // a port in use: said in words, with the way out
  const uint16_t busy = taken->address().port;
  CHECK_THROWS_WITH_AS(host_caf_store("127.0.0.1", busy),
                       doctest::Contains(("port " + std::to_string(busy) + " is already in use").c_str()),
                       std::runtime_error);
}

TEST_CASE("connect_attempt_budget: a retry after a refusal gets time for the port's answer, not the last millisecond") {
  // the store's and the cluster's connect loops: a retry near the deadline timed out in a loaded middleman, and a
  // refusing port was reported as one that accepts but does not speak (cluster_small under ctest -j2)
  using std::chrono::milliseconds;
  CHECK(connect_attempt_budget(milliseconds(1000), milliseconds(1000), false) == milliseconds(1000));  // first try
  CHECK(connect_attempt_budget(milliseconds(0), milliseconds(1000), false) == milliseconds(1));
  CHECK(connect_attempt_budget(milliseconds(-5), milliseconds(1000), true) == milliseconds(1000));
  CHECK(connect_attempt_budget(milliseconds(3), milliseconds(8000), true) == milliseconds(1000));
  CHECK(connect_attempt_budget(milliseconds(1), milliseconds(300), true) == milliseconds(300));
  CHECK(connect_attempt_budget(milliseconds(4000), milliseconds(8000), true) == milliseconds(4000));
}

TEST_CASE("test_comm: caf store: a port that accepts but never answers fails within the connect timeout") {
  // A listening socket that nobody serves: the kernel completes the TCP connect, CAF's
  // handshake gets no reply. The client must give up at its connect timeout, not hang.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  sa.sin_port = 0;
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) == 0);
  REQUIRE(::listen(fd, 8) == 0);
  socklen_t len = sizeof(sa);
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) == 0);
  const std::string addr = "caf://127.0.0.1:" + std::to_string(ntohs(sa.sin_port));
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH_AS(open_store(addr, 700ms),
                       doctest::Contains(("nothing at " + addr + " answered as a rendezvous store within 700 ms").c_str()),
                       std::runtime_error);
  const auto took = std::chrono::steady_clock::now() - start;
  MESSAGE("gave up after " << std::chrono::duration_cast<std::chrono::milliseconds>(took).count() << " ms");
  CHECK(took < 10s);
  ::close(fd);
}

TEST_CASE("test_comm: make_communicator: by name, with clear errors") {
  comm_options o;
  auto c = make_communicator(o);
  CHECK(c->backend() == "inproc");
  CHECK(c->world_size() == 1);
  o.backend = "mpi";
  CHECK_THROWS_WITH_AS(make_communicator(o), doctest::Contains("inproc, gloo, nccl"), std::invalid_argument);
  o.backend = "inproc";
  o.world_size = 2;
  CHECK_THROWS_WITH_AS(make_communicator(o), doctest::Contains("make_inproc_group"), std::invalid_argument);
  auto have = available_backends();
  CHECK(have.front() == "inproc");
#ifndef FLOWRUN_HAVE_NCCL
  nccl_options n;
  CHECK_THROWS_WITH_AS(nccl_communicator(n), doctest::Contains("without NCCL"), std::runtime_error);
#else
  nccl_options n;
  n.world_size = 2;
  CHECK_THROWS_AS(nccl_communicator(n), std::invalid_argument);  // no store
#endif
}

// ------------------------------------------------------------------ nccl

#ifdef FLOWRUN_HAVE_NCCL
TEST_CASE("test_comm: nccl: one rank on a GPU (skipped without one)") {
  if (!cuda_device_present()) {
    MESSAGE("no CUDA device: the nccl backend is only compiled and linked here");
    CHECK_THROWS_AS(nccl_communicator(nccl_options{}), std::runtime_error);
    return;
  }
  auto c = nccl_communicator(nccl_options{});
  CHECK(c->backend() == "nccl");
  CHECK(c->tensor_device() == device::cuda(0));
  auto x = tensor::from_floats({4}, {1, 2, 3, 4}).to(device::cuda(0));
  auto y = tensor::zeros({4}, dtype::f32, device::cuda(0));
  c->all_reduce(x);
  c->all_gather(x, y);
  CHECK(y.to(device::cpu()).item(3) == 4.0f);
  auto cpu = tensor::zeros({4});
  CHECK_THROWS_WITH_AS(c->all_reduce(cpu), doctest::Contains("takes tensors on cuda:0"), std::invalid_argument);
}
#endif

// ------------------------------------------------------------------ gloo

#ifdef FLOWRUN_HAVE_GLOO

namespace {

/// Starts `world` copies of this test binary as gloo ranks (the "comm gloo
/// worker" case) and returns their exit codes (-1: killed after the limit).
/// `rendezvous`: a CAF store address ("caf://HOST:PORT") the ranks rendezvous
/// through instead of the file store in `dir` (FLOWRUN_COMM_RENDEZVOUS);
/// `test_case`: the worker case the copies run.
std::vector<int> spawn_gloo_workers(int world, const std::string& dir, std::chrono::seconds limit,
                                    const std::string& rendezvous = "",
                                    const std::string& test_case = "test_comm: gloo worker") {
  char exe[4096];
  const ssize_t len = ::readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  REQUIRE(len > 0);
  exe[len] = 0;
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    std::vector<std::string> env_s;
    for (char** e = environ; *e; ++e)
      if (std::strncmp(*e, "FLOWRUN_COMM_", 13) != 0) env_s.emplace_back(*e);
    env_s.push_back("FLOWRUN_COMM_WORKER=" + std::to_string(r));
    env_s.push_back("FLOWRUN_COMM_WORLD=" + std::to_string(world));
    env_s.push_back("FLOWRUN_COMM_STORE=" + dir);
    if (!rendezvous.empty()) env_s.push_back("FLOWRUN_COMM_RENDEZVOUS=" + rendezvous);
    env_s.push_back("OMP_NUM_THREADS=1");
    std::vector<char*> envp;
    for (auto& s : env_s) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::string a1 = "--test-case=" + test_case, a2 = "--no-skip=true", a3 = "--minimal=true";
    char* argv[] = {exe, a1.data(), a2.data(), a3.data(), nullptr};
    pid_t pid = 0;
    const int rc = ::posix_spawn(&pid, exe, nullptr, nullptr, argv, envp.data());
    REQUIRE_MESSAGE(rc == 0, "posix_spawn failed: " << std::strerror(rc));
    pids.push_back(pid);
  }
  std::vector<int> codes(world, -1);
  std::vector<bool> done(world, false);
  const auto deadline = std::chrono::steady_clock::now() + limit;
  int left = world;
  while (left > 0 && std::chrono::steady_clock::now() < deadline) {
    for (int r = 0; r < world; ++r) {
      if (done[r]) continue;
      int status = 0;
      if (::waitpid(pids[r], &status, WNOHANG) == pids[r]) {
        done[r] = true;
        --left;
        codes[r] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
    }
    std::this_thread::sleep_for(10ms);
  }
  for (int r = 0; r < world; ++r)
    if (!done[r]) {
      ::kill(pids[r], SIGKILL);
      ::waitpid(pids[r], nullptr, 0);
    }
  return codes;
}

}  // namespace

TEST_CASE("test_comm: gloo worker" * doctest::skip()) {
  // Runs only in the processes spawned by the "gloo: ... processes" cases.
  const char* rank_s = std::getenv("FLOWRUN_COMM_WORKER");
  if (!rank_s) return;
  gloo_options o;
  o.rank = std::atoi(rank_s);
  o.world_size = std::atoi(std::getenv("FLOWRUN_COMM_WORLD"));
  o.store_dir = std::getenv("FLOWRUN_COMM_STORE");
  if (const char* rv = std::getenv("FLOWRUN_COMM_RENDEZVOUS")) o.kv = open_store(rv, 10s);
  o.timeout = 30s;
  auto c = gloo_communicator(o);
  REQUIRE(c->backend() == "gloo");
  REQUIRE(c->rank() == o.rank);
  auto failures = run_suite(*c);
  for (auto& f : failures) FAIL_CHECK(f);
  // A reduce_scatter over a mismatched shape fails locally, the group lives on.
  auto a = tensor::zeros({5});
  auto b = tensor::zeros({2});
  CHECK_THROWS_WITH_AS(c->reduce_scatter(a, b), doctest::Contains("reduce_scatter (rank"), std::invalid_argument);
  c->barrier();
  // Point to point around the ring: rank r sends to r+1 (rank 0 first, the others receive
  // first, so the blocking sends never wait on each other), twice, in FIFO order.
  const int N = c->world_size(), r = c->rank(), right = (r + 1) % N, left = (r + N - 1) % N;
  for (int k = 0; k < 2; ++k) {
    auto mine = tensor::from_floats({3}, {float(r), float(k), 7.0f});
    auto got = tensor::zeros({3});
    if (r == 0) {
      c->send(mine, right);
      c->recv(got, left);
    } else {
      c->recv(got, left);
      c->send(mine, right);
    }
    CHECK(got.to_floats() == std::vector<float>{float(left), float(k), 7.0f});
  }
  c->barrier();
  c.reset();
  // Tell the parent this rank really ran (a wrong filter would run nothing and exit 0).
  if (failures.empty()) std::ofstream(std::string(o.store_dir) + "/ran." + rank_s) << "ok\n";
}

TEST_CASE("test_comm: gloo worker, 2 ranks per process" * doctest::skip()) {
  // Runs only in the processes spawned by "gloo: 2 processes x 2 ranks": process p hosts ranks 2p and
  // 2p + 1 on two threads (flowrun launch --nproc P with replicas = 2), each its own gloo group member.
  const char* proc_s = std::getenv("FLOWRUN_COMM_WORKER");
  if (!proc_s) return;
  const int p = std::atoi(proc_s), procs = std::atoi(std::getenv("FLOWRUN_COMM_WORLD"));
  std::vector<std::string> failures[2];
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t)
    threads.emplace_back([&, t] {
      try {
        gloo_options o;
        o.rank = 2 * p + t;
        o.world_size = 2 * procs;
        o.store_dir = std::getenv("FLOWRUN_COMM_STORE");
        o.timeout = 20s;
        auto c = gloo_communicator(o);
        failures[t] = run_suite(*c);
        // a ZeRO-3 gather's size: 8192 floats from each rank
        auto mine = tensor::from_floats({8192}, std::vector<float>(8192, static_cast<float>(o.rank)));
        auto all = tensor::zeros({8192 * o.world_size});
        c->all_gather(mine, all);
        for (int r = 0; r < o.world_size; ++r)
          if (all.data<float>()[r * 8192 + 17] != static_cast<float>(r)) failures[t].push_back("all_gather: wrong data");
        c->barrier();
      } catch (const std::exception& e) {
        failures[t].push_back(e.what());
      }
    });
  for (auto& th : threads) th.join();
  for (auto& f : failures)
    for (auto& x : f) FAIL_CHECK(x);
  if (failures[0].empty() && failures[1].empty())
    std::ofstream(std::string(std::getenv("FLOWRUN_COMM_STORE")) + "/ran." + proc_s) << "ok\n";
}

TEST_CASE("test_comm: gloo: 2 processes x 2 ranks (two group members in one process)") {
  const std::string dir = temp_dir("gloo2x2");
  auto codes = spawn_gloo_workers(2, dir, 120s, "", "test_comm: gloo worker, 2 ranks per process");
  for (int r = 0; r < 2; ++r) {
    CHECK_MESSAGE(codes[r] == 0, "gloo process " << r << " exited with " << codes[r]);
    CHECK_MESSAGE(std::filesystem::remove(dir + "/ran." + std::to_string(r)), "gloo process " << r << " did not run");
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("test_comm: gloo: 2 processes run every collective against the reference") {
  const std::string dir = temp_dir("gloo2");
  auto codes = spawn_gloo_workers(2, dir, 120s);
  for (int r = 0; r < 2; ++r) {
    CHECK_MESSAGE(codes[r] == 0, "gloo rank " << r << " exited with " << codes[r]);
    CHECK_MESSAGE(std::filesystem::remove(dir + "/ran." + std::to_string(r)), "gloo rank " << r << " did not run");
  }
  // The ranks removed their rendezvous records.
  CHECK(std::filesystem::is_empty(dir));
  std::filesystem::remove_all(dir);
}

TEST_CASE("test_comm: gloo: 3 processes (uneven ring)") {
  const std::string dir = temp_dir("gloo3");
  auto codes = spawn_gloo_workers(3, dir, 120s);
  for (int r = 0; r < 3; ++r) {
    CHECK_MESSAGE(codes[r] == 0, "gloo rank " << r << " exited with " << codes[r]);
    CHECK_MESSAGE(std::filesystem::remove(dir + "/ran." + std::to_string(r)), "gloo rank " << r << " did not run");
  }
  CHECK(std::filesystem::is_empty(dir));
  std::filesystem::remove_all(dir);
}

TEST_CASE("test_comm: caf store worker" * doctest::skip()) {
  // Runs only in the processes spawned by "caf store: ... two processes".
  const char* rank_s = std::getenv("FLOWRUN_COMM_WORKER");
  const char* rv = std::getenv("FLOWRUN_COMM_RENDEZVOUS");
  if (!rank_s || !rv) return;
  auto s = open_store(rv, 10s);
  auto v = s->get("ping", 30s);  // the parent sets it after the workers started
  v.push_back(static_cast<uint8_t>('0' + std::atoi(rank_s)));
  s->set("pong/" + std::string(rank_s), v);
  CHECK_THROWS_WITH_AS(s->get("never", 200ms), doctest::Contains("waiting for key 'never'"), std::runtime_error);
  std::ofstream(std::string(std::getenv("FLOWRUN_COMM_STORE")) + "/ran." + rank_s) << "ok\n";
}

TEST_CASE("test_comm: caf store: set/get/wait between processes") {
  auto host = host_caf_store();
  const std::string dir = temp_dir("cafstore");
  std::thread parent([&] {
    auto s = open_store(host->address().str(), 5s);
    std::this_thread::sleep_for(200ms);  // the workers are waiting for it by now (or soon)
    s->set("ping", all_bytes());
  });
  auto codes = spawn_gloo_workers(2, dir, 60s, host->address().str(), "test_comm: caf store worker");
  parent.join();
  auto s = open_store(host->address().str(), 5s);
  for (int r = 0; r < 2; ++r) {
    CHECK_MESSAGE(codes[r] == 0, "caf store worker " << r << " exited with " << codes[r]);
    CHECK_MESSAGE(std::filesystem::remove(dir + "/ran." + std::to_string(r)), "worker " << r << " did not run");
    auto want = all_bytes();
    want.push_back(static_cast<uint8_t>('0' + r));
    CHECK(s->get("pong/" + std::to_string(r), 1s) == want);
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("test_comm: gloo: 2 and 3 processes rendezvous over the CAF store") {
  // The same worker as the file-store cases (every collective against the
  // float64 reference, point to point), only the rendezvous differs.
  for (int world : {2, 3}) {
    CAPTURE(world);
    auto host = host_caf_store();
    const std::string dir = temp_dir("gloocaf");
    auto codes = spawn_gloo_workers(world, dir, 120s, host->address().str());
    for (int r = 0; r < world; ++r) {
      CHECK_MESSAGE(codes[r] == 0, "gloo rank " << r << " exited with " << codes[r]);
      CHECK_MESSAGE(std::filesystem::remove(dir + "/ran." + std::to_string(r)), "gloo rank " << r << " did not run");
    }
    CHECK(std::filesystem::is_empty(dir));  // nothing went through the folder
    CHECK(host->size() == 0);               // every rank erased its addresses
    std::filesystem::remove_all(dir);
  }
}

TEST_CASE("test_comm: gloo: abort wakes a collective waiting for a silent peer, and the peer fails at once") {
  // A cluster node stopped without closing its sockets (SIGSTOP, a partition): rank 1 joins the group
  // and then calls nothing. Rank 0 waits in each kind of call; another thread aborts it through the
  // abort registry (as the coordinator does when the liveness detector declares the node lost). The
  // wait ends at once naming the reason, not at the 60 s timeout; rank 1's next call fails at once too
  // (its connection to rank 0 was closed), and so does rank 0's next call.
  using clock = std::chrono::steady_clock;
  const std::vector<std::string> ops = {"all_reduce", "all_gather", "reduce_scatter", "broadcast", "recv", "barrier"};
  for (const auto& op : ops) {
    CAPTURE(op);
    const std::string dir = temp_dir("gloo_abort_" + op);
    std::unique_ptr<communicator> c[2];
    std::vector<std::thread> joiners;
    for (int r = 0; r < 2; ++r)
      joiners.emplace_back([&, r] {
        gloo_options o;
        o.rank = r;
        o.world_size = 2;
        o.store_dir = dir;
        o.timeout = 60s;
        c[r] = gloo_communicator(o);
      });
    for (auto& t : joiners) t.join();
    REQUIRE(c[0]);
    REQUIRE(c[1]);
    auto entry = register_abortable(*c[0], attempt_scope("run", 0), {"main", "w2"});
    std::string error;
    const auto t0 = clock::now();
    std::thread waiter([&] {
      try {
        auto x = tensor::from_floats({4}, {1, 2, 3, 4});
        auto all = tensor::zeros({8});
        auto half = tensor::zeros({2});
        if (op == "all_reduce") c[0]->all_reduce(x);
        else if (op == "all_gather") c[0]->all_gather(x, all);
        else if (op == "reduce_scatter") c[0]->reduce_scatter(x, half);
        else if (op == "broadcast") c[0]->broadcast(x, 1);
        else if (op == "recv") c[0]->recv(x, 1);
        else c[0]->barrier();
      } catch (const std::exception& e) {
        error = e.what();
      }
    });
    std::this_thread::sleep_for(300ms);
    CHECK(abort_spanning(attempt_scope("run", 0), "w1", "not this group") == 0);  // the group does not span w1
    CHECK(abort_spanning(attempt_scope("run", 1), "w2", "another attempt") == 0);
    CHECK(abort_spanning(attempt_scope("run", 0), "w2", "cluster node 'w2' was lost") == 1);
    waiter.join();
    CHECK(clock::now() - t0 < 10s);
    CHECK_MESSAGE(error.find(op + " (rank 0 of 2, gloo)") != std::string::npos, error);
    CHECK_MESSAGE(error.find("aborted: cluster node 'w2' was lost") != std::string::npos, error);
    // the silent peer's next call fails at once, as does every later call of the aborted rank
    const auto t1 = clock::now();
    CHECK_THROWS_AS(c[1]->barrier(), std::runtime_error);
    CHECK(clock::now() - t1 < 10s);
    CHECK_THROWS_WITH_AS(c[0]->barrier(), doctest::Contains("aborted: cluster node 'w2' was lost"), std::runtime_error);
    std::filesystem::remove_all(dir);
  }
  // an entry that went away is not aborted
  {
    auto in = make_communicator(comm_options{});
    { auto entry = register_abortable(*in, "scope", {"w3"}); }
    CHECK(abort_spanning("scope", "w3", "gone") == 0);
    auto entry = register_abortable(*in, "scope", {"w3"});
    CHECK(abort_scope("scope", "the part stops") == 1);
  }
}

TEST_CASE("test_comm: gloo: one rank, and a peer that never arrives") {
  gloo_options o;
  auto one = gloo_communicator(o);  // world_size 1: no rendezvous
  auto x = tensor::from_floats({2}, {1.0f, 2.0f});
  one->all_reduce(x);
  CHECK(x.item(1) == 2.0f);
  CHECK(one->backend() == "gloo");

  o.world_size = 2;
  CHECK_THROWS_AS(gloo_communicator(o), std::invalid_argument);  // no store_dir
  o.store_dir = temp_dir("gloo_missing");
  o.timeout = 500ms;
  auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH_AS(gloo_communicator(o), doctest::Contains("gloo rendezvous (rank 0 of 2"), std::runtime_error);
  CHECK(std::chrono::steady_clock::now() - start < 20s);
  CHECK(std::filesystem::is_empty(o.store_dir));  // no stale address for the next job
  std::filesystem::remove_all(o.store_dir);
  // The same over the CAF store: the error names the rendezvous, the store keeps nothing.
  auto host = host_caf_store();
  o.store_dir.clear();
  o.kv = open_store(host->address().str(), 5s);
  CHECK_THROWS_WITH_AS(gloo_communicator(o), doctest::Contains("gloo rendezvous (rank 0 of 2, a flowrun store"),
                       std::runtime_error);
  CHECK(host->size() == 0);
}

// Debian's gloo crashed the process (SIGSEGV in CreateDeviceAttr, no message) on a host name that does not
// resolve, in most runs of a cluster whose [cluster] main_address was one (cluster_small checks that case).
TEST_CASE("test_comm: gloo: a host name that does not resolve is an error naming it") {
  gloo_options o;
  o.world_size = 2;
  o.store_dir = temp_dir("gloo_bad_host");
  o.hostname = "nonexistent.invalid";  // RFC 6761: never resolves
  o.timeout = 500ms;
  for (int i = 0; i < 5; ++i)
    CHECK_THROWS_WITH_AS(gloo_communicator(o), doctest::Contains("the host 'nonexistent.invalid' does not resolve"),
                         std::runtime_error);
  std::filesystem::remove_all(o.store_dir);
}

#else

TEST_CASE("test_comm: gloo: not built") {
  MESSAGE("flowrun was built without gloo (libgloo-dev): the gloo tests are compiled out");
  CHECK_THROWS_WITH_AS(gloo_communicator(gloo_options{}), doctest::Contains("without gloo"), std::runtime_error);
}

#endif
