"""ONNX Runtime as the fused engine.

Why this module looks the way it does (facts checked in the project notes on ORT):

* ORT refuses to fuse across a graph output, so "marked" tensors are simply
  added to the graph outputs before the session is built.
* The session saves its optimized graph (`optimized_model_filepath`); that file
  is the only reliable view of what ORT fused, and reloading it at
  ORT_DISABLE_ALL reproduces the fused outputs bit for bit.
* Fused nodes keep the output tensor names of the last original node they
  replace, so the fused-node map is computed from *tensor* names
  (`fused_node_map`), never from node names.
* ORT silently ignores optimizer names it does not know, and the names changed
  between releases. `known_optimizers` learns the names from the installed
  native library (a superset check) and `confirm_optimizer_effect` proves that
  disabling a name really changes the optimized graph.

onnxruntime is imported inside functions so that importing this module (and
`bisect-tui --help`) stays fast. Every API used exists in onnxruntime 1.16.
"""

from __future__ import annotations

import functools
import glob
import hashlib
import json
import os
import re
import tempfile
import uuid
import weakref
from collections import Counter
from pathlib import Path
from typing import Collection, Iterable, Optional

import numpy as np
import onnx

from bisect_tui.core.errors import EngineBuildError, EngineRunError, EnvironmentFault, UserError
from bisect_tui.core.graph import (
    GraphIndex,
    mark_outputs,
    name_nodes,
    node_inputs,
    tensor_types,
    toposort,
)
from bisect_tui.engines.base import LEVELS, PRECISIONS, EngineConfig, FusedNode

# Words ORT's optimizer names end with. Both the native-library scan and the
# node-name tag parser use them, so a name is "optimizer-like" in one place only.
_OPT_SUFFIXES = (
    "Fusion",
    "Elimination",
    "Transformer",
    "Approximation",
    "Rewrite",
    "Folding",
    "Optimizer",
)
# FusionL1/FusionL2 (level-suffixed names since ~1.20) are covered by the optional L<digit>.
_OPT_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]*(?:" + "|".join(_OPT_SUFFIXES) + r")(?:L[0-9])?$")
# GenerateNodeName appends `_token_<N>` when a generated name collides.
_TOKEN_SUFFIX_RE = re.compile(r"_token_[0-9]+$")

# Names that are infrastructure (base classes, bare suffixes), not optimizers a
# user can disable. Kept out so they never look like valid disable targets.
_NOT_OPTIMIZERS = frozenset(
    {
        "GraphTransformer",
        "RuleBasedGraphTransformer",
        "SelectorActionTransformer",
        "GenerateRuleBasedGraphTransformer",
        "FusionL1",
        "FusionL2",
        *_OPT_SUFFIXES,
    }
)

# Prefixes ORT puts in front of a tensor name when it makes a copy of the same
# values in another precision (the CPU provider runs most fp16 ops in fp32 and
# inserts casts: `InsertedCast_` up to ~1.2x, `InsertedPrecisionFreeCast_`
# later; constant casts are folded into `FusedBack_` initializers). Such a
# tensor *is* the original tensor for the map.
_ALIAS_PREFIXES = ("InsertedPrecisionFreeCast_", "InsertedCast_", "FusedBack_")

# Ops that only move/relabel data. When one of them ends a cluster of
# optimizer-made nodes (e.g. Reshape -> Gemm -> Reshape from MatMulAddFusion on
# 3-D inputs) the compute node in the cluster is what the user should see as
# "the fused node", so it inherits the cluster's original nodes.
_LAYOUT_OPS = frozenset(
    {
        "Cast",
        "CastLike",
        "Reshape",
        "Transpose",
        "Squeeze",
        "Unsqueeze",
        "Identity",
        "Flatten",
        "ReorderInput",
        "ReorderOutput",
    }
)

_LEVEL_NAMES = {
    "disable": "ORT_DISABLE_ALL",
    "basic": "ORT_ENABLE_BASIC",
    "extended": "ORT_ENABLE_EXTENDED",
    "all": "ORT_ENABLE_ALL",
}

# A protobuf message cannot be serialized above 2 GiB; stay well below it.
_EXTERNAL_DATA_THRESHOLD = 1_800_000_000


# --------------------------------------------------------------------------- names


