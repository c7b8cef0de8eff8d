#!/usr/bin/env bash
# flowctl against a running graphs/pretrain.graph (docs/console.md):
#   status; top shows rates that change from frame to frame; graph --dot; inspect; events;
#   pause without the token is refused, with it the run pauses; resume; checkpoint makes the
#   ZeRO ranks write one; stop drains and ends the run with 130; then no console answers; an
#   unwritable --console-token-file ends the run with exit 1 and the reason, never a hang.
set -euo pipefail
flowrun=$1 flowctl=$2 root=$3 out=$4
rm -rf "$out" && mkdir -p "$out"
ck="$out/ck"
log="$out/flowrun.err"
: > "$log"  # exists before the poll below reads it (the background job opens it a moment later)

"$flowrun" run "$root/graphs/pretrain.graph" --no-progress -q --threads 2 \
  --console 0 --console-token-file "$out/token" \
  --set node.data.total_steps=100000 --set node.ranks.total_steps=100000 \
  --set node.ranks.output_dir="$ck" --set node.data.output_dir="$ck" --set node.ranks.save_checkpoint_steps=0 \
  --set node.ranks.export_hf= --set node.ranks.print_every=100000 > "$out/flowrun.out" 2> "$log" &
pid=$!
cleanup() { kill -9 $pid 2> /dev/null || true; }
trap cleanup EXIT

port=""
for _ in $(seq 1 600); do
  port=$(sed -n 's|.*console: http://127.0.0.1:\([0-9]*\)/.*|\1|p' "$log" 2> /dev/null | head -1 || true)
  [[ -n "$port" ]] && break
  kill -0 $pid 2> /dev/null || { echo "flowrun exited early:"; cat "$log"; exit 1; }
  sleep 0.1
done
[[ -n "$port" ]] || { echo "flowrun printed no console address:"; cat "$log"; exit 1; }
echo "console on port $port"
ctl() { "$flowctl" --port "$port" "$@"; }

echo "== flowctl status"
ctl status | tee "$out/status.txt"
grep -q "flowrun pretrain" "$out/status.txt" || { echo "status does not name the graph"; exit 1; }

echo "== flowctl top: 5 frames, 0.7 s apart"
# wait for the ranks to train (the first steps load the model)
# the header names the phase as step k/N with an ETA (zero_rank's ctx.progress; the ETA from its second
# step on), not the bare step counter
progress_re="s · pretrain [1-9][0-9]*/100000 ETA [0-9]+:[0-9]{2}"
for _ in $(seq 1 300); do
  ctl status | head -1 > "$out/status_progress.txt"
  grep -qE "$progress_re" "$out/status_progress.txt" && break
  sleep 0.1
done
cat "$out/status_progress.txt"
grep -qE "$progress_re" "$out/status_progress.txt" ||
  { echo "status does not show the pretraining phase as step k/N with an ETA"; exit 1; }
ctl top -n 5 -d 0.7 > "$out/top.txt"
cat "$out/top.txt"
# the ranks' row per frame: HANDLED/s (col 6), BYTES IN/s (col 7-8), BUSY (col 9)
awk '/^--- frame/ { f++ } $1 == "ranks" { print f, $6, $7 $8, $9 }' "$out/top.txt" > "$out/ranks_rows.txt"
cat "$out/ranks_rows.txt"
frames=$(wc -l < "$out/ranks_rows.txt")
(( frames == 5 )) || { echo "expected 5 frames with a ranks row, got $frames"; exit 1; }
distinct=$(cut -d' ' -f2- "$out/ranks_rows.txt" | sort -u | wc -l)
nonzero=$(awk '$2 + 0 > 0' "$out/ranks_rows.txt" | wc -l)
echo "  ranks (handled/s, bytes in/s, busy ms/s): $distinct distinct rows over $frames frames, $nonzero frames with traffic"
(( nonzero >= 3 )) || { echo "top shows no traffic on the ranks"; exit 1; }
(( distinct >= 2 )) || { echo "top's rates do not change between frames"; exit 1; }
grep -q "data.batch -> ranks.batch" "$out/top.txt" || { echo "top shows no edge"; exit 1; }

