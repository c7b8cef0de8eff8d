// OpenMP's wait settings for the subcommands that run graphs.
//
// A graph runs each node on its own thread, and every thread that starts OpenMP regions gets its own
// libgomp pool, so a graph holds more OpenMP threads than cores. libgomp then waits with its
// "throttled" spin count (100 spins by default, about a microsecond) before sleeping on a futex, and
// every region of a node running alone (the generator's decode steps: ~50 regions per token of a few
// microseconds each) pays a futex wake-up. OMP_WAIT_POLICY=active raises the throttled count to 1,000;
// GOMP_SPINCOUNT=300000 keeps the ordinary count at libgomp's own default (not active's 5 minutes of
// spinning), so a process with no more OpenMP threads than cores waits as before. Measured on
// graphs/ppo.graph at 6.1 M parameters: the iteration 0.509 -> 0.454 s, generation 1,780-1,930 ->
// 2,130-3,180 tokens/s (docs/performance.md change 25).
//
// libgomp reads its environment once, in its constructor, before main. Setting the variables earlier,
// from the executable's .preinit_array, does not hold: libc's own initializer then resets environ to
// the process's original block. So the process re-executes itself once (same pid, arguments and
// standard streams) with the two variables set, and with FLOWRUN_OMP_DEFAULTS=1, which says who chose
// them. A user's own setting of either variable wins: then nothing is set and nothing re-executed.
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "tools/flowrun/commands.h"

namespace flowrun::cli {

void apply_omp_defaults(const std::vector<std::string>& args, char** argv) {
  if (args.size() < 2) return;
  const std::string& sub = args[1];
  if (sub != "run" && sub != "train" && sub != "launch" && sub != "node") return;
  if (std::getenv("OMP_WAIT_POLICY") || std::getenv("GOMP_SPINCOUNT")) return;
#if defined(__linux__)
  setenv("OMP_WAIT_POLICY", "active", 1);
  setenv("GOMP_SPINCOUNT", "300000", 1);
  setenv("FLOWRUN_OMP_DEFAULTS", "1", 1);
  execv("/proc/self/exe", argv);  // returns only on failure: then run on with libgomp's defaults
  unsetenv("OMP_WAIT_POLICY");
  unsetenv("GOMP_SPINCOUNT");
  unsetenv("FLOWRUN_OMP_DEFAULTS");
#else
  (void)argv;
#endif
}

bool omp_defaults_applied() {
  const char* v = std::getenv("FLOWRUN_OMP_DEFAULTS");
  return v && *v == '1';
}

}  // namespace flowrun::cli