def optimizer_tags(node_name: str, known: Collection[str]) -> list[str]:
    """Optimizer names ORT wrote into a fused node's name.

    Newer releases name a fused node `<original>/<Optimizer>/...`, e.g.
    `mm1/MatMulAddFusion/GemmTransposeFusion/` -> ["MatMulAddFusion",
    "GemmTransposeFusion"]. A component counts when it is a known optimizer or
    looks like one (the tag can differ from the disable name: the tag says
    `LayerNormFusion` while 1.32 disables it as `LayerNormFusionL1`). Names are
    kept as written (no L1/L2 stripping); a `_token_<N>` collision suffix is
    dropped. Order of first appearance, no duplicates."""
    tags: list[str] = []
    for comp in node_name.split("/"):
        comp = _TOKEN_SUFFIX_RE.sub("", comp)
        if not comp or comp in tags:
            continue
        if comp in known or _OPT_NAME_RE.match(comp):
            tags.append(comp)
    return tags


def _scan_library(data: bytes, found: set[str]) -> None:
    """Collect optimizer-like identifiers from one native library image.

    Three sources, because none alone is complete: null-terminated C strings
    ending in an optimizer suffix (the name literals; a literal can be
    tail-merged by the linker, e.g. `MatMulAddFusion` lives inside
    `/MatMulAddFusion\\0`, which the backward walk still finds), rewrite-rule
    names (`EliminateIdentity`, `FuseReluClip`), and RTTI class names
    (`N11onnxruntime20ConvActivationFusionE`) for names the compiler never
    stored as a C string."""
    ident = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")
    suffix_re = re.compile(
        rb"(?:Fusion(?:L[0-9])?|Elimination|Transformer|Approximation|Rewrite|Folding|Optimizer)\x00"
    )
    for m in suffix_re.finditer(data):
        end = m.end() - 1
        i = m.start()
        while i > 0 and data[i - 1] in ident and m.start() - i < 120:
            i -= 1
        found.add(data[i:end].decode("ascii"))
    for m in re.finditer(rb"\x00((?:Eliminate|Fuse)[A-Z][A-Za-z0-9_]{2,80})\x00", data):
        found.add(m.group(1).decode("ascii"))
    for m in re.finditer(rb"11onnxruntime([0-9]{1,3})([A-Za-z][A-Za-z0-9_]*)E", data):
        n = int(m.group(1))
        name = m.group(2)[:n].decode("ascii")
        if len(name) == n and _OPT_NAME_RE.match(name):
            found.add(name)


def _native_libraries() -> list[Path]:
    """The ORT native libraries shipped in the installed wheel."""
    import onnxruntime

    capi = Path(onnxruntime.__file__).parent / "capi"
    paths: list[Path] = []
    for pattern in (
        "onnxruntime_pybind11_state*.so",
        "onnxruntime_pybind11_state*.pyd",
        "libonnxruntime*.so*",
        "libonnxruntime*.dylib",
        "onnxruntime.dll",
    ):
        paths.extend(Path(p) for p in glob.glob(str(capi / pattern)))
    # provider plugins (CUDA, TensorRT) register no graph transformers of their
    # own that a user disables by name; skip them (they are hundreds of MB).
    return sorted({p for p in paths if "providers" not in p.name})


def _scan_cache_key(libs: list[Path]) -> str:
    parts = []
    for p in libs:
        try:
            st = p.stat()
            parts.append(f"{p}:{st.st_size}:{st.st_mtime_ns}")
        except OSError:
            parts.append(str(p))
    return hashlib.sha1("|".join(parts).encode()).hexdigest()[:16]


def _scan_cache_path(libs: list[Path]) -> Path:
    from bisect_tui.core.session import state_home

    return state_home() / f"ort-optimizers-{_scan_cache_key(libs)}.json"


def _read_scan_cache(libs: list[Path]) -> Optional[set[str]]:
    try:
        return set(json.loads(_scan_cache_path(libs).read_text()))
    except (OSError, ValueError, TypeError):
        return None


def _write_scan_cache(libs: list[Path], names: set[str]) -> None:
    try:
        from bisect_tui.core import atomic

        atomic.write_json(_scan_cache_path(libs), sorted(names))
    except OSError:
        pass  # a cache only; the scan result is used either way


