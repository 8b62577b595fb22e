"""Engine builds of one search round, in parallel worker processes.

A round's candidates are independent builds (the k split points of a k-ary
search, the attribution's one rebuild per candidate pass), so several
processes can build and run them at once; on an accelerator box each worker
would own one device. The parent judges every result itself, in the order the
strategy proposed the candidates, so the steps, the verdicts and the build
count do not depend on how many workers ran them.

What crosses the process boundary is our own plain records only (a build
job: config dict, tensor names, folder; a result: the engine's output arrays,
the fused-node map as dicts, the engine's error text). Workers load the engine
through the registry by name and read the model from the session's copy; no
file's content is ever unpickled.

Worker processes start with `spawn`: never `fork`, which would copy the
app's threads and the engine's state.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import os
import time
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from bisect_tui.core.errors import EngineBuildError, EnvironmentFault
from bisect_tui.engines.base import EngineConfig


def default_workers() -> int:
    """One worker per core this process may use, at most 8 (each build holds a
    whole engine in memory)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, min(cores, 8))


@dataclass(frozen=True)
class BuildJob:
    """One candidate build: the engine config, the tensors to mark (each one
    blocks the fusions across it), where an unmarked build keeps its optimized
    graph, and whether to ask which fusions survived the marking."""

    config: dict
    marks: tuple[str, ...]
    workdir: Optional[str] = None
    want_unblocked: bool = False
    outputs: tuple[str, ...] = ()  # the outputs to fetch and return (judged); () = all


@dataclass
class BuildResult:
    """What one build produced, judged later by the parent."""

    outputs: Optional[list[dict[str, np.ndarray]]] = None  # one dict per input sample
    fused_nodes: Optional[list[dict]] = None  # unmarked builds only
    optimized: Optional[str] = None
    error_kind: Optional[str] = None  # build_error | run_error
    error: Optional[str] = None
    build_message: Optional[str] = None  # str(exc) of the engine's error, for the summary
    failed_at: Optional[str] = None  # "build" or "run" when the engine failed
    unblocked: Optional[list[str]] = None
    fault: Optional[str] = None  # an EnvironmentFault's message: re-raised by the parent
    seconds: float = 0.0
    worker: str = "main"  # "main" (this process) or "w<pid>"


def build_and_run(engine, model_path: str, feeds: Sequence[dict], job: BuildJob, worker: str = "main") -> BuildResult:
    """Build the engine for `job`, run it on every sample, read its map.

    The same function runs in this process (one worker) and in the pool, so
    both paths produce the same records."""
    from pathlib import Path

    t0 = time.perf_counter()
    res = BuildResult(worker=worker)
    config = EngineConfig.from_dict(job.config)
    workdir = Path(job.workdir) if job.workdir else None
    try:
        built = engine.build(Path(model_path), config, list(job.marks), workdir)
    except EngineBuildError as exc:
        res.error_kind, res.error, res.build_message = exc.kind, exc.engine_message, str(exc)
        res.failed_at = "build"
        res.seconds = time.perf_counter() - t0
        return res
    try:
        outs = [built.run(f, list(job.outputs) or None) for f in feeds]
        if job.want_unblocked and job.marks:
            res.unblocked = [f.name for f in built.fusions_across(job.marks)]
        if workdir is not None:
            try:  # the map is informative; never fail a step on it
                res.fused_nodes = [f.to_dict() for f in built.fused_nodes]
                res.optimized = str(built.optimized_model_path)
            except Exception:  # noqa: BLE001
                res.fused_nodes = None
        res.outputs = [{k: np.asarray(v) for k, v in o.items()} for o in outs]
    except EngineBuildError as exc:  # built, then failed on the inputs
        res.error_kind, res.error, res.build_message = exc.kind, exc.engine_message, str(exc)
        res.failed_at = "run"
        res.outputs = None
    finally:
        built.close()
    res.seconds = time.perf_counter() - t0
    return res


# --- worker side ---------------------------------------------------------------
_W: dict = {}


def _init_worker(engine_name: str, model_path: str, feeds: list[dict]) -> None:
    from bisect_tui.engines import get_engine

    _W["engine"] = get_engine(engine_name)
    _W["model"] = model_path
    _W["feeds"] = feeds
    _W["name"] = f"w{os.getpid()}"


