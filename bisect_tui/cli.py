"""Command line: `bisect-tui` opens the app; subcommands run headless.

Exit codes (also in docs/check.md):
  0  within tolerance (check) / nothing to find (bisect)
  1  tolerance broken (check) / culprit(s) found (bisect)
  2  usage error or bad input (one line on stderr, nothing in the session lost)
  3  the baseline is not deterministic (two identical runs differ)
  4  NaN/Inf in the baseline
  5  environment fault: disk full, file too large, permission denied (one line;
     nothing half-written is left for a rerun to trust)
  70 internal error: a bug in bisect-tui, never a verdict (one line naming the
     log file with the traceback, in <session>/log/)
  130 interrupted (Ctrl-C or SIGTERM); rerun the same command to resume

Heavy libraries (onnxruntime, textual) are imported only inside commands so
`--help` stays instant.
"""

from __future__ import annotations

import argparse
import errno
import os
import signal
import sys
from pathlib import Path
from typing import Optional, Sequence

from bisect_tui import __version__, compare_cli
from bisect_tui.core.errors import Cancelled, EnvironmentFault, ExitCode, UserError
from bisect_tui.core.escape import term

EPILOG = """exit codes: 0 within tolerance / nothing to find, 1 tolerance broken / culprits found,
2 usage or bad input, 3 baseline not deterministic, 4 NaN/Inf in the baseline,
5 environment fault (disk full, permission), 70 internal error (a bug, see the log), 130 interrupted"""

# generated inputs are held in memory: more samples than this is a typo, not a plan
MAX_SAMPLES = 10_000


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2, like every other bad input
        self.exit(int(ExitCode.USAGE), f"bisect-tui: error: {message}\n")


def _add_model_options(p: argparse.ArgumentParser) -> None:
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
    g.add_argument("--max-memory", metavar="SIZE", help="memory budget for dumping tensors (e.g. 2G; default: 1/4 of free RAM)")
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
    b.add_argument("--workers", type=_positive_int, default=None, metavar="N",
                   help="engine builds at once, in worker processes (default: one per core, at most 8; "
                        "asked for, or with --fanout > 1, they start at once and import the engine while "
                        "the baseline runs); the result and the build count do not depend on it")
    b.add_argument("--devices", type=_device_list, default=None, metavar="LIST",
                   help="one build worker per accelerator, e.g. 0,1,2,3: each worker sees only its own "
                        "(CUDA_VISIBLE_DEVICES), this process the first; sets --workers to their number")
    b.add_argument("--ray", metavar="ADDRESS", default=None,
                   help="build on Ray actors instead of local processes, one per worker (--workers N): "
                        "'local' starts Ray on this machine, else a cluster address for ray.init "
                        "('auto', 'ray://HEAD:10001'); needs the extra: pip install 'bisect-tui[ray]'")
    b.add_argument("--fanout", type=_positive_int, default=1, metavar="K",
                   help="candidates the search builds per round (default 1: binary search; K > 1: "
                        "K split points per round, fewer rounds for more builds, for K workers)")
    b.add_argument("--no-probe", action="store_true",
                   help="search by builds alone: skip the fused-graph probe that names suspects to try first")
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


def _device_list(text: str) -> list[str]:
    items = [t.strip() for t in text.split(",")]
    if not items or any(not t or not (t.isdigit() or t.startswith(("GPU-", "MIG-"))) for t in items) \
            or len(set(items)) != len(items):
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected distinct device indices or UUIDs separated by commas, e.g. 0,1")
    return items


def _positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected 1 or more, got {n}")
    return n


def _check_output_file(path: Optional[Path], flag: str) -> None:
    """A --json/--report/--bundle target must be writable now, not after the whole run."""
    if path is None:
        return
    p = Path(path)
    if p.is_dir():
        raise UserError(f"{flag} {term(p)} is a directory; give a file name")
    if p.exists() and not os.access(p, os.W_OK):
        raise UserError(f"{flag} {term(p)} exists and is not writable")
    # missing folders are created when the file is written; the nearest existing
    # one must be a folder we can write in
    probe = p.parent if str(p.parent) else Path(".")
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    if not probe.is_dir():
        raise UserError(f"{flag} {term(p)}: {term(probe)} is a file, not a folder")
    if not p.exists() and not os.access(probe, os.W_OK | os.X_OK):
        raise UserError(f"{flag} {term(p)}: the folder {term(probe)} is not writable")


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
    from bisect_tui.core.pipeline import TriageOptions
    from bisect_tui.core.memory import parse_memory
    from bisect_tui.core.tolerance import parse_tolerance
    from bisect_tui.engines.flags import config_from_args

    _check_numbers(args)
    _check_session_dir(args.session)
    for flag in ("json", "report", "bundle"):
        _check_output_file(getattr(args, flag, None), f"--{flag}")
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


def cmd_check(args: argparse.Namespace) -> int:
    _prestart_second_run(args)
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
    print(term(check_text(summary), keep_newlines=True))
    from bisect_tui.core.bisect.command import export_session, public_json, write_report_copy

    full, _, _ = export_session(triage, summary, None, with_plots=bool(args.report))
    if args.json:
        atomic.write_json(args.json, public_json(full))
    if args.report:
        write_report_copy(full, args.report)
    return summary["exit_code"]


def _prestart_second_run(args: argparse.Namespace) -> None:
    if not getattr(args, "no_determinism", False):
        from bisect_tui.core.second_run import prestart

        prestart()  # its imports overlap ours (the determinism check's fresh process)


def cmd_bisect(args: argparse.Namespace) -> int:
    _prestart_second_run(args)
    from bisect_tui.core.bisect.command import run_bisect_command

    return run_bisect_command(args, options_from_args(args))