@functools.lru_cache(maxsize=1)
def known_optimizers() -> frozenset[str]:
    """Optimizer names the INSTALLED onnxruntime knows, learnt from its binary.

    This is a superset check: every name ORT accepts in `disabled_optimizers`
    appears in the library, but so may a few strings that are not (tags,
    helper class names). It is good for warning about typos and about names
    from another release; `confirm_optimizer_effect` is the real proof that
    disabling a name changes the engine. Cached in memory and on disk (keyed by
    the libraries' paths, sizes and mtimes): a scan takes a few tenths of a second."""
    libs = _native_libraries()
    found = _read_scan_cache(libs)
    if found is None:
        found = set()
        for path in libs:
            try:
                data = path.read_bytes()
            except OSError:
                continue
            _scan_library(data, found)
        _write_scan_cache(libs, found)
    if "_RuleBasedTransformer" in found:
        # the rule containers are named "Level<N>_RuleBasedTransformer" at runtime
        found.update(f"Level{k}_RuleBasedTransformer" for k in (1, 2, 3))
    return frozenset(
        n for n in found if n and not n.startswith("_") and n not in _NOT_OPTIMIZERS
    )


def unknown_optimizers(names: Iterable[str]) -> list[str]:
    """Names the installed ORT does not know (it would silently ignore them)."""
    known = known_optimizers()
    return [n for n in names if n not in known]


def versions() -> dict[str, str]:
    """Versions recorded in every session so a report says what produced it."""
    import onnxruntime

    return {
        "onnxruntime": onnxruntime.__version__,
        "onnx": onnx.__version__,
        "numpy": np.__version__,
        "providers": ",".join(onnxruntime.get_available_providers()),
    }


# --------------------------------------------------------------------------- map


def _ensure_named(model: onnx.ModelProto) -> onnx.ModelProto:
    """GraphIndex keys nodes by name; give a copy unique names if needed."""
    names = [n.name for n in model.graph.node]
    if all(names) and len(set(names)) == len(names):
        return model
    m = onnx.ModelProto()
    m.CopyFrom(model)
    name_nodes(m)
    return m


