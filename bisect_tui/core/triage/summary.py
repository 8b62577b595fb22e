"""The checklist's verdict and its summary, the JSON contract of `check`.

A bad baseline (NaN/Inf, nondeterministic, an export that is not the PyTorch
model) stops the checklist before any engine is judged; otherwise the engine's
comparison decides. The summary is a `Summary` record; its JSON is what
`check --json`, report.json and the report read (docs/check.md).
"""

from __future__ import annotations

from typing import Optional

from bisect_tui.core.baseline import versions
from bisect_tui.core.commandline import command_line
from bisect_tui.core.errors import ExitCode
from bisect_tui.core.triage.records import Summary


def overall_exit(verdict: str) -> ExitCode:
    return {
        "pass": ExitCode.OK,
        "fail": ExitCode.TOLERANCE,
        "nondeterministic": ExitCode.NONDETERMINISTIC,
        "nan_inf": ExitCode.NAN_INF,
        # the ONNX export is not the PyTorch model: a tolerance broken before any engine runs
        "export_mismatch": ExitCode.TOLERANCE,
    }[verdict]


class Verdicts:
    """The verdicts of a `Triage` (a mixin: it reads the steps' results)."""

    def verdict_before_engine(self) -> Optional[str]:
        """A verdict that stops the checklist before any engine is judged."""
        if self.range_result and self.range_result.nan_inf:
            return "nan_inf"
        if self.determinism_result and self.determinism_result.deterministic is False:
            return "nondeterministic"
        if self.framework_result and not self.framework_result.golden["deterministic"]:
            return "nondeterministic"
        if self.framework_result and not self.framework_result.export_matches:
            return "export_mismatch"
        return None

    def verdict(self) -> str:
        early = self.verdict_before_engine()
        if early:
            return early
        if self.check is None:
            raise RuntimeError("fused step has not run")
        return "pass" if self.check.passed else "fail"

    def summary_record(self) -> Summary:
        assert self.info and self.session and self.inputs and self.baseline
        verdict = self.verdict()
        manifest = self.baseline.manifest
        engine_versions = {**versions(self.reference), **self.engine.versions(), **self._frontend_versions()}
        return Summary(
            verdict=verdict,
            exit_code=int(overall_exit(verdict)),
            model={"path": str(self.info.path), "sha256": self.info.sha256,
                   "nodes": self.info.node_count, "opset": self.info.opset},
            session=str(self.session.root),
            inputs={**self.inputs.source, "arrays": self.inputs.describe()},
            tolerance=self.opts.tolerance.to_dict(),
            baseline={"tensors": len(manifest["tensors"]), "bytes": manifest["bytes"],
                      "reused": self.baseline.reused, "recomputed": list(self.baseline.recomputed),
                      "groups": manifest["options"]["groups"],
                      "memory_warning": manifest["options"].get("memory_warning"),
                      # how the reference ran, for the report's baseline line (read from
                      # the 5,000-entry manifest at render time, it cost 0.2 s a report)
                      "options": {k: manifest["options"].get(k) for k in ("optimization", "precision")},
                      "dir": str(self.session.baseline_dir)},
            determinism=self.determinism_result,
            range_check=self.range_result,
            check=self.check,
            versions=engine_versions,
            # the settings as the user types them (the report shows these, not a dict)
            command={c: command_line(self.opts, c, options=self.engine.options) for c in ("check", "bisect")},
            framework=self.framework_result,
            arbiter=self.arbiter_result,
        )

    def summary(self) -> dict:
        """The JSON contract of `check` (documented in docs/check.md)."""
        return self.summary_record().to_json()
