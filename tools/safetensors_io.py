"""The safetensors writer and reader of the fixture generators (make_gpt2_fixture.py,
make_llama_fixture.py): written by hand so that the files are byte-deterministic (keys sorted,
compact JSON header padded with spaces to a multiple of 8, __metadata__ last), and read back to
check them."""
import json
import os
import struct

import numpy as np
import torch

_DT = {
    torch.float32: ("F32", "<f4"),
    torch.int32: ("I32", "<i4"),
}
_NP = {"F32": "<f4", "I32": "<i4"}


def write_safetensors(path, tensors, metadata=None):
    header = {}
    blobs = []
    offset = 0
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous()
        dt, npdt = _DT[t.dtype]
        data = t.numpy().astype(npdt, copy=False).tobytes(order="C")
        header[name] = {"dtype": dt, "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    header["__metadata__"] = dict(metadata or {"format": "pt"})
    hjson = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hjson += b" " * ((-len(hjson)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for d in blobs:
            f.write(d)


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    assert n % 8 == 0, "header length not 8-byte aligned"
    header = json.loads(raw[8 : 8 + n].decode("utf-8"))
    data = raw[8 + n :]
    meta = header.pop("__metadata__", {})
    out = {}
    end_max = 0
    for name, info in header.items():
        b, e = info["data_offsets"]
        arr = np.frombuffer(data[b:e], dtype=_NP[info["dtype"]]).reshape(info["shape"])
        out[name] = torch.from_numpy(arr.copy())
        end_max = max(end_max, e)
    assert end_max == len(data), "trailing / missing data in safetensors file"
    return out, meta


def check_roundtrip(path, tensors, metadata):
    back, meta = read_safetensors(path)
    assert set(back) == set(tensors), (path, set(back) ^ set(tensors))
    for k, v in tensors.items():
        r = back[k]
        assert r.dtype == v.dtype and tuple(r.shape) == tuple(v.shape), (k, r.dtype, r.shape, v.dtype, v.shape)
        assert torch.equal(r, v), k
    assert meta == metadata, (meta, metadata)


# ----------------------------------------------------------------------------


def write_expected(out, tokens, run, names, hyper):
    """The expected.safetensors the C++ fixture tests read: tokens, logits, loss, adamw_losses,
    grad.<name> and final.<name> of `run` for every parameter name, and the hyperparameters
    (name, string) pairs as metadata after "format". Returns the tensors written."""
    exp = {
        "tokens": tokens.to(torch.int32),
        "logits": run["logits"],
        "loss": run["loss"].reshape(()),
        "adamw_losses": run["adamw_losses"],
    }
    for k in names:
        exp["grad." + k] = run["grads"][k]
        exp["final." + k] = run["final"][k]
    for k, v in exp.items():
        if k != "tokens":
            assert v.dtype == torch.float32, k
    meta = {"format": "pt"}
    meta.update(hyper)
    path = os.path.join(out, "expected.safetensors")
    write_safetensors(path, exp, meta)
    check_roundtrip(path, exp, meta)
    return exp
