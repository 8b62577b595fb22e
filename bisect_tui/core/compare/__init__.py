"""Golden data against outputs dumped by any engine (TRT-LLM, vendors' SDKs, ORT...).

The second seed article's pipeline: golden FP32 answers, an engine's outputs
saved with np.save, dtypes aligned, the landed metrics and tolerance presets,
pitfall detectors, overlaid histograms, and an exit code for CI.
"""

from bisect_tui.core.compare.matching import Hints
from bisect_tui.core.compare.records import CompareResult, Conversion, Finding, TensorResult
from bisect_tui.core.compare.run import CompareOptions, compare_dumps

__all__ = ["CompareOptions", "CompareResult", "Conversion", "Finding", "Hints", "TensorResult", "compare_dumps"]
