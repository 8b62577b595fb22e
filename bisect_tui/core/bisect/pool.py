"""Engine builds of one search round, in parallel worker processes (or Ray actors).

A round's candidates are independent builds (the k split points of a k-ary search, the
attribution's one rebuild per candidate pass), so several processes can build and run them at once;
on an accelerator box each worker would own one device. The parent judges every result itself, in
the order the strategy proposed the candidates, so the steps, the verdicts and the build count do
not depend on how many workers ran them, nor on which.

A spawned worker needs a fresh interpreter to import onnx and the engine before its first build
(0.2 s here, more on a loaded machine or a heavier engine). So `bisect` starts its workers before
anything else (`BuildPool.start`), while the baseline dump, the determinism run and the check keep
this process busy; by the first round of several builds they have imported the engine and hold the
inputs. Each worker is sent the inputs once (`attach`), never per build, and sends back only the
graph outputs the judge reads (a marked build also returns thousands of marked tensors). A round's
jobs are dealt before it starts, largest first, in turn to this process and each worker: everyone
gets as much to build, and the same round always goes to the same owners (a job taken by whoever is
free first would make the step log's worker column depend on timing).

What crosses the process boundary is our own plain records only (a build job: engine config,
tensor names, folder; a result: output arrays, the fused-node map as dicts, the engine's error
text) and the engine factory the caller hands the pool (a picklable callable such as
`functools.partial(registry.get_engine, "ort")`), which each worker calls to load its own
engine; workers read the model from the session's copy; no file's content is ever unpickled.

Worker processes start with `spawn`: never `fork`, which would copy the app's threads and the
engine's state; and not forkserver, which keeps its socket in the temp folder (the session's
while a session runs, deleted after it).
"""

from __future__ import annotations

import collections
import multiprocessing
import os
import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np

from bisect_tui.core import background
from bisect_tui.core.errors import EngineBuildError, EnvironmentFault, UserError
from bisect_tui.api import BuildContext, EngineConfig


def default_workers() -> int:
    """One worker per core this process may use, at most 8 (each build holds a
    whole engine in memory)."""
    from bisect_tui.core.threads import cores

    return max(1, min(cores(), 8))


EngineFactory = Callable[[], object]  # loads an engine in the process that calls it; picklable


@dataclass(frozen=True)
class BuildJob:
    """One candidate build: the engine config, the tensors to mark (each one
    blocks the fusions across it), where an unmarked build keeps its optimized
    graph, and whether to ask which fusions survived the marking."""

    config: EngineConfig
    marks: tuple[str, ...]
    workdir: Optional[str] = None
    want_unblocked: bool = False
    outputs: tuple[str, ...] = ()  # the outputs to fetch and return (judged); () = all
    # shapes, saved inputs and cache folder of a whole-graph build (api.BuildContext,
    # without callbacks so it travels to worker processes); None for subgraphs
    context: Optional[BuildContext] = None
    cuts: tuple[str, ...] = ()  # a marked build: made as parts cut at these tensors (parts.py)
    # closed at the search's next wait, after its result is handed over (a teardown held the
    # next step 0.2-0.3 s at 21,000 nodes); where one more engine fits the budget, here only
    close_later: bool = False

    def __post_init__(self):
        # the config as the session records it (entries sorted): every builder,
        # here or in a worker, builds exactly that
        object.__setattr__(self, "config", EngineConfig.from_dict(self.config.to_dict()))


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
    fault: Optional[str] = None  # a failure outside the engine's verdict: re-raised by the parent
    fault_kind: Optional[str] = None  # environment | user | internal
    seconds: float = 0.0
    worker: str = "main"  # "main" (this process), "w<pid>" (a worker process) or a Ray actor's name
    files: dict = field(default_factory=dict)  # Ray: optimized-graph files built away from the session
    # the map's FusedNode objects, for a build made in this process (never sent between processes)
    fused_objs: Optional[list] = None
    parts: int = 0  # made as this many parts (parts.py); 0: whole


