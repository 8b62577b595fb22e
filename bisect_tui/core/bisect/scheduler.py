"""Where and when the search's builds are made: one object the strategy is handed.

The strategy only says which trials it wants, in order; this decides how
they get built: through the pool (this process and worker processes, or Ray
actors), from a build already started in a thread while other work ran (a
prefetch of a trial the search will certainly ask for next), or from a build
the `bisect` command started before the search existed (early.py, handed in
as `early`). Whichever way, the results come back in the order asked, so the
steps, their order and the build count are those of the plain search; a
prefetched or early build nobody takes is neither recorded nor counted.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from bisect_tui.core import background
from bisect_tui.core.bisect.next_round import GUESS_NICE
from bisect_tui.core.bisect.pool import BuildJob, BuildResult
from bisect_tui.api import EngineConfig


@dataclass(frozen=True)
class Plan:
    """One trial as the search will build and record it."""

    kind: str  # what the step is called ("bisect", "suspect alone", ...)
    config: EngineConfig
    marks: tuple[str, ...]  # tensors marked (each blocks the fusions across it)
    key: str  # the step's identity on record
    region: str  # the enabled units, in words
    ids: tuple[int, ...]  # the enabled units' indices


def no_early_build(config: EngineConfig, marks) -> Optional[Future]:
    return None


class BuildScheduler:
    """Builds the search's plans: the pool, the prefetches, the early builds.

    `engine_dir(config)`: where an unmarked build keeps its optimized graph and
    map (the level search, the attribution and the workaround read them instead
    of building again). `concurrent`: the engine lets go of the GIL while it
    builds (Capabilities.concurrent_builds), so a build may run in a thread
    beside the search's own work."""

    def __init__(self, pool, outputs: tuple[str, ...] = (), marking_blocks: bool = True,
                 engine_dir: Callable[[EngineConfig], Path] = lambda config: Path("."),
                 concurrent: bool = False, fanout: int = 1,
                 early: Callable[[EngineConfig, tuple], Optional[Future]] = no_early_build,
                 context=None, beside: Callable[..., bool] = lambda builds=2: True,
                 cuts: Callable[[Plan], tuple] = lambda plan: ()):
        self.pool = pool
        self.context = context  # api.BuildContext of every whole-graph build, no callbacks
        self.outputs = tuple(outputs)
        self.marking_blocks = marking_blocks
        self.engine_dir = engine_dir
        self.concurrent = concurrent
        self.fanout = fanout
        self.early = early
        # whether `builds` whole-graph builds fit in memory at once (core/bisect/limits.py)
        self.beside = beside
        self.cuts = cuts  # where a marked build may be cut into parts (parts.py)
        self._prefetched: dict[str, Future] = {}  # step key -> Future of [BuildResult]

    @property
    def workers(self) -> int:
        return self.pool.workers

    def job(self, plan: Plan) -> BuildJob:
        workdir = self.engine_dir(plan.config) if not plan.marks else None
        return BuildJob(config=plan.config, marks=tuple(plan.marks),
                        workdir=str(workdir) if workdir is not None else None,
                        want_unblocked=bool(plan.marks) and not self.marking_blocks,
                        outputs=self.outputs, context=self.context,
                        cuts=tuple(self.cuts(plan)) if plan.marks else (),
                        close_later=workdir is not None and self.concurrent and self.beside(3))

    def can_prefetch(self, builds: int = 2) -> bool:
        """A build beside the search's work: an engine with concurrent builds, and
        rounds of one build each (with more, the rounds spread builds over the
        workers already); not on Ray, whose actors build away from this process; and
        only while `builds` at once fit in the memory budget (`beside`)."""
        return (self.concurrent and self.fanout == 1 and getattr(self.pool, "kind", None) in ("serial", "processes")
                and self.beside(builds))

    def prefetching(self, key: str) -> bool:
        return key in self._prefetched

    def prefetch(self, plan: Plan, guess: bool = False) -> None:
        """Start `plan`'s build now, in a thread (or take the early build of it).

        `guess`: a build the search may not ask for (next_round.py): only where it fits
        in memory beside two others, and at a lower priority than theirs."""
        if not self.can_prefetch(3 if guess else 2) or plan.key in self._prefetched:
            return
        started = self.early(plan.config, plan.marks)  # made while the check ran (early.py)
        if started is not None:
            self._prefetched[plan.key] = started
            return
        self._prefetched[plan.key] = background.start(self.pool.run, [self.job(plan)], name="prefetch-build",
                                                      nice=GUESS_NICE if guess else 0)

    def build(self, plans: list[Plan]) -> list[tuple[BuildJob, BuildResult]]:
        """One round: each plan's job and what its build produced, in the order given."""
        jobs = [self.job(p) for p in plans]
        started = [self._prefetched.pop(p.key, None) or self.early(p.config, p.marks) for p in plans]
        rest = iter(self.pool.run([j for j, f in zip(jobs, started) if f is None]) if None in started else ())
        waiting = [j for j, f in zip(jobs, started) if f is not None and not f.done()]
        if waiting and not any(j.cuts for j in waiting):
            # this thread would only wait; not for a build made in parts, whose Python a
            # teardown holding the GIL stalls (0.16-0.22 s of the last round at 21,000
            # nodes): those closes wait for the next wait, or the command's end
            background.run_later()
        return [(j, f.result()[0] if f is not None else next(rest)) for j, f in zip(jobs, started)]
