"""ONNX file helpers shared by the engines and the core: content hashes,
size estimates, saving with external data past the protobuf limit, loading
with one-line errors, unique node names.

One place for them: a protobuf message cannot be serialized above 2 GiB, and
every engine that writes a modified model (marked outputs, FP16 conversion)
must switch to external data the same way."""

from __future__ import annotations

import functools
import hashlib
import os
import uuid
from pathlib import Path

import onnx

from bisect_tui.core.errors import UserError
from bisect_tui.core.graph import name_nodes

# A protobuf message cannot be serialized above 2 GiB; stay well below it.
EXTERNAL_DATA_THRESHOLD = 1_800_000_000


def first_line(e: BaseException) -> str:
    text = str(e).strip() or type(e).__name__
    return text.splitlines()[0]


@functools.lru_cache(maxsize=64)
def file_hash_cached(path: str, size: int, mtime_ns: int) -> str:
    h = hashlib.sha1()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def file_hash(path: Path) -> str:
    """Content hash of a model file (cached per path/size/mtime: models are big)."""
    st = path.stat()
    return file_hash_cached(str(path.resolve()), st.st_size, st.st_mtime_ns)


def tensor_bytes(t: onnx.TensorProto) -> int:
    if t.raw_data:
        return len(t.raw_data)
    n = 1
    for d in t.dims:
        n *= d
    return n * 8  # upper bound for typed fields


def model_size_estimate(model: onnx.ModelProto) -> int:
    """Bytes the serialized model would take, without serializing (which fails >2 GiB)."""
    total = sum(tensor_bytes(t) for t in model.graph.initializer)
    for n in model.graph.node:
        for a in n.attribute:
            if a.HasField("t"):
                total += tensor_bytes(a.t)
    return total + 1_000_000


def uses_external_data(model: onnx.ModelProto) -> bool:
    return any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer)


def save_model(model: onnx.ModelProto, path: Path, threshold: int = EXTERNAL_DATA_THRESHOLD) -> None:
    """Write a model for the runtimes; with external data when it would not fit in protobuf.

    The .onnx is written under a temporary name and renamed, so a concurrent
    reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        if model_size_estimate(model) > threshold:
            onnx.save_model(
                model,
                str(tmp),
                save_as_external_data=True,
                all_tensors_to_one_file=True,
                location=path.name + ".data",
                size_threshold=1024,
            )
        else:
            tmp.write_bytes(model.SerializeToString())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def load_model(path: Path, load_external: bool = True) -> onnx.ModelProto:
    try:
        return onnx.load(str(path), load_external_data=load_external)
    except FileNotFoundError:
        raise UserError(f"model file not found: {path}") from None
    except Exception as e:  # DecodeError and friends: not an ONNX file
        raise UserError(f"could not read ONNX model {path}: {first_line(e)}") from None


def uses_external_data_file(path: Path) -> bool:
    """Whether the model file at `path` keeps its weights outside (then so must the optimized one)."""
    try:
        return uses_external_data(onnx.load(str(path), load_external_data=False))
    except Exception:
        return False


def existing_tensors(model: onnx.ModelProto) -> set[str]:
    g = model.graph
    names = {o for n in g.node for o in n.output if o}
    names |= {i.name for i in g.input} | {i.name for i in g.initializer}
    return names


def ensure_named(model: onnx.ModelProto) -> onnx.ModelProto:
    """GraphIndex keys nodes by name; give a copy unique names if needed."""
    names = [n.name for n in model.graph.node]
    if all(names) and len(set(names)) == len(names):
        return model
    m = onnx.ModelProto()
    m.CopyFrom(model)
    name_nodes(m)
    return m
