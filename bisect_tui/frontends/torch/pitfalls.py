"""The golden-data pitfalls the articles list, each detected where it can be.

Every detector returns a `Pitfall` with a state: `found` (with what was seen),
`clear` (checked, not present) or `not_checked` (and why not). Each carries
why it matters and what to do, so the report can print it as it stands.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional

import numpy as np

FOUND, CLEAR, NOT_CHECKED = "found", "clear", "not_checked"


@dataclass
class Pitfall:
    kind: str
    state: str
    title: str
    detail: str
    why: str
    what_to_do: str

    def to_dict(self) -> dict:
        return asdict(self)


def training_mode(training_at_load: list[dict], still_training: list[dict],
                  train_vs_eval: Optional[float]) -> Pitfall:
    why = ("dropout zeroes random values and batch norm normalizes with the batch's own statistics "
           "(and updates its running ones) in training mode: golden data taken that way is neither "
           "repeatable nor what the engine computes")
    if still_training:
        names = ", ".join(f"{m['module']} ({m['type']})" for m in still_training[:8])
        return Pitfall("training_mode", FOUND, "modules stay in training mode after eval()",
                       f"{len(still_training)} module(s) still report training=True after eval(): {names}",
                       why, "find the train() override or the code that sets .training back; golden data "
                       "from these modules is not the inference result")
    sensitive = [m for m in training_at_load if m["changes_output"]]
    if training_at_load:
        names = ", ".join(f"{m['module']} ({m['type']})" for m in sensitive[:8]) or "none that change the output"
        moved = (f"; run in training mode the output moves by max abs {train_vs_eval:.3g}"
                 if train_vs_eval is not None else "")
        return Pitfall("training_mode", FOUND if sensitive else CLEAR,
                       "the factory returned the module in training mode",
                       f"{len(training_at_load)} module(s) had training=True; switched to eval() for the "
                       f"golden data. Output-changing: {names}{moved}",
                       why, "call model.eval() in your own comparison scripts too; golden data here is "
                       "taken in eval mode")
    return Pitfall("training_mode", CLEAR, "eval mode", "every module was in eval mode", why,
                   "nothing to do")


def weights_changed(before: str, after_first: str, after_second: str, second_call: dict) -> Pitfall:
    why = ("golden data is only comparable when both sides use the same weights from one checkpoint; "
           "a module that writes its own parameters or buffers in forward gives each run other numbers")
    if before != after_first or after_first != after_second:
        return Pitfall("weights_changed", FOUND, "weights change while the model runs",
                       "the SHA-256 of the state_dict differs before and after a forward pass "
                       f"({before[:12]} -> {after_first[:12]} -> {after_second[:12]})",
                       why, "find the parameter or buffer updated in forward (an EMA, a cache, batch-norm "
                       "statistics in training mode) and stop it for inference")
    if second_call.get("checked") and not second_call.get("same_weights"):
        return Pitfall("weights_changed", FOUND, "the factory gives other weights on every call",
                       "two calls of the factory produced state_dicts with different SHA-256: the weights "
                       "are not loaded from one checkpoint (an unseeded random init?)",
                       why, "load the weights from one checkpoint file, or seed the initialisation "
                       "(torch.manual_seed) inside the factory")
    detail = f"state_dict SHA-256 {before[:12]} unchanged by two runs"
    if second_call.get("checked"):
        detail += " and equal on a second factory call"
    elif second_call.get("reason"):
        detail += f" (second factory call: {second_call['reason']})"
    return Pitfall("weights_changed", CLEAR, "weights fixed", detail, why, "nothing to do")


def inputs_fixed(source: str, second_call: dict) -> Pitfall:
    why = ("the baseline, the golden data and the fused engine must see the exact same input; an input "
           "drawn anew each time makes every comparison meaningless")
    if second_call.get("checked") and second_call.get("same_inputs") is False:
        return Pitfall("inputs_not_fixed", FOUND, "the factory's example inputs change on every call",
                       "two calls returned example inputs with different SHA-256 (torch.randn without a "
                       "seed or generator?); this session uses the first call's, saved in input.npz",
                       why, "seed the inputs (torch.Generator().manual_seed) or save them once and pass "
                       "--input FILE")
    return Pitfall("inputs_not_fixed", CLEAR, "inputs fixed",
                   f"the exact inputs are saved in the session ({source}) and every run reads them", why,
                   "nothing to do")


def nondeterminism(differing: list[dict], compared: int) -> Pitfall:
    why = ("two identical forward passes must give identical bits; otherwise no tolerance can tell an "
           "engine bug from run-to-run noise")
    if differing:
        first = differing[0]
        return Pitfall("nondeterministic", FOUND, "PyTorch's forward is not deterministic",
                       f"{len(differing)} of {compared} module output(s) differ between two runs on the same "
                       f"input; first: {first['name']} ({first['type']})",
                       why, "look for dropout called with training=True, random ops (rand, randn, "
                       "bernoulli) or non-deterministic kernels; try torch.use_deterministic_algorithms(True)")
    return Pitfall("nondeterministic", CLEAR, "deterministic",
                   f"all {compared} module outputs bit-identical over two runs", why, "nothing to do")


def dtype_alignment(changes: list[dict], mismatched: list[str]) -> Pitfall:
    why = ("an FP16 tensor compared directly with an FP32 one shows FP16's own rounding (about 1e-3) as "
           "if it were an error; golden data is FP32 and both sides are cast to float64 before comparing")
    if changes or mismatched:
        parts = [f"{c['what']} were {'/'.join(c['from'])}, converted to float32" for c in changes]
        if mismatched:
            parts.append(f"{len(mismatched)} module output(s) are not float32 inside the model "
                         f"(first {mismatched[0]}): saved as float32")
        return Pitfall("dtype", FOUND, "not FP32 on the framework side", "; ".join(parts), why,
                       "take golden data in FP32 (model.float()); judge an FP16 engine with an fp16 "
                       "tolerance (--preset fp16), never against raw FP16 golden data")
    return Pitfall("dtype", CLEAR, "FP32 throughout", "parameters, inputs and module outputs are float32",
                   why, "nothing to do")


def _softmax(a: np.ndarray, axis: int = -1) -> np.ndarray:
    a = np.asarray(a, dtype=np.float64)
    e = np.exp(a - a.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def softmax_side(torch_arr: np.ndarray, onnx_arr: np.ndarray, atol: float = 1e-4) -> Optional[str]:
    """'onnx' when only the ONNX side has a softmax on the last axis, 'torch'
    for the reverse, None when neither explains the difference."""
    t = np.asarray(torch_arr, dtype=np.float64)
    o = np.asarray(onnx_arr, dtype=np.float64).reshape(t.shape)
    if t.ndim == 0 or t.shape[-1] < 2:
        return None
    if np.allclose(_softmax(t), o, atol=atol, rtol=0):
        return "onnx"
    if np.allclose(t, _softmax(o), atol=atol, rtol=0):
        return "torch"
    return None


def batch_permutation(torch_arr: np.ndarray, onnx_arr: np.ndarray, atol: float = 1e-4) -> Optional[list[int]]:
    """When the two sides hold the same rows of axis 0 in another order, the
    order (row i of ONNX = row perm[i] of PyTorch); None otherwise."""
    t = np.asarray(torch_arr, dtype=np.float64)
    o = np.asarray(onnx_arr, dtype=np.float64).reshape(t.shape)
    if t.ndim < 1 or t.shape[0] < 2:
        return None
    tf, of = t.reshape(t.shape[0], -1), o.reshape(o.shape[0], -1)
    perm = []
    for row in of:
        d = np.abs(tf - row).max(axis=1)
        j = int(d.argmin())
        if d[j] > atol:
            return None
        perm.append(j)
    if sorted(perm) != list(range(len(perm))) or perm == list(range(len(perm))):
        return None
    return perm


def output_shape_pitfalls(failing: list, arrays: dict) -> tuple[Pitfall, Pitfall]:
    """Softmax on one side only, and batch order, on the failing cross-check outputs."""
    soft_why = ("a softmax (or any post-processing) applied on one side only turns logits into "
                "probabilities: the numbers differ everywhere although both are right")
    batch_why = ("with several samples in a batch, results compared row by row must be in the same order "
                 "as the inputs; shuffled rows look like a wrong result")
    soft, batch = None, None
    checked = 0
    for m in failing:
        if m.name not in arrays:
            continue
        g, o = arrays[m.name]
        checked += 1
        for k in range(g.shape[0]):  # per sample
            if soft is None:
                side = softmax_side(g[k], o[k])
                if side:
                    where = "the ONNX export applies a softmax PyTorch's forward does not" if side == "onnx" \
                        else "PyTorch applies a softmax the ONNX export does not"
                    soft = Pitfall("softmax_one_side", FOUND, "softmax on one side only",
                                   f"{m.module} ({m.type}) -> {m.onnx_tensor}: {where}", soft_why,
                                   "apply the same post-processing on both sides (look for code that runs "
                                   "only under torch.onnx.is_in_onnx_export() or only in a deployment "
                                   "wrapper), or compare before the softmax")
            if batch is None:
                perm = batch_permutation(g[k], o[k])
                if perm:
                    batch = Pitfall("batch_order", FOUND, "batch order differs",
                                    f"{m.module} -> {m.onnx_tensor}: the same rows in another order "
                                    f"(ONNX row i = PyTorch row {perm})", batch_why,
                                    "keep the batch order of the inputs on both sides (no shuffling "
                                    "loader, no sort in the export path) before comparing")
    if soft is None:
        soft = Pitfall("softmax_one_side", CLEAR if checked or not failing else NOT_CHECKED,
                       "no one-sided softmax",
                       f"checked on {checked} failing output(s)" if failing else
                       "every mapped output agrees, so no post-processing differs", soft_why, "nothing to do")
    if batch is None:
        batch = Pitfall("batch_order", CLEAR if checked or not failing else NOT_CHECKED, "batch order kept",
                        f"checked on {checked} failing output(s)" if failing else
                        "every mapped output agrees row for row", batch_why, "nothing to do")
    return soft, batch


def baked_values(tracer_warnings: list[str], exporter: str) -> Pitfall:
    why = ("the TorchScript tracer records Python numbers computed from tensors (float(x), .item(), "
           "x.shape in Python arithmetic) as constants: the export is right for the example input only")
    if tracer_warnings:
        return Pitfall("export_baked_values", FOUND, "the trace baked Python values into the export",
                       f"{len(tracer_warnings)} tracer warning(s), first: {tracer_warnings[0]}", why,
                       "use the dynamo exporter (--exporter dynamo), or keep the value a tensor in forward; "
                       "the cross-check on another input shows whether it matters")
    return Pitfall("export_baked_values", CLEAR, "no baked values",
                   f"no tracer warnings ({exporter} exporter)", why, "nothing to do")
