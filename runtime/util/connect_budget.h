// The time one connect attempt gets inside a retry loop bounded by a connect timeout.
#pragma once

#include <algorithm>
#include <chrono>

namespace flowrun {

/// The time limit of one connect attempt: what is `left` of the loop's `timeout`, but, for a retry
/// (`retry`: an earlier attempt was refused), at least min(timeout, 1 s), so that the verdict is the
/// port's own answer. A retry given only the last millisecond timed out in the middleman of a loaded
/// machine, and a port that had refused every try was reported as one that accepts connections but
/// does not speak (cluster_small failed so about one run in 15 under `ctest -j2`). At least 1 ms.
inline std::chrono::milliseconds connect_attempt_budget(std::chrono::milliseconds left,
                                                        std::chrono::milliseconds timeout, bool retry) {
  const auto floor = retry ? std::min(timeout, std::chrono::milliseconds(1000)) : std::chrono::milliseconds(1);
  return std::max({left, floor, std::chrono::milliseconds(1)});
}

}  // namespace flowrun