def build_and_run(engine, model_path: str, feeds: Sequence[dict], job: BuildJob, worker: str = "main",
                  keep: Optional[Sequence[str]] = None) -> BuildResult:
    """Build the engine for `job`, run it on every sample, read its map.

    The same function runs in this process and in every worker, so all paths
    produce the same records. `keep`: the output names to return (the judge
    reads the graph outputs only); None keeps all."""
    t0 = time.perf_counter()
    if job.cuts:  # a marked build: made as the graph's parts where it can be
        from bisect_tui.core.bisect.parts import run_parts
        if (got := run_parts(engine, model_path, feeds, job)) is not None:
            return BuildResult(outputs=_kept(got[0], keep), parts=got[1], worker=worker, seconds=time.perf_counter() - t0)
    res = BuildResult(worker=worker)
    config = job.config
    workdir = Path(job.workdir) if job.workdir else None
    try:
        built = engine.build(Path(model_path), config, list(job.marks), workdir, context=job.context)
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
                objs = list(built.fused_nodes)
                res.fused_nodes = [f.to_dict() for f in objs]
                if worker == "main":
                    res.fused_objs = objs
                res.optimized = str(built.optimized_model_path)
            except Exception:  # noqa: BLE001
                res.fused_nodes = None
        res.outputs = _kept(outs, keep)
    except EngineBuildError as exc:  # built, then failed on the inputs
        res.error_kind, res.error, res.build_message = exc.kind, exc.engine_message, str(exc)
        res.failed_at = "run"
        res.outputs = None
    finally:
        background.close_later(built.close) if job.close_later and worker == "main" else built.close()
    res.seconds = time.perf_counter() - t0
    return res


def _kept(outs: list[dict], keep: Optional[Sequence[str]]) -> list[dict[str, np.ndarray]]:
    wanted = set(keep) if keep is not None else None
    return [{k: np.asarray(v) for k, v in o.items() if wanted is None or k in wanted} for o in outs]


def guarded_build(engine, model_path: str, feeds, job: BuildJob, worker: str, keep) -> BuildResult:
    """`build_and_run` for a worker: a failure that is not the engine's verdict
    comes back as a record, to be raised again by the parent as what it was."""
    try:
        return build_and_run(engine, model_path, feeds, job, worker, keep)
    except EnvironmentFault as exc:
        return BuildResult(fault=str(exc), fault_kind="environment", worker=worker)
    except UserError as exc:
        return BuildResult(fault=str(exc), fault_kind="user", worker=worker)
    except Exception as exc:  # noqa: BLE001  (a bug: the parent stops with an internal error)
        return BuildResult(fault=f"{type(exc).__name__}: {exc}", fault_kind="internal", worker=worker)


def raise_fault(res: BuildResult) -> None:
    if res.fault_kind == "environment":
        raise EnvironmentFault(res.fault)
    if res.fault_kind == "user":
        raise UserError(res.fault)
    raise RuntimeError(f"build worker {res.worker} failed: {res.fault}")


def warm_up(engine, model_path: Optional[str] = None) -> None:
    """What an engine does once per process before its first build: imports,
    then (given the model) reading it once for all the builds to come."""
    engine.warm_up() if model_path is None else engine.warm_up(Path(model_path))


