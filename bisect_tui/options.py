"""The options of a triage as the user gives them: the flags `check`, `bisect`
and `tui` share, their validation, and their translation into TriageOptions.

One declaration for the command line and the app's model picker (which takes
the input flags typed as on the command line), so that what works in one
works in the other. Nothing heavy is imported until options are built.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Optional

from bisect_tui.core.errors import ExitCode, UserError
from bisect_tui.core.escape import term

# generated inputs are held in memory: more samples than this is a typo, not a plan
MAX_SAMPLES = 10_000

# the flags the picker takes beside a model (engine settings are in the settings form)
INPUT_FLAGS = ("--shape", "--input-value", "--input", "--input-range", "--seed", "--samples", "--session")


class Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2, like every other bad input
        self.exit(int(ExitCode.USAGE), f"bisect-tui: error: {message}\n")


def add_model_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", type=Path, nargs="?", help="the ONNX model to triage (omit with --torch)")
    p.add_argument("--torch", metavar="MODULE:FACTORY",
                   help="a PyTorch model instead: module.path:factory returning a module or (module, inputs)")
    p.add_argument("--exporter", default="auto", choices=["auto", "dynamo", "torchscript"],
                   help="ONNX exporter for --torch (default auto: dynamo, else TorchScript)")
    g = p.add_argument_group("session and inputs")
    g.add_argument("--session", type=Path,
                   help="session directory (default: ./bisect-sessions/<model>-<hash>[-<inputs hash>]: "
                        "each input choice gets its own; list and prune them with `bisect-tui sessions`)")
    g.add_argument("--shape", action="append", default=[], metavar="NAME=DIMS",
                   help="concrete shape for an input (x=1x3x224x224) or a named dim (batch=1); "
                        "without it a model with dynamic dims stops with a suggestion that ran")
    g.add_argument("--seed", type=int, default=0, help="seed for generated inputs (default 0)")
    g.add_argument("--samples", type=int, default=1, help="number of input samples (default 1)")
    g.add_argument("--input", type=Path, help=".npy/.npz with the exact inputs (leading samples axis optional)")
    g.add_argument("--input-range", action="append", default=[], metavar="NAME=MIN:MAX",
                   help="value range for a generated input (ids=0:30000)")
    g.add_argument("--input-value", action="append", default=[], metavar="NAME=VALUE",
                   help="fill an input with one fixed value: a sample rate (sr=16000), a flag (use_cache=false)")
    g.add_argument("--max-memory", metavar="SIZE", help="memory budget for dumping tensors and for the search's builds: one beside another only when both fit (e.g. 2G; default: 1/4 of free RAM)")
    g.add_argument("--no-determinism", action="store_true", help="skip the run-twice determinism check")
    g.add_argument("--range", action="append", default=[], metavar="TENSOR=MIN:MAX",
                   help="expected value range of tensors (glob allowed) for the range check")
    e = p.add_argument_group("fused engine")
    from bisect_tui.engines.flags import add_engine_flags

    add_engine_flags(e)  # the common core plus every engine's declared options
    t = add_tolerance_options(p, "the precision's")
    t.add_argument("--outputs-only", action="store_true",
                   help="compare final outputs only (skip the per-tensor comparison of the fused graph)")
    t.add_argument("--no-arbiter", action="store_true",
                   help="skip the float64 run that tells whether the fused result is really worse than FP32")
    o = p.add_argument_group("output")
    o.add_argument("--json", type=Path, metavar="FILE", help="write the result as JSON")
    o.add_argument("--report", type=Path, metavar="FILE.md", help="write a Markdown report")
    o.add_argument("--model-explorer", type=Path, metavar="FILE.json",
                   help="write each node's error for Google's Model Explorer (node data JSON; culprits highlighted)")
    o.add_argument("-q", "--quiet", action="store_true", help="no progress output")


def add_tolerance_options(p: argparse.ArgumentParser, default_preset: str) -> argparse._ArgumentGroup:
    """The tolerance flags `check`, `bisect` and `compare` share (same names, same presets)."""
    t = p.add_argument_group("tolerance")
    t.add_argument("--preset", help=f"tolerance preset: fp32, fp16, bf16, int8, article, ... (default: {default_preset})")
    t.add_argument("--atol", type=float, metavar="X",
                   help="absolute tolerance: |test - reference| <= atol + rtol*|reference| per element "
                        "(overrides the preset's)")
    t.add_argument("--rtol", type=float, metavar="X",
                   help="relative tolerance in that per-element test (overrides the preset's)")
    t.add_argument("--min-cosine", type=float, metavar="X",
                   help="smallest cosine similarity an output may have, e.g. 0.9999 (overrides the preset's)")
    t.add_argument("--tol", action="append", default=[], metavar="OUTPUT:CRIT=V,...",
                   help="per-output tolerance, e.g. logits:atol=1e-3,min_cosine=0.999")
    t.add_argument("--topk", type=int, metavar="K", help="also compare top-k agreement along the last axis")
    return t


def device_list(text: str) -> list[str]:
    items = [t.strip() for t in text.split(",")]
    if not items or any(not t or not (t.isdigit() or t.startswith(("GPU-", "MIG-"))) for t in items) \
            or len(set(items)) != len(items):
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected distinct device indices or UUIDs separated by commas, e.g. 0,1")
    return items


def positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected 1 or more, got {n}")
    return n


def _check_session_dir(path: Optional[Path]) -> None:
    if path is None:
        return
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise UserError(f"--session {term(p)} is a file, not a directory")
    probe = p
    while not probe.exists():
        if probe.is_symlink():
            raise UserError(f"--session {term(p)}: {term(probe)} is a dangling symbolic link")
        if probe.parent == probe:
            break
        probe = probe.parent
    if not probe.is_dir():
        raise UserError(f"--session {term(p)}: {term(probe)} is not a directory")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise UserError(f"--session {term(p)}: {term(probe)} is not writable")


def _check_numbers(args: argparse.Namespace) -> None:
    if not 1 <= args.samples <= MAX_SAMPLES:
        raise UserError(f"--samples must be between 1 and {MAX_SAMPLES}, got {args.samples}")
    if not 0 <= args.seed < 2 ** 63:
        raise UserError(f"--seed must be a non-negative integer below 2**63, got {args.seed}")
    if args.topk is not None and args.topk < 1:
        raise UserError(f"--topk must be at least 1, got {args.topk}")
    for flag in ("max_builds", "max_culprits"):
        value = getattr(args, flag, None)
        if value is not None and value < 1:
            raise UserError(f"--{flag.replace('_', '-')} must be at least 1, got {value}")


def options_from_args(args: argparse.Namespace):
    """Turn parsed arguments into TriageOptions, validating every value up front."""
    from bisect_tui.core.checks import parse_ranges
    from bisect_tui.core.inputs import parse_input_values, parse_shapes, parse_value_ranges
    from bisect_tui.core.triage.options import TriageOptions
    from bisect_tui.core.memory import parse_memory
    from bisect_tui.core.tolerance import parse_tolerance
    from bisect_tui.engines.flags import config_from_args

    _check_numbers(args)
    _check_session_dir(args.session)
    from bisect_tui.core.outputs import check_target

    for kind in ("json", "report", "bundle", "model_explorer"):
        check_target(getattr(args, kind, None), "--" + kind.replace("_", "-"), kind)
    engine, config = config_from_args(args)  # validated by the engine itself
    preset = args.preset or ({"fp16": "fp16", "bf16": "bf16"}.get(args.precision, "fp32"))
    tolerance = parse_tolerance(preset, args.atol, args.rtol, args.min_cosine, args.tol)
    torch_spec = None
    if getattr(args, "torch", None):
        from bisect_tui.frontends.torch import TorchSpec

        if args.model is not None:
            raise UserError("give either an ONNX model or --torch MODULE:FACTORY, not both")
        torch_spec = TorchSpec.parse(args.torch, args.exporter).to_dict()
    elif args.model is None:
        raise UserError("no model: give an ONNX file or --torch MODULE:FACTORY")
    return TriageOptions(
        model=args.model,
        session_dir=args.session,
        shapes=parse_shapes(args.shape),
        seed=args.seed,
        samples=args.samples,
        input_file=args.input,
        input_ranges=parse_value_ranges(args.input_range),
        input_values=parse_input_values(args.input_value),
        max_memory=parse_memory(args.max_memory) if args.max_memory else 0,
        engine=engine,
        config=config,
        tolerance=tolerance,
        ranges=parse_ranges(args.range),
        check_determinism=not args.no_determinism,
        topk=args.topk,
        compare_tensors=not args.outputs_only,
        torch=torch_spec,
        arbiter=not getattr(args, "no_arbiter", False),
    )




def options_for_input_flags(path: Path, flags: str):
    """TriageOptions for `path` with input flags written as on the command line
    (the picker's field): the same declarations and checks as `check`."""
    import contextlib
    import io
    import shlex

    try:
        tokens = shlex.split(flags)
    except ValueError as exc:
        raise UserError(f"input options: {exc}") from None
    for t in tokens:
        if t.startswith("-") and t.split("=", 1)[0] not in INPUT_FLAGS:
            raise UserError(f"input options: {t} is not an input option here; use "
                            + ", ".join(sorted(INPUT_FLAGS)) + " (engine settings are in the settings form, o)")
    parser = Parser(prog="bisect-tui check")
    add_model_options(parser)
    err = io.StringIO()
    try:  # a typo is a line in the picker, never an exit or a print over the screen
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            args = parser.parse_args([str(path), *tokens])
    except SystemExit:
        line = err.getvalue().strip().splitlines()
        raise UserError("input options: " + (line[-1].removeprefix("bisect-tui: error: ") if line else "not valid"))
    return options_from_args(args)
