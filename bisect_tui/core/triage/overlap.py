"""Work started beside the baseline dump, on another core, and taken (or
dropped) by the step that needs it: the determinism check's second run (which
then computes the arbiter's float64 truth), the engine under test's build, and
the sensitivity check's 1-ulp run.

Each is started only when the machine has a core to spare and the model is a
small share of the memory budget; a step that finds nothing started does the
work itself, so the answers never depend on what overlapped.
"""

from __future__ import annotations

import functools
import threading
from pathlib import Path
from typing import Optional

from bisect_tui.core.session import stable_key
from bisect_tui.core.threads import cores
from bisect_tui.core.triage.options import EngineConfig


def fused_key(baseline_key: str, opts, config: EngineConfig) -> str:
    """The cache key of check.json: the baseline and every setting the comparison reads."""
    return stable_key("fused/v4", baseline_key, opts.engine, opts.compare_tensors,
                      config.to_dict(), opts.tolerance.to_dict(), opts.topk)


def sensitivity_key(baseline_key: str, opts) -> str:
    return stable_key("sensitivity/v1", baseline_key, opts.tolerance.to_dict())


class Overlap:
    """The early work of one `Triage` (a mixin: it reads the triage's model,
    session, inputs and options)."""

    def _start_second_run_early(self):
        """The determinism check's second run, started now so that its process
        start and its run overlap the dump on another core. Only for a model
        whose activations are a small share of the memory budget (both runs
        hold theirs at once) and one group; otherwise it runs after the dump."""
        if not self.opts.check_determinism or cores() < 2:
            return None
        from bisect_tui.core.baseline import baseline_key
        from bisect_tui.core.checks import SecondRun, determinism_plan
        from bisect_tui.core.groups import model_sizes

        assert self.info and self.session and self.inputs
        cached = self.session.read_json("determinism.json")
        if cached and cached.get("baseline_key") == baseline_key(self.info, self.inputs, self.reference):
            return None
        tensors = self.info.index.intermediate_tensors()
        sizes, _ = model_sizes(self.info, self.shapes)
        activations = sum(sizes.get(t) or 0 for t in tensors) * max(self.inputs.samples, 1)
        if activations > self.max_memory // 8:
            return None
        groups = determinism_plan(self.info, self.shapes, tensors, self.max_memory)
        if len(groups) != 1:
            return None
        # the arbiter's float64 truth needs only the model and inputs: the second
        # process computes it next (the torch front end's truth comes from torch)
        truth = list(self.info.outputs) if self.opts.arbiter and self._torch is None else None
        from bisect_tui.core.parted_run import plan_cuts_for

        return SecondRun(self.session, groups, self.cancel, truth_outputs=truth, reference=self.reference,
                         cuts=plan_cuts_for(self))

    def _fused_key(self, baseline_key: str, config: EngineConfig) -> str:
        return fused_key(baseline_key, self.opts, config)

    def _start_fused_build_early(self) -> None:
        """The engine under test needs nothing from the baseline to be built: with an
        engine whose builds may run in a thread (Capabilities.concurrent_builds) it is
        built beside the dump, and run_fused takes it. Only for a model whose weights
        are a small share of the memory budget (the build holds a copy while the
        dump runs), and not when check.json already holds this verdict."""
        if not self.may_build_beside():
            return
        assert self.info and self.session and self.inputs
        from bisect_tui.core.baseline import baseline_key

        config = self.opts.config
        cached = self.session.read_json("check.json")
        if cached and cached.get("key") == self._fused_key(baseline_key(self.info, self.inputs, self.reference), config):
            return
        from bisect_tui.core import background

        workdir = self.engine_dir(config)
        workdir.mkdir(parents=True, exist_ok=True)
        entered = threading.Event()
        build = functools.partial(self.engine.build, context=self.build_context(entered=entered.set))
        future = background.start(build, self.session.model_path, config, (), workdir, name="fused-build")
        self._fused_build = (config, workdir, future)
        # this thread's next work (the second run's plan: shape inference of the whole
        # graph, one call that holds the GIL) kept the build from reaching the library
        # for 0.43 s at 21,000 nodes while the other core idled
        background.wait_for_entry(future, entered)

    def engine_build_in_flight(self) -> bool:
        """The engine under test is still being built beside the checks (what the
        check waits on next): work started now that is needed later should yield to it."""
        early = self._fused_build
        return early is not None and not early[2].done()

    def may_build_beside(self) -> bool:
        """Engine builds may run in a thread beside other work: an engine whose builds
        let go of the GIL (Capabilities.concurrent_builds), two cores or more, and
        weights a small share of the memory budget (such a build holds a copy meanwhile)."""
        return (self.engine.capabilities.concurrent_builds and cores() >= 2
                and self.info is not None and self.info.initializer_bytes * 4 <= self.max_memory // 8)

    def _sensitivity_key(self, baseline_key: str) -> str:
        return sensitivity_key(baseline_key, self.opts)

    def _start_sensitivity_early(self) -> None:
        """The sensitivity check's 1-ulp run needs the model and inputs only: run it
        in a thread beside the dump (the baseline's runtime lets go of the GIL), for a model whose
        activations are a small share of the memory budget."""
        if cores() < 2 or not any(a.dtype.kind == "f" for a in self.inputs.arrays.values()):
            return
        from bisect_tui.core.baseline import baseline_key
        from bisect_tui.core.groups import model_sizes

        assert self.info and self.session and self.inputs
        sizes, _ = model_sizes(self.info, self.shapes)
        activations = sum(v or 0 for v in sizes.values()) * max(self.inputs.samples, 1)
        if activations > self.max_memory // 8 or self.info.initializer_bytes * 4 > self.max_memory // 8:
            return
        key = self._sensitivity_key(baseline_key(self.info, self.inputs, self.reference))
        cached = self.session.read_json("sensitivity.json")
        if cached and cached.get("key") == key:
            return
        from bisect_tui.core import background
        from bisect_tui.core.checks import perturbed_runs

        self._sensitivity_runs = (key, background.start(perturbed_runs, self.reference, self.info.model, self.inputs,
                                                        name="sensitivity"))

    def _take_sensitivity_runs(self, key: str):
        early, self._sensitivity_runs = self._sensitivity_runs, None
        if early is None or early[0] != key:
            return None
        return early[1].result()

    def _take_fused_build(self, config: EngineConfig, workdir: Path):
        """The early build of exactly this config (its engine errors raised here, as
        a build here would raise them), or None."""
        early, self._fused_build = self._fused_build, None
        if early is None:
            return None
        if early[0] != config or early[1] != workdir:
            self._drop(early)
            return None
        return early[2].result()

    @staticmethod
    def _drop(early) -> None:
        def close(f) -> None:
            try:
                f.result().close()
            except BaseException:  # noqa: BLE001 - a build nobody asked for: its error is nobody's
                pass

        early[2].add_done_callback(close)

    def _drop_fused_build(self) -> None:
        if self._fused_build is not None:
            self._drop(self._fused_build)
            self._fused_build = None

    def _drop_truth_source(self) -> None:
        if self._truth_source is not None:
            self._truth_source.abort()
            self._truth_source = None

    def _float64_truth(self, outputs: list[str]) -> tuple[dict, Optional[str], Optional[str]]:
        """The arbiter's truth: from the second process when it computed it, else here."""
        src, self._truth_source = self._truth_source, None
        got = src.truth() if src is not None else None
        if got is not None and set(got[0]) == set(outputs):
            return got
        from bisect_tui.core.reference import dump_values, float64_outputs

        return float64_outputs(self.info.model, self.inputs, outputs, self.reference,
                               dump_values(self.session, self.baseline.manifest))

