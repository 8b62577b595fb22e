"""The triage checklist as steps: inputs -> baseline -> determinism -> range
check -> fused engine -> comparison.

`Triage` is what both the CLI and the TUI drive: each step is a method that
reads what earlier steps left in the session directory, does its work (or
reuses a valid earlier result) and writes its own result there.
"""

from __future__ import annotations

import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np

from bisect_tui.core import atomic, safepath
from bisect_tui.core.baseline import (
    BaselineResult,
    run_baseline,
    versions,
)
from bisect_tui.core.cancel import CancelToken, Progress, ProgressFn, no_progress
from bisect_tui.core.checks import check_determinism, check_ranges
from bisect_tui.core.commandline import command_line
from bisect_tui.core.errors import EngineBuildError, ExitCode, UserError
from bisect_tui.core.input_suggest import check_config_inputs
from bisect_tui.core.inputs import (
    InputSet,
    generate_inputs,
    load_inputs,
    resolve_shapes,
)
from bisect_tui.core.model import ModelInfo, load_model_info, save_prepared
from bisect_tui.core.threads import cores
from bisect_tui.core.runner import default_max_memory, set_engine_log
from bisect_tui.core.session import Session, default_session_dir, now_iso, stable_key
from bisect_tui.core.tolerance import ToleranceSpec, parse_tolerance
from bisect_tui.api import EngineConfig


@dataclass
class TriageOptions:
    model: Optional[Path]  # None until a torch front end has exported the model
    session_dir: Optional[Path] = None
    shapes: dict[str, list[int]] = field(default_factory=dict)
    seed: int = 0
    samples: int = 1
    input_file: Optional[Path] = None
    input_ranges: dict[str, tuple[float, float]] = field(default_factory=dict)
    input_values: dict[str, Any] = field(default_factory=dict)  # --input-value: one value fills the input
    max_memory: int = 0  # 0 = derived from free RAM
    engine: str = "ort"
    config: EngineConfig = field(default_factory=EngineConfig)
    tolerance: ToleranceSpec = field(default_factory=lambda: parse_tolerance("fp32"))
    ranges: list[tuple[str, float, float]] = field(default_factory=list)
    check_determinism: bool = True
    topk: Optional[int] = None
    compare_tensors: bool = True  # also compare every tensor the fused graph keeps
    torch: Optional[dict] = None  # TorchSpec.to_dict(): the model comes from a PyTorch factory
    arbiter: bool = True  # judge baseline and fused outputs against a float64 run of the model

    def input_options(self) -> dict:
        if self.input_file:
            from bisect_tui.core.model import file_sha256

            return {"input_file": str(Path(self.input_file).resolve()),
                    "input_sha256": file_sha256(Path(self.input_file)),
                    "shapes": self.shapes}
        out = {"seed": self.seed, "samples": self.samples, "shapes": self.shapes,
               "input_ranges": {k: list(v) for k, v in self.input_ranges.items()}}
        if self.input_values:  # only when given: sessions made before the option stay valid
            out["input_values"] = dict(self.input_values)
        return out

    def inputs_are_default(self) -> bool:
        """Generated with the defaults: the session directory keeps the model's plain name."""
        return (not self.input_file and not self.shapes and self.seed == 0 and self.samples == 1
                and not self.input_ranges and not self.input_values)


    def to_dict(self) -> dict:
        """Everything needed to rerun this triage (saved in session.json for `resume`)."""
        return {
            "model": str(Path(self.model).resolve()) if self.model else None,
            "session_dir": str(self.session_dir) if self.session_dir else None,
            "shapes": self.shapes,
            "seed": self.seed,
            "samples": self.samples,
            "input_file": str(self.input_file) if self.input_file else None,
            "input_ranges": {k: list(v) for k, v in self.input_ranges.items()},
            "input_values": dict(self.input_values),
            "max_memory": self.max_memory,
            "engine": self.engine,
            "config": self.config.to_dict(),
            "tolerance": self.tolerance.to_dict(),
            "ranges": [list(r) for r in self.ranges],
            "check_determinism": self.check_determinism,
            "topk": self.topk,
            "compare_tensors": self.compare_tensors,
            "torch": self.torch,
            "arbiter": self.arbiter,
        }

    @classmethod
    def from_dict(cls, d: dict) -> "TriageOptions":
        return cls(
            model=Path(d["model"]) if d.get("model") else None,
            session_dir=Path(d["session_dir"]) if d.get("session_dir") else None,
            shapes={k: list(v) for k, v in (d.get("shapes") or {}).items()},
            seed=int(d.get("seed", 0)),
            samples=int(d.get("samples", 1)),
            input_file=Path(d["input_file"]) if d.get("input_file") else None,
            input_ranges={k: tuple(v) for k, v in (d.get("input_ranges") or {}).items()},
            input_values=dict(d.get("input_values") or {}),
            max_memory=int(d.get("max_memory") or 0),
            engine=d.get("engine", "ort"),
            config=EngineConfig.from_dict(d.get("config") or {}),
            tolerance=ToleranceSpec.from_dict(d["tolerance"]) if d.get("tolerance") else parse_tolerance("fp32"),
            ranges=[tuple(r) for r in d.get("ranges") or []],
            check_determinism=bool(d.get("check_determinism", True)),
            topk=d.get("topk"),
            compare_tensors=bool(d.get("compare_tensors", True)),
            torch=d.get("torch"),
            arbiter=bool(d.get("arbiter", True)),
        )


