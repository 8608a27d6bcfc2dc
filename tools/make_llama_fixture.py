#!/usr/bin/env python3
"""Generate the tiny Llama reference fixtures tests/fixtures/llama_tiny{,_tied}/.

The reference is Hugging Face transformers' LlamaForCausalLM (eager attention,
float32, CPU, one thread). Made with Debian's PyTorch 1.13 (python3-torch
1.13.1+dfsg-4, torch.__version__ "1.13.0a0") and transformers 4.45.2, in a
virtual environment that sees the system site packages:

    apt-get install python3-torch python3-venv
    /usr/bin/python3 -m venv --system-site-packages .venv-llama
    .venv-llama/bin/pip install -r tools/requirements-llama.txt
    .venv-llama/bin/python tools/make_llama_fixture.py   # writes both fixtures

Options: --variant {untied,tied,both} (default both), --out-root DIR (default
tests/fixtures; the fixtures go to DIR/llama_tiny and DIR/llama_tiny_tied).

Outputs (per fixture, same scheme as tools/make_gpt2_fixture.py):
  config.json           HF LlamaConfig (sorted keys, indent 2).
  model.safetensors     initial weights, F32, official HF LlamaForCausalLM key
                        names, torch (out, in) layout; "lm_head.weight" only
                        when the head is untied; no rotary inv_freq buffer.
  expected.safetensors  tokens, logits, loss, grad.<name>, adamw_losses,
                        final.<name> (after 10 AdamW steps on the same batch).

Checks done on every run: the safetensors files are read back (by hand and
through transformers' from_pretrained, which must reproduce the logits
bit for bit), and the HF logits must equal a hand-written reference forward
(plain torch ops: RMSNorm, rotate-half RoPE, GQA, causal softmax, SwiGLU)
to 1e-5. Running the script twice gives byte-identical files.
"""

import argparse
import json
import math
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # from_pretrained reads a local directory only
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import transformers  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from safetensors_io import check_roundtrip, write_expected, write_safetensors  # noqa: E402

transformers.logging.set_verbosity_error()

# ----------------------------------------------------------------------------
# Configuration
# ----------------------------------------------------------------------------
VOCAB = 100  # deliberately not a multiple of 128
HIDDEN = 32
N_HEAD = 4
N_KV_HEAD = 2  # grouped-query attention: 2 query heads per kv head
HEAD_DIM = 8
INTERMEDIATE = 48  # deliberately not 4 * HIDDEN
N_LAYER = 2
MAX_POS = 16
RMS_EPS = 1e-5
ROPE_THETA = 10000.0
B = 2
T = 8  # < MAX_POS on purpose
SEED = 1234

LR = 1e-3
BETA1 = 0.9
BETA2 = 0.95
ADAM_EPS = 1e-8
WEIGHT_DECAY = 0.1
STEPS = 10

VARIANTS = {"untied": ("llama_tiny", False), "tied": ("llama_tiny_tied", True)}


def param_shapes():
    """All parameter names (HF layout) -> shape, in the fixed draw order.

    Order: embed_tokens; per layer input_layernorm, q/k/v/o_proj,
    post_attention_layernorm, gate/up/down_proj; norm; lm_head (always drawn
    last, also for the tied variant, where it is then discarded, so both
    fixtures share the tokens and every other initial weight).
    """
    C, V, I = HIDDEN, VOCAB, INTERMEDIATE
    q_out, kv_out = N_HEAD * HEAD_DIM, N_KV_HEAD * HEAD_DIM
    shapes = {"model.embed_tokens.weight": (V, C)}
    for i in range(N_LAYER):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = (C,)
        shapes[p + "self_attn.q_proj.weight"] = (q_out, C)
        shapes[p + "self_attn.k_proj.weight"] = (kv_out, C)
        shapes[p + "self_attn.v_proj.weight"] = (kv_out, C)
        shapes[p + "self_attn.o_proj.weight"] = (C, q_out)
        shapes[p + "post_attention_layernorm.weight"] = (C,)
        shapes[p + "mlp.gate_proj.weight"] = (I, C)
        shapes[p + "mlp.up_proj.weight"] = (I, C)
        shapes[p + "mlp.down_proj.weight"] = (C, I)
    shapes["model.norm.weight"] = (C,)
    shapes["lm_head.weight"] = (V, C)
    return shapes


