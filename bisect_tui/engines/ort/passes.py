"""ONNX Runtime's pass names: learnt from the installed native library (they
changed between releases and unknown ones are ignored silently), read from
fused node names, from ORT's own log, and confirmed by a rebuild."""

from __future__ import annotations

import functools
import glob
import hashlib
import json
import os
import re
import tempfile
from collections import Counter
from pathlib import Path
from typing import Collection, Iterable, Optional

import numpy as np
import onnx

from bisect_tui.api import EngineConfig

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


def _scan_cache_path(libs: list[Path], kind: str = "optimizers") -> Path:
    from bisect_tui.core.session import state_home

    return state_home() / f"ort-{kind}-{_scan_cache_key(libs)}.json"


def _read_scan_cache(libs: list[Path], kind: str = "optimizers") -> Optional[set[str]]:
    try:
        data = json.loads(_scan_cache_path(libs, kind).read_text())
    except (OSError, ValueError, TypeError):
        return None
    if not isinstance(data, list) or not all(isinstance(x, str) for x in data):
        return None
    return set(data)


def _write_scan_cache(libs: list[Path], names: set[str], kind: str = "optimizers") -> None:
    try:
        from bisect_tui.core import atomic

        atomic.write_json(_scan_cache_path(libs, kind), sorted(names))
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


@functools.lru_cache(maxsize=1)
def known_config_keys() -> frozenset[str]:
    """Session config keys the INSTALLED onnxruntime knows, read from its binary.

    ORT accepts any key in `add_session_config_entry` and ignores the ones it
    does not know, so a misspelt key silently gives a PASS. The key literals
    (`session.*`, `optimization.*`, `mlas.*`, `ep.*`...) sit as C strings in the
    native library; a key ending in "." is a prefix family (`ep.cuda.`). Cached
    on disk like the optimizer names (the scan costs most of a second)."""
    libs = _native_libraries()
    cached = _read_scan_cache(libs, "config-keys")
    if cached is not None:
        return frozenset(cached)
    rx = re.compile(rb"(?<=\x00)((?:session|optimization|mlas|ep|kernel|memory|arena)\.[a-z0-9_.]{2,160})(?=\x00)")
    found: set[str] = set()
    for path in libs:
        try:
            data = path.read_bytes()
        except OSError:
            continue
        found.update(m.group(1).decode("ascii") for m in rx.finditer(data))
    if found:
        _write_scan_cache(libs, found, "config-keys")
    return frozenset(found)


def unknown_config_keys(keys: Iterable[str]) -> list[str]:
    """Keys the installed ORT does not know (empty when the scan found nothing: then it cannot tell)."""
    known = known_config_keys()
    if not known:
        return []
    prefixes = tuple(k for k in known if k.endswith("."))
    return [k for k in keys if k not in known and not k.startswith(prefixes)]


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

    from bisect_tui.engines.ort.engine import _LEVEL_NAMES, _fp16_model_path, _ort_errors

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
                                         disabled_optimizers=list(config.disabled_passes))
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
    from bisect_tui.engines.ort.engine import OrtEngine

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
            rest = tuple(sorted(set(config.disabled_passes) - {name}))
            base = EngineConfig(config.level, config.precision, config.config_entries, rest, config.providers)
            result[name] = signature(base) != signature(base.with_disabled([name]))
    finally:
        if own_tmp is not None:
            own_tmp.cleanup()
    return result
