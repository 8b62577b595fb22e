"""What the app knows about the triage it shows, owned by the UI thread.

Workers post messages carrying the core's frozen records (CheckResult,
Summary, Step, BisectResult, ...); the handlers put them here as they came,
and screens render from their attributes. A record the UI thread holds is a
snapshot (a frozen dataclass; the dicts inside it are read, never written):
the worker's later results replace it whole, so nothing changes under a screen
that is painting. JSON is made only where the app writes files. The model's
description (`info`, `inputs`) and the dump's `manifest` have no record yet.
Nothing here runs engine work.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from bisect_tui.core.bisect.records import BisectResult, Step
from bisect_tui.core.pipeline import CHECK_STEPS, TriageOptions
from bisect_tui.core.triage.records import CheckResult, DeterminismResult, RangeCheck, Summary
from bisect_tui.tui.texts import STEP_IDS

ENGINE_STEPS = CHECK_STEPS  # the checklist order, declared once in core/triage/steps.py
FINAL = ("passed", "failed", "skipped", "found", "unclear")


@dataclass
class BisectView:
    status: str = "idle"  # idle | running | cancelled | finished | interrupted | error
    steps: list[Step] = field(default_factory=list)
    builds: int = 0
    total: int = 0
    stage_text: str = ""
    result: Optional[BisectResult] = None
    recorded: int = 0  # steps already in bisect/steps.jsonl when interrupted
    error: str = ""

    @property
    def candidate(self) -> str:
        """The region the search is narrowing: the last failing step's region."""
        for st in reversed(self.steps):
            if not st.passed and st.kind != "workaround":
                return st.region
        return ""


@dataclass
class TriageState:
    options: TriageOptions
    states: dict[str, str] = field(default_factory=lambda: {s: "pending" for s in STEP_IDS})
    notes: dict[str, str] = field(default_factory=dict)
    info: Optional[dict] = None
    inputs: Optional[dict] = None
    session_dir: Optional[Path] = None
    live: dict[str, dict] = field(default_factory=dict)  # stage -> last progress
    manifest: Optional[dict] = None
    baseline_reused: bool = False
    determinism: Optional[DeterminismResult] = None
    range_check: Optional[RangeCheck] = None
    fused: Optional[CheckResult] = None
    summary: Optional[Summary] = None
    bisect: BisectView = field(default_factory=BisectView)
    exported: dict[str, str] = field(default_factory=dict)
    markdown: Optional[str] = None
    options_dirty: bool = False  # engine settings changed after the session was prepared
    halted: str = ""  # why "run all" stopped early (bad baseline)
    suggestion: Any = None  # input_suggest.Suggestion when the model's inputs need shapes/values
    input_error: str = ""

    def next_step(self) -> Optional[str]:
        for s in STEP_IDS:
            if s == "bisect":
                return None
            if self.states[s] not in FINAL:
                return s
        return None

    def done(self, step: str) -> bool:
        return self.states.get(step) in FINAL

    @property
    def session_root(self) -> Optional[Path]:
        if self.session_dir:
            return self.session_dir
        return Path(self.options.session_dir) if self.options.session_dir else None

    def set(self, step: str, state: str, note: str = "") -> None:
        self.states[step] = state
        if note:
            self.notes[step] = note
        else:
            self.notes.pop(step, None)

    def reset_engine_results(self) -> None:
        """Settings changed: the comparison and bisection must run again."""
        self.fused = None
        self.summary = None
        self.bisect = BisectView()
        self.markdown = None
        for s in ("fused", "bisect"):
            self.set(s, "pending")


def info_payload(info: Any) -> dict:
    """What the UI shows about the model (from core ModelInfo)."""
    return {
        "path": str(info.path),
        "sha256": info.sha256,
        "opset": info.opset,
        "nodes": info.node_count,
        "inputs": [{"name": i.name, "dtype": i.dtype, "shape": i.shape_text()} for i in info.inputs],
        "outputs": list(info.outputs),
        "op_counts": dict(info.op_counts),
        "renamed": info.renamed_nodes,
    }
