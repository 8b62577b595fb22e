"""The keyword arguments of Polygraphy's `CreateConfig` for one build.

Kept apart from the build so they are checked without TensorRT (Polygraphy
builds the config lazily): `trt` is the imported module, only its enum
attributes are read here.

* `profiles=None`, never `[]`, for a static model: Polygraphy's CreateConfig
  takes `util.default(profiles, [Profile()])`, and with a calibrator (INT8
  from a calibration cache) reads `profiles[-1]`; an empty list would raise
  IndexError there. None gives its one default profile (static shapes).
* `load_timing_cache`: the session's timing cache for this TensorRT and GPU;
  `EngineBytesFromNetwork(save_timing_cache=)` merges new timings back.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

from bisect_tui.engines.tensorrt.features import TrtFeatures
from bisect_tui.engines.tensorrt.options import TrtOptions
from bisect_tui.engines.tensorrt.profiles import ProfileSpec, to_polygraphy


def create_config_kwargs(opts: TrtOptions, feats: TrtFeatures, specs: Sequence[ProfileSpec], trt,
                         progress_monitor=None, timing_cache: Optional[Path] = None,
                         calibrator=None) -> dict:
    kwargs = opts.create_config_kwargs()
    if not feats.obey_precision_constraints:
        kwargs.pop("precision_constraints")
    if feats.always_strongly_typed:  # precision comes from the model's types
        for k in ("fp16", "bf16", "int8"):
            kwargs[k] = False
    kwargs["profiles"] = to_polygraphy(specs) or None
    kwargs["profiling_verbosity"] = trt.ProfilingVerbosity.DETAILED
    if opts.workspace_mb:
        kwargs["memory_pool_limits"] = {trt.MemoryPoolType.WORKSPACE: opts.workspace_mb << 20}
    if progress_monitor is not None:
        kwargs["progress_monitor"] = progress_monitor
    if timing_cache is not None:
        kwargs["load_timing_cache"] = str(timing_cache)
    if calibrator is not None and kwargs["int8"]:
        kwargs["calibrator"] = calibrator
    return kwargs