echo "== flowctl graph --dot"
ctl graph --dot > "$out/graph.dot"
cat "$out/graph.dot"
head -1 "$out/graph.dot" | grep -q '^digraph "pretrain" {' || { echo "not a DOT digraph"; exit 1; }
grep -q '"data" -> "ranks" \[label="[0-9.k]* msg/s' "$out/graph.dot" || { echo "the edge has no rate label"; exit 1; }
grep -q 'fillcolor=' "$out/graph.dot" || { echo "no state colours"; exit 1; }
if command -v dot > /dev/null; then dot -Tsvg "$out/graph.dot" > "$out/graph.svg"; fi

echo "== flowctl inspect ranks"
ctl inspect ranks | tee "$out/inspect.txt"
grep -q "deepspeed_config" "$out/inspect.txt" || { echo "inspect shows no settings"; exit 1; }
grep -q "memory .*params" "$out/inspect.txt" || { echo "inspect shows no memory per rank"; exit 1; }
grep -q "signal loss" "$out/inspect.txt" || { echo "inspect shows no loss signal"; exit 1; }

echo "== pause without the token is refused"
if ctl pause 2> "$out/pause_refused.txt"; then echo "pause without a token succeeded"; exit 1; fi
cat "$out/pause_refused.txt"
grep -q "HTTP 401" "$out/pause_refused.txt" || { echo "no 401"; exit 1; }
ctl status | grep -q " running " || { echo "the refused pause changed the run"; exit 1; }

echo "== pause / resume with the token (from the token file)"
export FLOWRUN_CONSOLE_TOKEN_FILE="$out/token"
ctl pause
for _ in $(seq 1 100); do ctl status | grep -q " paused " && break; sleep 0.05; done
ctl status | grep " paused " || { echo "the run did not pause"; exit 1; }
# no ETA while paused (the console samples every 0.5 s): it counted down to 0:00 with nothing running
sleep 1.2
ctl status | head -1 > "$out/status_paused.txt"
cat "$out/status_paused.txt"
grep -q "pretrain [0-9]*/100000" "$out/status_paused.txt" || { echo "the paused status shows no phase"; exit 1; }
if grep -q "ETA" "$out/status_paused.txt"; then echo "a paused run shows an ETA"; exit 1; fi
ctl resume
for _ in $(seq 1 100); do ctl status | grep -q " running " && break; sleep 0.05; done
ctl status | grep " running " || { echo "the run did not resume"; exit 1; }

echo "== checkpoint: the ZeRO ranks write one at their next step"
ctl checkpoint | tee "$out/checkpoint.txt"
grep -q "ranks" "$out/checkpoint.txt" || { echo "the checkpoint reply names no node that honours it"; exit 1; }
for _ in $(seq 1 300); do [[ -f "$ck/latest" ]] && break; sleep 0.1; done
[[ -f "$ck/latest" ]] || { echo "no checkpoint was committed"; exit 1; }
echo "  committed $(cat "$ck/latest")"
first=$(cat "$ck/latest")
# the console samples the run every 0.5 s: the event may take that long to show
for _ in $(seq 1 50); do
  ctl events > "$out/events.txt"
  grep -q "honouring checkpoint request #1" "$out/events.txt" && break
  sleep 0.1
done
grep -q "honouring checkpoint request #1" "$out/events.txt" || { echo "no checkpoint event"; cat "$out/events.txt"; exit 1; }
grep -E "spawn|checkpoint" "$out/events.txt" | head -6

echo "== a checkpoint asked while paused, then stop: both replies say the request waits (it was dropped silently)"
ctl pause
for _ in $(seq 1 100); do ctl status | grep -q " paused " && break; sleep 0.05; done
ctl checkpoint | tee "$out/checkpoint_paused.txt"
grep -q "checkpoint request #2 sent; .*; the run is paused: that step comes after resume (a stop before it writes no checkpoint)" \
  "$out/checkpoint_paused.txt" || { echo "the paused run's checkpoint reply does not say it waits"; exit 1; }

