"""The triage checklist as steps: inputs -> baseline -> determinism -> range
check -> fused engine -> comparison (the order: steps.py).

`Triage` is what both the CLI and the TUI drive: each step is a method that
reads what earlier steps left in the session directory, does its work (or
reuses a valid earlier result) and writes its own result there. The work
started beside the dump is in overlap.py, the engine under test in fused.py,
the verdict and summary in summary.py, the PyTorch front end in frontend.py.
"""

from __future__ import annotations

import time
import zipfile
from typing import Any, Callable, Optional

import numpy as np

from bisect_tui.core import atomic, safepath
from bisect_tui.core.baseline import BaselineResult, run_baseline
from bisect_tui.core.cancel import CancelToken, Progress, ProgressFn, no_progress
from bisect_tui.core.checks import check_determinism, check_ranges
from bisect_tui.core.errors import UserError
from bisect_tui.core.input_suggest import check_config_inputs
from bisect_tui.core.input_suggest import resolve_shapes
from bisect_tui.core.named import check_names
from bisect_tui.core.inputs import InputSet, generate_inputs, load_inputs
from bisect_tui.core.model import ModelInfo, adopt_weights, load_model_info, save_prepared
from bisect_tui.core.engine_log import set_engine_log
from bisect_tui.core.memory import default_max_memory

# the float64 truth holds the weights as float32 (the model), float64 (its copy) and the
# evaluator's arrays: measured 9.5 GB peak on a 2.4 GB model
ARBITER_WEIGHT_COPIES = 4


def _size(n: int) -> str:
    return f"{n / (1 << 30):.1f} GB" if n >= 1 << 30 else f"{n / (1 << 20):.0f} MB"
from bisect_tui.core.session import Session, default_session_dir, stable_key
from bisect_tui.core.triage import catalog
from bisect_tui.core.triage.frontend import TorchFrontEnd
from bisect_tui.core.triage.fused import FusedStep
from bisect_tui.core.triage.options import TriageOptions
from bisect_tui.core.triage.overlap import Overlap
from bisect_tui.core.triage.records import (
    ArbiterResult,
    CheckResult,
    DeterminismResult,
    FrameworkResult,
    JsonView,
    RangeCheck,
)
from bisect_tui.core.triage.summary import Verdicts