def cmd_tui(args: Optional[argparse.Namespace]) -> int:
    from bisect_tui.tui.app import make_app

    wanted = args is not None and (getattr(args, "model", None) or getattr(args, "torch", None))
    opts = options_from_args(args) if wanted else None
    if opts is not None and opts.model is not None:
        from bisect_tui.core.model import load_model_info

        load_model_info(opts.model)  # a bad path fails here with one line, before the screen opens
    if opts is not None and opts.torch:
        from bisect_tui.frontends.torch import TorchSpec
        from bisect_tui.frontends.torch.factory import import_factory

        import_factory(TorchSpec.from_dict(opts.torch))  # a bad module or factory: one line, no screen
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


# errno values that mean the machine, not the model or the tool, stopped us
ENVIRONMENT_ERRNOS = {
    errno.ENOSPC: "the disk is full",
    errno.EFBIG: "a file grew past the allowed size (ulimit -f?)",
    errno.EDQUOT: "the disk quota is exhausted",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.EROFS: "the file system is read-only",
}


def environment_fault(exc: BaseException) -> Optional[EnvironmentFault]:
    """An OSError (or MemoryError) that is the machine's fault, as one line."""
    if isinstance(exc, MemoryError):
        return EnvironmentFault("out of memory; lower --max-memory or --samples, or free memory, and rerun")
    if isinstance(exc, OSError) and exc.errno in ENVIRONMENT_ERRNOS:
        where = f" ({term(exc.filename)})" if exc.filename else ""
        return EnvironmentFault(
            f"{ENVIRONMENT_ERRNOS[exc.errno]}{where}; nothing half-written is kept, "
            "fix it and rerun the same command to resume")
    return None


def write_crash_log(exc: BaseException) -> Path:
    """The traceback, in `<session>/log/` (or a fresh temp folder before any session)."""
    import datetime as _dt
    import tempfile
    import traceback

    from bisect_tui.core.session import active_root

    text = (f"bisect-tui {__version__} internal error at {_dt.datetime.now().isoformat()}\n"
            f"argv: {sys.argv!r}\n\n" + "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
    name = f"crash-{_dt.datetime.now():%Y%m%d-%H%M%S}-{os.getpid()}.log"
    root = active_root()
    if root is not None:
        try:
            from bisect_tui.core import atomic
            from bisect_tui.core.session import Session

            log_dir = Session(root).log_dir
            log_dir.mkdir(parents=True, exist_ok=True)
            atomic.write_text(log_dir / name, text)
            return log_dir / name
        except Exception:
            pass  # the session itself may be what failed: fall back to a temp folder
    from bisect_tui.core import safepath

    safepath.release_session_temp()
    folder = Path(tempfile.mkdtemp(prefix="bisect-tui-log-"))
    (folder / name).write_text(text, encoding="utf-8")
    return folder / name


def _on_sigterm(signum, frame):  # finally-blocks run: temp files go, the session stays resumable
    raise KeyboardInterrupt


def _install_signals() -> None:
    try:
        signal.signal(signal.SIGTERM, _on_sigterm)
        if hasattr(signal, "SIGXFSZ"):  # a file-size limit becomes EFBIG, not a silent kill
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    except ValueError:
        pass  # not the main thread (tests driving main from a worker)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Every outcome maps to a documented exit code; no traceback reaches the user,
    and an internal error never exits with a verdict's code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    handlers = {"check": cmd_check, "bisect": cmd_bisect, "tui": cmd_tui, "resume": cmd_resume,
                "sessions": cmd_sessions, "compare": compare_cli.run}
    from bisect_tui.core import safepath, session as _session

    _install_signals()
    opened = len(_session._ACTIVE)
    try:
        if args.command is None:
            return cmd_tui(None)
        return handlers[args.command](args)
    except UserError as exc:
        print(f"bisect-tui: error: {term(exc)}", file=sys.stderr)
        return int(exc.code)
    except (KeyboardInterrupt, Cancelled):
        print("\nbisect-tui: interrupted; rerun the same command to resume from the session directory",
              file=sys.stderr)
        return int(ExitCode.CANCELLED)
    except Exception as exc:
        fault = environment_fault(exc)
        if fault is not None:
            print(f"bisect-tui: error: {fault}", file=sys.stderr)
            return int(fault.code)
        try:
            log = write_crash_log(exc)
            where = f"traceback in {term(log)}"
        except Exception:
            where = "the traceback could not be written anywhere"
        first = term(str(exc).splitlines()[0][:200]) if str(exc).strip() else ""
        print(f"bisect-tui: internal error ({type(exc).__name__}{': ' + first if first else ''}); "
              f"this is a bug in bisect-tui, not a verdict; {where} (exit {int(ExitCode.INTERNAL)})",
              file=sys.stderr)
        return int(ExitCode.INTERNAL)
    finally:
        root = _session.active_root() if len(_session._ACTIVE) > opened else None
        safepath.release_session_temp(root)
        del _session._ACTIVE[opened:]


def entry() -> None:
    """The console script: main(), then a quick exit.

    By the time main() returns, every file of the run is written and closed
    (atomic writes, the session, the reports) and its workers are stopped;
    what is left for the interpreter is tearing down ONNX Runtime, numpy and
    the model's thousands of protobuf objects: 50-200 ms that nobody waits
    for. The exit handlers (a determinism run to stop) and the streams are
    run and flushed first; the code is main()'s."""
    from bisect_tui.core.threads import limit_blas

    limit_blas(os.environ)  # before numpy loads its BLAS (core/threads.py)
    code = main()
    import atexit
    import logging

    try:
        atexit._run_exitfuncs()
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
    except Exception:  # a closed pipe, a handler failing: the interpreter's own exit then
        raise SystemExit(code)
    os._exit(code)


if __name__ == "__main__":
    entry()
