// The OpenMP wait settings flowrun gives the subcommands that run graphs (tools/flowrun/omp_defaults.cpp
// says why), and how any flowrun process tells that it runs with them.
#pragma once

#include <cstdlib>
#include <cstring>

namespace flowrun {

/// The values flowrun sets when the user set neither variable, and its marker (FLOWRUN_OMP_DEFAULTS=1).
inline constexpr const char* k_omp_wait_policy = "active";
inline constexpr const char* k_gomp_spincount = "300000";

/// Whether this process runs with flowrun's settings: the marker and both values as flowrun sets them
/// (the flowrun processes it starts inherit them). A hand-exported marker alone is not enough, so a
/// user's own OMP_WAIT_POLICY or GOMP_SPINCOUNT is never taken for flowrun's.
inline bool omp_defaults_applied() {
  auto is = [](const char* name, const char* want) {
    const char* v = std::getenv(name);
    return v && std::strcmp(v, want) == 0;
  };
  return is("FLOWRUN_OMP_DEFAULTS", "1") && is("OMP_WAIT_POLICY", k_omp_wait_policy) &&
         is("GOMP_SPINCOUNT", k_gomp_spincount);
}

}  // namespace flowrun
