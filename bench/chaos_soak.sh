#!/usr/bin/env bash
# Chaos soak (docs/reliability.md, "Chaos soak"): graphs/rlhf.graph over 3 processes on 127.0.0.1 (main and the
# node daemons w1, w2, placed as in tests/cluster_rlhf_small.sh) with on_node_lost = "restart" and the graph's
# checkpoint_dir set, so steps 1-2 and step 3 commit checkpoints as the graph says (sft and rm every 40 / 50
# updates, step 3 every 10 iterations). A killer SIGKILLs a random process every
# 2-4 minutes (random): w1 or w2 (its daemon is started again on the same port after 0.5-8 s, so it may rejoin
# within rejoin_wait_ms or have its actors moved to main), or the coordinator main (the script then runs the same
# command again, which resumes from what was saved: steps 1-2's done markers and step 3's last commit). Runs
# repeat until SOAK_MIN minutes have passed (the run in progress finishes). Every finished run's policy, sft model
# and reward model must be byte-identical (cmp) to an uninterrupted single-process reference run made once at the
# start; every result line any of its attempts printed must be one of the reference's lines, and every one of the
# reference's lines must have been printed (timings aside). Not for CI.
# The script re-runs a killed coordinator at once on purpose: that case once lost its handshake with a daemon
# (CAF 0.17 reused the dead connection's name; runtime/actor/socket_numbers.h, tests/cluster_rerun_small.sh).
#
#   bench/chaos_soak.sh [SOAK_MIN=30] [BUILD_DIR=build] [--set ... to scale the graph]
#
# CHAOS_KILL_MIN_S and CHAOS_KILL_SPAN_S (default 120 and 120) set the kills' interval (for a quick try).
# Prints a line per kill and per run and a summary (runs, kills by node and by phase, restarts, resumes,
# failures, what was retrained); exits 1 on any mismatch or failed run. Logs: BUILD_DIR/chaos_soak/.
# The restart policy allows at most 4 attempts per coordinator process (max_restarts 3); a coordinator re-run
# after main was killed starts a new chain. With kills 2-4 minutes apart and a cluster run of 1-2 minutes, one
# process sees at most 2-3 node kills.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
soak_min=${1:-30}
build=$(cd "${2:-$root/build}" && pwd)
shift $(( $# < 2 ? $# : 2 ))
extra=("$@")
flowrun="$build/bin/flowrun"
out="$build/chaos_soak"
rm -rf "$out" && mkdir -p "$out/logs" "$out/pids" "$out/killed"
export OMP_WAIT_POLICY=PASSIVE
kill_min_s=${CHAOS_KILL_MIN_S:-120} kill_span_s=${CHAOS_KILL_SPAN_S:-120}  # a kill every 2-4 minutes

cleanup() {
  touch "$out/stop"
  [[ -n "${killer_pid:-}" ]] && kill "$killer_pid" 2>/dev/null
  for f in "$out"/main.pid "$out"/pids/*; do [[ -e "$f" ]] && kill -9 "$(cat "$f")" 2>/dev/null; done
  wait 2>/dev/null
}
trap cleanup EXIT
echo "chaos-secret-$$-$RANDOM" > "$out/secret"
now() { date +%s; }
t0=$(now)
stamp() { printf '%5ds' $(( $(now) - t0 )); }

common=(--no-progress --threads 2 "${extra[@]}")
split=(--set node.prompts.on=w1 --set node.ppo_controller.on=w2 --set node.sft.on=w1 --set node.rm.on=w1
       --set node.generator.on=w1 --set node.reward.on=w2 --set node.critic.on=w2)
outputs() { echo --set graph.checkpoint_dir="$1/ck" --set node.sft.output="$1/sft.bin" --set node.rm.output="$1/rm" \
  --set node.policy.output="$1/ppo.bin"; }
# result lines without timings, memory lines (printed where a trainer runs) and the checkpoint folder
results() {
  grep -h '^\[step' | grep -v '^\[step 3 ppo\] [a-z_]* memory rank' \
    | sed -E 's/ \([0-9]+ tokens\/s\)//; s/ gen [0-9]+ tok\/s train [0-9]+ tok\/s//; s/[,;] [0-9.]+ s$//; s/ -> [^ ]*\/ck(\/[^ ]*)?$/ -> CK\1/'
}

# --- the reference: one process, uninterrupted
ref="$out/ref"
mkdir -p "$ref"
echo "$(stamp) reference run (one process)"
"$flowrun" "$root/graphs/rlhf.graph" "${common[@]}" $(outputs "$ref") > "$ref/main.log" 2> "$ref/main.err" \
  || { echo "the reference run failed:"; tail -20 "$ref/main.err"; exit 1; }
results < "$ref/main.log" > "$ref/results"
sort -u "$ref/results" > "$ref/results.set"
ref_s=$(( $(now) - t0 ))
echo "$(stamp) reference done in ${ref_s} s: $(wc -l < "$ref/results") result lines"
count() { grep -c "$1" "$2" || true; }
ref_sft=$(count '^\[step 1 sft\] step [0-9]' "$ref/results")
ref_rm=$(count '^\[step 2 rm\] step [0-9]' "$ref/results")
ref_ppo=$(count '^\[step 3 ppo\] iter [0-9]' "$ref/results")
sft_every=$(sed -nE 's/^\[step 1 sft\] step ([0-9]+)\/.*/\1/p' "$ref/results" | head -1)
rm_every=$(sed -nE 's/^\[step 2 rm\] step ([0-9]+)\/.*/\1/p' "$ref/results" | head -1)

# --- the daemons: w1, w2 (no --once: each takes the next job); start_daemon NAME [PORT]
declare -A port
start_daemon() {
  local w=$1 p=${2:-0} n
  n=$(ls "$out/logs" | grep -c "^$w\.[0-9]*\.out$")
  rm -f "$out/$w.port"
  "$flowrun" node --listen "127.0.0.1:$p" --secret-file "$out/secret" --port-file "$out/$w.port" --threads 2 \
    > "$out/logs/$w.$n.out" 2> "$out/logs/$w.$n.err" &
  echo $! > "$out/pids/$w"
  disown $!  # never waited for: no job notice when the killer ends it
  for _ in $(seq 1 400); do [[ -s "$out/$w.port" ]] && break; sleep 0.05; done
  [[ -s "$out/$w.port" ]] || { echo "$(stamp) daemon $w did not start on port $p:"; tail -5 "$out/logs/$w.$n.err"; return 1; }
}
for w in w1 w2; do start_daemon $w || exit 1; port[$w]=$(cat "$out/$w.port"); done
{ echo "[cluster]"; echo "heartbeat_ms = 250"; echo 'on_node_lost = "restart"'; echo "rejoin_wait_ms = 4000"
  for w in w1 w2; do echo "[cluster.nodes.$w]"; echo "address = \"127.0.0.1:${port[$w]}\""; done; } > "$out/cluster.toml"

sizes() { for f in "$out"/logs/*.out; do echo "$f $(stat -c %s "$f")"; done; }
# the daemons' output between two size snapshots
daemon_lines() {
  local f end start
  while read -r f end; do
    start=$(awk -v f="$f" '$1 == f { print $2 }' "$1")
    tail -c +$(( ${start:-0} + 1 )) "$f" | head -c $(( end - ${start:-0} ))
  done < "$2"
}
# --- the killer: every 2-4 minutes a random one of w1, w2, main
phase_of() {  # what the current coordinator process is doing: from the lines it and the daemons printed so far
  local dir it lines
  dir=$(cat "$out/current" 2>/dev/null)
  lines=$({ cat "$dir/main.log.now" 2>/dev/null; sizes > "$out/sizes.now"; daemon_lines "$dir/sizes.start" "$out/sizes.now"; } \
          | grep '^\[step')
  it=$(grep -o '"iteration": [0-9]*' "$dir/ck/step3.json" 2>/dev/null | tail -1 | grep -o '[0-9]*$')
  if grep -q '^\[step 3 ppo\] \(iter\|held-out before\|resuming\)' <<< "$lines"; then
    local last
    last=$(grep -o '^\[step 3 ppo\] iter [0-9]*' <<< "$lines" | tail -1 | grep -o '[0-9]*$')
    echo "step 3 (last printed iteration: ${last:-none}; last commit: ${it:-none})"
  else
    local s1=0 s2=0
    grep -q '^\[step 1 sft\] \(held-out loss .* ->\|resumed\)' <<< "$lines" && s1=1
    grep -q '^\[step 2 rm\] \(held-out accuracy .* over\|resumed\)' <<< "$lines" && s2=1
    case $s1$s2 in 00) echo "steps 1+2";; 10) echo "step 2";; 01) echo "step 1";; 11) echo "step 3 (starting)";; esac
  fi
}
killer() {
  local targets=(w1 w2 main) t pid delay
  while [[ ! -e "$out/stop" ]]; do
    sleep $(( kill_min_s + RANDOM % (kill_span_s + 1) ))
    [[ -e "$out/stop" ]] && break
    t=${targets[RANDOM % 3]}
    if [[ $t == main ]]; then
      pid=$(cat "$out/main.pid" 2>/dev/null)
      if [[ -z "$pid" ]] || ! kill -0 "$pid" 2>/dev/null; then t=w$(( 1 + RANDOM % 2 )); fi  # between runs
    fi
    if [[ $t == main ]]; then
      touch "$out/killed/$pid"
      echo "$(stamp) KILL main (pid $pid) run $(basename "$(cat "$out/current")") phase $(phase_of)" | tee -a "$out/kills.log"
      kill -9 "$pid"
    else
      pid=$(cat "$out/pids/$t")
      delay=$(( 5 + RANDOM % 76 ))  # tenths of a second
      echo "$(stamp) KILL $t (pid $pid) run $(basename "$(cat "$out/current")") phase $(phase_of); restart in $((delay / 10)).$((delay % 10)) s" \
        | tee -a "$out/kills.log"
      kill -9 "$pid"
      wait "$pid" 2>/dev/null
      sleep "$((delay / 10)).$((delay % 10))"
      start_daemon "$t" "${port[$t]}" || echo "$(stamp) RESTART of $t failed" | tee -a "$out/kills.log"
    fi
  done
}
: > "$out/kills.log"
killer &
killer_pid=$!

# --- the runs
runs=0 passed=0 failures=0 resumes=0 restarts=0 rejoins=0
lost_sft=0 lost_rm=0 lost_ppo=0
deadline=$(( t0 + soak_min * 60 ))
while (( $(now) < deadline )); do
  runs=$((runs + 1))
  dir="$out/run$runs"
  mkdir -p "$dir"
  echo "$dir" > "$out/current"
  sizes > "$dir/sizes.0"
  cmd=("$flowrun" "$root/graphs/rlhf.graph" "${common[@]}" $(outputs "$dir") --cluster "$out/cluster.toml"
       --secret-file "$out/secret" "${split[@]}")
  rs=$(now) k=0 ok=1
  while :; do
    k=$((k + 1))
    sizes > "$dir/sizes.start"
    ln -sf "main.$k.log" "$dir/main.log.now"
    "${cmd[@]}" > "$dir/main.$k.log" 2> "$dir/main.$k.err" &
    mp=$!
    echo "$mp" > "$out/main.pid"
    wait "$mp"
    rc=$?
    rm -f "$out/main.pid"
    [[ $rc -eq 0 ]] && break
    if [[ -e "$out/killed/$mp" ]]; then resumes=$((resumes + 1)); continue; fi  # the same command again
    ok=0
    echo "$(stamp) run $runs: FAILED, coordinator process $k exited $rc:"
    grep -v "edge \|  node " "$dir/main.$k.err" | tail -8 | sed 's/^/    /'
    break
  done
  sizes > "$dir/sizes.1"
  { cat "$dir"/main.[0-9]*.log; daemon_lines "$dir/sizes.0" "$dir/sizes.1"; } > "$dir/all.out"
  results < "$dir/all.out" > "$dir/results"
  n_restart=$(cat "$dir"/main.*.err | grep -c "restarting the run (attempt" || true)
  n_rejoin=$(cat "$dir"/main.*.err | grep -c "answers again: its actors stay there" || true)
  restarts=$((restarts + n_restart)) rejoins=$((rejoins + n_rejoin))
  why=()
  if (( ok )); then
    cmp -s "$ref/ppo.bin" "$dir/ppo.bin" || why+=("the policy differs")
    cmp -s "$ref/sft.bin" "$dir/sft.bin" || why+=("the sft model differs")
    for f in "$ref"/rm/*; do cmp -s "$f" "$dir/rm/$(basename "$f")" || why+=("the reward model's $(basename "$f") differs"); done
    # every line printed is the reference's (the resume notices aside); every reference line was printed
    grep -v ' resum' "$dir/results" | sort -u | comm -23 - "$ref/results.set" > "$dir/extra"
    sort -u "$dir/results" | comm -13 - "$ref/results.set" > "$dir/missing"
    [[ -s "$dir/extra" ]] && why+=("$(wc -l < "$dir/extra") printed lines not in the reference (first: $(head -1 "$dir/extra"))")
    [[ -s "$dir/missing" ]] && why+=("$(wc -l < "$dir/missing") reference lines never printed (first: $(head -1 "$dir/missing"))")
  fi
  ls_sft=$(( ($(count '^\[step 1 sft\] step [0-9]' "$dir/results") - ref_sft) * sft_every ))
  ls_rm=$(( ($(count '^\[step 2 rm\] step [0-9]' "$dir/results") - ref_rm) * rm_every ))
  ls_ppo=$(( $(count '^\[step 3 ppo\] iter [0-9]' "$dir/results") - ref_ppo ))
  # a failed run printed less than the reference: nothing to count
  (( ok )) && lost_sft=$((lost_sft + ls_sft)) lost_rm=$((lost_rm + ls_rm)) lost_ppo=$((lost_ppo + ls_ppo))
  notes=$(grep -ho '^\[step [0-9] [a-z]*\] resum[a-z]* [^:]*\|^\[step 3 ppo\] resuming after iteration [0-9]*' "$dir/all.out" \
          | sed -E 's/ from .*//' | sort | uniq -c | sed -E 's/^ +//' | paste -sd ';' -)
  if (( ok )) && (( ${#why[@]} == 0 )); then
    passed=$((passed + 1)); verdict="OK (policy, sft and rm identical; $(wc -l < "$dir/results") lines all the reference's)"
  else
    failures=$((failures + 1))
    verdict="MISMATCH: $(IFS=';'; echo "${why[*]:-the run failed}")"
  fi
  (( ok )) && lost="retrained: sft $ls_sft steps, rm $ls_rm steps, ppo $ls_ppo iterations; " || lost=""
  echo "$(stamp) run $runs: $(( $(now) - rs )) s, $k coordinator process(es), $n_restart restart(s) ($n_rejoin rejoin), $lost${notes:+resumes: $notes; }$verdict"
done
touch "$out/stop"
kill "$killer_pid" 2>/dev/null
wait "$killer_pid" 2>/dev/null

kills=$(grep -c KILL "$out/kills.log" || true)
echo "SUMMARY chaos soak: $(( ($(now) - t0) / 60 )) min (reference ${ref_s} s), $runs runs, $passed identical to the reference, $failures failed or mismatched"
echo "  kills: $kills; by node: $(for t in w1 w2 main; do echo -n "$t $(grep -c "KILL $t " "$out/kills.log" || true), "; done | sed 's/, $//')"
echo "  kills by phase: $(sed -nE 's/.* phase (step[s]? [0-9+]+).*/\1/p' "$out/kills.log" | sort | uniq -c | sed -E 's/^ +//' | paste -sd ',' - | sed 's/,/, /g')"
echo "  restarts (on_node_lost = \"restart\" attempts): $restarts, of which $rejoins rejoined the restarted daemon; coordinator re-runs (resumes after main was killed): $resumes"
echo "  lost in the finished runs (trained again, from the printed progress lines): sft $lost_sft steps, rm $lost_rm steps, ppo $lost_ppo iterations"
(( failures == 0 && runs > 0 ))
