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
from typing import Callable, Optional

from bisect_tui.core.bisect.attribute_subgraph import attribute_on_subgraph, confirmed_names, guesses_on, subgraph_tests
from bisect_tui.core.bisect.attribution import attribute
from bisect_tui.core.bisect.isolate import isolate
from bisect_tui.core.bisect.next_round import next_round_configs
from bisect_tui.core.bisect.units import Unit


def amplified(iso: dict) -> bool:
    """No further from float64 than FP32 in isolation: the model amplifies rounding."""
    worse = [o.get("fused_worse") for o in (iso.get("outputs") or {}).values() if "fused_worse" in o]
    return bool(worse) and not any(worse)


def pass_guesses(triage, engine, group: list[Unit], cfg,
                 subgraph: Callable[[], Optional[Path]]) -> tuple[list[str], Optional[dict]]:
    """first_guesses for `group` under `cfg`, made once per triage: the bisect
    command (early.py), the search's prefetch and the culprit's attribution all ask
    for the same test. `subgraph` writes the group's extracted subgraph; where it
    gives None (no extraction) only the node-name tags are guessed, and not kept."""
    memo = vars(triage).setdefault("pass_guesses", {})
    key = Findings._key(group, cfg)
    if key in memo:
        return memo[key]
    sub = subgraph()
    got = guesses_on(engine, group, cfg, sub, triage.cancel,
                     lambda: pass_tests(triage, engine, group, cfg, lambda: sub))
    if sub is not None:
        memo[key] = got
    return got


def pass_tests(triage, engine, group: list[Unit], cfg, subgraph: Callable[[], Optional[Path]]) -> Optional[dict]:
    """attribute_subgraph.subgraph_tests for `group` under `cfg`, made once per triage."""
    memo = vars(triage).setdefault("pass_tests", {})
    key = Findings._key(group, cfg)
    if key not in memo:
        over = vars(triage).setdefault("pass_fused_over", {}).setdefault(key, {})
        memo[key] = subgraph_tests(engine, subgraph(), cfg, group, triage.cancel, over)
    return memo[key]


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
                tests = pass_tests(self.t, self.bis.engine, group, level_cfg, lambda: sub)
                self._attr[key] = (attribute_on_subgraph(self.bis, group, tests)
                                   or attribute(self.bis, group, sub, grouped=self._grouped.get(key)))
            finally:
                self.bis.config = saved
        return self._attr[key]

    def made(self, group: list[Unit], level_cfg) -> Optional[dict]:
        """The attribution of `group` if it has been made, else None (nothing built)."""
        return self._attr.get(self._key(group, level_cfg))

    def exposes_fusion(self, group: list[Unit], cfg) -> bool:
        """The subgraph tests already made (pass_tests; nothing is built here) show that
        with a confirmed pass of `group` disabled another fused op takes in some of its
        nodes: the attribution's build then holds a new fusion over the culprit, may fail
        on it (a second culprit behind the first), and the rest proof cannot be trusted
        to spare the "remaining fusions" build."""
        key = self._key(group, cfg)
        tests = vars(self.t).get("pass_tests", {}).get(key)
        over = vars(self.t).get("pass_fused_over", {}).get(key) or {}
        return bool(tests) and any(over.get(n) for n in confirmed_names(tests) or [])

    def speculative_configs(self, group: list[Unit], cfg, ci: int) -> list:
        """The full-engine configs the attribution of `group` will build first (each
        candidate pass disabled), found on subgraphs alone: to build in one round
        with other whole-graph candidates."""
        if amplified(self.isolation(group, cfg, ci)):
            return []
        names, grouped = pass_guesses(self.t, self.bis.engine, group, cfg, lambda: self._subgraph(group, cfg, ci))
        if grouped is not None:
            self._grouped[self._key(group, cfg)] = grouped
        return [cfg.with_disabled([n]) for n in names]

    def early_configs(self, group: list[Unit], cfg, subgraph: Callable[[], Optional[Path]]) -> list:
        """speculative_configs before the group is known to be a culprit, on a
        subgraph of the same nodes (`subgraph` writes it: the subgraph check's)."""
        names, _ = pass_guesses(self.t, self.bis.engine, group, cfg, subgraph)
        return [cfg.with_disabled([n]) for n in names]

    def next_round_configs(self, group: list[Unit], cfg, subgraph: Callable[[], Optional[Path]]) -> list:
        """next_round.next_round_configs for this search, where a guessed build can start
        (three whole-graph builds fit in memory at once)."""
        if not self.bis.scheduler.can_prefetch(3):
            return []
        key = self._key(group, cfg)
        tests = vars(self.t).get("pass_tests", {}).get(key)
        over = vars(self.t).get("pass_fused_over", {}).get(key) or {}
        return next_round_configs(self.t, self.bis.engine, group, cfg, tests, over, subgraph)

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
        disabled = sorted(set(names) | set(cfg.disabled_passes))
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