def fused_node_map(
    original: onnx.ModelProto,
    optimized: onnx.ModelProto,
    known_optimizers: Collection[str],
) -> list[FusedNode]:
    """Map every node of ORT's optimized graph to the original nodes it replaced.

    Mapping is by tensor names because ORT keeps the output tensor names of the
    last original node of a fused pattern and takes the pattern's external
    inputs. For an optimized node N:

    * its *boundary* is its inputs, where an input that does not exist in the
      original graph (an optimizer-made tensor such as `reorder_token_*`,
      `*_reshape_arg`, fp16 cast outputs) is resolved by walking back through
      the optimized graph's producers until original tensors are reached;
    * its original nodes are those reached walking back in the ORIGINAL graph
      from N's output tensors that exist there, stopping at the boundary
      (initializers and graph inputs are never nodes).

    A node whose outputs are all new tensors is glue and gets [] - its work is
    counted by the consumer that exposes an original tensor. One refinement:
    when that consumer is a pure layout op (Reshape/Cast/...) and the glue
    walked through contains a compute node (the Gemm of a Reshape-Gemm-Reshape
    MatMulAddFusion, the real op behind an fp16 output Cast), the compute node
    takes the original nodes, so the user sees "Gemm covers MatMul+Add".

    Tensors renamed by ORT's fp16 handling (`InsertedPrecisionFreeCast_X`,
    `InsertedCast_X`, `FusedBack_X`) stand for X, and so do renamed outputs of
    a node that kept its name, op and domain. Result is in the optimized graph's topological
    order."""
    original = _ensure_named(original)
    oidx = GraphIndex.build(original)
    og = original.graph
    orig_tensors = set(oidx.producer) | {i.name for i in og.input} | oidx.initializers
    orig_names = set(oidx.by_name)

    g = optimized.graph
    # A node ORT left as it was keeps its name, op and domain; if its outputs
    # were renamed anyway (cast insertion with a prefix this code doesn't know)
    # they are still that node's original outputs.
    survivor_alias: dict[str, str] = {}
    # The fp16 converter (keep_io_types) ends each graph output with a Cast back
    # to float32; what feeds that Cast holds the graph output's values. This
    # wins over the name rule below: a node that kept its name may have been
    # rewired to produce another node's output (ConvBNFusion keeps the Conv and
    # gives it the BatchNormalization's output).
    graph_outs = set(oidx.graph_outputs)
    for n in g.node:
        if (n.op_type == "Cast" and len(n.output) == 1 and n.output[0] in graph_outs and n.input
                and n.input[0] and n.input[0] not in orig_tensors):
            survivor_alias[n.input[0]] = n.output[0]
    for n in g.node:
        o = oidx.by_name.get(n.name)
        if o is None or o.op_type != n.op_type or o.domain != n.domain or len(o.output) != len(n.output):
            continue
        for new_t, old_t in zip(n.output, o.output):
            if new_t and old_t and new_t not in orig_tensors:
                survivor_alias.setdefault(new_t, old_t)

    # NchwcTransformer names each blocked-layout node `<original output>_nchwc`;
    # its (new) output holds that original tensor's values in NCHWc layout.
    # Without this the whole convolution trunk between ReorderInput and
    # ReorderOutput would collapse into one "fused node" at level "all".
    for n in g.node:
        if n.domain != "com.microsoft.nchwc" or len([o for o in n.output if o]) != 1:
            continue
        base = _TOKEN_SUFFIX_RE.sub("", n.name)
        for prefix in _ALIAS_PREFIXES:
            if base.startswith(prefix):
                base = base[len(prefix):]
        if base.endswith("_nchwc") and base[: -len("_nchwc")] in oidx.producer:
            out = n.output[0]
            if out not in orig_tensors:
                survivor_alias.setdefault(out, base[: -len("_nchwc")])

    def canon(t: str) -> Optional[str]:
        if t in orig_tensors:
            return t
        for prefix in _ALIAS_PREFIXES:
            if t.startswith(prefix) and t[len(prefix):] in orig_tensors:
                return t[len(prefix):]
        return survivor_alias.get(t)

    available = {i.name for i in g.input} | {i.name for i in g.initializer} | {
        i.values.name for i in g.sparse_initializer
    }
    nodes = toposort(list(g.node), available)
    producer: dict[str, int] = {}
    for k, n in enumerate(nodes):
        for o in n.output:
            if o:
                producer[o] = k

    # tensor -> (original boundary tensors, indices of glue nodes walked through)
    memo: dict[str, tuple[frozenset[str], frozenset[int]]] = {}

    def resolve(tensor: str) -> tuple[frozenset[str], frozenset[int]]:
        if tensor in memo:
            return memo[tensor]
        # iterative post-order walk: optimized graphs can be deep
        stack: list[tuple[str, bool]] = [(tensor, False)]
        on_stack: set[str] = set()
        while stack:
            t, expanded = stack.pop()
            if t in memo:
                continue
            c = canon(t)
            if c is not None:
                memo[t] = (frozenset({c}), frozenset())
                continue
            k = producer.get(t)
            if k is None:  # a new initializer / input: no original twin, no work
                memo[t] = (frozenset(), frozenset())
                continue
            ins = node_inputs(nodes[k])
            if not expanded:
                if t in on_stack:  # cycle guard (invalid graph); treat as a dead end
                    memo[t] = (frozenset(), frozenset({k}))
                    continue
                on_stack.add(t)
                stack.append((t, True))
                stack.extend((i, False) for i in ins if i not in memo)
                continue
            bound: set[str] = set()
            glue: set[int] = {k}
            for i in ins:
                b, gl = memo.get(i, (frozenset(), frozenset()))
                bound |= b
                glue |= gl
            memo[t] = (frozenset(bound), frozenset(glue))
        return memo[tensor]

    originals: dict[int, set[str]] = {}
    extra_tags: dict[int, list[str]] = {}

    def tags_of(n: onnx.NodeProto) -> list[str]:
        if n.name in orig_names:  # an original node left as it was
            return []
        name = n.name
        # don't read tags out of the original node name the fused one starts with
        head = name
        while "/" in head:
            head = head.rsplit("/", 1)[0]
            if head in orig_names:
                name = name[len(head):]
                break
        return optimizer_tags(name, known_optimizers)

    for k, n in enumerate(nodes):
        outs = [c for c in (canon(o) for o in n.output if o) if c is not None]
        outs = [c for c in outs if c in oidx.producer]
        if not outs:
            continue
        boundary: set[str] = set()
        glue: set[int] = set()
        for i in node_inputs(n):
            b, gl = resolve(i)
            boundary |= b
            glue |= gl
        covered = oidx.ancestors_within(outs, boundary)
        if not covered:
            continue
        rep = k
        if n.op_type in _LAYOUT_OPS and covered != [n.name]:
            compute = [j for j in glue if nodes[j].op_type not in _LAYOUT_OPS]
            if compute:
                rep = max(compute)
                extra_tags.setdefault(rep, []).extend(tags_of(n))
        originals.setdefault(rep, set()).update(covered)

    result: list[FusedNode] = []
    for k, n in enumerate(nodes):
        tags = tags_of(n)
        for t in extra_tags.get(k, []):
            if t not in tags:
                tags.append(t)
        result.append(
            FusedNode(
                name=n.name,
                op_type=n.op_type,
                domain=n.domain,
                inputs=list(n.input),
                outputs=list(n.output),
                original_nodes=sorted(originals.get(k, ()), key=oidx.order.__getitem__),
                optimizers=tags,
            )
        )
    return result