echo "== stop: the run drains and exits with 130"
ctl stop | tee "$out/stop.txt"
grep -q "^stop: stopping: sources stop.*; checkpoint request #2 was not honoured yet" "$out/stop.txt" ||
  { echo "the stop reply does not name the pending checkpoint request"; exit 1; }
ctl stop | tee "$out/stop2.txt" || true  # the run may be gone already
rc=0
wait $pid || rc=$?
trap - EXIT
echo "  flowrun exit code $rc"
(( rc == 130 )) || { echo "expected 130"; tail -20 "$log"; exit 1; }
# the console's stop is named as such on the log (it read "signal 2: draining ...; again to stop now")
grep -q "the console's stop: draining (sources stop; in-flight messages are handled); a second stop (or Ctrl-C) to stop now" \
  "$log" || { echo "the console's stop is not named on the log"; grep -i "draining" "$log"; exit 1; }
# a second stop stops without draining (when the run was still there to hear it), its reply says so; the
# pending request was honoured by a step of the drain, or the end of the run says it was not
[[ ! -s "$out/stop2.txt" ]] || grep -q "stopping without draining (the second stop)" "$out/stop2.txt" ||
  { echo "the second stop's reply: $(cat "$out/stop2.txt")"; exit 1; }
[[ "$(cat "$ck/latest")" != "$first" ]] || grep -q "checkpoint request #2 was not honoured before the run ended" "$log" ||
  { echo "the pending request was neither honoured nor named at the end"; tail -5 "$log"; exit 1; }
rc=0
ctl status > /dev/null 2> "$out/after.txt" || rc=$?
(( rc == 3 )) || { echo "flowctl after the run: expected exit code 3, got $rc"; exit 1; }
cat "$out/after.txt"
# usage errors exit 2 and say what is wrong: a misspelt subcommand is named (CLI11 said only "A subcommand
# is required"), a port out of range is refused (it was tried, and said "no console answers", exit 3)
rc=0
"$flowctl" --port 8080 stauts 2> "$out/usage.txt" || rc=$?
(( rc == 2 )) && grep -q "unknown subcommand 'stauts': use one of status," "$out/usage.txt" ||
  { echo "flowctl stauts: exit code $rc, $(cat "$out/usage.txt")"; exit 1; }
rc=0
"$flowctl" --port 70000 status 2> "$out/usage.txt" || rc=$?
(( rc == 2 )) && grep -q "70000 not in range" "$out/usage.txt" ||
  { echo "flowctl --port 70000: exit code $rc, $(cat "$out/usage.txt")"; exit 1; }
# a token file that cannot be written ends the run at once with the reason, five times in a row
# (the server's thread had not reached its accept loop when the error stopped it, and the join
# waited forever: no line, no exit)
touch "$out/a_file"
for i in 1 2 3 4 5; do
  rc=0
  timeout 60 "$flowrun" run "$root/graphs/pretrain.graph" --no-progress -q --console 0 \
    --console-token-file "$out/a_file/token" --set node.ranks.output_dir="$out/tf" --set node.data.output_dir="$out/tf" \
    > /dev/null 2> "$out/tokenfile.err" || rc=$?
  (( rc == 1 )) || { echo "an unwritable token file: exit code $rc (124: it hung), not 1"; cat "$out/tokenfile.err"; exit 1; }
  grep -q "console: cannot write the token to '$out/a_file/token'" "$out/tokenfile.err" ||
    { echo "an unwritable token file: no reason given"; cat "$out/tokenfile.err"; exit 1; }
done
echo "an unwritable token file: exit 1 with the reason, 5 of 5"

# step 3 honours a console checkpoint request at its next batch (it was acknowledged, "no node has asked yet",
# and never written: a stop then lost every iteration since the last scheduled commit)
echo "== step 3: a console checkpoint request is committed"
rm -rf "$out/s3"
"$flowrun" run "$root/graphs/rlhf.graph" --no-progress --console 0 --console-token-file "$out/s3_token" \
  --set graph.checkpoint_dir="$out/s3/ck" --set node.sft.output="$out/s3/sft.bin" --set node.rm.output="$out/s3/rm" \
  --set node.policy.output="$out/s3/p.bin" --set node.prompts.iterations=300 > "$out/s3.log" 2>&1 &
