#!/usr/bin/env bash
# The cluster tests under a CPU hog: each of tests/cluster_*.sh RUNS times in a row while every core is kept
# busy (stress-ng --cpu NPROC from Debian where installed, else one busy loop per core), at the same priority.
# A healthy node must never be declared lost (docs/reliability.md). Not for CI: about 40 minutes on 2 cores.
#
#   bench/cluster_under_load.sh [RUNS=20] [BUILD_DIR=build] [TESTS="cluster_small cluster_rlhf_small cluster_pretrain_small"]
#
# Prints one line per run (test, run, exit code, seconds, loss lines seen, teardown watchdogs) and a summary per test; the logs of a
# failed run stay in $BUILD_DIR/under_load/TEST.RUN.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
runs=${1:-20}
build=$(cd "${2:-$root/build}" && pwd)
tests=${3:-"cluster_small cluster_rlhf_small cluster_pretrain_small"}
out="$build/under_load"
mkdir -p "$out"
hog=()
cleanup() { for p in "${hog[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; }
trap cleanup EXIT
if command -v stress-ng > /dev/null; then
  stress-ng --cpu "$(nproc)" --quiet & hog+=($!)
  echo "hog: stress-ng --cpu $(nproc)"
else
  for _ in $(seq 1 "$(nproc)"); do (while :; do :; done) & hog+=($!); done
  echo "hog: $(nproc) busy loops"
fi
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores"
export OMP_WAIT_POLICY=PASSIVE
for t in $tests; do
  pass=0 fail=0 false_losses=0 watchdogs=0
  for r in $(seq 1 "$runs"); do
    dir="$out/$t.$r"
    rm -rf "$dir"
    t0=$(date +%s%N)
    case $t in
      cluster_small) bash "$root/tests/cluster_small.sh" "$build/bin/flowrun" "$root" "$dir" "$build/bin/flowctl" > "$dir.log" 2>&1 ;;
      *) bash "$root/tests/$t.sh" "$build/bin/flowrun" "$root" "$dir" > "$dir.log" 2>&1 ;;
    esac
    rc=$?
    s=$(( ($(date +%s%N) - t0) / 1000000000 ))
    # a loss by heartbeat where the test killed nothing by SIGSTOP is false (the tests' SIGKILLs drop the connection)
    fl=$(grep -rh "lost (no heartbeat" "$dir" "$dir.log" 2>/dev/null | grep -v "'w5'" | wc -l)
    false_losses=$((false_losses + fl))
    # the teardown watchdog (runtime/actor/teardown.h) ending a process whose actor system did not shut down
    wd=$(grep -rh "did not shut down within" "$dir" "$dir.log" 2>/dev/null | wc -l)
    watchdogs=$((watchdogs + wd))
    if [[ $rc -eq 0 ]]; then pass=$((pass + 1)); rm -rf "$dir"; else fail=$((fail + 1)); fi
    echo "$t run $r: exit $rc, ${s} s, heartbeat losses of healthy nodes: $fl, teardown watchdogs: $wd"
  done
  echo "SUMMARY $t: $pass passed, $fail failed, $false_losses false losses, $watchdogs teardown watchdogs in $runs runs under the hog"
done