# --- worker process ---------------------------------------------------------------
def _worker_main(conn, engine_factory: EngineFactory, device: Optional[str] = None) -> None:
    """A worker process: load the engine (`engine_factory()`), then build jobs until told to stop.

    `device`: the one accelerator this worker may see (CUDA_VISIBLE_DEVICES,
    set before the engine is imported, so its builds and runs go there).

    Messages in: ("setup", model_path, feeds, keep), ("build", BuildJob), ("stop",).
    Messages out: ("ready", name), ("ok",), ("result", BuildResult), ("error", text)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's; it stops us
    name = f"w{os.getpid()}"
    if device is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = device
        name += "@" + os.environ["CUDA_VISIBLE_DEVICES"]  # as this process sees it
    try:
        engine = engine_factory()
        warm_up(engine)
    except BaseException as exc:  # noqa: BLE001
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", name))
    model, feeds, keep = None, [], None
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg[0] == "setup":
            _, model, feeds, keep = msg
            try:
                warm_up(engine, model)
            except Exception:  # noqa: BLE001  (a head start only: the first build reads it as usual)
                pass
            conn.send(("ok",))
        elif msg[0] == "build":
            conn.send(("result", guarded_build(engine, model, feeds, msg[1], name, keep)))
        else:
            return


class _Round:
    """The jobs of one round, dealt before it starts: largest first (the number
    of marked tensors is what a build's time grows with), in turn to this
    process (owner 0) and each worker, so each gets as much to build as the
    others and the same round always goes to the same owners."""

    def __init__(self, jobs: list[BuildJob], owners: int):
        self.jobs = jobs
        order = sorted(range(len(jobs)), key=lambda i: -len(jobs[i].marks))  # stable: ties keep their order
        self.queues = [collections.deque(order[k::owners]) for k in range(owners)]
        self.results: list[Optional[BuildResult]] = [None] * len(jobs)
        self.errors: list[BaseException] = []
        self.pending = len(jobs)
        self.cond = threading.Condition()
        self.closed = False

    def take(self, owner: int) -> Optional[int]:
        with self.cond:
            if self.closed or self.errors or not self.queues[owner]:
                return None
            return self.queues[owner].popleft()

    def put(self, i: int, res: Optional[BuildResult], error: Optional[BaseException] = None) -> None:
        with self.cond:
            self.pending -= 1
            if error is not None:
                self.errors.append(error)
            else:
                self.results[i] = res
            self.cond.notify_all()

    def wait(self) -> None:
        """Until every job is built, or one failed (the others are not waited for)."""
        with self.cond:
            while self.pending and not self.errors:
                self.cond.wait()


class _ProcessWorker:
    """One spawned worker process and the thread in this process that talks to it.

    The thread waits for the worker's imports, sends it the inputs once, then
    builds, through the worker, its share of each round it is handed."""

    def __init__(self, ctx, engine_factory: EngineFactory, device: Optional[str] = None):
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_main, args=(child, engine_factory, device), daemon=True,
                                name="bisect-tui build worker")
        self.proc.start()
        child.close()
        self.name = f"w{self.proc.pid}" + (f"@{device}" if device is not None else "")
        self.inbox: queue.Queue = queue.Queue()
        self.imported = threading.Event()  # the engine is imported: it reads its messages
        self.ready = threading.Event()  # imported and set up: it can take jobs
        self.settled = threading.Event()  # ready, or gone for good
        self.dead: Optional[str] = None
        self.busy = False  # building a job now
        self.thread = threading.Thread(target=self._serve, daemon=True, name=f"pool {self.name}")
        self.thread.start()

    def _send(self, msg) -> None:
        try:
            self.conn.send(msg)
        except OSError:  # the process is gone (killed, out of memory)
            self.proc.join(1.0)
            raise RuntimeError(f"build worker {self.name} stopped (exit code {self.proc.exitcode})") from None

    def _recv(self):
        try:
            msg = self.conn.recv()
        except (EOFError, OSError):
            self.proc.join(1.0)
            raise RuntimeError(f"build worker {self.name} stopped (exit code {self.proc.exitcode})") from None
        if msg[0] == "error":
            raise RuntimeError(f"build worker {self.name} could not start: {msg[1]}")
        return msg

    def _serve(self) -> None:
        try:
            self._recv()  # ("ready", name): the engine is imported
            self.imported.set()
            while True:
                item = self.inbox.get()
                if item is None:
                    self.conn.send(("stop",))
                    return
                if item[0] == "setup":
                    self._send(item)
                    self._recv()
                    self.ready.set()
                    self.settled.set()
                    continue
                rnd: _Round = item[1]
                while (i := rnd.take(item[2])) is not None:
                    self.busy = True
                    try:
                        self._send(("build", rnd.jobs[i]))
                        res = self._recv()[1]
                    except BaseException as exc:  # noqa: BLE001
                        rnd.put(i, None, exc)
                        raise
                    finally:
                        self.busy = False
                    rnd.put(i, res)
        except BaseException as exc:  # noqa: BLE001
            self.dead = str(exc)
            self.ready.clear()
        finally:
            self.settled.set()

    def join(self, timeout: float = 5.0) -> None:
        """After `inbox.put(None)`: wait for the process to end. One still
        importing, or in the middle of a long build, is not worth waiting for."""
        if self.imported.is_set() and self.dead is None and not self.busy:
            self.proc.join(timeout)
        if self.proc.is_alive():  # in the middle of a long build: not worth waiting for
            self.proc.terminate()
            self.proc.join(timeout)
        self.conn.close()


# A pool nobody started on purpose (fanout 1 outside the `bisect` command: only
# the attribution has rounds of several builds) starts only once builds are seen
# to take longer than a worker's start; until then rounds run here. Which process
# builds never changes a result, only the wall time.
LAZY_START_BUILD_SECONDS = 2.0
# how long a round waits for a worker to import the engine before building without it
READY_SECONDS = 120.0


class BuildPool:
    """`workers` builds at a time: this process and `workers - 1` worker processes.

    `start()` launches the processes (at once, so their imports overlap other
    work); `attach()` gives the model, the inputs and the engine once they are
    known; `run()` builds a round."""

    @property
    def kind(self) -> str:
        return "processes" if self.workers > 1 else "serial"

    def __init__(self, workers: int, engine_factory: Optional[EngineFactory] = None,
                 devices: Optional[Sequence[str]] = None):
        """`engine_factory`: how a worker process loads the engine (None: builds
        stay in this process). `devices`: one accelerator per builder (this
        process takes the first, worker k the k+1-th); as many workers as
        devices when given."""
        self.devices = [str(d) for d in devices] if devices else None
        if self.devices:
            workers = len(self.devices)
        self.workers = max(1, int(workers))
        self.engine_factory = engine_factory
        self.engine = None
        self.model_path: Optional[str] = None
        self.feeds: list[dict] = []
        self.keep: Optional[list[str]] = None
        self._procs: list[_ProcessWorker] = []
        self._local_seconds: list[float] = []
        if engine_factory is None:
            self.workers = 1  # an engine object given in code (tests' programmed engine): no other process loads it

    @property
    def names(self) -> list[str]:
        return ["main"] + [p.name for p in self._procs]

    def start(self) -> None:
        """Start the worker processes now; each imports the engine in the background."""
        if self.workers < 2 or self._procs:
            return
        ctx = multiprocessing.get_context("spawn")
        devs = self.devices[1:] if self.devices else [None] * (self.workers - 1)
        self._procs = [_ProcessWorker(ctx, self.engine_factory, d) for d in devs]
        if self.model_path is not None:
            self._send_setup()

    def attach(self, engine, engine_factory: Optional[EngineFactory], model_path: str, feeds: list[dict],
               keep: Optional[Sequence[str]] = None) -> None:
        """The engine, model and inputs the builds use; sent to each worker once.

        An engine this pool's workers cannot load the same way (an object given
        in code: no factory) makes the pool serial."""
        self.engine = engine
        self.model_path = str(model_path)
        self.feeds = feeds
        self.keep = list(keep) if keep is not None else None
        if not same_factory(engine_factory, self.engine_factory):
            self.close()
            self.workers = 1
            return
        if self._procs:
            self._send_setup()

    def _send_setup(self) -> None:
        for p in self._procs:
            p.inbox.put(("setup", self.model_path, self.feeds, self.keep))

    def run(self, jobs: list[BuildJob]) -> list[BuildResult]:
        """Results in the order of `jobs`."""
        if self.workers > 1 and len(jobs) > 1 and not self._procs and self._builds_are_slow():
            self.start()
        if len(jobs) < 2:
            return self._check([self._local(j) for j in jobs])
        # a worker still importing is waited for (the command starts them before
        # the baseline, so by now they are ready); one that could not start is left out
        live = [p for p in self._procs if p.settled.wait(READY_SECONDS) and p.ready.is_set()]
        if not live:
            return self._check([self._local(j) for j in jobs])
        rnd = _Round(jobs, 1 + len(live))
        for k, p in enumerate(live, 1):
            p.inbox.put(("round", rnd, k))
        try:
            while (i := rnd.take(0)) is not None:
                try:
                    res = self._local(jobs[i])
                except BaseException as exc:
                    rnd.put(i, None, exc)
                    raise
                rnd.put(i, res)
        except BaseException:
            # a Ctrl-C or a failure here: nothing more is taken, and the builds
            # still running are not waited for (close() stops their processes)
            with rnd.cond:
                rnd.closed = True
            raise
        rnd.wait()
        if rnd.errors:
            raise rnd.errors[0]
        return self._check(rnd.results)  # type: ignore[arg-type]

    @staticmethod
    def _check(results: list[BuildResult]) -> list[BuildResult]:
        for r in results:
            if r.fault:
                raise_fault(r)
        return results

    def _builds_are_slow(self) -> bool:
        seen = self._local_seconds[-5:]
        return bool(seen) and sum(seen) / len(seen) >= LAZY_START_BUILD_SECONDS

    def _local(self, job: BuildJob) -> BuildResult:
        res = build_and_run(self.engine, self.model_path, self.feeds, job, "main", self.keep)
        self._local_seconds.append(res.seconds)
        return res

    def close(self) -> None:
        procs, self._procs = self._procs, []
        for p in procs:
            p.inbox.put(None)
        for p in procs:
            p.join()


def same_factory(a: Optional[EngineFactory], b: Optional[EngineFactory]) -> bool:
    """Whether two factories load the same engine (two `partial`s of the same
    call are equal here, though not to Python)."""
    if a is None or b is None:
        return False
    return a is b or a == b or all(getattr(a, k, a) == getattr(b, k, b) for k in ("func", "args", "keywords"))


def pool_for(triage, workers: int = 1, pool=None, engine_factory: Optional[EngineFactory] = None):
    """`pool` (or a new one of `workers`) attached to this triage's engine, model and inputs.

    `engine_factory`: how worker processes load the engine; by default the
    triage's own (None for an engine object given in code: builds stay here)."""
    if engine_factory is None:
        engine_factory = getattr(triage, "engine_factory", None)
    if pool is None:
        pool = BuildPool(workers, engine_factory if workers > 1 else None)
    feeds = [triage.inputs.feeds(k) for k in range(triage.inputs.samples)]
    pool.attach(triage.engine, engine_factory, str(triage.session.model_path), feeds, list(triage.info.outputs))
    return pool