def init_params():
    """Deterministic non-trivial init (float32). Consumes the global RNG.

    Matrices and embeddings N(0, 0.02); RMSNorm weights 1 + N(0, 0.1).
    """
    params = {}
    for name, shape in param_shapes().items():
        if len(shape) == 1:  # RMSNorm weights (the only 1-D parameters)
            params[name] = 1.0 + torch.randn(shape, dtype=torch.float32) * 0.1
        else:
            params[name] = torch.randn(shape, dtype=torch.float32) * 0.02
    return params


def hf_config(tied):
    return LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=N_LAYER,
        num_attention_heads=N_HEAD,
        num_key_value_heads=N_KV_HEAD,
        head_dim=HEAD_DIM,
        max_position_embeddings=MAX_POS,
        rms_norm_eps=RMS_EPS,
        rope_theta=ROPE_THETA,
        hidden_act="silu",
        attention_bias=False,
        attention_dropout=0.0,
        mlp_bias=False,
        tie_word_embeddings=tied,
        torch_dtype="float32",
        attn_implementation="eager",
    )


def config_json(tied):
    """The config.json dict: the usual keys of a HF Llama checkpoint config."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "max_position_embeddings": MAX_POS,
        "mlp_bias": False,
        "model_type": "llama",
        "num_attention_heads": N_HEAD,
        "num_hidden_layers": N_LAYER,
        "num_key_value_heads": N_KV_HEAD,
        "rms_norm_eps": RMS_EPS,
        "rope_theta": ROPE_THETA,
        "tie_word_embeddings": tied,
        "torch_dtype": "float32",
        "transformers_version": transformers.__version__,
        "vocab_size": VOCAB,
    }


# ----------------------------------------------------------------------------
# Models: HF LlamaForCausalLM, and a hand-written reference in plain torch ops
# ----------------------------------------------------------------------------
class HFModel:
    """LlamaForCausalLM holding the given weights; params() in HF order."""

    def __init__(self, params, tied, dtype):
        with torch.random.fork_rng():  # HF's own init must not touch our RNG stream
            self.model = LlamaForCausalLM(hf_config(tied))
        self.model.to(dtype)
        self.model.train()  # no dropout anywhere (attention_dropout 0)
        named = dict(self.model.named_parameters())  # tied head is deduplicated away
        assert set(named) == set(params), set(named) ^ set(params)
        with torch.no_grad():
            for k, v in params.items():
                named[k].copy_(v.to(dtype))
        if tied:
            assert self.model.lm_head.weight is self.model.model.embed_tokens.weight
        self.named = named

    def params(self):
        return self.named

    def logits(self, inputs):
        return self.model(input_ids=inputs, use_cache=False).logits


class RefModel:
    """Hand-written Llama forward: exactly the math tessera must implement."""

    def __init__(self, params, tied, dtype):
        self.tied = tied
        self.named = {k: v.detach().clone().to(dtype).requires_grad_(True) for k, v in params.items()}

    def params(self):
        return self.named

    def logits(self, inputs):
        p = self.named
        Bx, Tx = inputs.shape
        dt = p["model.norm.weight"].dtype
        H, KV, D = N_HEAD, N_KV_HEAD, HEAD_DIM

        def rms_norm(x, w):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + RMS_EPS) * w

        # RoPE, rotate-half (GPT-NeoX) pairing: dim j rotates with dim j + D/2,
        # angle = pos * theta^(-2j/D), j < D/2, positions 0..T-1.
        j = torch.arange(0, D, 2, dtype=torch.float64)
        inv_freq = 1.0 / (ROPE_THETA ** (j / D))  # (D/2,)
        ang = torch.arange(Tx, dtype=torch.float64)[:, None] * inv_freq[None, :]  # (T, D/2)
        ang = torch.cat([ang, ang], dim=-1)  # (T, D)
        cos, sin = ang.cos().to(dt), ang.sin().to(dt)

        def rope(x):  # (B, heads, T, D)
            x1, x2 = x[..., : D // 2], x[..., D // 2 :]
            return x * cos + torch.cat([-x2, x1], dim=-1) * sin

        causal = torch.tril(torch.ones(Tx, Tx, dtype=torch.bool))
        x = p["model.embed_tokens.weight"][inputs]  # (B, T, C)
        for i in range(N_LAYER):
            q_ = f"model.layers.{i}."
            h = rms_norm(x, p[q_ + "input_layernorm.weight"])
            # projections: y = x @ W^T with W stored (out, in); head-major output
            q = (h @ p[q_ + "self_attn.q_proj.weight"].t()).view(Bx, Tx, H, D).transpose(1, 2)
            k = (h @ p[q_ + "self_attn.k_proj.weight"].t()).view(Bx, Tx, KV, D).transpose(1, 2)
            v = (h @ p[q_ + "self_attn.v_proj.weight"].t()).view(Bx, Tx, KV, D).transpose(1, 2)
            q, k = rope(q), rope(k)
            # GQA: query head hq uses kv head hq // (H / KV)
            k = k.repeat_interleave(H // KV, dim=1)
            v = v.repeat_interleave(H // KV, dim=1)
            att = (q @ k.transpose(-2, -1)) / math.sqrt(D)
            att = att.masked_fill(~causal, float("-inf")).softmax(dim=-1)
            y = (att @ v).transpose(1, 2).reshape(Bx, Tx, H * D)
            x = x + y @ p[q_ + "self_attn.o_proj.weight"].t()
            h = rms_norm(x, p[q_ + "post_attention_layernorm.weight"])
            g = h @ p[q_ + "mlp.gate_proj.weight"].t()
            u = h @ p[q_ + "mlp.up_proj.weight"].t()
            x = x + (F.silu(g) * u) @ p[q_ + "mlp.down_proj.weight"].t()
        x = rms_norm(x, p["model.norm.weight"])
        head = p["model.embed_tokens.weight"] if self.tied else p["lm_head.weight"]
        return x @ head.t()


def ce_loss(logits, targets):
    """Mean cross-entropy over all B*T positions (no label shifting)."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def run_reference(cls, params, tied, inputs, targets, dtype):
    """Forward/backward at init, then STEPS AdamW steps. Returns a dict."""
    m = cls(params, tied, dtype)
    logits = m.logits(inputs)
    loss = ce_loss(logits, targets)
    loss.backward()
    names = list(params)
    out = {
        "logits": logits.detach().clone(),
        "loss": loss.detach().clone(),
        "grads": {k: m.params()[k].grad.detach().clone() for k in names},
    }

    m = cls(params, tied, dtype)  # fresh copy for the optimizer run
    ps = m.params()
    decay = [ps[k] for k in names if ps[k].dim() >= 2]
    no_decay = [ps[k] for k in names if ps[k].dim() < 2]
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
        l = ce_loss(m.logits(inputs), targets)
        losses.append(l.item())
        l.backward()
        opt.step()
    out["adamw_losses"] = torch.tensor(losses, dtype=dtype)
    out["final"] = {k: ps[k].detach().clone() for k in names}
    return out


