"""Importing the user's factory and getting a module fit for golden data.

The factory is the user's own code, run because they asked (`--torch`); its
return value is checked like any other input: a module (or module plus
example inputs), tensors only. What it hands back is made fit for golden data
here (eval mode, FP32) and every change is recorded, because each one is a
pitfall the articles warn about and the report must say it happened.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import torch
from torch import nn

from bisect_tui.core.errors import UserError
from bisect_tui.frontends.torch import TorchSpec

# Modules whose forward behaves differently in training mode.
TRAINING_SENSITIVE = (nn.modules.dropout._DropoutNd, nn.modules.batchnorm._BatchNorm,
                      nn.modules.instancenorm._InstanceNorm)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0][:200]}" if text else type(exc).__name__


def _exited(spec: TorchSpec, exc: SystemExit, doing: str) -> UserError:
    """The user's code called sys.exit (or exit()): that ends their script, not
    our triage. Passed on, exit(0) read as "within tolerance" with no output."""
    return UserError(f"--torch {spec.text}: {doing} called sys.exit({exc.code!r}); a factory must return "
                     "the model, not exit")


def import_factory(spec: TorchSpec) -> Callable[[], Any]:
    """The factory callable. Dotted paths resolve from the working directory
    first (as `python -m` does), a `.py` path is loaded from that file."""
    try:
        if spec.module.endswith(".py"):
            path = Path(spec.module).resolve()
            if not path.is_file():
                raise UserError(f"--torch {spec.text}: file not found: {path}")
            mod_name = "bisect_tui_user_" + hashlib.sha256(str(path).encode()).hexdigest()[:12]
            loader_spec = importlib.util.spec_from_file_location(mod_name, path)
            if loader_spec is None or loader_spec.loader is None:
                raise UserError(f"--torch {spec.text}: cannot load {path} as Python")
            module = importlib.util.module_from_spec(loader_spec)
            sys.modules[mod_name] = module
            loader_spec.loader.exec_module(module)
        else:
            cwd = os.getcwd()
            if cwd not in sys.path:
                sys.path.insert(0, cwd)
            module = importlib.import_module(spec.module)
    except UserError:
        raise
    except SystemExit as exc:
        raise _exited(spec, exc, f"importing {spec.module}") from None
    except Exception as exc:  # the user's module failed to import: their error, one line
        raise UserError(f"--torch {spec.text}: importing {spec.module} failed: {_first_line(exc)}") from None
    fn = getattr(module, spec.factory, None)
    if fn is None or not callable(fn):
        raise UserError(f"--torch {spec.text}: {spec.module} has no callable {spec.factory!r}")
    return fn


def state_digest(module: nn.Module) -> str:
    """SHA-256 over every parameter and buffer (name, dtype, shape, bytes):
    the same checkpoint gives the same digest, any changed weight another."""
    h = hashlib.sha256()
    for name, t in sorted(module.state_dict(keep_vars=False).items()):
        t = t.detach().cpu().contiguous()
        h.update(name.encode())
        h.update(str(t.dtype).encode())
        h.update(str(tuple(t.shape)).encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def tensors_digest(tensors: tuple) -> str:
    h = hashlib.sha256()
    for t in tensors:
        t = t.detach().cpu().contiguous()
        h.update(str(t.dtype).encode())
        h.update(str(tuple(t.shape)).encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def state_bytes(module: nn.Module) -> int:
    return int(sum(t.numel() * t.element_size() for t in module.state_dict().values()))


@dataclass
class Loaded:
    """The factory's module made ready for golden data, with what was changed."""

    module: nn.Module
    example_inputs: Optional[tuple]  # tensors, FP32 where floating
    input_names: list[str]
    state_sha256: str
    state_bytes: int
    training_at_load: list[dict] = field(default_factory=list)  # modules in training mode as returned
    still_training: list[dict] = field(default_factory=list)  # modules eval() could not switch off
    dtype_changes: list[dict] = field(default_factory=list)  # parameters/inputs converted to FP32
    examples_sha256: Optional[str] = None


def _forward_names(module: nn.Module, count: Optional[int]) -> list[str]:
    try:
        params = list(inspect.signature(module.forward).parameters.values())
    except (TypeError, ValueError):
        params = []
    named = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
                and p.default is p.empty]
    if count is None:
        return required or ["input_0"]
    names = named[:count]
    names += [f"input_{i}" for i in range(len(names), count)]
    return names


