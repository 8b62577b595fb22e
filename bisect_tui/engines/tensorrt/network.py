"""Edits of a parsed TensorRT network: marking tensors by exact name, reading
its layers for FP32 pins, applying the pins.

Duck-typed over TensorRT's INetworkDefinition, whose Python API Polygraphy's
own loaders use: iteration over layers, num_inputs/get_input,
layer.num_outputs/get_output, tensor.is_network_output, mark_output,
layer.precision, layer.set_output_type. Tested with stand-ins for those
objects (TensorRT's own cannot exist without a GPU)."""

from __future__ import annotations

from bisect_tui.engines.tensorrt.precision import NetworkLayer, PrecisionPlan


def _network_tensors(network) -> dict:
    tensors = {}
    for i in range(network.num_inputs):
        t = network.get_input(i)
        if t is not None:
            tensors[t.name] = t
    for layer in network:
        for k in range(layer.num_outputs):
            t = layer.get_output(k)
            if t is not None:
                tensors[t.name] = t
    return tensors


def mark_exact(network, marks) -> list:
    """Mark tensors as network outputs by exact name; returns the names the
    network lacks (left unmarked, the others are marked).

    Not Polygraphy's ModifyNetworkOutputs: it reads `* ? [ ]` in names as
    fnmatch patterns, and tensor names are data. A missing name is usually an
    ONNX Constant output the parser folded into weights: one such tensor must
    not cost every other mark."""
    tensors = _network_tensors(network)
    missing = [m for m in marks if m not in tensors]
    for m in marks:
        if m in tensors and not tensors[m].is_network_output:
            network.mark_output(tensors[m])
    return missing


def network_layers(network) -> list:
    layers = []
    for layer in network:
        outs = [layer.get_output(i) for i in range(layer.num_outputs)]
        outs = [t for t in outs if t is not None]
        layers.append(NetworkLayer(
            name=layer.name,
            outputs=tuple(t.name for t in outs),
            output_types=tuple(str(t.dtype).split(".")[-1].upper() for t in outs),
            metadata=str(getattr(layer, "metadata", "") or ""),
            layer_type=str(layer.type).split(".")[-1]))
    return layers


def apply_pins(network, plan: PrecisionPlan, float32) -> int:
    """FP32 compute on the plan's layers and FP32 output types on the outputs
    the plan names (never on Cast/Q/DQ/Fill outputs); returns how many layers."""
    n = 0
    for layer in network:
        if layer.name in plan.pins:
            layer.precision = float32
            for i in plan.output_types.get(layer.name, ()):
                layer.set_output_type(i, float32)
            n += 1
    return n
