#!/usr/bin/env python3
"""A PPO iteration in flowrun and in Hugging Face TRL's PPOTrainer, side by side (issue 19).

  bench/trl_ppo.sh [PAIRS=5] [BUILD=build]          (makes the venv, then runs this file with it)
  VENV/bin/python bench/trl_ppo.py --flowrun BUILD/bin/flowrun --out DIR [--pairs 5] [--iterations 8]
                                   [--models stories260K,llama6m] [--quick] [--baseline OTHER/bin/flowrun]

--baseline: a second flowrun binary (e.g. the main branch's build) run in the same rounds, so that a
change's before and after are measured against TRL in one script: each round then runs the three
sides in a rotating order, and the result adds the baseline's figures and ratios.

Both sides get the same model, the same shapes and the same PPO settings:
- the models: stories260K after a few SFT steps (graphs/rlhf.graph, then `flowrun convert` to an HF
  folder for TRL), and a random LLaMA of dim 288, 6 layers, 6 heads, FFN 768, vocab 512 (6.1 M
  parameters; made with transformers, seed 1234, read by both from the one HF folder);
- 8 prompts per iteration, each the last 48 tok512 pieces of an HH-RLHF prompt (flowrun's
  max_prompt_seq_len = 48 with truncation "prompt_start"); 32-token answers sampled at temperature 1;
- one PPO epoch over one mini-batch of 8 (flowrun: per_device_generation_batch_size = 8,
  per_device_training_batch_size = 8, ppo_epochs = 1; TRL: per_device_train_batch_size = 8,
  num_mini_batches = 1, num_ppo_epochs = 1, local_rollout_forward_batch_size = 8);
  kl 0.1, cliprange 0.2, gamma 1, lam 0.95, learning rate 1e-4, fp32, 2 threads.
--dtype bf16 runs both in bf16 instead: flowrun with dtype = bf16 on the policy, critic, reference
and reward models (fp32 masters, bf16 weights and products: runtime/kernels/cpu/gemm_bf16.h), TRL
with bf16=True (accelerate's torch.autocast(bfloat16) on the CPU, fp32 weights).
What could not be made equal (listed in the output and in docs/performance.md):
- the reward and value models: flowrun's step-2 reward model (a few rm_trainer steps from the same
  base) versus TRL's AutoModelForSequenceClassification of the same base with a fresh score head;
  same shapes and the same work per token, different weights;
- the prompts' rows: flowrun's step-3 share of the data split (2,4,4, seed 1234) versus the file's
  first rows; the same lengths (48 pieces each);
- TRL decays the learning rate linearly, flowrun keeps it constant (no effect on the time);
- answer lengths: both print them (flowrun `answer_len`, TRL 32 unless every row ends at EOS).

Time per iteration: on each side the interval between consecutive iteration ends, read live
(flowrun: its `[step 3 ppo] iter` lines; TRL: a TrainerCallback's on_step_end), the first
iteration dropped (warm-up). Each side's figure in a pair is the median of its intervals; the pairs
alternate which side runs first; the result is the median ratio over pairs with its min-max.
Prints one JSON line per model: {"kind": "trl_ppo", ...} (bench/report.py reads it).
"""
import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from host import host  # noqa: E402  (bench/host.py: CPU model with family and model, ISA, cores)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ASSETS = os.environ.get("FLOWRUN_ASSETS", os.path.join(ROOT, "..", "shared", "assets"))
TOK = os.path.join(ASSETS, "model/stories260K/tok512.model")
DATA = os.path.join(ASSETS, "data/hh-rlhf/harmless-base-test.dschat.jsonl")
PROMPT_LEN, ANSWER_LEN, BATCH = 48, 32, 8


def run(cmd, log):
    with open(log, "w") as f:
        r = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT)
    if r.returncode:
        sys.exit(f"trl_ppo: {' '.join(cmd)} failed (exit {r.returncode}); see {log}")