s3=$!
for _ in $(seq 1 600); do grep -q "iter 3 " "$out/s3.log" && break; sleep 0.1; done
grep -q "iter 3 " "$out/s3.log" || { kill $s3; echo "step 3 did not start"; tail -5 "$out/s3.log"; exit 1; }
s3port=$(sed -n 's|.*console: http://127.0.0.1:\([0-9]*\)/.*|\1|p' "$out/s3.log" | head -1)
"$flowctl" --port "$s3port" --token "$(cat "$out/s3_token")" checkpoint | tee "$out/s3_ck.txt"
grep -q "nodes that honour it at their next step: ppo_controller" "$out/s3_ck.txt" ||
  { kill $s3; echo "the controller does not honour checkpoint requests"; exit 1; }
for _ in $(seq 1 300); do grep -q "checkpoint after iteration" "$out/s3.log" && break; sleep 0.1; done
"$flowctl" --port "$s3port" --token "$(cat "$out/s3_token")" stop > /dev/null || true
wait $s3 || true
grep -q "\[step 3 ppo\] checkpoint after iteration [0-9]* -> $out/s3/ck" "$out/s3.log" ||
  { echo "the requested checkpoint was not committed:"; grep -E "checkpoint|iter " "$out/s3.log" | tail -5; exit 1; }
# flowrun launch's processes each have a console: a checkpoint request reaches one process's ranks only. The
# ranks agree on it by a collective at every step, so both checkpoint at the same step (before, the ranks took
# none: one rank had checkpointed alone, and the other's next collective hung 300 s, then failed)
echo "== flowrun launch: a console checkpoint request taken by one process's rank is honoured by both ranks"
rm -rf "$out/lp"
timeout 120 "$flowrun" launch --nproc 2 "$root/graphs/pretrain.graph" --set node.ranks.replicas=1 \
  --set node.ranks.comm_backend=gloo --set node.ranks.comm_timeout_s=30 --set node.ranks.output_dir="$out/lp" \
  --set node.data.output_dir="$out/lp" --set node.ranks.export_hf= --set node.data.total_steps=400 \
  --set node.ranks.total_steps=400 --set node.ranks.save_checkpoint_steps=200 --set node.ranks.keep_checkpoints=3 \
  --run-arg=--no-progress --run-arg=--console=0 --run-arg=--console-token=launch-token-0123456789 > "$out/lp.log" 2>&1 &
lp=$!
for _ in $(seq 1 600); do grep -q "step [0-9]*/400 " "$out/lp.log" && break; sleep 0.1; done
lport=$(sed -n 's|.*console: http://127.0.0.1:\([0-9]*\)/.*|\1|p' "$out/lp.log" | head -1)
[ -n "$lport" ] || { kill $lp; echo "launch: no console port"; tail -5 "$out/lp.log"; exit 1; }
"$flowctl" --port "$lport" --token launch-token-0123456789 checkpoint | tee "$out/lp_ck.txt"
grep -q "nodes that honour it at their next step: ranks" "$out/lp_ck.txt" ||
  { kill $lp; echo "launch: the ranks do not take checkpoint requests"; exit 1; }
rc=0; wait $lp || rc=$?
(( rc == 0 )) || { echo "launch with a checkpoint request: exit $rc (124: it hung)"; tail -5 "$out/lp.log"; exit 1; }
! grep -q "was not honoured before the run ended" "$out/lp.log" || { echo "launch: the request was not honoured"; exit 1; }
asked=$(cd "$out/lp" && ls -d step_* | grep -v -x -e step_00000200 -e step_00000400 || true)
[[ $(echo "$asked" | grep -c step_) -eq 1 ]] || { ls "$out/lp"; echo "launch: not one requested checkpoint: '$asked'"; exit 1; }
for st in $asked step_00000200 step_00000400; do
  [ -e "$out/lp/$st/shard_00000-of-00002.msgpack" ] && [ -e "$out/lp/$st/shard_00001-of-00002.msgpack" ] ||
    { ls "$out/lp"; echo "launch: $st is not whole"; exit 1; }
