"""The TensorRT engine's options, validated before anything is built.

Why refusals instead of warnings: Polygraphy only *warns* when INT8 is asked
for a network without Q/DQ layers and without a calibrator, and TensorRT then
builds with missing dynamic ranges; a triage tool comparing that engine would
blame fusion for a calibration problem. So INT8 needs either explicit
quantization in the model (QuantizeLinear/DequantizeLinear) or a calibration
cache file, and is refused in one line otherwise.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

from bisect_tui.core.errors import UserError
from bisect_tui.engines.tensorrt.declare import TRT_PRECISIONS

_QDQ = frozenset({"QuantizeLinear", "DequantizeLinear"})


@dataclass(frozen=True)
class TrtOptions:
    precision: str = "fp32"
    tf32: bool = False  # off by default: FP32 means FP32 (TensorRT enables TF32 unless told)
    calibration_cache: Optional[str] = None  # path; INT8 without Q/DQ nodes needs it
    workspace_mb: int = 0  # 0 = TensorRT's default
    builder_optimization_level: Optional[int] = None

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "TrtOptions":
        return cls(
            precision=str(d.get("precision", "fp32")),
            tf32=bool(d.get("tf32", False)),
            calibration_cache=d.get("calibration_cache"),
            workspace_mb=int(d.get("workspace_mb", 0) or 0),
            builder_optimization_level=d.get("builder_optimization_level"),
        )

    def create_config_kwargs(self) -> dict:
        """Keyword arguments for Polygraphy's `CreateConfig` (precision part).

        `precision_constraints="obey"` so that FP32 pins hold (with "prefer"
        TensorRT may fall back silently and a proof would prove nothing)."""
        p = self.precision
        kw = {
            "tf32": self.tf32 or p == "tf32",
            "fp16": p == "fp16",
            "bf16": p == "bf16",
            "int8": p == "int8",
            "precision_constraints": "obey",
        }
        if self.builder_optimization_level is not None:
            kw["builder_optimization_level"] = int(self.builder_optimization_level)
        return kw


def trt_options(config) -> TrtOptions:
    """TrtOptions from an EngineConfig (precision + `options.*` values)."""
    get = getattr(config, "option", None)
    val = (lambda k: get(k, "") or "") if get else (lambda k: "")
    ws = val("workspace_mb")
    lvl = val("opt_level")
    try:
        ws_i = int(ws) if ws else 0
        lvl_i = int(lvl) if lvl else None
    except ValueError:
        raise UserError(f"TensorRT workspace and optimization level are whole numbers, got {ws or lvl!r}") from None
    return TrtOptions(
        precision=config.precision or "fp32",
        tf32=val("tf32") == "on",
        calibration_cache=val("calibration_cache") or None,
        workspace_mb=ws_i,
        builder_optimization_level=lvl_i,
    )


def model_has_qdq(model) -> bool:
    return any(n.op_type in _QDQ for n in model.graph.node)


def validate(opts: TrtOptions, model=None) -> TrtOptions:
    """Raise a one-line UserError for options TensorRT would misuse."""
    if opts.precision not in TRT_PRECISIONS:
        raise UserError(
            f"unknown TensorRT precision {opts.precision!r}; use one of {', '.join(TRT_PRECISIONS)}"
        )
    if opts.workspace_mb < 0:
        raise UserError(f"workspace must be positive, got {opts.workspace_mb} MB")
    lvl = opts.builder_optimization_level
    if lvl is not None and not (0 <= int(lvl) <= 5):
        raise UserError(f"TensorRT builder optimization level must be 0..5, got {lvl}")
    if opts.calibration_cache and opts.precision != "int8":
        raise UserError("a calibration cache is only used with --precision int8")
    if opts.precision == "int8":
        # without the model (the CLI's and the app's option check) only the cache
        # can be judged; the build, which has the model, refuses INT8 without Q/DQ
        if opts.calibration_cache:
            p = Path(opts.calibration_cache)
            if not p.is_file():
                raise UserError(f"INT8 calibration cache not found: {p}")
        elif model is not None and not model_has_qdq(model):
            raise UserError(
                "INT8 needs a calibration cache or a model with QuantizeLinear/DequantizeLinear nodes; "
                "without either TensorRT would build with missing dynamic ranges (give the cache file)"
            )
    return opts
