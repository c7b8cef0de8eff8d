#!/usr/bin/env python3
"""A GRPO iteration in flowrun and in Hugging Face TRL's GRPOTrainer, side by side (issue 19).

  bench/trl_ppo.sh [PAIRS=5] [BUILD=build] [MODELS=stories260K,llama6m] [ALGOS=ppo,grpo]
  VENV/bin/python bench/trl_grpo.py --flowrun BUILD/bin/flowrun --out DIR [--pairs 5] [--iterations 8]
                                    [--models stories260K,llama6m] [--quick] [--baseline OTHER/bin/flowrun]

The same models as bench/trl_ppo.py (made there: stories260K after a few SFT steps as an HF folder,
and the random 6.1 M LLaMA), the same threads and the same pairing (pair_rounds there). GRPO at the
settings of veRL's and TRL's GSM8K recipes, scaled to these models:
- GSM8K test questions (FLOWRUN_ASSETS data/gsm8k/test.jsonl), each the last 48 tok512 pieces of
  its question (flowrun: max_prompt_seq_len = 48, truncation "prompt_start"; TRL: the same ids,
  handed to the trainer as they are, since it would tokenize the text itself and not truncate);
- 2 prompts per iteration x num_generations = 8 answers of up to 32 tokens, sampled at
  temperature 1 (no top-k, no top-p); one update over the 16 rows (flowrun:
  per_device_training_batch_size = 16, ppo_epochs = 1; TRL: per_device_train_batch_size = 16,
  gradient_accumulation_steps = 1, num_iterations = 1);
- the reward: GSM8K exact match on the last "#### N" (flowrun's built-in gsm8k rule; TRL: the same
  rule as a Python reward function); advantages normalised within each group by its standard
  deviation (flowrun advantage_estimator = "grpo"; TRL scale_rewards = "group");
- the loss: the clipped ratio at 0.2 (cliprange / epsilon), token-mean aggregation (flowrun
  loss_agg_mode = "token-mean"; TRL loss_type = "dapo"), a k3 KL loss to the frozen reference at
  0.001 (flowrun use_kl_loss, kl_loss_coef; TRL beta, which loads its reference model); no KL in
  the reward (kl_ctl = 0); gradient-norm clip 1; learning rate 1e-4, fp32, 2 threads.
--dtype bf16 runs both in bf16 (flowrun's dtype = bf16 on the policy and the reference, TRL's bf16=True),
as bench/trl_ppo.py's.
What could not be made equal:
- the prompts' rows: flowrun's step-3 share of the data split (2,4,4, seed 1234) versus the file's
  first rows of 48 pieces or more; the same lengths;
- flowrun keeps every group (filter_groups = false, so that both train on all 16 rows: these models
  score 0 on nearly every question, and DAPO's filter would drop those groups); TRL has no filter;
- flowrun clamps its k3 KL estimate to +-10 (veRL's low_var_kl), TRL does not (no effect on the
  time); neither has a dual clip (flowrun's clip_ratio_c is 0 by default);
- TRL decays the learning rate linearly, flowrun keeps it constant (no effect on the time);
- answer lengths: both print them (rows end at EOS or at 32 tokens).

Time per iteration, per pair and the result line as in bench/trl_ppo.py; one JSON line per model:
{"kind": "trl_grpo", ...} (bench/report.py reads it).
"""
import contextlib
import json
import os
import re
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from trl_ppo import ASSETS, TOK, iteration_intervals, make_models, pair_rounds, result, start  # noqa: E402

DATA = os.path.join(ASSETS, "data/gsm8k/test.jsonl")
PROMPT_LEN, ANSWER_LEN, PROMPTS, GENERATIONS = 48, 32, 2, 8
ROWS = PROMPTS * GENERATIONS
FINAL = re.compile(r"####\s*(-?[0-9][0-9,]*(?:\.[0-9]+)?)")


def final_number(text):
    """The number after the last "#### " in text, without thousands commas; None if there is none."""
    m = FINAL.findall(text)
    return m[-1].replace(",", "").rstrip(".") if m else None


def write_graph(out, policy, iterations, dtype="fp32"):
    """graphs/grpo.graph's GRPO stage on a given model (no SFT node), at the shapes above; dtype on the
    policy and the reference."""
    path = os.path.join(out, "grpo_bench.graph")
    tok, out_model = json.dumps(TOK), json.dumps(os.path.join(out, "flowrun_grpo" + ("" if os.path.isdir(policy)
                                                                                      else ".bin")))
    with open(path, "w") as f:
        f.write(f"""# written by bench/trl_grpo.py
edges = [
  "actor_model.model -> policy.init, reference.init",
  "prompts.batch -> controller.prompts",
  "controller.generate -> generator.prompts",
  "generator.rollouts -> policy.rollouts, reference.rollouts, reward.rollouts",
  "policy.scored -> experience.logprobs",
  "reference.scored -> experience.ref_logprobs",
  "reward.scored -> experience.reward",
  "experience.experience -> policy.train",
  "experience.summary -> controller.summary",
  "policy.stats -> controller.actor_stats",
  "policy.weights -> generator.weights",
  "controller.next -> prompts.next",
]

[graph]
name = "grpo_bench"
seed = 1234
checkpoint_dir = ""

[node.actor_model]
kind = "model_source"
model = {json.dumps(policy)}

[node.prompts]
kind = "prompt_loader"
tokenizer = {tok}
data = {json.dumps(DATA)}
data_split = "2,4,4"
max_prompt_seq_len = {PROMPT_LEN}
per_device_generation_batch_size = {PROMPTS}
iterations = {iterations}
eval_prompts = 4

[node.controller]
kind = "ppo_controller"

[node.generator]
kind = "rollout_generator"
tokenizer = {tok}
max_answer_seq_len = {ANSWER_LEN}
temperature = 1.0
num_generations = {GENERATIONS}

[node.reward]
kind = "reward_function"
tokenizer = {tok}
reward = "gsm8k"

[node.reference]
kind = "reference_model"
dtype = "{dtype}"

[node.experience]
kind = "experience_maker"
advantage_estimator = "grpo"
kl_ctl = 0.0
filter_groups = false

[node.policy]
kind = "policy"
actor_learning_rate = 1e-4
per_device_training_batch_size = {ROWS}
ppo_epochs = 1
use_kl_loss = true
kl_loss_coef = 0.001
loss_agg_mode = "token-mean"
dtype = "{dtype}"
output = {out_model}
""")
    return path


