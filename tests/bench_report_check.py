#!/usr/bin/env python3
"""bench/report.py's regression check against hand-made results (standard library only).

usage: bench_report_check.py REPO_ROOT WORK_DIR

A machine type holds one baseline per host class (its recorded FMA peak): a run is checked
against the baseline whose peak is nearest its own within 1.3x, is not checked when no
baseline is that near, fails (exit 1) on a median ratio more than 10% below the chosen one,
and --record adds a new host class or replaces the one it matches.
"""
import json
import os
import subprocess
import sys

root, work = sys.argv[1:3]
os.makedirs(work, exist_ok=True)
report = os.path.join(root, "bench", "report.py")
HOST = {"kind": "host", "cpu": "Test CPU", "isa": "avx2", "cores": 2}
TYPE = "Test CPU | avx2"


def results(name, peak, flow_tok_s, torch_tok_s):
    """A results file: one machine line and 3 interleaved pairs of one training item."""
    path = os.path.join(work, name)
    with open(path, "w") as f:
        f.write(json.dumps(dict(HOST, source="flowrun")) + "\n")
        f.write(json.dumps({"source": "flowrun", "kind": "machine", "threads": 2, "peak_gflops": peak,
                            "read_gbs_1g": 8.0, "read_gbs_64m": 8.0, "gemm": "test"}) + "\n")
        for fl, th in zip(flow_tok_s, torch_tok_s):
            item = {"kind": "train", "model": "m", "B": 4, "T": 64}
            f.write(json.dumps(dict(item, source="flowrun", tok_s=fl, sgemm_bound_tok_s=2 * fl,
                                    peak_bound_tok_s=4 * fl)) + "\n")
            f.write(json.dumps(dict(item, source="torch", tok_s=th)) + "\n")
    return path


