#!/usr/bin/env python3
"""Reference point for make bench: PyTorch (Debian's python3-torch, CPU) training steps of the
same GPT-2 model shape tessera's bench_train_step runs, on the same machine in the same session:
fp32, or bf16 autocast (torch.autocast("cpu", torch.bfloat16) around the forward and the loss:
PyTorch's mixed precision on the CPU, fp32 master weights and optimizer). Run with /usr/bin/python3
(the Debian interpreter that has torch). Not part of the product.

    /usr/bin/python3 bench/pytorch_gpt2_step.py [--B 4] [--T 256] [--steps 3] [--threads 2]
                                                [--precision fp32|bf16]
"""
import contextlib
import argparse
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, C, H):
        super().__init__()
        self.H = H
        self.ln1, self.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.qkv, self.proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.fc, self.fcproj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.H, C // self.H).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(C // self.H)
        att = att.masked_fill(~torch.tril(torch.ones(T, T, dtype=torch.bool)), float("-inf"))
        y = (att.softmax(-1) @ v).transpose(1, 2).reshape(B, T, C)
        x = x + self.proj(y)
        return x + self.fcproj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, L=12, H=12, C=768, V=50257, P=1024):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(P, C)
        self.blocks = nn.ModuleList(Block(C, H) for _ in range(L))
        self.lnf = nn.LayerNorm(C)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for b in self.blocks:
            x = b(x)
        logits = self.lnf(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--B", type=int, default=4)
    ap.add_argument("--T", type=int, default=256)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = GPT()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)
    x = torch.randint(0, 50257, (a.B, a.T))
    y = torch.randint(0, 50257, (a.B, a.T))
    def autocast():
        if a.precision == "bf16":
            return torch.autocast("cpu", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    times = []
    for s in range(a.steps + 1):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with autocast():
            loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        dt = time.perf_counter() - t0
        if s > 0:
            times.append(dt)
        print(f"  step {s}: {dt * 1e3:.0f} ms{' (warm-up)' if s == 0 else ''}", flush=True)
    med = sorted(times)[len(times) // 2]
    print(f"PyTorch {torch.__version__} {a.precision}, {a.threads} threads: median {med * 1e3:.0f} ms/step, "
          f"{a.B * a.T / med:.0f} tokens/s")


if __name__ == "__main__":
    main()