def _warm() -> str:
    return _W.get("name", "?")


def _work(job: BuildJob) -> BuildResult:
    try:
        return build_and_run(_W["engine"], _W["model"], _W["feeds"], job, _W["name"])
    except EnvironmentFault as exc:
        return BuildResult(fault=str(exc), worker=_W["name"])


# A spawned worker costs about a second of CPU (a fresh interpreter importing
# onnx and the engine). A pool nobody started on purpose (fanout 1: only the
# attribution has rounds of several builds) starts only once builds are seen
# to take longer than that; until then a round runs here, one build at a time.
# Which process builds never changes a result, only the wall time.
LAZY_START_BUILD_SECONDS = 2.0


class BuildPool:
    """`workers` builds at a time: this process builds one candidate of each
    round itself while `workers - 1` pool processes build the others."""

    def __init__(self, engine, engine_name: Optional[str], model_path: str, feeds: list[dict], workers: int):
        self.engine = engine
        self.model_path = str(model_path)
        self.feeds = feeds
        self.workers = max(1, int(workers))
        self.engine_name = engine_name
        self._ex: Optional[cf.ProcessPoolExecutor] = None
        self._local_seconds: list[float] = []
        if self.workers > 1 and engine_name is None:
            self.workers = 1  # an engine object given in code (tests' programmed engine): no registry name

    def start(self) -> None:
        """Start the pool processes now, so their imports overlap the first serial builds."""
        if self.workers < 2 or self._ex is not None:
            return
        # spawn: a fresh interpreter per worker, no server socket or temp folder
        # (forkserver keeps one in the temp folder, which is the session's while a
        # session runs, deleted after it)
        ctx = multiprocessing.get_context("spawn")
        self._ex = cf.ProcessPoolExecutor(max_workers=self.workers - 1, mp_context=ctx,
                                          initializer=_init_worker,
                                          initargs=(self.engine_name, self.model_path, self.feeds))
        for _ in range(self.workers - 1):
            self._ex.submit(_warm)

    def run(self, jobs: list[BuildJob]) -> list[BuildResult]:
        """Results in the order of `jobs`."""
        if self.workers < 2 or len(jobs) < 2 or (self._ex is None and not self._builds_are_slow()):
            return [self._local(j) for j in jobs]
        self.start()
        assert self._ex is not None
        # this process takes every workers-th job, the pool the rest
        mine = set(range(0, len(jobs), self.workers))
        futures = {i: self._ex.submit(_work, j) for i, j in enumerate(jobs) if i not in mine}
        try:
            local = {i: self._local(jobs[i]) for i in sorted(mine)}
            results = [local[i] if i in mine else futures[i].result() for i in range(len(jobs))]
        except BaseException:
            for f in futures.values():
                f.cancel()
            raise
        for r in results:
            if r.fault:
                raise EnvironmentFault(r.fault)
        return results

    def _builds_are_slow(self) -> bool:
        seen = self._local_seconds[-5:]
        return bool(seen) and sum(seen) / len(seen) >= LAZY_START_BUILD_SECONDS

    def _local(self, job: BuildJob) -> BuildResult:
        res = build_and_run(self.engine, self.model_path, self.feeds, job, "main")
        self._local_seconds.append(res.seconds)
        return res

    def close(self) -> None:
        if self._ex is not None:
            self._ex.shutdown(wait=True, cancel_futures=True)
            self._ex = None


def registry_name(triage) -> Optional[str]:
    """The registry name a worker can load this triage's engine by, or None
    when the engine is an object given in code (it cannot be rebuilt elsewhere)."""
    from bisect_tui.engines.registry import ENGINES, canonical

    module = ENGINES.get(canonical(triage.opts.engine))
    engine_module = type(triage.engine).__module__
    if module and (engine_module == module or engine_module.startswith(module + ".")):
        return canonical(triage.opts.engine)
    return None


def pool_for(triage, workers: int = 1) -> BuildPool:
    feeds = [triage.inputs.feeds(k) for k in range(triage.inputs.samples)]
    name = registry_name(triage) if workers > 1 else None
    return BuildPool(triage.engine, name, str(triage.session.model_path), feeds, workers)
