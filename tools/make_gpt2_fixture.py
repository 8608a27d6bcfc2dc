#!/usr/bin/python3
"""Generate the tiny GPT-2 reference fixture in tests/fixtures/gpt2_tiny/.

Run with Debian's PyTorch (CPU, torch 1.13):

    /usr/bin/python3 tools/make_gpt2_fixture.py [--out tests/fixtures/gpt2_tiny]

The model is written out by hand so that it matches Hugging Face
GPT2LMHeadModel exactly (Conv1D weights stored (in, out), tied LM head,
gelu_new, LayerNorm eps 1e-5). No transformers / safetensors packages are
needed; safetensors files are written and read back by hand.

Outputs:
  model.safetensors     initial weights, official openai-community/gpt2 key
                        names (no "transformer." prefix), plus the legacy
                        "h.{i}.attn.bias" causal-mask buffer.
  config.json           HF GPT2Config-style config.
  expected.safetensors  tokens, logits, loss, grad.<name>, adamw_losses,
                        final.<name> (after 10 AdamW steps on the same batch).
"""

import argparse
import json
import math
import os
import sys

import torch

from safetensors_io import check_roundtrip, write_expected, write_safetensors

# ----------------------------------------------------------------------------
# Configuration
# ----------------------------------------------------------------------------
N_LAYER = 2
N_HEAD = 4
N_EMBD = 32
N_POSITIONS = 16
VOCAB = 100  # deliberately not a multiple of 128
B = 2
T = 8  # < N_POSITIONS on purpose
SEED = 1234
LN_EPS = 1e-5

LR = 1e-3
BETA1 = 0.9
BETA2 = 0.95
ADAM_EPS = 1e-8
WEIGHT_DECAY = 0.1
STEPS = 10


def param_shapes():
    """Parameter names (HF layout) -> shape, in model definition order."""
    C, V, P = N_EMBD, VOCAB, N_POSITIONS
    shapes = {"wte.weight": (V, C), "wpe.weight": (P, C)}
    for i in range(N_LAYER):
        h = f"h.{i}."
        shapes[h + "ln_1.weight"] = (C,)
        shapes[h + "ln_1.bias"] = (C,)
        shapes[h + "attn.c_attn.weight"] = (C, 3 * C)
        shapes[h + "attn.c_attn.bias"] = (3 * C,)
        shapes[h + "attn.c_proj.weight"] = (C, C)
        shapes[h + "attn.c_proj.bias"] = (C,)
        shapes[h + "ln_2.weight"] = (C,)
        shapes[h + "ln_2.bias"] = (C,)
        shapes[h + "mlp.c_fc.weight"] = (C, 4 * C)
        shapes[h + "mlp.c_fc.bias"] = (4 * C,)
        shapes[h + "mlp.c_proj.weight"] = (4 * C, C)
        shapes[h + "mlp.c_proj.bias"] = (C,)
    shapes["ln_f.weight"] = (C,)
    shapes["ln_f.bias"] = (C,)
    return shapes


def init_params():
    """Deterministic non-trivial init (float32). Consumes the global RNG."""
    params = {}
    for name, shape in param_shapes().items():
        leaf = name.rsplit(".", 1)[0].rsplit(".", 1)[-1]
        is_ln = leaf.startswith("ln_")
        if is_ln and name.endswith(".weight"):
            t = 1.0 + torch.randn(shape, dtype=torch.float32) * 0.1
        else:
            # weights, embeddings, biases and LayerNorm biases: N(0, 0.02)
            t = torch.randn(shape, dtype=torch.float32) * 0.02
        params[name] = t
    return params


# ----------------------------------------------------------------------------
# Model (hand-written GPT-2, HF semantics)
# ----------------------------------------------------------------------------
def gelu_new(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def layer_norm(x, w, b):
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b, LN_EPS)


