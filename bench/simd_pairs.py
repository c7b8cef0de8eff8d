#!/usr/bin/env python3
"""Interleaved A B A B ... runs of bench_core, per-kernel medians and ratios.

    bench/simd_pairs.py --rounds 5 --label AVX3 "build/bin/bench_core --only kernels --simd AVX3" \
                                   --label AVX2 "build/bin/bench_core --only kernels --simd AVX2"

Each round runs every command once, in the order given (so noise that lasts
longer than a round hits every configuration alike). From each run it reads the
ms column of the markdown tables bench_core prints: `--only kernels`
(| kernel | shape | ms |) and `--profile` (| op | calls | ms | share |). It
prints, per kernel, each configuration's median ms with its min-max, and the
ratio of the first configuration's time to each other's, per round, as median
(min-max): a ratio above 1 means the other configuration is faster.
"""
import argparse
import re
import shlex
import statistics
import subprocess
import sys

ROW = re.compile(r"^\|\s*([A-Za-z_][\w .()/-]*?)\s*\|(.*)\|\s*$")


def parse(text):
    """kernel/op name -> ms, from bench_core's kernels table or --profile table."""
    out = {}
    for line in text.splitlines():
        m = ROW.match(line)
        if not m:
            continue
        cells = [c.strip() for c in m.group(2).split("|")]
        name = m.group(1)
        try:
            if len(cells) == 2:  # | kernel | shape | ms |
                out[name] = float(cells[1])
            elif len(cells) == 3 and cells[2].endswith("%") and cells[0]:  # | op | calls | ms | share |
                out[name] = float(cells[1])
        except ValueError:
            pass
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--label", nargs=2, action="append", metavar=("NAME", "COMMAND"), required=True)
    a = ap.parse_args()
    if len(a.label) < 2:
        sys.exit("simd_pairs: give at least two --label NAME COMMAND")
    runs = {name: [] for name, _ in a.label}
    for r in range(a.rounds):
        for name, cmd in a.label:
            p = subprocess.run(shlex.split(cmd), capture_output=True, text=True)
            if p.returncode != 0:
                sys.exit(f"simd_pairs: '{cmd}' failed ({p.returncode}): {p.stderr.strip()[-400:]}")
            runs[name].append(parse(p.stdout))
            head = next((l for l in p.stdout.splitlines() if l.startswith("GEMM:")), "")
            print(f"round {r + 1} {name}: {head}", file=sys.stderr)
    names = [n for n, _ in a.label]
    base = names[0]
    kernels = [k for k in runs[base][0] if all(k in run for n in names for run in runs[n])]
    fmt = lambda xs: f"{statistics.median(xs):.2f} ({min(xs):.2f}-{max(xs):.2f})"
    print("| kernel | " + " | ".join(f"{n} ms" for n in names) + " | " +
          " | ".join(f"{base}/{n}" for n in names[1:]) + " |")
    print("|---" * (2 * len(names)) + "|")
    for k in kernels:
        cells = [fmt([run[k] for run in runs[n]]) for n in names]
        ratios = [fmt([b[k] / o[k] for b, o in zip(runs[base], runs[n]) if o[k] > 0]) for n in names[1:]]
        print(f"| {k} | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")


if __name__ == "__main__":
    main()
