#!/usr/bin/env bash
# enable_tensorboard / tensorboard_path (DeepSpeed-Chat's names; docs/console.md, "TensorBoard")
# on graphs/rlhf.graph with small settings: sft, rm and ppo_controller write event files that
# the tensorboard Python package reads back with the values of the printed lines
# (tests/tensorboard_check.py); a tensorboard_path that cannot be written stops the run before
# training, naming the node and the path; enable_tensorboard without a path is refused; a
# resumed step 3 shows each iteration once in TensorBoard.
# The read-back needs a Python with tensorboard: $FLOWRUN_PYENV (default build/pyenv, made by
# tools/setup.sh from PyPI), else python3; without one the test says so and is skipped (77).
set -euo pipefail
flowrun=$1 root=$2 out=$3
rm -rf "$out" && mkdir -p "$out"
small=(--no-progress --set graph.checkpoint_dir="$out/checkpoints" --set node.sft.steps=6 --set node.rm.steps=6
       --set node.sft.print_every=1 --set node.rm.print_every=1 --set node.prompts.iterations=3
       --set node.prompts.eval_prompts=8 --set node.sft.output="$out/sft.bin" --set node.rm.output="$out/rm"
       --set node.policy.output="$out/ppo.bin")

# an unwritable folder (below a regular file): refused when the graph is checked (exit 2, as every
# output that cannot be written), before sft trains, naming both
echo x > "$out/a_file"
set +e
"$flowrun" "$root/graphs/rlhf.graph" "${small[@]}" --set node.sft.enable_tensorboard=true \
  --set node.sft.tensorboard_path="$out/a_file/tb" > "$out/bad.log" 2> "$out/bad.err"
rc=$?
set -e
[ $rc -eq 2 ] || { echo "a tensorboard_path below a file: exit $rc, not 2"; cat "$out/bad.err"; exit 1; }
grep -q "error: setting 'tensorboard_path' of node 'sft': '$out/a_file' (above the output '$out/a_file/tb') is not a folder" "$out/bad.err" ||
  { echo "the error does not name the node and the path:"; cat "$out/bad.err"; exit 1; }
if grep -q "step 1 sft\]" "$out/bad.log"; then echo "sft started despite the unwritable path:"; cat "$out/bad.log"; exit 1; fi
# enabled without a folder: refused when the graph is checked (exit 2, as every bad setting),
# at the setting's place, before anything runs
set +e
"$flowrun" "$root/graphs/rlhf.graph" "${small[@]}" --set node.rm.enable_tensorboard=true > "$out/nopath.log" 2> "$out/nopath.err"
rc=$?
set -e
[ $rc -eq 2 ] || { echo "enable_tensorboard without tensorboard_path: exit $rc, not 2"; cat "$out/nopath.err"; exit 1; }
grep -q "^--set node.rm.enable_tensorboard=true:1:[0-9]*: error: node 'rm': enable_tensorboard = true needs tensorboard_path" "$out/nopath.err" ||
  { echo "the error does not name the node and the setting:"; cat "$out/nopath.err"; exit 1; }
grep -q "hint: set tensorboard_path" "$out/nopath.err" || { echo "no fix named:"; cat "$out/nopath.err"; exit 1; }
if [ -s "$out/nopath.log" ]; then echo "something ran:"; cat "$out/nopath.log"; exit 1; fi
# a tensorboard_path that is a file: refused when the graph is checked too (it failed at start, exit 1)
: > "$out/a_file"
set +e
"$flowrun" "$root/graphs/rlhf.graph" "${small[@]}" --set node.rm.enable_tensorboard=true \
  --set node.rm.tensorboard_path="$out/a_file" > "$out/tbfile.log" 2> "$out/tbfile.err"
rc=$?
set -e
[ $rc -eq 2 ] || { echo "tensorboard_path a file: exit $rc, not 2"; cat "$out/tbfile.err"; exit 1; }
grep -q "error: node 'rm': tensorboard_path = \"$out/a_file\": $out/a_file is a file, not a folder" "$out/tbfile.err" ||
  { echo "the error does not say the path is a file:"; cat "$out/tbfile.err"; exit 1; }

# the run, with TensorBoard on three nodes (step 3 commits every iteration, for the resume below)
small+=(--set node.ppo_controller.save_checkpoint_steps=1)
tb=()
for n in sft rm ppo_controller; do
  tb+=(--set "node.$n.enable_tensorboard=true" --set "node.$n.tensorboard_path=$out/tb")
done
"$flowrun" "$root/graphs/rlhf.graph" "${small[@]}" "${tb[@]}" > "$out/log" 2> "$out/err" ||
  { echo "flowrun failed:"; tail -20 "$out/err"; exit 1; }
