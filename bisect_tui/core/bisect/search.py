"""The search for one triage: the strategy wired to this session's parts.

The strategy (strategy.py) is handed a store of steps (store.py), a build
scheduler (scheduler.py) and a judge (judge.py); `Bisector` makes them from a
triage whose baseline is done and fills in the checks that read the model's
own tensors (a suspect on its subgraph, a region in isolation, local
judgement). Callers that hold a triage (run.py, the app, the tests) use it;
nothing below it sees the triage.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from bisect_tui.core.bisect import early, parts
from bisect_tui.core.bisect.judge import BuildJudge, OutputJudge
from bisect_tui.core.bisect.records import Step
from bisect_tui.core.bisect.scheduler import BuildScheduler
from bisect_tui.core.bisect.store import StepStore, record_digest
from bisect_tui.core.bisect.strategy import Search
from bisect_tui.core.bisect.suspects import (amplifies_rounding, engine_levels, split_points, suspects_to_try,
                                             tries_suspect_first)
from bisect_tui.core.bisect.trials import BuildBudgetExceeded, Candidate
from bisect_tui.core.bisect.units import Unit
from bisect_tui.core.cancel import Progress
from bisect_tui.core.session import stable_key
from bisect_tui.api import EngineConfig, FusedNode

__all__ = ["Bisector", "BuildBudgetExceeded", "Candidate", "Step", "amplifies_rounding", "engine_levels",
           "record_digest", "split_points", "suspects_to_try", "tries_suspect_first"]


class Bisector(Search):
    """Runs the search for one Triage (baseline done) and one engine config."""

    def __init__(self, triage, config: Optional[EngineConfig] = None, max_builds: int = 200,
                 max_culprits: int = 5, local_factor: float = 10.0, fanout: int = 1, pool=None):
        """`fanout`: candidates per round of the prefix search (1: binary search;
        k: k split points per round, about log_(k+1) n rounds of k builds). It is
        the strategy, so it alone decides the builds; `pool` only decides how many
        run at once (default: one at a time, in this process)."""
        from bisect_tui.core.bisect.pool import pool_for

        self.t = triage
        self.session = triage.session
        self.engine = triage.engine
        self.pool = pool if pool is not None else pool_for(triage, 1)
        self.dir = self.session.bisect_dir
        self.dir.mkdir(parents=True, exist_ok=True)
        caps = self.engine.capabilities
        config = config or triage.opts.config
        from bisect_tui.core.bisect.limits import builds_beside_fit, check_build_memory

        check_build_memory(triage)  # --max-memory below one whole-graph build: refused here, in one line
        store = StepStore(self.session, lambda text: triage.progress(Progress("bisect", text)))
        scheduler = BuildScheduler(
            self.pool, outputs=tuple(triage.info.outputs), marking_blocks=caps is None or caps.marking_blocks,
            engine_dir=self.engine_dir, concurrent=bool(getattr(caps, "concurrent_builds", False)),
            fanout=max(1, int(fanout)), early=lambda cfg, marks: early.take(triage, cfg, marks),
            context=triage.build_context(callbacks=False), beside=lambda builds=2: builds_beside_fit(triage, builds),
            cuts=lambda plan: parts.cuts_for(triage, plan.config, plan.marks, self.known_units(plan.config)))
        self.judge = OutputJudge.for_triage(triage)
        # the config is not in it: each step's key has its own, so a build two fixpoint
        # rounds both ask for (one round's attribution, the next round's full engine) is one
        search_key = stable_key("bisect/v2", triage.baseline.manifest["key"],
                                triage.opts.tolerance.to_dict(), triage.opts.topk)
        super().__init__(store, scheduler, BuildJudge(self.judge), caps=caps, check=triage.fused,
                         max_culprits=max_culprits, fanout=fanout, local_factor=local_factor, config=config,
                         index=triage.info.index, search_key=search_key, max_builds=max_builds,
                         progress=triage.progress, cancel=triage.cancel)

    # the check's result and map as the triage holds them when the search runs
    @property
    def check(self) -> Optional[dict]:
        return self.t.fused

    @check.setter
    def check(self, value) -> None:
        pass

    @property
    def check_map(self):
        return getattr(self.t, "fused_map_objs", None)

    @check_map.setter
    def check_map(self, value) -> None:
        pass

    def engine_dir(self, config: EngineConfig) -> Path:
        d = self.t.engine_dir(config)
        d.mkdir(parents=True, exist_ok=True)
        return d

    def trusted_file(self, path: Optional[str]) -> Optional[str]:
        return self.store.trusted_file(path)

    def rebuild_map(self, config: EngineConfig, workdir: Path) -> tuple[list[FusedNode], str]:
        built = self.engine.build(self.session.model_path, config, (), workdir,
                                  context=self.t.build_context())
        try:
            return built.fused_nodes, str(built.optimized_model_path)
        finally:
            built.close()

    def check_on_subgraph(self, u: Unit) -> Optional[dict]:
        from bisect_tui.core.bisect import subgraph_check

        return subgraph_check.suspect_on_subgraph(self, u, self.config, self.dir / "subgraphs" / f"unit_{u.index}")

    def subgraph_file(self, u: Unit) -> Optional[Path]:
        from bisect_tui.core.bisect.subgraph_check import subgraph_file

        return subgraph_file(self.t, u)

    def isolate_region(self, u: Unit, config: EngineConfig) -> dict:
        from bisect_tui.core.bisect.isolate import isolate

        return isolate(self.t, [u], config, self.dir / "regions" / f"unit_{u.index}")

    def judge_locally(self, units: list[Unit], config: EngineConfig) -> dict:
        from bisect_tui.core.bisect.local_judgement import judge_units

        return judge_units(self.t, units, config, self.dir / "local", self.local_factor)
