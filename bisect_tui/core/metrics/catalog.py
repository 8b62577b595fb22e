"""Every figure a comparison reports, declared once.

A `Metric` says how its value follows from the sums the streamed passes
accumulate (`Sums`), what a table calls it, and, when a tolerance may bound
it, the `Bound`: which `Tolerance` field holds the limit, the direction, the
ratio and the verdict's wording. The comparison (`streamed`, `batched`), the
tolerance judgement (`tolerance.judge`) and the tolerance's own field list
(`tolerance.criteria.CRITERIA`) all read `METRICS`; adding a figure computed
from the existing sums is one entry here (plus, when it can be bounded, its
field on `Tolerance`, which a test checks).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, NamedTuple, Optional

import numpy as np

from bisect_tui.core.metrics.limits import fix, le_ratio, lim, one_minus_ratio, sci, snr_ratio

_NAN = float("nan")


class Sums(NamedTuple):
    """What the passes over one pair of tensors accumulate, over the positions
    where both sides are finite. ``sum_r2``/``sum_t2``/``sum_rt``/``sum_e2``
    are of the values times 2**-e (``scale`` = 2**e, 1.0 in ordinary cases),
    so that squaring neither overflows nor underflows."""

    n: int
    err_max: float
    sum_err: float
    max_rel: float
    sum_rel: float
    within1: int  # relative error <= 0.1%
    within5: int  # relative error <= 0.5%
    sum_r2: float
    sum_t2: float
    sum_rt: float
    sum_e2: float
    scale: float
    rel_floor: float


@dataclass(frozen=True)
class Bound:
    """How a tolerance bounds a metric: ``criterion`` is the `Tolerance` field
    holding the limit, ``op`` the relation that must hold, ``ratio`` how many
    times over the limit a value is. The verdict reads
    ``<word> <measured> <op> <limit>``; ``at_least``/``at_most`` are the limits
    a user may set."""

    criterion: str
    op: str  # "<=" (an upper bound) or ">=" (a lower bound)
    ratio: Callable[[float, float], float]
    word: str  # "{k}" is the k of the top-k agreement
    measured: Callable[[float, float], str] = sci
    limit: Callable[[float], str] = lim
    floor_note: bool = False  # a relative metric: the verdict names the floor it used
    at_least: Optional[float] = 0.0
    at_most: Optional[float] = None
    missing: str = ""  # a metric some tensors lack: why it is skipped ("{shape}" is theirs)

    def text(self, measured: float, limit: float, ok: bool, k: Optional[int] = None,
             floor: Optional[float] = None) -> str:
        return self.compose(*self.parts(limit, k), measured, limit, ok, floor)

    def parts(self, limit: float, k: Optional[int] = None) -> tuple[str, str]:
        """The words of text() that depend on the tolerance only: a judge of
        thousands of tensors against one tolerance words them once."""
        return self.word.format(k=k), self.limit(limit)

    def compose(self, word: str, limit_text: str, measured: float, limit: float, ok: bool,
                floor: Optional[float] = None) -> str:
        """text() from its `parts`."""
        relation = self.op if ok else _FLIP[self.op]
        note = f" (rel. floor {lim(floor)})" if self.floor_note and floor is not None else ""
        return f"{word} {self.measured(measured, limit)} {relation} {limit_text}{note}"


_FLIP = {"<=": ">", ">=": "<"}


@dataclass(frozen=True)
class Metric:
    """One reported figure: its key in compare()'s dict, the column label, its
    value from the sums (None: computed only on request, like the top-k
    agreement), and its bound. ``in_table``: a column of the outputs table."""

    key: str
    label: str
    value: Optional[Callable[[Sums], float]]
    bound: Optional[Bound] = None
    in_table: bool = False
    always: bool = False  # reported even when no position was compared


def _cosine(s: Sums) -> float:
    return _cosine_of(s.sum_r2, s.sum_t2, s.sum_rt)


def _cosine_of(sum_r2: float, sum_t2: float, sum_rt: float) -> float:
    zero_r, zero_t = sum_r2 == 0.0, sum_t2 == 0.0
    if zero_r and zero_t:
        return 1.0
    if zero_r or zero_t:
        return 0.0
    return float(min(1.0, max(-1.0, sum_rt / math.sqrt(sum_r2) / math.sqrt(sum_t2))))


def _snr_db(s: Sums) -> float:
    return _snr_of(s.sum_r2, s.sum_e2)


def _snr_of(sum_r2: float, sum_e2: float) -> float:
    if sum_e2 == 0.0:
        return math.inf
    if sum_r2 == 0.0:
        return -math.inf
    ratio = sum_r2 / sum_e2
    return 10.0 * math.log10(ratio) if ratio > 0 else -math.inf


def _general(v: float) -> str:
    return f"{v:g}"


def _upper(key: str, floor_note: bool = False) -> Bound:
    return Bound(key, "<=", le_ratio, key, floor_note=floor_note)


METRICS: tuple[Metric, ...] = (
    Metric("max_abs", "max abs", lambda s: float(s.err_max), _upper("max_abs"), in_table=True),
    Metric("mean_abs", "mean abs", lambda s: s.sum_err / s.n, _upper("mean_abs"), in_table=True),
    Metric("rmse", "rmse", lambda s: math.sqrt(s.sum_e2 / s.n) * s.scale),
    Metric("max_rel", "max rel", lambda s: float(s.max_rel), _upper("max_rel", floor_note=True), in_table=True),
    Metric("mean_rel", "mean rel", lambda s: s.sum_rel / s.n, _upper("mean_rel", floor_note=True)),
    Metric("rel_floor", "rel. floor", lambda s: s.rel_floor, always=True),
    Metric("cosine", "cosine", _cosine,
           Bound("min_cosine", ">=", one_minus_ratio, "cosine", fix, _general, at_most=1.0), in_table=True),
    Metric("within_0.1pct", "within 0.1%", lambda s: s.within1 / s.n),
    Metric("within_0.5pct", "within 0.5%", lambda s: s.within5 / s.n),
    Metric("snr_db", "SNR dB", _snr_db,
           Bound("min_snr_db", ">=", snr_ratio, "snr", lambda m, _limit: f"{m:.1f} dB",
                 lambda v: f"{v:g} dB", at_least=None), in_table=True),
    Metric("topk_agreement", "top-k agreement", None,
           Bound("min_topk", ">=", one_minus_ratio, "top-{k} agreement", fix, _general, at_most=1.0,
                 missing="min_topk: no class axis of size >= 2 in shape {shape}")),
)
"""In the order compare() reports them and a verdict checks them."""

BOUNDED: tuple[Metric, ...] = tuple(m for m in METRICS if m.bound is not None)
TABLE: tuple[Metric, ...] = tuple(m for m in METRICS if m.in_table)
"""The columns of the outputs tables (label, then the value by key)."""


_VALUED = tuple((m.key, m.value, m.always) for m in METRICS if m.value is not None)


FIGURE_KEYS: tuple[str, ...] = tuple(key for key, _, _ in _VALUED)
"""The keys figures() returns, in its order."""


def figures(s: Sums) -> dict[str, float]:
    """The value of every metric computed from sums (NaN when no position was compared)."""
    if s.n:
        return {key: value(s) for key, value, _ in _VALUED}
    return {key: value(s) if always else _NAN for key, value, always in _VALUED}


# Each figure of many pairs at once (metrics.batched): the formulas of METRICS on
# columns, one numpy operation per figure instead of ten calls per pair. Only the
# operations IEEE rounds exactly (division, sqrt) are numpy's; cosine and SNR take
# the very scalar functions above, pair by pair (numpy's log10 may differ in the
# last digit from math.log10).
_COLUMNS: dict[str, Callable] = {
    "max_abs": lambda s: s.err_max,
    "mean_abs": lambda s: s.sum_err / s.n,
    "rmse": lambda s: np.sqrt(s.sum_e2 / s.n) * s.scale,
    "max_rel": lambda s: s.max_rel,
    "mean_rel": lambda s: s.sum_rel / s.n,
    "rel_floor": lambda s: s.rel_floor,
    "cosine": lambda s: list(map(_cosine_of, s.sum_r2.tolist(), s.sum_t2.tolist(), s.sum_rt.tolist())),
    "within_0.1pct": lambda s: s.within1 / s.n,
    "within_0.5pct": lambda s: s.within5 / s.n,
    "snr_db": lambda s: list(map(_snr_of, s.sum_r2.tolist(), s.sum_e2.tolist())),
}
if set(_COLUMNS) != set(FIGURE_KEYS):  # a figure added to METRICS needs its column formula here
    raise AssertionError(f"catalog: no column formula for {sorted(set(FIGURE_KEYS) ^ set(_COLUMNS))}")


def figure_rows(s: Sums) -> list[tuple]:
    """figures() of many pairs: ``s`` holds one float64/int64 array per field
    (``scale`` a float), every ``n`` > 0; one tuple per pair, values in
    FIGURE_KEYS order, equal bit for bit to figures() of that pair."""
    cols = []
    for key in FIGURE_KEYS:
        col = _COLUMNS[key](s)
        cols.append(col.tolist() if isinstance(col, np.ndarray) else col)
    return list(zip(*cols))
