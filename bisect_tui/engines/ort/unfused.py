"""ONNX Runtime as the unfused reference: the FP32 baseline's sessions.

ORT_DISABLE_ALL on the CPU in FP32 runs every original node as the model
states it, which is what the fused engine is judged against. The same
session factory also serves the ORT engine's observer (its saved optimized
graph reloaded unfused). onnxruntime is imported inside functions: importing
this module stays as cheap as the engine's declarations.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from bisect_tui.core.engine_log import log_engine_error
from bisect_tui.core.errors import UserError

if TYPE_CHECKING:
    import onnx

PROTO_LIMIT = 1_800_000_000  # protobuf refuses to serialize 2 GiB; keep a margin
ORT_QUIET = 4  # FATAL only: ORT's own coloured ERROR lines would print before our one-line error
# ORT's pool threads spin after each parallel op by default: CPU taken from the
# builds and the Python this tool runs beside its sessions (a tenth to a fifth of
# the wall time of a bisection on two cores); values do not depend on it
NO_SPIN = ("session.intra_op.allow_spinning", "0")
# as the package's LABEL (not imported from it: the package imports the engine, which imports this)
LABEL = "ONNX Runtime"


def quiet_ort() -> None:
    """Keep ORT's default logger (used before a session has its own) off our output."""
    import onnxruntime as ort

    try:
        ort.set_default_logger_severity(ORT_QUIET)
    except Exception:  # very old releases: the per-session level below still applies
        pass


def make_session(model: "onnx.ModelProto", threads: int = 0):
    """An ORT_DISABLE_ALL CPU session of `model`; a model that does not load is
    one UserError (the whole message in the session's engine log)."""
    import onnx
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.enable_cpu_mem_arena = False  # let freed activations go back to the OS
    so.add_session_config_entry(NO_SPIN[0], NO_SPIN[1])
    if threads:
        so.intra_op_num_threads = threads
    quiet_ort()
    so.log_severity_level = ORT_QUIET
    try:
        base = external_folder(so, model)
        if base is not None or model.ByteSize() < PROTO_LIMIT:
            return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        # A protobuf message cannot exceed 2 GB: weights go to an external file.
        import tempfile

        with tempfile.TemporaryDirectory(prefix="bisect_tui_big_") as tmp:
            path = f"{tmp}/model.onnx"
            onnx.save_model(model, path, save_as_external_data=True, all_tensors_to_one_file=True,
                            location="model.onnx.data")
            return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    except Exception as exc:
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        where = log_engine_error(f"{LABEL} could not load the model", exc)
        raise UserError(f"{LABEL} could not load the model: {msg[:300]}{where}") from None


EXTERNAL_FOLDER = "session.model_external_initializers_file_folder_path"


def external_folder(so, model: "onnx.ModelProto"):
    """For a model whose weights stay in data files (core/external_data.py): the
    folder its locations resolve in, set on `so`, so the small proto goes to ORT
    as bytes and ORT reads the weights from their files (None: no external data)."""
    from bisect_tui.core.external_data import base_of

    base = base_of(model)
    if base is not None:
        so.add_session_config_entry(EXTERNAL_FOLDER, str(base))
    return base


class _Session:
    """An ORT session as the contract's `UnfusedSession` (its own `run`, no wrapper call)."""

    __slots__ = ("run", "_sess")

    def __init__(self, sess) -> None:
        self._sess = sess
        self.run = sess.run

    def output_names(self) -> list[str]:
        return [o.name for o in self._sess.get_outputs()]


class OrtUnfused:
    """`api.reference.UnfusedReference` on ONNX Runtime (ORT_DISABLE_ALL, CPU, FP32)."""

    name = "onnxruntime unfused (ORT_DISABLE_ALL, FP32)"
    label = LABEL
    library = "onnxruntime"
    mode = "ORT_DISABLE_ALL"
    spec = "bisect_tui.engines.ort.unfused:OrtUnfused"
    runs_in_parts = True  # ORT_DISABLE_ALL: each node its own kernel (core/parted_run.py)

    def session(self, model: "onnx.ModelProto") -> _Session:
        return _Session(make_session(model))

    def versions(self) -> dict[str, str]:
        import onnxruntime as ort

        return {"onnxruntime": ort.__version__}

    def cache_key(self) -> str:
        import onnxruntime as ort

        return ort.__version__

    def settings(self) -> dict[str, str]:
        return {"optimization": self.mode, "precision": "fp32", "provider": "CPUExecutionProvider"}

    def error_text(self, exc: BaseException) -> str:
        """ORT's message without its `[ONNXRuntimeError] : 1 : FAIL :` prefix and source paths."""
        import re

        text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        text = re.sub(r"^\[ONNXRuntimeError\]\s*:\s*\d+\s*:\s*\w+\s*:\s*", "", text)
        return text.split(" Status Message:")[0]

    def check_loadable(self, model, path: Path) -> None:
        """An opset-1..6 model ORT cannot load stops with the conversion command
        (opset-6 models whose operators all have kernels run as they are: most do)."""
        from bisect_tui.core.legacy_models import RUNTIME_MIN_OPSET, default_opset

        if not 0 < default_opset(model) < RUNTIME_MIN_OPSET:
            return
        try:
            make_session(model)
        except UserError as exc:
            refusal = old_opset_refusal(model, str(exc), path)
            if refusal is None:
                raise
            raise UserError(refusal) from None

    def warm_up(self) -> None:
        import onnxruntime  # noqa: F401  (the import is the point: its library loaded now)



_NO_KERNEL = re.compile(r"Could not find an implementation for (\S+?)\((\d+)\)")


def old_opset_refusal(model, error: str, path: Path) -> Optional[str]:
    """The one line for a model ORT cannot load because its opset is too old, or
    None when the load failed for another reason."""
    from bisect_tui.core.legacy_models import RUNTIME_MIN_OPSET, default_opset, upgrade_command, upgraded_name

    opset = default_opset(model)
    m = _NO_KERNEL.search(error)
    if m is None or not 0 < opset < RUNTIME_MIN_OPSET:
        return None
    return (f"{Path(path).name} imports opset {opset}: ONNX Runtime has no kernel for its "
            f"{m.group(1)}-{m.group(2)}: convert it to opset {RUNTIME_MIN_OPSET} with `{upgrade_command(path)}`, "
            f"then run bisect-tui on {shlex.quote(upgraded_name(path))}")
