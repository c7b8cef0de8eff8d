#include "actors/rank_group.h"

#include <cstdlib>
#include <map>
#include <mutex>
#include <stdexcept>

#include "runtime/comm/caf_store.h"

namespace flowrun::actors {

namespace {

int env_int(const char* name, int dflt) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : dflt;
}

// The in-process groups of this process's replicas, by node name (the first
// replica to start makes it; it is forgotten once every replica has joined).
std::mutex groups_mutex;
std::map<std::string, std::pair<std::shared_ptr<comm::inproc_group>, std::size_t>> groups;

std::shared_ptr<comm::inproc_group> join_inproc(const std::string& key, int world, std::size_t members) {
  std::lock_guard<std::mutex> lock(groups_mutex);
  auto& slot = groups[key];
  if (!slot.first) slot = {comm::make_inproc_group(world), 0};
  auto g = slot.first;
  if (++slot.second == members) groups.erase(key);
  return g;
}

}  // namespace

int process_index() { return env_int("FLOWRUN_PROCESS_INDEX", 0); }
int process_count() { return env_int("FLOWRUN_NPROC", 1); }

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
    co.group = join_inproc(ctx.name(), g.world, ctx.replicas());
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
    else
      throw std::invalid_argument("node '" + ctx.name() + "': comm_backend \"" + co.backend +
                                  "\" needs a rendezvous: rendezvous (caf://HOST:PORT), store_dir (a folder every "
                                  "rank sees), FLOWRUN_RENDEZVOUS or FLOWRUN_STORE_DIR (flowrun launch sets one)");
    co.prefix = "flowrun/" + ctx.name();
  }
  g.comm = comm::make_communicator(co);
  g.rendezvous = co.kv;
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