# --------------------------------------------------------------------------- build helpers


@functools.lru_cache(maxsize=64)
def _file_hash_cached(path: str, size: int, mtime_ns: int) -> str:
    h = hashlib.sha1()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def _file_hash(path: Path) -> str:
    """Content hash of a model file (cached per path/size/mtime: models are big)."""
    st = path.stat()
    return _file_hash_cached(str(path.resolve()), st.st_size, st.st_mtime_ns)


def _tensor_bytes(t: onnx.TensorProto) -> int:
    if t.raw_data:
        return len(t.raw_data)
    n = 1
    for d in t.dims:
        n *= d
    return n * 8  # upper bound for typed fields


def _model_size_estimate(model: onnx.ModelProto) -> int:
    """Bytes the serialized model would take, without serializing (which fails >2 GiB)."""
    total = sum(_tensor_bytes(t) for t in model.graph.initializer)
    for n in model.graph.node:
        for a in n.attribute:
            if a.HasField("t"):
                total += _tensor_bytes(a.t)
    return total + 1_000_000


def _uses_external_data(model: onnx.ModelProto) -> bool:
    return any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer)


def _save_model(model: onnx.ModelProto, path: Path) -> None:
    """Write a model for ORT; with external data when it would not fit in protobuf.

    The .onnx is written under a temporary name and renamed, so a concurrent
    reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        if _model_size_estimate(model) > _EXTERNAL_DATA_THRESHOLD:
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


def _ort_errors() -> tuple[type[BaseException], ...]:
    """Exception classes ORT raises for a bad model or option (version independent)."""
    from onnxruntime.capi import onnxruntime_pybind11_state as C

    classes: list[type[BaseException]] = [RuntimeError, ValueError]
    for name in dir(C):
        obj = getattr(C, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            classes.append(obj)
    return tuple(classes)


def _first_line(e: BaseException) -> str:
    text = str(e).strip() or type(e).__name__
    return text.splitlines()[0]


def _build_error(e: BaseException) -> EngineBuildError:
    return EngineBuildError(f"ONNX Runtime could not build the fused engine: {_first_line(e)}", _first_line(e))


def _run_error(e: BaseException) -> EngineRunError:
    return EngineRunError(f"ONNX Runtime failed running the fused engine: {_first_line(e)}", _first_line(e))


def _load(path: Path, load_external: bool = True) -> onnx.ModelProto:
    try:
        return onnx.load(str(path), load_external_data=load_external)
    except FileNotFoundError:
        raise UserError(f"model file not found: {path}") from None
    except Exception as e:  # DecodeError and friends: not an ONNX file
        raise UserError(f"could not read ONNX model {path}: {_first_line(e)}") from None


def _validate(config: EngineConfig) -> None:
    if config.level not in LEVELS:
        raise UserError(f"unknown optimization level {config.level!r}; use one of {', '.join(LEVELS)}")
    if config.precision not in PRECISIONS:
        raise UserError(f"unknown precision {config.precision!r}; use one of {', '.join(PRECISIONS)}")
    import onnxruntime

    available = onnxruntime.get_available_providers()
    missing = [p for p in config.providers if p not in available]
    if missing:
        # ORT would warn and silently fall back to CPU, comparing the wrong engine
        raise UserError(
            f"execution provider {missing[0]} is not available in this onnxruntime "
            f"({onnxruntime.__version__}); available: {', '.join(available)}"
        )


def _fp16_model_path(model_path: Path, workdir: Path, keep_fp32: Collection[str] = ()) -> Path:
    """The fp16 conversion of `model_path`, cached in workdir by source hash
    and keep-set.

    Conversion is deterministic but not free on big models and a bisection
    builds dozens of engines from the same source, so convert once. The
    keep-set goes to the converter's `node_block_list`: those original nodes
    stay FP32, with casts around them."""
    keep = sorted(set(keep_fp32))
    tag = "" if not keep else "_keep" + hashlib.sha1("\n".join(keep).encode()).hexdigest()[:10]
    cached = workdir / f"fp16_{_file_hash(model_path)}{tag}.onnx"
    if cached.exists():
        return cached
    from onnxruntime.transformers.float16 import convert_float_to_float16

    model = _load(model_path)
    try:
        converted = convert_float_to_float16(model, keep_io_types=True, node_block_list=keep or None)
    except Exception as e:  # the converter asserts on models it cannot handle
        raise EngineBuildError(f"could not convert the model to fp16: {_first_line(e)}", _first_line(e)) from None
    _save_model(converted, cached)
    return cached


def _existing_tensors(model: onnx.ModelProto) -> set[str]:
    g = model.graph
    names = {o for n in g.node for o in n.output if o}
    names |= {i.name for i in g.input} | {i.name for i in g.initializer}
    return names


# --------------------------------------------------------------------------- engine


class OrtBuilt:
    """A built ORT session plus what is needed to explain it (the saved optimized graph)."""

    def __init__(
        self,
        session,
        config: EngineConfig,
        source_path: Path,
        optimized_model_path: Optional[Path],
        unmarkable: list[str],
        tmpdir: Optional[tempfile.TemporaryDirectory] = None,
    ):
        self._session = session
        self.config = config
        self.source_path = source_path
        self.optimized_model_path: Optional[Path] = optimized_model_path
        self.unmarkable = unmarkable
        self.output_names: list[str] = [o.name for o in session.get_outputs()]
        self._fused: Optional[list[FusedNode]] = None
        self._tmpdir = tmpdir
        if tmpdir is not None:
            # the temp dir lives as long as this object, even without close()
            self._finalizer = weakref.finalize(self, tmpdir.cleanup)

    @property
    def fused_nodes(self) -> list[FusedNode]:
        """Computed on first use: loading both graphs costs time the run path doesn't need."""
        if self._fused is None:
            if self.optimized_model_path is None or not self.optimized_model_path.exists():
                raise RuntimeError("the optimized model is gone (engine closed?)")
            original = _load(self.source_path, load_external=False)
            optimized = onnx.load(str(self.optimized_model_path), load_external_data=False)
            self._fused = fused_node_map(original, optimized, known_optimizers())
        return self._fused

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """All outputs (graph outputs, then marked tensors) by name."""
        if self._session is None:
            raise RuntimeError("engine is closed")
        try:
            values = self._session.run(self.output_names, feeds)
        except _ort_errors() as e:
            # the engine built but its kernels fail on these inputs: a finding
            raise _run_error(e) from None
        return dict(zip(self.output_names, values))

    def close(self) -> None:
        """Release the session (its memory) and the temp dir if this object owns one."""
        self._session = None
        if self._tmpdir is not None:
            self._finalizer()
            self._tmpdir = None
            self.optimized_model_path = None


