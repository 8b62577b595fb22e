"""The settings of a triage as the user would type them on the command line.

A report pasted into a bug tracker should say how to reproduce it; a Python
dict of the config does not. Every value is quoted for a POSIX shell
(`shlex.quote`): names come from models and may hold spaces or quotes.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Optional, Sequence

from bisect_tui.core.tolerance import PRESETS

_CRITERIA_FLAGS = (("atol", "--atol"), ("rtol", "--rtol"), ("min_cosine", "--min-cosine"))


def _g(x: float) -> str:
    return f"{x:g}"


def _as_list(value) -> list:
    """A list option's value: stored as a JSON list in the config's options, or a tuple."""
    import json

    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return [value]
        return list(value) if isinstance(value, list) else [value]
    return list(value or ())


def engine_argv(options: Sequence, c) -> list[str]:
    """The engine's flags for `c`, from its declared `options` (values that differ from
    the defaults), with the common --precision after the first of them."""
    out: list[str] = []
    opts = list(options)
    precision = ["--precision", c.precision] if c.precision != "fp32" else []
    if not opts:
        return precision
    for i, opt in enumerate(opts):
        value = opt.config_value(c)
        if opt.kind == "mapping":
            for k, v in value or ():
                out += [opt.flag, f"{k}={v}"]
        elif opt.kind == "list":
            value = _as_list(value)
            # what a config holds when nothing is given, and what the engine adds itself
            implied = _as_list(opt.config_value(type(c)())) + list(opt.implied)
            for n in value:
                if n in implied:
                    continue  # the engine's own fallback (every such list ends with it)
                out += [opt.flag, str(n)]
        elif value not in (None, "", opt.default):
            out += [opt.flag, str(value)]
        if i == 0:
            out += precision
    return out


def command_argv(opts, command: str = "check", model_name: Optional[str] = None,
                 options: Optional[Sequence] = None) -> list[str]:
    """argv (without the program name) that reruns `opts`; the model as a file name
    (paths of the reporter's machine mean nothing to the reader). `options`: the
    engine's declared options; by default those of the installed engine catalog."""
    from bisect_tui.core.inputs import value_text

    torch = getattr(opts, "torch", None)
    if torch:  # the model and its example inputs come from the PyTorch factory
        argv = [command, "--torch", torch["spec"]]
        if torch.get("exporter", "auto") != "auto":
            argv += ["--exporter", torch["exporter"]]
    else:
        argv = [command, model_name or Path(opts.model).name]
    if torch:
        pass
    elif opts.input_file:
        argv += ["--input", Path(opts.input_file).name]
    else:
        for name, dims in opts.shapes.items():
            argv += ["--shape", f"{name}={'x'.join(map(str, dims))}"]
        for name, v in opts.input_values.items():
            argv += ["--input-value", f"{name}={value_text(v)}"]
        for name, (lo, hi) in opts.input_ranges.items():
            argv += ["--input-range", f"{name}={_g(lo)}:{_g(hi)}"]
        if opts.seed:
            argv += ["--seed", str(opts.seed)]
        if opts.samples != 1:
            argv += ["--samples", str(opts.samples)]
    c = opts.config
    if opts.engine != "ort":
        argv += ["--engine", opts.engine]
    if options is None:
        from bisect_tui.core.triage.catalog import installed

        options = installed().options(opts.engine)
    argv += engine_argv(options, c)
    for n in getattr(c, "keep_fp32", ()):
        argv += ["--keep-fp32", n]
    tol = opts.tolerance.default
    base = tol.name.split("+", 1)[0]
    default_preset = {"fp16": "fp16", "bf16": "bf16"}.get(c.precision, "fp32")
    if base in PRESETS and base != default_preset:
        argv += ["--preset", base]
    if base in PRESETS and tol.name != base:
        preset = PRESETS[base].tolerance
        for field, flag in _CRITERIA_FLAGS:
            v = getattr(tol, field)
            if v is not None and v != getattr(preset, field):
                argv += [flag, _g(v)]
    for pattern, t in opts.tolerance.overrides:
        parts = [f"{f}={_g(getattr(t, f))}" for f, _ in _CRITERIA_FLAGS if getattr(t, f) is not None]
        argv += ["--tol", f"{pattern}:{','.join(parts)}"]
    if opts.topk:
        argv += ["--topk", str(opts.topk)]
    if not opts.compare_tensors:
        argv.append("--outputs-only")
    if not opts.check_determinism:
        argv.append("--no-determinism")
    for t, lo, hi in opts.ranges:
        argv += ["--range", f"{t}={_g(lo)}:{_g(hi)}"]
    return argv


def command_line(opts, command: str = "check", model_name: Optional[str] = None,
                 options: Optional[Sequence] = None) -> str:
    return "bisect-tui " + " ".join(shlex.quote(a) for a in command_argv(opts, command, model_name, options))