def make_models(flowrun, out, name):
    """Returns (policy for flowrun, reward model folder for flowrun, HF folder for TRL)."""
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    hf = os.path.join(d, "hf")
    if name == "stories260K":
        sft, rm = os.path.join(d, "sft.bin"), os.path.join(d, "rm")
        if not (os.path.exists(sft) and os.path.isdir(rm)):
            run([flowrun, os.path.join(ROOT, "graphs/rlhf.graph"), "--no-progress", "-q", "--set",
                 "graph.checkpoint_dir=", "--set", "node.sft.steps=6", "--set", "node.rm.steps=6",
                 "--set", "node.prompts.iterations=1", "--set", "node.prompts.eval_prompts=4",
                 "--set", f"node.sft.output={sft}", "--set", f"node.rm.output={rm}",
                 "--set", f"node.policy.output={os.path.join(d, 'rlhf_ppo.bin')}"], os.path.join(d, "models.log"))
        if not os.path.isdir(hf):
            run([flowrun, "convert", "--from", "llama2c", sft, "--to", "hf", hf, "--tokenizer", TOK],
                os.path.join(d, "convert.log"))
        return sft, rm, hf
    # llama6m: a random LLaMA of stories15M's shape with tok512's vocabulary
    if not os.path.isdir(hf):
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM
        torch.manual_seed(1234)
        cfg = LlamaConfig(hidden_size=288, intermediate_size=768, num_hidden_layers=6, num_attention_heads=6,
                          num_key_value_heads=6, vocab_size=512, max_position_embeddings=256,
                          tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)
        LlamaForCausalLM(cfg).save_pretrained(hf, safe_serialization=True)
        import shutil
        shutil.copy(TOK, os.path.join(hf, "tokenizer.model"))
        with open(os.path.join(hf, "tokenizer_config.json"), "w") as f:
            json.dump({"tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>",
                       "unk_token": "<unk>", "add_bos_token": True, "add_eos_token": False}, f)
    rm = os.path.join(d, "rm")
    if not os.path.isdir(rm):
        run([flowrun, os.path.join(ROOT, "graphs/rm.graph"), "--no-progress", "-q", "--set", "graph.checkpoint_dir=",
             "--set", f"node.rm.model={hf}", "--set", "node.rm.steps=2", "--set", f"node.rm.output={rm}"],
            os.path.join(d, "rm.log"))
    return hf, rm, hf


def flowrun_pass(flowrun, policy, rm, out, iterations, dtype="fp32"):
    """One flowrun run of graphs/ppo.graph: the seconds between consecutive iteration lines."""
    precision = [x for n in ("policy", "critic", "reference", "reward") for x in ("--set", f"node.{n}.dtype={dtype}")]
    cmd = [flowrun, os.path.join(ROOT, "graphs/ppo.graph"), "--no-progress", *precision, "--set", "graph.checkpoint_dir=",
           "--set", f"node.actor_model.model={policy}", "--set", f"node.reward_model.model={rm}",
           "--set", f"node.prompts.iterations={iterations}", "--set", "node.prompts.eval_prompts=8",
           "--set", f"node.prompts.max_prompt_seq_len={PROMPT_LEN}",
           "--set", f"node.prompts.per_device_generation_batch_size={BATCH}",
           "--set", f"node.generator.max_answer_seq_len={ANSWER_LEN}",
           "--set", f"node.policy.per_device_training_batch_size={BATCH}",
           "--set", f"node.critic.per_device_training_batch_size={BATCH}",
           "--set", f"node.policy.output={os.path.join(out, 'flowrun_ppo' + ('' if os.path.isdir(policy) else '.bin'))}"]
    return iteration_intervals(cmd)