def run(res, base, *extra):
    p = subprocess.run([sys.executable, report, res, "--baseline", base, *extra],
                       capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


base = os.path.join(work, "baseline.json")
# two host classes of one type: ratio 2.0 recorded at 80 GFLOP/s, 1.5 at 190
slow = results("slow.jsonl", 80.0, [200, 210, 190], [100, 100, 100])    # median ratio 2.0
fast = results("fast.jsonl", 190.0, [150, 160, 140], [100, 100, 100])   # median ratio 1.5
if os.path.exists(base):
    os.remove(base)
rc, out = run(slow, base, "--record")
assert rc == 0 and "at an FMA peak of 80 GFLOP/s" in out, out
rc, out = run(fast, base)
assert rc == 0 and "not checked" in out and "recorded for peaks of 80 GFLOP/s" in out, out
rc, out = run(fast, base, "--record")
assert rc == 0, out
book = json.load(open(base))
peaks = sorted(b["machine"]["peak_gflops"] for b in book["machines"][TYPE]["baselines"])
assert peaks == [80.0, 190.0], peaks

# a full-core run at ratio 1.6 passes against 1.5 though it is far below the 80 GFLOP/s host's 2.0
rc, out = run(results("fast_ok.jsonl", 181.0, [160, 150, 170], [100, 100, 100]), base)
assert rc == 0 and "regression check: ok" in out and "recorded at an FMA peak of 190" in out, out
# a slow-host run at 1.7 fails against its own class's 2.0 (15% below)
rc, out = run(results("slow_bad.jsonl", 85.0, [170, 165, 175], [100, 100, 100]), base)
assert rc == 1 and "FAILED" in out and "1.700 < 2.000" in out, out
# a legacy entry (one baseline, no host classes) is still read
legacy = os.path.join(work, "legacy.json")
with open(legacy, "w") as f:
    json.dump({"machines": {TYPE: book["machines"][TYPE]["baselines"][0]}}, f)
rc, out = run(results("slow_ok.jsonl", 79.0, [200, 195, 205], [100, 100, 100]), legacy)
assert rc == 0 and "regression check: ok" in out, out
# re-recording a class replaces it rather than adding a third
rc, out = run(results("fast_new.jsonl", 200.0, [170, 170, 170], [100, 100, 100]), base, "--record")
book = json.load(open(base))
bases = book["machines"][TYPE]["baselines"]
assert rc == 0 and len(bases) == 2, out
assert sorted(round(b["ratios"]["train m B=4 T=64 / torch"], 3) for b in bases) == [1.7, 2.0], bases

# a PPO-vs-TRL line in fp32 and one with both sides in bf16 (bench/trl_ppo.py --dtype bf16): two ratios and two
# goal rows, the bf16 one named as such (the goal's own measure is fp32)
def trl_line(dtype, ratio):
    d = {"kind": "trl_ppo", "model": "llama6m", "pairs": 3, "iterations": 8, "threads": 2, "batch": 8,
         "prompt_len": 48, "answer_len": 32, "flowrun_s_per_iter": [0.3] * 3, "trl_s_per_iter": [0.3 * ratio] * 3,
         "flowrun_samples_per_s_median": 8 / 0.3, "trl_samples_per_s_median": 8 / (0.3 * ratio),
         "ratio_median": ratio, "ratio_min": ratio, "ratio_max": ratio, "flowrun_answer_len_mean": 32.0,
         "trl_version": "1.12.0", "torch_version": "2", "host": HOST}
    if dtype:
        d["dtype"] = dtype
    return json.dumps(d)


def grpo_line(dtype, ratio):
    d = json.loads(trl_line(dtype, ratio))
    d.update(kind="trl_grpo", prompts=2, num_generations=8, trl_answer_len_mean=32.0)
    return json.dumps(d)


both = results("trl.jsonl", 190.0, [170, 170, 170], [100, 100, 100])
with open(both, "a") as f:
    f.write(trl_line(None, 2.8) + "\n")  # a line from before --dtype: fp32
    f.write(trl_line("bf16", 4.1) + "\n")
    f.write(grpo_line("fp32", 2.2) + "\n")
    f.write(grpo_line("bf16", 2.9) + "\n")
rc, out = run(both, os.path.join(work, "trl_base.json"), "--record")
assert rc == 0, out
rows = [l for l in out.splitlines() if l.startswith("| PPO iteration, llama6m >= 4x")]
assert len(rows) == 2, out
assert "2.80x" in rows[0] and "(the goal's measure is fp32)" not in rows[0] and "no" in rows[0], rows
assert "both sides in bf16 (the goal's measure is fp32)" in rows[1] and "4.10x" in rows[1], rows
ratios = json.load(open(os.path.join(work, "trl_base.json")))["machines"][TYPE]["baselines"][0]["ratios"]
assert ratios["ppo llama6m / trl"] == 2.8 and ratios["ppo llama6m bf16 / trl"] == 4.1, ratios
assert ratios["grpo llama6m / trl"] == 2.2 and ratios["grpo llama6m bf16 / trl"] == 2.9, ratios
assert "| llama6m, bf16 on both, 2 prompts x 8 answers" in out, out

# a run of some items updates those ratios and keeps the baseline's others (a --only or --no-torch record
# replaced the whole class: 17 ratios became 0 and every later check passed)
part = os.path.join(work, "part_base.json")
with open(part, "w") as f:
    json.dump(json.load(open(os.path.join(work, "trl_base.json"))), f)
rc, out = run(results("part.jsonl", 195.0, [180, 180, 180], [100, 100, 100]), part, "--record")
assert rc == 0 and "kept 4 of the baseline's" in out, out
kept = json.load(open(part))["machines"][TYPE]["baselines"]
assert len(kept) == 1 and kept[0]["ratios"]["ppo llama6m / trl"] == 2.8, kept
assert round(kept[0]["ratios"]["train m B=4 T=64 / torch"], 3) == 1.8, kept
# a check that compares nothing fails (a misspelt item ran nothing and the check said "ok")
nothing = os.path.join(work, "nothing.jsonl")
with open(nothing, "w") as f:
    f.write(json.dumps(dict(HOST, source="flowrun")) + "\n")
    f.write(json.dumps({"source": "flowrun", "kind": "machine", "threads": 2, "peak_gflops": 190.0,
                        "read_gbs_1g": 8.0, "read_gbs_64m": 8.0, "gemm": "test"}) + "\n")
rc, out = run(nothing, part)  # machine figures alone: no ratio to check
assert rc == 0 and "measured no ratio" in out and "not checked" in out, out
other = os.path.join(work, "other.jsonl")
with open(other, "w") as f:
    f.write(open(nothing).read())
    for fl, th in ((180, 100), (170, 100)):
        item = {"kind": "train", "model": "other", "B": 4, "T": 64}
        f.write(json.dumps(dict(item, source="flowrun", tok_s=fl, sgemm_bound_tok_s=2 * fl, peak_bound_tok_s=4 * fl)) + "\n")
        f.write(json.dumps(dict(item, source="torch", tok_s=th)) + "\n")
rc, out = run(other, part)  # ratios, none of them the baseline's
assert rc == 1 and "measured none of the" in out, out
# an empty file, a missing one, a cut line and --record without --baseline: errors (exit 2), no traceback
empty = os.path.join(work, "empty.jsonl")
open(empty, "w").close()
for args in ([empty, "--baseline", part], [os.path.join(work, "missing.jsonl")], [nothing, "--record"]):
    p = subprocess.run([sys.executable, report, *args], capture_output=True, text=True)
    assert p.returncode == 2 and "Traceback" not in p.stderr and p.stderr.startswith("report: "), (args, p.stderr)
cut = os.path.join(work, "cut.jsonl")
with open(cut, "w") as f:
    f.write(open(nothing).read() + '{"kind": "tra')
p = subprocess.run([sys.executable, report, cut], capture_output=True, text=True)
assert p.returncode == 2 and "cut.jsonl:3: not a JSON line" in p.stderr, p.stderr
# a loaded host's run (its FMA peak below every class's) is not checked, and says why
rc, out = run(results("loaded.jsonl", 60.0, [100, 100, 100], [100, 100, 100]), part)
assert rc == 0 and "not checked" in out and "below every recorded one" in out, out

# bench/host.py names the machine type: two AMD EPYC generations that share a model name
# are two types (a Zen 5 run was checked against the Zen 4 baseline), and the ISA is the widest.
# Run as run_bench.sh runs it: one JSON line on stdout, from the cpuinfo file given alone.
host_py = os.path.join(root, "bench", "host.py")


def host_line(name, text):
    path = os.path.join(work, name)
    with open(path, "wb") as f:
        f.write(text.encode() if isinstance(text, str) else text)
    p = subprocess.run([sys.executable, host_py, path], capture_output=True, text=True)
    assert p.returncode == 0 and p.stderr == "", (name, p.returncode, p.stderr)
    d = json.loads(p.stdout)
    assert d["kind"] == "host" and d["cores"] >= 1 and p.stdout.count("\n") == 1, p.stdout
    return d


zen = "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: {}\nmodel\t\t: {}\nmodel name\t: AMD EPYC\n" \
      "flags\t\t: fpu sse4_2 avx2 fma avx512f avx512bw\n\nprocessor\t: 1\ncpu family\t: 99\nmodel\t\t: 99\n"
z4, z5 = host_line("zen4", zen.format(25, 17)), host_line("zen5", zen.format(26, 2))
assert (z4["cpu"], z4["isa"]) == ("AMD EPYC (family 25 model 17)", "avx512"), z4
assert (z5["cpu"], z5["isa"]) == ("AMD EPYC (family 26 model 2)", "avx512"), z5
for name, text, cpu, isa in (
        ("nofma", "cpu family\t: 23\nmodel\t\t: 49\nmodel name\t: AMD EPYC 7B12\nflags\t\t: sse4_2 avx2\n",
         "AMD EPYC 7B12 (family 23 model 49)", "avx2-nofma"),
        ("sse4", "cpu family\t: 6\nmodel\t\t: 26\nmodel name\t: Intel Xeon\nflags\t\t: sse2 sse4_1 sse4_2\n",
         "Intel Xeon (family 6 model 26)", "sse4"),
        ("neon", "processor\t: 0\nFeatures\t: fp asimd evtstrm\nCPU implementer\t: 0x41\n", "unknown", "neon"),
        ("sve", "processor\t: 0\nFeatures\t: fp asimd sve\nCPU implementer\t: 0x41\n", "unknown", "sve"),
        ("armv7", "Hardware\t: BCM2835\nFeatures\t: half thumb\n", "BCM2835", "scalar"),
        ("noflags", "model name\t: Some CPU\n", "Some CPU", "scalar"),
        ("empty", "", "unknown", "scalar"),
        ("notutf8", b"model name\t: \xff CPU\nflags\t: avx2 fma\n", "\ufffd CPU", "avx2")):
    d = host_line(name, text)
    assert (d["cpu"], d["isa"]) == (cpu, isa), (name, d)
p = subprocess.run([sys.executable, host_py, os.path.join(work, "no-such-cpuinfo")], capture_output=True, text=True)
assert p.returncode == 2 and p.stdout == "" and "cannot read" in p.stderr and "Traceback" not in p.stderr, p
# a results file from before host.py ("Test CPU", no family and model) is told so, not checked
rc, out = run(results("old_host.jsonl", 80.0, [200, 210, 190], [100, 100, 100]),
              os.path.join(root, "bench", "baseline.json"))
assert rc == 0 and "predates bench/host.py" in out, out
# the committed baseline's keys are host.py's machine types of the hosts each entry records
book = json.load(open(os.path.join(root, "bench", "baseline.json")))
for key, entry in book["machines"].items():
    for b in entry.get("baselines", [entry]):
        assert key == f'{b["host"]["cpu"]} | {b["host"]["isa"]}' and "(family " in key, key
print("bench_report_check: ok")
