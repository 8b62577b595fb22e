"""Building and running ONNX Runtime sessions: the fused build with its marks,
the saved optimized graph it is mapped from, and the caches a search of dozens
of builds of one model relies on.

Why it looks the way it does (facts checked in the project notes on ORT):

* ORT refuses to fuse across a graph output, so "marked" tensors are simply
  added to the graph outputs before the session is built.
* The session saves its optimized graph (`optimized_model_filepath`); that file
  is the only reliable view of what ORT fused, and reloading it at
  ORT_DISABLE_ALL reproduces the fused outputs bit for bit.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import threading
import uuid
import weakref
from pathlib import Path
from typing import Callable, Collection, Optional, Sequence

import numpy as np
import onnx

from bisect_tui.api import LEVELS, EngineBuildError, EngineConfig, EngineRunError, EnvironmentFault, FusedNode, UserError
from bisect_tui.core.external_data import has_external_data
from bisect_tui.core.graph import mark_outputs
from bisect_tui.core.onnx_files import (
    existing_tensors as _existing_tensors,
    file_hash as _file_hash,
    first_line as _first_line,
    load_model as _load,
    uses_external_data_file as _uses_external_data_file,
)
from bisect_tui.core.onnx_files import save_model as _save_any
from bisect_tui.engines.ort.declare import ORT_PRECISIONS, providers_of
from bisect_tui.engines.ort.loading import load_runnable as _load_runnable
from bisect_tui.engines.ort.unfused import EXTERNAL_FOLDER
from bisect_tui.engines.ort.fusedmap import fused_node_map
from bisect_tui.engines.ort.levels import graph_level
from bisect_tui.engines.ort.passes import known_optimizers


# A protobuf message cannot be serialized above 2 GiB; stay well below it.
EXTERNAL_DATA_THRESHOLD = 1_800_000_000


def _threshold() -> int:
    """Model size above which weights go to an external file (a module global,
    read at each save, so a test can lower it)."""
    return EXTERNAL_DATA_THRESHOLD


def _save_model(model: onnx.ModelProto, path: Path) -> None:
    _save_any(model, path, _threshold())


def ort_errors() -> tuple[type[BaseException], ...]:
    """Exception classes ORT raises for a bad model or option (version independent)."""
    from onnxruntime.capi import onnxruntime_pybind11_state as C

    classes: list[type[BaseException]] = [RuntimeError, ValueError]
    for name in dir(C):
        obj = getattr(C, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            classes.append(obj)
    return tuple(classes)


def _build_error(e: BaseException) -> EngineBuildError:
    return EngineBuildError(f"ONNX Runtime could not build the fused engine: {_first_line(e)}", _first_line(e),
                            str(e).strip())


def _run_error(e: BaseException) -> EngineRunError:
    return EngineRunError(f"ONNX Runtime failed running the fused engine: {_first_line(e)}", _first_line(e),
                          str(e).strip())


def validate_basics(config: EngineConfig) -> None:
    """Level, precision and providers: what every build checks first."""
    if config.level not in LEVELS:
        raise UserError(f"unknown optimization level {config.level!r}; use one of {', '.join(LEVELS)}")
    if config.precision not in ORT_PRECISIONS:
        raise UserError(f"precision {config.precision!r} is not one ONNX Runtime CPU runs here; "
                        f"use one of {', '.join(ORT_PRECISIONS)}")
    import onnxruntime

    available = onnxruntime.get_available_providers()
    missing = [p for p in providers_of(config) if p not in available]
    if missing:
        # ORT would warn and silently fall back to CPU, comparing the wrong engine
        raise UserError(
            f"execution provider {missing[0]} is not available in this onnxruntime "
            f"({onnxruntime.__version__}); available: {', '.join(available)}"
        )


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
            original = _original_for_map(self.source_path)
            optimized = onnx.load(str(self.optimized_model_path), load_external_data=False)
            self._fused = fused_node_map(original, optimized, known_optimizers())
        return self._fused

    def run(self, feeds: dict[str, np.ndarray], names: Optional[Sequence[str]] = None) -> dict[str, np.ndarray]:
        """All outputs (graph outputs, then marked tensors) by name, or only `names`."""
        if self._session is None:
            raise RuntimeError("engine is closed")
        wanted = self.output_names if names is None else [n for n in names if n in set(self.output_names)]
        try:
            values = self._session.run(wanted, feeds)
        except ort_errors() as e:
            # the engine built but its kernels fail on these inputs: a finding
            raise _run_error(e) from None
        return dict(zip(wanted, values))

    observable = True  # False: the optimized graph's weights were too big to keep

    def observe(self, feeds: dict[str, np.ndarray], tensors) -> dict[str, np.ndarray]:
        if self.optimized_model_path is None or not self.observable:
            return {}
        from bisect_tui.engines.ort.observer import OrtObserver

        return OrtObserver(self.optimized_model_path).observe(feeds, tensors)

    def fusions_across(self, marks) -> list[FusedNode]:
        return []  # ORT never fuses across a graph output

    def precision_used(self) -> str:
        return self.config.precision

    def close(self) -> None:
        """Release the session (its memory) and the temp dir if this object owns one."""
        self._session = None
        if self._tmpdir is not None:
            self._finalizer()
            self._tmpdir = None
            self.optimized_model_path = None


# The model a marked build starts from, with its tensor names and inferred
# types: a search builds the same model dozens of times with different marks,
# and loading plus shape inference was a tenth of each build on a 5,000-node
# graph. Kept for models up to this size only (the proto holds the weights),
# keyed by the file's identity so a changed file is read again.
_BASE_CACHE_MAX_BYTES = 256 << 20
_BASE_CACHE: dict[tuple, tuple] = {}


_MAP_ORIGINAL: list = []  # [(file identity, model)], newest last: the original graphs of the last maps
_MAP_ORIGINAL_KEPT = 4  # the whole model and the subgraphs a search maps against in turn
_MAP_LOCK = threading.Lock()


def _file_key(path: Path) -> tuple:
    st = os.stat(path)
    return (str(Path(path).resolve()), st.st_ino, st.st_size, st.st_mtime_ns)


def _original_for_map(path: Path) -> onnx.ModelProto:
    """The model a fused-node map starts from (no weights), read once per file
    identity: every build of a search maps back to the same original graph, and
    fused_node_map keeps that graph's index while the object is the same
    (its load and index were a third of a map on a 5,000-node model); a
    subgraph mapped in between does not push the whole model out."""
    key = _file_key(path)
    with _MAP_LOCK:  # builds map in several threads
        for k, (have, model) in enumerate(_MAP_ORIGINAL):
            if have == key:
                _MAP_ORIGINAL.append(_MAP_ORIGINAL.pop(k))
                return model
    model = _load(path, load_external=False)
    _keep_original(key, model)
    return model


def _keep_original(key: tuple, model: onnx.ModelProto) -> None:
    """Newest last; when full, the oldest of the smallest goes first: a round's four
    subgraph maps had pushed out the whole model, which the next whole-graph map then
    read and indexed again (0.4 CPU-s at 21,000 nodes)."""
    with _MAP_LOCK:
        kept = [e for e in _MAP_ORIGINAL if e[0] != key] + [(key, model)]
        while len(kept) > _MAP_ORIGINAL_KEPT:
            sizes = [len(m.graph.node) for _, m in kept[:-1]]
            kept.pop(sizes.index(min(sizes)))
        _MAP_ORIGINAL[:] = kept


def know_original(path: Path, model: onnx.ModelProto, index) -> None:
    """`model` (every node named) is what the file at `path` holds now, and `index`
    its GraphIndex: maps of engines built from that file start from them instead
    of reading and indexing the file again."""
    from bisect_tui.engines.ort.fusedmap import adopt_original

    _keep_original(_file_key(path), model)
    adopt_original(model, model, index)


def marking_base(path: Path) -> tuple:
    key = _file_key(path)  # (path, inode, size, mtime)
    hit = _BASE_CACHE.get(key)
    if hit is not None:
        return hit
    model = _load_runnable(path)
    # marks go in untyped: ORT types each from the node that makes it, fp16 ones too,
    # so the marked builds need no shape inference (0.07 s on a 5,000-node model);
    # whether its weights are outside, walked once here, not again per build
    entry = (model, _existing_tensors(model), {}, has_external_data(model))
    if key[2] <= _BASE_CACHE_MAX_BYTES:  # with external data the proto holds no weights: small
        _BASE_CACHE.clear()  # one model at a time: the search's
        _BASE_CACHE[key] = entry
    return entry


def build(
    model_path: Path,
    config: EngineConfig,
    marked: Collection[str] = (),
    workdir: Optional[Path] = None,
    entered: Optional[Callable[[], None]] = None,
    save_optimized: bool = True,
    given: Optional[onnx.ModelProto] = None,
) -> OrtBuilt:
    """Build the fused session for `config` with `marked` tensors kept observable.

    Marked tensors that do not exist in the model to build (e.g. renamed by
    the fp16 converter) are skipped and listed in `OrtBuilt.unmarkable`.
    ORT errors (invalid model, bad config value) become a one-line
    `UserError`. Without `workdir` the built object owns a temp dir that
    holds the saved optimized graph until `close()`."""
    model_path = Path(model_path)
    validate_basics(config)
    if given is not None and (save_optimized or workdir is not None or config.precision != "fp32"):
        given = None  # the file's identity names what is saved, and the FP16 conversion reads it
    if given is None and not model_path.exists():
        raise UserError(f"model file not found: {model_path}")
    tmpdir: Optional[tempfile.TemporaryDirectory] = None
    # a build whose graph nobody reads (a part of a marked build) needs a folder only
    # for an FP16 conversion or a marked model too big to pass as bytes
    if workdir is None and (save_optimized or config.precision == "fp16"
                            or _marked_size(model_path, marked, given) > _threshold()):
        tmpdir = tempfile.TemporaryDirectory(prefix="bisect_tui_ort_")
        workdir = Path(tmpdir.name)
        given = None
    try:
        return _build_in(model_path, config, marked, Path(workdir) if workdir is not None else None, tmpdir,
                         entered, save_optimized, given)
    except BaseException:
        if tmpdir is not None:
            tmpdir.cleanup()
        raise


def _marked_size(path: Path, marked: Collection[str], given: Optional[onnx.ModelProto] = None) -> int:
    """Bytes a model file with `marked` tensors added as outputs would take, at most: the
    file's own size (it holds every weight that is not outside; `given`'s serialized size
    for a model handed in) and a name's room per mark, with the margin
    `model_size_estimate` keeps. Walking every initializer of each part of a parted
    build for this took 0.1 CPU-s a build at 21,000 nodes."""
    try:
        size = given.ByteSize() if given is not None else os.stat(path).st_size
    except OSError:
        return 0  # a missing file fails in the build, with its own message
    return size + 1_000_000 + sum(len(t) + 16 for t in marked)


def _build_in(
    model_path: Path,
    config: EngineConfig,
    marked: Collection[str],
    workdir: Optional[Path],
    tmpdir: Optional[tempfile.TemporaryDirectory],
    entered: Optional[Callable[[], None]] = None,
    save_optimized: bool = True,
    given: Optional[onnx.ModelProto] = None,
) -> OrtBuilt:
    """`given`: the model at `model_path`, in the caller's hands (a part of a parted
    build): built from memory, the file is not read back. Without a workdir nothing is
    named by the file's key, so a part costs no stat, hash or read of its file: each of
    those let go of the GIL and waited up to a switch interval to get it back from the
    check's Python (0.3-0.5 s over 33 parts at 21,000 nodes)."""
    import onnxruntime as ort

    if workdir is not None:
        workdir.mkdir(parents=True, exist_ok=True)
    marked = list(dict.fromkeys(t for t in marked if t))

    key = ""  # names only what is saved in the workdir
    if workdir is not None:
        key_blob = json.dumps(
            {"model": _file_hash(model_path), "config": config.key(), "marked": sorted(marked)},
            sort_keys=True,
        ).encode()
        key = hashlib.sha1(key_blob).hexdigest()[:12]

    unmarkable: list[str] = []
    base_path = model_path
    if config.precision == "fp16":
        from bisect_tui.engines.ort.fp16 import fp16_model_path  # the faithful FP16 conversion

        base_path = fp16_model_path(model_path, workdir, config.keep_fp32)
    if given is not None:
        model, existing, types, base_external = given, _existing_tensors(given), {}, has_external_data(given)
    elif marked:
        model, existing, types, base_external = marking_base(base_path)
    else:
        model, existing, types, base_external = None, set(), {}, False
    markable: list[str] = []
    if marked and model is not None:
        markable = [t for t in marked if t in existing]
        # e.g. a tensor the fp16 converter renamed: legitimate, reported to the caller
        unmarkable = [t for t in marked if t not in existing]
    model_arg: str | bytes
    external = base_external if model is not None else _uses_external_data_file(base_path)
    if markable and model is not None:
        # fp16: types come from the converted model, so marked tensors are fp16
        model = mark_outputs(model, markable, types)
        if not external and workdir is not None and _marked_size(base_path, markable, given) > _threshold():
            build_path = workdir / f"build_{key}.onnx"
            _save_model(model, build_path)
            model_arg = str(build_path)
        else:
            model_arg = model.SerializeToString()
    elif given is not None:
        model_arg = given.SerializeToString()  # the caller's copy: its file is not read back
    else:
        model_arg = str(base_path)  # nothing added: the file on disk is the model
    model = None  # weights can be big; ORT has its own copy now

    so = ort.SessionOptions()
    so.graph_optimization_level = graph_level(ort, config.level)
    # ORT writes the file during session creation; write under a unique name
    # and rename so a concurrent build of the same key never tears it.
    optimized = tmp_opt = None
    if save_optimized and workdir is not None:
        optimized = workdir / f"optimized_{key}.onnx"
        tmp_opt = workdir / f".optimized_{key}.{uuid.uuid4().hex[:8]}.onnx"
        so.optimized_model_filepath = str(tmp_opt)
    so.enable_cpu_mem_arena = False  # dumps of many tensors must stay memory bounded
    from bisect_tui.engines.ort.unfused import NO_SPIN

    if NO_SPIN[0] not in {str(k) for k, _ in config.config_entries}:  # the user's own value wins
        so.add_session_config_entry(*NO_SPIN)  # spinning pool threads took CPU from the other builds
    # FATAL only: ORT's warnings ("NCHWc model is hardware specific") and coloured ERROR
    # lines would garble the TUI and print before our one-line error (which says it all)
    from bisect_tui.engines.ort.unfused import ORT_QUIET, quiet_ort

    quiet_ort()
    so.log_severity_level = ORT_QUIET
    if isinstance(model_arg, bytes) and external:
        # the marked proto holds no weights: ORT reads them from the source's folder
        so.add_session_config_entry(EXTERNAL_FOLDER, str(base_path.parent.resolve()))
    if optimized is not None and (external or (isinstance(model_arg, str) and model_arg != str(base_path)
                                               and _uses_external_data_file(Path(model_arg)))):
        # a marked model saved with its weights outside: so are the optimized graph's
        so.add_session_config_entry(
            "session.optimized_model_external_initializers_file_name", optimized.name + ".data"
        )
        so.add_session_config_entry(
            "session.optimized_model_external_initializers_min_size_in_bytes", "1024"
        )
    try:
        for k, v in config.config_entries:
            so.add_session_config_entry(str(k), str(v))
        if entered is not None:  # the session is made without the GIL from here on
            entered()
        session = ort.InferenceSession(
            model_arg,
            so,
            providers=list(providers_of(config)),
            disabled_optimizers=list(config.disabled_passes),
        )
    except ort_errors() as e:
        if tmp_opt is None:
            raise _build_error(e) from None  # nothing was being saved: the engine's own verdict
        if tmp_opt.exists():
            tmp_opt.unlink()
        # A full disk or a file-size limit makes ORT fail while saving the
        # optimized graph, with a protobuf message that names neither. Such a
        # failure must not read as "this fusion breaks the build" (a verdict):
        # if the same build succeeds without saving, the machine is at fault.
        so.optimized_model_filepath = ""
        try:
            ort.InferenceSession(model_arg, so, providers=list(providers_of(config)),
                                 disabled_optimizers=list(config.disabled_passes))
        except ort_errors():
            raise _build_error(e) from None
        raise EnvironmentFault(
            f"ONNX Runtime could not write the optimized graph into {workdir} ({_first_line(e)}): "
            "the disk is full, a file-size limit or a permission stopped it; fix it and rerun") from None
    saved: Optional[Path] = None
    if tmp_opt is not None and tmp_opt.exists():
        os.replace(tmp_opt, optimized)
        saved = optimized
    # marked builds (a search's trials) only need the graph, for the map: their weights copy goes
    observable = not (saved is not None and external and markable and _drop_big_optimized_weights(tmp_opt, optimized))
    built = OrtBuilt(session, config, model_path, saved, unmarkable, tmpdir)
    built.observable = observable
    return built


# ORT writes the optimized graph's weights beside it (a full copy of the model's
# weights per build). The fused-node map needs only the graph; the observer and
# the fused-graph probe, which rerun the optimized graph, need the weights too,
# but only of unmarked builds (the check's, a workaround's). A marked build's
# copy above this size is deleted after the build: a search of dozens of marked
# builds of a 2.4 GB model would otherwise keep tens of GB (its observer then
# reports nothing).
OPTIMIZED_WEIGHTS_KEPT_MAX = 256 << 20


def _drop_big_optimized_weights(written: Path, optimized: Path) -> bool:
    data = written.with_name(optimized.name + ".data")
    if data.exists() and data.stat().st_size > OPTIMIZED_WEIGHTS_KEPT_MAX:
        data.unlink()
        return True
    return False