def _training_modules(module: nn.Module) -> list[dict]:
    return [{"module": name or "(root)", "type": type(m).__name__,
             "changes_output": isinstance(m, TRAINING_SENSITIVE)}
            for name, m in module.named_modules() if m.training]


def unpack(result: Any, spec: TorchSpec) -> tuple[nn.Module, Optional[tuple]]:
    if isinstance(result, nn.Module):
        return result, None
    if isinstance(result, (tuple, list)) and len(result) == 2 and isinstance(result[0], nn.Module):
        ex = result[1]
        if isinstance(ex, torch.Tensor):
            ex = (ex,)
        if not isinstance(ex, (tuple, list)) or not all(isinstance(t, torch.Tensor) for t in ex):
            raise UserError(f"--torch {spec.text}: the example inputs must be a tensor or a tuple of tensors "
                            f"(got {type(ex).__name__})")
        return result[0], tuple(ex)
    raise UserError(f"--torch {spec.text}: the factory must return an nn.Module or (module, example_inputs), "
                    f"got {type(result).__name__}")


def load(spec: TorchSpec) -> Loaded:
    """Call the factory once; eval mode, FP32, CPU; record every change made."""
    fn = import_factory(spec)
    try:
        result = fn()
    except SystemExit as exc:
        raise _exited(spec, exc, "the factory") from None
    except Exception as exc:
        raise UserError(f"--torch {spec.text}: the factory raised {_first_line(exc)}") from None
    module, examples = unpack(result, spec)
    training = _training_modules(module)
    module.eval()
    still = _training_modules(module)  # a train() override or a child that re-enables itself
    module.to("cpu")
    changes: list[dict] = []
    narrow = sorted({str(t.dtype) for t in list(module.parameters()) + list(module.buffers())
                     if t.is_floating_point() and t.dtype != torch.float32})
    if narrow:
        module.float()
        changes.append({"what": "parameters", "from": narrow, "to": "torch.float32"})
    if examples is not None:
        fixed = []
        for i, t in enumerate(examples):
            t = t.detach().cpu()
            if t.is_floating_point() and t.dtype != torch.float32:
                changes.append({"what": f"example input {i}", "from": [str(t.dtype)], "to": "torch.float32"})
                t = t.float()
            fixed.append(t)
        examples = tuple(fixed)
    names = _forward_names(module, len(examples) if examples is not None else None)
    return Loaded(
        module=module,
        example_inputs=examples,
        input_names=names,
        state_sha256=state_digest(module),
        state_bytes=state_bytes(module),
        training_at_load=training,
        still_training=still,
        dtype_changes=changes,
        examples_sha256=tensors_digest(examples) if examples is not None else None,
    )


# A second factory call (to see whether it gives the same weights and inputs)
# is made only when building the model twice is cheap.
SECOND_CALL_LIMIT = 256 << 20


def second_call(spec: TorchSpec, first: Loaded) -> dict:
    """Call the factory again and compare weights and example inputs by digest."""
    if first.state_bytes > SECOND_CALL_LIMIT:
        return {"checked": False, "reason": f"weights are {first.state_bytes >> 20} MB: not built twice"}
    fn = import_factory(spec)
    try:
        module, examples = unpack(fn(), spec)
    except UserError:
        raise
    except SystemExit as exc:
        raise _exited(spec, exc, "the factory's second call") from None
    except Exception as exc:
        return {"checked": False, "reason": f"second call raised {_first_line(exc)}"}
    module.eval().to("cpu")
    if any(t.is_floating_point() and t.dtype != torch.float32
           for t in list(module.parameters()) + list(module.buffers())):
        module.float()
    same_weights = state_digest(module) == first.state_sha256
    same_inputs = None
    if examples is not None and first.example_inputs is not None:
        ex = tuple(t.detach().cpu().float() if t.is_floating_point() else t.detach().cpu() for t in examples)
        same_inputs = tensors_digest(ex) == first.examples_sha256
    del module
    return {"checked": True, "same_weights": same_weights, "same_inputs": same_inputs}


def feeds_to_args(loaded: Loaded, feeds: dict[str, np.ndarray]) -> tuple:
    """One sample of the session's inputs as the forward's positional arguments."""
    missing = [n for n in loaded.input_names if n not in feeds]
    if missing:
        raise UserError(f"the inputs have no array for forward argument(s) {', '.join(missing)} "
                        f"(have {', '.join(sorted(feeds))})")
    return tuple(torch.from_numpy(np.ascontiguousarray(feeds[n])) for n in loaded.input_names)
