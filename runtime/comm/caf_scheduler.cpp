#include "runtime/comm/caf_scheduler.h"

#include <algorithm>
#include <chrono>
#include <thread>

namespace flowrun::comm {

void configure_scheduler(caf::actor_system_config& cfg, std::size_t threads) {
  if (threads == 0) threads = std::max(2u, std::thread::hardware_concurrency());
  cfg.set("scheduler.max-threads", static_cast<caf::config_value::integer>(threads));
  cfg.set("scheduler.max-throughput", static_cast<caf::config_value::integer>(4));
  cfg.set("work-stealing.moderate-sleep-duration", caf::timespan{std::chrono::microseconds{500}});
}

}  // namespace flowrun::comm
