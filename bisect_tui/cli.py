"""Command line: `bisect-tui` opens the app; subcommands run headless.

Exit codes (also in docs/check.md):
  0  within tolerance (check) / nothing to find (bisect)
  1  tolerance broken (check) / culprit(s) found (bisect)
  2  usage error or bad input (one line on stderr, nothing in the session lost)
  3  the baseline is not deterministic (two identical runs differ)
  4  NaN/Inf in the baseline
  130 interrupted (Ctrl-C); rerun the same command to resume

Heavy libraries (onnxruntime, textual) are imported only inside commands so
`--help` stays instant.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional, Sequence

from bisect_tui import __version__, compare_cli
from bisect_tui.core.errors import Cancelled, ExitCode, UserError

EPILOG = """exit codes: 0 within tolerance / nothing to find, 1 tolerance broken / culprits found,
2 usage or bad input, 3 baseline not deterministic, 4 NaN/Inf in the baseline, 130 interrupted"""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2, like every other bad input
        self.exit(int(ExitCode.USAGE), f"bisect-tui: error: {message}\n")


def _add_model_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", type=Path, help="the ONNX model to triage (.onnx)")
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
    g.add_argument("--max-memory", metavar="SIZE", help="memory budget for dumping tensors (e.g. 2G; default: 1/4 of free RAM)")
    g.add_argument("--no-determinism", action="store_true", help="skip the run-twice determinism check")
    g.add_argument("--range", action="append", default=[], metavar="TENSOR=MIN:MAX",
                   help="expected value range of tensors (glob allowed) for the range check")
    e = p.add_argument_group("fused engine")
    e.add_argument("--engine", default="ort", metavar="NAME", help="engine (default: ort = ONNX Runtime CPU)")
    e.add_argument("--level", default="all", choices=["disable", "basic", "extended", "all"],
                   help="graph optimization level of the fused engine (default all)")
    e.add_argument("--precision", default="fp32", choices=["fp32", "fp16"], help="engine precision (default fp32)")
    e.add_argument("--ort-config", action="append", default=[], metavar="KEY=VALUE",
                   help="session config entry, e.g. optimization.enable_gelu_approximation=1")
    e.add_argument("--disable", action="append", default=[], metavar="OPTIMIZER",
                   help="disable an optimizer by name (checked against the installed ORT)")
    e.add_argument("--keep-fp32", action="append", default=[], metavar="NODE",
                   help="with --precision fp16: keep this original node in FP32 (a keep-set that "
                        "`bisect` finds for you)")
    t = add_tolerance_options(p, "the precision's")
    t.add_argument("--outputs-only", action="store_true",
                   help="compare final outputs only (skip the per-tensor comparison of the fused graph)")
    o = p.add_argument_group("output")
    o.add_argument("--json", type=Path, metavar="FILE", help="write the result as JSON")
    o.add_argument("--report", type=Path, metavar="FILE.md", help="write a Markdown report")
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


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="bisect-tui",
        description="Find the fused operator that makes an optimized inference engine break tolerance. "
        "With no command, opens the app.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"bisect-tui {__version__}")
    sub = p.add_subparsers(dest="command", parser_class=_Parser)
    c = sub.add_parser("check", help="baseline, determinism, range check, fused engine, comparison",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_model_options(c)
    b = sub.add_parser("bisect", help="find the fused op(s) that break tolerance",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_model_options(b)
    b.add_argument("--bundle", type=Path, metavar="FILE.zip", help="write a minimal repro bundle")
    b.add_argument("--max-builds", type=int, default=200, help="stop after this many engine builds")
    b.add_argument("--max-culprits", type=int, default=5,
                   help="stop after this many culprits (default 5; many usually means amplified rounding)")
    tu = sub.add_parser("tui", help="open the app on a model")
    _add_model_options(tu)
    r = sub.add_parser("resume", help="reopen a session directory in the app where it stopped")
    r.add_argument("session", type=Path, help="the session directory (see `bisect-tui sessions`)")
    r.add_argument("--headless", action="store_true", help="resume the bisection without the app")
    r.add_argument("-q", "--quiet", action="store_true", help="no progress output (with --headless)")
    se = sub.add_parser("sessions", help="list the session directories with their size; prune old ones")
    se.add_argument("action", nargs="?", default="list", choices=["list", "prune"],
                    help="list (default) or prune")
    se.add_argument("--dir", type=Path, default=Path("bisect-sessions"), metavar="DIR",
                    help="where the sessions are (default ./bisect-sessions; the app's recent ones are added)")
    se.add_argument("--unfinished", action="store_true",
                    help="prune: sessions where no check or bisection finished (failed attempts)")
    se.add_argument("--older-than", type=float, metavar="DAYS", help="prune: sessions created more than DAYS ago")
    se.add_argument("--all", action="store_true", help="prune: every session found")
    se.add_argument("--dry-run", action="store_true", help="prune: only show what would be removed")
    se.add_argument("--include-recent", action="store_true",
                    help="prune: also the app's recent sessions outside --dir (list always shows them)")
    compare_cli.add_parser(sub)
    return p


def _kv_list(items: Sequence[str], flag: str) -> tuple[tuple[str, str], ...]:
    out = []
    for item in items:
        if "=" not in item:
            raise UserError(f"bad {flag} {item!r}: expected KEY=VALUE")
        k, v = item.split("=", 1)
        out.append((k.strip(), v.strip()))
    return tuple(sorted(out))


def options_from_args(args: argparse.Namespace):
    """Turn parsed arguments into TriageOptions, validating every value up front."""
    from bisect_tui.core.checks import parse_ranges
    from bisect_tui.core.inputs import parse_input_values, parse_shapes, parse_value_ranges
    from bisect_tui.core.pipeline import TriageOptions
    from bisect_tui.core.runner import parse_memory
    from bisect_tui.core.tolerance import parse_tolerance
    from bisect_tui.engines import get_engine
    from bisect_tui.engines.base import EngineConfig

    engine = get_engine(args.engine)
    disabled = tuple(dict.fromkeys(args.disable))
    unknown = engine.unknown_optimizers(disabled) if disabled else []
    if unknown:
        import difflib

        known = sorted(engine.known_optimizers())
        hints = difflib.get_close_matches(unknown[0], known, n=3)
        vers = engine.versions().get(engine.name if engine.name != "ort" else "onnxruntime", "")
        raise UserError(
            f"--disable {unknown[0]}: the installed engine ({engine.name} {vers}) does not know this "
            f"optimizer and would silently ignore it"
            + (f"; did you mean {', '.join(hints)}?" if hints else "")
        )
    config = EngineConfig(
        level=args.level,
        precision=args.precision,
        config_entries=_kv_list(args.ort_config, "--ort-config"),
        disabled_optimizers=disabled,
        keep_fp32=tuple(sorted(set(args.keep_fp32))),
    )
    preset = args.preset or ("fp16" if args.precision == "fp16" else "fp32")
    tolerance = parse_tolerance(preset, args.atol, args.rtol, args.min_cosine, args.tol)
    if args.samples < 1:
        raise UserError(f"--samples must be at least 1, got {args.samples}")
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
        engine=args.engine,
        config=config,
        tolerance=tolerance,
        ranges=parse_ranges(args.range),
        check_determinism=not args.no_determinism,
        topk=args.topk,
        compare_tensors=not args.outputs_only,
    )


def cmd_check(args: argparse.Namespace) -> int:
    from bisect_tui.core import atomic
    from bisect_tui.core.pipeline import Triage
    from bisect_tui.core.report import check_text
    from bisect_tui.progress_text import TextProgress

    opts = options_from_args(args)
    progress = TextProgress(enabled=not args.quiet)
    triage = Triage(opts, progress)
    try:
        summary = triage.run_all()
    finally:
        progress.close()
    print(check_text(summary))
    from bisect_tui.core.bisect.command import export_session, public_json, write_report_copy

    full, _, _ = export_session(triage, summary, None, with_plots=bool(args.report))
    if args.json:
        atomic.write_json(args.json, public_json(full))
    if args.report:
        write_report_copy(full, args.report)
    return summary["exit_code"]


def cmd_bisect(args: argparse.Namespace) -> int:
    from bisect_tui.core.bisect.command import run_bisect_command

    return run_bisect_command(args, options_from_args(args))


def cmd_tui(args: Optional[argparse.Namespace]) -> int:
    from bisect_tui.tui.app import make_app

    opts = options_from_args(args) if args is not None and getattr(args, "model", None) else None
    if opts is not None:
        from bisect_tui.core.model import load_model_info

        load_model_info(opts.model)  # a bad path fails here with one line, before the screen opens
    app = make_app(options=opts)
    if args is not None:  # `tui --json/--report`: written by every export and on quit
        app.output_json = getattr(args, "json", None)
        app.output_report = getattr(args, "report", None)
    app.run()
    return int(app.return_code or 0)


def cmd_sessions(args: argparse.Namespace) -> int:
    from bisect_tui.core import sessions_admin as sa
    from bisect_tui.core.escape import term

    # prune acts under --dir only, unless asked: sessions elsewhere are someone's on purpose
    entries = sa.find_sessions(args.dir, include_recent=args.action == "list" or args.include_recent)
    if args.action == "list":
        if not entries:
            print(f"no sessions under {term(args.dir)} (nor in the app's recent list)")
            return 0
        for e in entries:
            print(f"{sa.human_size(e.bytes):>9}  {term(_shown(e.path))}  {term(e.model)}  [{term(e.inputs)}]  "
                  f"{e.last_step}  {e.created[:10]}")
        print(f"{len(entries)} session(s), {sa.human_size(sum(e.bytes for e in entries))} in all; "
              "`bisect-tui sessions prune --unfinished` removes failed attempts")
        return 0
    chosen = sa.select(entries, args.older_than, args.unfinished, args.all)
    freed = 0
    for e in chosen:
        if args.dry_run:
            print(f"would remove {term(_shown(e.path))} ({sa.human_size(e.bytes)}, {e.last_step})")
        else:
            freed += sa.remove(e)
            print(f"removed {term(_shown(e.path))} ({sa.human_size(e.bytes)}, {e.last_step})")
    kept = len(entries) - len(chosen)
    what = "would free" if args.dry_run else "freed"
    total = sum(e.bytes for e in chosen) if args.dry_run else freed
    print(f"{len(chosen)} session(s) {'selected' if args.dry_run else 'removed'}, {what} {sa.human_size(total)}; "
          f"{kept} kept")
    return 0


def _shown(p: Path) -> str:
    try:
        return str(Path(p).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(p)


def cmd_resume(args: argparse.Namespace) -> int:
    from bisect_tui.core.resume import options_from_session

    opts = options_from_session(args.session)
    if args.headless:
        from bisect_tui.core.bisect.command import run_bisect_command

        ns = argparse.Namespace(json=None, report=None, bundle=None, quiet=args.quiet, max_builds=200,
                                max_culprits=5)
        return run_bisect_command(ns, opts)
    from bisect_tui.tui.app import make_app

    app = make_app(options=opts, resume=True)
    app.run()
    return int(app.return_code or 0)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handlers = {"check": cmd_check, "bisect": cmd_bisect, "tui": cmd_tui, "resume": cmd_resume,
                "sessions": cmd_sessions, "compare": compare_cli.run}
    try:
        if args.command is None:
            return cmd_tui(None)
        return handlers[args.command](args)
    except UserError as exc:
        print(f"bisect-tui: error: {exc}", file=sys.stderr)
        return int(exc.code)
    except (KeyboardInterrupt, Cancelled):
        print("\nbisect-tui: interrupted; rerun the same command to resume from the session directory",
              file=sys.stderr)
        return int(ExitCode.CANCELLED)


if __name__ == "__main__":
    raise SystemExit(main())