done
echo "  the request became $asked, both shards, besides the scheduled step_00000200 and step_00000400"
# a --timeout of 0 is refused (it said no console answers, of one that was there); a short token is warned
"$flowctl" --timeout 0 status > "$out/t0.txt" 2>&1 && { echo "flowctl --timeout 0 was accepted"; exit 1; }
grep -q -- "--timeout: must be > 0 seconds, got 0" "$out/t0.txt" || { cat "$out/t0.txt"; echo "flowctl --timeout 0: no reason"; exit 1; }
"$flowrun" run "$root/graphs/sft.graph" --no-progress -q --console 0 --console-token abc --set graph.checkpoint_dir= \
  --set node.sft.steps=1 --set node.sft.output="$out/short_token.bin" > /dev/null 2> "$out/short_token.err" ||
  { tail -3 "$out/short_token.err"; echo "the run with a short token failed"; exit 1; }
grep -q "the console token is 3 characters: one of 16 or more" "$out/short_token.err" ||
  { echo "a 3-character console token was not warned"; exit 1; }
# --console-linger: a Ctrl-C ends the linger at once with the run's exit code (it slept the linger through);
# a negative, non-finite or week-long linger is refused
"$flowrun" run "$root/graphs/examples/generate.graph" --no-progress --console 0 --console-linger 60 \
  > "$out/linger.log" 2>&1 &
lg=$!
for _ in $(seq 1 300); do grep -q "serving its final state" "$out/linger.log" && break; sleep 0.1; done
grep -q "serving its final state for 60 s more" "$out/linger.log" || { kill $lg; tail -3 "$out/linger.log"; echo "no linger"; exit 1; }
kill -INT $lg
t0=$SECONDS; rc=0; wait $lg || rc=$?
(( rc == 0 && SECONDS - t0 <= 5 )) || { echo "SIGINT during the linger: exit $rc after $((SECONDS - t0)) s"; exit 1; }
grep -q "console: stopped serving (a signal during the linger)" "$out/linger.log" || { echo "the linger's end is not said"; exit 1; }
for bad in -1 nan 1e12; do
  "$flowrun" run "$root/graphs/examples/generate.graph" --console 0 --console-linger "$bad" > "$out/linger_bad.log" 2>&1 &&
    { echo "--console-linger $bad was accepted"; exit 1; }
  grep -q -- "--console-linger: must be in \[0, 604800\]" "$out/linger_bad.log" || { cat "$out/linger_bad.log"; exit 1; }
done
echo "  --console-linger: SIGINT ends it (exit 0); -1, nan and 1e12 refused"
# a token that cannot travel in a header or one line of the token file, and an empty one, are refused (exit 2);
# flowctl refuses a negative --since (it became 2^64 - 1) and a non-finite -d
"$flowrun" run "$root/graphs/examples/generate.graph" --console 0 --console-token '' > "$out/tok.log" 2>&1 &&
  { echo "an empty --console-token was accepted"; exit 1; }
grep -q -- "--console-token is empty" "$out/tok.log" || { cat "$out/tok.log"; exit 1; }
"$flowrun" run "$root/graphs/examples/generate.graph" --console 0 --console-token $'abc\ndef0123456789abc' \
  > "$out/tok.log" 2>&1 && { echo "a --console-token with a newline was accepted"; exit 1; }
grep -q "the console token holds a space or a control character" "$out/tok.log" || { cat "$out/tok.log"; exit 1; }
"$flowctl" events --since -1 > "$out/since.txt" 2>&1 && { echo "flowctl events --since -1 was accepted"; exit 1; }
grep -q -- "--since: must be a whole number >= 0" "$out/since.txt" || { cat "$out/since.txt"; exit 1; }
"$flowctl" top -d nan > "$out/d.txt" 2>&1 && { echo "flowctl top -d nan was accepted"; exit 1; }
grep -q -- "--interval: must be > 0 seconds, got nan" "$out/d.txt" || { cat "$out/d.txt"; exit 1; }
echo "  an empty token and one with a newline, flowctl --since -1 and -d nan: refused"
echo "console_flowctl: ok"