class OrtEngine:
    """ONNX Runtime engine (see module docstring for the facts it relies on)."""

    name = "ort"

    def build(
        self,
        model_path: Path,
        config: EngineConfig,
        marked: Collection[str] = (),
        workdir: Optional[Path] = None,
    ) -> OrtBuilt:
        """Build the fused session for `config` with `marked` tensors kept observable.

        Marked tensors that do not exist in the model to build (e.g. renamed by
        the fp16 converter) are skipped and listed in `OrtBuilt.unmarkable`.
        ORT errors (invalid model, bad config value) become a one-line
        `UserError`. Without `workdir` the built object owns a temp dir that
        holds the saved optimized graph until `close()`."""
        model_path = Path(model_path)
        _validate(config)
        if not model_path.exists():
            raise UserError(f"model file not found: {model_path}")
        tmpdir: Optional[tempfile.TemporaryDirectory] = None
        if workdir is None:
            tmpdir = tempfile.TemporaryDirectory(prefix="bisect_tui_ort_")
            workdir = Path(tmpdir.name)
        try:
            return self._build(model_path, config, marked, Path(workdir), tmpdir)
        except BaseException:
            if tmpdir is not None:
                tmpdir.cleanup()
            raise

    def _build(
        self,
        model_path: Path,
        config: EngineConfig,
        marked: Collection[str],
        workdir: Path,
        tmpdir: Optional[tempfile.TemporaryDirectory],
    ) -> OrtBuilt:
        import onnxruntime as ort

        workdir.mkdir(parents=True, exist_ok=True)
        marked = list(dict.fromkeys(t for t in marked if t))
        key_blob = json.dumps(
            {"model": _file_hash(model_path), "config": config.key(), "marked": sorted(marked)},
            sort_keys=True,
        ).encode()
        key = hashlib.sha1(key_blob).hexdigest()[:12]

        unmarkable: list[str] = []
        base_path = (_fp16_model_path(model_path, workdir, config.keep_fp32)
                     if config.precision == "fp16" else model_path)
        model = _load(base_path) if marked else None
        markable: list[str] = []
        if marked and model is not None:
            existing = _existing_tensors(model)
            markable = [t for t in marked if t in existing]
            # e.g. a tensor the fp16 converter renamed: legitimate, reported to the caller
            unmarkable = [t for t in marked if t not in existing]
        model_arg: str | bytes
        if markable and model is not None:
            # fp16: types come from the converted model, so marked tensors are fp16
            model = mark_outputs(model, markable, tensor_types(model))
            if _model_size_estimate(model) > _EXTERNAL_DATA_THRESHOLD:
                build_path = workdir / f"build_{key}.onnx"
                _save_model(model, build_path)
                model_arg = str(build_path)
            else:
                model_arg = model.SerializeToString()
        else:
            model_arg = str(base_path)  # nothing added: the file on disk is the model
        model = None  # weights can be big; ORT has its own copy now

        so = ort.SessionOptions()
        so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, _LEVEL_NAMES[config.level])
        optimized = workdir / f"optimized_{key}.onnx"
        # ORT writes the file during session creation; write under a unique name
        # and rename so a concurrent build of the same key never tears it.
        tmp_opt = workdir / f".optimized_{key}.{uuid.uuid4().hex[:8]}.onnx"
        so.optimized_model_filepath = str(tmp_opt)
        so.enable_cpu_mem_arena = False  # dumps of many tensors must stay memory bounded
        # FATAL only: ORT's warnings ("NCHWc model is hardware specific") and coloured ERROR
        # lines would garble the TUI and print before our one-line error (which says it all)
        from bisect_tui.core.runner import ORT_QUIET, quiet_ort

        quiet_ort()
        so.log_severity_level = ORT_QUIET
        if isinstance(model_arg, str) and _uses_external_data_file(Path(model_arg)):
            so.add_session_config_entry(
                "session.optimized_model_external_initializers_file_name", optimized.name + ".data"
            )
            so.add_session_config_entry(
                "session.optimized_model_external_initializers_min_size_in_bytes", "1024"
            )
        try:
            for k, v in config.config_entries:
                so.add_session_config_entry(str(k), str(v))
            session = ort.InferenceSession(
                model_arg,
                so,
                providers=list(config.providers),
                disabled_optimizers=list(config.disabled_optimizers),
            )
        except _ort_errors() as e:
            if tmp_opt.exists():
                tmp_opt.unlink()
            # A full disk or a file-size limit makes ORT fail while saving the
            # optimized graph, with a protobuf message that names neither. Such a
            # failure must not read as "this fusion breaks the build" (a verdict):
            # if the same build succeeds without saving, the machine is at fault.
            so.optimized_model_filepath = ""
            try:
                ort.InferenceSession(model_arg, so, providers=list(config.providers),
                                     disabled_optimizers=list(config.disabled_optimizers))
            except _ort_errors():
                raise _build_error(e) from None
            raise EnvironmentFault(
                f"ONNX Runtime could not write the optimized graph into {workdir} ({_first_line(e)}): "
                "the disk is full, a file-size limit or a permission stopped it; fix it and rerun") from None
        saved: Optional[Path] = None
        if tmp_opt.exists():
            os.replace(tmp_opt, optimized)
            saved = optimized
        return OrtBuilt(session, config, model_path, saved, unmarkable, tmpdir)

    def known_optimizers(self) -> set[str]:
        return set(known_optimizers())

    def unknown_optimizers(self, names: Iterable[str]) -> list[str]:
        return unknown_optimizers(names)

    def versions(self) -> dict[str, str]:
        return versions()

    def modifying_passes(self, model_path: Path, config: EngineConfig) -> Optional[list[str]]:
        return modifying_passes(model_path, config)

    def confirm_optimizer_effect(
        self,
        model_path: Path,
        config: EngineConfig,
        optimizer_names: Iterable[str],
        workdir: Optional[Path] = None,
    ) -> dict[str, bool]:
        return confirm_optimizer_effect(model_path, config, optimizer_names, workdir)


