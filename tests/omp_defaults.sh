#!/usr/bin/env bash
# The subcommands that run graphs re-execute flowrun with OMP_WAIT_POLICY=active and GOMP_SPINCOUNT=300000
# unless the user set either; the others leave libgomp's defaults (tools/flowrun/omp_defaults.cpp).
# Usage: omp_defaults.sh FLOWRUN
set -uo pipefail
flowrun=$1
fail() { echo "omp_defaults: $*" >&2; exit 1; }
show() { env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT -u FLOWRUN_OMP_DEFAULTS FLOWRUN_SHOW_OMP=1 "$@" 2>&1 >/dev/null; }
got=$(show "$flowrun" run /nonexistent/omp_defaults.graph)
[[ "$got" == *"OMP_WAIT_POLICY=active GOMP_SPINCOUNT=300000 (flowrun's defaults)"* ]] || fail "run: got '$got'"
[[ "$got" == *"omp_defaults.graph"* ]] || fail "run: the re-executed run did not report the missing graph: '$got'"
got=$(show "$flowrun" /nonexistent/omp_defaults.graph)  # the graph shorthand is `run`
[[ "$got" == *"(flowrun's defaults)"* ]] || fail "shorthand: got '$got'"
got=$(show "$flowrun" kinds)
[[ "$got" == *"OMP_WAIT_POLICY=(unset) GOMP_SPINCOUNT=(unset) (libgomp's defaults)"* ]] || fail "kinds: got '$got'"
got=$(show env OMP_WAIT_POLICY=PASSIVE "$flowrun" run /nonexistent/omp_defaults.graph)
[[ "$got" == *"OMP_WAIT_POLICY=PASSIVE GOMP_SPINCOUNT=(unset) (the user's)"* ]] || fail "passive: got '$got'"
got=$(show env GOMP_SPINCOUNT=5 "$flowrun" run /nonexistent/omp_defaults.graph)
[[ "$got" == *"OMP_WAIT_POLICY=(unset) GOMP_SPINCOUNT=5 (the user's)"* ]] || fail "spincount: got '$got'"
# FLOWRUN_OMP_DEFAULTS=1 alone (a user's export) is not flowrun's settings
got=$(show env FLOWRUN_OMP_DEFAULTS=1 "$flowrun" kinds)
[[ "$got" == *"(libgomp's defaults)"* ]] || fail "marker alone: got '$got'"
# started through the dynamic loader, /proc/self/exe is the loader: no re-exec, the run goes on
loader=$(readlink -f /lib64/ld-linux-x86-64.so.2 2>/dev/null || true)
if [[ -x "$loader" ]]; then
  got=$(show "$loader" "$flowrun" run /nonexistent/omp_defaults.graph)
  [[ "$got" == *"(libgomp's defaults)"* && "$got" == *"omp_defaults.graph"* ]] || fail "loader: got '$got'"
fi
echo "omp_defaults: ok"
