"""Which trials the search tries first, decided from what the check already knows.

Shared by the strategy and by the builds the `bisect` command starts before
the search (early.py), which must choose exactly as the search will: a build
started for a suspect the search does not try is wasted. Each takes the
engine's declared capabilities (levels, layout-rewrite domains), never an
engine.
"""

from __future__ import annotations

from typing import Optional

from bisect_tui.core.bisect.units import Unit
from bisect_tui.api import LEVELS, EngineConfig

MAX_SEED_TRIES = 3  # the probe's suspects tried alone before any search


def engine_levels(caps) -> tuple[str, ...]:
    """The engine's optimization levels, lowest (everything off) first."""
    return tuple(caps.levels) if caps is not None else LEVELS


def amplifies_rounding(fused: Optional[dict]) -> bool:
    """The check's sensitivity (its result `fused`) says a 1-ulp input change breaks the tolerance."""
    return bool(((fused or {}).get("sensitivity") or {}).get("amplifies"))


def tries_suspect_first(caps, config: EngineConfig, fused: Optional[dict]) -> bool:
    """Whether the search tries the probe's suspect alone at the user's level before
    anything else: not in a model that amplifies rounding (the check's sensitivity),
    not when that level is already the lowest."""
    levels = engine_levels(caps)
    return not (amplifies_rounding(fused) or config.level == levels[0] or len(levels) < 2)


def probe_seeds(units: list[Unit], probe: dict) -> list[Unit]:
    """The probe's suspects (own error, most first) that marking can block."""
    by_idx = {u.index: u for u in units}
    return [by_idx[i] for i in probe.get("suspects", []) if i in by_idx and by_idx[i].blockable]


def suspects_to_try(caps, units: list[Unit], probe: dict) -> list[Unit]:
    """probe_seeds less the nodes a layout rewrite made: such a node stands for a
    whole trunk, and the lower levels' finer map is worth their builds."""
    coarse = set(getattr(caps, "coarse_domains", ()) or ())
    return [u for u in probe_seeds(units, probe) if u.domain not in coarse]


def split_points(lo: int, hi: int, k: int) -> list[int]:
    """Up to k split points in [lo, hi), cutting it into k + 1 near-equal parts;
    for k = 1 the binary search's midpoint (lo + hi) // 2."""
    n = hi - lo
    if k <= 1:
        return [(lo + hi) // 2]
    pts = sorted({lo + (n * i) // (k + 1) for i in range(1, k + 1)})
    pts = [p for p in pts if lo <= p < hi]
    return pts or [(lo + hi) // 2]
