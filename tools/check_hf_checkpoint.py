#!/usr/bin/env python3
"""Loads a checkpoint tessera wrote (config.json + model.safetensors) into Hugging Face
transformers (LlamaForCausalLM or GPT2LMHeadModel, by its model_type) and checks that it is the
same model: the greedy continuation of a prompt (token ids) equals the ids tessera's KV-cache
decoder produced, and it prints the mean next-token loss over the prompt and continuation.

    P=$(printf 'The jury said' | build/tessera tokenize)
    E=$(build/tessera sample --model runs/demo-llama --ids --temperature 0 --tokens 20 \
        --prompt 'The jury said')
    .venv-llama/bin/python tools/check_hf_checkpoint.py --model runs/demo-llama \
        --prompt "$P" --expect "$P $E"

(.venv-llama: tools/requirements-llama.txt.) Exit code 0 when the continuations agree.
"""
import argparse
import json
import os
import sys

import torch
import transformers


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, help="a run directory or checkpoint directory")
    ap.add_argument("--prompt", required=True, help="prompt token ids, separated by spaces")
    ap.add_argument("--expect", required=True,
                    help="tessera's ids: the prompt followed by its greedy continuation")
    a = ap.parse_args()
    d = a.model
    if not os.path.exists(os.path.join(d, "config.json")):  # a run directory: newest checkpoint
        ck = os.path.join(d, "checkpoints")
        d = os.path.join(ck, sorted(x for x in os.listdir(ck) if x.startswith("step_"))[-1])
    cfg = json.load(open(os.path.join(d, "config.json")))
    cls = {"llama": transformers.LlamaForCausalLM,
           "gpt2": transformers.GPT2LMHeadModel}[cfg["model_type"]]
    torch.set_num_threads(1)
    model = cls.from_pretrained(d, torch_dtype=torch.float32, attn_implementation="eager").eval()
    prompt = [int(x) for x in a.prompt.split()]
    expect = [int(x) for x in a.expect.split()]
    n_new = len(expect) - len(prompt)
    if n_new <= 0 or expect[:len(prompt)] != prompt:
        sys.exit("--expect must start with the prompt ids and continue them")
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=n_new, do_sample=False,
                             pad_token_id=0)[0].tolist()
        ids = torch.tensor([expect])
        loss = torch.nn.functional.cross_entropy(model(ids).logits[0, :-1], ids[0, 1:]).item()
    print(f"{d}: {cfg['model_type']}, {sum(p.numel() for p in model.parameters())} parameters")
    print(f"Hugging Face greedy: {' '.join(map(str, out))}")
    print(f"tessera greedy:      {' '.join(map(str, expect))}")
    print(f"mean next-token loss over the sequence (Hugging Face): {loss:.6f}")
    same = out == expect
    print("continuations agree" if same else "continuations DIFFER")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
