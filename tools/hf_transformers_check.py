#!/usr/bin/env python3
"""Load Hugging Face folders that flowrun's trainers wrote in transformers, and compare.

Not part of CI (it needs torch and transformers; the C++ tests do not). For each folder
it loads AutoModelForCausalLM (float32, eager attention) and compares with what
flowrun's own loader computes on the same probe ids (`make_tiny_hf --outputs DIR`):
  - the logits, for sft / ppo outputs;
  - for a reward model (a v_head.weight tensor, which transformers reports as unused):
    DS-Chat's values, last hidden state (after the final norm) @ v_head.weight^T.
Passes when the largest |difference| is at most --tol (1e-5).

  python -m venv /tmp/tfenv && /tmp/tfenv/bin/pip install torch transformers safetensors
  ctest --test-dir build -R hf_trainers_small      # writes build/tests/hf_trainers_small/{opt,gpt2,llama}/...
  /tmp/tfenv/bin/python tools/hf_transformers_check.py build/bin/make_tiny_hf \\
      build/tests/hf_trainers_small/*/{sft,rm,ppo}
"""
import argparse
import json
import subprocess
import sys

import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("make_tiny_hf", help="the make_tiny_hf binary (prints flowrun's outputs)")
    ap.add_argument("folders", nargs="+")
    ap.add_argument("--tol", type=float, default=1e-5)
    a = ap.parse_args()
    ok = True
    for d in a.folders:
        ref = json.loads(subprocess.run([a.make_tiny_hf, "--outputs", d], check=True, capture_output=True,
                                        text=True).stdout)
        ids = torch.tensor(ref["input_ids"])
        model = AutoModelForCausalLM.from_pretrained(d, attn_implementation="eager", dtype=torch.float32).eval()
        with torch.no_grad():
            out = model(input_ids=ids, output_hidden_states=True)
        if "values" in ref:
            with safe_open(f"{d}/model.safetensors", "pt") as f:
                v_head = f.get_tensor("v_head.weight")
            got = (out.hidden_states[-1] @ v_head.T).squeeze(-1).flatten()
            want, what = torch.tensor(ref["values"]), "values"
        else:
            got = out.logits.flatten()
            want, what = torch.tensor(ref["logits"]), "logits"
        diff = (got - want).abs().max().item()
        status = "OK" if diff <= a.tol else "FAIL"
        ok &= diff <= a.tol
        print(f"{status} {d}: {type(model).__name__}, max |{what} - flowrun's| = {diff:.3g} (tol {a.tol})")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
