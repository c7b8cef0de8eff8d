#!/usr/bin/env python3
"""Samples per second and held-out results of step 3 at max_staleness S = 0, 1, 2 (issue 21).

  python3 bench/async_staleness.py --flowrun build/bin/flowrun --out DIR [--rounds 2] [--iterations 12]
                                   [--graphs ppo,grpo] [--staleness 0,1,2]

One process per run; the generator and the trainers get one OpenMP thread each (the nodes' `threads`
setting), so on a 2-core machine generation and training can overlap only when S >= 1. For each graph
the S values run interleaved (S = 0, 1, 2, then 2, 1, 0, ...), `rounds` times. Per run:
- samples/s: prompts per iteration (times num_generations for GRPO) over the median interval between
  consecutive `[step 3 ppo] iter` lines, the first dropped (warm-up);
- the held-out result the controller prints after training (ppo: the reward model's mean reward on the
  held-out prompts; grpo: the same line, whose reward is the rule reward, i.e. accuracy).
The models: ppo.graph starts from step-1 and step-2 models made once with graphs/rlhf.graph (a few
steps, as bench/ppo_split.py); grpo.graph trains its own SFT model first (fewer steps here), whose time
is outside the measured intervals.
Prints one JSON line per graph and S: {"kind": "staleness", ...}, and a table to stderr.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_quiet(cmd, log):
    with open(log, "w") as f:
        r = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT)
    if r.returncode:
        sys.exit(f"async_staleness: {' '.join(cmd)} failed (exit {r.returncode}); see {log}")


def one_run(cmd):
    """Runs cmd; returns (intervals between iteration lines, held-out result after, the log)."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    stamps, after, log = [], None, []
    for line in p.stdout:
        log.append(line)
        if "[step 3 ppo] iter " in line:
            stamps.append(time.perf_counter())
        if "[step 3 ppo] held-out mean reward" in line and "->" in line:
            after = float(line.split("->")[1].split()[0])
    if p.wait():
        sys.exit("async_staleness: flowrun failed:\n" + "".join(log[-30:]))
    return [b - a for a, b in zip(stamps, stamps[1:])], after, log


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--flowrun", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--iterations", type=int, default=12)
    ap.add_argument("--graphs", default="ppo,grpo")
    ap.add_argument("--staleness", default="0,1,2")
    a = ap.parse_args()
    out = os.path.abspath(a.out)
    os.makedirs(out, exist_ok=True)
    svals = [int(x) for x in a.staleness.split(",")]
    def one_thread(nodes):
        return [x for n in nodes for x in ("--set", f"node.{n}.threads=1")]

    sft, rm = os.path.join(out, "sft.bin"), os.path.join(out, "rm")
    results = []
    for g in a.graphs.split(","):
        if g == "ppo":
            if not (os.path.exists(sft) and os.path.isdir(rm)):
                run_quiet([a.flowrun, os.path.join(ROOT, "graphs/rlhf.graph"), "--no-progress", "-q", "--set",
                           "graph.checkpoint_dir=", "--set", "node.sft.steps=40", "--set", "node.rm.steps=40",
                           "--set", "node.prompts.iterations=1", "--set", "node.prompts.eval_prompts=4",
                           "--set", f"node.sft.output={sft}", "--set", f"node.rm.output={rm}",
                           "--set", f"node.policy.output={os.path.join(out, 'rlhf_ppo.bin')}"],
                          os.path.join(out, "models.log"))
            base = [a.flowrun, os.path.join(ROOT, "graphs/ppo.graph"), "--no-progress", "--set", "graph.checkpoint_dir=",
                    "--set", f"node.actor_model.model={sft}", "--set", f"node.reward_model.model={rm}",
                    "--set", f"node.prompts.iterations={a.iterations}",
                    "--set", f"node.policy.output={os.path.join(out, 'ppo.bin')}"] + \
                one_thread(["generator", "policy", "critic", "reference", "reward"])
            controller, per_iter = "ppo_controller", 8
        else:
            data = os.path.join(out, "addition.jsonl")  # tools/make_addition_data.py, as the README runs it
            if not os.path.exists(data):
                run_quiet([sys.executable, os.path.join(ROOT, "tools/make_addition_data.py"), "--out", data],
                          os.path.join(out, "addition.log"))
            base = [a.flowrun, os.path.join(ROOT, "graphs/grpo.graph"), "--set", f"node.sft.data={data}",
                    "--set", f"node.prompts.data={data}", "--no-progress", "--set", "graph.checkpoint_dir=",
                    "--set", "node.sft.steps=200", "--set", f"node.prompts.iterations={a.iterations}",
                    "--set", "node.prompts.eval_prompts=64",
                    "--set", f"node.policy.output={os.path.join(out, 'grpo.bin')}"] + \
                one_thread(["generator", "policy", "reference"])
            controller, per_iter = "controller", 64 * 8
        runs = {s: [] for s in svals}
        for r in range(a.rounds):
            for s in (svals if r % 2 == 0 else list(reversed(svals))):
                iv, after, log = one_run(base + ["--set", f"node.{controller}.max_staleness={s}"])
                with open(os.path.join(out, f"{g}.S{s}.r{r}.log"), "w") as f:
                    f.writelines(log)
                sps = per_iter / statistics.median(iv)
                runs[s].append((sps, after))
                print(f"# {g} S={s} round {r + 1}: {sps:.1f} samples/s, held-out after {after}", file=sys.stderr,
                      flush=True)
        s0 = statistics.median([x[0] for x in runs[svals[0]]])
        for s in svals:
            sps = [x[0] for x in runs[s]]
            d = {"kind": "staleness", "graph": g, "S": s, "rounds": a.rounds, "iterations": a.iterations,
                 "samples_per_s": sps, "samples_per_s_median": statistics.median(sps),
                 "speedup_vs_S0": statistics.median(sps) / s0,
                 "held_out_after": [x[1] for x in runs[s]]}
            results.append(d)
            print(json.dumps(d), flush=True)
    print("\n| graph | S | samples/s (median) | vs S = 0 | held-out after (each round) |", file=sys.stderr)
    print("|---|---|---|---|---|", file=sys.stderr)
    for d in results:
        print(f'| {d["graph"]} | {d["S"]} | {d["samples_per_s_median"]:.1f} | {d["speedup_vs_S0"]:.2f}x | '
              f'{", ".join("-" if x is None else f"{x:.4f}" for x in d["held_out_after"])} |', file=sys.stderr)


if __name__ == "__main__":
    main()
