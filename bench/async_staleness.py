#!/usr/bin/env python3
"""Samples per second and held-out results of step 3 at max_staleness S = 0, 1, 2 (issue 21).

  python3 bench/async_staleness.py --flowrun build/bin/flowrun --out DIR [--rounds 2] [--iterations 12]
                                   [--graphs ppo,grpo,grpo_noref] [--staleness 0,1,2] [--placement one|split]

The generator and the trainers get one OpenMP thread each (the nodes' `threads` setting), so on a
2-core machine generation and training can overlap only when S >= 1. Placement:
- one (the default): one process, the threads placed by the OS;
- split: the generator in a process of its own, pinned to core 1 (`taskset -c 1 flowrun node`, a
  cluster on 127.0.0.1, docs/scaling.md), everything else (the trainers, scorers, loader and
  controller) in the main process pinned to core 0: the issue's "one core each". Rollouts and the
  policy's weights then cross processes through the bulk plane (gloo), every update. For each graph
the S values run interleaved (S = 0, 1, 2, then 2, 1, 0, ...), `rounds` times. Per run:
- samples/s: prompts per iteration (times num_generations for GRPO) over the mean interval between
  consecutive `[step 3 ppo] iter` lines from the second to the last (the first interval dropped:
  warm-up). The mean, not the median: with S >= 1 the reports can come in bursts (two batches
  reported 0.4 s apart, then 2.6 s to the next), where the median interval says nothing of the rate;
- the held-out result the controller prints after training (ppo: the reward model's mean reward on the
  held-out prompts; grpo: the same line, whose reward is the rule reward, i.e. accuracy).
The models: ppo.graph starts from step-1 and step-2 models made once with graphs/rlhf.graph (a few
steps, as bench/ppo_split.py); grpo.graph trains its own SFT model first (the graph's 1000 steps since 2026-12-06; 500 before), whose time
is outside the measured intervals. grpo_noref is grpo.graph less its reference model (node and edges;
the experience maker's reference = false, the policy's use_kl_loss = false: no KL, as DAPO trains), the
same job with one frozen forward fewer per batch.
Prints one JSON line per graph and S: {"kind": "staleness", ...}, and a table to stderr.

With --profile each run also writes its --metrics file (DIR/GRAPH.S<S>.r<R>.metrics.jsonl) and the
script prints, per graph and S, where an iteration's time goes, from the run's own metrics
(medians over the rounds; the first iteration dropped): {"kind": "profile", ...} and a table:
- phase_seconds: the controller's signals per iteration: generate (the generator's own time),
  score (phase_seconds/score_and_experience: the four scorers, rewards, advantages and the messages
  between), train (from the experience to both trainers' stats: with S >= 1 this includes the wait
  for the trainers to finish the batch before), report;
- wait_seconds: the controller's wait_seconds/generate and wait_seconds/train: one iteration's
  interval less the generator's (the policy's) own time on the batch;
- per node, seconds per iteration busy in the node's calls and waiting for input between them
  (the metrics' busy_s and wait_s over the steady window, times the mean interval);
- cores: the CPU time of the run's processes (/proc/PID/stat, user + system; with split, the node daemon's too) over
  the same window's wall time.
"""
import argparse
import json
import os
import re
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


def cpu_seconds(pid):
    """User + system CPU seconds of process pid so far (/proc/PID/stat fields 14 and 15)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except OSError:
        return None


def start_node(flowrun, out, core):
    """A `flowrun node` daemon pinned to one core, for one job (--once); returns (process, cluster file,
    secret file)."""
    secret, port_file = os.path.join(out, "secret"), os.path.join(out, "w1.port")
    with open(secret, "w") as f:
        f.write(f"async-bench-{os.getpid()}-{time.time()}\n")
    if os.path.exists(port_file):
        os.remove(port_file)
    log = open(os.path.join(out, "w1.log"), "a")
    node = subprocess.Popen(["taskset", "-c", str(core), flowrun, "node", "--listen", "127.0.0.1:0", "--secret-file",
                             secret, "--port-file", port_file, "--threads", "1", "--once"], stdout=log,
                            stderr=subprocess.STDOUT)
    for _ in range(200):
        if os.path.exists(port_file) and os.path.getsize(port_file):
            break
        time.sleep(0.05)
    else:
        node.kill()
        sys.exit(f"async_staleness: the node daemon did not start; see {log.name}")
    with open(port_file) as f:
        port = f.read().strip()
    cluster = os.path.join(out, "cluster.toml")
    with open(cluster, "w") as f:
        f.write(f'[cluster]\nheartbeat_ms = 250\n[cluster.nodes.w1]\naddress = "127.0.0.1:{port}"\n')
    return node, cluster, secret


def one_run(cmd, node=None):
    """Runs cmd; returns (intervals between iteration lines, held-out result after, the log, cores used
    between the second and the last iteration line, by cmd and by the node daemon if any)."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    stamps, cpus, after, log = [], [], None, []
    def cpu_now():
        a = cpu_seconds(p.pid)
        b = cpu_seconds(node.pid) if node else 0.0
        return None if a is None or b is None else a + b
    for line in p.stdout:
        log.append(line)
        if "[step 3 ppo] iter " in line:
            stamps.append(time.perf_counter())
            cpus.append(cpu_now())
        if "[step 3 ppo] held-out mean reward" in line and "->" in line:
            after = float(line.split("->")[1].split()[0])
    if p.wait():
        if node:
            node.kill()
        sys.exit("async_staleness: flowrun failed:\n" + "".join(log[-30:]))
    if node and node.wait(timeout=60):
        sys.exit(f"async_staleness: the node daemon exited with {node.returncode}")
    cores = None
    if len(stamps) >= 3 and cpus[1] is not None and cpus[-1] is not None:
        cores = (cpus[-1] - cpus[1]) / (stamps[-1] - stamps[1])
    return [b - a for a, b in zip(stamps, stamps[1:])], after, log, cores