def attention(x, p, h):
    Bx, Tx, C = x.shape
    hs = C // N_HEAD
    qkv = x @ p[h + "attn.c_attn.weight"] + p[h + "attn.c_attn.bias"]  # (B,T,3C)
    q, k, v = qkv.split(C, dim=2)
    q = q.view(Bx, Tx, N_HEAD, hs).transpose(1, 2)  # (B,H,T,hs)
    k = k.view(Bx, Tx, N_HEAD, hs).transpose(1, 2)
    v = v.view(Bx, Tx, N_HEAD, hs).transpose(1, 2)
    att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
    causal = torch.tril(torch.ones(Tx, Tx, dtype=torch.bool))
    att = att.masked_fill(~causal, float("-inf"))
    att = torch.softmax(att, dim=-1)
    y = att @ v  # (B,H,T,hs)
    y = y.transpose(1, 2).contiguous().view(Bx, Tx, C)
    return y @ p[h + "attn.c_proj.weight"] + p[h + "attn.c_proj.bias"]


def mlp(x, p, h):
    x = x @ p[h + "mlp.c_fc.weight"] + p[h + "mlp.c_fc.bias"]
    x = gelu_new(x)
    return x @ p[h + "mlp.c_proj.weight"] + p[h + "mlp.c_proj.bias"]


def forward(p, inputs, targets):
    Bx, Tx = inputs.shape
    pos = torch.arange(Tx)
    x = p["wte.weight"][inputs] + p["wpe.weight"][pos][None, :, :]
    for i in range(N_LAYER):
        h = f"h.{i}."
        x = x + attention(layer_norm(x, p[h + "ln_1.weight"], p[h + "ln_1.bias"]), p, h)
        x = x + mlp(layer_norm(x, p[h + "ln_2.weight"], p[h + "ln_2.bias"]), p, h)
    x = layer_norm(x, p["ln_f.weight"], p["ln_f.bias"])
    logits = x @ p["wte.weight"].t()  # tied LM head
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    return logits, loss


