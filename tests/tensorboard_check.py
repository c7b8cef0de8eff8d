#!/usr/bin/env python3
"""Reads a run's TensorBoard event files back with the tensorboard package (PyPI) and checks
that they hold the values of the run's printed lines (tests/tensorboard_small.sh).

    python tensorboard_check.py LOG TB_DIR

LOG is the run's standard output; TB_DIR the nodes' tensorboard_path. For each node (sft, rm,
ppo_controller) there must be exactly one file events.out.tfevents.* in TB_DIR/NODE whose first
record is the file_version event; every printed step must have its scalars, at that step, equal
to the printed numbers within the printed precision (TensorBoard keeps float32: its rounding is
allowed too), and no step may be there that was not printed. Exits 1 naming what differs.
"""
import math
import os
import re
import sys
import time

from tensorboard.backend.event_processing import event_accumulator, event_file_loader

log_path, tb_dir = sys.argv[1], sys.argv[2]
lines = open(log_path, encoding="utf-8").read().splitlines()
failures = []
checked = 0


def tolerance(text):
    """Half a unit in the last printed digit of `text` ("0.6931" -> 5e-5, "1.00e-03" -> 5e-6)."""
    if "e" in text:
        mant, exp = text.split("e")
        digits = len(mant.split(".")[1]) if "." in mant else 0
        return 0.5 * 10.0 ** (int(exp) - digits)
    digits = len(text.split(".")[1]) if "." in text else 0
    return 0.5 * 10.0 ** (-digits)


def load(node):
    d = os.path.join(tb_dir, node)
    files = [f for f in os.listdir(d) if f.startswith("events.out.tfevents.")] if os.path.isdir(d) else []
    if len(files) != 1:
        failures.append(f"{d}: {len(files)} event files, want 1 ({files})")
        return None
    first = next(iter(event_file_loader.EventFileLoader(os.path.join(d, files[0])).Load()))
    if first.file_version != "brain.Event:2":
        failures.append(f"{d}/{files[0]}: first record is not the file_version event: {first}")
    acc = event_accumulator.EventAccumulator(d, size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    return acc


def check(node, pattern, tags):
    """`pattern` captures the step, then one group per tag in `tags` (None: not in TensorBoard)."""
    global checked
    acc = load(node)
    if acc is None:
        return
    printed = {}
    for line in lines:
        m = re.search(pattern, line)
        if m:
            printed[int(m.group(1))] = m.groups()[1:]
    if not printed:
        failures.append(f"{node}: no printed line matches {pattern!r}")
        return
    have = set(acc.Tags()["scalars"])
    now = time.time()
    for i, tag in enumerate(tags):
        if tag is None:
            continue
        if tag not in have:
            failures.append(f"{node}: no scalar {tag!r} (it has {sorted(have)})")
            continue
        events = acc.Scalars(tag)
        steps = [e.step for e in events]
        if sorted(steps) != sorted(printed):
            failures.append(f"{node}/{tag}: steps {steps}, printed steps {sorted(printed)}")
        for e in events:
            if not (now - 3600 < e.wall_time <= now + 1):
                failures.append(f"{node}/{tag} step {e.step}: wall_time {e.wall_time} is not of this run")
            if e.step not in printed:
                continue
            text = printed[e.step][i]
            want = float(text)
            tol = tolerance(text) + 1e-6 * abs(want) + 1e-12  # the print's rounding + float32's
            if not math.isfinite(e.value) or abs(e.value - want) > tol:
                failures.append(f"{node}/{tag} step {e.step}: TensorBoard {e.value!r}, printed {text}")
            checked += 1
    return acc


num = r"(-?[0-9.]+(?:e[-+][0-9]+)?)"
check("sft", rf"\[step 1 sft\] step (\d+)/\d+ loss {num} lr {num} \({num} tokens/s\)",
      ["loss", "lr", "tokens_per_s"])
check("rm", rf"\[step 2 rm\] step (\d+)/\d+ loss {num} acc {num} chosen {num} rejected {num}",
      ["loss", "accuracy", "chosen_mean", "rejected_mean"])
ppo = check("ppo_controller",
            rf"\[step 3 ppo\] iter (\d+) reward {num} kl {num} actor_loss {num} critic_loss {num} .*answer_len {num} "
            rf"gen {num} tok/s train {num} tok/s",
            ["reward", "kl", "actor_loss", "critic_loss", "answer_len", "generation_tokens_per_s",
             "training_tokens_per_s"])
if ppo is not None:  # per-phase times: one per training iteration, none for the held-out passes
    iters = sorted(e.step for e in ppo.Scalars("reward"))
    for tag in ["phase_seconds/generate", "phase_seconds/score_and_experience", "phase_seconds/train",
                "phase_seconds/report"]:
        if tag not in ppo.Tags()["scalars"]:
            failures.append(f"ppo_controller: no scalar {tag!r}")
            continue
        ev = ppo.Scalars(tag)
        if sorted(e.step for e in ev) != iters or any(not (0 <= e.value < 3600) for e in ev):
            failures.append(f"ppo_controller/{tag}: {[(e.step, e.value) for e in ev]}, iterations {iters}")

if failures:
    print("tensorboard_check: FAILED\n  " + "\n  ".join(failures))
    sys.exit(1)
print(f"tensorboard_check: {checked} printed values found in the event files")