def profile_of(metrics_file, controller, cycle):
    """Where one iteration's time goes, from a --metrics file (see the module's doc)."""
    sig, snaps = {}, []
    with open(metrics_file) as f:
        for line in f:
            d = json.loads(line)
            if "signal" in d:
                if d["node"] == controller and d.get("value") is not None and d["step"] >= 1:
                    sig.setdefault(d["signal"], []).append((d["step"], d["value"], d["t"]))
            elif "nodes" in d:
                snaps.append(d)
    med = lambda name: statistics.median([v for _, v, _ in sig[name]]) if sig.get(name) else None
    out = {"phase_seconds": {"generate": med("phase_seconds/generate"),
                             "score": med("phase_seconds/score_and_experience"),
                             "train": med("phase_seconds/train"), "report": med("phase_seconds/report")},
           "wait_seconds": {"generate": med("wait_seconds/generate"), "train": med("wait_seconds/train")},
           "nodes": {}}
    reports = sorted(t for _, _, t in sig.get("actor_loss", []))
    if len(reports) >= 2:  # the steady window: from the second trained report to the last
        inside = [s for s in snaps if reports[0] <= s["t"] <= reports[-1]]
        if len(inside) >= 2:
            a, b = inside[0], inside[-1]
            dt = b["t"] - a["t"]
            for name, n in b["nodes"].items():
                m = a["nodes"].get(name)
                if m is None:
                    continue
                out["nodes"][name] = {"busy": (n["busy_s"] - m["busy_s"]) / dt * cycle,
                                      "wait": (n.get("wait_s", 0) - m.get("wait_s", 0)) / dt * cycle}
    return out


