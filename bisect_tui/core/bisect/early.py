"""The search's first whole-graph build, started while the checklist still runs.

A failing `bisect` always builds "all fusions blocked" first (the engine with
every tensor marked): it needs only the prepared model and the inputs, not the
baseline or the verdict. Started in a thread when the dump is done, it is
built while the check compares the engine and runs the probe, which are
Python on one core, instead of at the start of the search, where it shared the
cores with the suspect's own builds. The search takes it as it takes a
prefetch (Bisector.prefetch): the steps, their order and the build count are
the search's own. A build nobody asks for (the check passed, the search was
cancelled, the step was already in the session) is left to finish and is
neither recorded nor counted.
"""

from __future__ import annotations

import hashlib
import os
from typing import Optional

from bisect_tui.engines.base import EngineConfig


def _key(config: EngineConfig, marks) -> tuple:
    return (repr(sorted(config.to_dict().items())),
            hashlib.sha1("\n".join(sorted(marks)).encode()).hexdigest())


def start_blocked_build(triage) -> None:
    """For an engine whose builds may run in a thread (Capabilities.concurrent_builds),
    two cores or more, weights small next to the memory budget (the build holds a
    copy while the check runs), and a session without search steps yet."""
    caps = getattr(triage.engine, "capabilities", None)
    if not getattr(caps, "concurrent_builds", False) or (os.cpu_count() or 1) < 2:
        return
    info, session, inputs = triage.info, triage.session, triage.inputs
    if info is None or session is None or inputs is None:
        return
    if info.initializer_bytes * 4 > triage.max_memory // 8:
        return
    steps = session.bisect_dir / "steps.jsonl"
    if steps.exists() and steps.stat().st_size:
        return  # a resumed search: its first steps are likely on record already
    from bisect_tui.core import background
    from bisect_tui.core.bisect.pool import BuildJob, build_and_run

    config = triage.opts.config
    marks = tuple(info.index.intermediate_tensors())
    job = BuildJob(config=config.to_dict(), marks=marks, workdir=None,
                   want_unblocked=bool(marks) and not (caps is None or caps.marking_blocks),
                   outputs=tuple(info.outputs))
    feeds = [inputs.feeds(k) for k in range(inputs.samples)]

    def build() -> list:
        return [build_and_run(triage.engine, str(session.model_path), feeds, job, "main", list(info.outputs))]

    triage.search_builds[_key(config, marks)] = background.start(build, name="blocked-build")


def take(triage, config: EngineConfig, marks) -> Optional[object]:
    """The Future of an early build of exactly this config and these marks, or None."""
    builds = getattr(triage, "search_builds", None)
    if not builds:
        return None
    return builds.pop(_key(config, marks), None)
