"""Models whose weights live in external data files (every model over 2 GB).

A protobuf message cannot be serialized above 2 GiB, and a model that keeps its
weights outside is usually one that would not fit. So such a model is never
loaded with its weights: the in-memory proto holds only the graph and the
`external_data` references (location, offset, length), and every consumer
reads the weights from the files, where the runtimes read them too.

Why the weights get session-unique names: a reference is only a relative
location, and the runtimes refuse absolute ones or ones that leave the model's
directory (one says "Absolute path not allowed", "escapes model directory"; others
the same). The session therefore holds the data files itself (a copy, verified
by digest; never a hard link to the user's file: onnx refuses to load a data
file with more than one link, "a potential hardlink attack", so a link would
break the user's own `onnx.load` of their model) under
`weights/<digest>_<name>`, and the prepared model refers to them relative to
the session root. A location names its content, so the registry below, which
says which directory a location is relative to, cannot confuse two models
loaded by one process: a proto that only knows its locations still finds its
files (runtime sessions of marked copies, `tensor_array`, the FP16 converter's
input), and derived models written elsewhere in the session get hard links to
the session's copies rather than copies. onnx's own loader refuses those
linked files, so every read of weights here is our own (`read_bytes`: offset
and length inside a file checked to lie in its folder).

The selection is by the presence of external data, never by size: a 3 MB model
with external data runs the same code as a 2.4 GB one, so the tests exercise it.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from operator import attrgetter
from pathlib import Path
from typing import Iterator, Optional

import onnx

from bisect_tui.core.errors import UserError

WEIGHTS_DIR = "weights"
_BASES: dict[str, str] = {}  # location -> the directory it is relative to


def all_tensors(model: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    """Initializers and tensor attributes, in subgraphs too (all can be external)."""
    return iter(_tensors(model.graph, []))


_ATTRIBUTES = attrgetter("attribute")
_DATA_LOCATION = attrgetter("data_location")
_EXTERNAL = onnx.TensorProto.EXTERNAL


def _tensors(g: onnx.GraphProto, out: list) -> list:
    """`all_tensors`' order into `out`: a graph's initializers, then per node per
    attribute its tensor, its tensors and its subgraphs'. Nodes without attributes,
    nearly all of a large model's, are passed over in C (map/filter): a Python
    generator per graph and a loop per node made every walk of a 21,000-node
    model cost ~35 ms, and other modules ask hundreds of times a run."""
    out.extend(g.initializer)
    for attrs in filter(None, map(_ATTRIBUTES, g.node)):
        for a in attrs:
            if a.HasField("t"):
                out.append(a.t)
            if a.tensors:
                out.extend(a.tensors)
            if a.HasField("g"):
                _tensors(a.g, out)
            for sg in a.graphs:
                _tensors(sg, out)
    return out


def _externals(g: onnx.GraphProto, out: list) -> list:
    """The external ones of `_tensors(g)`, in its order, into `out`. A graph's
    initializers are first asked for their data locations all at once (in C):
    only a graph that has an external one builds a list of them."""
    inits = g.initializer
    if _EXTERNAL in map(_DATA_LOCATION, inits):
        out.extend(t for t in inits if t.data_location == _EXTERNAL)
    for attrs in filter(None, map(_ATTRIBUTES, g.node)):
        for a in attrs:
            if a.HasField("t") and a.t.data_location == _EXTERNAL:
                out.append(a.t)
            if a.tensors and _EXTERNAL in map(_DATA_LOCATION, a.tensors):
                out.extend(t for t in a.tensors if t.data_location == _EXTERNAL)
            if a.HasField("g"):
                _externals(a.g, out)
            for sg in a.graphs:
                _externals(sg, out)
    return out


def _any_external(g: onnx.GraphProto) -> bool:
    """Whether `_externals(g)` holds any, stopping at the first."""
    if _EXTERNAL in map(_DATA_LOCATION, g.initializer):
        return True
    for attrs in filter(None, map(_ATTRIBUTES, g.node)):
        for a in attrs:
            if a.HasField("t") and a.t.data_location == _EXTERNAL:
                return True
            if a.tensors and _EXTERNAL in map(_DATA_LOCATION, a.tensors):
                return True
            if a.HasField("g") and _any_external(a.g):
                return True
            for sg in a.graphs:
                if _any_external(sg):
                    return True
    return False


def is_external(t: onnx.TensorProto) -> bool:
    return t.data_location == onnx.TensorProto.EXTERNAL


def location_of(t: onnx.TensorProto) -> str:
    return next((e.value for e in t.external_data if e.key == "location"), "")


def has_external_data(model: onnx.ModelProto) -> bool:
    return _any_external(model.graph)


def locations(model: onnx.ModelProto) -> list[str]:
    """The data files a model refers to, each once, in first-use order."""
    return list(dict.fromkeys(location_of(t) for t in _externals(model.graph, [])))


_CONTENT_NAMED = re.compile(rf"^{WEIGHTS_DIR}/[0-9a-f]{{16}}_")


def register(model: onnx.ModelProto, base: Path) -> None:
    """Say that the locations of `model` are relative to `base` (in this process).

    A user's location (`model.onnx.data`) means the folder last loaded: one
    process triages one model at a time. A session's content-named location
    keeps the folder it was first registered with while its file is there (a
    subgraph's folder holding a link to the same bytes must not take over: it
    may be gone when the whole model runs next)."""
    for loc in locations(model):
        old = _BASES.get(loc)
        if old and _CONTENT_NAMED.match(loc) and (Path(old) / loc).is_file():
            continue
        _BASES[loc] = str(Path(base).resolve())


def base_of(model: onnx.ModelProto) -> Optional[Path]:
    """The directory a model's external locations resolve in, or None for a model
    that holds its weights. A model whose files were never registered is one
    error naming the location (never a runtime's "path does not exist")."""
    locs = locations(model)
    if not locs:
        return None
    bases = {_BASES.get(loc) for loc in locs}
    if None in bases or len(bases) != 1:
        missing = next((loc for loc in locs if loc not in _BASES), locs[0])
        raise UserError(f"the model's external data file {missing!r} is not known to this process "
                        "(internal: the model was not loaded through bisect_tui.core.external_data)")
    return Path(bases.pop())


def load(path: Path) -> onnx.ModelProto:
    """A model file as the runs need it: weights left in their files when it has
    external data (its locations registered), loaded otherwise."""
    path = Path(path)
    model = onnx.load(str(path), load_external_data=False)
    if has_external_data(model):
        check_locations(model, path.parent)
        register(model, path.parent)
    return model


def check_locations(model: onnx.ModelProto, base: Path) -> None:
    """Every location relative, inside `base`, and an existing regular file (names
    from a model are data: a planted `../../etc/passwd` is refused, not read)."""
    from bisect_tui.core.safepath import is_relative_name

    root = Path(os.path.realpath(base))
    for loc in locations(model):
        if not is_relative_name(loc):
            raise UserError(f"external data location {loc!r} is not a relative path inside the model's folder")
        real = Path(os.path.realpath(root / loc))
        if root not in real.parents:
            raise UserError(f"external data location {loc!r} leads outside the model's folder {base}")
        if not real.is_file():
            raise UserError(f"external data file {loc!r} of the model is missing (looked in {base})")


def read_bytes(t: onnx.TensorProto, base: Path) -> bytes:
    """The bytes of an external tensor (its offset and length in its file)."""
    info = {e.key: e.value for e in t.external_data}
    loc = info.get("location", "")
    root = Path(os.path.realpath(base))
    path = Path(os.path.realpath(root / loc))
    if not loc or root not in path.parents:
        raise UserError(f"external data location {loc!r} of tensor {t.name!r} leads outside {base}")
    offset = int(info.get("offset") or 0)
    length = int(info["length"]) if info.get("length") else None
    with open(path, "rb") as fh:
        fh.seek(offset)
        data = fh.read() if length is None else fh.read(length)
    if length is not None and len(data) != length:
        raise UserError(f"external data file {loc!r} is shorter than tensor {t.name!r} needs "
                        f"({offset} + {length} bytes)")
    return data


def _inline(t: onnx.TensorProto, base: Path) -> None:
    t.raw_data = read_bytes(t, base)
    t.data_location = onnx.TensorProto.DEFAULT
    del t.external_data[:]


def tensor_array(t: onnx.TensorProto):
    """`numpy_helper.to_array`, an external tensor read from its registered file."""
    from onnx import numpy_helper

    if not is_external(t):
        return numpy_helper.to_array(t)
    base = _BASES.get(location_of(t))
    if base is None:
        raise UserError(f"external data of tensor {t.name!r} is not known to this process")
    c = onnx.TensorProto()
    c.CopyFrom(t)
    _inline(c, Path(base))
    return numpy_helper.to_array(c)


def file_digest(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for b in iter(lambda: fh.read(chunk), b""):
            h.update(b)
    return h.hexdigest()


def data_files(model: onnx.ModelProto, base: Path) -> list[dict]:
    """Each data file with its size and sha256 (part of the model's identity:
    other weights are another model, hence another session)."""
    out = []
    for loc in locations(model):
        p = Path(base) / loc
        out.append({"location": loc, "bytes": p.stat().st_size, "sha256": file_digest(p)})
    return out


def session_name(rec: dict) -> str:
    """`weights/<digest>_<file name>`: the content names the file."""
    from bisect_tui.core.graph import safe_name

    name = safe_name(Path(rec["location"]).name, 60)
    prefix = rec["sha256"][:16] + "_"
    # a session's own prepared model given as the model: its files already carry the digest
    return f"{WEIGHTS_DIR}/{name if name.startswith(prefix) else prefix + name}"


def copy_in(src: Path, dest: Path) -> None:
    """A copy written under a temporary name and renamed (a killed run leaves no half file)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.part")
    shutil.copyfile(src, tmp)
    os.replace(tmp, dest)


def link_or_copy(src: Path, dest: Path) -> str:
    """A hard link to `src` at `dest` (no bytes copied), or a copy across file systems."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.part")
    if tmp.exists():
        tmp.unlink()
    try:
        os.link(src, tmp)
        how = "hardlink"
    except OSError:
        shutil.copyfile(src, tmp)
        how = "copy"
    os.replace(tmp, dest)
    return how


def adopt_into_session(model: onnx.ModelProto, src_base: Path, records: list[dict], root: Path) -> list[dict]:
    """Give the session its own reference to every data file and point `model`'s
    locations at them (in place; the proto holds no weights, so this is cheap).

    A file already in the session (a rerun) is the same inode as the user's, or
    it is checked against the digest: one that differs is replaced, never
    trusted. A copy is verified after it is made."""
    from bisect_tui.core import safepath

    out = []
    for rec in records:
        name = session_name(rec)
        dest = safepath.inside(root, name)
        src = Path(src_base) / rec["location"]
        if dest.exists() and dest.stat().st_size == rec["bytes"] and file_digest(dest) == rec["sha256"]:
            how = "reused"  # a rerun: the session's copy, verified by digest
        else:
            copy_in(src, dest)
            how = "copied"
            if file_digest(dest) != rec["sha256"]:
                raise UserError(f"copying the external data file {rec['location']!r} into the session gave "
                                "other bytes (the file changed while it was read?); rerun")
        out.append({**rec, "session_file": name, "stored_as": how, "sha256_verified": True})
    renames = {rec["location"]: o["session_file"] for rec, o in zip(records, out)}
    for t in _externals(model.graph, []):
        for e in t.external_data:
            if e.key == "location":
                e.value = renames[e.value]
    register(model, root)
    return out


# A derived model (a culprit's subgraph) whose external weights are below this
# is written with them inside: it is then self-contained, so the repro bundle's
# copy of it runs anywhere. Above it, hard links (never copies) keep a search of
# a big model from writing its weights again per trial.
INLINE_MAX_BYTES = 64 << 20


def external_bytes(model: onnx.ModelProto) -> int:
    total = 0
    for t in _externals(model.graph, []):
        length = next((e.value for e in t.external_data if e.key == "length"), "")
        total += int(length) if length else (1 << 40)  # unknown: counts as big
    return total


def write_beside(model: onnx.ModelProto, path: Path) -> None:
    """Write a derived model (marked, extracted: its weights still in the data
    files) at `path`. Small external weights go inside it (self-contained);
    big ones stay outside, their locations resolving from `path`'s folder
    through hard links to the data files. Never a copy of big weights."""
    from bisect_tui.core import atomic

    path = Path(path)
    base = base_of(model)
    if base is not None and external_bytes(model) <= INLINE_MAX_BYTES:
        model = with_weights(model)
    elif base is not None:
        folder = Path(os.path.realpath(path.parent))
        if folder != Path(os.path.realpath(base)):
            for loc in locations(model):
                dest = folder / loc
                if not (dest.exists() and os.path.samefile(dest, Path(base) / loc)):
                    link_or_copy(Path(base) / loc, dest)
    atomic.write_bytes(path, model.SerializeToString())


def with_weights(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy holding its weights (for consumers that need them in memory, such as
    the float64 evaluator); the model itself is left as it is."""
    base = base_of(model)
    m = onnx.ModelProto()
    m.CopyFrom(model)
    if base is not None:
        for t in _externals(m.graph, []):
            _inline(t, base)
    return m


def load_with_weights(path: Path) -> onnx.ModelProto:
    """A model file with its weights in memory (a converter's input, such as the
    FP16 conversion), read by `read_bytes`: onnx.load refuses the session's
    linked data files."""
    model = load(path)
    return with_weights(model) if has_external_data(model) else model
