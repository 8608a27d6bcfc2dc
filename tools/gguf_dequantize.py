#!/usr/bin/env python3
"""Dequantizes every tensor of a GGUF file with gguf-py (the `gguf` package from PyPI, the
reference decoder of llama.cpp's formats) into a safetensors file of F32 tensors under their GGUF
names, each in the shape gguf-py gives it (rows, columns for a matrix), and prints the file's
tessera.* metadata as one JSON object. tessera's tests compare the values with those tessera
computed (tests/cli/test_convert_cli.cpp).

Usage: .venv-oracle/bin/python tools/gguf_dequantize.py FILE.gguf OUT.safetensors
(scripts/setup --with-oracle installs tools/requirements-gguf.txt into .venv-oracle.)
Exit status 0: written; 2: bad input.
"""
import json
import sys

import gguf

from gguf_fixture import write_safetensors  # F32 tensors, written by hand


def field_value(field):
    if field.types and field.types[0] == gguf.GGUFValueType.STRING:
        return bytes(field.parts[field.data[0]]).decode("utf-8")
    return field.parts[field.data[0]].tolist()[0]


def main(argv):
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        reader = gguf.GGUFReader(argv[1])
    except (OSError, ValueError) as e:
        print(f"gguf_dequantize: cannot read {argv[1]}: {e}", file=sys.stderr)
        return 2
    tensors = {t.name: gguf.quants.dequantize(t.data, t.tensor_type) for t in reader.tensors}
    write_safetensors(argv[2], tensors, generator="tools/gguf_dequantize.py")
    meta = {k: field_value(f) for k, f in reader.fields.items() if k.startswith("tessera.")}
    meta["tensor_types"] = {t.name: t.tensor_type.name for t in reader.tensors}
    print(json.dumps(meta))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
