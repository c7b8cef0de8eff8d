// The end of a run's actor system: why and how in teardown.h.
#include "runtime/actor/teardown.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <thread>

#include <caf/all.hpp>
#include <spdlog/spdlog.h>

namespace flowrun::actor {

void teardown_actor_system(std::unique_ptr<caf::actor_system> sys, bool clustered, int exit_code,
                           const std::string& error) {
  if (!clustered) {
    sys.reset();
    return;
  }
  auto done = std::make_shared<std::promise<void>>();
  caf::actor_system* raw = sys.get();  // alive until ~actor_system's body ends: its registry with it
  std::thread watchdog([finished = done->get_future(), exit_code, error, raw]() mutable {
    if (finished.wait_for(std::chrono::seconds(10)) == std::future_status::ready) return;
    if (!error.empty()) spdlog::error("{}", error);  // what the caller would have printed
    spdlog::warn("the CAF actor system did not shut down within 10 s after the run ended (CAF 0.17 still holds an "
                 "actor of it); exiting with the run's exit code {}",
                 exit_code);
    // ~actor_system first waits for CAF's count of running actors to drop to zero (an actor that never
    // exited), then for every detached event-based actor's thread (one that exited but was not destroyed).
    spdlog::warn("CAF counts {} running actor(s); its destructor waits for 0", raw->registry().running());
    spdlog::default_logger()->flush();
    std::fflush(stdout);
    std::fflush(stderr);
    std::_Exit(exit_code);
  });
  sys.reset();
  done->set_value();
  watchdog.join();
}

}  // namespace flowrun::actor
