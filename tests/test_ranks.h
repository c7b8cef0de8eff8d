// Runs one function per rank on threads of this process over an inproc communicator group:
// the ZeRO and engine suites' way to test N ranks without N processes.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "runtime/comm/communicator.h"
#include "runtime/kernels/ops.h"

namespace flowrun::test {

/// fn(rank, communicator&) on `world` threads, each with 1/world of the cores and a 60 s
/// collective timeout; then REQUIREs that no rank threw, naming the rank and its message.
template <class F>
void on_inproc_ranks(int world, F&& fn) {
  auto group = comm::make_inproc_group(world);
  std::vector<std::string> errors(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      try {
        ops::set_thread_budget(std::max(1, ops::hardware_threads() / world));
        auto c = comm::inproc_communicator(group, r, std::chrono::seconds(60));
        fn(r, *c);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < world; ++r) REQUIRE_MESSAGE(errors[r].empty(), "rank " << r << ": " << errors[r]);
}

}  // namespace flowrun::test