def median_profile(profiles):
    """The median of each number over the rounds' profiles."""
    def med(xs):
        xs = [x for x in xs if x is not None]
        return statistics.median(xs) if xs else None
    out = {}
    for key in ("phase_seconds", "wait_seconds"):
        out[key] = {k: med([p[key][k] for p in profiles]) for k in profiles[0][key]}
    names = set().union(*[p["nodes"].keys() for p in profiles])
    out["nodes"] = {n: {k: med([p["nodes"].get(n, {}).get(k) for p in profiles]) for k in ("busy", "wait")}
                    for n in sorted(names)}
    out["cores"] = med([p.get("cores") for p in profiles])
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--flowrun", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--iterations", type=int, default=12)
    ap.add_argument("--graphs", default="ppo,grpo")
    ap.add_argument("--staleness", default="0,1,2")
    ap.add_argument("--profile", action="store_true", help="also print where each iteration's time goes")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="more --set for every run (e.g. node.generator.threads=2)")
    ap.add_argument("--placement", choices=("one", "split"), default="one",
                    help="one process, or the generator pinned to core 1 in its own process and the rest to core 0")
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
            graph, threaded, extra_sets = os.path.join(ROOT, "graphs/grpo.graph"), ["generator", "policy", "reference"], []
            if g == "grpo_noref":  # without the reference model: no KL (veRL with neither KL option, as DAPO)
                graph, threaded = os.path.join(out, "grpo_noref.graph"), ["generator", "policy"]
                extra_sets = ["--set", "node.experience.reference=false", "--set", "node.policy.use_kl_loss=false"]
                with open(os.path.join(ROOT, "graphs/grpo.graph")) as f:
                    text = f.read().replace(", reference.init", "").replace(", reference.rollouts", "")
                text = re.sub(r'\s*"reference\.scored -> experience\.ref_logprobs",', "", text)
                with open(graph, "w") as f:  # its model inputs resolve under FLOWRUN_ASSETS from there
                    f.write(re.sub(r"\[node\.reference\]\n(?:(?!\[).*\n)*", "", text))
            base = [a.flowrun, graph, "--set", f"node.sft.data={data}",
                    "--set", f"node.prompts.data={data}", "--no-progress", "--set", "graph.checkpoint_dir=",
                    "--set", "node.sft.output=",
                    "--set", f"node.prompts.iterations={a.iterations}",
                    "--set", f"node.policy.output={os.path.join(out, 'grpo.bin')}"] + one_thread(threaded) + extra_sets
            controller, per_iter = "controller", 64 * 8
        for kv in a.set:
            base += ["--set", kv]
        runs = {s: [] for s in svals}
        profiles = {s: [] for s in svals}
        for r in range(a.rounds):
            for s in (svals if r % 2 == 0 else list(reversed(svals))):
                extra = []
                mfile = os.path.join(out, f"{g}.S{s}.r{r}.metrics.jsonl")
                if a.profile:
                    extra = ["--metrics", mfile, "--metrics-interval", "0.2"]
                cmd, node = base + ["--set", f"node.{controller}.max_staleness={s}"] + extra, None
                if a.placement == "split":
                    node, cluster, secret = start_node(a.flowrun, out, 1)
                    cmd = ["taskset", "-c", "0"] + cmd + ["--cluster", cluster, "--secret-file", secret,
                                                          "--set", "node.generator.on=w1"]
                iv, after, log, cores = one_run(cmd, node)
                with open(os.path.join(out, f"{g}.S{s}.r{r}.log"), "w") as f:
                    f.writelines(log)
                cycle = statistics.mean(iv[1:] if len(iv) > 1 else iv)  # seconds per batch over the steady window
                sps = per_iter / cycle
                runs[s].append((sps, after))
                if a.profile:
                    p = profile_of(mfile, controller, cycle)
                    p["cores"] = cores
                    p["cycle"] = cycle
                    profiles[s].append(p)
                print(f"# {g} S={s} round {r + 1}: {sps:.1f} samples/s, held-out after {after}", file=sys.stderr,
                      flush=True)
        s0 = statistics.median([x[0] for x in runs[svals[0]]])
        for s in svals:
            sps = [x[0] for x in runs[s]]
            d = {"kind": "staleness", "graph": g, "S": s, "placement": a.placement, "rounds": a.rounds,
                 "iterations": a.iterations,
                 "samples_per_s": sps, "samples_per_s_median": statistics.median(sps),
                 "speedup_vs_S0": statistics.median(sps) / s0,
                 "held_out_after": [x[1] for x in runs[s]]}
            results.append(d)
            print(json.dumps(d), flush=True)
        if a.profile:
            print(f"\n{g}: seconds per iteration (medians of {a.rounds} rounds)", file=sys.stderr)
            for s in svals:
                mp = median_profile(profiles[s])
                cycle = statistics.median([p["cycle"] for p in profiles[s]])
                pl = {"kind": "profile", "graph": g, "S": s, "cycle_s": cycle, **mp}
                print(json.dumps(pl), flush=True)
                ph, w = mp["phase_seconds"], mp["wait_seconds"]
                f = lambda x: "-" if x is None else f"{x:.3f}"
                print(f"S={s}: iteration {cycle:.3f} s, cores used {f(mp['cores'])}; phases: generate {f(ph['generate'])}, "
                      f"score {f(ph['score'])}, train {f(ph['train'])}, report {f(ph['report'])}; waits: generator "
                      f"{f(w['generate'])}, policy {f(w['train'])}", file=sys.stderr)
                for n, v in mp["nodes"].items():
                    print(f"    {n:16s} busy {f(v['busy'])}  waiting for input {f(v['wait'])}", file=sys.stderr)
    print("\n| graph | S | samples/s (median) | vs S = 0 | held-out after (each round) |", file=sys.stderr)
    print("|---|---|---|---|---|", file=sys.stderr)
    for d in results:
        print(f'| {d["graph"]} | {d["S"]} | {d["samples_per_s_median"]:.1f} | {d["speedup_vs_S0"]:.2f}x | '
              f'{", ".join("-" if x is None else f"{x:.4f}" for x in d["held_out_after"])} |', file=sys.stderr)


if __name__ == "__main__":
    main()
