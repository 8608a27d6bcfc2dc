#!/usr/bin/env python3
"""The PyTorch reference for tessera's GPU throughput (bench_gpu_train): training steps of the same
model shapes (GPT-2 124M and 350M, a Llama of similar size) at T=1024 in bf16 autocast with fp32
master weights and fused AdamW, in eager mode and under torch.compile, on the same GPU in the same
session. Prints one JSON line per run (tokens/s, MFU against the dense bf16 peak) and a table.
Not part of the product; needs a CUDA build of PyTorch.

    python3 bench/gpu/torch_train_step.py [--models gpt2-124m,gpt2-350m,llama-160m]
        [--modes eager,compile] [--T 1024] [--batches 32,16,8] [--steps 10] [--peak 989.4]
"""
import argparse
import json
import math
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

SHAPES = {
    # name: (family, layers, heads, kv_heads, embd, ffn hidden, vocab)
    "gpt2-124m": ("gpt2", 12, 12, 12, 768, 3072, 50257),
    "gpt2-350m": ("gpt2", 24, 16, 16, 1024, 4096, 50257),
    # Llama with GPT-2 124M's widths: RMSNorm, RoPE, SwiGLU (8C/3 rounded), untied head, no bias
    "llama-160m": ("llama", 12, 12, 12, 768, 2048, 32000),
}


def pad_vocab(v):
    return (v + 127) // 128 * 128


class GptBlock(nn.Module):
    def __init__(self, C, H, F_):
        super().__init__()
        self.H = H
        self.ln1, self.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.qkv, self.proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.fc, self.fcproj = nn.Linear(C, F_), nn.Linear(F_, C)

    def forward(self, x, rope):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.H, C // self.H).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.fcproj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


def rope_tables(T, hs, device, theta=10000.0):
    inv = 1.0 / theta ** (torch.arange(0, hs, 2, device=device).float() / hs)
    f = torch.outer(torch.arange(T, device=device).float(), inv)
    return f.cos(), f.sin()


def apply_rope(x, cos, sin):  # x (B,H,T,hs), halves rotated (the Hugging Face Llama layout)
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).type_as(x)


class LlamaBlock(nn.Module):
    def __init__(self, C, H, KV, F_):
        super().__init__()
        self.H, self.KV, self.hs = H, KV, C // H
        self.n1, self.n2 = nn.RMSNorm(C, eps=1e-5), nn.RMSNorm(C, eps=1e-5)
        self.q = nn.Linear(C, C, bias=False)
        self.kv = nn.Linear(C, 2 * KV * self.hs, bias=False)
        self.o = nn.Linear(C, C, bias=False)
        self.gate_up = nn.Linear(C, 2 * F_, bias=False)
        self.down = nn.Linear(F_, C, bias=False)

    def forward(self, x, rope):
        B, T, C = x.shape
        h = self.n1(x)
        q = self.q(h).view(B, T, self.H, self.hs).transpose(1, 2)
        k, v = self.kv(h).view(B, T, 2, self.KV, self.hs).unbind(2)
        k, v = k.transpose(1, 2), v.transpose(1, 2)
        q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.KV != self.H)
        x = x + self.o(y.transpose(1, 2).reshape(B, T, C))
        g, u = self.gate_up(self.n2(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(g) * u)


class Model(nn.Module):
    def __init__(self, family, L, H, KV, C, F_, V, T):
        super().__init__()
        self.family, self.T, self.hs = family, T, C // H
        Vp = pad_vocab(V)
        self.wte = nn.Embedding(Vp, C)
        if family == "gpt2":
            self.wpe = nn.Embedding(T, C)
            self.blocks = nn.ModuleList(GptBlock(C, H, F_) for _ in range(L))
            self.lnf = nn.LayerNorm(C)
            self.head = None  # tied
        else:
            self.blocks = nn.ModuleList(LlamaBlock(C, H, KV, F_) for _ in range(L))
            self.lnf = nn.RMSNorm(C, eps=1e-5)
            self.head = nn.Linear(C, Vp, bias=False)

    def init_weights(self):  # GPT-2's: N(0, 0.02), zero biases (norms keep their ones)
        for mod in self.modules():
            if isinstance(mod, (nn.Linear, nn.Embedding)):
                nn.init.normal_(mod.weight, std=0.02)
                if getattr(mod, "bias", None) is not None:
                    nn.init.zeros_(mod.bias)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx)
        rope = None
        if self.family == "gpt2":
            x = x + self.wpe(torch.arange(T, device=idx.device))
        else:
            rope = rope_tables(T, self.hs, idx.device)
        for b in self.blocks:
            x = b(x, rope)
        x = self.lnf(x)
        w = self.wte.weight if self.head is None else self.head.weight
        logits = x @ w.t()
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))


