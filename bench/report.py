#!/usr/bin/env python3
"""Merges bench_core's and torch_ref.py's JSON lines into the table of
docs/performance.md, and checks the ratios against the last recorded ones.

  bench/report.py RESULTS.jsonl [--baseline bench/baseline.json] [--record] [--tolerance 0.10]

RESULTS.jsonl holds lines from bench_core --json (source "flowrun"), from
torch_ref.py (source "torch"), from ppo_split.py (kind "ppo"), from runtime_share.py
(kind "runtime_share": the actor runtime's share of a PPO run's CPU samples) and run_bench.sh's
"host" line (CPU model and ISA), each tagged by bench/run_bench.sh with
{"source": ...}. run_bench.sh runs each item as interleaved pairs (flowrun, then
PyTorch, then flowrun, ...): the k-th flowrun figure of an item is paired with its
k-th PyTorch figure, and each pair gives one ratio. The report gives, per item,
the median of each side, the median ratio with its min-max over the pairs, and
each side's spread (max / min over its runs), since a shared machine moves whole
runs 2-3x.

The ratios checked are the ones a noisy machine does not move much: the median
flowrun / PyTorch ratio, and flowrun / the sgemm bound and flowrun / the FMA-peak
bound (measured in the same process; median over the runs). Baselines are kept
per machine type (CPU model and ISA) and, within a type, per host class: the same
CPU model can be a whole core on one host and half of one on another (the FMA
peak measured 80 and 190 GFLOP/s on two 2-vCPU AMD EPYC hosts), which moves the
fractions of the FMA bound and the ratios to PyTorch, so a run is checked against
the baseline of its type whose recorded FMA peak is nearest its own, and only
when the two are within --peak-match (1.3x). A drop of more than --tolerance
(10%) below that baseline fails (exit 1); a run with no baseline of its type and
host class is reported as such. --record stores this run's medians as the
baseline of its type and host class: the ratios it measured replace those of the baseline
recorded within --peak-match, whose other ratios stay (a run of some items updates those).
A check that compares none of the baseline's ratios, where the run measured some, fails; a results file with no results is
an error (exit 2), as is an unreadable one.
"""
import argparse
import json
import statistics
import sys


def key_of(d):
    if d["kind"] == "train":
        return f'train {d["model"]} B={d["B"]} T={d["T"]}'
    if d["kind"] == "decode":
        return f'decode {d["model"]} batch={d["batch"]}'
    return d["kind"]


def median(xs):
    return statistics.median(xs) if xs else None


def spread(xs):
    return max(xs) / min(xs) if xs and min(xs) > 0 else None


def machine_type(host):
    """The baseline key: CPU model and ISA (e.g. 'Intel(R) Xeon(R) Processor | avx512')."""
    return f'{host.get("cpu", "unknown CPU")} | {host.get("isa", "unknown ISA")}' if host else "unknown"


def baselines_of(entry):
    """The baselines recorded for one machine type: a list of {"ratios", "machine", ...}
    (an entry written before host classes holds one baseline itself)."""
    if not entry:
        return []
    return entry["baselines"] if "baselines" in entry else [entry]