class Triage(Overlap, FusedStep, TorchFrontEnd, Verdicts):
    """One triage of one model, persisted in its session directory."""

    # each step's result is a record (`check`, `determinism_result`, ...); these are their JSON
    fused = JsonView(CheckResult, "check")
    determinism = JsonView(DeterminismResult, "determinism_result")
    range_check = JsonView(RangeCheck, "range_result")
    framework = JsonView(FrameworkResult, "framework_result")
    arbiter = JsonView(ArbiterResult, "arbiter_result")

    def __init__(
        self,
        opts: TriageOptions,
        progress: ProgressFn = no_progress,
        cancel: Optional[CancelToken] = None,
        engine=None,
        engine_factory: Optional[Callable[[], Any]] = None,
        reference=None,
    ):
        """`engine`: the engine object to use; `engine_factory`: a picklable
        zero-argument callable that makes one (pool workers load their own with
        it). The CLI and the app give them; without either, the installed engine
        catalog's engine named by `opts.engine` (core/triage/catalog.py).
        `reference`: the unfused FP32 side (api.reference.UnfusedReference);
        by default the catalog's."""
        self.opts = opts
        self.reference = reference if reference is not None else catalog.installed().reference()
        self.progress = progress
        self.cancel = cancel or CancelToken()
        self.info: Optional[ModelInfo] = None
        self.session: Optional[Session] = None
        self.inputs: Optional[InputSet] = None
        self.shapes: dict[str, list[int]] = {}
        self.baseline: Optional[BaselineResult] = None
        self.determinism_result: Optional[DeterminismResult] = None
        self.range_result: Optional[RangeCheck] = None
        self.check: Optional[CheckResult] = None  # the engine under test, judged (check.json)
        self.framework_result: Optional[FrameworkResult] = None  # torch: golden data, cross-check, pitfalls
        self.arbiter_result: Optional[ArbiterResult] = None
        # per-tensor errors of a fused graph already probed in this process (the
        # check's probe is the search's when both run at the user's settings)
        self.probe_errors: dict[tuple, tuple[dict, dict]] = {}  # probe key -> (errors, how it read them)
        self._second_run = None  # checks.SecondRun started beside the baseline dump
        self._truth_source = None  # that run, after its digests, computing the arbiter's float64 truth
        self._fused_build = None  # (config, workdir, future): the engine under test, built beside the dump
        self._sensitivity_runs = None  # (key, future): the 1-ulp run, made beside the dump
        # the `bisect` command sets this: the search's first build starts when the dump is
        # done (bisect/early.py), and the search takes it from `search_builds`
        self.search_ahead = False
        # called with the check's verdict so far (passed, optimized_model, sensitivity) once a
        # failing engine's probe and map are in: the bisect command starts its first build there
        self.after_probe = None
        self.search_builds: dict = {}
        self.fused_map_objs = None  # (optimized graph, config, [FusedNode]) of the engine run_fused built
        self._torch = None  # frontends.torch.step.TorchPrepared
        self._engine = engine
        self._engine_factory = engine_factory

    @property
    def max_memory(self) -> int:
        return self.opts.max_memory or default_max_memory()

    @property
    def engine_factory(self) -> Callable[[], Any]:
        """How a pool worker makes its own engine (picklable)."""
        if self._engine_factory is None:
            self._engine_factory = catalog.factory(self.opts.engine)
        return self._engine_factory

    @property
    def engine(self):
        if self._engine is None:
            self._engine = self.engine_factory()
        if self._engine.progress is None:
            # engines whose builds take minutes (TensorRT) report builder phases; a
            # cancel from the app or Ctrl-C stops the build at the next phase step
            self._engine.progress = self._build_progress
        return self._engine

    def build_context(self, callbacks: bool = True, entered=None):
        """What a whole-graph build of this triage's model may need (api.BuildContext):
        the shapes it runs, its saved inputs, the session's cache folder and, in
        this process, the progress and cancel hooks (a pool worker's copy has none:
        callbacks do not cross processes)."""
        from bisect_tui.api import BuildContext

        assert self.session is not None
        return BuildContext(
            input_shapes={k: tuple(int(d) for d in v) for k, v in self.shapes.items()},
            feeds_file=self.session.inputs_path, cache_dir=self.session.root / "engines",
            progress=self._build_progress if callbacks else None,
            cancel_check=self.cancel.check if callbacks else None,
            entered=entered)  # this process's only: a job sent to a worker never has one

    def _build_progress(self, text: str) -> bool:
        self.progress(Progress("build", text))
        return not self.cancel.cancelled

    # step 1 -----------------------------------------------------------------
    def prepare(self) -> InputSet:
        """Load and check the model, open the session, fix the exact inputs."""
        if self.opts.torch and self._torch is None:
            self._prepare_torch()
        self.progress(Progress("inputs", "loading model"))
        info = load_model_info(self.opts.model)
        # an opset the reference has no kernels for: the conversion command, not the library's error
        self.reference.check_loadable(info.model, info.path)
        self.info = info
        if self.opts.input_file:
            root = self.opts.session_dir
        else:
            self.shapes = resolve_shapes(info, self.opts.shapes, self.opts.input_values, self.reference)
            check_config_inputs(info, self.opts.input_values, self.opts.input_ranges)
            root = self.opts.session_dir
        check_names(info.index, self.opts.config, self.engine)
        if root is None:  # a new shape or seed gets its own directory, never a lock message
            key = None if self.opts.inputs_are_default() else stable_key(self.opts.input_options())
            root = default_session_dir(info.path, info.sha256, inputs_key=key)
        session = Session(root)
        self.session = session
        set_engine_log(session.path("engine.log"))
        if self.opts.input_file:
            inputs = load_inputs(info, self.opts.input_file, self.opts.shapes)
            self.shapes = {n: list(a.shape[1:]) for n, a in inputs.arrays.items()}
        else:
            inputs = None
        # Validate everything before the first write, so bad input never touches
        # an existing session.
        session.init(info.path, info.sha256, self.opts.input_options(),
                     named=self.opts.session_dir is not None)
        safepath.use_session_temp(session.root)  # the engines' and our temp files stay in the session
        session.update_meta(options={**self.opts.to_dict(), "session_dir": str(session.root)})
        if not session.model_path.exists():
            save_prepared(info, session.model_path)
            # only a file written now: a reused one is read as it is
            self.engine.know_original(session.model_path, info.model, info.index)
            if not info.external:
                from bisect_tui.core.bisect.parts import know_model

                know_model(session.model_path, info.model, info.index)
        if info.external:  # weights in data files: the session's own, verified by digest
            session.update_meta(external_data=adopt_weights(info, session.model_path))
        if inputs is None:
            existing = self._load_saved_inputs()
            inputs = existing or generate_inputs(
                info, self.shapes, self.opts.seed, self.opts.samples, self.opts.input_ranges,
                self.opts.input_values,
            )
        if not session.inputs_path.exists():
            atomic.save_npz(session.inputs_path, inputs.arrays)
            session.write_json("input_source.json", {**inputs.source, "inputs": inputs.describe()})
        self.inputs = inputs
        session.mark_step("inputs", "passed", samples=inputs.samples)
        return inputs

    def _load_saved_inputs(self) -> Optional[InputSet]:
        assert self.session is not None
        if not self.session.inputs_path.exists():
            return None
        try:
            with safepath.open_read(self.session.root, "input.npz") as fh, np.load(fh, allow_pickle=False) as z:
                arrays = {k: z[k] for k in z.files}
        except safepath.UnsafePath:
            raise
        except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile) as exc:
            # damaged (or holds pickles, which are never loaded): made again from the seed
            self.progress(Progress("inputs", f"{self.session.inputs_path.name} is unreadable "
                                   f"({type(exc).__name__}); generating the inputs again from the seed"))
            self.session.inputs_path.unlink()
            return None
        src = self.session.read_json("input_source.json") or {}
        return InputSet(arrays, {k: v for k, v in src.items() if k != "inputs"})

    def _need_prepared(self) -> None:
        if self.inputs is None:
            self.prepare()

    # step 2 -----------------------------------------------------------------
    def run_baseline(self) -> BaselineResult:
        self._need_prepared()
        assert self.info and self.session and self.inputs
        self.session.mark_step("baseline", "running")
        # the build first: it needs nothing more, and the second run's plan (the
        # activations' sizes) took 0.5 s of this thread at 21,000 nodes, while the
        # other core waited
        self._start_fused_build_early()
        try:
            early = self._start_second_run_early()
        except BaseException:
            self._drop_fused_build()
            raise
        made: list = []

        def perturbed(sess) -> None:
            # the sensitivity check's 1-ulp run in the dump's own session: no session of its own
            from bisect_tui.core.checks import perturbed_runs

            made.append(perturbed_runs(self.reference, self.info.model, self.inputs, sess, list(self.info.outputs)))

        try:
            res = run_baseline(
                self.info, self.session, self.inputs, self.shapes, self.max_memory,
                self.cancel, self.progress, last_session=perturbed, reference=self.reference,
            )
        except BaseException:
            if early is not None:
                early.abort()
            self._drop_fused_build()
            raise
        self._second_run = early
        self.baseline = res
        if self.search_ahead and not res.reused:
            from bisect_tui.core.bisect.early import start_blocked_build

            start_blocked_build(self)
        if made and made[0] is not None:
            from bisect_tui.core import background

            self._sensitivity_runs = (self._sensitivity_key(res.manifest["key"]), background.done(made[0]))
        else:  # a reused dump (no session), or outputs the dump does not hold: beside what comes next
            self._start_sensitivity_early()
        self.session.mark_step(
            "baseline", "passed", tensors=len(res.manifest["tensors"]), reused=res.reused,
            bytes=res.manifest["bytes"], recomputed=len(res.recomputed),
        )
        return res

    # step 3 -----------------------------------------------------------------
    def run_determinism(self) -> dict:
        if self.baseline is None:
            self.run_baseline()
        assert self.info and self.session and self.inputs and self.baseline
        if not self.opts.check_determinism:
            self.session.mark_step("determinism", "skipped")
            self.determinism = {"deterministic": None, "skipped": True}
            return self.determinism
        self.session.mark_step("determinism", "running")
        started, self._second_run = self._second_run, None
        from bisect_tui.core.parted_run import plan_cuts_for

        res = check_determinism(
            self.info, self.session, self.inputs, self.shapes, self.baseline.manifest,
            self.max_memory, self.cancel, self.progress, started=started, reference=self.reference,
            cuts=plan_cuts_for(self),  # for a second run made there (one started early has its own)
        )
        self._drop_truth_source()
        if started is not None and started.truth_pending:
            self._truth_source = started
        self.determinism = res
        self.session.mark_step("determinism", "passed" if res["deterministic"] else "failed")
        return self.determinism

    # step 4 -----------------------------------------------------------------
    def run_range_check(self) -> dict:
        if self.baseline is None:
            self.run_baseline()
        assert self.info and self.session and self.baseline
        self.progress(Progress("range_check", "checking value ranges"))
        res = check_ranges(self.info, self.baseline.manifest, self.opts.ranges, session=self.session)
        self.range_check = res
        self.session.mark_step("range_check", "passed" if res["ok"] else "failed")
        return self.range_check

    # float64 arbiter -------------------------------------------------------------
    def run_arbiter(self) -> dict:
        """Baseline and fused outputs against a float64 run of the whole model."""
        from bisect_tui.core.arbiter import arbitrate, unavailable

        if self.check is None:
            self.run_fused()
        if not self.opts.arbiter:
            self.arbiter = {**unavailable("skipped (--no-arbiter)"), "skipped": True}
            return self.arbiter
        if self.check.error:
            self._drop_truth_source()
            self.arbiter = unavailable("the fused engine did not build or run: no output to judge")
            return self.arbiter
        needed = ARBITER_WEIGHT_COPIES * (self.info.initializer_bytes if self.info is not None else 0)
        if needed > self.max_memory:  # a 2.4 GB model peaked at 9.5 GB with the float64 run, 2.8 GB without
            self._drop_truth_source()
            self.arbiter = {**unavailable(
                f"skipped: the float64 run holds its weights about {ARBITER_WEIGHT_COPIES} times over "
                f"({_size(needed)}), more than the memory budget of {_size(self.max_memory)}; "
                f"give --max-memory {-(-needed // (1 << 20)) + 1}M to run it"), "skipped": True}
            return self.arbiter
        key = stable_key("arbiter/v2", self.baseline.manifest["key"], self.check.key,
                         self._torch.loaded.state_sha256 if self._torch else None)
        cached = self.session.read_json("arbiter.json")
        if cached and cached.get("key") == key:
            self._drop_truth_source()
            self.arbiter = cached
            return self.arbiter
        self.progress(Progress("arbiter", "float64 run of the whole model"))
        t0 = time.perf_counter()
        fused = self._load_fused_outputs()
        if fused is None:
            self.session.path("check.json").unlink(missing_ok=True)  # recompute with outputs saved
            self.check = None
            self.run_fused()
            fused = self._load_fused_outputs()
        outputs = list(self.info.outputs)
        # reference_output also covers outputs the baseline holds no dump of (a graph input passed
        # through, a constant)
        from bisect_tui.core.baseline import reference_output

        baseline = {n: np.asarray(reference_output(self.info, self.session, self.baseline.manifest, self.inputs, n))
                    for n in outputs}
        framework = None
        note = None
        got = None
        try:
            if self._torch is not None:
                from bisect_tui.frontends.torch.step import float64_truth

                truth, framework, source = float64_truth(self, self._torch)
            else:
                got = self._float64_truth(outputs)
                truth, source, note = got
        except UserError as exc:
            self.arbiter = {"key": key, **unavailable(str(exc))}
            self.session.write_json("arbiter.json", self.arbiter)
            return self.arbiter
        passed = {n: o.passed for n, o in self.check.outputs.items()}
        arb = arbitrate(truth, baseline, fused, self.check.config["precision"], source, passed,
                        framework, note, reference_check=getattr(got, "reference_check", None),
                        sensitivity=self.check.sensitivity)
        self.arbiter = {"key": key, **arb.to_dict(), "seconds": time.perf_counter() - t0}
        self.session.write_json("arbiter.json", self.arbiter)
        return self.arbiter

    # the whole checklist ------------------------------------------------------
    def run_all(self) -> dict:
        self.prepare()
        self.run_baseline()
        self.run_range_check()
        self.run_framework()
        overlapped = self._second_run is not None and self.verdict_before_engine() is None
        if overlapped:
            # the determinism check's second run (another process, started with the
            # dump) is still finishing: judge the engine meanwhile, instead of waiting
            self.run_fused()
        self.run_determinism()
        if self.verdict_before_engine() is None:
            if not overlapped:
                self.run_fused()
            self.run_arbiter()  # its float64 truth was computed by the second run meanwhile
        else:
            self._drop_truth_source()
            self._drop_fused_build()
            if overlapped:
                # a nondeterministic baseline stops the checklist before the engine: the
                # comparison made meanwhile cannot be trusted and is not reported
                self.check = None
                self.session.mark_step("fused", "skipped", why="the baseline is not deterministic")
        return self.summary()

