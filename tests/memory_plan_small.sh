#!/usr/bin/env bash
# The trainers' memory planner (issue 16: "it refuses a plan that cannot fit, naming the node
# and the setting to lower"; docs/zero.md "Memory"): a plan over memory_limit_gb is refused
# before anything trains, naming the node and the settings to change, for sft_trainer and
# rm_trainer at start, and for step 3's policy and critic at init (the engine's state) and
# before they score the first rollouts (the rows' length is known then; nothing trained yet).
set -euo pipefail
flowrun=$1 root=$2 out=$3
rm -rf "$out" && mkdir -p "$out" && cd "$out"

fail() { echo "memory_plan_small: $*"; exit 1; }

# refused NAME GRAPH PATTERN ARGS...: the run must fail, its error match PATTERN, and no step have trained
refused() {
  local name=$1 graph=$2 pattern=$3
  shift 3
  if "$flowrun" "$root/graphs/$graph" --no-progress "$@" > "$name.log" 2> "$name.err"; then
    fail "$name: a plan over memory_limit_gb ran"
  fi
  grep -q -- "$pattern" "$name.err" || { echo "$name: the error does not match '$pattern':"; cat "$name.err"; exit 1; }
  ! grep -q "step 1/\|\] iteration 1" "$name.log" || fail "$name: it trained before refusing"
  echo "$name: $(grep -o "node '[^']*': the plan needs about.*" "$name.err" | head -1)"
}

# steps 1 and 2, at start
refused sft sft.graph "node 'sft': the plan needs about.*(memory_limit_gb).*lower per_device_train_batch_size or max_seq_len, raise zero_stage (now 0), set lora_dim, turn on gradient_checkpointing" \
  --set node.sft.memory_limit_gb=0.001
# with LoRA, checkpointing and stage 3 on, only the batch and the length remain to lower
refused sft_lora sft.graph "node 'sft': the plan needs about.*lower per_device_train_batch_size or max_seq_len" \
  --set node.sft.memory_limit_gb=0.0001 --set node.sft.lora_dim=4 --set node.sft.gradient_checkpointing=true \
  --set node.sft.zero_stage=3
! grep -q "raise zero_stage\|set lora_dim\|turn on gradient_checkpointing" sft_lora.err ||
  fail "sft_lora: names a setting that is already on: $(cat sft_lora.err)"
refused rm rm.graph "node 'rm': the plan needs about.*(memory_limit_gb).*lower per_device_train_batch_size or max_seq_len" \
  --set node.rm.memory_limit_gb=0.001

# step 3: a reward model to start the critic from (one RM step is enough)
"$flowrun" "$root/graphs/rm.graph" --no-progress --set node.rm.steps=1 --set node.rm.output="$out/rm_model" \
  --set node.rm.eval_fraction=0.01 > rm1.log 2> rm1.err || { cat rm1.err; fail "the 1-step reward model failed"; }
step3=(--set node.actor_model.model=model/stories260K/stories260K.bin --set node.reward_model.model="$out/rm_model"
       --set node.prompts.iterations=2 --set node.policy.output="")
# at init: the engine's state alone is over the limit
refused policy_init ppo.graph "node 'policy': the plan needs about.*for a micro-batch of 8 x 1 tokens.*lower per_device_training_batch_size or max_prompt_seq_len + max_answer_seq_len, raise actor_zero_stage (now 0), set actor_lora_dim, turn on actor_gradient_checkpointing" \
  "${step3[@]}" --set node.policy.memory_limit_gb=0.001
refused critic_init ppo.graph "node 'critic': the plan needs about.*raise critic_zero_stage (now 0), set critic_lora_dim" \
  "${step3[@]}" --set node.critic.memory_limit_gb=0.001
# the state fits, the first rollouts' rows (48 prompt + up to 32 answer tokens) do not: refused before training
refused policy_rollouts ppo.graph "node 'policy': the plan needs about.*for a micro-batch of 8 x [0-9][0-9] tokens" \
  "${step3[@]}" --set node.policy.memory_limit_gb=0.01
echo "memory_plan_small: ok"