def nearest_baseline(bases, peak, peak_match):
    """(index, baseline) of the baseline whose recorded FMA peak is nearest peak (GFLOP/s,
    as a ratio) when within peak_match of it; (None, None) if none is. With peak unknown
    (the run has no machine figures) the only baseline is taken, or none if there are several."""
    if peak is None:
        return (0, bases[0]) if len(bases) == 1 else (None, None)
    best, best_i, best_d = None, None, None
    for i, b in enumerate(bases):
        bp = b.get("machine", {}).get("peak_gflops")
        if not bp:
            continue
        d = max(peak / bp, bp / peak)
        if d <= peak_match and (best_d is None or d < best_d):
            best, best_i, best_d = b, i, d
    return best_i, best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("results")
    ap.add_argument("--baseline", default=None)
    ap.add_argument("--record", action="store_true")
    ap.add_argument("--tolerance", type=float, default=0.10)
    ap.add_argument("--peak-match", type=float, default=1.3)
    a = ap.parse_args()

    fl, th = {}, {}  # key -> list of runs, in run order
    machine, ppo, torch_info, host = {}, None, {}, {}
    trl = []  # bench/trl_ppo.py: a PPO iteration in flowrun and in TRL, one line per model
    trl_grpo = []  # bench/trl_grpo.py: a GRPO iteration in flowrun and in TRL's GRPOTrainer, one line per model
    shares = []  # bench/runtime_share.py: the actor runtime's share of a PPO run's CPU samples, one line per model
    if a.record and not a.baseline:
        print("report: --record needs --baseline FILE (the file the median ratios are recorded in)", file=sys.stderr)
        return 2
    try:
        f = open(a.results)
    except OSError as e:
        print(f"report: cannot read {a.results}: {e.strerror} (bench/run_bench.sh writes it: OUT/results.jsonl)",
              file=sys.stderr)
        return 2
    n_lines = 0
    with f:
        for lineno, line in enumerate(f, 1):
            line = line.strip()
            if not line.startswith("{"):
                continue
            try:
                d = json.loads(line)
            except json.JSONDecodeError as e:
                print(f"report: {a.results}:{lineno}: not a JSON line ({e.msg}, column {e.colno}); a run cut "
                      "short leaves one: delete the line or run again", file=sys.stderr)
                return 2
            n_lines += 1
            src = d.get("source", "flowrun")
            if d["kind"] == "machine":
                machine = d
            elif d["kind"] == "host":
                host = d
            elif d["kind"] == "info":
                torch_info = d
            elif d["kind"] == "ppo":
                ppo = d
            elif d["kind"] == "trl_ppo":
                trl.append(d)
            elif d["kind"] == "trl_grpo":
                trl_grpo.append(d)
            elif d["kind"] == "runtime_share":
                shares.append(d)
            else:
                (th if src == "torch" else fl).setdefault(key_of(d), []).append(d)
    if n_lines == 0 or not (fl or th or trl or trl_grpo or shares or ppo or machine):
        print(f"report: {a.results} holds no results (an empty or interrupted run, or --only naming no item)",
              file=sys.stderr)
        return 2

    def summary(k):
        """Medians and spreads of item k: (flowrun runs, torch runs, ratios of the pairs)."""
        f_runs = [d["tok_s"] for d in fl.get(k, [])]
        t_runs = [d["tok_s"] for d in th.get(k, [])]
        pairs = [x / y for x, y in zip(f_runs, t_runs) if y > 0]
        return f_runs, t_runs, pairs

    def ratio_text(pairs):
        if not pairs:
            return "-"
        return f"{median(pairs):.2f}x ({min(pairs):.2f}-{max(pairs):.2f}, {len(pairs)} pairs)"

    def spread_text(xs):
        s = spread(xs)
        return f"{s:.2f}x" if s else "-"

    ratios = {}
    out = []
    out.append(f'Host: {host.get("cpu", "?")}, ISA {host.get("isa", "?")}, {host.get("cores", "?")} cores'
               if host else "Host: not recorded")
    if machine:
        out.append(f'Machine: {machine["threads"]} threads, FMA peak {machine["peak_gflops"]:.0f} GFLOP/s, '
                   f'read bandwidth {machine["read_gbs_1g"]:.1f} GB/s (1 GiB), {machine["read_gbs_64m"]:.1f} GB/s '
                   f'(64 MiB); GEMM: {machine["gemm"]}')
    if torch_info:
        out.append(f'PyTorch {torch_info.get("torch")} ({torch_info.get("blas")}, {torch_info.get("cpu_capability")}), '
                   f'{torch_info.get("threads")} threads')
    out.append("")
    out.append("| training step | flowrun tok/s (median) | PyTorch tok/s (median) | flowrun / PyTorch: median (min-max) "
               "| flowrun spread | PyTorch spread | flowrun / sgemm bound | flowrun / FMA bound |")
    out.append("|---|---|---|---|---|---|---|---|")
    for k, runs in fl.items():
        if runs[0]["kind"] != "train":
            continue
        f_runs, t_runs, pairs = summary(k)
        r_s = median([d["tok_s"] / d["sgemm_bound_tok_s"] for d in runs])
        r_p = median([d["tok_s"] / d["peak_bound_tok_s"] for d in runs])
        if pairs:
            ratios[k + " / torch"] = median(pairs)
        ratios[k + " / sgemm bound"] = r_s
        ratios[k + " / FMA bound"] = r_p
        d0 = runs[0]
        out.append(f'| {d0["model"]} B={d0["B"]} T={d0["T"]} | {median(f_runs):.1f} | '
                   f'{median(t_runs):.1f} | ' if t_runs else f'| {d0["model"]} B={d0["B"]} T={d0["T"]} | '
                   f'{median(f_runs):.1f} | - | ')
        out[-1] += f'{ratio_text(pairs)} | {spread_text(f_runs)} | {spread_text(t_runs)} | {r_s:.2f} | {r_p:.2f} |'
    out.append("")
    out.append("| decode (greedy, KV cache) | batch | flowrun tok/s (median) | PyTorch tok/s (median) "
               "| flowrun / PyTorch: median (min-max) | flowrun spread | PyTorch spread |")
    out.append("|---|---|---|---|---|---|---|")
    for k, runs in fl.items():
        if runs[0]["kind"] != "decode":
            continue
        f_runs, t_runs, pairs = summary(k)
        if pairs:
            ratios[k + " / torch"] = median(pairs)
        out.append(f'| {runs[0]["model"]} | {runs[0]["batch"]} | {median(f_runs):.0f} | ' +
                   (f'{median(t_runs):.0f} | ' if t_runs else "- | ") +
                   f'{ratio_text(pairs)} | {spread_text(f_runs)} | {spread_text(t_runs)} |')
    if ppo:
        out.append("")
        out.append(f'PPO iteration (stories260K, {ppo["iterations"]} iterations, runtime metrics): '
                   f'{ppo["seconds_per_iteration"]:.3f} s per iteration')
        out.append("")
        out.append("Nodes run side by side (the scorers, the trainers), so the shares of the wall time can add up "
                   "to more than 100%.")
        out.append("")
        out.append("| phase | s per iteration | share of the wall time |")
        out.append("|---|---|---|")
        for name, s in ppo["phases"].items():
            if s is None:
                out.append(f'| {name} | unknown: the busy times add up to '
                           f'{100 * ppo.get("busy_over_wall", 0):.0f}% of the wall time (nodes overlapped) | |')
            else:
                out.append(f'| {name} | {s:.4f} | {100 * s / ppo["seconds_per_iteration"]:.1f}% |')
    if shares:
        out.append("")
        out.append("| PPO run under perf (bench/runtime_share.py) | CPU samples | actor runtime | OpenMP waiting | "
                   "node code | kernels |")
        out.append("|---|---|---|---|---|---|")
        for d in shares:
            sh, steady = d["share"], d["samples"] * (1 - d["share"].get("start-up", 0))
            pct = lambda k: f'{100 * sh.get(k, 0) * d["samples"] / steady:.2f}%' if steady else "-"
            out.append(f'| {d.get("label", "graphs/ppo.graph")} | {d["samples"]} | {pct("actor runtime")} | '
                       f'{pct("openmp")} | {pct("node code")} | {pct("kernels")} |')
        out.append("(shares of the samples outside start-up)")
    if trl:
        out.append("")
        out.append("| PPO iteration vs TRL's PPOTrainer (bench/trl_ppo.py) | flowrun samples/s (median) | "
                   "TRL samples/s (median) | flowrun / TRL: median (min-max) | answer length (flowrun; TRL 32) |")
        out.append("|---|---|---|---|---|")
        for d in trl:
            bf16 = d.get("dtype", "fp32") == "bf16"  # a separate measure: both sides in bf16 (--dtype bf16)
            ratios[f'ppo {d["model"]}{" bf16" if bf16 else ""} / trl'] = d["ratio_median"]
            out.append(f'| {d["model"]}{", bf16 on both" if bf16 else ""}, {d["batch"]} prompts x {d["prompt_len"]} + {d["answer_len"]} tokens, '
                       f'trl {d["trl_version"]} | {d["flowrun_samples_per_s_median"]:.2f} | '
                       f'{d["trl_samples_per_s_median"]:.2f} | {d["ratio_median"]:.2f}x ({d["ratio_min"]:.2f}-'
                       f'{d["ratio_max"]:.2f}, {d["pairs"]} pairs) | {d["flowrun_answer_len_mean"]:.1f} |')
    if trl_grpo:
        out.append("")
        out.append("| GRPO iteration vs TRL's GRPOTrainer (bench/trl_grpo.py) | flowrun samples/s (median) | "
                   "TRL samples/s (median) | flowrun / TRL: median (min-max) | answer length (flowrun; TRL) |")
        out.append("|---|---|---|---|---|")
        for d in trl_grpo:
            bf16 = d.get("dtype", "fp32") == "bf16"
            ratios[f'grpo {d["model"]}{" bf16" if bf16 else ""} / trl'] = d["ratio_median"]
            out.append(f'| {d["model"]}{", bf16 on both" if bf16 else ""}, {d["prompts"]} prompts x {d["num_generations"]} answers, '
                       f'{d["prompt_len"]} + {d["answer_len"]} tokens, trl {d["trl_version"]} | '
                       f'{d["flowrun_samples_per_s_median"]:.2f} | {d["trl_samples_per_s_median"]:.2f} | '
                       f'{d["ratio_median"]:.2f}x ({d["ratio_min"]:.2f}-{d["ratio_max"]:.2f}, {d["pairs"]} pairs) | '
                       f'{d["flowrun_answer_len_mean"]:.1f}; {d["trl_answer_len_mean"]:.1f} |')
    # the goals of the CPU-performance issue (#19), as measured in this run: median ratios
    goals = []
    for d in trl:
        goal = {"stories260K": 8, "llama6m": 4}.get(d["model"])
        if goal:  # the goal is measured in fp32; a bf16 run (both sides) is shown beside it, so named
            both_bf16 = ", both sides in bf16 (the goal's measure is fp32)" if d.get("dtype") == "bf16" else ""
            goals.append((f'PPO iteration, {d["model"]} >= {goal}x TRL\'s samples/s (median){both_bf16}',
                          f'{d["ratio_median"]:.2f}x', d["ratio_median"] >= goal))
    k = "train gpt2_124m B=4 T=64"
    f_runs, t_runs, pairs = summary(k)
    if pairs:
        goals.append(("GPT-2 124M B=4 T=64 training >= 1.5x PyTorch (median)", f"{median(pairs):.2f}x",
                      median(pairs) >= 1.5))
        fs, ts = spread(f_runs), spread(t_runs)
        goals.append(("... flowrun's spread no wider than PyTorch's", f"{fs:.2f}x vs {ts:.2f}x", fs <= ts))
    k = "train gpt2_124m B=8 T=256"
    f_runs, t_runs, pairs = summary(k)
    if pairs:
        goals.append(("GPT-2 124M B=8 T=256 training >= 1.2x PyTorch (median)", f"{median(pairs):.2f}x",
                      median(pairs) >= 1.2))
    if fl.get(k):
        rp = median([d["tok_s"] / d["peak_bound_tok_s"] for d in fl[k]])
        goals.append(("... >= 50% of the FMA bound", f"{100 * rp:.0f}%", rp >= 0.5))
    _, _, pairs = summary("decode stories15m batch=1")
    if pairs:
        goals.append(("stories15M-shape decode, batch 1 >= 2.5x PyTorch (median)", f"{median(pairs):.2f}x",
                      median(pairs) >= 2.5))
    d1, d16 = fl.get("decode stories15m batch=1"), fl.get("decode stories15m batch=16")
    if d1 and d16:
        r = median([x["tok_s"] for x in d16]) / median([x["tok_s"] for x in d1])
        goals.append(("stories15M decode, batch 16 >= 5x its own batch 1", f"{r:.2f}x", r >= 5))
    measured = [d for d in shares if d.get("runtime_share_steady") is not None]
    if measured:  # perf's samples: the runtime's own frames, however the nodes overlap
        worst = max(d["runtime_share_steady"] for d in measured)
        goals.append(("PPO iteration: actor-runtime overhead < 2% (CPU samples, bench/runtime_share.py)",
                      ", ".join(f'{100 * d["runtime_share_steady"]:.2f}% ({d.get("label", "graphs/ppo.graph")})'
                                for d in measured), worst < 0.02))
    elif ppo and ppo.get("runtime_overhead_share") is not None:
        goals.append(("PPO iteration: actor-runtime overhead < 2%", f'{100 * ppo["runtime_overhead_share"]:.2f}%',
                      ppo["runtime_overhead_share"] < 0.02))
    elif ppo:
        goals.append(("PPO iteration: actor-runtime overhead < 2%", "not measurable by subtraction here (busy "
                      f'times {100 * ppo.get("busy_over_wall", 0):.0f}% of the wall time)', None))
    if goals:
        out.append("")
        out.append("| goal | this run | met |")
        out.append("|---|---|---|")
        for name, val, ok in goals:
            out.append(f"| {name} | {val} | {'unknown' if ok is None else 'yes' if ok else 'no'} |")
    print("\n".join(out))

    ratios = {k: v for k, v in ratios.items() if v is not None}
    mtype = machine_type(host)
    status = 0
    book = {}
    if a.baseline:
        try:
            with open(a.baseline) as f:
                book = json.load(f)
        except FileNotFoundError:
            book = {}
        except json.JSONDecodeError as e:
            print(f"report: {a.baseline}:{e.lineno}: not JSON ({e.msg}); restore it with git checkout {a.baseline}",
                  file=sys.stderr)
            return 2
    machines = book.get("machines", {})
    bases = baselines_of(machines.get(mtype))
    peak = machine.get("peak_gflops")
    peak_text = f"{peak:.0f} GFLOP/s" if peak else "not measured in this run"
    recorded = ", ".join(f'{b.get("machine", {}).get("peak_gflops", 0):.0f}' for b in bases) or "none"
    idx, chosen = nearest_baseline(bases, peak, a.peak_match)
    if a.baseline and not a.record:
        if not bases:
            old = host.get("isa") in ("sse4", "avx2", "avx2-nofma", "avx512") and "(family " not in host.get("cpu", "")
            print(f"\nregression check: no baseline for this machine type ({mtype}) in {a.baseline}; "
                  f"known: {', '.join(machines) or 'none'} (run with --record to make one)" +
                  ("; this results file's host line has no CPU family and model: it predates bench/host.py, "
                   "whose machine types the baselines use" if old else ""))
        elif chosen is None:
            slower = peak and all(b.get("machine", {}).get("peak_gflops", 0) > peak for b in bases)
            print(f"\nregression check: no baseline of {mtype} for a host of this FMA peak ({peak_text}; "
                  f"recorded for peaks of {recorded} GFLOP/s, matched within {a.peak_match}x): not checked. " +
                  ("The peak is below every recorded one: a loaded host (another job running) reads like this; "
                   "run again on a quiet one. A slower host class of this CPU gets a baseline of its own with --record."
                   if slower else "A host class of its own: run with --record to add one."))
        else:
            base = chosen["ratios"]
            compared = sum(k in ratios for k in base)
            drops = []
            for k, b in base.items():
                if k in ratios and ratios[k] < (1 - a.tolerance) * b:
                    drops.append(f"  {k}: {ratios[k]:.3f} < {b:.3f} - {100 * a.tolerance:.0f}%")
            bp = chosen.get("machine", {}).get("peak_gflops")
            against = f"the baseline of {mtype}" + (f" recorded at an FMA peak of {bp:.0f} GFLOP/s (this run: {peak_text})" if bp else "")
            if not ratios:
                print("\nregression check: this run measured no ratio (its items give none, as machine alone): "
                      "not checked")
            elif compared == 0:
                print(f"\nregression check FAILED: this run measured none of the {len(base)} median ratios of "
                      f"{against} (its items: {', '.join(sorted(ratios)) or 'none'}); keep at least one of "
                      f"{', '.join(sorted(base))}")
                status = 1
            elif drops:
                print("\nregression check FAILED (a median ratio dropped more than "
                      f"{100 * a.tolerance:.0f}% below {against}):\n" + "\n".join(drops))
                status = 1
            else:
                print(f"\nregression check: ok ({compared} median ratios within "
                      f"{100 * a.tolerance:.0f}% of {against}, or above)")
    if a.record and a.baseline:
        if not peak:
            print("\nnot recorded: this run has no machine figures (the FMA peak picks the host class; "
                  "keep machine in --only)")
            return 1
        if not ratios:
            print("\nnot recorded: this run measured no median ratio (nothing to record)")
            return 1
        # a run of some items (--only, --no-torch, no --trl) updates those and keeps the baseline's others
        kept = {k: v for k, v in (chosen or {}).get("ratios", {}).items() if k not in ratios}
        entry = {"ratios": {**kept, **ratios}, "machine": machine, "torch": torch_info or (chosen or {}).get("torch", {}),
                 "host": host}
        if idx is None:
            bases.append(entry)
        else:
            bases[idx] = entry
        machines[mtype] = {"baselines": bases}
        with open(a.baseline, "w") as f:
            json.dump({"machines": machines}, f, indent=1, sort_keys=True)
            f.write("\n")
        print(f"\nrecorded {len(ratios)} median ratios in {a.baseline} for {mtype} at an FMA peak of {peak_text}" +
              (f"; kept {len(kept)} of the baseline's that this run did not measure ({', '.join(sorted(kept))})"
               if kept else ""))
    return status


if __name__ == "__main__":
    sys.exit(main())
