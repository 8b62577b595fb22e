"""The PyTorch front end inside a triage: the model is exported into the session
first, so the checklist then runs on that ONNX file like on any other; the
framework step adds PyTorch's own golden data and the export's cross-check.

Nothing here loads torch unless the options name a PyTorch factory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from bisect_tui.core.cancel import Progress


class TorchFrontEnd:
    """The torch steps of a `Triage` (a mixin: `self._torch` holds the
    frontends.torch.step.TorchPrepared once exported)."""

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

    def run_framework(self) -> Optional[dict]:
        """PyTorch's own golden data, run twice, cross-checked against the ONNX baseline."""
        if not self.opts.torch:
            return None
        if self.baseline is None:
            self.run_baseline()
        from bisect_tui.frontends.torch.step import run_golden

        self.session.mark_step("framework", "running")
        self.framework = run_golden(self, self._torch)
        self.session.mark_step("framework", "passed" if self.framework_result.export_matches else "failed")
        return self.framework

    def _frontend_versions(self) -> dict[str, str]:
        if self._torch is None:
            return {}
        import torch

        return {"torch": torch.__version__}
