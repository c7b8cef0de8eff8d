#!/usr/bin/env python3
"""Load Hugging Face folders that flowrun's trainers wrote in transformers, and compare.

Not part of CI (it needs torch and transformers; the C++ tests do not): bench/hf_transformers_check.sh
makes the venv, writes the folders and runs this. For each folder it loads AutoModelForCausalLM (eager
attention) and compares with what flowrun's own loader computes on the same probe ids
(`make_tiny_hf --outputs DIR`):
  - the logits, for sft / ppo outputs;
  - for a reward model (a v_head.weight tensor, which transformers reports as unused):
    DS-Chat's values, last hidden state (after the final norm) @ v_head.weight^T.
The reference is transformers in float64 (the float32 weights upcast exactly), so the difference is
flowrun's float32 rounding alone; transformers' own float32 run is printed beside it (its distance from
the float64 run is the float32 noise floor of the model). The folder's tokenizer is loaded with
AutoTokenizer and must give flowrun's ids for a probe text (no BOS/EOS), and a LLaMA tokenizer.model
must prepend BOS by default (LlamaTokenizer, as in Meta's folders; tokenizer_config.json says so). A folder passes when the model
loads with no missing, mismatched or unexpected tensor (v_head.weight excepted), the tokenizer ids are
equal, and max |flowrun - transformers float64| is at most --tol (1e-5) times max(1, the largest |output|)
(float32 rounding grows with the outputs' size: stories260K's logits reach 22, and a kernel path that
rounds otherwise, AVX-512 against AVX2, moves the last bits). sentencepiece and protobuf are
needed for LLaMA folders' tokenizer.model.

  python -m venv /tmp/tfenv && /tmp/tfenv/bin/pip install torch transformers safetensors sentencepiece protobuf
  ctest --test-dir build -R hf_trainers_small      # writes build/tests/hf_trainers_small/{opt,gpt2,llama}/...
  /tmp/tfenv/bin/python tools/hf_transformers_check.py build/bin/make_tiny_hf \\
      build/tests/hf_trainers_small/*/{sft,rm,ppo}
"""
import argparse
import json
import os
import subprocess
import sys

import torch
import transformers
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer


def outputs(d, dt, ids, values):
    """transformers' logits (or DS-Chat values) of folder d in dtype dt, flattened, as float64."""
    model, info = AutoModelForCausalLM.from_pretrained(d, attn_implementation="eager", dtype=dt,
                                                       output_loading_info=True)
    model.eval()
    bad = {k: sorted(v) for k, v in info.items() if k != "unexpected_keys" and v}
    unexpected = set(info["unexpected_keys"]) - ({"v_head.weight"} if values else set())
    if unexpected:
        bad["unexpected_keys"] = sorted(unexpected)
    with torch.no_grad():
        out = model(input_ids=ids, output_hidden_states=True)
    if values:
        with safe_open(f"{d}/model.safetensors", "pt") as f:
            v_head = f.get_tensor("v_head.weight").to(dt)
        got = (out.hidden_states[-1] @ v_head.T).squeeze(-1)
    else:
        got = out.logits
    return type(model).__name__, got.flatten().double(), bad


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("make_tiny_hf", help="the make_tiny_hf binary (prints flowrun's outputs)")
    ap.add_argument("folders", nargs="+")
    ap.add_argument("--tol", type=float, default=1e-5)
    a = ap.parse_args()
    print(f"torch {torch.__version__}, transformers {transformers.__version__}")
    ok = True
    for d in a.folders:
        ref = json.loads(subprocess.run([a.make_tiny_hf, "--outputs", d], check=True, capture_output=True,
                                        text=True).stdout)
        ids = torch.tensor(ref["input_ids"])
        what = "values" if "values" in ref else "logits"
        want = torch.tensor(ref[what], dtype=torch.float64)
        name, got64, bad = outputs(d, torch.float64, ids, what == "values")
        _, got32, _ = outputs(d, torch.float32, ids, what == "values")
        diff = (got64 - want).abs().max().item()
        diff32 = (got32 - want).abs().max().item()
        floor = (got32 - got64).abs().max().item()
        if "text" in ref:
            try:
                tok = AutoTokenizer.from_pretrained(d)
                tok_ids = tok(ref["text"], add_special_tokens=False)["input_ids"]
                if tok_ids != ref["text_ids"]:
                    bad["tokenizer"] = f"AutoTokenizer ids {tok_ids} != flowrun's {ref['text_ids']}"
                elif os.path.exists(f"{d}/tokenizer.model"):  # LLaMA's tokenizer prepends BOS, as Meta's folders do
                    with open(f"{d}/config.json") as f:
                        bos = json.load(f)["bos_token_id"]
                    if tok(ref["text"])["input_ids"] != [bos] + tok_ids:
                        bad["tokenizer"] = f"{type(tok).__name__} does not prepend BOS {bos}"
            except Exception as e:  # noqa: BLE001 - any failure to load is the finding
                bad["tokenizer"] = f"AutoTokenizer cannot load it: {type(e).__name__}: {e}"
        scale = max(1.0, want.abs().max().item())  # the tolerance is relative to the outputs' size
        good = diff <= a.tol * scale and not bad
        ok &= good
        print(f"{'OK' if good else 'FAIL'} {d}: {name}, max |{what}| {want.abs().max().item():.3g}, "
              f"max |flowrun - transformers f64| = {diff:.3g} (tol {a.tol} x {scale:.3g}); "
              f"vs transformers f32 {diff32:.3g}, transformers f32 - f64 {floor:.3g}"
              + ("; tokenizer ids equal" if "text" in ref and "tokenizer" not in bad else "")
              + (f"; problems: {bad}" if bad else ""))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
