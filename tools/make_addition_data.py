#!/usr/bin/env python3
"""Writes the addition task of graphs/grpo.graph and graphs/rloo.graph: a verifiable task
(GSM8K's answer format in miniature) that a 260K-parameter LLaMA learns on 2 CPU cores.

Each line is a DeepSpeed-Chat prompt/chosen row:
    {"prompt": "23+58=", "chosen": " #### 81"}
The reward_function node's gsm8k rule scores an answer 1 when its last "#### N" is the sum.
Pairs (a, b) with 0 <= a, b < 10**digits are drawn without replacement, so every problem
appears once in the file: the loaders' held-out carve never shares a problem with training.
The seed fixes the file; Python's standard library only.

    python3 tools/make_addition_data.py --out out/grpo/addition.jsonl [--seed 1234] [--count 6000]
"""
import argparse
import json
import os
import random
import sys


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="the JSONL file to write (its folder is created)")
    ap.add_argument("--seed", type=int, default=1234, help="fixes the problems and their order")
    ap.add_argument("--count", type=int, default=6000, help="problems to write")
    ap.add_argument("--digits", type=int, default=2, help="operands are below 10**digits")
    args = ap.parse_args()
    space = (10 ** args.digits) ** 2
    if not 0 < args.count <= space:
        print(f"make_addition_data: --count must be in 1..{space} for --digits {args.digits}", file=sys.stderr)
        return 2
    rng = random.Random(args.seed)
    n = 10 ** args.digits
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    tmp = args.out + ".tmp"
    with open(tmp, "w") as f:
        for k in rng.sample(range(space), args.count):
            a, b = divmod(k, n)
            f.write(json.dumps({"prompt": f"{a}+{b}=", "chosen": f" #### {a + b}"}) + "\n")
    os.replace(tmp, args.out)  # whole or not at all
    print(f"wrote {args.count} problems to {args.out} (seed {args.seed})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