def iteration_intervals(cmd):
    """Runs one flowrun step-3 job (PPO or GRPO): the seconds between consecutive iteration lines,
    read live, and the mean answer length they print. Exits with the job's last lines if it fails or
    prints fewer than 2 iterations."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    stamps, lens, log = [], [], []
    for line in p.stdout:
        log.append(line)
        if "[step 3 ppo] iter " in line:
            stamps.append(time.perf_counter())
            if " answer_len " in line:
                lens.append(float(line.split(" answer_len ")[1].split()[0].rstrip(":")))
    if p.wait():
        sys.exit(f"{os.path.basename(sys.argv[0])}: flowrun failed:\n" + "".join(log[-20:]))
    if len(stamps) < 2:
        sys.exit(f"{os.path.basename(sys.argv[0])}: flowrun printed fewer than 2 iteration lines:\n" + "".join(log[-20:]))
    return [b - a for a, b in zip(stamps, stamps[1:])], statistics.mean(lens) if lens else float("nan")


def trl_pass(hf, out, iterations, threads, dtype="fp32"):
    """One TRL PPOTrainer run: the seconds between consecutive on_step_end calls."""
    import torch
    from datasets import Dataset
    from transformers import (AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer,
                              TrainerCallback)
    from trl.experimental.ppo import PPOConfig, PPOTrainer
    torch.set_num_threads(threads)
    tok = AutoTokenizer.from_pretrained(hf)
    tok.pad_token_id = 0  # tok512's <unk>; the rows are all PROMPT_LEN long, so nothing is padded
    ids = []
    with open(DATA) as f:
        for line in f:
            x = tok(json.loads(line)["prompt"])["input_ids"]
            if len(x) >= PROMPT_LEN:
                ids.append(x[-PROMPT_LEN:])  # "prompt_start": keep the prompt's end
            if len(ids) == BATCH * iterations:
                break
    pol, ref = AutoModelForCausalLM.from_pretrained(hf), AutoModelForCausalLM.from_pretrained(hf)
    rm = AutoModelForSequenceClassification.from_pretrained(hf, num_labels=1)
    vm = AutoModelForSequenceClassification.from_pretrained(hf, num_labels=1)
    for m in (rm, vm):
        m.config.pad_token_id = 0
    stamps = []

    class Stamp(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            stamps.append(time.perf_counter())

    cfg = PPOConfig(output_dir=os.path.join(out, "trl_out"), per_device_train_batch_size=BATCH,
                    gradient_accumulation_steps=1, num_mini_batches=1, local_rollout_forward_batch_size=BATCH,
                    num_ppo_epochs=1, total_episodes=BATCH * iterations, response_length=ANSWER_LEN, temperature=1.0,
                    learning_rate=1e-4, kl_coef=0.1, cliprange=0.2, gamma=1.0, lam=0.95, num_sample_generations=0,
                    report_to=[], save_strategy="no", logging_steps=10**6, use_cpu=True, bf16=dtype == "bf16",
                    fp16=False, seed=1234, disable_tqdm=True)
    with contextlib.redirect_stdout(sys.stderr):  # TRL prints its metrics: keep stdout to JSON lines
        PPOTrainer(args=cfg, processing_class=tok, model=pol, ref_model=ref, reward_model=rm, value_model=vm,
                   train_dataset=Dataset.from_dict({"input_ids": ids}), callbacks=[Stamp()]).train()
    return [b - a for a, b in zip(stamps, stamps[1:])]


def pair_rounds(name, pairs, baseline, one):
    """The interleaved rounds of one model: each round runs flowrun and TRL (and the baseline
    binary when given) through one(side) -> (seconds between iterations, mean answer length or
    None), alternating which goes first (rotating with a baseline). Each side's figure in a round
    is the median of its intervals; returns the lists (flowrun s/iter, TRL s/iter, TRL / flowrun
    ratios, flowrun answer lengths, baseline s/iter, TRL / baseline ratios)."""
    fr, tr, ratios, lens, br, bratios = [], [], [], [], [], []
    sides = ["flowrun", "trl"] + (["baseline"] if baseline else [])
    for k in range(pairs):
        order = sides[k % len(sides):] + sides[:k % len(sides)] if baseline else \
            (sides if k % 2 == 0 else sides[::-1])
        got = {}
        for side in order:
            iv, alen = one(side)
            if side == "flowrun":
                lens.append(alen)
            got[side] = statistics.median(iv)
        fr.append(got["flowrun"])
        tr.append(got["trl"])
        ratios.append(got["trl"] / got["flowrun"])
        line = (f"# {name} pair {k + 1}: flowrun {got['flowrun']:.3f} s/iter, TRL {got['trl']:.3f} s/iter, "
                f"ratio {ratios[-1]:.2f}")
        if baseline:
            br.append(got["baseline"])
            bratios.append(got["trl"] / got["baseline"])
            line += f"; baseline {got['baseline']:.3f} s/iter, ratio {bratios[-1]:.2f}"
        print(line, file=sys.stderr, flush=True)
    return fr, tr, ratios, lens, br, bratios


def start(description):
    """The command line of the side-by-side scripts (this file and bench/trl_grpo.py), the output
    folder, the threads' environment and the host line, printed: returns (args, out, host)."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--flowrun", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--iterations", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--models", default="stories260K,llama6m")
    ap.add_argument("--quick", action="store_true", help="1 pair of 3 iterations")
    ap.add_argument("--baseline", default="", help="a second flowrun binary measured in the same rounds")
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"],
                    help="both sides in this precision (bf16: flowrun's dtype = bf16, TRL's bf16=True)")
    a = ap.parse_args()
    if a.quick:
        a.pairs, a.iterations = 1, 3
    out = os.path.abspath(a.out)
    os.makedirs(out, exist_ok=True)
    os.environ["OMP_NUM_THREADS"] = str(a.threads)
    import trl  # noqa: F401  (fail early without it)
    h = host()
    print(json.dumps({"kind": "host", **h}), flush=True)
    return a, out, h


