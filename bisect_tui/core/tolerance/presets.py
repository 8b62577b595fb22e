"""Named tolerances: documented starting points a user picks by name.

Each says why its limits are what they are, so `--preset` is a choice a
user can read, not a magic number.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bisect_tui.core.errors import UserError
from bisect_tui.core.tolerance.criteria import Tolerance

DEFAULT_PRESET = "fp32"


@dataclass(frozen=True)
class Preset:
    tolerance: Tolerance
    description: str


def _p(name: str, description: str, **criteria: Any) -> tuple[str, Preset]:
    return name, Preset(Tolerance(name=name, **criteria), description)


PRESETS: dict[str, Preset] = dict(
    [
        _p("fp32", "FP32 fused vs unfused kernels differ by ~1e-7..1e-6 (summation order); "
           "1e-4 ignores reordering and catches real bugs",
           atol=1e-4, rtol=1e-4, min_cosine=0.99999),
        _p("fp16", "FP16 has ~3 decimal digits (eps 9.8e-4); 1e-2 allows accumulated rounding",
           atol=1e-2, rtol=1e-2, min_cosine=0.999),
        _p("bf16", "BF16 has ~2 decimal digits (eps 7.8e-3); 5e-2 allows accumulated rounding",
           atol=5e-2, rtol=5e-2, min_cosine=0.99),
        _p("int8", "quantized: elementwise error is expected, judge the signal (cosine, SQNR)",
           min_cosine=0.99, min_snr_db=20.0),
        _p("article", "rule of thumb from the seed articles: MAE < 1e-3, relative error < 1%, "
           "cosine > 0.99",
           mean_abs=1e-3, mean_rel=1e-2, min_cosine=0.99),
        _p("msprobe", "Ascend msprobe's per-op rule: cosine >= 0.99 and max abs error <= 1",
           min_cosine=0.99, max_abs=1.0),
        _p("torch-fp32", "torch.testing.assert_close defaults for float32",
           atol=1e-5, rtol=1.3e-6),
        _p("torch-fp16", "torch.testing.assert_close defaults for float16",
           atol=1e-5, rtol=1e-3),
        _p("torch-bf16", "torch.testing.assert_close defaults for bfloat16",
           atol=1e-5, rtol=1.6e-2),
    ]
)


def get_preset(name: str) -> Tolerance:
    """The preset's Tolerance; UserError listing the valid names otherwise."""
    key = name.strip().lower().replace("_", "-")
    if key not in PRESETS:
        raise UserError(f"unknown tolerance preset {name!r}; valid presets: {', '.join(PRESETS)}")
    return PRESETS[key].tolerance
