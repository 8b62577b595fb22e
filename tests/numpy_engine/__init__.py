"""A fifth engine, written as a third party would: a small numpy interpreter of
ONNX that fuses MatMul+Add(+Relu) into one kernel. It imports nothing of
bisect_tui but the contract (`bisect_tui.api`) and is registered without
editing the program (`BISECT_TUI_ENGINES=numpy=numpy_engine`).

Its fused MatMul+Add+Relu kernel multiplies in float16 (a real precision bug
of the kind the search exists for); MatMul+Add alone is exact. Marking a
tensor inside a pattern keeps that pattern unfused, as the contract asks."""

from __future__ import annotations

from bisect_tui.api import Capabilities

LABEL = "numpy interpreter"
OPTIONS = ()
CAPABILITIES = Capabilities(marking=True, marking_blocks=True, pass_switches=False, keep_high_precision=False,
                            levels=("all",), precisions=("fp32",),
                            observation="none: the interpreter keeps no fused tensors")


def load():
    from numpy_engine.engine import NumpyEngine

    return NumpyEngine()
