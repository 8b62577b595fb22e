"""What "within tolerance" means, and the verdict on one compared tensor.

`criteria` holds the `Tolerance` (optional criteria, None = not checked),
`presets` the named starting points, `spec` a tolerance per output as the CLI
flags give it, `verdict` the `Verdict` naming every failing criterion with its
measured value and limit, `judge` the judgement itself. The names callers use
are importable from here.
"""

from __future__ import annotations

from bisect_tui.core.tolerance.criteria import CRITERIA, DEFAULT_TOPK, Tolerance
from bisect_tui.core.tolerance.judge import judge, judge_arrays, judge_many, worst_ratio
from bisect_tui.core.tolerance.presets import DEFAULT_PRESET, PRESETS, Preset, get_preset
from bisect_tui.core.tolerance.spec import ToleranceSpec, parse_tolerance
from bisect_tui.core.tolerance.verdict import Criterion, Verdict

__all__ = ["CRITERIA", "DEFAULT_PRESET", "DEFAULT_TOPK", "PRESETS", "Criterion", "Preset", "Tolerance",
           "ToleranceSpec", "Verdict", "get_preset", "judge", "judge_arrays", "judge_many", "parse_tolerance",
           "worst_ratio"]
