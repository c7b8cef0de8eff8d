#!/usr/bin/env python3
"""A PPO job on stories260K (graphs/ppo.graph), its time split by phase from
the runtime's own metrics (flowrun --metrics: per-node busy time, per-edge
messages and bytes).

  bench/ppo_split.py --flowrun build/bin/flowrun --out DIR [--iterations N] [--quick]

1. The step-1 and step-2 models it starts from are made once (graphs/rlhf.graph
   with a few SFT and RM steps) and kept in DIR.
2. graphs/ppo.graph runs N PPO iterations (plus its held-out passes before and
   after) with ONE CAF worker thread (--threads 1), so node callbacks never
   overlap: the job's wall time is the sum of the nodes' busy times plus what
   the runtime itself spends (scheduling, messaging, credit bookkeeping,
   metrics, start-up and shutdown). The kernels inside a callback still use
   every core (OpenMP).
3. Phases, from the per-node busy times:
   - generation: the rollout generator;
   - scoring: the reference and reward models, plus the scoring part of the
     policy and the critic, taken as equal to the reference's and the
     reward model's (same model shapes, same sequences, the same forward);
   - training: the rest of the policy's and the critic's busy time;
   - experience: the experience maker (rewards, GAE);
   - weight sync: the policy -> generator "weights" edge carries a handle to
     the live model (the hybrid engine), no copy: its bytes are reported;
   - loading: model sources, prompt loader, controller;
   - runtime: wall time minus the sum of all busy times; null when the busy
     times add up to more than the wall time (the policy and the critic are
     blocking kinds with threads of their own and overlap the others even
     with one CAF worker: then this split cannot see the runtime's share).
Prints one JSON line {"kind": "ppo", ...} for bench/report.py.
"""
import argparse
import json
import os
import subprocess
import sys
import time


def run(cmd, log):
    with open(log, "w") as f:
        r = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT)
    if r.returncode != 0:
        sys.stderr.write(f"ppo_split: {' '.join(cmd)} failed (exit {r.returncode}); see {log}\n")
        sys.exit(1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--flowrun", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--iterations", type=int, default=10)
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    if not (os.path.isfile(a.flowrun) and os.access(a.flowrun, os.X_OK)):
        ap.error(f"--flowrun {a.flowrun}: no such program (tools/build.sh builds build/bin/flowrun)")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = os.path.abspath(a.out)
    os.makedirs(out, exist_ok=True)
    iters = 3 if a.quick else a.iterations

    sft, rm = os.path.join(out, "sft.bin"), os.path.join(out, "rm")
    if not (os.path.exists(sft) and os.path.isdir(rm)):
        run([a.flowrun, os.path.join(root, "graphs/rlhf.graph"), "--no-progress", "-q", "--set", "graph.checkpoint_dir=",
             "--set", "node.sft.steps=6", "--set", "node.rm.steps=6",
             "--set", "node.prompts.iterations=1", "--set", "node.prompts.eval_prompts=4",
             "--set", f"node.sft.output={sft}", "--set", f"node.rm.output={rm}",
             "--set", f"node.policy.output={os.path.join(out, 'rlhf_ppo.bin')}"], os.path.join(out, "models.log"))

    metrics = os.path.join(out, "ppo_metrics.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    t0 = time.time()
    run([a.flowrun, os.path.join(root, "graphs/ppo.graph"), "--no-progress", "-q", "--threads", "1",
         "--metrics", metrics, "--metrics-interval", "0",
         "--set", f"node.actor_model.model={sft}", "--set", f"node.reward_model.model={rm}",
         "--set", f"node.prompts.iterations={iters}", "--set", "node.prompts.eval_prompts=8",
         "--set", f"node.policy.output={os.path.join(out, 'ppo.bin')}"], os.path.join(out, "ppo.log"))
    wall = time.time() - t0
    final = None
    with open(metrics) as f:
        for line in f:
            d = json.loads(line)
            if d.get("final"):
                final = d
    n = final["nodes"]
    busy = {k: v["busy_s"] for k, v in n.items()}
    t = final["t"]
    g = lambda k: busy.get(k, 0.0)
    pol_score = min(g("reference"), g("policy"))
    cri_score = min(g("reward"), g("critic"))
    phases = {
        "generation": g("generator"),
        "scoring": g("reference") + g("reward") + pol_score + cri_score,
        "experience": g("experience"),
        "training": (g("policy") - pol_score) + (g("critic") - cri_score),
        "weight sync": 0.0,
        "loading (models, prompts, controller)": g("actor_model") + g("reward_model") + g("prompts") +
                                                 g("ppo_controller"),
    }
    known = set(["generator", "reference", "reward", "policy", "critic", "experience", "actor_model",
                 "reward_model", "prompts", "ppo_controller"])
    other = sum(v for k, v in busy.items() if k not in known)
    if other:
        phases["other nodes"] = other
    # The policy and the critic are blocking node kinds (threads of their own: their ranks block in
    # collectives), so they run beside the CAF worker even with --threads 1 and the busy times can
    # add up to more than the wall time. Then wall - busy says nothing about the runtime: reported
    # as unknown (null), with the overlap, instead of a clamped 0.
    busy_sum = sum(busy.values())
    overlap = busy_sum > t
    phases["runtime (wall - sum of busy)"] = None if overlap else t - busy_sum
    weights = final["edges"].get("policy.weights -> generator.weights", {})
    res = {
        "kind": "ppo",
        "iterations": iters,
        "held_out_passes": 2,
        "seconds": t,
        "process_seconds": wall,
        "seconds_per_iteration": t / iters,
        "phases": {k: (None if v is None else v / iters) for k, v in phases.items()},
        "busy_over_wall": busy_sum / t,
        "runtime_overhead_share": None if overlap else phases["runtime (wall - sum of busy)"] / t,
        "weights_edge": {"messages": weights.get("sent", 0), "bytes": weights.get("bytes", 0)},
        "messages": sum(e.get("sent", 0) for e in final["edges"].values()),
    }
    print(json.dumps(res))


if __name__ == "__main__":
    main()
