#!/usr/bin/env bash
# The console under load (docs/reliability.md, "Console under load"): graphs/pretrain.graph (two ZeRO-3 ranks)
# trains a fixed number of steps with the console on, PAIRS times with and PAIRS times without wrk driving the
# console's GET API, interleaved (load first in odd pairs, last in even ones). wrk (Debian package `wrk`; not in
# tools/setup.sh, this script installs it if missing) starts when the run's 10 s metrics line appears, runs
# WRK_S seconds (default 60) with WRK_THREADS threads and WRK_CONNS connections (default -t1 -c8: one core of
# a 2-core machine at most), and cycles through /api/status, /api/nodes, /api/graph, /api/edges,
# /api/bottlenecks, /api/signals, /api/memory, /api/cluster, /api/events, each with the token header.
# WRK_NICE (default 0) runs wrk at that nice level: a client on another machine takes none of the job's CPU,
# and on one 2-core machine WRK_NICE=19 comes closest to that (wrk then gets what the job leaves).
# The job's throughput is read from its own metrics lines (cumulative tokens, every 10 s): tokens over the lines
# at the start and the end of wrk's window, the same window in the run without load. Not for CI.
#
#   bench/console_load.sh [PAIRS=3] [BUILD_DIR=build] [STEPS=3500]
#
# Prints per run: wall time, window throughput, the job's CPU seconds; for wrk: requests/s, p50/p99 latency,
# non-2xx responses, socket errors and wrk's own CPU; then medians. Exits 1 if a request failed.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
pairs=${1:-3}
build=$(cd "${2:-$root/build}" && pwd)
steps=${3:-3500}
wrk_s=${WRK_S:-60} wrk_t=${WRK_THREADS:-1} wrk_c=${WRK_CONNS:-8} wrk_nice=${WRK_NICE:-0}
out="$build/console_load"
rm -rf "$out" && mkdir -p "$out"
export OMP_WAIT_POLICY=PASSIVE
if ! command -v wrk > /dev/null; then
  sudo=""; [[ $(id -u) -ne 0 ]] && sudo="sudo"
  $sudo apt-get install -y -qq wrk > /dev/null || { echo "wrk is missing and could not be installed (apt-get install wrk)"; exit 1; }
fi
pid=""
cleanup() { [[ -n "$pid" ]] && kill -9 "$pid" 2>/dev/null; wait 2>/dev/null; }
trap cleanup EXIT
cat > "$out/api.lua" <<'EOF'
-- cycles through the console's GET endpoints; the token comes from the environment
local paths = {"/api/status", "/api/nodes", "/api/graph", "/api/edges", "/api/bottlenecks?n=5", "/api/signals",
               "/api/memory", "/api/cluster", "/api/events"}
local i = 0
wrk.headers["Authorization"] = "Bearer " .. os.getenv("FLOWRUN_CONSOLE_TOKEN")
request = function()
  i = i % #paths + 1
  return wrk.format("GET", paths[i])
