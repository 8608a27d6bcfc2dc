#!/usr/bin/env python3
"""GGUF fixtures from gguf-py (llama.cpp's own reader and writer), and the check of the GGUF
files tessera writes. Needs the pinned packages of tools/requirements-gguf.txt:

    python3 -m venv .venv-oracle
    .venv-oracle/bin/pip install -r tools/requirements-gguf.txt
    .venv-oracle/bin/python tools/gguf_fixture.py generate   # fixtures + fuzz seeds
    .venv-oracle/bin/python tools/gguf_fixture.py check      # tessera_written.gguf vs gguf-py
    .venv-oracle/bin/python tools/gguf_fixture.py check-model M.gguf  # tessera convert's output

generate writes (deterministic: the same bytes on every run)
  tests/fixtures/gguf/reference.gguf
      metadata of every value type (the keys of METADATA) and one tensor per ggml type tessera
      reads: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1 quantized by gguf.quants.quantize from
      random fp32 sources (with edge cases: zero and constant blocks, f16 rounding ties and
      overflow limits), and q4_k, q5_k, q6_k as random blocks with sane f16 scales (gguf-py cannot
      quantize K-quants).
  tests/fixtures/gguf/reference.expected.safetensors  (F32 tensors, row-major shapes)
      dequant.<name>  gguf.quants.dequantize of each tensor as GGUFReader read it
      source.<name>   the fp32 values the tensor was quantized from (not for the K-quants)
  tests/fuzz/corpus/gguf/*.gguf  small valid files, one per ggml type, plus metadata-only and
      64-byte-aligned ones and a llama of mixed quantized matrices (the seeds of the fuzz target)

check reads tests/fixtures/gguf/tessera_written.gguf (written by tessera's GgufWriter in the
unit test GgufFixture.WriterOutputMatchesCommittedFile) with GGUFReader and checks: every
metadata value of METADATA with its type, the alignment, each tensor's type, shape and bytes
against reference.gguf (gguf-py's quantization of the same source), the dequantized values, and
that gguf-py's GGUFWriter, given the same content, writes a byte-identical file.
"""

import argparse
import json
import pathlib
import struct
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q
from gguf import GGUFValueType as V

ROOT = pathlib.Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "gguf"
CORPUS = ROOT / "tests" / "fuzz" / "corpus" / "gguf"
SEED = 20250611

# Metadata of every value type, in file order after general.architecture (which GGUFWriter
# writes first). tests/unit/test_gguf.cpp builds the same values with GgufValue and checks that
# their encodings equal these.
METADATA = [
    ("general.name", V.STRING, "tessera gguf fixture", None),
    ("test.u8", V.UINT8, 200, None),
    ("test.i8", V.INT8, -100, None),
    ("test.u16", V.UINT16, 60000, None),
    ("test.i16", V.INT16, -30000, None),
    ("test.u32", V.UINT32, 4000000000, None),
    ("test.i32", V.INT32, -2000000000, None),
    ("test.u64", V.UINT64, 2**63 + 5, None),
    ("test.i64", V.INT64, -(2**62) - 3, None),
    ("test.f32", V.FLOAT32, 3.14159, None),
    ("test.f64", V.FLOAT64, 2.718281828459045, None),
    ("test.bool", V.BOOL, True, None),
    ("test.string", V.STRING, "h\u00e9llo, w\u00f6rld", None),
    ("test.empty_string", V.STRING, "", None),
    ("test.array.u8", V.ARRAY, [1, 2, 255], V.UINT8),
    ("test.array.i8", V.ARRAY, [-128, 0, 127], V.INT8),
    ("test.array.u16", V.ARRAY, [0, 65535], V.UINT16),
    ("test.array.i16", V.ARRAY, [-32768, 32767], V.INT16),
    ("test.array.u32", V.ARRAY, [7, 4294967295], V.UINT32),
    ("test.array.i32", V.ARRAY, [-2147483648, 1, 2147483647], V.INT32),
    ("test.array.u64", V.ARRAY, [0, 2**64 - 1], V.UINT64),
    ("test.array.i64", V.ARRAY, [-(2**63), 2**63 - 1], V.INT64),
    ("test.array.f32", V.ARRAY, [0.5, -1.25, 1e-3], V.FLOAT32),
    ("test.array.f64", V.ARRAY, [1e300, -2.5e-300], V.FLOAT64),
    ("test.array.bool", V.ARRAY, [True, False, True], V.BOOL),
    ("test.array.string", V.ARRAY, ["a", "", "\u00fcn\u00efcode", "with space"], V.STRING),
    ("llama.block_count", V.UINT32, 2, None),
]