def overall_exit(verdict: str) -> ExitCode:
    return {
        "pass": ExitCode.OK,
        "fail": ExitCode.TOLERANCE,
        "nondeterministic": ExitCode.NONDETERMINISTIC,
        "nan_inf": ExitCode.NAN_INF,
        # the ONNX export is not the PyTorch model: a tolerance broken before any engine runs
        "export_mismatch": ExitCode.TOLERANCE,
    }[verdict]


class Triage:
    """One triage of one model, persisted in its session directory."""

    def __init__(
        self,
        opts: TriageOptions,
        progress: ProgressFn = no_progress,
        cancel: Optional[CancelToken] = None,
        engine=None,
    ):
        """`engine`: the engine object to use (tests inject one); by default
        the registry's engine named by `opts.engine`."""
        self.opts = opts
        self.progress = progress
        self.cancel = cancel or CancelToken()
        self.info: Optional[ModelInfo] = None
        self.session: Optional[Session] = None
        self.inputs: Optional[InputSet] = None
        self.shapes: dict[str, list[int]] = {}
        self.baseline: Optional[BaselineResult] = None
        self.determinism: Optional[dict] = None
        self.range_check: Optional[dict] = None
        self.fused: Optional[dict] = None
        self.framework: Optional[dict] = None  # torch front end: golden data, cross-check, pitfalls
        self.arbiter: Optional[dict] = None
        # per-tensor errors of a fused graph already probed in this process (the
        # check's probe is the search's when both run at the user's settings)
        self.probe_errors: dict[tuple, dict] = {}
        self._second_run = None  # checks.SecondRun started beside the baseline dump
        self._truth_source = None  # that run, after its digests, computing the arbiter's float64 truth
        self._fused_build = None  # (config, workdir, future): the engine under test, built beside the dump
        self._sensitivity_runs = None  # (key, future): the 1-ulp run, made beside the dump
        # the `bisect` command sets this: the search's first build starts when the dump is
        # done (bisect/early.py), and the search takes it from `search_builds`
        self.search_ahead = False
        self.search_builds: dict = {}
        self.fused_map_objs = None  # (optimized graph, config, [FusedNode]) of the engine run_fused built
        self._torch = None  # frontends.torch.step.TorchPrepared
        self._engine = engine

    @property
    def max_memory(self) -> int:
        return self.opts.max_memory or default_max_memory()

    @property
    def engine(self):
        if self._engine is None:
            from bisect_tui.engines.registry import get_engine

            self._engine = get_engine(self.opts.engine)
        if getattr(self._engine, "progress", False) is None:
            # engines whose builds take minutes (TensorRT) report builder phases; a
            # cancel from the app or Ctrl-C stops the build at the next phase step
            self._engine.progress = self._build_progress
        return self._engine

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
        self.info = info
        if self.opts.input_file:
            root = self.opts.session_dir
        else:
            self.shapes = resolve_shapes(info, self.opts.shapes, self.opts.input_values)
            check_config_inputs(info, self.opts.input_values, self.opts.input_ranges)
            root = self.opts.session_dir
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
        safepath.use_session_temp(session.root)  # ORT's and our temp files stay in the session
        session.update_meta(options={**self.opts.to_dict(), "session_dir": str(session.root)})
        if not session.model_path.exists():
            save_prepared(info, session.model_path)
            known = getattr(self.engine, "know_original", None)
            if known is not None:  # only a file written now: a reused one is read as it is
                known(session.model_path, info.model, info.index)
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

    def _prepare_torch(self) -> None:
        """Export the PyTorch model into the session first; the checklist then
        runs on that ONNX file like on any other."""
        from bisect_tui.frontends.torch import TorchSpec
        from bisect_tui.frontends.torch.step import default_session_dir as torch_session_dir
        from bisect_tui.frontends.torch.step import prepare

        spec = TorchSpec.from_dict(self.opts.torch)
        self.progress(Progress("inputs", f"exporting {spec.text} to ONNX"))
        root = Path(self.opts.session_dir or torch_session_dir(spec))
        self._torch = prepare(self.opts, root)
        self.opts.session_dir = root
        self.opts.model = self._torch.model_path
        if self._torch.input_file is not None:
            self.opts.input_file = self._torch.input_file

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
        early = self._start_second_run_early()
        self._start_fused_build_early()
        made: list = []

        def perturbed(sess) -> None:
            # the sensitivity check's 1-ulp run in the dump's own session: no session of its own
            from bisect_tui.core.checks import perturbed_runs

            made.append(perturbed_runs(self.info.model, self.inputs, sess, list(self.info.outputs)))

        try:
            res = run_baseline(
                self.info, self.session, self.inputs, self.shapes, self.max_memory,
                self.cancel, self.progress, last_session=perturbed,
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
        if cached and cached.get("baseline_key") == baseline_key(self.info, self.inputs):
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
        return SecondRun(self.session, groups, self.cancel, truth_outputs=truth)

    def _fused_key(self, baseline_key: str, config: EngineConfig) -> str:
        return stable_key("fused/v4", baseline_key, self.opts.engine, self.opts.compare_tensors,
                          config.to_dict(), self.opts.tolerance.to_dict(), self.opts.topk)

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
        if cached and cached.get("key") == self._fused_key(baseline_key(self.info, self.inputs), config):
            return
        from bisect_tui.core import background

        workdir = self.engine_dir(config)
        workdir.mkdir(parents=True, exist_ok=True)
        future = background.start(self.engine.build, self.session.model_path, config, (), workdir, name="fused-build")
        self._fused_build = (config, workdir, future)

    def may_build_beside(self) -> bool:
        """Engine builds may run in a thread beside other work: an engine whose builds
        let go of the GIL (Capabilities.concurrent_builds), two cores or more, and
        weights a small share of the memory budget (such a build holds a copy meanwhile)."""
        caps = getattr(self.engine, "capabilities", None)
        return (bool(getattr(caps, "concurrent_builds", False)) and cores() >= 2
                and self.info is not None and self.info.initializer_bytes * 4 <= self.max_memory // 8)

    def _sensitivity_key(self, baseline_key: str) -> str:
        return stable_key("sensitivity/v1", baseline_key, self.opts.tolerance.to_dict())

    def _start_sensitivity_early(self) -> None:
        """The sensitivity check's 1-ulp run needs the model and inputs only: run it
        in a thread beside the dump (ORT lets go of the GIL), for a model whose
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
        key = self._sensitivity_key(baseline_key(self.info, self.inputs))
        cached = self.session.read_json("sensitivity.json")
        if cached and cached.get("key") == key:
            return
        from bisect_tui.core import background
        from bisect_tui.core.checks import perturbed_runs

        self._sensitivity_runs = (key, background.start(perturbed_runs, self.info.model, self.inputs,
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
        res = check_determinism(
            self.info, self.session, self.inputs, self.shapes, self.baseline.manifest,
            self.max_memory, self.cancel, self.progress, started=started,
        )
        self._drop_truth_source()
        if started is not None and started.truth_pending:
            self._truth_source = started
        self.determinism = res
        self.session.mark_step("determinism", "passed" if res["deterministic"] else "failed")
        return res

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
        from bisect_tui.core.reference import float64_outputs

        return float64_outputs(self.info.model, self.inputs, outputs)

    # step 4 -----------------------------------------------------------------
    def run_range_check(self) -> dict:
        if self.baseline is None:
            self.run_baseline()
        assert self.info and self.session and self.baseline
        self.progress(Progress("range_check", "checking value ranges"))
        res = check_ranges(self.info, self.baseline.manifest, self.opts.ranges, session=self.session)
        self.range_check = res
        self.session.mark_step("range_check", "passed" if res["ok"] else "failed")
        return res

    # step 5 -----------------------------------------------------------------
    def engine_dir(self, config: EngineConfig) -> Path:
        assert self.session
        return self.session.path(f"engines/{self.opts.engine}-{config.key()}")

    def run_fused(self, config: Optional[EngineConfig] = None) -> dict:
        """Build the fused engine, run it on the same inputs, compare final outputs."""
        if self.baseline is None:
            self.run_baseline()
        assert self.info and self.session and self.inputs and self.baseline
        config = config or self.opts.config
        key = self._fused_key(self.baseline.manifest["key"], config)
        cached = self.session.read_json("check.json")
        if cached and cached.get("key") == key:
            self._drop_fused_build()
            self.fused = cached
            self.session.mark_step("fused", "passed" if cached["passed"] else "failed")
            return cached
        self.session.mark_step("fused", "running")
        t0 = time.perf_counter()
        self.progress(Progress("fused", f"building {self.opts.engine} engine ({config.level}, {config.precision})"))
        self.cancel.check()
        workdir = self.engine_dir(config)
        workdir.mkdir(parents=True, exist_ok=True)
        try:
            built = self._take_fused_build(config, workdir) or self.engine.build(
                self.session.model_path, config, (), workdir)
        except EngineBuildError as exc:
            # The baseline ran, the engine under test did not: that is the
            # failure the user came with, a finding for the bisection.
            return self._fused_failed(key, config, exc, t0)
        try:
            build_s = time.perf_counter() - t0
            per_sample = []
            for k in range(self.inputs.samples):
                self.cancel.check()
                self.progress(Progress("fused", f"running sample {k + 1}/{self.inputs.samples}", k, self.inputs.samples))
                per_sample.append(built.run(self.inputs.feeds(k)))
            self._save_fused_outputs(workdir, key, per_sample)
            fused_objs = list(built.fused_nodes)
            fused_nodes = [n.to_dict() for n in fused_objs]
            precision_used = self._precision_used(built, config)
            atomic.write_json(workdir / "fused_nodes.json", fused_nodes)
            optimized = str(built.optimized_model_path) if built.optimized_model_path else None
            # the search maps this same engine first: it takes these objects, not the file
            self.fused_map_objs = (optimized, config, fused_objs)
        except EngineBuildError as exc:
            return self._fused_failed(key, config, exc, t0)
        finally:
            built.close()
        from bisect_tui.core.bisect.judge import OutputJudge

        judged = OutputJudge.for_triage(self).judge(per_sample)
        outputs: dict[str, Any] = {
            name: {k: o[k] for k in ("metrics", "tolerance", "passed", "verdict", "summary")}
            for name, o in judged.outputs.items()
        }
        passed = judged.passed
        fused_only = [n for n in fused_nodes if n["is_fused"]]
        shared = None
        if self.opts.compare_tensors and optimized:
            # Tensors the fused graph still has are compared through its saved
            # graph run unfused (the same values, without undoing any fusion).
            from bisect_tui.core.bisect.probe import run_probe

            probe = run_probe(self, optimized, [])
            shared = {k: probe[k] for k in ("tensors_compared", "first_failing_tensor", "worst_tensors", "profile")}
            shared["failing"] = probe["failing_count"]
        from bisect_tui.core.checks import check_sensitivity

        self.progress(Progress("fused", "sensitivity: baseline with inputs moved by 1 ulp"))
        skey = self._sensitivity_key(self.baseline.manifest["key"])
        sensitivity = check_sensitivity(
            self.info, self.session, self.inputs, self.baseline.manifest, self.opts.tolerance, skey,
            runs=self._take_sensitivity_runs(skey))
        result = {
            "key": key,
            "checked_at": now_iso(),
            "engine": self.opts.engine,
            "sensitivity": sensitivity,
            **({"precision_used": precision_used} if precision_used else {}),
            # the engine's own words for its settings (the report's settings lines)
            "engine_settings": [list(row) for row in self.engine.describe(config)]
            if hasattr(self.engine, "describe") else [],
            "config": config.to_dict(),
            "passed": passed,
            "outputs": outputs,
            "failing_outputs": [n for n, o in outputs.items() if not o["passed"]],
            "fused_nodes": fused_only,
            "shared_tensors": shared,
            "optimized_nodes": len(fused_nodes),
            "original_nodes": self.info.node_count,
            "optimized_model": optimized,
            "build_seconds": build_s,
            "seconds": time.perf_counter() - t0,
        }
        self.session.write_json("check.json", result)
        self.fused = result
        self.session.mark_step("fused", "passed" if passed else "failed")
        return result

    def _precision_used(self, built, config: EngineConfig) -> Optional[dict]:
        """What the compiled engine really runs, read back from it, and what it
        would pick on its own; None when both are simply what was asked."""
        used = built.precision_used() if hasattr(built, "precision_used") else config.precision
        default = getattr(self.engine, "default_precision", lambda: None)()
        if used == config.precision and default in (None, config.precision):
            return None
        return {"asked": config.precision, "used": used, "engine_default": default}

    def _save_fused_outputs(self, workdir: Path, key: str, per_sample: list[dict]) -> None:
        """The fused engine's final outputs, for the float64 arbiter (keys by
        position: output names are model data, not file names)."""
        names = list(self.info.outputs)
        arrays = {f"out_{i}": np.stack([s[n] for s in per_sample]) for i, n in enumerate(names)}
        atomic.save_npz(workdir / "fused_outputs.npz", arrays)
        from bisect_tui.core.model import file_sha256

        atomic.write_json(workdir / "fused_outputs.json", {
            "key": key, "outputs": names, "sha256": file_sha256(workdir / "fused_outputs.npz")})

    def _load_fused_outputs(self) -> Optional[dict[str, np.ndarray]]:
        """Trusted only when the digest and the check's key still match."""
        from bisect_tui.core.model import file_sha256

        workdir = self.engine_dir(self.opts.config)
        meta = atomic.read_json(workdir / "fused_outputs.json") if (workdir / "fused_outputs.json").exists() else None
        npz = workdir / "fused_outputs.npz"
        if not meta or not self.fused or meta.get("key") != self.fused.get("key") or not npz.exists() \
                or file_sha256(npz) != meta.get("sha256"):
            return None
        with np.load(npz, allow_pickle=False) as z:
            return {n: z[f"out_{i}"] for i, n in enumerate(meta["outputs"])}

    # framework golden data (torch front end) ------------------------------------
    def run_framework(self) -> Optional[dict]:
        """PyTorch's own golden data, run twice, cross-checked against the ONNX baseline."""
        if not self.opts.torch:
            return None
        if self.baseline is None:
            self.run_baseline()
        from bisect_tui.frontends.torch.step import run_golden

        self.session.mark_step("framework", "running")
        self.framework = run_golden(self, self._torch)
        self.session.mark_step("framework", "passed" if self.framework["export_matches"] else "failed")
        return self.framework

    # float64 arbiter -------------------------------------------------------------
    def run_arbiter(self) -> dict:
        """Baseline and fused outputs against a float64 run of the whole model."""
        from bisect_tui.core.arbiter import arbitrate, unavailable

        if self.fused is None:
            self.run_fused()
        if not self.opts.arbiter:
            self.arbiter = {**unavailable("skipped (--no-arbiter)"), "skipped": True}
            return self.arbiter
        if self.fused.get("error"):
            self._drop_truth_source()
            self.arbiter = unavailable("the fused engine did not build or run: no output to judge")
            return self.arbiter
        key = stable_key("arbiter/v1", self.baseline.manifest["key"], self.fused["key"],
                         self._torch.loaded.state_sha256 if self._torch else None)
        cached = self.session.read_json("arbiter.json")
        if cached and cached.get("key") == key:
            self._drop_truth_source()
            self.arbiter = cached
            return cached
        self.progress(Progress("arbiter", "float64 run of the whole model"))
        t0 = time.perf_counter()
        fused = self._load_fused_outputs()
        if fused is None:
            self.session.path("check.json").unlink(missing_ok=True)  # recompute with outputs saved
            self.fused = None
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
        try:
            if self._torch is not None:
                from bisect_tui.frontends.torch.step import float64_truth

                truth, framework, source = float64_truth(self, self._torch)
            else:
                truth, source, note = self._float64_truth(outputs)
        except UserError as exc:
            self.arbiter = {"key": key, **unavailable(str(exc))}
            self.session.write_json("arbiter.json", self.arbiter)
            return self.arbiter
        passed = {n: o["passed"] for n, o in self.fused["outputs"].items()}
        arb = arbitrate(truth, baseline, fused, self.fused["config"]["precision"], source, passed,
                        framework, note)
        self.arbiter = {"key": key, **arb.to_dict(), "seconds": time.perf_counter() - t0}
        self.session.write_json("arbiter.json", self.arbiter)
        return self.arbiter

    def _fused_failed(self, key: str, config: EngineConfig, exc, t0: float) -> dict:
        """check.json for an engine that failed to build or run (kind and the
        engine's own message), judged failed like a broken tolerance."""
        assert self.session and self.info
        result = {
            "key": key,
            "checked_at": now_iso(),
            "engine": self.opts.engine,
            "sensitivity": None,
            "config": config.to_dict(),
            "passed": False,
            "error": {"kind": exc.kind, "message": exc.engine_message, "summary": str(exc)},
            "outputs": {},
            "failing_outputs": list(self.info.outputs),
            "fused_nodes": [],
            "shared_tensors": None,
            "optimized_nodes": 0,
            "original_nodes": self.info.node_count,
            "optimized_model": None,
            "build_seconds": time.perf_counter() - t0,
            "seconds": time.perf_counter() - t0,
        }
        self.session.write_json("check.json", result)
        self.fused = result
        self.session.mark_step("fused", "failed", error=exc.kind)
        return result

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
                self.fused = None
                self.session.mark_step("fused", "skipped", why="the baseline is not deterministic")
        return self.summary()

    def verdict_before_engine(self) -> Optional[str]:
        """A verdict that stops the checklist before any engine is judged."""
        if self.range_check and self.range_check["nan_inf"]:
            return "nan_inf"
        if self.determinism and self.determinism.get("deterministic") is False:
            return "nondeterministic"
        if self.framework and not self.framework["golden"]["deterministic"]:
            return "nondeterministic"
        if self.framework and not self.framework["export_matches"]:
            return "export_mismatch"
        return None

    def verdict(self) -> str:
        early = self.verdict_before_engine()
        if early:
            return early
        if self.fused is None:
            raise RuntimeError("fused step has not run")
        return "pass" if self.fused["passed"] else "fail"

    def summary(self) -> dict:
        """The JSON contract of `check` (documented in docs/check.md)."""
        assert self.info and self.session and self.inputs and self.baseline
        verdict = self.verdict()

        out = {
            "verdict": verdict,
            "exit_code": int(overall_exit(verdict)),
            "model": {"path": str(self.info.path), "sha256": self.info.sha256,
                      "nodes": self.info.node_count, "opset": self.info.opset},
            "session": str(self.session.root),
            "inputs": {**self.inputs.source, "arrays": self.inputs.describe()},
            "tolerance": self.opts.tolerance.to_dict(),
            "baseline": {"tensors": len(self.baseline.manifest["tensors"]),
                         "bytes": self.baseline.manifest["bytes"],
                         "reused": self.baseline.reused,
                         "recomputed": list(self.baseline.recomputed),
                         "groups": self.baseline.manifest["options"]["groups"],
                         "memory_warning": self.baseline.manifest["options"].get("memory_warning"),
                         "dir": str(self.session.baseline_dir)},
            "determinism": self.determinism,
            "range_check": self.range_check,
            "engine": self.fused["engine"] if self.fused else None,
            "engine_settings": (self.fused or {}).get("engine_settings") or [],
            "config": self.fused["config"] if self.fused else None,
            "outputs": self.fused["outputs"] if self.fused else {},
            "failing_outputs": self.fused["failing_outputs"] if self.fused else [],
            "fused_nodes": self.fused["fused_nodes"] if self.fused else [],
            "shared_tensors": self.fused.get("shared_tensors") if self.fused else None,
            "sensitivity": self.fused.get("sensitivity") if self.fused else None,
            "engine_error": self.fused.get("error") if self.fused else None,
            **({"precision_used": self.fused["precision_used"]} if (self.fused or {}).get("precision_used") else {}),
            "versions": {**versions(), **self.engine.versions()},
            # the settings as the user types them (the report shows these, not a dict)
            "command": {c: command_line(self.opts, c) for c in ("check", "bisect")},
            "framework": self.framework,
            "arbiter": self.arbiter,
        }
        if self._torch is not None:
            import torch

            out["versions"]["torch"] = torch.__version__
        return out