_STDERR_LOCK = __import__("threading").Lock()
_MODIFIED_RE = re.compile(r"GraphTransformer (\S+) modified: 1")


def modifying_passes(model_path: Path, config: EngineConfig) -> Optional[list[str]]:
    """Names of the graph transformers ORT's own log says modified this model
    (session log at INFO: "GraphTransformer X modified: 1"), in log order.

    The log goes to the process's stderr from native code, so fd 2 is pointed
    at a temp file for the session creation (under a lock). Rewrite rules run
    inside `Level<N>_RuleBasedTransformer` and are logged under that name.
    None when the log could not be read (never a reason to fail)."""
    import onnxruntime as ort

    model_path = Path(model_path)
    with tempfile.TemporaryDirectory(prefix="bisect_tui_log_") as d:
        base = (_fp16_model_path(model_path, Path(d), config.keep_fp32)
                if config.precision == "fp16" else model_path)
        so = ort.SessionOptions()
        so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, _LEVEL_NAMES[config.level])
        so.log_severity_level = 1
        for k, v in config.config_entries:
            so.add_session_config_entry(str(k), str(v))
        log = Path(d) / "ort.log"
        with _STDERR_LOCK:
            try:
                import sys

                sys.stderr.flush()
                fd = os.open(log, os.O_WRONLY | os.O_CREAT, 0o600)
                saved = os.dup(2)
            except OSError:
                return None
            try:
                os.dup2(fd, 2)
                try:
                    ort.InferenceSession(str(base), so, providers=list(config.providers),
                                         disabled_optimizers=list(config.disabled_optimizers))
                except _ort_errors():
                    pass  # the log up to the failure still says what ran
            finally:
                os.dup2(saved, 2)
                os.close(saved)
                os.close(fd)
        try:
            text = log.read_text(errors="replace")
        except OSError:
            return None
    return list(dict.fromkeys(_MODIFIED_RE.findall(text)))


