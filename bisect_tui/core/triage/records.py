"""What the check produces, as frozen records: the engine's verdict per output,
the whole comparison (check.json) and the summary (`check --json`).

The JSON users see is the contract (docs/check.md, docs/bisect.md): each record
writes exactly today's keys, in today's order, with `to_json()` and reads them
back with `from_json()`; the steps pass records, JSON is made at the edges
(files, `--json`) and read back into records there. The report and the app
read records, the search's as well as these; the bisection's own code
(core/bisect) still reads the check's JSON, through `Triage`'s JsonView.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

# the version of the top-level `check --json` / report.json layout; raised when a key changes meaning
SCHEMA_VERSION = 1

_OUTPUT_KEYS = ("metrics", "tolerance", "passed", "verdict", "summary")


@dataclass(frozen=True)
class OutputVerdict:
    """One final output judged against its tolerance."""

    metrics: Mapping[str, Any]
    tolerance: Mapping[str, Any]
    passed: bool
    verdict: Mapping[str, Any]  # every criterion checked: measured value, limit, ratio
    summary: str

    def to_json(self) -> dict:
        return {k: getattr(self, k) for k in _OUTPUT_KEYS}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "OutputVerdict":
        return cls(**{k: d[k] for k in _OUTPUT_KEYS})


@dataclass(frozen=True)
class CheckResult:
    """The engine under test built, run on the same inputs and judged (check.json).

    `error` is set, and `engine_settings` is None, when the engine failed to
    build or run: that failure is the finding."""

    key: str
    checked_at: str
    engine: str
    sensitivity: Optional[Mapping[str, Any]]
    config: Mapping[str, Any]
    passed: bool
    outputs: Mapping[str, OutputVerdict]
    failing_outputs: tuple[str, ...]
    fused_nodes: tuple[Mapping[str, Any], ...]
    shared_tensors: Optional[Mapping[str, Any]]
    optimized_nodes: int
    original_nodes: int
    optimized_model: Optional[str]
    build_seconds: float
    seconds: float
    precision_used: Optional[Mapping[str, Any]] = None
    engine_settings: Optional[tuple[tuple[str, str], ...]] = None
    error: Optional[Mapping[str, Any]] = None

    def to_json(self) -> dict:
        out: dict[str, Any] = {"key": self.key, "checked_at": self.checked_at, "engine": self.engine,
                               "sensitivity": self.sensitivity}
        if self.precision_used:
            out["precision_used"] = self.precision_used
        if self.engine_settings is not None:
            out["engine_settings"] = [list(row) for row in self.engine_settings]
        out.update(config=self.config, passed=self.passed)
        if self.error is not None:
            out["error"] = self.error
        out.update(
            outputs={n: o.to_json() for n, o in self.outputs.items()},
            failing_outputs=list(self.failing_outputs),
            fused_nodes=list(self.fused_nodes),
            shared_tensors=self.shared_tensors,
            optimized_nodes=self.optimized_nodes,
            original_nodes=self.original_nodes,
            optimized_model=self.optimized_model,
            build_seconds=self.build_seconds,
            seconds=self.seconds,
        )
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "CheckResult":
        settings = d.get("engine_settings")
        return cls(
            key=d["key"], checked_at=d["checked_at"], engine=d["engine"], sensitivity=d.get("sensitivity"),
            config=d["config"], passed=bool(d["passed"]),
            outputs={n: OutputVerdict.from_json(o) for n, o in (d.get("outputs") or {}).items()},
            failing_outputs=tuple(d.get("failing_outputs") or ()),
            fused_nodes=tuple(d.get("fused_nodes") or ()),
            shared_tensors=d.get("shared_tensors"),
            optimized_nodes=int(d.get("optimized_nodes") or 0),
            original_nodes=int(d.get("original_nodes") or 0),
            optimized_model=d.get("optimized_model"),
            build_seconds=float(d.get("build_seconds") or 0.0),
            seconds=float(d.get("seconds") or 0.0),
            precision_used=d.get("precision_used"),
            engine_settings=None if settings is None else tuple(tuple(row) for row in settings),
            error=d.get("error"),
        )


@dataclass(frozen=True)
class DeterminismResult:
    """The baseline run twice, every tensor compared bit for bit (determinism.json);
    `skipped` with --no-determinism, when `deterministic` is None."""

    deterministic: Optional[bool]
    skipped: bool = False
    baseline_key: str = ""
    checked_at: str = ""
    tensors_compared: int = 0
    differing: tuple[Mapping[str, Any], ...] = ()
    first: Optional[Mapping[str, Any]] = None
    seconds: float = 0.0
    overlapped: Optional[bool] = None  # None: a session written before the overlap was recorded
    advice: Optional[str] = None
    # how the second run was made when not as one session: {"parts": n, "control": ...}, or
    # {"parts": n, "parts_differed": tensor} when a run in one session settled it
    second_run: Optional[Mapping[str, Any]] = None

    def to_json(self) -> dict:
        if self.skipped:
            return {"deterministic": None, "skipped": True}
        out: dict[str, Any] = {"baseline_key": self.baseline_key, "checked_at": self.checked_at,
                               "tensors_compared": self.tensors_compared, "deterministic": self.deterministic,
                               "differing": list(self.differing), "first": self.first, "seconds": self.seconds}
        if self.overlapped is not None:
            out["overlapped"] = self.overlapped
        if self.advice is not None:
            out["advice"] = self.advice
        if self.second_run:
            out["second_run"] = dict(self.second_run)
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "DeterminismResult":
        if d.get("skipped"):
            return cls(deterministic=None, skipped=True)
        return cls(deterministic=d["deterministic"], baseline_key=d["baseline_key"], checked_at=d["checked_at"],
                   tensors_compared=int(d["tensors_compared"]), differing=tuple(d.get("differing") or ()),
                   first=d.get("first"), seconds=float(d.get("seconds") or 0.0), overlapped=d.get("overlapped"),
                   advice=d.get("advice"), second_run=d.get("second_run") or None)


_RANGE_KEYS = ("baseline_key", "nan_inf", "nan_inf_origin", "fp16", "bf16", "user_ranges", "ok")


@dataclass(frozen=True)
class RangeCheck:
    """The baseline's values against NaN/Inf, FP16/BF16 limits and the user's
    ranges (range_check.json)."""

    baseline_key: str
    nan_inf: tuple[Mapping[str, Any], ...]  # the tensors holding NaN/Inf (empty: none)
    nan_inf_origin: Optional[Mapping[str, Any]]
    fp16: Optional[Mapping[str, Any]]
    bf16: Optional[Mapping[str, Any]]
    user_ranges: tuple[Mapping[str, Any], ...]
    ok: bool

    def to_json(self) -> dict:
        out = {k: getattr(self, k) for k in _RANGE_KEYS}
        out.update(nan_inf=list(self.nan_inf), user_ranges=list(self.user_ranges))
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "RangeCheck":
        return cls(**{**{k: d.get(k) for k in _RANGE_KEYS}, "nan_inf": tuple(d.get("nan_inf") or ()),
                      "user_ranges": tuple(d.get("user_ranges") or ()), "ok": bool(d.get("ok"))})


_FRAMEWORK_KEYS = ("key", "spec", "export", "golden", "crosscheck", "export_matches", "pitfalls", "seconds")


@dataclass(frozen=True)
class FrameworkResult:
    """The PyTorch front end's golden data, run twice, and the export's
    cross-check against the ONNX baseline (torch/crosscheck.json)."""

    key: str
    spec: str
    export: Mapping[str, Any]
    golden: Mapping[str, Any]  # its `deterministic` says whether PyTorch ran the same twice
    crosscheck: Mapping[str, Any]
    export_matches: bool
    pitfalls: tuple[Mapping[str, Any], ...]
    seconds: float

    def to_json(self) -> dict:
        return {**{k: getattr(self, k) for k in _FRAMEWORK_KEYS}, "pitfalls": list(self.pitfalls)}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "FrameworkResult":
        # a file of an older version may lack a key: read as empty, never a crash
        return cls(**{**{k: d.get(k) for k in _FRAMEWORK_KEYS}, "golden": d.get("golden") or {},
                      "export_matches": bool(d.get("export_matches")), "pitfalls": tuple(d.get("pitfalls") or ())})


_JUDGED_KEYS = ("truth_source", "precision", "factor", "note", "all_not_worse", "reference_check")


@dataclass(frozen=True)
class ArbiterResult:
    """Baseline and fused outputs against a float64 run (arbiter.json); when it
    could not run, `available` is False and `reason` says why."""

    available: bool
    outputs: Mapping[str, Mapping[str, Any]]
    key: Optional[str] = None
    reason: Optional[str] = None
    judged: Mapping[str, Any] = field(default_factory=dict)  # truth_source, precision, factor, note, all_not_worse
    skipped: bool = False  # --no-arbiter
    seconds: Optional[float] = None

    def to_json(self) -> dict:
        out: dict[str, Any] = {} if self.key is None else {"key": self.key}
        out["available"] = self.available
        if self.available:
            out.update({k: self.judged.get(k) for k in _JUDGED_KEYS})
        else:
            out["reason"] = self.reason
        out["outputs"] = self.outputs
        if self.skipped:
            out["skipped"] = True
        if self.seconds is not None:
            out["seconds"] = self.seconds
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "ArbiterResult":
        return cls(available=bool(d["available"]), outputs=d.get("outputs") or {}, key=d.get("key"),
                   reason=d.get("reason"), judged={k: d.get(k) for k in _JUDGED_KEYS if k in d},
                   skipped=bool(d.get("skipped")), seconds=d.get("seconds"))


@dataclass(frozen=True)
class Summary:
    """The JSON contract of `check` (docs/check.md), the head of report.json."""

    verdict: str
    exit_code: int
    model: Mapping[str, Any]
    session: str
    inputs: Mapping[str, Any]
    tolerance: Mapping[str, Any]
    baseline: Mapping[str, Any]
    determinism: Optional[DeterminismResult]
    range_check: Optional[RangeCheck]
    check: Optional[CheckResult]  # None when a bad baseline stopped the checklist first
    versions: Mapping[str, str]
    command: Mapping[str, str]  # the settings as the user types them, per command
    framework: Optional[FrameworkResult]
    arbiter: Optional[ArbiterResult]
    schema_version: int = SCHEMA_VERSION
    extra: Mapping[str, Any] = field(default_factory=dict)  # keys a newer writer added

    def to_json(self) -> dict:
        c = self.check
        cj = c.to_json() if c is not None else None
        out: dict[str, Any] = {
            "schema_version": self.schema_version,
            "verdict": self.verdict,
            "exit_code": self.exit_code,
            "model": self.model,
            "session": self.session,
            "inputs": self.inputs,
            "tolerance": self.tolerance,
            "baseline": self.baseline,
            "determinism": self.determinism.to_json() if self.determinism else None,
            "range_check": self.range_check.to_json() if self.range_check else None,
            "engine": c.engine if c else None,
            "engine_settings": (cj or {}).get("engine_settings") or [],
            "config": c.config if c else None,
            "outputs": cj["outputs"] if cj else {},
            "failing_outputs": cj["failing_outputs"] if cj else [],
            "fused_nodes": cj["fused_nodes"] if cj else [],
            "shared_tensors": c.shared_tensors if c else None,
            "sensitivity": c.sensitivity if c else None,
            "engine_error": c.error if c else None,
        }
        if c is not None and c.precision_used:
            out["precision_used"] = c.precision_used
        out.update(versions=dict(self.versions), command=dict(self.command),
                   framework=self.framework.to_json() if self.framework else None,
                   arbiter=self.arbiter.to_json() if self.arbiter else None)
        out.update(self.extra)
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any], check: Optional[CheckResult] = None) -> "Summary":
        """The summary of a saved report.json; the comparison itself is in check.json
        (`check`): without it the engine's fields are rebuilt from what the summary holds."""
        if check is None and d.get("engine") is not None:
            check = CheckResult(
                key="", checked_at="", engine=d["engine"], sensitivity=d.get("sensitivity"),
                config=d.get("config") or {}, passed=d.get("verdict") == "pass",
                outputs={n: OutputVerdict.from_json(o) for n, o in (d.get("outputs") or {}).items()},
                failing_outputs=tuple(d.get("failing_outputs") or ()),
                fused_nodes=tuple(d.get("fused_nodes") or ()), shared_tensors=d.get("shared_tensors"),
                optimized_nodes=0, original_nodes=int((d.get("model") or {}).get("nodes") or 0),
                optimized_model=None, build_seconds=0.0, seconds=0.0, precision_used=d.get("precision_used"),
                engine_settings=tuple(tuple(r) for r in d.get("engine_settings") or ()),
                error=d.get("engine_error"))
        known = set(SUMMARY_KEYS) | {"precision_used"}
        return cls(
            verdict=d["verdict"], exit_code=int(d["exit_code"]), model=d["model"], session=d["session"],
            inputs=d["inputs"], tolerance=d["tolerance"], baseline=d["baseline"],
            determinism=DeterminismResult.from_json(d["determinism"]) if d.get("determinism") else None,
            range_check=RangeCheck.from_json(d["range_check"]) if d.get("range_check") else None, check=check,
            versions=d.get("versions") or {}, command=d.get("command") or {},
            framework=FrameworkResult.from_json(d["framework"]) if d.get("framework") else None,
            arbiter=ArbiterResult.from_json(d["arbiter"]) if d.get("arbiter") else None, schema_version=int(d.get("schema_version", SCHEMA_VERSION)),
            extra={k: v for k, v in d.items() if k not in known})


