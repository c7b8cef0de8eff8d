#!/usr/bin/env python3
"""PyTorch reference for bench_core: the same shapes in plain torch nn.Modules.

Run by bench/run_bench.sh (which makes the venv and installs torch from PyPI);
prints one JSON object per line, keyed like bench_core's own lines:

  {"kind": "train", "model": "gpt2_124m", "B": 4, "T": 64, "tok_s": ...}
  {"kind": "decode", "model": "stories15m", "batch": 1, "tok_s": ...}

The models are written out here (nanoGPT's GPT-2 and a llama2.c-style LLaMA),
fp32, eager mode, `torch.set_num_threads(threads)`; a training step is
forward + cross-entropy + backward + torch.optim.AdamW (its default foreach
implementation), as flowrun's bench does. Attention uses
F.scaled_dot_product_attention (PyTorch's own fused CPU kernel), so this is the
fastest plain-PyTorch formulation rather than a strawman.
"""
import argparse
import json
import math
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


# ----------------------------------------------------------------- GPT-2 (nanoGPT)
class GPTBlock(nn.Module):
    def __init__(self, C, H):
        super().__init__()
        self.H = H
        self.ln_1 = nn.LayerNorm(C)
        self.c_attn = nn.Linear(C, 3 * C)
        self.c_proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C)
        self.c_fc = nn.Linear(C, 4 * C)
        self.mlp_proj = nn.Linear(4 * C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q = q.view(B, T, self.H, C // self.H).transpose(1, 2)
        k = k.view(B, T, self.H, C // self.H).transpose(1, 2)
        v = v.view(B, T, self.H, C // self.H).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.c_proj(y)
        x = x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))
        return x


class GPT2(nn.Module):
    def __init__(self, L=12, C=768, H=12, V=50257, S=1024):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(S, C)
        self.h = nn.ModuleList([GPTBlock(C, H) for _ in range(L)])
        self.ln_f = nn.LayerNorm(C)
        self.lm_head = nn.Linear(C, V, bias=False)
        self.lm_head.weight = self.wte.weight  # tied
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx, targets):
        B, T = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for b in self.h:
            x = b(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


# ----------------------------------------------------------------- LLaMA (llama2.c's model.py)
class RMSNorm(nn.Module):
    def __init__(self, C, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(C))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope_cache(hs, S, theta=10000.0):
    freqs = 1.0 / (theta ** (torch.arange(0, hs, 2).float() / hs))
    t = torch.arange(S).float()
    f = torch.outer(t, freqs)
    return torch.cos(f), torch.sin(f)


def apply_rope(x, cos, sin):  # x (B, T, H, hs), adjacent pairs
    xr = x.float().reshape(*x.shape[:-1], -1, 2)
    x0, x1 = xr[..., 0], xr[..., 1]
    c = cos.view(1, x.shape[1], 1, -1)
    s = sin.view(1, x.shape[1], 1, -1)
    return torch.stack([x0 * c - x1 * s, x0 * s + x1 * c], dim=-1).flatten(3)


class LlamaBlock(nn.Module):
    def __init__(self, C, F_, H, KV):
        super().__init__()
        self.H, self.KV, self.hs = H, KV, C // H
        self.attention_norm = RMSNorm(C)
        self.wq = nn.Linear(C, H * self.hs, bias=False)
        self.wk = nn.Linear(C, KV * self.hs, bias=False)
        self.wv = nn.Linear(C, KV * self.hs, bias=False)
        self.wo = nn.Linear(H * self.hs, C, bias=False)
        self.ffn_norm = RMSNorm(C)
        self.w1 = nn.Linear(C, F_, bias=False)
        self.w2 = nn.Linear(F_, C, bias=False)
        self.w3 = nn.Linear(C, F_, bias=False)

    def attn(self, x, cos, sin, cache=None, pos=0):
        B, T, _ = x.shape
        q = apply_rope(self.wq(x).view(B, T, self.H, self.hs), cos, sin)
        k = apply_rope(self.wk(x).view(B, T, self.KV, self.hs), cos, sin)
        v = self.wv(x).view(B, T, self.KV, self.hs)
        if cache is not None:  # (B, S, KV, hs) each
            cache[0][:, pos:pos + T] = k
            cache[1][:, pos:pos + T] = v
            k = cache[0][:, :pos + T]
            v = cache[1][:, :pos + T]
        rep = self.H // self.KV
        k = k.repeat_interleave(rep, dim=2)
        v = v.repeat_interleave(rep, dim=2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=(T > 1))
        return self.wo(y.transpose(1, 2).reshape(B, T, -1))

    def forward(self, x, cos, sin, cache=None, pos=0):
        x = x + self.attn(self.attention_norm(x), cos, sin, cache, pos)
        h = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class Llama(nn.Module):
    def __init__(self, C, F_, L, H, KV, V, S):
        super().__init__()
        self.tok_embeddings = nn.Embedding(V, C)
        self.layers = nn.ModuleList([LlamaBlock(C, F_, H, KV) for _ in range(L)])
        self.norm = RMSNorm(C)
        self.output = nn.Linear(C, V, bias=False)
        self.output.weight = self.tok_embeddings.weight
        cos, sin = rope_cache(C // H, S)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx, targets=None, caches=None, pos=0):
        B, T = idx.shape
        x = self.tok_embeddings(idx)
        cos, sin = self.cos[pos:pos + T], self.sin[pos:pos + T]
        for i, l in enumerate(self.layers):
            x = l(x, cos, sin, None if caches is None else caches[i], pos)
        x = self.norm(x)
        if targets is None:
            return self.output(x[:, -1, :])
        logits = self.output(x)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


LLAMAS = {  # C, F, L, H, KV, V, S
    "stories260k": (64, 172, 5, 8, 4, 512, 512),
    "stories15m": (288, 768, 6, 6, 6, 32000, 256),
}


def bench_train(name, model, B, T, V, seconds):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0)
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, V, (B, T), generator=g)
    tg = torch.randint(0, V, (B, T), generator=g)

    def step():
        loss = model(idx, tg)
        opt.zero_grad(set_to_none=False)
        loss.backward()
        opt.step()

    step()  # warm-up
    step()
    n, t0 = 0, time.perf_counter()
    while True:
        step()
        n += 1
        dt = time.perf_counter() - t0
        if dt >= seconds and n >= 2:
            break
    return B * T * n / dt


@torch.inference_mode()
def bench_decode(model, batch, steps, C, H, KV, L, V):
    hs = C // H
    caches = [(torch.zeros(batch, steps + 1, KV, hs), torch.zeros(batch, steps + 1, KV, hs)) for _ in range(L)]
    tok = torch.ones(batch, 1, dtype=torch.long)
    logits = model(tok, caches=caches, pos=0)  # the "prompt": BOS
    t0 = time.perf_counter()
    for pos in range(1, steps):
        tok = logits.argmax(-1, keepdim=True)
        logits = model(tok, caches=caches, pos=pos)
    dt = time.perf_counter() - t0
    return batch * (steps - 1) / dt


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=3.0, help="minimum timed seconds per training figure")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", default="", help="comma list of: train_gpt2, train_gpt2_large, train_260k, decode")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    only = set(filter(None, a.only.split(",")))
    want = lambda k: not only or k in only
    out = lambda d: (print(json.dumps({"source": "torch", **d})), sys.stdout.flush())
    out({"kind": "info", "torch": torch.__version__, "threads": torch.get_num_threads(),
         "blas": "mkl" if torch.backends.mkl.is_available() else "other",
         "cpu_capability": torch.backends.cpu.get_cpu_capability()})
    secs = 1.0 if a.quick else a.seconds
    if want("train_260k"):
        C, F_, L, H, KV, V, S = LLAMAS["stories260k"]
        m = Llama(C, F_, L, H, KV, V, S)
        out({"kind": "train", "model": "stories260k", "B": 8, "T": 64, "tok_s": bench_train("s", m, 8, 64, V, secs)})
    if want("train_gpt2"):
        m = GPT2()
        out({"kind": "train", "model": "gpt2_124m", "B": 4, "T": 64, "tok_s": bench_train("g", m, 4, 64, 50257, secs)})
        if want("train_gpt2_large") or not only:
            out({"kind": "train", "model": "gpt2_124m", "B": 8, "T": 256,
                 "tok_s": bench_train("g", m, 8, 256, 50257, secs)})
        del m
    elif want("train_gpt2_large"):
        m = GPT2()
        out({"kind": "train", "model": "gpt2_124m", "B": 8, "T": 256, "tok_s": bench_train("g", m, 8, 256, 50257, secs)})
    if want("decode"):
        for name in ("stories260k", "stories15m"):
            C, F_, L, H, KV, V, S = LLAMAS[name]
            m = Llama(C, F_, L, H, KV, V, S).eval()
            for batch in (1, 16):
                steps = 64 if a.quick else 256
                steps = min(steps, S - 1)
                bench_decode(m, batch, 8, C, H, KV, L, V)  # warm-up
                out({"kind": "decode", "model": name, "batch": batch,
                     "tok_s": bench_decode(m, batch, steps, C, H, KV, L, V)})


if __name__ == "__main__":
    main()
