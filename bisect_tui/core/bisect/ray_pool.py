"""The build pool on Ray: one actor per worker, each holding the engine.

The same interface as `pool.BuildPool` (start, attach, run, close, workers,
names, kind), so the search does not know where its builds ran. Ray does the
placing and the queueing (`ray.util.ActorPool` gives each job to the next free
actor); there is no scheduler of ours. Each actor imports the engine when it
is created (at the start of the command, while this process makes the
baseline), gets the model and the inputs once through Ray's object store, and
builds from its own copy of the model, so it needs no file system shared with
this machine. An unmarked build's optimized graph (the level search, the
probe and the attribution read it) comes back as bytes and is written into
the session here.

`ray` is an optional extra (`pip install -e '.[ray]'` from a clone), imported only
when `--ray` is given.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
from pathlib import Path
from typing import Optional, Sequence

from bisect_tui.core import atomic
from bisect_tui.core.bisect.pool import (BuildJob, BuildResult, EngineFactory, guarded_build, raise_fault,
                                         same_factory, warm_up)
from bisect_tui.core.errors import UserError

_FILE_NAME = re.compile(r"^\.?[A-Za-z0-9_][A-Za-z0-9_.-]*$")  # what an engine names its optimized graph
LOCAL = ("local", "auto-local")


def import_ray():
    try:
        import ray
    except ImportError:
        raise UserError("--ray needs Ray, an optional extra: pip install -e '.[ray]' from a clone of bisect-tui") from None
    return ray


class BuildActor:
    """Runs inside a Ray worker process: the engine, the model and the inputs, kept."""

    def __init__(self, engine_factory: EngineFactory, index: int):
        import socket
        import tempfile

        self.engine = engine_factory()
        warm_up(self.engine)
        self.name = f"ray{index}@{socket.gethostname()}:{os.getpid()}"
        self.dir = Path(tempfile.mkdtemp(prefix="bisect_tui_ray_"))
        self.model: Optional[str] = None
        self.feeds: list = []
        self.keep = None

    def setup(self, model_bytes: bytes, digest: str, model_name: str, feeds: list, keep) -> str:
        if hashlib.sha256(model_bytes).hexdigest() != digest:
            raise RuntimeError("the model arrived damaged (its SHA-256 differs)")
        path = self.dir / (model_name if _FILE_NAME.match(model_name) else "model.onnx")
        path.write_bytes(model_bytes)
        self.model, self.feeds, self.keep = str(path), feeds, keep
        try:
            warm_up(self.engine, self.model)
        except Exception:  # noqa: BLE001  (a head start only: the first build reads it as usual)
            pass
        return self.name

    def build(self, job: BuildJob) -> BuildResult:
        """The job built here; an optimized graph kept for the session comes back as files."""
        local = job
        if job.workdir is not None:  # the session's engine folder: a folder of ours on this machine
            sub = self.dir / ("eng_" + hashlib.sha1(job.workdir.encode()).hexdigest()[:12])
            local = dataclasses.replace(job, workdir=str(sub))
        res = guarded_build(self.engine, self.model, self.feeds, local, self.name, self.keep)
        if res.optimized:
            opt = Path(res.optimized)
            res.files = {p.name: p.read_bytes() for p in (opt, opt.with_name(opt.name + ".data")) if p.is_file()}
            res.optimized = opt.name
            for p in Path(local.workdir).glob("optimized_*"):  # the session keeps its copy
                p.unlink()
        return res

    def close(self) -> None:
        import shutil

        shutil.rmtree(self.dir, ignore_errors=True)


class RayBuildPool:
    """`workers` Ray actors; `address`: "local" starts a Ray instance on this
    machine (`ray.init`), anything else is a cluster address for `ray.init`
    ("auto", "ray://head:10001", "head:6379")."""

    kind = "ray"

    def __init__(self, address: str, workers: int, engine_factory: Optional[EngineFactory]):
        if engine_factory is None:
            raise UserError("--ray: the engine must be one of the registry's (an engine given in code "
                            "cannot be loaded by a Ray worker)")
        self.address = address
        self.workers = max(1, int(workers))
        self.engine_factory = engine_factory
        self._actors: list = []
        self._names: list[str] = []
        self._started_ray = False

    @property
    def names(self) -> list[str]:
        return list(self._names)

    def start(self) -> None:
        """Connect to (or start) Ray and create the actors; their engine imports run from now on."""
        if self._actors:
            return
        ray = import_ray()
        if not ray.is_initialized():
            opts = dict(include_dashboard=False, log_to_driver=False, logging_level="ERROR")
            try:
                if self.address in LOCAL:
                    ray.init(num_cpus=self.workers, **opts)
                else:
                    ray.init(address=self.address, **opts)
            except Exception as exc:  # noqa: BLE001  (Ray raises ConnectionError, ValueError, RuntimeError...)
                from bisect_tui.core.onnx_files import first_line

                raise UserError(f"--ray {self.address}: Ray did not start or connect ({first_line(exc)}); "
                                "use --ray local for a Ray instance on this machine") from None
            self._started_ray = True
        actor = ray.remote(num_cpus=1)(BuildActor)
        self._actors = [actor.remote(self.engine_factory, i) for i in range(self.workers)]

    def attach(self, engine, engine_factory: Optional[EngineFactory], model_path: str, feeds: list[dict],
               keep: Optional[Sequence[str]] = None) -> None:
        """Send the model and the inputs to every actor once (one object each in Ray's store)."""
        if not same_factory(engine_factory, self.engine_factory):
            raise UserError("--ray: the engine must be one of the registry's")
        self.start()
        ray = import_ray()
        from bisect_tui.core.onnx_files import uses_external_data_file

        path = Path(model_path)
        if uses_external_data_file(path):
            raise UserError("--ray: models with external weight files are not sent to Ray workers yet; "
                            "run without --ray (--workers N uses processes on this machine)")
        data = path.read_bytes()
        model_ref, feeds_ref = ray.put(data), ray.put(feeds)
        digest = hashlib.sha256(data).hexdigest()
        self._names = ray.get([a.setup.remote(model_ref, digest, path.name, feeds_ref,
                                              list(keep) if keep is not None else None)
                               for a in self._actors])

    def run(self, jobs: list[BuildJob]) -> list[BuildResult]:
        """Results in the order of `jobs`, each built by the next free actor."""
        from ray.util import ActorPool

        if not jobs:
            return []
        results = list(ActorPool(self._actors).map(lambda a, j: a.build.remote(j), jobs))
        for job, res in zip(jobs, results):
            if res.fault:
                raise_fault(res)
            if res.files and job.workdir is not None:
                folder = Path(job.workdir)
                folder.mkdir(parents=True, exist_ok=True)
                for name, blob in res.files.items():
                    if not _FILE_NAME.match(name):
                        raise RuntimeError(f"a Ray worker sent back a file with an unexpected name: {name!r}")
                    atomic.write_bytes(folder / name, blob)
                res.optimized = str(folder / res.optimized) if res.optimized else None
            res.files = {}
        return results

    def close(self) -> None:
        if not self._actors and not self._started_ray:
            return
        ray = import_ray()
        try:
            ray.get([a.close.remote() for a in self._actors], timeout=10)
        except Exception:  # noqa: BLE001  (an actor that is gone has nothing left to remove)
            pass
        for a in self._actors:
            ray.kill(a)
        self._actors = []
        if self._started_ray:
            ray.shutdown()
            self._started_ray = False
