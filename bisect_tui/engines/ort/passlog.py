"""What ONNX Runtime's own session log says about its passes, and the proof
that disabling a pass changes its optimized graph."""

from __future__ import annotations

import dataclasses
import os
import re
import tempfile
import threading
from collections import Counter
from pathlib import Path
from typing import Callable, Iterable, Optional

import onnx

from bisect_tui.api import EngineConfig
from bisect_tui.engines.ort.declare import providers_of
from bisect_tui.engines.ort.levels import graph_level
from bisect_tui.engines.ort.fp16 import fp16_model_path
from bisect_tui.engines.ort.session import ort_errors

_STDERR_LOCK = threading.Lock()
_MODIFIED_RE = re.compile(r"GraphTransformer (\S+) modified: 1")


def _session_log(model_path: Path, config: EngineConfig, severity: int = 1) -> Optional[str]:
    """ORT's own session log for building `model_path` under `config` (the FP16
    conversion included), or None when it could not be read.

    The log goes to the process's stderr from native code, so fd 2 is pointed
    at a temp file for the session creation (under a lock). A build that fails
    still logs what ran up to the failure."""
    import onnxruntime as ort

    model_path = Path(model_path)
    with tempfile.TemporaryDirectory(prefix="bisect_tui_log_") as d:
        base = (fp16_model_path(model_path, Path(d), config.keep_fp32)
                if config.precision == "fp16" else model_path)
        so = ort.SessionOptions()
        so.graph_optimization_level = graph_level(ort, config.level)
        so.log_severity_level = severity
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
                    ort.InferenceSession(str(base), so, providers=list(providers_of(config)),
                                         disabled_optimizers=list(config.disabled_passes))
                except ort_errors():
                    pass  # the log up to the failure still says what ran
            finally:
                os.dup2(saved, 2)
                os.close(saved)
                os.close(fd)
        try:
            return log.read_text(errors="replace")
        except OSError:
            return None


def modifying_passes(model_path: Path, config: EngineConfig) -> Optional[list[str]]:
    """Names of the graph transformers ORT's own log says modified this model
    (session log at INFO: "GraphTransformer X modified: 1"), in log order.
    Rewrite rules run inside `Level<N>_RuleBasedTransformer` and are logged
    under that name. None when the log could not be read (never a reason to fail)."""
    text = _session_log(model_path, config)
    if text is None:
        return None
    return list(dict.fromkeys(_MODIFIED_RE.findall(text)))


def _graph_signature(path: Path) -> Counter:
    m = onnx.load(str(path), load_external_data=False)
    return Counter((n.domain, n.op_type, n.name) for n in m.graph.node)


def confirm_optimizer_effect(
    build: Callable,
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
    own_tmp: Optional[tempfile.TemporaryDirectory] = None
    if workdir is None:
        own_tmp = tempfile.TemporaryDirectory(prefix="bisect_tui_confirm_")
        workdir = Path(own_tmp.name)
    sigs: dict[EngineConfig, Counter] = {}

    def signature(cfg: EngineConfig) -> Counter:
        if cfg not in sigs:
            built = build(model_path, cfg, (), workdir)
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
            base = dataclasses.replace(config, disabled_passes=rest, keep_fp32=())
            result[name] = signature(base) != signature(base.with_disabled([name]))
    finally:
        if own_tmp is not None:
            own_tmp.cleanup()
    return result


# at VERBOSE ORT names each transformer it applies; some log only their outcome
_APPLIED_RE = re.compile(r"(?:Applying graph transformer (\S+) on step|GraphTransformer (\S+) modified: )")
_CONTAINER_RE = re.compile(r"^Level[0-9]_RuleBasedTransformer$")
_LEVEL_CACHE: dict = {}


def _applied(text: str) -> list[str]:
    return list(dict.fromkeys(a or b for a, b in _APPLIED_RE.findall(text)))


def _tiny_model(path: Path) -> None:
    """A graph every level builds: the transformers ORT applies to it are the level's list."""
    from onnx import TensorProto, helper

    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="relu")], "levels",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def level_transformers(config: EngineConfig) -> list[str]:
    """Every graph transformer the installed ORT runs at `config`'s level (and the
    levels under it), in its order, read from its own VERBOSE log of a one-node
    model built with the same providers and session entries (cached per process)."""
    key = (config.level, tuple(providers_of(config)), tuple(config.config_entries))
    if key not in _LEVEL_CACHE:
        plain = dataclasses.replace(config, precision="fp32", keep_fp32=(), disabled_passes=())
        with tempfile.TemporaryDirectory(prefix="bisect_tui_levels_") as d:
            path = Path(d) / "tiny.onnx"
            _tiny_model(path)
            text = _session_log(path, plain, severity=0)
        _LEVEL_CACHE[key] = _applied(text or "")
    return list(_LEVEL_CACHE[key])


def pass_plan(model_path: Path, config: EngineConfig) -> Optional[dict]:
    """The pass bisection's candidates: the transformers ORT applied to this model
    under `config` (its VERBOSE log, up to a failure), then the rest of the level's
    transformers, minus those already disabled; each `Level<N>_RuleBasedTransformer`
    container is a group whose members are the rewrite rules the library knows
    (its optimizer names that no level logs as a transformer: disabled_optimizers
    accepts rule names too)."""
    from bisect_tui.engines.ort.passes import known_optimizers

    text = _session_log(model_path, config, severity=0)
    if text is None:
        return None
    ran = _applied(text)
    level = level_transformers(config)
    everything = set(level_transformers(dataclasses.replace(config, level="all"))) | set(ran)
    skip = set(config.disabled_passes)
    passes = [n for n in dict.fromkeys(ran + level) if n not in skip]
    rules = sorted(n for n in known_optimizers() if n not in everything and not _CONTAINER_RE.match(n)
                   and n not in skip)
    groups = {n: rules for n in passes if _CONTAINER_RE.match(n)}
    return {"passes": passes, "groups": groups, "ran": ran,
            "source": "ORT's VERBOSE session log (transformers) and its library's names (rewrite rules)"}
