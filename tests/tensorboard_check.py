#!/usr/bin/env python3
"""Reads a run's TensorBoard event files back with the tensorboard package (PyPI) and checks
that they hold the values of the run's printed lines (tests/tensorboard_small.sh).

    python tensorboard_check.py [--resumed] LOG TB_DIR

LOG is the run's standard output; TB_DIR the nodes' tensorboard_path. For each node (sft, rm,
ppo_controller) there must be exactly one file events.out.tfevents.* in TB_DIR/NODE whose first
record is the file_version event; every printed step must have its scalars, at that step, equal
to the printed numbers within the printed precision (TensorBoard keeps float32: its rounding is
allowed too), and no step may be there that was not printed, nor any twice. Exits 1 naming what
differs.

--resumed: TB_DIR/ppo_controller holds an interrupted run's file and its resumed run's, whose
second record is SessionLog START at the first step it wrote; LOG holds both runs' lines (a step
printed twice counts with its last line). Only ppo_controller is checked.
"""
import math
import os
import re
import sys
import time

from tensorboard.backend.event_processing import event_accumulator, event_file_loader

args = sys.argv[1:]
resumed = "--resumed" in args
if resumed:
    args.remove("--resumed")
log_path, tb_dir = args[0], args[1]
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
    want = 2 if resumed else 1
    if len(files) != want:
        failures.append(f"{d}: {len(files)} event files, want {want} ({files})")
        return None
    files.sort()  # TensorBoard's order: by name, whose first part is the time of opening
    for f in files:
        first = next(iter(event_file_loader.EventFileLoader(os.path.join(d, f)).Load()))
        if first.file_version != "brain.Event:2":
            failures.append(f"{d}/{f}: first record is not the file_version event: {first}")
    if resumed:
        events = list(event_file_loader.EventFileLoader(os.path.join(d, files[1])).Load())
        if len(events) < 3 or not events[1].HasField("session_log") or events[1].session_log.status != 1 or \
                events[1].step != events[2].step:
            failures.append(f"{d}/{files[1]}: the second record is not SessionLog START at the first step: "
                            f"{events[1:3]}")
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
        if sorted(steps) != sorted(printed):  # each printed step once (a resumed run's purged)
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
if not resumed:
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


def check_held_out(node, tags, before, after):
    """The held-out values (held_out/NAME, reported without a step): the printed "before" figure at step 0 and
    the "after" one at the node's last step written (`after` is None: that pass printed no such figure)."""
    global checked
    acc = load(node)
    if acc is None:
        return
    have = set(acc.Tags()["scalars"])
    steps = {e.step for tag in have if not tag.startswith("held_out/") for e in acc.Scalars(tag)}
    last = max(steps) if steps else 0
    for tag, b, a in zip(tags, before, after):
        if tag not in have:
            failures.append(f"{node}: no scalar {tag!r} (it has {sorted(have)})")
            continue
        got = sorted((e.step, e.value) for e in acc.Scalars(tag))
        want = [(0, b)] + ([(last, a)] if a is not None else [])
        if len(got) != len(want) or any(gs != ws or abs(gv - float(wv)) > tolerance(wv) + 1e-6 * abs(float(wv))
                                        for (gs, gv), (ws, wv) in zip(got, want)):
            failures.append(f"{node}/{tag}: {got}, printed {want}")
        checked += len(want)


if not resumed:
    log = "\n".join(lines)
    # (node, before pattern, after pattern, tags, the before groups, the after groups)
    for node, b_pat, a_pat, tags, b_at, a_at in [
            ("sft", rf"\[step 1 sft\] .* held-out loss {num} \(ppl {num}\) before",
             rf"\[step 1 sft\] held-out loss {num} -> {num} \(ppl {num} -> {num}\)",
             ["held_out/loss", "held_out/perplexity"], [1, 2], [2, 4]),
            ("ppo_controller", rf"\[step 3 ppo\] held-out before: mean reward {num} ± {num}, KL to reference {num}",
             rf"\[step 3 ppo\] held-out after: mean reward {num} ± {num}, KL to reference {num}",
             ["held_out/reward", "held_out/kl"], [1, 3], [1, 3])]:
        m0, m1 = re.search(b_pat, log), re.search(a_pat, log)
        if m0 and m1:
            check_held_out(node, tags, [m0[i] for i in b_at], [m1[i] for i in a_at])
        else:
            failures.append(f"{node}: the held-out lines were not printed")

if failures:
    print("tensorboard_check: FAILED\n  " + "\n  ".join(failures))
    sys.exit(1)
print(f"tensorboard_check: {checked} printed values found in the event files")