def flowrun_pass(flowrun, graph):
    """One flowrun run of the bench graph: the seconds between consecutive iteration lines, and the
    mean answer length."""
    return iteration_intervals([flowrun, graph, "--no-progress"])


def trl_pass(hf, out, iterations, threads, dtype="fp32"):
    """One TRL GRPOTrainer run: the seconds between consecutive on_step_end calls, and the mean
    completion length TRL logged."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer
    torch.set_num_threads(threads)
    tok = AutoTokenizer.from_pretrained(hf)
    tok.pad_token_id = 0  # tok512's <unk>; every prompt is PROMPT_LEN long, so nothing is padded
    ids, rows = {}, {"prompt": [], "answer": []}
    with open(DATA) as f:
        for line in f:
            j = json.loads(line)
            x = tok(j["question"])["input_ids"]
            if len(x) >= PROMPT_LEN:
                ids[j["question"]] = x[-PROMPT_LEN:]  # "prompt_start": keep the question's end
                rows["prompt"].append(j["question"])
                rows["answer"].append(j["answer"])
            if len(rows["prompt"]) == PROMPTS * iterations:
                break

    class FixedIds(GRPOTrainer):
        def _tokenize_prompts(self, prompts):  # the ids above, not a new tokenization of the text
            return [ids[p] for p in prompts], None, {}

    def gsm8k(prompts, completions, answer, **kw):
        return [1.0 if final_number(c) is not None and final_number(c) == final_number(r) else 0.0
                for c, r in zip(completions, answer)]

    stamps, lens = [], []

    class Stamp(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            stamps.append(time.perf_counter())

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "completions/mean_length" in logs:
                lens.append(float(logs["completions/mean_length"]))

    cfg = GRPOConfig(output_dir=os.path.join(out, "trl_grpo_out"), per_device_train_batch_size=ROWS,
                     gradient_accumulation_steps=1, num_generations=GENERATIONS, max_completion_length=ANSWER_LEN,
                     temperature=1.0, top_k=0, top_p=1.0, learning_rate=1e-4, beta=0.001, epsilon=0.2,
                     num_iterations=1, loss_type="dapo", scale_rewards="group", max_steps=iterations,
                     report_to=[], save_strategy="no", logging_steps=1, use_cpu=True, bf16=dtype == "bf16", fp16=False,
                     seed=1234, disable_tqdm=True, log_completions=False)
    model = AutoModelForCausalLM.from_pretrained(hf)
    with contextlib.redirect_stdout(sys.stderr):  # TRL prints its metrics: keep stdout to JSON lines
        FixedIds(model=model, reward_funcs=gsm8k, args=cfg, processing_class=tok,
                 train_dataset=Dataset.from_dict(rows), callbacks=[Stamp()]).train()
    if len(stamps) < 2:
        sys.exit("trl_grpo: TRL ran fewer than 2 steps")
    return [b - a for a, b in zip(stamps, stamps[1:])], statistics.mean(lens) if lens else float("nan")


def main():
    a, out, h = start("A GRPO iteration in flowrun and in TRL's GRPOTrainer, side by side")
    for name in a.models.split(","):
        policy, _, hf = make_models(a.flowrun, out, name)  # the PPO bench's models (its reward model unused)
        work = os.path.join(out, "grpo_" + name)
        os.makedirs(work, exist_ok=True)
        graph = write_graph(work, policy, a.iterations, a.dtype)
        trl_lens = []

        def one(side):
            if side == "trl":
                iv, alen = trl_pass(hf, work, a.iterations, a.threads, a.dtype)
                trl_lens.append(alen)
                return iv, None
            return flowrun_pass(a.flowrun if side == "flowrun" else a.baseline, graph)
        rounds = pair_rounds(name, a.pairs, a.baseline, one)
        print(result("trl_grpo", name, a, h, ROWS, rounds, prompts=PROMPTS, num_generations=GENERATIONS,
                     prompt_len=PROMPT_LEN, answer_len=ANSWER_LEN, trl_answer_len_mean=statistics.mean(trl_lens)),
              flush=True)


if __name__ == "__main__":
    main()