# the top-level keys of `check --json` in their order (`precision_used` only when the
# engine did not run what was asked); tests/test_check_json_keys.py pins them
SUMMARY_KEYS = ("schema_version", "verdict", "exit_code", "model", "session", "inputs", "tolerance", "baseline",
                "determinism", "range_check", "engine", "engine_settings", "config", "outputs",
                "failing_outputs", "fused_nodes", "shared_tensors", "sensitivity", "engine_error", "versions",
                "command", "framework", "arbiter")


class JsonView:
    """A step's result as its JSON, for the code that still reads dicts (the
    bisection's, core/bisect: the report and the app read the records): the
    record in `record_attr` is the truth; its JSON is made once per record, the
    same object until the result changes. Assigning JSON (a cached file) or a
    record sets the record."""

    def __init__(self, record_type: type, record_attr: str) -> None:
        self.record_type = record_type
        self.record_attr = record_attr
        self.cache = f"_{record_attr}_json"

    def __get__(self, obj, owner=None):
        if obj is None:
            return self
        record = getattr(obj, self.record_attr)
        if record is None:
            return None
        held = obj.__dict__.get(self.cache)
        if held is None or held[0] is not record:
            held = (record, record.to_json())
            obj.__dict__[self.cache] = held
        return held[1]

    def __set__(self, obj, value) -> None:
        if value is not None and not isinstance(value, self.record_type):
            value = self.record_type.from_json(value)
        setattr(obj, self.record_attr, value)

