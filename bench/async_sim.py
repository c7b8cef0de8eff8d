#!/usr/bin/env python3
"""Expected speedup of max_staleness S = 1, 2 over S = 0 on a GPU cluster, from measured phase times (issue 21).

  python3 bench/async_sim.py [--profile PROFILE.json] [--gpus 8,64] [--iterations 200]
                             [--gen-serial 0.10] [--score-serial 0.02] [--train-serial 0.05]
                             [--sync-share 0.03] [--pause-share 0.005]

What it does: simulates the controller's schedule (actors/ppo_controller.cpp) event by event for
`iterations` batches and prints samples/s relative to S = 0, for each GPU count, as a markdown table.

Input: one iteration's phase times at S = 0 as measured by bench/async_staleness.py --profile
(its JSON: generate, score, train, report seconds per iteration, measured on one core per node).
Without --profile the numbers of docs/scaling.md's measurement are used.

Model (every assumption is a flag):
 1. The work of each phase keeps the measured ratio on GPUs: generation G, scoring (reference,
    reward, critic values, the policy's old log-probs) C, training (policy and critic) T, the
    controller's report R, in seconds on one device.
 2. A phase spread over n devices takes t(n) = t(1) * (f + (1 - f) / n) (Amdahl): f is the part
    that does not shrink with more devices. For generation that is the longest answer's decode
    (the tail: devices that finished their share wait for it), for training the gradient all-reduce
    and the optimizer's step, for scoring the same as training's forward. Defaults: f_gen 0.10,
    f_score 0.02, f_train 0.05.
 3. S = 0 (DS-Chat's hybrid engine): every phase runs on all N devices in turn; the generator
    reads the trainer's weights in place (no copy). One iteration: G(N) + C(N) + T(N) (the
    controller's report, under 1% of an iteration here, is left out).
 4. S >= 1: N = N_gen + N_train devices, generation on N_gen, scoring and training on N_train
    (veRL's one-step-off placement, AReaL's split); every split is tried and the best kept. After
    each update the weights go to the generator devices, taking sync_share of one S = 0
    iteration on the N devices (default 0.03: 14 GB of a 7B model in bf16 at ~100 GB/s is ~0.15 s
    beside steps of several seconds), overlapped with generation (double buffer), and the
    generator pauses pause_share of an S = 0 iteration between batches to take them up. The
    schedule is the controller's: batch k + 1 is asked for when batch k is sent to the generator
    (so generating k + 1 overlaps scoring and training k), at most S + 1 batches between the start
    of their generation and the end of their training, the generator takes the
    weights the batch was stamped with (`wait`); scoring and training share the training devices
    in arrival order.
Result = samples/s at S over samples/s at S = 0 on the same N devices (steady state: the first
10 batches dropped).
"""
import argparse
import json
import sys

# docs/scaling.md, "Asynchronous RLHF on a GPU cluster": ppo.graph at S = 0, one thread per node
# (bench/async_staleness.py --profile, AMD EPYC AVX2, 2 cores, loaded; 2026-12-02), seconds per iteration
MEASURED = {"graph": "ppo", "generate": 0.079, "score": 0.218, "train": 0.367, "report": 0.0,
            "source": "built-in: docs/scaling.md's measurement"}


def amdahl(t1, f, n):
    """Seconds of a phase of t1 seconds on one device spread over n devices with serial fraction f."""
    return t1 * (f + (1.0 - f) / n)


