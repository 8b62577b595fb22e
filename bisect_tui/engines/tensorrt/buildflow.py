"""One engine build: the cache, the marking fallback, and what a failure means.

The steps that need TensorRT (`build_bytes`, `deserialize`) are passed in, so
this logic is tested without a GPU:

* a cached plan is reused with the pin plan and the missing marks its build
  recorded; a cached plan that does not deserialize (another GPU, another
  TensorRT build) is dropped and rebuilt, never read as a marking failure;
* a failed marked build is rebuilt unmarked (the search isolates regions
  instead), unless the user cancelled it: then it stops;
* a failure carries TensorRT's logged reason (`buildlog.captured_errors`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from bisect_tui.engines.tensorrt.buildlog import BuildFailed, captured_errors, first_line
from bisect_tui.engines.tensorrt.cache import EngineCache
from bisect_tui.engines.tensorrt.precision import PrecisionPlan


@dataclass
class BuildOutcome:
    engine: Any
    cache_hit: bool
    plan: Optional[PrecisionPlan]
    missing_marks: list = field(default_factory=list)  # marks the TensorRT network lacks (left unmarked)
    marking_error: str = ""  # why the marked build failed (then it was rebuilt unmarked)
    dropped_marks: list = field(default_factory=list)


def _once(cache: EngineCache, key: str, marks: list, build_bytes: Callable, deserialize: Callable,
          record: dict) -> BuildOutcome:
    data = cache.get(key)
    if data is not None:
        info = cache.info(key)
        try:
            engine = deserialize(data)
        except Exception:  # a plan of another GPU or TensorRT build
            cache.drop(key)
        else:
            plan = info.get("precision_plan")
            return BuildOutcome(engine, True, PrecisionPlan.from_dict(plan) if isinstance(plan, dict) else None,
                                list(info.get("missing_marks") or []))
    box: dict = {}
    with captured_errors() as logged:
        try:
            data = bytes(build_bytes(marks, box))
        except Exception as e:  # PolygraphyException ("Invalid Engine"), or the binding's own error
            raise BuildFailed(e, list(logged)) from None
    plan: Optional[PrecisionPlan] = box.get("plan")
    missing = list(box.get("missing") or [])
    meta = dict(record, marked=len(marks), missing_marks=missing)
    if plan is not None:
        meta["precision_plan"] = plan.to_dict()
    cache.put(key, data, meta)
    with captured_errors() as logged:
        try:
            engine = deserialize(data)
        except Exception as e:
            raise BuildFailed(e, list(logged)) from None
    return BuildOutcome(engine, False, plan, missing)


def build_engine(cache: EngineCache, key_for: Callable[[list], str], marks: list, build_bytes: Callable,
                 deserialize: Callable, cancelled: Callable[[], bool], record: dict) -> BuildOutcome:
    """Build (or reuse) the engine with `marks` as outputs; see the module docstring.

    `build_bytes(marks, box)` returns the serialized plan and may put the
    precision plan (`box["plan"]`) and the marks the network lacked
    (`box["missing"]`) in `box`; `deserialize(bytes)` returns the engine."""
    marks = list(marks)
    try:
        return _once(cache, key_for(marks), marks, build_bytes, deserialize, record)
    except BuildFailed as failed:
        if cancelled() or not marks:
            raise failed.to_user(cancelled()) from None
        reason = failed.reason
    try:
        out = _once(cache, key_for([]), [], build_bytes, deserialize, record)
    except BuildFailed as failed:
        raise failed.to_user(cancelled()) from None
    out.marking_error, out.dropped_marks = reason, marks
    return out


__all__ = ["BuildOutcome", "build_engine", "first_line"]
