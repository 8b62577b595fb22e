"""What "within tolerance" means: a `Tolerance` is a set of optional criteria.

The bounds on reported figures are declared with the figures themselves
(`metrics.catalog`); here are the fields that hold their limits, the
elementwise atol/rtol test, and how a tolerance validates and describes
itself. A field per declared bound: `tests/test_tolerance.py` checks them.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from bisect_tui.core.errors import UserError
from bisect_tui.core.metrics.catalog import BOUNDED

DEFAULT_TOPK = 5
"""k of the top-k agreement when `min_topk` is set without `topk`."""

_BOUND_FIELDS = tuple(m.bound.criterion for m in BOUNDED)
_FLOAT_FIELDS = ("atol", "rtol") + _BOUND_FIELDS + ("max_fail_share", "rel_floor")
_INT_FIELDS = ("topk",)
CRITERIA = _FLOAT_FIELDS + _INT_FIELDS
"""Keys accepted in overrides and `Tolerance.from_dict` (besides `name`/`preset`)."""

_AT_LEAST = {**{f: 0.0 for f in _FLOAT_FIELDS}, **{m.bound.criterion: m.bound.at_least for m in BOUNDED}}
_AT_MOST = {**{m.bound.criterion: m.bound.at_most for m in BOUNDED if m.bound.at_most is not None},
            "max_fail_share": 1.0}


@dataclass(frozen=True)
class Tolerance:
    """Optional criteria; None means "not checked".

    atol/rtol: elementwise test like numpy.allclose, an element fails when
    ``|t - r| > atol + rtol * |r|`` (one of them unset counts as 0); at most
    ``max_fail_share`` of the compared elements may fail. The others bound the
    aggregate metrics of the same name; ``min_*`` are lower bounds.
    ``topk`` is k for ``min_topk`` (default 5); ``rel_floor`` is passed to
    compare() for the relative metrics (None = compare's default floor).
    """

    atol: float | None = None
    rtol: float | None = None
    max_abs: float | None = None
    mean_abs: float | None = None
    max_rel: float | None = None
    mean_rel: float | None = None
    min_cosine: float | None = None
    min_snr_db: float | None = None
    min_topk: float | None = None
    max_fail_share: float = 0.0
    topk: int | None = None
    rel_floor: float | None = None
    name: str = "custom"

    def __post_init__(self) -> None:
        for f in _FLOAT_FIELDS:
            v = getattr(self, f)
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v):
                raise UserError(f"tolerance {f}={v!r} is not a number")
            if _AT_LEAST[f] is not None and v < _AT_LEAST[f]:
                raise UserError(f"tolerance {f}={v!r} must be >= {_AT_LEAST[f]:g}")
        for f, most in _AT_MOST.items():
            v = getattr(self, f)
            if v is not None and v > most:
                raise UserError(f"tolerance {f}={v!r} must be <= {most:g}")
        if self.rel_floor is not None and not self.rel_floor > 0:
            raise UserError(f"tolerance rel_floor={self.rel_floor!r} must be > 0")
        if self.topk is not None and (
            isinstance(self.topk, bool) or not isinstance(self.topk, int) or self.topk < 1
        ):
            raise UserError(f"tolerance topk={self.topk!r} must be an integer >= 1")

    @property
    def checks_allclose(self) -> bool:
        return self.atol is not None or self.rtol is not None

    @property
    def k(self) -> int | None:
        """k to compute top-k agreement with, or None when it is not checked."""
        if self.min_topk is None:
            return None
        return self.topk or DEFAULT_TOPK

    def replace(self, **changes: Any) -> "Tolerance":
        return dataclasses.replace(self, **changes)

    def describe(self) -> str:
        """One line, e.g. ``fp16: atol=0.01 rtol=0.01 min_cosine=0.999``."""
        parts = [
            f"{f}={getattr(self, f):g}"
            for f in CRITERIA
            if getattr(self, f) is not None and not (f == "max_fail_share" and self.max_fail_share == 0)
        ]
        return f"{self.name}: {' '.join(parts) if parts else '(nothing checked)'}"

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Tolerance":
        unknown = set(data) - set(CRITERIA) - {"name"}
        if unknown:
            raise UserError(
                f"unknown tolerance field(s) {', '.join(sorted(unknown))}; valid: {', '.join(CRITERIA)}"
            )
        return cls(**data)
