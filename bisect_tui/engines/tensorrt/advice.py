"""The TensorRT settings a finding tells the user to apply.

A keep-set proof built with `layer.precision = FLOAT` *and* FP32 output types
(see precision.py). Polygraphy's `--layer-precisions` sets only the first, and
its `--tensor-datatypes` only touches network inputs and outputs, so the
command that reproduces the proof runs a network postprocess script
(`--trt-npps keep_fp32.py`, a constant script written with the repro bundle,
reading the layer names from `repro_tensorrt.json`). Which advice applies
depends on the TensorRT that ran: 10 pins layers, 11 (always strongly typed)
needs the nodes in FP32 in the ONNX model; unknown gives both."""

from __future__ import annotations

from typing import Optional

NPPS = "keep_fp32.py"
_CONVERT = ("polygraphy convert model.onnx --fp16 --precision-constraints obey --trt-npps "
            f"{NPPS} -o model.engine")
_TYPED = ("keep the nodes in FP32 in the ONNX model (convert_float_to_float16(node_block_list=...)) "
          "before TensorRT parses it (TensorRT 11 takes precisions from the model's types)")
_FIND = (f"{_CONVERT} ({NPPS}, written with the repro bundle, pins the network layers TensorRT's parser "
         "made from the kept nodes, found by their [ONNX Layer: ...] metadata, to FP32 precision and FP32 "
         "output types)")


def keep_fp32_text(layers, strongly_typed: Optional[bool]) -> str:
    """Advice for a proven keep-set; `layers` the network layers the proof
    pinned (may be empty), `strongly_typed` None when TensorRT is unknown."""
    if layers and strongly_typed is not True:
        return (f"{_CONVERT} ({NPPS}, written with the repro bundle, sets FP32 precision and FP32 output types "
                f"on {', '.join(layers)}, as the proof did; --layer-precisions alone sets only the precision)")
    if strongly_typed is True:
        return _TYPED
    if strongly_typed is False:
        return _FIND
    return f"TensorRT 10: {_FIND}; TensorRT 11: {_TYPED}"


def workaround_text(workaround, pins_for, strongly_typed: Optional[bool]) -> str:
    kind = workaround.get("kind")
    if kind == "keep_fp32":
        layers = workaround.get("layer_precisions") or {}
        keep = tuple(sorted(workaround.get("keep_fp32") or ()))
        if not layers and keep:  # the pins a build with this keep-set made (this process or the cache)
            layers = pins_for(keep)
        return keep_fp32_text(list(layers), strongly_typed)
    if kind == "precision":
        return (f"build with --precision {workaround.get('precision', 'fp32')} "
                "(Polygraphy CreateConfig without the reduced-precision flag)")
    if kind == "mark_outputs":
        return ("mark " + ", ".join(workaround.get("marked_tensors") or []) + " as network outputs "
                "(Polygraphy ModifyNetworkOutputs / --trt-outputs): TensorRT stops fusing there")
    return "no TensorRT setting was proven to fix it"