def params_of(name):
    fam, L, H, KV, C, F_, V = SHAPES[name]
    m = Model(fam, L, H, KV, C, F_, V, 1024)
    n = sum(p.numel() for p in m.parameters())
    n_emb = m.wte.weight.numel() + (m.wpe.weight.numel() if fam == "gpt2" else 0)
    return n, n_emb


def flops_per_token(name, T):
    """Training FLOPs per token, tessera's count (3x model::forward_flops_per_token): 6 times the
    matmul parameters (the layers' weight matrices and the LM head over the real vocabulary; no
    biases, norms or embeddings lookups) plus 12 L C T for the attention scores and values (the
    full T x T, not halved for causality)."""
    fam, L, H, KV, C, F_, V = SHAPES[name]
    hs = C // H
    if fam == "gpt2":
        per_layer = 3 * C * C + C * C + 2 * C * F_
    else:
        per_layer = C * C + 2 * C * KV * hs + C * C + 3 * C * F_
    return 6 * (L * per_layer + C * V) + 12 * L * C * T


def run(name, mode, B, T, steps, peak):
    fam, L, H, KV, C, F_, V = SHAPES[name]
    torch.manual_seed(0)
    model = Model(fam, L, H, KV, C, F_, V, T).cuda()
    model.init_weights()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    step_model = torch.compile(model) if mode == "compile" else model
    gen = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randint(0, V, (B, T), device="cuda", generator=gen)
    y = torch.randint(0, V, (B, T), device="cuda", generator=gen)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = step_model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    t0 = time.time()
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    warm_s = time.time() - t0
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(steps):
        start.record()
        loss = step()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    times.sort()
    med = times[len(times) // 2]
    tok_s = B * T / med
    mfu = tok_s * flops_per_token(name, T) / (peak * 1e12)
    return {
        "impl": f"pytorch-{mode}", "model": name, "B": B, "T": T, "step_ms": med * 1e3,
        "tokens_per_s": tok_s, "mfu": mfu, "loss": float(loss), "warmup_s": warm_s,
        "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30,
        "params": params_of(name)[0], "flops_per_token": flops_per_token(name, T),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="gpt2-124m,gpt2-350m,llama-160m")
    ap.add_argument("--modes", default="eager,compile")
    ap.add_argument("--T", type=int, default=1024)
    ap.add_argument("--batches", default="64,32,16,8", help="tried largest first; the first that fits")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--peak", type=float, default=989.4, help="dense bf16 TFLOP/s (H100 SXM)")
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = True
    print(f"# torch {torch.__version__}, {torch.cuda.get_device_name()}", flush=True)
    rows = []
    for name in a.models.split(","):
        for mode in a.modes.split(","):
            for B in (int(b) for b in a.batches.split(",")):
                try:
                    r = run(name, mode, B, a.T, a.steps, a.peak)
                except torch.OutOfMemoryError:
                    torch.cuda.empty_cache()
                    print(f"# {name} {mode} B={B}: out of memory", flush=True)
                    continue
                finally:
                    torch._dynamo.reset()
                    torch.cuda.empty_cache()
                    torch.cuda.reset_peak_memory_stats()
                rows.append(r)
                print(json.dumps(r), flush=True)
                break
    print(f"{'impl':18} {'model':11} {'B':>3} {'ms/step':>8} {'tok/s':>9} {'MFU':>6} {'GiB':>5}")
    for r in rows:
        print(f"{r['impl']:18} {r['model']:11} {r['B']:3d} {r['step_ms']:8.1f} "
              f"{r['tokens_per_s']:9.0f} {100 * r['mfu']:5.1f}% {r['peak_mem_gib']:5.1f}")


if __name__ == "__main__":
    sys.exit(main())
