"""The next fixpoint round's attribution build, guessed on this culprit's subgraph.

When disabling a culprit's pass lets another pass fuse its nodes (the subgraph
tests show it: findings.Findings.exposes_fusion), the search's next round finds
that fusion, guesses its pass as this round did (its tags, the subgraph tests)
and builds the full engine with both passes disabled: that round's attribution,
and the workaround's proof. On record it waited for this round's attribution
build, whose map names the new fused node, so the two slowest whole-graph builds
of a two-culprit search ran one after the other while the second core idled
(21,000 nodes: about 4.5 s each).

The culprit's subgraph already holds the answer: built with this round's passes
disabled, the engine makes the new fused node there, with its tags. So the next
round's config is guessed from it and built beside this round's, at a lower
thread priority, so that it takes only what the certain builds leave. It is a
guess, never a verdict: the next round takes the build only if it asks for exactly
that config (scheduler.BuildScheduler.prefetch), and judges it then like any
other; a build nobody asks for is neither recorded nor counted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

from bisect_tui.api import EngineConfig
from bisect_tui.core.bisect.attribute_subgraph import confirmed_names, guesses_on, subgraph_map, subgraph_tests
from bisect_tui.core.bisect.units import Unit, build_units

# how much lower than the search's own threads a guessed build runs (Linux nice levels)
GUESS_NICE = 10


def next_round_configs(triage, engine, group: list[Unit], cfg: EngineConfig, tests: Optional[dict],
                       over: dict, subgraph: Callable[[], Optional[Path]]) -> list[EngineConfig]:
    """The full-engine configs the next round's attribution will ask for first, when
    this round's subgraph tests of `group` (made already: findings.pass_tests; `over`,
    the fused ops over its nodes with each pass off) show another fusion over the
    culprit's nodes with its passes disabled; [] otherwise."""
    if len(group) != 1:
        return []
    names = confirmed_names(tests) or []
    if not any(over.get(n) for n in names):
        return []
    sub = subgraph()
    if sub is None:
        return []
    # the next round's engine: every pass this round confirms disabled (run._run)
    nxt = cfg.with_disabled(names)
    fused = subgraph_map(engine, sub, nxt)
    if fused is None:
        return []
    own = set(group[0].original_nodes)
    over_units = [u for u in build_units([f for f in fused if own.intersection(f.original_nodes)],
                                         triage.info.index) if u.blockable]
    if not over_units:
        return []
    u2 = over_units[0]  # the next round tries the fused nodes over earlier culprits in this order
    names2, _ = guesses_on(engine, [u2], nxt, sub, triage.cancel,
                           lambda: subgraph_tests(engine, sub, nxt, [u2], triage.cancel))
    return [c for c in (nxt.with_disabled([m]) for m in names2) if c != nxt]


__all__ = ["GUESS_NICE", "next_round_configs"]
