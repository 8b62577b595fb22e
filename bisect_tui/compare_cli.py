"""`bisect-tui compare GOLDEN TEST`: golden data against an engine's dumped outputs.

For engines bisect-tui cannot drive (TRT-LLM, vendor SDKs, a server in
production): dump the outputs with np.save, compare them with golden answers
(a framework's FP32 run, or a bisect-tui session's baseline), get an exit code
for CI and a Markdown report with overlaid histograms.

Kept out of cli.py so that the main parser only registers it; nothing heavy
is imported until the command runs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

EPILOG = """exit codes: 0 every compared tensor within tolerance, 1 tolerance broken,
2 bad input (missing file, object array, shapes or names that do not match), 70 internal error

examples:
  bisect-tui compare golden.npy trt_output.npy
  bisect-tui compare golden/ dumps/ --map names.yaml --report compare.md
  bisect-tui compare bisect-sessions/model-1a2b3c4d outputs.npz --preset fp16"""

PRESET_DEFAULT = "from the test's dtype: fp16 for float16, bf16 for bfloat16, int8 when dequantized, else fp32"


def add_parser(subparsers) -> argparse.ArgumentParser:
    from bisect_tui.options import add_tolerance_options

    p = subparsers.add_parser(
        "compare", help="judge an engine's dumped outputs (.npy/.npz) against golden data",
        description="Compare TEST (an engine's outputs saved with np.save) with GOLDEN (framework FP32 "
                    "answers, or a bisect-tui session's baseline) using the same metrics and tolerance "
                    "presets as `check`.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("golden", type=Path, metavar="GOLDEN",
                   help=".npy, .npz, a folder of them, or a session directory (its baseline)")
    p.add_argument("test", type=Path, metavar="TEST", help=".npy, .npz or a folder of them")
    m = p.add_argument_group("matching and dtypes")
    m.add_argument("--map", type=Path, metavar="FILE", help="JSON/YAML: test name (glob) -> golden name")
    m.add_argument("--test-dtype", action="append", default=[], metavar="NAME=KIND",
                   help="how a test tensor was stored: fp16/bf16 (raw 16-bit words), float8_e4m3fn, ...")
    m.add_argument("--scale", action="append", default=[], metavar="NAME=SCALE[:ZERO_POINT]",
                   help="dequantize an INT8/INT32 test tensor: (q - zero_point) * scale")
    m.add_argument("--softmax", type=int, metavar="AXIS",
                   help="compare probabilities: softmax along AXIS on the side(s) that hold raw logits")
    m.add_argument("--skip-unmatched", action="store_true",
                   help="compare the matched tensors even if some test tensors have no golden match")
    add_tolerance_options(p, PRESET_DEFAULT)
    o = p.add_argument_group("output")
    o.add_argument("--json", type=Path, metavar="FILE", help="write the result as JSON")
    o.add_argument("--report", type=Path, metavar="FILE.md",
                   help="write a Markdown report (PNG histograms in FILE-plots/ beside it)")
    o.add_argument("--tui", action="store_true", help="open the result in the app's compare view")
    o.add_argument("-q", "--quiet", action="store_true", help="print only the verdict line")
    return p


def _pairs(items, flag: str) -> list[tuple[str, str]]:
    from bisect_tui.core.errors import UserError

    out = []
    for item in items:
        name, eq, value = item.rpartition("=")
        if not eq or not name.strip() or not value.strip():
            raise UserError(f"bad {flag} {item!r}: expected NAME=VALUE (NAME may be a glob)")
        out.append((name.strip(), value.strip()))
    return out


def options_from_args(args: argparse.Namespace):
    from bisect_tui.core.compare import CompareOptions, Hints
    from bisect_tui.core.compare.matching import check_dtype_hint
    from bisect_tui.core.errors import UserError

    dtypes = tuple((n, check_dtype_hint(k, f"--test-dtype {n}")) for n, k in _pairs(args.test_dtype, "--test-dtype"))
    scales = []
    for n, v in _pairs(args.scale, "--scale"):
        s, _, z = v.partition(":")
        try:
            scales.append((n, float(s), float(z) if z else 0.0))
        except ValueError:
            raise UserError(f"bad --scale {n}={v}: expected SCALE[:ZERO_POINT] numbers") from None
    if args.topk is not None and args.topk < 1:
        raise UserError(f"--topk must be at least 1, got {args.topk}")
    return CompareOptions(
        mapping=args.map, preset=args.preset, atol=args.atol, rtol=args.rtol, min_cosine=args.min_cosine,
        overrides=tuple(args.tol), topk=args.topk, softmax_axis=args.softmax,
        hints=Hints(dtypes, tuple(scales)), skip_unmatched=args.skip_unmatched,
    )


def run(args: argparse.Namespace) -> int:
    from bisect_tui.core.errors import ExitCode, UserError

    try:
        return _run(args)
    except (UserError, KeyboardInterrupt):
        raise
    except Exception as exc:  # a bug of ours must not read as a verdict (0 or 1)
        import traceback

        traceback.print_exc(file=sys.stderr)
        print(f"bisect-tui: internal error in compare: {type(exc).__name__}: {exc}", file=sys.stderr)
        return int(ExitCode.INTERNAL)


def _write(flag: str, path: Path, fn) -> None:
    """Write an output file; the machine refusing (disk full, permission) is exit 5, not a bug."""
    from bisect_tui.core.errors import EnvironmentFault, UserError
    from bisect_tui.core.escape import term

    try:
        fn()
    except IsADirectoryError:
        raise UserError(f"{flag} {term(path)} is a directory; give a file name") from None
    except (NotADirectoryError, FileExistsError):
        raise UserError(f"{flag} {term(path)}: a file stands where a folder of that path should be") from None
    except OSError as exc:
        raise EnvironmentFault(f"{flag} {term(path)}: cannot write ({term(exc.strerror or exc)})") from None


def _run(args: argparse.Namespace) -> int:
    from bisect_tui.core import atomic
    from bisect_tui.core.compare import compare_dumps
    from bisect_tui.core.compare.report import text, verdict_line, write_report
    from bisect_tui.core.errors import UserError
    from bisect_tui.core.escape import term

    opts = options_from_args(args)
    from bisect_tui.core.outputs import check_target

    for flag, kind in (("--json", "json"), ("--report", "report")):  # before the work, not after
        check_target(getattr(args, kind), flag, kind)
    result = compare_dumps(args.golden, args.test, opts)
    if args.json:
        _write("--json", args.json, lambda: atomic.write_json(args.json, result.to_dict()))
    if args.report:
        _write("--report", args.report, lambda: write_report(result, args.report))
    print(verdict_line(result) if args.quiet else text(result))
    if args.tui:
        from bisect_tui.tui.screens.compare import CompareApp

        app = CompareApp(result)
        app.run()
    return result.exit_code
