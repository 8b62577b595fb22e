"""Messages the engine worker threads post to the app.

The worker threads never touch widgets: they post these (``post_message`` is
thread-safe) and the UI thread renders them. Progress is coalesced: a pending
``EngineProgress`` is dropped when a newer one of the same stage is queued
right behind it, so a flood of progress never backs up the UI.

The results travel as the core's frozen records (a snapshot the worker no
longer changes), never as JSON: the UI thread reads their attributes.
"""

from __future__ import annotations

from typing import Any, Optional, Union

from textual.message import Message

from bisect_tui.core.bisect.records import BisectResult, Step
from bisect_tui.core.triage.records import CheckResult, DeterminismResult, RangeCheck, Summary

StepRecord = Union[DeterminismResult, RangeCheck, CheckResult]


class EngineProgress(Message):
    """Progress of the running step (replaceable by newer progress of the same stage)."""

    def __init__(self, stage: str, text: str, done: float = 0, total: Optional[float] = None,
                 data: Optional[dict] = None) -> None:
        super().__init__()
        self.stage = stage
        self.text = text
        self.done = done
        self.total = total
        self.data = data or {}

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, EngineProgress) and message.stage == self.stage


class StepStarted(Message):
    def __init__(self, step: str) -> None:
        super().__init__()
        self.step = step


class StepFinished(Message):
    """A checklist step finished: its state and what the core returned.

    `record`: the check's record (determinism, range_check, fused), with the
    summary after the comparison; `payload`: what the inputs and baseline steps
    describe (the model, the inputs, the dump's manifest), which have no record."""

    def __init__(self, step: str, state: str, payload: Optional[dict[str, Any]] = None,
                 record: Optional[StepRecord] = None, summary: Optional[Summary] = None) -> None:
        super().__init__()
        self.step = step
        self.state = state
        self.payload = payload or {}
        self.record = record
        self.summary = summary


class StepStopped(Message):
    """A step did not finish: cancelled, or a one-line error."""

    def __init__(self, step: Optional[str], reason: str, text: str, suggestion=None) -> None:
        super().__init__()
        self.step = step
        self.reason = reason  # "cancelled" | "error" | "halt"
        self.text = text
        self.suggestion = suggestion  # input_suggest.Suggestion when the inputs need shapes


class BisectStep(Message):
    """One step of the search (never coalesced: every row of the table matters)."""

    def __init__(self, step: Step) -> None:
        super().__init__()
        self.step = step


class BisectFinished(Message):
    def __init__(self, result: BisectResult, summary: Optional[Summary], loaded: bool = False) -> None:
        super().__init__()
        self.result = result
        self.summary = summary
        self.loaded = loaded  # read back from the session, not run now


class BisectInterrupted(Message):
    """Resume found a bisection that stopped before it finished."""

    def __init__(self, recorded: int) -> None:
        super().__init__()
        self.recorded = recorded


class ExportDone(Message):
    def __init__(self, paths: dict[str, str], markdown: str, copy: bool) -> None:
        super().__init__()
        self.paths = paths
        self.markdown = markdown
        self.copy = copy


class WorkDone(Message):
    """Posted last by every engine worker, whatever happened: the UI is free again."""

    def __init__(self, kind: str, outcome: str) -> None:
        super().__init__()
        self.kind = kind
        self.outcome = outcome
