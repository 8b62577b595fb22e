"""Each culprit's isolation and attribution, made once per search.

The search asks for them while it runs, not only the report afterwards: the
attribution's confirming build (the full engine with the culprit's pass
disabled) is a whole-graph build the workaround needs anyway, and where every
other fused node of the engine comes out of it unchanged it also proves what
the "remaining fusions" build would (the other fusions pass together), so
that build is not made. With several workers the confirming build can run in
the same round as "all fusions blocked" (`speculative_configs`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from bisect_tui.core.bisect.attribution import attribute, first_guesses
from bisect_tui.core.bisect.isolate import isolate
from bisect_tui.core.bisect.units import Unit


def amplified(iso: dict) -> bool:
    """No further from float64 than FP32 in isolation: the model amplifies rounding."""
    worse = [o.get("fused_worse") for o in (iso.get("outputs") or {}).values() if "fused_worse" in o]
    return bool(worse) and not any(worse)


class Findings:
    def __init__(self, triage, bisector, first_index: int = 1):
        """`first_index`: the number of this search's first culprit (its folder
        `bisect/culprit_<n>`), after the culprits of earlier fixpoint rounds."""
        self.t = triage
        self.bis = bisector
        self.first_index = first_index
        self._iso: dict[tuple, dict] = {}
        self._attr: dict[tuple, dict] = {}
        self._grouped: dict[tuple, Optional[dict]] = {}
        self._guesses: dict[tuple, tuple[list[str], Optional[dict]]] = {}  # first_guesses, made early

    @staticmethod
    def _key(group: list[Unit], cfg) -> tuple:
        return (repr(sorted(cfg.to_dict().items())), tuple(u.index for u in group))

    def isolation(self, group: list[Unit], level_cfg, ci: int) -> dict:
        key = self._key(group, level_cfg)
        if key not in self._iso:
            self._iso[key] = isolate(self.t, group, level_cfg, self.t.session.bisect_dir / f"culprit_{ci}")
        return self._iso[key]

    def _subgraph(self, group, level_cfg, ci) -> Optional[Path]:
        iso = self.isolation(group, level_cfg, ci)
        return Path(iso["subgraph"]) if iso.get("subgraph") else None

    def attribution(self, group: list[Unit], level_cfg, ci: int) -> dict:
        """attribute() at the level the search ran (the attribution compares engines there)."""
        key = self._key(group, level_cfg)
        if key not in self._attr:
            sub = self._subgraph(group, level_cfg, ci)
            saved = self.bis.config
            self.bis.config = level_cfg
            try:
                self._attr[key] = attribute(self.bis, group, sub, grouped=self._grouped.get(key))
            finally:
                self.bis.config = saved
        return self._attr[key]

    def speculative_configs(self, group: list[Unit], cfg, ci: int) -> list:
        """The full-engine configs the attribution of `group` will build first (each
        candidate pass disabled), found on subgraphs alone: to build in one round
        with other whole-graph candidates."""
        if amplified(self.isolation(group, cfg, ci)):
            return []
        key = self._key(group, cfg)
        if key in self._guesses:
            names, grouped = self._guesses[key]
        else:
            names, grouped = self._first_guesses(group, cfg, self._subgraph(group, cfg, ci))
        if grouped is not None:
            self._grouped[key] = grouped
        return [cfg.with_disabled([n]) for n in names]

    def early_configs(self, group: list[Unit], cfg, subgraph: Path) -> list:
        """speculative_configs before the group is known to be a culprit, on a
        subgraph of the same nodes written meanwhile (the subgraph check's): the
        full-engine builds its attribution would ask for, to start early. Kept,
        so speculative_configs does not test the passes again."""
        key = self._key(group, cfg)
        if key not in self._guesses:
            self._guesses[key] = self._first_guesses(group, cfg, subgraph)
        return [cfg.with_disabled([n]) for n in self._guesses[key][0]]

    def _first_guesses(self, group: list[Unit], cfg, subgraph: Optional[Path]):
        return first_guesses(self.bis.engine, cfg, group, subgraph, self.t.cancel)

    def rest_proof(self, groups: list[list[Unit]], units: list[Unit], cfg):
        """The step proving that every fusion but `groups` passes together, or None.

        The full engine of `cfg` (the search's own, unmarked) with the passes of
        the culprits found so far disabled, as the fixpoint builds it next: when
        it passes and holds every other fused node exactly (same op, same original
        nodes) and nothing new outside the culprits' nodes, it has shown in the
        real engine what "remaining fusions" shows with marks."""
        names: list[str] = []
        for k, g in enumerate(groups):
            ci = self.first_index + k
            if amplified(self.isolation(g, cfg, ci)):
                return None  # the fixpoint does not disable an amplified culprit's pass
            confirmed = self.attribution(g, cfg, ci)["confirmed"]
            if not confirmed:
                return None
            names += confirmed
        disabled = sorted(set(names) | set(cfg.disabled_optimizers))
        fused, _, step = self.bis.fused_map(cfg.with_disabled(disabled))
        if fused is None or not step.passed or step.error_kind:
            return None
        held = {u.index for g in groups for u in g}
        held_nodes = {n for g in groups for u in g for n in u.original_nodes}
        want = {(u.op_type, frozenset(u.original_nodes)) for u in units if u.index not in held}
        have = {(f.op_type, frozenset(f.original_nodes)) for f in fused if f.is_fused}
        if not want <= have:
            return None  # the pass also made other fused nodes: they are judged by the search
        if any(not nodes <= held_nodes for _, nodes in have - want):
            return None  # disabling made new fusions elsewhere
        return step
