"""What `--engine tensorrt` declares to the engine-neutral interface
(options, capabilities), readable without TensorRT installed.

TensorRT-only values live in `EngineConfig.options` (`options.<name>`); the
precision is the engine-neutral `--precision`."""

from __future__ import annotations

from bisect_tui.api import Capabilities, EngineOption

# here, not in options.py: every command reads the declarations (the CLI flags), while
# options.py (a dataclass, TrtOptions from a config) is needed only when TensorRT runs
TRT_PRECISIONS = ("fp32", "tf32", "fp16", "bf16", "int8")

OBSERVATION = ("debug tensors where the installed TensorRT has mark_unfused_tensors_as_debug_tensors "
               "(fusion kept, fused-away tensors absent); otherwise none")


def _options():
    return (
        EngineOption("tf32", "choice", "off", "allow TF32 in FP32 layers (TensorRT enables it unless told; off "
                     "here so FP32 means FP32)", "--trt-tf32", "options.tf32", choices=("off", "on"),
                     label="TF32"),
        EngineOption("calibration_cache", "text", "", "INT8 calibration cache file (needed for --precision int8 "
                     "when the model has no Q/DQ nodes)", "--trt-calibration-cache", "options.calibration_cache",
                     metavar="FILE", label="INT8 calibration cache"),
        EngineOption("workspace_mb", "text", "", "builder workspace limit in MB (default: TensorRT's)",
                     "--trt-workspace-mb", "options.workspace_mb", metavar="MB", label="workspace"),
        EngineOption("opt_level", "text", "", "builder optimization level 0..5 (default: TensorRT's)",
                     "--trt-opt-level", "options.opt_level", metavar="0..5", label="builder optimization level"),
        EngineOption("profile", "text", "", "optimization profile of dynamic inputs, NAME=MIN:OPT:MAX joined by ';' "
                     "(default: exactly the shapes the triage runs)", "--trt-profile", "options.profile",
                     metavar="NAME=MIN:OPT:MAX", label="optimization profile"),
    )


def _capabilities():
    return Capabilities(
        marking=True,
        # a Myelin region can write a marked tensor and stay one kernel: each
        # build reports such layers (fusions_across) and the search isolates them
        marking_blocks=False,
        pass_switches=False,  # TensorRT has no per-pass switch
        keep_high_precision=True,
        levels=("all",),
        precisions=TRT_PRECISIONS,
        observation=OBSERVATION,
    )


OPTIONS = _options()
CAPABILITIES = _capabilities()


def profile_ranges(config) -> dict:
    from bisect_tui.engines.tensorrt.profiles import parse_profile_range

    get = getattr(config, "option", None)
    text = (get("profile", "") or "") if get else ""
    return dict(parse_profile_range(p.strip()) for p in text.split(";") if p.strip())
