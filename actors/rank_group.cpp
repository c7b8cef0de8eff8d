#include "actors/rank_group.h"
#include "models/checkpoint.h"

#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "actors/resume_check.h"
#include "runtime/actor/job.h"
#include "runtime/comm/caf_store.h"
#include "runtime/comm/store.h"
#include "runtime/graph/parse.h"

namespace flowrun::actors {

namespace {

int env_int(const char* name, int dflt) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : dflt;
}

// What the `members` replicas of a node in this process share, by key: the first replica to start
// makes it (`make`); it is forgotten once every replica has taken it.
std::mutex shared_mutex;
std::map<std::string, std::pair<std::shared_ptr<void>, std::size_t>> shared_objects;

template <class T, class Make>
std::shared_ptr<T> join_shared(const std::string& key, std::size_t members, Make&& make) {
  std::lock_guard<std::mutex> lock(shared_mutex);
  auto& slot = shared_objects[key];
  if (!slot.first) slot = {std::shared_ptr<void>(make()), 0};
  auto g = std::static_pointer_cast<T>(slot.first);
  if (++slot.second == members) shared_objects.erase(key);
  return g;
}


// The settings that ranks in other processes must share, each "name" -> a hash of its value: the node's
// settings record (resume_check.h: a file by its contents where the record has them), less what only prints
// (print_every, ...). A path the record holds only as a path (a model, an output folder) is compared by its
// last name and, for a file, its size: each machine may spell the folders its own way (another
// FLOWRUN_ASSETS), while another model file or checkpoint mostly differs there. Sorted by name (the record
// is a sorted JSON object; its values are graph::to_string's, a string quoted).
std::vector<std::pair<std::string, std::uint64_t>> shared_settings(const graph::node_spec& n) {
  const nlohmann::json rec = settings_record(n, {});
  const std::string contents = " (contents)";
  std::vector<std::pair<std::string, std::uint64_t>> out;
  for (const auto& [k, v] : rec.items()) {
    if (k.find("print") != std::string::npos) continue;
    const bool by_contents = k.size() > contents.size() && k.compare(k.size() - contents.size(), contents.size(), contents) == 0;
    std::string value = v.dump();
    if (k == "model (contents)" && v.is_object()) {  // a model folder, file by file: those a model is read from (resume_check.h)
      nlohmann::json files = nlohmann::json::object();
      for (const auto& [f, fp] : v.items())
        if (is_model_file(f)) files[f] = fp;
      value = files.dump();
    }
    if (!by_contents) {
      if (rec.contains(k + contents)) continue;
      const auto* set = n.find_setting(k);
      if (const auto* p = set ? std::get_if<std::string>(&set->value) : nullptr; p && !p->empty() && (*p)[0] == '/') {
        std::error_code ec;
        const std::filesystem::path path(*p);
        const auto size = std::filesystem::is_regular_file(path, ec) ? std::filesystem::file_size(path, ec) : 0;
        value = path.filename().string() + "|" + std::to_string(ec ? 0 : size);
      }
    }
    out.emplace_back(k, graph::fnv1a64(value));
  }
  return out;
}

// Ranks in several processes (flowrun launch, processes started by hand, cluster nodes) check at the
// rendezvous that they run the node with the same settings: two processes started by hand with another
// learning rate trained their shards at different rates without a word, another zero_stage hung until
// comm_timeout_s. Two all_gathers: the count, then each setting's hash as four 16-bit floats (exact).
// Every rank sees the same gathered values and reaches the same verdict (all throw, or none).
void check_same_settings(actor::node_context& ctx, comm::communicator& c, int local_ranks) {
  const int W = c.world_size();
  if (W == local_ranks) return;  // one process: one spec
  const auto mine = shared_settings(ctx.spec());
  const auto K = static_cast<int64_t>(mine.size());
  const device dev = c.tensor_device();
  auto gather = [&](const std::vector<float>& v) {
    tensor send = tensor::from_floats({static_cast<int64_t>(v.size())}, v).to(dev);
    tensor recv = tensor::zeros({W * static_cast<int64_t>(v.size())}, dtype::f32, dev);
    c.all_gather(send, recv);
    return recv.to(device::cpu());
  };
  const tensor counts = gather({static_cast<float>(K)});
  std::string other;
  for (int r = 0; r < W; ++r)
    if (counts.data<float>()[r] != static_cast<float>(K)) other += (other.empty() ? "" : ", ") + std::to_string(r);
  std::vector<std::string> differ;
  if (other.empty()) {
    std::vector<float> h;
    for (const auto& [k, x] : mine)
      for (int q = 0; q < 4; ++q) h.push_back(static_cast<float>((x >> (16 * q)) & 0xffff));
    const tensor all = gather(h);
    const float* a = all.data<float>();
    for (int64_t i = 0; i < K; ++i)
      for (int r = 1; r < W; ++r) {
        bool same = true;
        for (int q = 0; q < 4; ++q) same &= a[r * 4 * K + 4 * i + q] == a[4 * i + q];
        if (!same) {
          differ.push_back(mine[static_cast<size_t>(i)].first + " (rank " + std::to_string(r) + ")");
          break;
        }
      }
  }
  c.reset_stats();  // the check is no traffic of the node's
  if (other.empty() && differ.empty()) return;
  throw std::invalid_argument(fmt::format(
      "node '{}': its {} ranks do not run with the same settings as rank 0: {}; start every process with the "
      "same graph file, --set overrides and files (flowrun launch and a cluster do)",
      ctx.name(), W,
      other.empty() ? "they differ in " + fmt::format("{}", fmt::join(differ, ", "))
                    : "rank(s) " + other + " have other settings altogether (another graph or kind)"));
}

}  // namespace

