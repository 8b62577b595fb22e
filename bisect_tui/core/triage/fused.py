"""The engine under test: built (or taken from the early build), run on the
check's inputs, each final output judged, the fused graph's own tensors
compared; an engine that fails to build or run is a finding, judged failed.

Its result is a `CheckResult`, saved as check.json and reused while its key
(the baseline and every setting the comparison reads) holds.
"""

from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import Optional

import numpy as np

from bisect_tui.core import atomic
from bisect_tui.core.cancel import Progress
from bisect_tui.core.errors import EngineBuildError
from bisect_tui.core.session import now_iso
from bisect_tui.core.triage.options import EngineConfig
from bisect_tui.core.triage.records import CheckResult, OutputVerdict


class FusedStep:
    """Step 5 of a `Triage` (a mixin: it reads the triage's model, session,
    inputs, baseline, options and engine)."""

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
            self.check = CheckResult.from_json(cached)
            self.session.mark_step("fused", "passed" if self.check.passed else "failed")
            return self.fused
        self.session.mark_step("fused", "running")
        t0 = time.perf_counter()
        self.progress(Progress("fused", f"building {self.opts.engine} engine ({config.level}, {config.precision})"))
        self.cancel.check()
        workdir = self.engine_dir(config)
        workdir.mkdir(parents=True, exist_ok=True)
        try:
            built = self._take_fused_build(config, workdir) or self.engine.build(
                self.session.model_path, config, (), workdir, context=self.build_context())
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
            precision_used = self._precision_used(built, config)
            optimized = str(built.optimized_model_path) if built.optimized_model_path else None
        except BaseException as exc:
            built.close()
            if isinstance(exc, EngineBuildError):
                return self._fused_failed(key, config, exc, t0)
            raise
        from bisect_tui.core import background

        # the map is read beside the comparison and the probe (whose runtime session
        # lets go of the GIL while it is made): at 21,000 nodes it was 0.44 s of this
        # thread's time before them; the engine is closed once its map is read
        mapped = background.start(lambda: list(built.fused_nodes), name="fused-map")
        try:
            return self._judged_fused(key, config, t0, build_s, per_sample, precision_used, optimized, mapped,
                                      workdir)
        finally:
            # with a search next, its first wait on a build closes the engine (background.close_later)
            close = functools.partial(background.close_later, built.close) if self.search_ahead else built.close
            mapped.add_done_callback(lambda _f: close())

    def _judged_fused(self, key: str, config: EngineConfig, t0: float, build_s: float, per_sample: list,
                      precision_used, optimized: Optional[str], mapped, workdir: Path) -> dict:
        """The comparison of a built engine's outputs, its probe and the map `mapped`
        (a Future) read meanwhile."""
        from bisect_tui.core.bisect.judge import OutputJudge

        judged = OutputJudge.for_triage(self).judge(per_sample)
        outputs = {name: OutputVerdict.from_json(o) for name, o in judged.outputs.items()}
        shared = None
        if self.opts.compare_tensors and optimized:
            # Tensors the fused graph still has are compared through its saved
            # graph run unfused (the same values, without undoing any fusion).
            from bisect_tui.core.bisect.probe import run_probe

            probe = run_probe(self, optimized, [], expected=per_sample)  # the engine's outputs: a control
            shared = {k: probe[k] for k in ("tensors_compared", "first_failing_tensor", "worst_tensors", "profile",
                                            "observer")}
            shared["failing"] = probe["failing_count"]
        from bisect_tui.core.checks import check_sensitivity

        self.progress(Progress("fused", "sensitivity: baseline with inputs moved by 1 ulp"))
        skey = self._sensitivity_key(self.baseline.manifest["key"])
        sensitivity = check_sensitivity(
            self.info, self.session, self.inputs, self.baseline.manifest, self.opts.tolerance, skey,
            runs=self._take_sensitivity_runs(skey), reference=self.reference)
        try:
            fused_objs = mapped.result()
        except EngineBuildError as exc:
            return self._fused_failed(key, config, exc, t0)
        # the search maps this same engine first: it takes these objects, not the file
        self.fused_map_objs = (optimized, config, fused_objs)
        if self.after_probe is not None and not judged.passed:
            # a search follows: its first whole-graph build may start from the probe's
            # suspect now, before this check's files are written (0.2 s at 21,000 nodes)
            self.after_probe({"passed": False, "optimized_model": optimized, "sensitivity": sensitivity})
        fused_nodes = [n.to_dict() for n in fused_objs]
        atomic.write_json(workdir / "fused_nodes.json", fused_nodes)
        return self._keep(CheckResult(
            key=key, checked_at=now_iso(), engine=self.opts.engine, sensitivity=sensitivity,
            precision_used=precision_used,
            # the engine's own words for its settings (the report's settings lines)
            engine_settings=tuple(tuple(row) for row in self.engine.describe(config)),
            config=config.to_dict(), passed=judged.passed, outputs=outputs,
            failing_outputs=tuple(n for n, o in outputs.items() if not o.passed),
            fused_nodes=tuple(n for n in fused_nodes if n["is_fused"]), shared_tensors=shared,
            optimized_nodes=len(fused_nodes), original_nodes=self.info.node_count, optimized_model=optimized,
            build_seconds=build_s, seconds=time.perf_counter() - t0,
        ))

    def _keep(self, result: CheckResult, error: Optional[str] = None) -> dict:
        """Save the comparison as check.json and hold it; its JSON is what callers get."""
        self.check = result
        self.session.write_json("check.json", self.fused)
        if error:
            self.session.mark_step("fused", "failed", error=error)
        else:
            self.session.mark_step("fused", "passed" if result.passed else "failed")
        return self.fused

    def _precision_used(self, built, config: EngineConfig) -> Optional[dict]:
        """What the compiled engine really runs, read back from it, and what it
        would pick on its own; None when both are simply what was asked."""
        used = built.precision_used()
        default = self.engine.default_precision()
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
        if not meta or self.check is None or meta.get("key") != self.check.key or not npz.exists() \
                or file_sha256(npz) != meta.get("sha256"):
            return None
        with np.load(npz, allow_pickle=False) as z:
            return {n: z[f"out_{i}"] for i, n in enumerate(meta["outputs"])}

    def _fused_failed(self, key: str, config: EngineConfig, exc, t0: float) -> dict:
        """check.json for an engine that failed to build or run (kind and the
        engine's own message), judged failed like a broken tolerance."""
        assert self.session and self.info
        error = {"kind": exc.kind, "message": exc.engine_message, "summary": str(exc)}
        detail = getattr(exc, "detail", "") or exc.engine_message
        # the engine's whole text, in check.json and in a file of its own (the terminal shows its first line)
        error["detail"] = detail
        path = self.engine_dir(config) / "engine_error.txt"
        atomic.write_text(path, detail.rstrip("\n") + "\n")
        error["detail_file"] = path.relative_to(self.session.root).as_posix()
        return self._keep(CheckResult(
            key=key, checked_at=now_iso(), engine=self.opts.engine, sensitivity=None, config=config.to_dict(),
            passed=False, error=error,
            outputs={}, failing_outputs=tuple(self.info.outputs), fused_nodes=(), shared_tensors=None,
            optimized_nodes=0, original_nodes=self.info.node_count, optimized_model=None,
            build_seconds=time.perf_counter() - t0, seconds=time.perf_counter() - t0,
        ), error=exc.kind)
