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
// Nor is anything when /proc/self/exe is the dynamic loader (`ld-linux-x86-64.so.2 flowrun run ...`:
// exec-ing it with flowrun's arguments would load the wrong program). The re-exec costs one more
// process start (~0.1 s) per graph run; the commands that run no graph (generate, chat, eval, ...)
// hold one OpenMP pool, which libgomp does not throttle, and are left alone. Child processes that are
// not flowrun (a reward function's script, runtime/util/line_process.cpp) get the user's environment.
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/util/omp_defaults.h"
#include "tools/flowrun/commands.h"

namespace flowrun::cli {

void apply_omp_defaults(const std::vector<std::string>& args, char** argv) {
  if (args.size() < 2) return;
  const std::string& sub = args[1];
  if (sub != "run" && sub != "train" && sub != "launch" && sub != "node") return;
  if (std::getenv("OMP_WAIT_POLICY") || std::getenv("GOMP_SPINCOUNT")) return;
#if defined(__linux__)
  char exe[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) return;
  exe[n] = '\0';
  const char* base = std::strrchr(exe, '/');
  base = base ? base + 1 : exe;
  if (std::strncmp(base, "ld-", 3) == 0 || std::strncmp(base, "ld.so", 5) == 0) return;  // run through the loader
  setenv("OMP_WAIT_POLICY", k_omp_wait_policy, 1);
  setenv("GOMP_SPINCOUNT", k_gomp_spincount, 1);
  setenv("FLOWRUN_OMP_DEFAULTS", "1", 1);
  execv("/proc/self/exe", argv);  // returns only on failure: then run on with libgomp's defaults
  unsetenv("OMP_WAIT_POLICY");
  unsetenv("GOMP_SPINCOUNT");
  unsetenv("FLOWRUN_OMP_DEFAULTS");
#else
  (void)argv;
#endif
}

void show_omp_settings_if_asked() {
  const char* show = std::getenv("FLOWRUN_SHOW_OMP");
  if (!show || *show != '1') return;
  auto val = [](const char* n) { const char* v = std::getenv(n); return v ? v : "(unset)"; };
  const char* who = flowrun::omp_defaults_applied()                                            ? "flowrun's defaults"
                    : std::getenv("OMP_WAIT_POLICY") || std::getenv("GOMP_SPINCOUNT") ? "the user's"
                                                                                      : "libgomp's defaults";
  std::fprintf(stderr, "flowrun: OMP_WAIT_POLICY=%s GOMP_SPINCOUNT=%s (%s)\n", val("OMP_WAIT_POLICY"),
               val("GOMP_SPINCOUNT"), who);
}


}  // namespace flowrun::cli
