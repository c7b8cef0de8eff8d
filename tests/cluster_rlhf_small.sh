#!/usr/bin/env bash
# graphs/rlhf.graph with small settings over 3 processes on 127.0.0.1 (docs/scaling.md), with the models spread:
# steps 1 and 2 (sft, rm), the prompt loader and the generator on node w1; the reward model, the critic and the PPO
# controller on node w2; the policy, the reference and the experience maker on main. Models, rollouts, scores and
# experience cross nodes, their tensors through the bulk plane (gloo). Every loss, accuracy, reward and KL printed
# equals the single-process run with the same seed (timings aside), and the trained policy file is byte-identical.
# Then a SIGKILL of the controller's node in the middle of PPO, under both policies: on_node_lost = "stop" stops the
# run with steps 1-2's models intact; on_node_lost = "restart" starts it again with w2's actors on main, steps 1-2
# resume from their saved models (not trained again), and the results and the policy equal the uninterrupted run's.
# Last, SIGTERM to main while step 1 trains on w1: the drain reaches the daemon's trainer, which commits its update.
# Usage: cluster_rlhf_small.sh FLOWRUN SOURCE_DIR WORK_DIR
set -euo pipefail
flowrun=$1 root=$2 out=$3
rm -rf "$out" && mkdir -p "$out"
pids=()
cleanup() { for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
echo "rlhf-secret-$$-$RANDOM" > "$out/secret"
small=(--no-progress --threads 2 --set graph.checkpoint_dir= --set node.sft.steps=3 --set node.rm.steps=3 --set node.prompts.iterations=6
       --set node.prompts.eval_prompts=4)
split=(--set node.prompts.on=w1 --set node.ppo_controller.on=w2 --set node.sft.on=w1 --set node.rm.on=w1
       --set node.generator.on=w1 --set node.reward.on=w2 --set node.critic.on=w2)
outputs() { echo --set node.sft.output="$out/$1-sft.bin" --set node.rm.output="$out/$1-rm" --set node.policy.output="$out/$1-ppo.bin"; }
# the printed results without timings (tokens/s, seconds) and the trainers' memory lines (printed where they run)
results() { grep '^\[step' "$@" | grep -v '^\[step 3 ppo\] [a-z_]* memory rank' | sed -E 's/ \([0-9]+ tokens\/s\)//; s/ gen [0-9]+ tok\/s train [0-9]+ tok\/s//; s/[,;] [0-9.]+ s$//'; }
source "$(dirname "$0")/cluster_lib.sh"  # daemons, cluster_file

"$flowrun" "$root/graphs/rlhf.graph" "${small[@]}" $(outputs single) > "$out/single.log" 2> "$out/single.err" \
  || { echo "single-process run failed:"; tail -20 "$out/single.err"; exit 1; }
daemons "" --once
cluster_file "$out/cluster.toml"
"$flowrun" "$root/graphs/rlhf.graph" "${small[@]}" $(outputs cluster) --cluster "$out/cluster.toml" \
  --secret-file "$out/secret" "${split[@]}" \
  > "$out/cluster.log" 2> "$out/cluster.err" || { echo "cluster run failed:"; tail -20 "$out/cluster.err"; exit 1; }
wait "${pids[@]}" || { echo "a --once node did not exit cleanly"; cat "$out/w1.err" "$out/w2.err"; exit 1; }
# steps 1 and 2 print on w1; step 3's results are printed by the controller, on w2
# steps 1 and 2 train at once, so their lines interleave by timing (in either run): compare each step's
# lines in their own order (a stable sort on the "[step N name]" tag)
by_step() { LC_ALL=C sort -s -t']' -k1,1; }
results "$out/single.log" | by_step > "$out/single.results"
{ results "$out/w1.out"; results "$out/w2.out"; } | by_step > "$out/cluster.results"
grep -q "^\[step 1 sft\] step 3/3" "$out/w1.out" || { echo "step 1 did not run on w1:"; cat "$out/w1.out"; exit 1; }
grep -q "^\[step 3 ppo\] iter 1 reward" "$out/w2.out" || { echo "the controller did not run on w2:"; cat "$out/w2.out"; exit 1; }
# tensors crossed through the communicator, not inside CAF messages
traffic=$(grep -o "cross-process traffic.*" "$out/cluster.err")
bulk_bytes=$(sed -nE 's/.*total .* ([0-9]+) bulk payloads \(([0-9]+) tensors, ([0-9]+) communicator bytes\).*/\3/p' <<< "$traffic")
[[ -n "$bulk_bytes" && "$bulk_bytes" -gt 1000000 ]] \
  || { echo "no tensors went through the bulk plane: $traffic"; exit 1; }
for w in w1 w2; do grep -q "bulk plane: joined as rank" "$out/$w.err" || { echo "$w did not join the bulk plane"; exit 1; }; done
diff "$out/single.results" "$out/cluster.results" || { echo "the cluster run's results differ"; exit 1; }
cmp "$out/single-ppo.bin" "$out/cluster-ppo.bin" || { echo "the trained policies differ"; exit 1; }
sed 's/^/  /' "$out/cluster.results"
grep -ho "cluster node '[^']*' ([^)]*): authenticated; actors there: .*\|cross-process traffic.*" "$out/cluster.err" | sed 's/^/  /'
echo "  $(wc -l < "$out/single.results") result lines equal; the trained policy files are identical"

echo "== SIGKILL of the controller's node (w2) in the middle of PPO"
pids=()
daemons "" --once
cluster_file "$out/cluster.toml"
"$flowrun" "$root/graphs/rlhf.graph" "${small[@]}" $(outputs killed) --set node.prompts.iterations=200 \
  --cluster "$out/cluster.toml" --secret-file "$out/secret" --set node.prompts.on=w1 --set node.ppo_controller.on=w2 \
  > "$out/killed.log" 2> "$out/killed.err" &
run_pid=$!
pids+=($run_pid)
for _ in $(seq 1 1200); do grep -q "^\[step 3 ppo\] iter 1 reward" "$out/w2.out" && break; sleep 0.05; done
grep -q "^\[step 3 ppo\] iter 1 reward" "$out/w2.out" || { echo "PPO did not reach iteration 1:"; tail "$out/killed.err"; exit 1; }
kill -9 "$w2_pid"
set +e
wait "$run_pid"
rc=$?
set -e
[[ $rc -eq 1 ]] || { echo "the run's exit code is $rc, not 1:"; tail -20 "$out/killed.err"; exit 1; }
grep -q "cluster node 'w2' lost (.*); its actors: ppo_controller; the run stops" "$out/killed.err" \
  || { echo "no error naming w2 and the controller:"; tail -20 "$out/killed.err"; exit 1; }
# what steps 1 and 2 wrote before PPO began is intact: the same bytes as the single-process run's
cmp "$out/single-sft.bin" "$out/killed-sft.bin" || { echo "step 1's model differs"; exit 1; }
for f in "$out/single-rm"/*; do cmp "$f" "$out/killed-rm/$(basename "$f")" || { echo "step 2's $(basename "$f") differs"; exit 1; }; done
[[ ! -e "$out/killed-ppo.bin" ]] || { echo "a half-trained policy was saved as if complete"; exit 1; }
echo "  $(grep -o "cluster node 'w2' lost.*its actors: ppo_controller" "$out/killed.err" | head -1)"
echo "  steps 1 and 2's saved models equal the reference run's; no half-trained policy was saved"

echo "== on_node_lost = \"restart\": SIGKILL of w2 (controller, reward, critic) in the middle of PPO"
pids=()
daemons r  # without --once: a surviving daemon takes the next attempt's job
cluster_file "$out/restart.toml" 'on_node_lost = "restart"'
"$flowrun" "$root/graphs/rlhf.graph" "${small[@]}" $(outputs restart) --cluster "$out/restart.toml" \
  --secret-file "$out/secret" "${split[@]}" > "$out/restart.log" 2> "$out/restart.err" &
run_pid=$!
pids+=($run_pid)
for _ in $(seq 1 1200); do grep -q "^\[step 3 ppo\] iter 1 reward" "$out/rw2.out" && break; sleep 0.05; done
grep -q "^\[step 3 ppo\] iter 1 reward" "$out/rw2.out" || { echo "PPO did not reach iteration 1 on w2:"; tail "$out/restart.err"; exit 1; }
kill -9 "$w2_pid"
set +e
wait "$run_pid"
rc=$?
set -e
[[ $rc -eq 0 ]] || { echo "the restarted run's exit code is $rc, not 0:"; grep -v "edge \|  node " "$out/restart.err" | tail -20; exit 1; }
grep -q "^\[step 3 ppo\] held-out after" "$out/rw2.out" && { echo "w2 was killed too late (PPO had finished)"; exit 1; }
grep -q "cluster node 'w2' lost (.*); its actors: ppo_controller, reward, critic; the run stops and starts again" \
  "$out/restart.err" || { echo "no error naming w2 and its actors:"; tail -20 "$out/restart.err"; exit 1; }
grep -q "restarting the run (attempt 2 of at most 4, on_node_lost = \"restart\"): ppo_controller moves from w2 to main; reward moves from w2 to main; critic moves from w2 to main" \
  "$out/restart.err" || { echo "no restart line:"; grep -i restart "$out/restart.err"; exit 1; }
# steps 1 and 2 ran once, on w1; the second attempt loaded what they had saved
[[ $(grep -c "^\[step 1 sft\] step 3/3" "$out/rw1.out") -eq 1 ]] || { echo "step 1 trained twice:"; cat "$out/rw1.out"; exit 1; }
[[ $(grep -c "^\[step 2 rm\] step 3/3" "$out/rw1.out") -eq 1 ]] || { echo "step 2 trained twice:"; cat "$out/rw1.out"; exit 1; }
grep -q "^\[step 1 sft\] resumed (attempt 2): .*restart-sft.bin was saved by an earlier attempt of this run" "$out/rw1.out" \
  || { echo "step 1 did not resume:"; cat "$out/rw1.out"; exit 1; }
grep -q "^\[step 2 rm\] resumed (attempt 2): .*restart-rm was saved by an earlier attempt of this run" "$out/rw1.out" \
  || { echo "step 2 did not resume:"; cat "$out/rw1.out"; exit 1; }
# the second attempt's step 3 (controller now on main) equals the uninterrupted run, and so does the policy
grep '^\[step 3' "$out/single.results" > "$out/single.step3"
results "$out/restart.log" > "$out/restart.step3"
diff "$out/single.step3" "$out/restart.step3" || { echo "the restarted run's step 3 differs"; exit 1; }
cmp "$out/single-ppo.bin" "$out/restart-ppo.bin" || { echo "the restarted run's policy differs"; exit 1; }
cmp "$out/single-sft.bin" "$out/restart-sft.bin" || { echo "step 1's model differs"; exit 1; }
for f in "$out/single-rm"/*; do cmp "$f" "$out/restart-rm/$(basename "$f")" || { echo "step 2's $(basename "$f") differs"; exit 1; }; done
echo "  $(grep -o "restarting the run.*" "$out/restart.err" | head -1)"
echo "  steps 1 and 2 resumed from their saved models; $(wc -l < "$out/restart.step3") step-3 lines and the policy equal the uninterrupted run's"

echo "== a lost node that comes back (rejoin_wait_ms): its actors stay there"
# w1 (without --once) is still there and takes this run too; w2 gets a new daemon, killed and started again on its port
rm -f "$out/w2.port"
"$flowrun" node --listen 127.0.0.1:0 --secret-file "$out/secret" --port-file "$out/w2.port" --threads 2 \
  > "$out/jw2.out" 2> "$out/jw2.err" &
w2_pid=$!
pids+=($w2_pid)
for _ in $(seq 1 200); do [[ -s "$out/w2.port" ]] && break; sleep 0.05; done
w2_port=$(cat "$out/w2.port")
{ echo "[cluster]"; echo "heartbeat_ms = 250"; echo 'on_node_lost = "restart"'; echo "rejoin_wait_ms = 20000"
  echo "[cluster.nodes.w1]"; echo "address = \"127.0.0.1:$(cat "$out/w1.port")\""
  echo "[cluster.nodes.w2]"; echo "address = \"127.0.0.1:$w2_port\""; } > "$out/rejoin.toml"
"$flowrun" "$root/graphs/rlhf.graph" "${small[@]}" $(outputs rejoin) --cluster "$out/rejoin.toml" \
  --secret-file "$out/secret" "${split[@]}" > "$out/rejoin.log" 2> "$out/rejoin.err" &
run_pid=$!
pids+=($run_pid)
for _ in $(seq 1 1200); do grep -q "^\[step 3 ppo\] iter 1 reward" "$out/jw2.out" && break; sleep 0.05; done
grep -q "^\[step 3 ppo\] iter 1 reward" "$out/jw2.out" || { echo "PPO did not reach iteration 1 on w2:"; tail "$out/rejoin.err"; exit 1; }
kill -9 "$w2_pid"
sleep 0.5  # the supervisor's delay
"$flowrun" node --listen "127.0.0.1:$w2_port" --secret-file "$out/secret" --threads 2 > "$out/jw2b.out" 2> "$out/jw2b.err" &
pids+=($!)
set +e
wait "$run_pid"
rc=$?
set -e
[[ $rc -eq 0 ]] || { echo "the rejoined run's exit code is $rc, not 0:"; grep -v "edge \|  node " "$out/rejoin.err" | tail -20; exit 1; }
grep -q "restarting the run (attempt 2 of at most 4, on_node_lost = \"restart\"): w2 answers again: its actors stay there" \
  "$out/rejoin.err" || { echo "no rejoin line:"; grep -i "restart\|waiting" "$out/rejoin.err"; exit 1; }
# what stopped the attempt (the lost node and its actors) is said first, before the wait for the node
# (it names w2 also when a transfer from w2 failed before w2 was seen lost: `|| true` so that a line
# not found reaches the message below, where set -e and pipefail ended the script without one)
stop_line=$(grep -n "attempt 1 stopped: cluster node 'w2' lost" "$out/rejoin.err" | head -1 | cut -d: -f1 || true)
wait_line=$(grep -n "waiting up to 20000 ms for cluster node 'w2'" "$out/rejoin.err" | head -1 | cut -d: -f1 || true)
[[ -n "$stop_line" && ( -z "$wait_line" || "$stop_line" -lt "$wait_line" ) ]] ||
  { echo "the attempt's stop line does not come before the rejoin wait:"; grep -n "stopped\|waiting" "$out/rejoin.err"; exit 1; }
results "$out/jw2b.out" > "$out/rejoin.step3"  # the new w2 daemon runs the controller again
diff "$out/single.step3" "$out/rejoin.step3" || { echo "the rejoined run's step 3 differs"; exit 1; }
cmp "$out/single-ppo.bin" "$out/rejoin-ppo.bin" || { echo "the rejoined run's policy differs"; exit 1; }
echo "  $(grep -o "restarting the run.*" "$out/rejoin.err" | head -1)"
echo "  the controller, reward and critic ran again on the returning w2; step 3 and the policy equal the uninterrupted run's"
echo "== SIGTERM while step 1 trains on w1: the daemon's trainer drains and commits the update it stopped at"
# (the run's phase lives on main: the daemon saw no drain, and its trainer stopped with nothing committed)
pids=()
daemons d --once
cluster_file "$out/drain.toml"
"$flowrun" "$root/graphs/sft.graph" --no-progress --threads 2 --set node.sft.steps=2000 --set node.sft.on=w1 \
  --set graph.checkpoint_dir="$out/drain-ckpt" --set node.sft.output="$out/drain-sft.bin" --cluster "$out/drain.toml" \
  --secret-file "$out/secret" > "$out/drain.log" 2> "$out/drain.err" &
run_pid=$!
pids+=($run_pid)
for _ in $(seq 1 1200); do grep -q "^\[step 1 sft\] step 40/2000" "$out/dw1.out" && break; sleep 0.05; done
grep -q "^\[step 1 sft\] step 40/2000" "$out/dw1.out" || { echo "step 1 did not reach update 40 on w1:"; tail "$out/drain.err"; exit 1; }
kill -TERM "$run_pid"
set +e
wait "$run_pid"
rc=$?
set -e
[[ $rc -eq 143 ]] || { echo "SIGTERM: exit code $rc, not 143:"; tail -5 "$out/drain.err"; exit 1; }
k=$(sed -nE 's/^\[step 1 sft\] stopping at update ([0-9]+) of 2000: committing it$/\1/p' "$out/dw1.out")
[[ -n "$k" ]] || { echo "the trainer on w1 committed nothing at the drain:"; grep "step 1 sft\] interrupted" "$out/dw1.out"; exit 1; }
grep -qF "[w1] [step 1 sft] interrupted at update $k of 2000: the last committed checkpoint is $out/drain-ckpt/sft/step_$(printf %08d "$k"); the same command resumes there" \
  "$out/drain.log" || { echo "main's terminal does not say what w1 kept:"; grep "step 1 sft" "$out/drain.log" | tail -3; exit 1; }
echo "  w1's trainer committed update $k of 2000 at main's SIGTERM"
echo "cluster_rlhf_small: OK"