def run_reference(init, inputs, targets, dtype):
    """Forward/backward at init, then STEPS AdamW steps. Returns a dict."""
    params = {k: v.detach().clone().to(dtype).requires_grad_(True) for k, v in init.items()}
    names = list(params.keys())

    logits, loss = forward(params, inputs, targets)
    loss.backward()
    out = {
        "logits": logits.detach().clone(),
        "loss": loss.detach().clone(),
        "grads": {k: params[k].grad.detach().clone() for k in names},
    }

    # Fresh copy for the optimizer run (grads zeroed).
    params = {k: v.detach().clone().to(dtype).requires_grad_(True) for k, v in init.items()}
    decay = [params[k] for k in names if params[k].dim() >= 2]
    no_decay = [params[k] for k in names if params[k].dim() < 2]
    opt = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": WEIGHT_DECAY},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=LR,
        betas=(BETA1, BETA2),
        eps=ADAM_EPS,
        foreach=False,
    )
    losses = []
    for _ in range(STEPS):
        opt.zero_grad(set_to_none=True)
        _, l = forward(params, inputs, targets)
        losses.append(l.item())
        l.backward()
        opt.step()
    out["adamw_losses"] = torch.tensor(losses, dtype=dtype)
    out["final"] = {k: params[k].detach().clone() for k in names}
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--out", default=os.path.join(repo, "tests", "fixtures", "gpt2_tiny"))
    ap.add_argument("--n-head", type=int, default=N_HEAD,
                    help="heads (gpt2_tiny_hs32, for the GPU's bf16 attention: --n-head 2 --n-embd 64)")
    ap.add_argument("--n-embd", type=int, default=N_EMBD)
    args = ap.parse_args()
    globals().update(N_HEAD=args.n_head, N_EMBD=args.n_embd)
    os.makedirs(args.out, exist_ok=True)

    torch.set_num_threads(1)  # reproducible reductions
    torch.manual_seed(SEED)
    init = init_params()
    tokens = torch.randint(0, VOCAB, (B, T + 1), dtype=torch.int64)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]

    r32 = run_reference(init, inputs, targets, torch.float32)
    r64 = run_reference(init, inputs, targets, torch.float64)
    assert abs(r32["adamw_losses"][0].item() - r32["loss"].item()) == 0.0

    # ---- model.safetensors
    model = dict(init)
    mask = torch.tril(torch.ones(N_POSITIONS, N_POSITIONS, dtype=torch.float32)).view(1, 1, N_POSITIONS, N_POSITIONS)
    for i in range(N_LAYER):
        model[f"h.{i}.attn.bias"] = mask.clone()
    model_meta = {"format": "pt"}
    mpath = os.path.join(args.out, "model.safetensors")
    write_safetensors(mpath, model, model_meta)
    check_roundtrip(mpath, model, model_meta)

    # ---- config.json
    config = {
        "model_type": "gpt2",
        "n_layer": N_LAYER,
        "n_head": N_HEAD,
        "n_embd": N_EMBD,
        "n_positions": N_POSITIONS,
        "n_ctx": N_POSITIONS,
        "vocab_size": VOCAB,
        "layer_norm_epsilon": LN_EPS,
        "activation_function": "gelu_new",
        "architectures": ["GPT2LMHeadModel"],
    }
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")

    # ---- expected.safetensors
    exp = write_expected(args.out, tokens, r32, list(init), [("lr", repr(LR)), ("beta1", repr(BETA1)), ("beta2", repr(BETA2)), ("eps", repr(ADAM_EPS)), ("weight_decay", repr(WEIGHT_DECAY)), ("steps", str(STEPS)), ("B", str(B)), ("T", str(T)), ("seed", str(SEED))])

    # ---- float32 vs float64 noise levels
    def maxdiff(a, b):
        return (a.double() - b.double()).abs().max().item()

    def maxrel(a, b):
        return ((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-30)).item()

    names = list(init)
    grad_abs = max(maxdiff(r32["grads"][k], r64["grads"][k]) for k in names)
    grad_rel = max(maxrel(r32["grads"][k], r64["grads"][k]) for k in names)
    final_abs = max(maxdiff(r32["final"][k], r64["final"][k]) for k in names)

    print(f"wrote {args.out}")
    for fn in ("model.safetensors", "config.json", "expected.safetensors"):
        print(f"  {fn}: {os.path.getsize(os.path.join(args.out, fn))} bytes")
    print("expected.safetensors keys:")
    for k in sorted(exp):
        print(f"  {k} {exp[k].dtype} {list(exp[k].shape)}")
    print(f"loss (f32)                         = {r32['loss'].item():.9f}  (ln V = {math.log(VOCAB):.6f})")
    print(f"adamw_losses (f32)                 = {[round(x, 6) for x in r32['adamw_losses'].tolist()]}")
    print("f32 vs f64 noise levels:")
    print(f"  |loss32 - loss64|                = {abs(r32['loss'].double().item() - r64['loss'].item()):.3e}")
    print(f"  max |logits32 - logits64|        = {maxdiff(r32['logits'], r64['logits']):.3e}")
    print(f"  max |grad32 - grad64| (abs)      = {grad_abs:.3e}")
    print(f"  max grad rel-to-max-abs err      = {grad_rel:.3e}")
    print(f"  max |adamw_losses32 - 64|        = {maxdiff(r32['adamw_losses'], r64['adamw_losses']):.3e}")
    print(f"  max |final32 - final64|          = {final_abs:.3e}")
    # The key slice of c_attn.bias, [C:2C], has an analytically ZERO gradient
    # (it adds q.b_k, a per-row constant, to every attention score; softmax is
    # shift-invariant). Its f32 gradient is pure round-off, which AdamW
    # normalises into tiny noise-driven updates (bounded by ~lr*|g|/eps per step).
    C = N_EMBD
    kb = [f"h.{i}.attn.c_attn.bias" for i in range(N_LAYER)]
    kb_grad32 = max(r32["grads"][k][C : 2 * C].abs().max().item() for k in kb)
    kb_final = max(maxdiff(r32["final"][k][C : 2 * C], init[k][C : 2 * C]) for k in kb)
    rest = [
        maxdiff(r32["final"][k], r64["final"][k]) for k in names if k not in kb
    ] + [
        maxdiff(torch.cat([r32["final"][k][:C], r32["final"][k][2 * C :]]), torch.cat([r64["final"][k][:C], r64["final"][k][2 * C :]]))
        for k in kb
    ]
    print(f"  max |final32 - final64| excluding c_attn.bias[C:2C] = {max(rest):.3e}")
    print(f"  c_attn.bias[C:2C]: max |grad32| = {kb_grad32:.3e} (exact value 0), max |final32 - init| = {kb_final:.3e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
