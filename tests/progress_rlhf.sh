#!/usr/bin/env bash
# Progress from sft_trainer and rm_trainer reaches the job's live state (docs/console.md, "Progress and
# ETA"): graphs/rlhf.graph runs steps 1 and 2 at once; flowctl status (GET /api/status) names each, in any order, as
# "step 1 sft k/N ETA m:ss · step 2 rm k/N ETA m:ss", never the largest counter; /api/status's
# progress records carry both nodes with a non-negative eta_s; step 3 ("step 3 ppo", prompt_loader) is not among
# them, in the status line or the records, while steps 1 and 2 train (a phase shows once it has started, though
# prompt_loader sends its first batch at the job's start), nor is ppo_controller's phase the job's phase;
# /api/graph's layout fits 1120 px.
# The steps are many so that the run is still training when polled; stop ends it (exit 130).
set -euo pipefail
flowrun=$1 flowctl=$2 root=$3 out=$4
rm -rf "$out" && mkdir -p "$out"
log="$out/flowrun.err"
: > "$log"
"$flowrun" run "$root/graphs/rlhf.graph" --no-progress -q --threads 2 \
  --console 0 --console-token-file "$out/token" --set graph.checkpoint_dir= \
  --set node.sft.steps=100000 --set node.rm.steps=100000 --set node.sft.print_every=100000 \
  --set node.rm.print_every=100000 --set node.sft.output="$out/sft.bin" --set node.rm.output="$out/rm" \
  > "$out/flowrun.out" 2> "$log" &
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
ctl() { "$flowctl" --port "$port" "$@"; }

# both trainers report from their second update on with an ETA (the first report starts the rate); the
# phases are listed in the order they first reported, which is timing (each held-out pass before training
# is a phase of its own), so each is looked for on its own
re_sft="step 1 sft [1-9][0-9]*/100000 ETA [0-9]+:[0-9]{2}"
re_rm="step 2 rm [1-9][0-9]*/100000 ETA [0-9]+:[0-9]{2}"
both() { grep -qE "$re_sft" "$1" && grep -qE "$re_rm" "$1"; }
for _ in $(seq 1 600); do
  ctl status | head -1 > "$out/status.txt"
  both "$out/status.txt" && break
  kill -0 $pid 2> /dev/null || { echo "flowrun exited early:"; cat "$log"; exit 1; }
  sleep 0.1
done
cat "$out/status.txt"
both "$out/status.txt" || { echo "status does not show steps 1 and 2 as step k/N with an ETA"; exit 1; }
if grep -q "step 3" "$out/status.txt"; then echo "status shows step 3 while steps 1 and 2 train"; exit 1; fi

# the JSON records behind it, and the page's layout
curl -sf "http://127.0.0.1:$port/api/status" > "$out/status.json"
curl -sf "http://127.0.0.1:$port/api/graph" > "$out/graph.json"
python3 - "$out/status.json" "$out/graph.json" <<'PY'
import json, sys
st = json.load(open(sys.argv[1]))
by = {p["node"]: p for p in st["progress"]}
for node, what in (("sft", "step 1 sft"), ("rm", "step 2 rm")):
    p = by[node]
    assert p["what"] == what, p
    assert p["total"] == 100000 and 1 <= p["done"] < 100000, p
    assert p["eta_s"] is not None and p["eta_s"] >= 0, p
    print(f"{node}: {p['what']} {p['done']}/{p['total']} eta_s {p['eta_s']}")
assert st["progress_text"].count(" · ") >= 1, st["progress_text"]
assert "prompts" not in by and "step 3" not in st["progress_text"], st["progress"]  # step 3 has not started
# the header's phase is one of the training steps', never the PPO controller's (its held-out batch arrives
# at the job's start, but step 3 has not begun)
assert st["phase"] in ("step 1 sft", "step 2 rm", "step 1 sft held-out", "step 2 rm held-out"), st["phase"]
print(f"phase: {st['phase']}")
lay = json.load(open(sys.argv[2]))["layout"]
assert lay["width"] <= 1120, lay["width"]
for b in lay["nodes"]:
    assert 0 <= b["x"] and b["x"] + b["w"] <= lay["width"], b
print(f"layout: {len(lay['nodes'])} boxes within {lay['width']} px")
PY

export FLOWRUN_CONSOLE_TOKEN_FILE="$out/token"
ctl stop
rc=0
wait $pid || rc=$?
trap - EXIT
(( rc == 130 )) || { echo "expected exit 130 after stop, got $rc"; cat "$log"; exit 1; }
echo "ok"