def simulate(S, G, C, T, R, sync_s, latency_s, iterations):
    """Seconds per batch in steady state of the controller's schedule with max_staleness S >= 1.

    G: generation of one batch on the generator devices; C, T: scoring and training of one batch on
    the training devices; R: the controller's report; sync_s: one weight transfer (overlapped);
    latency_s: the generator's pause to take new weights between batches.
    """
    gen_free = 0.0      # when the generator devices are next free
    train_free = 0.0    # when the training devices are next free (after the last training)
    launched = {}       # batch -> when it was sent to the generator
    summary = {}        # batch -> when its experience was made
    trained = {}        # batch -> when its update was reported
    weights_at = {0: 0.0}  # version -> when the generator has it
    launch = 0.0
    for k in range(iterations):
        if k > 0:
            # asked for once batch k-1 is sent to the generator, at most S+1 batches in flight
            launch = launched[k - 1]
            if k - (S + 1) >= 0:
                launch = max(launch, trained[k - (S + 1)] + R)
        launched[k] = launch
        # the stamp: updates reported at launch; the generator waits for those weights
        version = sum(1 for j in trained if trained[j] + R <= launch)
        start = max(gen_free, launch, weights_at.get(version, launch)) + latency_s
        gen_done = start + G
        gen_free = gen_done
        # scoring on the training devices, in arrival order: after batch k-1's training
        summary[k] = max(gen_done, train_free) + C
        trained[k] = summary[k] + T  # training follows its own scoring on the same devices
        train_free = trained[k]
        weights_at[k + 1] = trained[k] + sync_s
    warm = min(10, iterations // 4)
    return (trained[iterations - 1] - trained[warm]) / (iterations - 1 - warm)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--profile", help="bench/async_staleness.py --profile output (JSON lines; the S = 0 entry is used)")
    ap.add_argument("--graph", default="ppo", help="which graph's profile to use")
    ap.add_argument("--gpus", default="8,64")
    ap.add_argument("--iterations", type=int, default=200)
    ap.add_argument("--gen-serial", type=float, default=0.10)
    ap.add_argument("--score-serial", type=float, default=0.02)
    ap.add_argument("--train-serial", type=float, default=0.05)
    ap.add_argument("--sync-share", type=float, default=0.03,
                    help="one weight transfer to the generator devices, as a share of an S = 0 iteration")
    ap.add_argument("--pause-share", type=float, default=0.005,
                    help="the generator's pause to take new weights, as a share of an S = 0 iteration")
    a = ap.parse_args()

    m = dict(MEASURED)
    if a.profile:
        with open(a.profile) as f:
            rows = [json.loads(x) for x in f if x.strip().startswith("{")]
        rows = [r for r in rows if r.get("kind") == "profile" and r.get("graph") == a.graph and r.get("S") == 0]
        if not rows:
            sys.exit(f"async_sim: {a.profile} has no profile line of graph {a.graph} at S = 0 "
                     "(run bench/async_staleness.py --profile)")
        p = rows[0]["phase_seconds"]
        m = {"graph": a.graph, "generate": p["generate"], "score": p["score"], "train": p["train"],
             "report": p.get("report", 0.0), "source": a.profile}
    G1, C1, T1 = m["generate"], m["score"], m["train"]
    total = G1 + C1 + T1
    # the measured times are per iteration on this machine; the cluster's are in the same ratio,
    # scaled so that one iteration's work on one device is 1 unit (the speedup is a ratio). The
    # controller's own time (report, well under 1% here) is left out on both sides.
    G1, C1, T1, R = G1 / total, C1 / total, T1 / total, 0.0
    print(f"phase shares of one S = 0 iteration ({m['source']}, graph {m['graph']}): generation {G1:.2f}, "
          f"scoring {C1:.2f}, training {T1:.2f}")
    print(f"serial fractions: generation {a.gen_serial}, scoring {a.score_serial}, training {a.train_serial}; "
          f"weight transfer {a.sync_share} and generator pause {a.pause_share} of an S = 0 iteration\n")
    print("| GPUs | S | generator / trainer GPUs | s per batch (1 = one iteration on one GPU) | speedup vs S = 0 |")
    print("|---|---|---|---|---|")
    out = []
    for N in [int(x) for x in a.gpus.split(",")]:
        sync0 = amdahl(G1, a.gen_serial, N) + amdahl(C1, a.score_serial, N) + amdahl(T1, a.train_serial, N) + R
        print(f"| {N} | 0 | {N} colocated | {sync0:.4f} | 1.00x |")
        sync_s, lat = a.sync_share * sync0, a.pause_share * sync0
        for S in (1, 2):
            best = None
            for ng in range(1, N):
                t = simulate(S, amdahl(G1, a.gen_serial, ng), amdahl(C1, a.score_serial, N - ng),
                             amdahl(T1, a.train_serial, N - ng), R, sync_s, lat, a.iterations)
                if best is None or t < best[0]:
                    best = (t, ng)
            print(f"| {N} | {S} | {best[1]} / {N - best[1]} | {best[0]:.4f} | {sync0 / best[0]:.2f}x |")
            out.append({"kind": "async_sim", "gpus": N, "S": S, "gen_gpus": best[1], "speedup": sync0 / best[0]})
    for d in out:
        print(json.dumps(d), file=sys.stderr)


if __name__ == "__main__":
    main()