end
EOF
# one run: run NAME LOAD(0|1)
run() {
  local name=$1 load=$2 d="$out/$1" port="" t_start wrk_pid=""
  mkdir -p "$d"
  t_start=$(date +%s%N)
  FLOWRUN_CONSOLE_TOKEN="load-$$" /usr/bin/time -f "%U %S" -o "$d/cpu" "$build/bin/flowrun" run "$root/graphs/pretrain.graph" \
    --no-progress -q --threads 2 --console 0 \
    --set node.data.total_steps="$steps" --set node.ranks.total_steps="$steps" \
    --set node.ranks.output_dir="$d/ck" --set node.data.output_dir="$d/ck" --set node.ranks.save_checkpoint_steps=0 \
    --set node.ranks.export_hf= --set node.ranks.print_every=100000 > "$d/flowrun.out" 2> "$d/flowrun.err" &
  pid=$!
  if (( load )); then
    for _ in $(seq 1 600); do
      grep -q "\] 10\.[0-9]s: step" "$d/flowrun.err" 2>/dev/null && break
      kill -0 $pid 2>/dev/null || break
      sleep 0.1
    done
    port=$(sed -n 's|.*console: http://127.0.0.1:\([0-9]*\)/.*|\1|p' "$d/flowrun.err" | head -1)
    [[ -n "$port" ]] || { echo "$name: no console address"; tail "$d/flowrun.err"; return 1; }
    FLOWRUN_CONSOLE_TOKEN="load-$$" /usr/bin/time -f "%U %S" -o "$d/wrk.cpu" \
      nice -n "$wrk_nice" wrk -t"$wrk_t" -c"$wrk_c" -d"${wrk_s}s" --latency -s "$out/api.lua" "http://127.0.0.1:$port" > "$d/wrk.out" 2>&1 &
    wrk_pid=$!
  fi
  wait $pid
  local rc=$?
  pid=""
  [[ -n "$wrk_pid" ]] && wait "$wrk_pid"
  local wall_ms=$(( ($(date +%s%N) - t_start) / 1000000 ))
  [[ $rc -eq 0 ]] || { echo "$name: flowrun exited $rc"; tail "$d/flowrun.err"; return 1; }
  # the metrics lines: elapsed and cumulative tokens; the window is the lines at 10 s and 10 + WRK_S s
  sed -nE 's/.*\] ([0-9.]+)s: step [0-9]+, ([0-9]+) tokens .*/\1 \2/p' "$d/flowrun.err" > "$d/metrics"
  local tps
  tps=$(awk -v a=10 -v b=$((10 + wrk_s)) '$1 + 0.5 >= a && !t0 { t0 = $1; k0 = $2 } $1 + 0.5 >= b && !t1 { t1 = $1; k1 = $2 }
    END { if (t1 > t0) printf "%.0f", (k1 - k0) / (t1 - t0); else print "nan" }' "$d/metrics")
  [[ $tps == nan ]] && { echo "$name: the job ended before $((10 + wrk_s)) s (no metrics line there): raise STEPS"; return 1; }
  read -r u s < "$d/cpu"
  echo "$tps" > "$d/tps"; echo "$wall_ms" > "$d/wall_ms"
  local line="$name: wall $(awk -v m="$wall_ms" 'BEGIN { printf "%.1f", m / 1000 }') s, ${tps} tok/s in the window, job CPU $(awk -v u="$u" -v s="$s" 'BEGIN { printf "%.1f", u + s }') s"
  if (( load )); then
    local rps p50 p99 non2xx sock wu ws
    rps=$(awk '/^Requests\/sec/ { print $2 }' "$d/wrk.out")
    p50=$(awk '$1 == "50%" { print $2 }' "$d/wrk.out"); p99=$(awk '$1 == "99%" { print $2 }' "$d/wrk.out")
    non2xx=$(awk '/Non-2xx or 3xx responses/ { print $NF }' "$d/wrk.out"); non2xx=${non2xx:-0}
    sock=$(sed -n 's/.*Socket errors: //p' "$d/wrk.out"); sock=${sock:-none}
    read -r wu ws < "$d/wrk.cpu"
    echo "$rps $p99 $non2xx" > "$d/wrk.summary"
    line+="; wrk: $(awk '/requests in/ { print $1 }' "$d/wrk.out") requests, $rps req/s, p50 $p50, p99 $p99, non-2xx $non2xx, socket errors: $sock, wrk CPU $(awk -v u="$wu" -v s="$ws" -v w="$wrk_s" 'BEGIN { printf "%.1f s (%.0f%% of a core)", u + s, 100 * (u + s) / w }')"
    [[ "$non2xx" == 0 && "$sock" == none ]] || echo "$name" >> "$out/errors"
  fi
  echo "$line"
}
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores; load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "job: graphs/pretrain.graph, $steps steps, console on; wrk -t$wrk_t -c$wrk_c -d${wrk_s}s (nice $wrk_nice) from the 10 s metrics line"
for p in $(seq 1 "$pairs"); do
  if (( p % 2 )); then run "load.$p" 1 || exit 1; run "idle.$p" 0 || exit 1
  else run "idle.$p" 0 || exit 1; run "load.$p" 1 || exit 1; fi
done
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
tl=$(cat "$out"/load.*/tps | median) ti=$(cat "$out"/idle.*/tps | median)
wl=$(cat "$out"/load.*/wall_ms | median) wi=$(cat "$out"/idle.*/wall_ms | median)
echo "SUMMARY console under load ($pairs pairs, medians): throughput $ti tok/s without, $tl tok/s with wrk ($(awk -v a="$ti" -v b="$tl" 'BEGIN { printf "%+.1f%%", 100 * (b - a) / a }')); wall $(awk -v m="$wi" 'BEGIN { printf "%.1f", m / 1000 }') s vs $(awk -v m="$wl" 'BEGIN { printf "%.1f", m / 1000 }') s; wrk $(cut -d' ' -f1 "$out"/load.*/wrk.summary | median) req/s, p99 $(cut -d' ' -f2 "$out"/load.*/wrk.summary | paste -sd/ -) per run; failed requests in $(cat "$out/errors" 2>/dev/null | wc -l) runs"
[[ ! -s "$out/errors" ]]