def result(kind, name, a, h, rows, rounds, **extra):
    """One model's JSON line (bench/report.py reads it): pair_rounds' lists `rounds`, `rows`
    samples per iteration, and the script's own fields in `extra`."""
    fr, tr, ratios, lens, br, bratios = rounds
    base = {} if not a.baseline else {
        "baseline": a.baseline, "baseline_s_per_iter": br,
        "baseline_ratio_median": statistics.median(bratios), "baseline_ratio_min": min(bratios),
        "baseline_ratio_max": max(bratios)}
    return json.dumps({
        "kind": kind, "model": name, "pairs": a.pairs, "iterations": a.iterations, "threads": a.threads,
        "batch": rows, "dtype": a.dtype, **extra, "flowrun_s_per_iter": fr, "trl_s_per_iter": tr,
        "flowrun_samples_per_s_median": rows / statistics.median(fr),
        "trl_samples_per_s_median": rows / statistics.median(tr),
        "ratio_median": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
        "flowrun_answer_len_mean": statistics.mean(lens), "trl_version": __import__("trl").__version__,
        "torch_version": __import__("torch").__version__, "host": h, **base})


def main():
    a, out, h = start("A PPO iteration in flowrun and in TRL's PPOTrainer, side by side")
    for name in a.models.split(","):
        policy, rm, hf = make_models(a.flowrun, out, name)

        def one(side):
            if side == "trl":
                return trl_pass(hf, out, a.iterations, a.threads, a.dtype), None
            return flowrun_pass(a.flowrun if side == "flowrun" else a.baseline, policy, rm, out, a.iterations,
                                a.dtype)
        rounds = pair_rounds(name, a.pairs, a.baseline, one)
        print(result("trl_ppo", name, a, h, BATCH, rounds, prompt_len=PROMPT_LEN, answer_len=ANSWER_LEN), flush=True)


if __name__ == "__main__":
    main()