# The tensors of reference.gguf: name, type, row-major shape (rows, cols).
TENSORS = [
    ("f32", Q.F32, (3, 64)),
    ("f16", Q.F16, (3, 64)),
    ("bf16", Q.BF16, (3, 64)),
    ("q8_0", Q.Q8_0, (4, 64)),
    ("q4_0", Q.Q4_0, (4, 64)),
    ("q4_1", Q.Q4_1, (4, 64)),
    ("q5_0", Q.Q5_0, (4, 64)),
    ("q5_1", Q.Q5_1, (4, 64)),
    ("q4_k", Q.Q4_K, (2, 512)),
    ("q5_k", Q.Q5_K, (2, 512)),
    ("q6_k", Q.Q6_K, (2, 512)),
    ("q2_k", Q.Q2_K, (2, 512)),
    ("q3_k", Q.Q3_K, (2, 512)),
]
WRITABLE = ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1"]  # what tessera's writer encodes
WRITTEN_ALIGNMENT = 64  # tessera_written.gguf uses a non-default alignment


def f16_edge_values():
    """Values that exercise fp32 -> fp16 rounding: ties, subnormals, the overflow limit."""
    return np.array([
        0.0, -0.0, 1.0, -1.0, 65504.0, -65504.0, 65519.0, 65519.99, 6.103515625e-05, 2.0**-24,
        3 * 2.0**-25, 2.0**-25, 2.0**-26, 1e-8, 1 + 2.0**-11, 1 + 3 * 2.0**-11, 2048 + 1, 2048 + 3,
        0.1, -0.3333333, 1e-5, 4.5e-6, 5.9604645e-08, 3.0e-5, 12345.678, -0.00012207031,
        2.0**-14 - 2.0**-25, 2.0**-14 - 2.0**-26, 1000.5, 1001.5, 0.099975586, 7.0,
    ], dtype=np.float32)


def bf16_edge_values():
    """Values that exercise fp32 -> bf16 rounding: ties to even, large and tiny values."""
    bits = np.array([
        0x3F808000, 0x3F818000, 0x3F80C000, 0x3F807FFF, 0x7F7F0000, 0x7F7F7FFF, 0x00010000,
        0x00008000, 0x00018000, 0x80000000, 0x3F800001, 0xBF808001, 0x42F6E979, 0x2F800000,
        0x3DCCCCCD, 0xC0490FDB,
    ], dtype=np.uint32)
    return bits.view(np.float32)


def source_values(name, shape, rng):
    """The fp32 values a tensor is quantized from: normal noise plus edge cases."""
    x = rng.standard_normal(shape).astype(np.float32)
    flat = x.reshape(-1)
    if name == "f16":
        e = f16_edge_values()
        flat[: e.size] = e
    elif name == "bf16":
        e = bf16_edge_values()
        flat[: e.size] = e
    elif name in ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1"):
        flat[0:32] = 0.0                      # an all-zero block (d = 0)
        flat[32:64] = 0.75                    # a constant block (d = 0 for q4_1)
        flat[64:96] *= 3.0
        flat[70] = -7.5                       # largest magnitude is negative
        flat[96:128] = np.linspace(-1, 1, 32, dtype=np.float32)  # exact halves in q4_1
    elif name == "f32":
        flat[:6] = np.array([0.0, -0.0, 1e-40, -3.4e38, 1.0, 1e-45], dtype=np.float32)
    return x


def random_kquant_blocks(qtype, n_blocks, rng):
    """Random K-quant blocks whose f16 scales are sane (small, finite, some negative)."""
    block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)
    d = (rng.uniform(1e-4, 0.05, n_blocks) * rng.choice([-1, 1], n_blocks)).astype(np.float16)
    d[0] = np.uint16(3).view(np.float16)  # a subnormal f16 scale
    if qtype == Q.Q6_K:
        blocks[:, 208:210] = d.view(np.uint8).reshape(n_blocks, 2)
    elif qtype == Q.Q3_K:
        blocks[:, 108:110] = d.view(np.uint8).reshape(n_blocks, 2)
    elif qtype == Q.Q2_K:
        dmin = rng.uniform(0, 0.02, n_blocks).astype(np.float16)
        blocks[:, 80:82] = d.view(np.uint8).reshape(n_blocks, 2)
        blocks[:, 82:84] = dmin.view(np.uint8).reshape(n_blocks, 2)
    else:
        dmin = rng.uniform(0, 0.02, n_blocks).astype(np.float16)
        blocks[:, 0:2] = d.view(np.uint8).reshape(n_blocks, 2)
        blocks[:, 2:4] = dmin.view(np.uint8).reshape(n_blocks, 2)
    return blocks


