#!/usr/bin/env python3
"""Reference logits of SmolLM2-135M from Hugging Face transformers, for the unit test that runs
tessera on the same weights (GgufSmolLM2.LogitsMatchTransformers).

The weights are the ones tessera runs: the GGUF file (Q4_1) dequantized by tessera and written
as a Hugging Face checkpoint (`tessera convert`), loaded into transformers' LlamaForCausalLM in
fp32 with eager attention. For each prompt (token ids from `tessera tokenize --tokenizer
smollm2-135m`) the fixture holds, at every position, the argmax, the max logit and the
log-sum-exp of the logits, and at the last position the 10 largest logits.

    build/tessera convert --model smollm2-135m --out /tmp/smollm2-hf
    .venv-llama/bin/python tools/make_smollm2_logits.py --model /tmp/smollm2-hf \
        --tessera build/tessera --out tests/fixtures/smollm2_logits.json

(.venv-llama: tools/requirements-llama.txt; transformers 4.45.2, torch 1.13 from Debian.)
"""
import argparse
import json
import subprocess
import sys

import torch
import transformers

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "Once upon a time, in a small village at the edge of the forest, there lived",
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--tessera", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    torch.set_num_threads(1)
    model = transformers.LlamaForCausalLM.from_pretrained(
        a.model, torch_dtype=torch.float32, attn_implementation="eager").eval()
    out = {"model": "SmolLM2-135M-Instruct Q4_1 (GGUF), dequantized by tessera",
           "transformers": transformers.__version__, "torch": torch.__version__, "prompts": []}
    for text in PROMPTS:
        ids = [int(x) for x in subprocess.run(
            [a.tessera, "tokenize", "--tokenizer", "smollm2-135m"], input=text.encode(),
            capture_output=True, check=True).stdout.split()]
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0].double()
        top = torch.topk(logits[-1], 10)
        out["prompts"].append({
            "text": text,
            "ids": ids,
            "argmax": logits.argmax(-1).tolist(),
            "max": logits.max(-1).values.tolist(),
            "logsumexp": torch.logsumexp(logits, -1).tolist(),
            "top10_ids": top.indices.tolist(),
            "top10_logits": top.values.tolist(),
        })
        print(f"{text!r}: {len(ids)} tokens, next {top.indices[0].item()} "
              f"({top.values[0].item():.4f})")
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