int process_index() { return actor::launch_process_index(); }
int process_count() { return env_int("FLOWRUN_NPROC", 1); }

bool all_replicas_here(const actor::node_context& ctx) {
  if (process_count() > 1) return false;
  for (std::int64_t r = 0; r < static_cast<std::int64_t>(ctx.replicas()); ++r)
    if (graph::placement_of(ctx.spec(), r) != graph::main_process_name) return false;
  return true;
}

rank_group join_rank_group(actor::node_context& ctx) {
  const auto& s = ctx.spec();
  const int nproc = process_count(), pidx = process_index();
  rank_group g;
  g.local_ranks = static_cast<int>(ctx.replicas());
  g.world = g.local_ranks * nproc;
  g.rank = pidx * g.local_ranks + static_cast<int>(ctx.replica());
  comm::comm_options co;
  co.backend = s.get_string("comm_backend");
  co.rank = g.rank;
  co.world_size = g.world;
  co.timeout = std::chrono::seconds(s.get_int("comm_timeout_s"));
  if (co.backend == "inproc") {
    if (nproc > 1)
      throw std::invalid_argument("node '" + ctx.name() + "': comm_backend \"inproc\" joins threads of one process; "
                                  "with flowrun launch --nproc " + std::to_string(nproc) + " use \"gloo\"");
    co.group = join_shared<comm::inproc_group>("inproc/" + ctx.name(), ctx.replicas(),
                                                [&] { return comm::make_inproc_group(g.world); });
  } else {
    // The rendezvous, first found: the node's rendezvous (caf://HOST:PORT or a folder), its
    // store_dir, the cluster run's store (ctx.rendezvous_store()), $FLOWRUN_RENDEZVOUS (flowrun
    // launch --rendezvous caf), $FLOWRUN_STORE_DIR (--rendezvous file). gloo's addresses and
    // NCCL's unique id go through it.
    const char* rv = std::getenv("FLOWRUN_RENDEZVOUS");
    const char* sd = std::getenv("FLOWRUN_STORE_DIR");
    if (!s.get_string("rendezvous").empty())
      co.kv = comm::open_store(s.get_string("rendezvous"), co.timeout);
    else if (!s.get_string("store_dir").empty())
      co.store_dir = s.get_string("store_dir");
    else if (ctx.rendezvous_store())  // a cluster run's store (ranks on several cluster nodes)
      co.kv = ctx.rendezvous_store();
    else if (rv && *rv)
      co.kv = comm::open_store(rv, co.timeout);
    else if (sd && *sd)
      co.store_dir = sd;
    else if (all_replicas_here(ctx))  // threads of this one process (a restart moved a cluster's ranks to main)
      co.kv = join_shared<comm::store>("store/" + comm::attempt_scope(ctx.run_id(), ctx.attempt()) + "/" + ctx.name(),
                                       ctx.replicas(), [] { return std::make_shared<comm::memory_store>(); });
    else
      throw std::invalid_argument("node '" + ctx.name() + "': comm_backend \"" + co.backend +
                                  "\" needs a rendezvous: rendezvous (caf://HOST:PORT), store_dir (a folder every "
                                  "rank sees), FLOWRUN_RENDEZVOUS or FLOWRUN_STORE_DIR (flowrun launch sets one)");
    // the processes of one flowrun launch (FLOWRUN_LAUNCHER_PID) share the FLOWRUN_RUN_ID it made, unique to the
    // launch: in the prefix, the records a launch that failed at the rendezvous left in the same --store folder are
    // never read as this one's (they failed it, "records left by a crashed job"). Processes started by hand keep the
    // plain prefix, whatever FLOWRUN_RUN_ID each has: a user's id may be a requeued job's again (its records would
    // meet it), or differ between them (they would wait out comm_timeout_s under two prefixes)
    const char* launched = std::getenv("FLOWRUN_LAUNCHER_PID");
    const char* shared = std::getenv("FLOWRUN_RUN_ID");
    const bool scoped = launched && *launched && shared && ctx.run_id() == shared;
    co.prefix = "flowrun/" + (scoped ? ctx.run_id() + "/" : std::string()) + ctx.name();
  }
  g.comm = comm::make_communicator(co);
  g.rendezvous = co.kv;
  std::set<std::string> places;
  for (std::int64_t r = 0; r < static_cast<std::int64_t>(ctx.replicas()); ++r) places.insert(graph::placement_of(s, r));
  g.abortable = comm::register_abortable(*g.comm, comm::attempt_scope(ctx.run_id(), ctx.attempt()), std::move(places));
  if (co.backend != "inproc") check_same_settings(ctx, *g.comm, g.local_ranks);
  return g;
}

const std::set<std::string>& rank_group_setting_names() {
  static const std::set<std::string> names = {"comm_backend", "rendezvous", "store_dir", "comm_timeout_s"};
  return names;
}

void add_rank_group_settings(graph::node_kind& k) {
  using T = graph::setting_type;
  k.option("comm_backend", T::string, std::string("inproc"), "inproc (threads), gloo (processes) or nccl (GPUs)")
      .option("rendezvous", T::string, std::string(""),
              "gloo/nccl rendezvous: caf://HOST:PORT (a CAF store) or a folder (default: $FLOWRUN_RENDEZVOUS)")
      .option("store_dir", T::output, std::string(""), "gloo/nccl rendezvous folder (default: $FLOWRUN_STORE_DIR)")
      .option("comm_timeout_s", T::int_, std::int64_t{300}, "how long a collective waits for the other ranks").at_least(1);
}

}  // namespace flowrun::actors
