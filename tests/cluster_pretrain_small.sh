#!/usr/bin/env bash
# graphs/pretrain.graph (TencentPretrain-style ZeRO-3 pretraining of stories260K on TinyStories) with its two
# ranks on two cluster nodes (docs/scaling.md): the ranks' gloo group spans the nodes (rendezvous through the
# cluster run's store on main), the loader's global batches cross through the bulk plane.
#   1. the per-step losses and the step-40 checkpoint equal the single-process run's (2 in-process ranks);
#   2. on_node_lost = "restart": w2 (ranks[1]) is killed once step 10 is committed; the run restarts with
#      ranks[1] on main, both ranks resume from the last committed checkpoint, and the step-40 checkpoint is
#      again byte-identical to the uninterrupted run's;
#   3. a frozen node (SIGSTOP of w2) under "restart": the liveness detector loses it, w1's rank group is
#      aborted (its collective waited for comm_timeout_s before), the restart tells the frozen daemon from a
#      live one and moves ranks[1] to main, and the step-40 checkpoint is again the uninterrupted run's;
#   4. the same with ranks[0] on main: main aborts its own rank, and attempt 2 runs both gloo ranks on main
#      (no cluster store left: they meet through a store in memory);
#   5. a console checkpoint request on main reaches ranks that all run on cluster nodes: one whole checkpoint.
# Usage: cluster_pretrain_small.sh FLOWRUN SOURCE_DIR WORK_DIR
set -euo pipefail
flowrun=$1 root=$2 out=$3
rm -rf "$out" && mkdir -p "$out"
pids=()
cleanup() { for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
echo "pretrain-secret-$$-$RANDOM" > "$out/secret"
steps=40
common=(--no-progress --set node.data.total_steps=$steps --set node.ranks.total_steps=$steps
        --set node.ranks.print_every=1 --set node.ranks.export_hf= --set node.ranks.save_checkpoint_steps=5)
dirs() { echo --set node.ranks.output_dir="$out/$1" --set node.data.output_dir="$out/$1"; }
losses() { sed -n 's/^\[pretrain\] step \([0-9]*\)\/[0-9]* loss \([0-9.]*\) grad_norm \([0-9.]*\) .*/\1 \2 \3/p' "$@"; }
# same_step A B: two step folders hold the same files, byte for byte, but for when each manifest was saved (its
# saved_at_ns, the last key, and the CRC-32 trailer after it)
same_step() {
  python3 - "$1" "$2" <<'PY'
import os, sys
a, b = sys.argv[1:]
if sorted(os.listdir(a)) != sorted(os.listdir(b)):
    sys.exit("other files: %s vs %s" % (sorted(os.listdir(a)), sorted(os.listdir(b))))
for n in sorted(os.listdir(a)):
    x, y = open(os.path.join(a, n), "rb").read(), open(os.path.join(b, n), "rb").read()
    if n.endswith(".msgpack"):
        key = bytes([0xA0 + 11]) + b"saved_at_ns"  # a msgpack fixstr of 11 bytes
        x, y = x[:x.rindex(key)], y[:y.rindex(key)]
    if x != y:
        sys.exit(n + " differs")
PY
}
source "$(dirname "$0")/cluster_lib.sh"  # daemons, cluster_file
start_nodes() {  # PREFIX: daemons w1 and w2 (without --once: a survivor takes the restarted run), a cluster file
  daemons "$1"
  cluster_file "$out/$1cluster.toml" 'on_node_lost = "restart"'
}

# start_spread NAME CLUSTER_FILE [args...]: the ranks on w1 and w2 in the background (run_pid), logs
# $out/NAME.log and .err; returns once step 10 or later is committed ($committed), before step 40
start_spread() {
  local name=$1 file=$2; shift 2
  "$flowrun" "$root/graphs/pretrain.graph" "${common[@]}" $(dirs "$name") --cluster "$file" \
    --secret-file "$out/secret" --set node.ranks.on=w1,w2 --set node.ranks.comm_backend=gloo "$@" \
    > "$out/$name.log" 2> "$out/$name.err" &
  run_pid=$!
  pids+=($run_pid)
  for _ in $(seq 1 3000); do
    [[ -f "$out/$name/latest" ]] && [[ "$(cat "$out/$name/latest")" > "step_00000009" ]] && break
    sleep 0.01
  done
  committed=$(cat "$out/$name/latest" 2>/dev/null || echo none)
  [[ "$committed" > "step_00000009" && "$committed" < "step_00000040" ]] \
    || { echo "no checkpoint between steps 10 and 35 to stop w2 at (latest: $committed)"; exit 1; }
}

# freeze_w2_until_restarted NAME: SIGSTOP w2 under the run start_spread began; $ms: until the restart line.
# Then the run must end with exit 0, having moved ranks[1] from w2 to main, and its step-40 checkpoint must
# be the uninterrupted run's.
freeze_w2_until_restarted() {
  local name=$1 rc=0 t0
  kill -STOP "$w2_pid"
  t0=$(date +%s%N)
  for _ in $(seq 1 6000); do grep -q "restarting the run" "$out/$name.err" && break; sleep 0.01; done
  ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  wait "$run_pid" || rc=$?
  kill -CONT "$w2_pid"
  [[ $rc -eq 0 ]] || { echo "the restarted run's exit code is $rc, not 0:"; grep -v "edge \|  node " "$out/$name.err" | tail; exit 1; }
  grep -q "restarting the run (attempt 2 of at most 4, on_node_lost = \"restart\"): ranks moves from w2 to main" \
    "$out/$name.err" || { echo "no restart line moving ranks to main:"; grep -i restart "$out/$name.err"; exit 1; }
  same_step "$out/single/step_00000040" "$out/$name/step_00000040" || { echo "the restarted run's step-40 checkpoint differs"; exit 1; }
}

echo "== one process, 2 ranks (the reference)"
"$flowrun" "$root/graphs/pretrain.graph" "${common[@]}" $(dirs single) > "$out/single.log" 2> "$out/single.err" \
  || { echo "single-process run failed:"; tail -20 "$out/single.err"; exit 1; }
losses "$out/single.log" > "$out/single.losses"
[[ $(wc -l < "$out/single.losses") -eq $steps ]] || { echo "expected $steps loss lines:"; cat "$out/single.log"; exit 1; }

echo "== ranks[0] on w1, ranks[1] on w2 (gloo across the nodes), the loader on main"
start_nodes a
"$flowrun" "$root/graphs/pretrain.graph" "${common[@]}" $(dirs cluster) --cluster "$out/acluster.toml" \
  --secret-file "$out/secret" --set node.ranks.on=w1,w2 --set node.ranks.comm_backend=gloo \
  > "$out/cluster.log" 2> "$out/cluster.err" || { echo "cluster run failed:"; tail -20 "$out/cluster.err"; exit 1; }
losses "$out/aw1.out" > "$out/cluster.losses"  # rank 0 prints, on w1
diff "$out/single.losses" "$out/cluster.losses" || { echo "the per-step losses differ"; exit 1; }
# and main's terminal shows them too, each once, behind the node's name (they showed only on w1's), and the
# closing held-out line
diff "$out/single.losses" <(sed -n 's/^\[w1\] //p' "$out/cluster.log" | losses) ||
  { echo "main's terminal does not show w1's losses"; exit 1; }
grep -q "^\[w1\] \[pretrain\] held-out loss .* after step 40" "$out/cluster.log" || { echo "main shows no closing line"; exit 1; }
same_step "$out/single/step_00000040" "$out/cluster/step_00000040" || { echo "the step-40 checkpoints differ"; exit 1; }
grep -q "comm [0-9.]* MB/rank" "$out/aw1.out" || { echo "no communicator bytes reported"; exit 1; }
echo "  $steps losses and the step-40 checkpoint equal the single-process run's;" \
     "$(grep -o "comm [0-9.]* MB/rank" "$out/aw1.out" | head -1) per step over gloo between w1 and w2"
echo "  $(grep -o "total .*bulk payloads.*" "$out/cluster.err" | head -1)"

echo "== on_node_lost = \"restart\": SIGKILL of w2 (ranks[1]) once step 10 is committed"
start_nodes b
start_spread restart "$out/bcluster.toml"
kill -9 "$w2_pid"
set +e
wait "$run_pid"
rc=$?
set -e
[[ $rc -eq 0 ]] || { echo "the restarted run's exit code is $rc, not 0:"; grep -v "edge \|  node " "$out/restart.err" | tail; exit 1; }
grep -q "cluster node 'w2' lost (.*); its actors: ranks\[1\]; the run stops and starts again" "$out/restart.err" \
  || { echo "no line naming w2 and ranks[1]:"; tail "$out/restart.err"; exit 1; }
grep -q "restarting the run (attempt 2 of at most 4, on_node_lost = \"restart\"): ranks moves from w2 to main" \
  "$out/restart.err" || { echo "no restart line:"; grep -i restart "$out/restart.err"; exit 1; }
resumed=$(sed -n 's/^\[pretrain\] resuming after step \([0-9]*\) from .*/\1/p' "$out/restart.log" | head -1)
[[ -n "$resumed" && "$resumed" -ge 10 ]] || { echo "the second attempt did not resume from a checkpoint:"; cat "$out/restart.log"; exit 1; }
same_step "$out/single/step_00000040" "$out/restart/step_00000040" || { echo "the restarted run's step-40 checkpoint differs"; exit 1; }
# after the resume, the losses (printed by rank 0, still on w1) continue the reference curve
losses "$out/bw1.out" | awk -v r="$resumed" '$1 > r' > "$out/restart.losses"
awk -v r="$resumed" '$1 > r' "$out/single.losses" > "$out/single.after"
diff "$out/single.after" <(tail -n "$(wc -l < "$out/single.after")" "$out/restart.losses") \
  || { echo "the losses after the resume differ"; exit 1; }
echo "  killed with $committed committed; the second attempt resumed after step $resumed, ranks[1] on main;" \
     "the last $(wc -l < "$out/single.after") losses and the step-40 checkpoint equal the uninterrupted run's"
echo "== a frozen node (SIGSTOP of w2, ranks[1]) under on_node_lost = \"restart\""
# w2 keeps its sockets open. Before, ranks[0] on w1 waited in its collective for comm_timeout_s (120 s
# here), and the restart judged w2 back because it accepted a TCP connection, so attempt 2 waited
# connect_timeout_ms for its handshake and spent a second restart.
start_nodes c
cluster_file "$out/ccluster.toml" 'on_node_lost = "restart"' 'lost_after_ms = 2000' 'connect_timeout_ms = 3000'
start_spread frozen "$out/ccluster.toml" --set node.ranks.comm_timeout_s=120
freeze_w2_until_restarted frozen
grep -q "cluster node 'w2' was lost: aborted the collectives of 1 rank group(s) here that span it" "$out/cw1.err" \
  || { echo "w1 did not abort its rank group:"; tail -20 "$out/cw1.err"; exit 1; }
grep -q "cluster node 'w2' (127.0.0.1:[0-9]*) accepts connections but its daemon does not answer" "$out/frozen.err" \
  || { echo "the frozen w2 was not told from a live one:"; grep -i "restart\|answer" "$out/frozen.err"; exit 1; }
! grep -q "attempt 3" "$out/frozen.err" || { echo "a second restart:"; grep -i restart "$out/frozen.err"; exit 1; }
(( ms < 30000 )) || { echo "the restart came $ms ms after the SIGSTOP (comm_timeout_s = 120)"; exit 1; }
echo "  frozen with $committed committed; restarted ${ms} ms later with ranks[1] on main (comm_timeout_s = 120);" \
     "the step-40 checkpoint equals the uninterrupted run's"
echo "== ranks[0] on main, ranks[1] on w2, w2 frozen: main's own rank is aborted, the restart runs both ranks on main"
# attempt 2 has no cluster node left, so no cluster store: the gloo ranks, now threads of main, meet through a
# store in memory (before, attempt 2 failed at start: 'comm_backend "gloo" needs a rendezvous')
start_nodes d
cluster_file "$out/dcluster.toml" 'on_node_lost = "restart"' 'lost_after_ms = 2000' 'connect_timeout_ms = 3000'
start_spread main_frozen "$out/dcluster.toml" --set node.ranks.on=main,w2 --set node.ranks.comm_timeout_s=120
freeze_w2_until_restarted main_frozen
grep -q "aborted the collectives of 1 rank group(s) on main that span 'w2'" "$out/main_frozen.err" \
  || { echo "main did not abort its rank group:"; grep -i "abort\|lost" "$out/main_frozen.err" | head; exit 1; }
echo "  frozen with $committed committed; both ranks finished on main, the step-40 checkpoint the uninterrupted run's"
echo "== the console's checkpoint request on main reaches ranks that all run on cluster nodes"
# main forwards its requests with every counter poll; the ranks on w1 and w2 agree on the step, so the
# request becomes one whole checkpoint (before, the nodes never saw it and the reply named no node)
start_nodes e
cluster_file "$out/ecluster.toml"
"$flowrun" "$root/graphs/pretrain.graph" --no-progress --set node.data.total_steps=200 --set node.ranks.total_steps=200 \
  --set node.ranks.print_every=1 --set node.ranks.export_hf= --set node.ranks.save_checkpoint_steps=1000 \
  --set node.ranks.keep_checkpoints=3 $(dirs asked) --cluster "$out/ecluster.toml" --secret-file "$out/secret" \
  --set node.ranks.on=w1,w2 --set node.ranks.comm_backend=gloo --console 0 --console-token asked-token-0123456789 \
  > "$out/asked.log" 2> "$out/asked.err" &
run_pid=$!
pids+=($run_pid)
for _ in $(seq 1 600); do grep -q "step 5/200 " "$out/ew1.out" 2>/dev/null && break; sleep 0.05; done
cport=$(sed -n 's|.*console: http://127.0.0.1:\([0-9]*\)/.*|\1|p' "$out/asked.err" | head -1)
[[ -n "$cport" ]] || { echo "no console port:"; tail -5 "$out/asked.err"; exit 1; }
# main learns that the ranks poll the requests from the nodes' next counter report: its console shows both
# replicas checkpoint_capable then (a request posted before that report was honoured, but its reply named
# no node: one run in four)
for _ in $(seq 1 200); do
  [[ $(curl -sf "http://127.0.0.1:$cport/api/nodes/ranks" | grep -o '"checkpoint_capable":true' | wc -l) -eq 2 ]] && break
  sleep 0.05
done
curl -sf "http://127.0.0.1:$cport/api/nodes/ranks" > "$out/asked_ranks.json" || { echo "GET /api/nodes/ranks failed"; exit 1; }
[[ $(grep -o '"checkpoint_capable":true' "$out/asked_ranks.json" | wc -l) -eq 2 ]] ||
  { echo "the console does not show both ranks taking checkpoint requests:"; head -c 600 "$out/asked_ranks.json"; exit 1; }
curl -sf -X POST -H "X-Flowrun-Token: asked-token-0123456789" "http://127.0.0.1:$cport/api/checkpoint" > "$out/asked_reply.json" \
  || { echo "POST /api/checkpoint failed"; exit 1; }
grep -q "ranks" "$out/asked_reply.json" || { echo "the reply names no node that honours it:"; cat "$out/asked_reply.json"; exit 1; }
wait "$run_pid" || { echo "the run with a checkpoint request failed:"; tail -5 "$out/asked.err"; exit 1; }
! grep -q "was not honoured before the run ended" "$out/asked.err" || { echo "the end of the run says not honoured"; exit 1; }
at=$(sed -n 's/.*honouring the console.s checkpoint request #1 at step \([0-9]*\).*/\1/p' "$out/ew1.err" | head -1)
[[ -n "$at" && "$at" -lt 200 ]] || { echo "rank 0 on w1 did not honour the request:"; grep -i checkpoint "$out/ew1.err" | tail -3; exit 1; }
st=$(printf "step_%08d" "$at")
[ -e "$out/asked/$st/shard_00000-of-00002.msgpack" ] && [ -e "$out/asked/$st/shard_00001-of-00002.msgpack" ] \
  || { ls "$out/asked"; echo "the requested checkpoint $st is not whole"; exit 1; }
[[ $(ls -d "$out/asked"/step_* | wc -l) -eq 2 ]] || { ls "$out/asked"; echo "not one requested checkpoint besides step 200"; exit 1; }
echo "  the request reached both ranks on the nodes: $st with both shards (and step_00000200); reply $(head -c 160 "$out/asked_reply.json")"

echo "== a run the console paused stays paused over a restart; the events go on numbering"
# the restarted attempt ran on though the operator had paused, and its events were numbered from 1 again
start_nodes f
start_spread paused "$out/fcluster.toml" --console 0 --console-token paused-token-0123456789
pport=$(sed -n 's|.*console: http://127.0.0.1:\([0-9]*\)/.*|\1|p' "$out/paused.err" | head -1)
[[ -n "$pport" ]] || { echo "no console port:"; tail -5 "$out/paused.err"; exit 1; }
ptok=(-H "X-Flowrun-Token: paused-token-0123456789")
curl -sf -X POST "${ptok[@]}" "http://127.0.0.1:$pport/api/pause" > /dev/null || { echo "POST /api/pause failed"; exit 1; }
before=$(curl -sf "http://127.0.0.1:$pport/api/events" | python3 -c 'import json,sys; print(json.load(sys.stdin)["last_seq"])')
kill -9 "$w2_pid"
for _ in $(seq 1 3000); do grep -q "the restarted run starts paused" "$out/paused.err" && break; sleep 0.01; done
grep -q "the restarted run starts paused, as the console left it: resume to go on" "$out/paused.err" ||
  { echo "the restart did not keep the pause:"; grep -i "restart\|paus" "$out/paused.err" | tail -5; exit 1; }
sleep 1
curl -sf "http://127.0.0.1:$pport/api/status" | grep -q '"run_state":"paused"' ||
  { echo "the restarted run is not paused:"; curl -sf "http://127.0.0.1:$pport/api/status" | head -c 300; exit 1; }
curl -sf "http://127.0.0.1:$pport/api/events?since=$before" > "$out/paused_events.json"
python3 - "$out/paused_events.json" "$before" <<'PY' || exit 1
import json, sys
ev = json.load(open(sys.argv[1]))["events"]
seqs = [e["seq"] for e in ev]
if not any(e["kind"] == "pause" and "restarted run starts paused" in e["text"] for e in ev) or seqs != sorted(set(seqs)) \
        or not seqs or seqs[0] <= int(sys.argv[2]):
    sys.exit("the events after %s: %s" % (sys.argv[2], [(e["seq"], e["kind"]) for e in ev]))
PY
curl -sf -X POST "${ptok[@]}" "http://127.0.0.1:$pport/api/resume" > /dev/null || { echo "POST /api/resume failed"; exit 1; }
rc=0; wait "$run_pid" || rc=$?
[[ $rc -eq 0 ]] || { echo "the resumed run exited $rc:"; tail -5 "$out/paused.err"; exit 1; }
same_step "$out/single/step_00000040" "$out/paused/step_00000040" || { echo "the paused run's step-40 checkpoint differs"; exit 1; }
echo "  paused, w2 killed: attempt 2 started paused (events numbered after $before); resumed, the step-40 checkpoint is the uninterrupted run's"
echo "cluster_pretrain_small: OK"
