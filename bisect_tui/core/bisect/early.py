"""The search's whole-graph builds that need no search, started before it.

A failing `bisect` always builds "all fusions blocked" first (the engine with
every tensor marked): it needs only the prepared model and the inputs, not the
baseline or the verdict. Started in a thread when the dump is done, it is
built while the check compares the engine and runs the probe, which are
Python on one core, instead of at the start of the search, where it shared the
cores with the suspect's own builds. The search takes it as it takes a
prefetch (scheduler.BuildScheduler.prefetch): the steps, their order and the build count are
the search's own. A build nobody asks for (the check passed, the search was
cancelled, the step was already in the session) is left to finish and is
neither recorded nor counted.

The same holds for the probe's suspect once the check has judged the engine:
its pass is found on its subgraph (its tags, else group testing) and the full
engine with that pass disabled, which its attribution, the rest proof and the
workaround build once the search confirms the suspect, is started then
(`start_attribution_build`), a few tenths of a second before the search would.
"""

from __future__ import annotations

import hashlib
import threading
from typing import Optional

from bisect_tui.api import EngineConfig


def _key(config: EngineConfig, marks) -> tuple:
    return (repr(sorted(config.to_dict().items())),
            hashlib.sha1("\n".join(sorted(marks)).encode()).hexdigest())


def _may_start(triage) -> bool:
    """Builds beside other work (Triage.may_build_beside), room for two whole-graph
    builds in the memory budget, and a session without search steps yet."""
    if triage.session is None or triage.inputs is None or not triage.may_build_beside():
        return False
    from bisect_tui.core.bisect.limits import builds_beside_fit

    if not builds_beside_fit(triage):
        return False  # two whole-graph builds at once would not fit in --max-memory
    steps = triage.session.bisect_dir / "steps.jsonl"
    return not (steps.exists() and steps.stat().st_size)  # a resumed search has its steps on record


# "All fusions blocked" is started when the dump is done. Where the engine under test is
# still building then, the check waits on that build and the probe after it, the search on
# this one only later: lowered, it leaves the engine's build its core (21,000 nodes: the
# engine built 1.2-4.6 s sooner, with the second run lowered too, second_run.NICE). Where
# that build is done (5,000 nodes), it is next on the search's path: not lowered (a
# thread's priority can be lowered, never raised again without privileges).
BLOCKED_NICE = 5


def _start(triage, config: EngineConfig, marks: tuple, workdir, name: str, nice: int = 0,
           wait_entry: bool = False) -> None:
    """The build the search's BuildPool would make for this candidate (pool.build_and_run).
    `wait_entry`: return once the engine's library has taken the build over
    (BuildContext.entered), for a build the search waits on next: the check's own
    Python after this (its map's records and files, GIL-bound) held it back 0.15 s at
    21,000 nodes."""
    from bisect_tui.core import background
    from bisect_tui.core.bisect.parts import cuts_for
    from bisect_tui.core.bisect.limits import builds_beside_fit
    from bisect_tui.core.bisect.pool import BuildJob, build_and_run

    caps = triage.engine.capabilities
    info, inputs = triage.info, triage.inputs
    entered = threading.Event() if wait_entry else None
    # the job runs in this process, never in a worker: it may carry `entered`
    context = triage.build_context(callbacks=False, entered=entered.set if entered is not None else None)
    job = BuildJob(config=config, marks=marks, workdir=str(workdir) if workdir is not None else None,
                   want_unblocked=bool(marks) and not (caps is None or caps.marking_blocks),
                   cuts=tuple(cuts_for(triage, config, marks)) if marks else (),
                   outputs=tuple(info.outputs), context=context,
                   close_later=workdir is not None and builds_beside_fit(triage, 3))
    feeds = [inputs.feeds(k) for k in range(inputs.samples)]
    model = str(triage.session.model_path)

    def build() -> list:
        return [build_and_run(triage.engine, model, feeds, job, "main", list(info.outputs))]

    future = triage.search_builds[_key(config, marks)] = background.start(build, name=name, nice=nice)
    if entered is not None:
        background.wait_for_entry(future, entered)


def start_blocked_build(triage) -> None:
    """"All fusions blocked" of the user's config (the search's first build)."""
    if _may_start(triage):
        _start(triage, triage.opts.config, tuple(triage.info.index.intermediate_tensors()), None, "blocked-build",
               nice=BLOCKED_NICE if triage.engine_build_in_flight() else 0)


def start_attribution_build(triage, check: Optional[dict] = None) -> None:
    """The full engine without the pass that made the probe's first suspect,
    chosen as strategy.Search._suspect_at_user_level chooses it: only after a failing
    check that mapped its engine, and where the search takes that path. `check`: the
    check's verdict as far as it is made (Triage.after_probe), else the finished one.
    Once per triage: the check's hook and the command after it both ask."""
    made = triage.fused_map_objs
    fused = check if check is not None else triage.fused
    if not made or not fused or fused.get("passed") or getattr(triage, "_attribution_started", False):
        return
    if not _may_start(triage):
        return
    triage._attribution_started = True
    optimized, config, objs = made
    if config != triage.opts.config or not optimized or optimized != fused.get("optimized_model"):
        return
    from bisect_tui.core.bisect.findings import pass_guesses
    from bisect_tui.core.bisect.probe import run_probe
    from bisect_tui.core.bisect.suspects import suspects_to_try, tries_suspect_first
    from bisect_tui.core.bisect.subgraph_check import subgraph_file
    from bisect_tui.core.bisect.units import build_units

    caps = triage.engine.capabilities
    if not tries_suspect_first(caps, config, fused):
        return  # the search does not start from the suspect: its builds decide
    units = build_units(objs, triage.info.index)
    # the check's per-tensor errors, kept in this process: the same suspects the search reads
    batch = suspects_to_try(caps, units, run_probe(triage, optimized, units))
    if not batch:
        return
    u = batch[0]
    names, _ = pass_guesses(triage, triage.engine, [u], config, lambda: subgraph_file(triage, u))
    for n in names:
        cfg = config.with_disabled([n])
        workdir = triage.engine_dir(cfg)
        workdir.mkdir(parents=True, exist_ok=True)
        _start(triage, cfg, (), workdir, "attribution-build", wait_entry=True)


def take(triage, config: EngineConfig, marks) -> Optional[object]:
    """The Future of an early build of exactly this config and these marks, or None."""
    builds = getattr(triage, "search_builds", None)
    if not builds:
        return None
    return builds.pop(_key(config, marks), None)