def encode(qtype, values):
    """The tensor as GGUFWriter.add_tensor takes it (numpy dtype of F32/F16, bytes otherwise)."""
    return gguf.quants.quantize(values, qtype)


def add_metadata(writer):
    for key, vtype, value, sub_type in METADATA:
        writer.add_key_value(key, value, vtype, sub_type=sub_type)


def write_gguf(path, tensors, alignment=None, metadata=True, arch="llama"):
    """tensors: list of (name, qtype, data as encode() returns it)."""
    w = gguf.GGUFWriter(str(path), arch)
    if metadata:
        add_metadata(w)
    if alignment is not None:
        w.add_custom_alignment(alignment)
    for name, qtype, data in tensors:
        raw_dtype = None if qtype in (Q.F32, Q.F16) else qtype
        w.add_tensor(name, data, raw_dtype=raw_dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_safetensors(path, tensors, generator="tools/gguf_fixture.py"):
    """F32 tensors {name: array}, keys sorted, written by hand (no safetensors package needed)."""
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        data = np.ascontiguousarray(tensors[name], dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(tensors[name].shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    header["__metadata__"] = {"generator": generator, "gguf": gguf_version()}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((-len(h)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def read_safetensors(path):
    raw = pathlib.Path(path).read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__", None)
    data = raw[8 + n:]
    return {k: np.frombuffer(data[v["data_offsets"][0]:v["data_offsets"][1]], dtype="<f4")
            .reshape(v["shape"]) for k, v in header.items()}


def gguf_version():
    from importlib.metadata import version
    return version("gguf")


def dequantize(tensor):
    return np.asarray(gguf.quants.dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)


def generate_reference():
    rng = np.random.default_rng(SEED)
    tensors, expected = [], {}
    for name, qtype, shape in TENSORS:
        if qtype in (Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K):
            block_size = gguf.GGML_QUANT_SIZES[qtype][0]
            n_blocks = shape[0] * shape[1] // block_size
            blocks = random_kquant_blocks(qtype, n_blocks, rng)
            data = blocks.reshape(shape[0], -1)
        else:
            src = source_values(name, shape, rng)
            expected[f"source.{name}"] = src
            data = encode(qtype, src)
        tensors.append((name, qtype, data))
    FIXTURES.mkdir(parents=True, exist_ok=True)
    path = FIXTURES / "reference.gguf"
    write_gguf(path, tensors)
    reader = gguf.GGUFReader(str(path))
    for t in reader.tensors:
        expected[f"dequant.{t.name}"] = dequantize(t).reshape(tuple(reversed(t.shape.tolist())))
    write_safetensors(FIXTURES / "reference.expected.safetensors", expected)
    print(f"wrote {path} ({path.stat().st_size} bytes) and reference.expected.safetensors "
          f"({(FIXTURES / 'reference.expected.safetensors').stat().st_size} bytes)")


def write_quantized_llama(path, rng):
    """A llama of two layers (width 32) whose matrices mix the block types a llama.cpp Q4_K_M or
    Q5_K_M file mixes where rows are too short for the K-quants, parts of one linear differing."""
    w = gguf.GGUFWriter(str(path), "llama")
    for key, value in [("block_count", 2), ("context_length", 16), ("embedding_length", 32),
                       ("feed_forward_length", 32), ("attention.head_count", 2),
                       ("attention.head_count_kv", 1)]:
        w.add_uint32(f"llama.{key}", value)
    w.add_float32("llama.rope.freq_base", 10000.0)
    w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    types = [{"attn_q": Q.Q5_0, "attn_k": Q.Q5_0, "attn_v": Q.Q8_0, "attn_output": Q.Q4_1,
              "ffn_gate": Q.Q5_1, "ffn_up": Q.Q4_0, "ffn_down": Q.Q8_0},
             {"attn_q": Q.Q4_0, "attn_k": Q.Q4_1, "attn_v": Q.Q5_1, "attn_output": Q.Q5_0,
              "ffn_gate": Q.Q8_0, "ffn_up": Q.Q8_0, "ffn_down": Q.Q4_1}]
    rows = {"attn_q": 32, "attn_k": 16, "attn_v": 16, "attn_output": 32, "ffn_gate": 32,
            "ffn_up": 32, "ffn_down": 32}
    norm = lambda: (1 + 0.1 * rng.standard_normal(32)).astype(np.float32)
    w.add_tensor("token_embd.weight", encode(Q.Q8_0, rng.standard_normal((8, 32)).astype(np.float32)),
                 raw_dtype=Q.Q8_0)
    for layer, kinds in enumerate(types):
        w.add_tensor(f"blk.{layer}.attn_norm.weight", norm())
        for name, qtype in kinds.items():
            values = (0.2 * rng.standard_normal((rows[name], 32))).astype(np.float32)
            w.add_tensor(f"blk.{layer}.{name}.weight", encode(qtype, values), raw_dtype=qtype)
        w.add_tensor(f"blk.{layer}.ffn_norm.weight", norm())
    w.add_tensor("output_norm.weight", norm())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def generate_corpus():
    """One small valid file per ggml type, plus metadata-only and 64-byte-aligned files."""
    rng = np.random.default_rng(SEED + 1)
    CORPUS.mkdir(parents=True, exist_ok=True)
    for name, qtype, _ in TENSORS:
        block_size = gguf.GGML_QUANT_SIZES[qtype][0]
        if qtype in (Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K):
            data = random_kquant_blocks(qtype, 1, rng)
        else:
            cols = max(block_size, 4)
            data = encode(qtype, rng.standard_normal((2 if cols == 4 else 1, cols)).astype(np.float32))
        write_gguf(CORPUS / f"{name}.gguf", [(name, qtype, data)], metadata=False)
    write_gguf(CORPUS / "metadata.gguf", [])
    x = rng.standard_normal((2, 32)).astype(np.float32)
    write_gguf(CORPUS / "align64.gguf", [("a", Q.F32, x[:1, :8]), ("b", Q.Q8_0, encode(Q.Q8_0, x))],
               alignment=64, metadata=False)
    write_gguf(CORPUS / "empty.gguf", [], metadata=False)
    write_quantized_llama(CORPUS / "llama_quantized_mix.gguf", rng)
    sizes = sorted((p.name, p.stat().st_size) for p in CORPUS.glob("*.gguf"))
    print(f"wrote {len(sizes)} seeds to {CORPUS}: " + ", ".join(f"{n} {s} B" for n, s in sizes))


# ---- check ----

def expected_field_value(vtype, value, sub_type):
    if vtype == V.FLOAT32:
        return float(np.float32(value))
    if vtype == V.ARRAY and sub_type == V.FLOAT32:
        return [float(np.float32(v)) for v in value]
    return value


def check_metadata(reader, problems):
    fields = {k: f for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    expected_keys = ["general.architecture"] + [m[0] for m in METADATA] + ["general.alignment"]
    if list(fields) != expected_keys:
        problems.append(f"metadata keys {list(fields)} != {expected_keys}")
    wanted = [("general.architecture", V.STRING, "llama", None)] + METADATA + [
        ("general.alignment", V.UINT32, WRITTEN_ALIGNMENT, None)]
    for key, vtype, value, sub_type in wanted:
        f = fields.get(key)
        if f is None:
            continue
        types = [vtype] + ([sub_type] if sub_type is not None else [])
        got = f.contents()
        want = expected_field_value(vtype, value, sub_type)
        if f.types != types or got != want:
            problems.append(f"{key}: {[t.name for t in f.types]} {got!r}, expected "
                            f"{[t.name for t in types]} {want!r}")
    return len(wanted)


def check_tensors(reader, reference, expected, problems):
    ref = {t.name: t for t in reference.tensors}
    names = [t.name for t in reader.tensors]
    if names != WRITABLE:
        problems.append(f"tensors {names} != {WRITABLE}")
    for t in reader.tensors:
        r = ref[t.name]
        if t.tensor_type != r.tensor_type or t.shape.tolist() != r.shape.tolist():
            problems.append(f"{t.name}: {t.tensor_type.name} {t.shape.tolist()}, reference "
                            f"{r.tensor_type.name} {r.shape.tolist()}")
            continue
        if t.data.tobytes() != r.data.tobytes():
            diff = np.flatnonzero(t.data.view(np.uint8).reshape(-1) != r.data.view(np.uint8).reshape(-1))
            problems.append(f"{t.name}: bytes differ from gguf-py's quantization at {diff[:8]}")
        values = dequantize(t).reshape(expected[f"dequant.{t.name}"].shape)
        if values.tobytes() != expected[f"dequant.{t.name}"].tobytes():
            problems.append(f"{t.name}: dequantized values differ")
        if t.data_offset % WRITTEN_ALIGNMENT != 0:
            problems.append(f"{t.name}: data at byte {t.data_offset}, not aligned")


def rewrite_with_gguf_py(reader, path):
    """What gguf-py's own writer makes of the same content (metadata, tensors, alignment)."""
    w = gguf.GGUFWriter(str(path), "llama")
    add_metadata(w)
    w.add_custom_alignment(WRITTEN_ALIGNMENT)
    for t in reader.tensors:
        if t.tensor_type in (Q.F32, Q.F16):
            w.add_tensor(t.name, np.array(t.data))
        else:
            w.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def check(path):
    print(f"gguf-py {gguf_version()}, numpy {np.__version__}: reading {path}")
    reader = gguf.GGUFReader(str(path))
    reference = gguf.GGUFReader(str(FIXTURES / "reference.gguf"))
    expected = read_safetensors(FIXTURES / "reference.expected.safetensors")
    problems = []
    n_keys = check_metadata(reader, problems)
    if reader.alignment != WRITTEN_ALIGNMENT:
        problems.append(f"alignment {reader.alignment}, expected {WRITTEN_ALIGNMENT}")
    check_tensors(reader, reference, expected, problems)
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        again = pathlib.Path(tmp) / "again.gguf"
        rewrite_with_gguf_py(reader, again)
        same = again.read_bytes() == pathlib.Path(path).read_bytes()
    if not same:
        problems.append("gguf-py's GGUFWriter writes different bytes for the same content")
    print(f"  metadata: {n_keys} keys checked (types and values)")
    for t in reader.tensors:
        print(f"  tensor {t.name:5s} {t.tensor_type.name:5s} shape {t.shape.tolist()} at byte "
              f"{t.data_offset}: bytes equal gguf-py's quantization, dequantized values equal")
    print(f"  gguf-py's GGUFWriter given the same content writes {'the same' if same else 'OTHER'} "
          f"{pathlib.Path(path).stat().st_size} bytes")
    for p in problems:
        print("  PROBLEM:", p)
    print("check: " + ("ok" if not problems else f"{len(problems)} problems"))
    return 0 if not problems else 1


# ---- check-model ----

# The tensor dims (ggml's ne, innermost first) llama.cpp's loader creates for a gpt2 block
# (llama-model.cpp, LLM_ARCH_GPT2), from the hyperparameters; None: any size.
def gpt2_expected_dims(n_embd, n_ff, n_ctx, n_vocab):
    return {
        "token_embd.weight": [n_embd, n_vocab],
        "position_embd.weight": [n_embd, n_ctx],
        "output_norm.weight": [n_embd], "output_norm.bias": [n_embd],
        "attn_norm.weight": [n_embd], "attn_norm.bias": [n_embd],
        "attn_qkv.weight": [n_embd, 3 * n_embd], "attn_qkv.bias": [3 * n_embd],
        "attn_output.weight": [n_embd, n_embd], "attn_output.bias": [n_embd],
        "ffn_norm.weight": [n_embd], "ffn_norm.bias": [n_embd],
        "ffn_up.weight": [n_embd, n_ff], "ffn_up.bias": [n_ff],
        "ffn_down.weight": [n_ff, n_embd], "ffn_down.bias": [n_embd],
    }


def check_model(path):
    """A model file tessera wrote (tessera convert --format gguf), read as llama.cpp would: the
    architecture and its hyperparameter keys by gguf-py's own constants, every tensor name one of
    gguf-py's MODEL_TENSORS for the architecture, each tensor dequantized, the tokenizer's size
    against the embedding; for gpt2 the exact tensor set (the head tied: no output.weight) and the
    dims llama.cpp's loader creates."""
    print(f"gguf-py {gguf_version()}, numpy {np.__version__}: reading {path}")
    reader = gguf.GGUFReader(str(path))
    fields = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    problems = []
    arch = fields.get("general.architecture")
    arch_id = {name: a for a, name in gguf.MODEL_ARCH_NAMES.items()}.get(arch)
    if arch_id is None:
        print(f"  PROBLEM: general.architecture {arch!r} is not one of gguf-py's")
        return 1
    K = gguf.Keys
    keys = [K.LLM.BLOCK_COUNT, K.LLM.CONTEXT_LENGTH, K.LLM.EMBEDDING_LENGTH,
            K.LLM.FEED_FORWARD_LENGTH, K.Attention.HEAD_COUNT,
            K.Attention.LAYERNORM_EPS if arch == "gpt2" else K.Attention.LAYERNORM_RMS_EPS]
    for key in (k.format(arch=arch) for k in keys):
        if key not in fields:
            problems.append(f"metadata {key} is missing")
    n_layer = fields.get(f"{arch}.block_count", 0)
    allowed = set()
    for t in gguf.MODEL_TENSORS[arch_id]:
        name = gguf.TENSOR_NAMES[t]
        for bid in (range(n_layer) if "{bid}" in name else [None]):
            base = name.format(bid=bid)
            allowed |= {base + ".weight", base + ".bias"}
    names = [t.name for t in reader.tensors]
    for n in names:
        if n not in allowed:
            problems.append(f"tensor {n} is not one of gguf-py's {arch} tensors")
    types = {}
    for t in reader.tensors:
        values = gguf.quants.dequantize(t.data, t.tensor_type)
        if values.size != int(np.prod(t.shape)) or not np.all(np.isfinite(values)):
            problems.append(f"{t.name}: {values.size} values for dims {t.shape.tolist()}, or "
                            "non-finite ones")
        types[t.tensor_type.name] = types.get(t.tensor_type.name, 0) + 1
    by_name = {t.name: t for t in reader.tensors}
    vocab = int(by_name["token_embd.weight"].shape[1]) if "token_embd.weight" in by_name else -1
    if "tokenizer.ggml.tokens" in fields:
        n_tokens = len(fields["tokenizer.ggml.tokens"])
        if n_tokens != vocab:
            problems.append(f"{n_tokens} tokens, but token_embd.weight has {vocab} rows")
        for key in ("tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.merges",
                    "tokenizer.ggml.token_type"):
            if key not in fields:
                problems.append(f"metadata {key} is missing")
    if arch == "gpt2":
        dims = gpt2_expected_dims(fields.get("gpt2.embedding_length"),
                                  fields.get("gpt2.feed_forward_length"),
                                  fields.get("gpt2.context_length"), vocab)
        want = {n for n in dims if not n.startswith(("attn_", "ffn_"))}
        want |= {f"blk.{b}.{n}" for b in range(n_layer) for n in dims if n.startswith(("attn_", "ffn_"))}
        if set(names) != want:
            problems.append(f"tensors {sorted(set(names) ^ want)} differ from llama.cpp's gpt2 set")
        for n, t in by_name.items():
            expect = dims.get(n.split(".", 2)[2] if n.startswith("blk.") else n)
            if expect is not None and t.shape.tolist() != expect:
                problems.append(f"{n}: dims {t.shape.tolist()}, llama.cpp's loader wants {expect}")
    print(f"  {arch}: {len(names)} tensors ({', '.join(f'{v} {k}' for k, v in sorted(types.items()))}), "
          f"{len(fields)} metadata keys, vocabulary {vocab}"
          + (f", tokenizer {fields['tokenizer.ggml.model']}/{fields['tokenizer.ggml.pre']}"
             if "tokenizer.ggml.model" in fields else ""))
    for p in problems:
        print("  PROBLEM:", p)
    print("check-model: " + ("ok" if not problems else f"{len(problems)} problems"))
    return 0 if not problems else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("generate", help="write the fixtures and the fuzz seeds")
    c = sub.add_parser("check", help="check a GGUF file tessera wrote with gguf-py")
    c.add_argument("path", nargs="?", default=str(FIXTURES / "tessera_written.gguf"))
    m = sub.add_parser("check-model", help="check a model file tessera convert wrote with gguf-py")
    m.add_argument("path")
    args = ap.parse_args()
    if args.cmd == "generate":
        generate_reference()
        generate_corpus()
        return 0
    if args.cmd == "check-model":
        return check_model(args.path)
    return check(args.path)


if __name__ == "__main__":
    sys.exit(main())
