#!/usr/bin/env python3
"""PyTorch's causal attention kernels (scaled_dot_product_attention with each backend) at the
shape bench_gpu_attention times, for the side-by-side table in docs/performance.md. Median
milliseconds (triton.testing.do_bench) and TFLOP/s with the same causal FLOP count (forward 2
matmuls of B NH T^2 hs / 2 multiply-adds, backward 5). Not part of the product.

    python3 bench/gpu/torch_attention.py [--B 8] [--T 1024] [--NH 12] [--hs 64]
"""
import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench


def main():
    ap = argparse.ArgumentParser()
    for k, v in (("B", 8), ("T", 1024), ("NH", 12), ("hs", 64)):
        ap.add_argument(f"--{k}", type=int, default=v)
    a = ap.parse_args()
    q, k, v = (torch.randn(a.B, a.NH, a.T, a.hs, device="cuda", dtype=torch.bfloat16,
                           requires_grad=True) for _ in range(3))
    fwd_flop = 2 * 2 * a.B * a.NH * a.T * a.T * a.hs / 2
    print(f"# torch {torch.__version__}, {torch.cuda.get_device_name()}, B={a.B} T={a.T} "
          f"NH={a.NH} hs={a.hs}")
    for name, backend in (("flash", SDPBackend.FLASH_ATTENTION),
                          ("cudnn", SDPBackend.CUDNN_ATTENTION),
                          ("efficient", SDPBackend.EFFICIENT_ATTENTION)):
        try:
            with sdpa_kernel(backend):
                o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                g = torch.randn_like(o)
                tf = do_bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                              return_mode="median")
                tb = do_bench(lambda: torch.autograd.grad(
                    F.scaled_dot_product_attention(q, k, v, is_causal=True), (q, k, v), g),
                    return_mode="median") - tf
            print(f"torch sdpa {name:9s} forward {tf:7.3f} ms {fwd_flop / tf / 1e9:6.1f} TFLOP/s   "
                  f"backward {tb:7.3f} ms {2.5 * fwd_flop / tb / 1e9:6.1f} TFLOP/s")
        except Exception as e:  # a backend may not support this GPU or shape
            print(f"torch sdpa {name}: unavailable ({str(e).splitlines()[0][:80]})")


if __name__ == "__main__":
    main()