def _uses_external_data_file(path: Path) -> bool:
    """Whether the model file at `path` keeps its weights outside (then so must the optimized one)."""
    try:
        return _uses_external_data(onnx.load(str(path), load_external_data=False))
    except Exception:
        return False


def _graph_signature(path: Path) -> Counter:
    m = onnx.load(str(path), load_external_data=False)
    return Counter((n.domain, n.op_type, n.name) for n in m.graph.node)


def confirm_optimizer_effect(
    model_path: Path,
    config: EngineConfig,
    optimizer_names: Iterable[str],
    workdir: Optional[Path] = None,
) -> dict[str, bool]:
    """For each name: does disabling it change ORT's optimized graph?

    ORT ignores unknown names silently, so a name from another release (or a
    typo) would make a "workaround" that changes nothing. This is the proof:
    build once with the name enabled and once disabled (everything else as in
    `config`) and compare the multiset of optimized nodes (domain, op_type,
    name). A name already disabled in `config` is tested the same way, by
    comparing against `config` without it."""
    engine = OrtEngine()
    own_tmp: Optional[tempfile.TemporaryDirectory] = None
    if workdir is None:
        own_tmp = tempfile.TemporaryDirectory(prefix="bisect_tui_confirm_")
        workdir = Path(own_tmp.name)
    sigs: dict[EngineConfig, Counter] = {}

    def signature(cfg: EngineConfig) -> Counter:
        if cfg not in sigs:
            built = engine.build(model_path, cfg, (), workdir)
            try:
                assert built.optimized_model_path is not None
                sigs[cfg] = _graph_signature(built.optimized_model_path)
            finally:
                built.close()
        return sigs[cfg]

    result: dict[str, bool] = {}
    try:
        for name in dict.fromkeys(optimizer_names):
            rest = tuple(sorted(set(config.disabled_optimizers) - {name}))
            base = EngineConfig(config.level, config.precision, config.config_entries, rest, config.providers)
            result[name] = signature(base) != signature(base.with_disabled([name]))
    finally:
        if own_tmp is not None:
            own_tmp.cleanup()
    return result


__all__ = [
    "OrtBuilt",
    "OrtEngine",
    "confirm_optimizer_effect",
    "fused_node_map",
    "known_optimizers",
    "modifying_passes",
    "optimizer_tags",
    "unknown_optimizers",
    "versions",
]
