"""Loading and validating the user's ONNX model, turning every failure into one line.

The model is *prepared* once (every node named) and written into the session
directory; engines, the baseline and the bisection all read that copy, so a
node name means the same thing in every file the tool writes.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Union

import numpy as np
import onnx

from bisect_tui.core import external_data as ext
from bisect_tui.core.errors import UserError
from bisect_tui.core.graph import GraphIndex, name_nodes

Dim = Union[int, str, None]


@dataclass
class InputSpec:
    name: str
    dtype: str  # numpy dtype name, e.g. "float32"
    shape: list[Dim]  # ints for static dims, dim_param names or None for dynamic ones

    @property
    def is_static(self) -> bool:
        return all(isinstance(d, int) and d >= 0 for d in self.shape)

    def shape_text(self) -> str:
        return "x".join(str(d) if d is not None else "?" for d in self.shape) or "scalar"


@dataclass
class ModelInfo:
    path: Path
    sha256: str
    model: onnx.ModelProto
    inputs: list[InputSpec]
    outputs: list[str]
    index: GraphIndex
    opset: int
    renamed_nodes: int = 0
    initializer_bytes: int = 0
    op_counts: dict[str, int] = field(default_factory=dict)
    # the data files of a model with external data (location, bytes, sha256; then
    # the session's copy): `model` then holds no weights (core/external_data.py)
    external: list[dict] = field(default_factory=list)

    @property
    def node_count(self) -> int:
        return len(self.index.nodes)


def file_sha256(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while True:
            b = fh.read(chunk)
            if not b:
                break
            h.update(b)
    return h.hexdigest()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:300]


def elem_type_to_dtype(elem_type: int) -> str:
    try:
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type)).name
    except Exception:
        return f"onnx_type_{elem_type}"


def initializer_bytes(initializers) -> int:
    """Bytes of the weights (string tensors left out), from their dims and types.

    The item size is looked up once per data type and the dims multiplied as
    Python ints: np.dtype and np.prod per initializer were a fifth of loading a
    21,000-node model. A type numpy does not know raises as it did; a product
    outside int64 takes np.prod, so it wraps as it did."""
    items: dict[int, int] = {}
    string = onnx.TensorProto.STRING
    total = 0
    for t in initializers:
        dt = t.data_type
        if dt == string:
            continue
        item = items.get(dt)
        if item is None:
            item = items[dt] = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(dt)).itemsize
        n = math.prod(t.dims)
        if not -(1 << 63) <= n < (1 << 63):
            n = int(np.prod(t.dims, dtype=np.int64))
        total += n * item
    return total


def load_model_info(path: Union[str, Path]) -> ModelInfo:
    """Load, check and index an ONNX model. Raises UserError with one line."""
    p = Path(path)
    if not p.exists():
        raise UserError(f"model file not found: {p}")
    if p.is_dir():
        raise UserError(f"model path is a directory, not an ONNX file: {p}")
    try:
        # weights in external files stay there: a >2 GB model is never one proto in memory
        model = onnx.load(str(p), load_external_data=False)
    except Exception as exc:  # protobuf DecodeError, ...
        raise UserError(f"not an ONNX model: {p} ({_first_line(exc)})") from None
    if not model.HasField("graph") or len(model.graph.node) == 0:
        raise UserError(f"not an ONNX model: {p} (no graph or no nodes in it)")
    external: list[dict] = []
    if ext.has_external_data(model):
        ext.check_locations(model, p.parent)
        external = ext.data_files(model, p.parent)
        ext.register(model, p.parent)
    try:
        # from the path when the weights are outside: the checker reads them where they are
        onnx.checker.check_model(str(p) if external else model)
    except ValueError:
        # >2 GB protos can only be checked from the path
        try:
            onnx.checker.check_model(str(p))
        except Exception as exc:
            raise UserError(f"invalid ONNX model {p.name}: {_first_line(exc)}") from None
    except Exception as exc:
        raise UserError(f"invalid ONNX model {p.name}: {_first_line(exc)}") from None
    if len(model.graph.output) == 0:
        raise UserError(f"{p.name} declares no graph outputs: there is nothing to compare "
                        "(add the tensors you care about to graph.output)")
    renamed = name_nodes(model)
    index = GraphIndex.build(model)
    inputs = []
    for vi in model.graph.input:
        if vi.name in index.initializers:
            continue
        tt = vi.type.tensor_type
        if not vi.type.HasField("tensor_type"):
            raise UserError(
                f"input {vi.name!r} is not a tensor (sequence/map inputs are not supported)"
            )
        dims: list[Dim] = []
        for d in tt.shape.dim:
            if d.HasField("dim_value") and d.dim_value > 0:
                dims.append(int(d.dim_value))
            elif d.HasField("dim_param") and d.dim_param:
                dims.append(d.dim_param)
            else:
                dims.append(None)
        inputs.append(InputSpec(vi.name, elem_type_to_dtype(tt.elem_type), dims))
    opset = next(
        (o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0
    )
    init_bytes = initializer_bytes(model.graph.initializer)
    ops: dict[str, int] = {}
    for n in index.nodes:
        ops[n.op_type] = ops.get(n.op_type, 0) + 1
    return ModelInfo(
        path=p,
        sha256=model_digest(p, external),
        model=model,
        inputs=inputs,
        outputs=list(index.graph_outputs),
        index=index,
        opset=opset,
        renamed_nodes=renamed,
        initializer_bytes=init_bytes,
        op_counts=ops,
        external=external,
    )


def model_digest(path: Path, external: list[dict]) -> str:
    """sha256 of the model file, and of its data files when it has them (other
    weights are another model: another session, never a reused dump)."""
    own = file_sha256(path)
    if not external:
        return own
    h = hashlib.sha256(own.encode())
    for rec in external:
        h.update(f"\n{rec['location']}\0{rec['bytes']}\0{rec['sha256']}".encode())
    return h.hexdigest()


def save_prepared(info: ModelInfo, dest: Path) -> Path:
    """Write the prepared (named) model where engines will read it.

    With external data the session gets its own reference to the data files
    (hard links, or verified copies) and the prepared file refers to them: the
    proto written holds no weights, whatever the model's size."""
    from bisect_tui.core import atomic

    dest = Path(dest)
    adopt_weights(info, dest)
    if info.external or info.model.ByteSize() < (1 << 31) - (1 << 20):
        atomic.write_bytes(dest, info.model.SerializeToString())
    else:  # >2 GB held in memory (not loaded by load_model_info): weights to a file next to it
        dest.parent.mkdir(parents=True, exist_ok=True)
        onnx.save_model(
            info.model,
            str(dest),
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=dest.name + ".data",
        )
    return dest


def adopt_weights(info: ModelInfo, dest: Path) -> list[dict]:
    """The session's data files for `info` (next to the prepared model at `dest`),
    linked, copied or verified, with `info.model` pointed at them. Called for a
    prepared model written now and for one reused (its files checked by digest)."""
    if not info.external or info.external[0].get("session_file"):
        return info.external
    info.external = ext.adopt_into_session(info.model, info.path.parent, info.external, Path(dest).parent)
    return info.external
