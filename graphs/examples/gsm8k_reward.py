#!/usr/bin/env python3
"""A user's own reward for the reward_function node (reward = "command"): GSM8K exact match
written as a plain Python function, behind the JSON-lines loop the node speaks.

    [node.reward]
    kind = "reward_function"
    reward = "command"
    command = "python3 graphs/examples/gsm8k_reward.py [--format_score X]"

Each input line is {"prompt", "completion", "reference", "iteration", "row"}; each output line
is one number. It scores like the built-in reward = "gsm8k" with the same format_score (the
last "#### N" of the completion that has a number against the reference's, numbers compared after removing
thousands separators and a zero decimal part), so a run with either gives the same rewards
(tests/grpo_small.sh).
"""
import argparse
import json
import re
import sys

def normalize(text):
    """'1,080' -> '1080', '42.0' -> '42', '$18' -> '18', '-0' -> '0'; None if not a number."""
    m = re.fullmatch(r"([-+]?)\$?([0-9]+(?:,[0-9]+)*)(?:\.([0-9]*))?", text.strip())
    if not m:
        return None
    sign, whole, frac = m.groups()
    whole = whole.replace(",", "").lstrip("0") or "0"
    frac = (frac or "").rstrip("0")
    out = whole + ("." + frac if frac else "")
    return "-" + out if sign == "-" and out != "0" else out


NUMBER = re.compile(r"[-+]?\$?[0-9]+(?:,[0-9]+)*(?:\.[0-9]*)?")  # ASCII digits only, as the built-in rule


def final_answer(text):
    """The number after the last '####' that has one, or None ('1.5.2': the raw text, matching nothing)."""
    at = len(text)
    while (at := text.rfind("####", 0, at + 3)) >= 0:
        rest = text[at + 4:].lstrip(" \t")
        m = NUMBER.match(rest)
        if m:
            end = m.end()
            if re.match(r"\.[0-9]", rest[end:]):
                run = re.match(r"[0-9.,]*", rest[end:]).group(0)
                return rest[:end] + run
            norm = normalize(m.group(0))
            if norm is not None:
                return norm
        if at == 0:
            return None
    return None


def gsm8k_reward(completion, reference, format_score=0.0):
    """1 for the right final answer, format_score for a well-formed wrong one, else 0."""
    want = final_answer(reference) if "####" in reference else normalize(reference)
    got = final_answer(completion)
    if got is None:
        return 0.0
    return 1.0 if got == want else format_score


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--format_score", type=float, default=0.0)
    args = ap.parse_args()
    for line in sys.stdin:
        sample = json.loads(line)
        print(gsm8k_reward(sample["completion"], sample["reference"], args.format_score), flush=True)


if __name__ == "__main__":  # imported (to reuse gsm8k_reward), it reads nothing
    main()