def maxdiff(a, b):
    return (a.double() - b.double()).abs().max().item()


def maxrel(a, b):
    return ((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-30)).item()


def make_fixture(out, tied, all_params, tokens):
    os.makedirs(out, exist_ok=True)
    params = {k: v for k, v in all_params.items() if not (tied and k == "lm_head.weight")}
    names = list(params)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]

    hf32 = run_reference(HFModel, params, tied, inputs, targets, torch.float32)
    ref32 = run_reference(RefModel, params, tied, inputs, targets, torch.float32)
    ref64 = run_reference(RefModel, params, tied, inputs, targets, torch.float64)
    assert hf32["adamw_losses"][0].item() == hf32["loss"].item()

    # ---- model.safetensors
    model_meta = {"format": "pt"}
    mpath = os.path.join(out, "model.safetensors")
    write_safetensors(mpath, params, model_meta)
    check_roundtrip(mpath, params, model_meta)

    # ---- config.json
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config_json(tied), f, indent=2, sort_keys=True)
        f.write("\n")

    # ---- expected.safetensors
    exp = write_expected(out, tokens, hf32, names, [("lr", repr(LR)), ("beta1", repr(BETA1)), ("beta2", repr(BETA2)), ("eps", repr(ADAM_EPS)), ("weight_decay", repr(WEIGHT_DECAY)), ("steps", str(STEPS)), ("B", str(B)), ("T", str(T)), ("seed", str(SEED))])

    # ---- the written checkpoint loads in transformers and gives the same logits
    loaded = LlamaForCausalLM.from_pretrained(out, attn_implementation="eager", torch_dtype=torch.float32)
    assert loaded.config.tie_word_embeddings == tied and loaded.config.head_dim == HEAD_DIM
    assert (loaded.lm_head.weight is loaded.model.embed_tokens.weight) == tied
    with torch.no_grad():
        loaded_logits = loaded(input_ids=inputs, use_cache=False).logits
    hf_reload = maxdiff(loaded_logits, hf32["logits"])
    assert torch.equal(loaded_logits, hf32["logits"]), hf_reload

    # ---- sanity: HF == hand-written reference forward
    ref_logits = maxdiff(hf32["logits"], ref32["logits"])
    assert ref_logits <= 1e-5, ref_logits
    ref_grad = max(maxdiff(hf32["grads"][k], ref32["grads"][k]) for k in names)
    ref_final = max(maxdiff(hf32["final"][k], ref32["final"][k]) for k in names)

    name = os.path.basename(os.path.normpath(out))
    print(f"wrote {out}  (tie_word_embeddings={tied})")
    for fn in ("config.json", "model.safetensors", "expected.safetensors"):
        print(f"  {fn}: {os.path.getsize(os.path.join(out, fn))} bytes")
    print("expected.safetensors keys:")
    for k in sorted(exp):
        print(f"  {k} {exp[k].dtype} {list(exp[k].shape)}")
    print(f"[{name}] loss (f32)                    = {hf32['loss'].item():.9f}  (ln V = {math.log(VOCAB):.6f})")
    print(f"[{name}] adamw_losses (f32)            = {[round(x, 6) for x in hf32['adamw_losses'].tolist()]}")
    print(f"[{name}] from_pretrained(out) logits == HF logits: max diff {hf_reload:.3e}")
    print(f"[{name}] HF vs hand-written reference (both f32):")
    print(f"  max |logits_hf - logits_ref|     = {ref_logits:.3e}  (must be <= 1e-5)")
    print(f"  |loss_hf - loss_ref|             = {abs(hf32['loss'].item() - ref32['loss'].item()):.3e}")
    print(f"  max |grad_hf - grad_ref|         = {ref_grad:.3e}")
    print(f"  max |adamw_losses_hf - ref|      = {maxdiff(hf32['adamw_losses'], ref32['adamw_losses']):.3e}")
    print(f"  max |final_hf - final_ref|       = {ref_final:.3e}")
    print(f"[{name}] f32 (HF) vs f64 (hand-written reference) noise levels:")
    print(f"  |loss32 - loss64|                = {abs(hf32['loss'].double().item() - ref64['loss'].item()):.3e}")
    print(f"  max |logits32 - logits64|        = {maxdiff(hf32['logits'], ref64['logits']):.3e}")
    print(f"  max |grad32 - grad64| (abs)      = {max(maxdiff(hf32['grads'][k], ref64['grads'][k]) for k in names):.3e}")
    print(f"  max grad rel-to-max-abs err      = {max(maxrel(hf32['grads'][k], ref64['grads'][k]) for k in names):.3e}")
    print(f"  max |adamw_losses32 - 64|        = {maxdiff(hf32['adamw_losses'], ref64['adamw_losses']):.3e}")
    print(f"  max |final32 - final64|          = {max(maxdiff(hf32['final'][k], ref64['final'][k]) for k in names):.3e}")
    gmin = min(hf32["grads"][k].abs().max().item() for k in names)
    print(f"  smallest max|grad| over parameters = {gmin:.3e} (every gradient non-trivial)")
    assert gmin > 1e-6, gmin


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--out-root", default=os.path.join(repo, "tests", "fixtures"),
                    help="parent directory of llama_tiny/ and llama_tiny_tied/ (default tests/fixtures)")
    ap.add_argument("--variant", choices=["untied", "tied", "both"], default="both")
    args = ap.parse_args()

    print(f"torch {torch.__version__}, transformers {transformers.__version__}, numpy {np.__version__}")
    torch.set_num_threads(1)  # reproducible reductions
    torch.manual_seed(SEED)
    all_params = init_params()  # draw order: param_shapes(), lm_head always drawn
    tokens = torch.randint(0, VOCAB, (B, T + 1), dtype=torch.int64)

    for v in (["untied", "tied"] if args.variant == "both" else [args.variant]):
        dirname, tied = VARIANTS[v]
        make_fixture(os.path.join(args.out_root, dirname), tied, all_params, tokens)
    return 0


if __name__ == "__main__":
    sys.exit(main())
