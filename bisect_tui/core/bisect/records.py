"""What the search produces, as frozen records; JSON only at the edges.

Each record's `to_json()` writes exactly the keys the session files and
`report.json` have always had (docs/bisect.md is the contract, and
tests/test_search_records.py holds them to it); `from_json()` reads them back.
A record that is a whole file's top-level object (`BisectResult`, in
`bisect/result.json`) carries a `schema` version, so a reader can tell a
result written by another release.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Optional

from bisect_tui.api import DISABLED_KEY, EngineConfig

RESULT_SCHEMA = "bisect-tui/bisect-result/1"


def _fields(cls) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


@dataclass(frozen=True)
class Step:
    """One trial of the search: a build (or a reused record of one) and its verdict.

    The same record is a line of `bisect/steps.jsonl` (plus the time written and
    its digest), an entry of the result's `steps` and the progress event's step."""

    n: int
    kind: str
    region: str
    enabled: list[int]
    config: dict
    marks: int
    passed: bool
    ratio: float
    max_abs: float
    summary: str
    builds: int
    cached: bool
    seconds: float
    fused_in_build: Optional[int] = None
    key: str = ""
    optimized: Optional[str] = None  # saved optimized graph (unmarked builds only)
    error_kind: Optional[str] = None  # build_error | run_error: the engine failed, not the numbers
    error: Optional[str] = None  # the engine's own message
    # fused nodes the engine kept although a tensor inside them was marked
    # (engines whose marking does not always block; None when not asked)
    unblocked: Optional[list[str]] = None
    worker: Optional[str] = None  # which process built it: "main" or "w<pid>"
    round_size: Optional[int] = None  # builds of the round it was built in, when more than one
    # judged on the fused node's own subgraph, the rest of the graph unfused
    # (subgraph_check.py): an engine build of a few nodes, not a whole-graph build
    subgraph: Optional[bool] = None
    # judge.elementwise_ratio: the figure steps are compared by in the tables
    elementwise_ratio: Optional[float] = None
    # a marked build made as this many parts (parts.py)
    parts: Optional[int] = None

    _OPTIONAL = ("unblocked", "worker", "round_size", "subgraph", "elementwise_ratio", "parts")

    def to_json(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        for k in self._OPTIONAL:
            if d.get(k) is None:
                d.pop(k, None)
        return d

    to_dict = to_json  # the name older callers use

    @classmethod
    def from_json(cls, d: dict, **override: Any) -> "Step":
        """A step from a saved record (keys it does not know, such as `at` and
        `digest`, are the file's, not the step's)."""
        known = _fields(cls)
        return cls(**{**{k: v for k, v in d.items() if k in known}, **override})

    def replace(self, **changes: Any) -> "Step":
        return dataclasses.replace(self, **changes)


def step_config(config: EngineConfig) -> dict:
    """The part of a config a step records (the search varies only these)."""
    return {"level": config.level, DISABLED_KEY: list(config.disabled_passes)}


@dataclass(frozen=True)
class Culprit:
    """A fused node (or a set that only fails together) proven to break tolerance,
    or an engine failure bisected to the nodes whose precision causes it."""

    kind: str  # fusion | interaction | build_error | run_error
    layer: int  # fixpoint round that found it
    exposed_by: Optional[list[str]]  # passes disabled before it was found
    amplified: bool  # no further from float64 than FP32 in isolation
    fused_node: Optional[str]
    op_type: str
    original_nodes: list[str]
    optimizers: list[str]
    interaction: bool
    units: list[int]
    attribution: dict
    isolated: dict
    worst_elements: list
    engine_error: Optional[dict] = None

    def to_json(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        if d["engine_error"] is None:
            d.pop("engine_error")
        return d

    @classmethod
    def from_json(cls, d: dict) -> "Culprit":
        known = _fields(cls)
        return cls(**{k: v for k, v in d.items() if k in known})


@dataclass(frozen=True)
class Workaround:
    """The engine setting with which the full engine passes, proven by a build
    (`kind` None: none found; `how` is the engine's own words for it)."""

    kind: Optional[str]  # disable_optimizers | mark_outputs | None
    disabled_passes: list[str] = field(default_factory=list)  # JSON: "disabled_optimizers"
    full_engine: Optional[dict] = None
    tried: list[dict] = field(default_factory=list)
    how: str = ""
    marked_tensors: Optional[list[str]] = None  # mark_outputs only
    # no setting passes in a model that amplifies rounding: the one that came closest
    best_effort: Optional[dict] = None

    _ORDER = ("kind", DISABLED_KEY, "marked_tensors", "full_engine", "tried", "how", "best_effort")

    def to_json(self) -> dict:
        d = {k: getattr(self, "disabled_passes" if k == DISABLED_KEY else k) for k in self._ORDER}
        for k in ("marked_tensors", "best_effort"):
            if d[k] is None:
                d.pop(k)
        return d

    @classmethod
    def from_json(cls, d: dict) -> "Workaround":
        known = _fields(cls)
        d = {("disabled_passes" if k == DISABLED_KEY else k): v for k, v in d.items()}
        return cls(**{k: v for k, v in d.items() if k in known})

    def with_best_effort(self, full_engine_ratio: Optional[float], why: str) -> "Workaround":
        """The tried setting that came closest to passing, when none passed."""
        tried = [t for t in self.tried if t.get(DISABLED_KEY) and t.get("ratio") is not None]  # built ones
        if self.kind is not None or not tried:
            return self
        best = min(tried, key=lambda t: t["ratio"])
        return dataclasses.replace(self, best_effort={
            DISABLED_KEY: best[DISABLED_KEY], "ratio": best["ratio"],
            "ratio_before": full_engine_ratio, "max_abs": best["max_abs"], "why_not_passing": why,
        })


@dataclass(frozen=True)
class KeepSet:
    """The keep-set search: the smallest set of original nodes kept in high
    precision with which the full engine passes, every test it built."""

    engine_pin: str
    candidates: int
    seeds: list[dict]
    keep_fp32: list[str]
    passed: bool
    tests: list[dict]
    builds: int
    metrics: Optional[dict] = None
    setting: Optional[str] = None
    cli: Optional[str] = None
    explanation: Optional[str] = None
    # "keep every node" against the engine in FP32 (keepset_control.py); failed: nothing concluded
    control: Optional[dict] = None
    instrument_failed: bool = False
    minimality: Optional[str] = None  # "one-minimal", or why the set may hold more than it needs

    _ORDER = ("engine_pin", "candidates", "seeds", "keep_fp32", "passed", "tests", "metrics", "setting", "cli",
              "explanation", "builds", "control", "instrument_failed", "minimality")

    def to_json(self) -> dict:
        d = {k: getattr(self, k) for k in self._ORDER}
        for k in ("metrics", "setting", "cli", "explanation", "control", "minimality"):
            if d[k] is None:
                d.pop(k)
        d["tests_run"] = len(self.tests)
        return d

    @classmethod
    def from_json(cls, d: dict) -> "KeepSet":
        known = _fields(cls)
        return cls(**{k: v for k, v in d.items() if k in known})


@dataclass(frozen=True)
class PrecisionSetting:
    """An engine without per-node pinning: the full engine rebuilt in FP32, which
    proves (or refutes) that the precision setting is the cause."""

    passed: bool
    summary: str
    precision: str = "fp32"
    ratio: Optional[float] = None  # None: the build budget ran out first
    max_abs: Optional[float] = None
    setting: Optional[str] = None

    kind = "precision_setting"

    def to_json(self) -> dict:
        d: dict = {"kind": self.kind, "precision": self.precision, "passed": self.passed}
        if self.ratio is not None:
            d.update(ratio=self.ratio, max_abs=self.max_abs, summary=self.summary, setting=self.setting)
        else:
            d["summary"] = self.summary
        return d

    @classmethod
    def from_json(cls, d: dict) -> "PrecisionSetting":
        return cls(passed=d["passed"], summary=d.get("summary", ""), precision=d.get("precision", "fp32"),
                   ratio=d.get("ratio"), max_abs=d.get("max_abs"), setting=d.get("setting"))


def precision_from_json(d: Optional[dict]):
    if d is None:
        return None
    return PrecisionSetting.from_json(d) if d.get("kind") == "precision_setting" else KeepSet.from_json(d)


@dataclass(frozen=True)
class BisectResult:
    """The whole bisection (`bisect/result.json`, and `bisect` in report.json).

    `search` holds the search's own keys (verdict, level, units, probe, the
    evidence of a verdict, ...: see `strategy.Search.run`), which this record
    extends with what the findings, the fixpoint and the workaround add."""

    search: dict
    culprits: tuple[Culprit, ...]
    layers: list[dict]
    workaround: Optional[Workaround]
    precision: Any  # KeepSet | PrecisionSetting | None
    steps: tuple[Step, ...]
    engine_builds: int
    subgraph_builds: int
    parallel: dict
    untrusted_steps: int
    finished: str
    tolerance: dict
    probe_agrees: Optional[bool] = None
    verdict: Optional[str] = None  # None: the search's
    stopped_reason: Optional[str] = None  # set when the search gave none
    # the key order of the JSON this record was read from: the search's own keys
    # (`culprits`, `steps`, ...) sit among the record's there, and a result read
    # back (the app's restore, its export) is written again byte for byte
    json_order: tuple[str, ...] = field(default=(), compare=False, repr=False)

    @property
    def final_verdict(self) -> str:
        return self.verdict or self.search["verdict"]

    @property
    def final_stopped_reason(self) -> Optional[str]:
        """Why the search stopped early, as `to_json()` writes it: the search's
        own reason when it gave one (even an empty one), else the record's."""
        return self.search["stopped_reason"] if "stopped_reason" in self.search else self.stopped_reason

    def to_json(self) -> dict:
        steps = [s.to_json() for s in self.steps]
        for n, st in enumerate(steps, 1):
            st["n"] = n
        d = {
            "schema": RESULT_SCHEMA,
            **self.search,
            # cross-check: did the one-run probe point at what the builds proved?
            "probe_agrees": self.probe_agrees,
            "culprits": [c.to_json() for c in self.culprits],
            "layers": self.layers,
            "workaround": self.workaround.to_json() if self.workaround is not None else None,
            "precision": self.precision.to_json() if self.precision is not None else None,
            "steps": steps,
            "engine_builds": self.engine_builds,
            # builds of a suspect's own few nodes that stood in for whole-graph ones (subgraph_check.py)
            "subgraph_builds": self.subgraph_builds,
            "parallel": self.parallel,
            "untrusted_steps": self.untrusted_steps,  # recorded steps whose digest failed: recomputed
            "finished": self.finished,
            "tolerance": self.tolerance,
        }
        if self.stopped_reason:
            d.setdefault("stopped_reason", self.stopped_reason)
        d["verdict"] = self.final_verdict
        if self.json_order:
            d = {**{k: d[k] for k in self.json_order if k in d}, **d}
        return d

    _OWN = ("probe_agrees", "culprits", "layers", "workaround", "precision", "steps", "engine_builds",
            "subgraph_builds", "parallel", "untrusted_steps", "finished", "tolerance")

    @classmethod
    def from_json(cls, d: dict) -> "BisectResult":
        search = {k: v for k, v in d.items() if k not in cls._OWN and k != "schema"}
        return cls(
            search=search,
            culprits=tuple(Culprit.from_json(c) for c in d.get("culprits", [])),
            layers=list(d.get("layers", [])),
            workaround=Workaround.from_json(d["workaround"]) if d.get("workaround") else None,
            precision=precision_from_json(d.get("precision")),
            steps=tuple(Step.from_json(s) for s in d.get("steps", [])),
            engine_builds=d.get("engine_builds", 0), subgraph_builds=d.get("subgraph_builds", 0),
            parallel=dict(d.get("parallel", {})), untrusted_steps=d.get("untrusted_steps", 0),
            finished=d.get("finished", ""), tolerance=dict(d.get("tolerance", {})),
            probe_agrees=d.get("probe_agrees"), json_order=tuple(d),
        )


def result_of(result: Any) -> Optional[BisectResult]:
    """The record of a result handed over as `bisect/result.json`'s dict (or as
    the record itself): the one conversion for readers whose callers hold the
    JSON (the exporter, report.json read back). None, or an empty dict: none."""
    if result is None or isinstance(result, BisectResult):
        return result
    return BisectResult.from_json(result) if result else None