cat "$out/log"
grep -q "step 3 ppo\] iter 2 reward" "$out/log" || { echo "step 3 did not finish"; exit 1; }

py=""
for cand in "${FLOWRUN_PYENV:-$root/build/pyenv}/bin/python" python3; do
  if command -v "$cand" > /dev/null && "$cand" -c "import tensorboard" 2> /dev/null; then py=$cand; break; fi
done
if [ -z "$py" ]; then
  echo "SKIP: no Python with the tensorboard package to read the event files back (tools/setup.sh makes" \
       "build/pyenv with it from PyPI; or set FLOWRUN_PYENV to a venv that has it)"
  exit 77
fi
"$py" "$root/tests/tensorboard_check.py" "$out/log" "$out/tb"

# a resumed run writes again the steps the interrupted one wrote after its last commit: the run's
# state cut back to its commit after iteration 1 (as a kill after iteration 2's report would
# leave it), the same command resumes after iteration 1 and writes iteration 2 again, into a
# second event file that starts with SessionLog START at step 2, so TensorBoard shows each
# iteration once, iteration 2 with the resumed run's values (tensorboard_check.py --resumed)
cp -r "$out/checkpoints" "$out/r_checkpoints"
mkdir -p "$out/r_tb" && cp -r "$out/tb/ppo_controller" "$out/r_tb/"
"$py" - "$out/r_checkpoints/step3.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["committed"] = [p for p in c["committed"] if p["iteration"] <= 2]
assert c["committed"], "no commit after iteration 1"
json.dump(c, open(sys.argv[1], "w"))
PY
"$flowrun" "$root/graphs/rlhf.graph" "${small[@]}" --set graph.checkpoint_dir="$out/r_checkpoints" \
  --set node.ppo_controller.enable_tensorboard=true --set node.ppo_controller.tensorboard_path="$out/r_tb" \
  --set node.rm.tensorboard_path="$out/tb_off" \
  > "$out/r_log" 2> "$out/r_err" || { echo "the resumed run failed:"; tail -20 "$out/r_err"; exit 1; }
# a tensorboard_path without enable_tensorboard writes nothing (DeepSpeed-Chat's meaning) and says so
grep -q "node 'rm': tensorboard_path = \"$out/tb_off\" but enable_tensorboard is false: no event files are written" \
  "$out/r_err" || { echo "no warning for a tensorboard_path without enable_tensorboard:"; cat "$out/r_err"; exit 1; }
[ ! -e "$out/tb_off" ] || { echo "$out/tb_off was written"; exit 1; }
# the folder held the interrupted run's events: the resumed run says that TensorBoard hides their later points
grep -q "ppo_controller.*TensorBoard: $out/r_tb/ppo_controller holds event files of an earlier run" "$out/r_err" ||
  { echo "no warning for a tensorboard_path with an earlier run's events:"; grep -i tensorboard "$out/r_err"; exit 1; }
grep -q "resuming after iteration 1 " "$out/r_log" || { echo "the run did not resume after iteration 1:"; cat "$out/r_log"; exit 1; }
grep "step 3 ppo\] iter" "$out/r_log"
cat "$out/log" "$out/r_log" > "$out/both_log"  # iteration 2 printed twice: the resumed run's line last
"$py" "$root/tests/tensorboard_check.py" --resumed "$out/both_log" "$out/r_tb"
# the same command once more: the run had finished, so nothing trains and nothing is written: no new event
# file, no warning of an earlier run (it opened an empty file and warned that the earlier curves hide)
ls "$out/r_tb/ppo_controller" > "$out/r_tb_files"
"$flowrun" "$root/graphs/rlhf.graph" "${small[@]}" --set graph.checkpoint_dir="$out/r_checkpoints" \
  --set node.ppo_controller.enable_tensorboard=true --set node.ppo_controller.tensorboard_path="$out/r_tb" \
  > "$out/f_log" 2> "$out/f_err" || { echo "the rerun of the finished run failed:"; tail -20 "$out/f_err"; exit 1; }
grep -q "held-out mean reward" "$out/f_log" || { echo "the finished run's rerun printed no results:"; cat "$out/f_log"; exit 1; }
ls "$out/r_tb/ppo_controller" | cmp -s - "$out/r_tb_files" ||
  { echo "the finished run's rerun changed the event files:"; ls -l "$out/r_tb/ppo_controller"; exit 1; }
grep -q "holds event files of an earlier run" "$out/f_err" && { echo "the finished run's rerun warned of hidden curves"; exit 1; }
"$py" "$root/tests/tensorboard_check.py" --resumed "$out/both_log" "$out/r_tb"
echo "tensorboard_small: ok"
