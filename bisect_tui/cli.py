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
  141 the output was closed (`bisect-tui bisect ... | head`): the run stopped
      there, the session keeps what was done; rerun the same command to resume

Heavy libraries (the engines', textual) are imported only inside commands so
`--help` stays instant.
"""

from __future__ import annotations

import argparse
import errno
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Optional, Sequence

from bisect_tui import __version__

if TYPE_CHECKING:
    from bisect_tui.core.errors import EnvironmentFault

# The rest of the program is imported inside the functions, not here: `entry()`
# starts the determinism check's second interpreter before it (see
# _prestart_early), and every module this one imported first (the shared options,
# the engine contract, numpy by way of the commands) made that start later.


def __getattr__(name: str):
    # re-exported, imported on first use: `bisect_tui.cli.options_from_args`, `.commands`
    if name == "options_from_args":
        from bisect_tui.options import options_from_args

        return options_from_args
    if name in ("commands", "compare_cli"):
        import importlib

        return importlib.import_module(f"bisect_tui.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

EPILOG = """exit codes: 0 within tolerance / nothing to find, 1 tolerance broken / culprits found,
2 usage or bad input, 3 baseline not deterministic, 4 NaN/Inf in the baseline,
5 environment fault (disk full, permission), 6 bisect: the engine cannot build or run the model at all,
70 internal error (a bug, see the log), 130 interrupted, 141 the output was closed (| head)"""

def build_parser() -> argparse.ArgumentParser:
    from bisect_tui import compare_cli
    from bisect_tui.options import Parser, add_model_options, device_list, positive_int

    p = Parser(
        prog="bisect-tui",
        description="Find the fused operator that makes an optimized inference engine break tolerance. "
        "With no command, opens the app.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"bisect-tui {__version__}")
    sub = p.add_subparsers(dest="command", parser_class=Parser)
    c = sub.add_parser("check", help="baseline, determinism, range check, fused engine, comparison",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_options(c)
    b = sub.add_parser("bisect", help="find the fused op(s) that break tolerance",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_options(b)
    b.add_argument("--bundle", type=Path, metavar="FILE.zip", help="write a minimal repro bundle")
    b.add_argument("--max-builds", type=int, default=200, help="stop after this many engine builds")
    b.add_argument("--max-culprits", type=int, default=5,
                   help="stop after this many culprits (default 5; many usually means amplified rounding)")
    b.add_argument("--workers", type=positive_int, default=None, metavar="N",
                   help="engine builds at once, in worker processes (default: one per core, at most 8; "
                        "asked for, or with --fanout > 1, they start at once and import the engine while "
                        "the baseline runs); the result and the build count do not depend on it")
    b.add_argument("--devices", type=device_list, default=None, metavar="LIST",
                   help="one build worker per accelerator, e.g. 0,1,2,3: each worker sees only its own "
                        "(CUDA_VISIBLE_DEVICES), this process the first; sets --workers to their number")
    b.add_argument("--ray", metavar="ADDRESS", default=None,
                   help="build on Ray actors instead of local processes, one per worker (--workers N): "
                        "'local' starts Ray on this machine, else a cluster address for ray.init "
                        "('auto', 'ray://HEAD:10001'); needs the extra: pip install -e '.[ray]' from a clone")
    b.add_argument("--fanout", type=positive_int, default=1, metavar="K",
                   help="candidates the search builds per round (default 1: binary search; K > 1: "
                        "K split points per round, fewer rounds for more builds, for K workers)")
    b.add_argument("--no-probe", action="store_true",
                   help="search by builds alone: skip the fused-graph probe that names suspects to try first")
    tu = sub.add_parser("tui", help="open the app on a model")
    add_model_options(tu)
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
    from bisect_tui.core.errors import EnvironmentFault
    from bisect_tui.core.escape import term

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


def _default_sigterm_in_child() -> None:
    # a library's forked child (a telemetry sender) is not ours to unwind: it
    # printed a KeyboardInterrupt traceback after our clean one-line error
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


_FORK_HOOK = []


def _install_signals() -> None:
    if not _FORK_HOOK and hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_default_sigterm_in_child)
        _FORK_HOOK.append(True)
    try:
        signal.signal(signal.SIGTERM, _on_sigterm)
        if hasattr(signal, "SIGXFSZ"):  # a file-size limit becomes EFBIG, not a silent kill
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    except ValueError:
        pass  # not the main thread (tests driving main from a worker)


MAX_ARGS = 4096


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Every outcome maps to a documented exit code; no traceback reaches the user,
    and an internal error never exits with a verdict's code."""
    given = list(sys.argv[1:] if argv is None else argv)
    from bisect_tui.core import startup_gc

    try:
        return _main(given)
    finally:
        startup_gc.resume()  # paused by entry() for a check or bisect (startup_gc.py)


def _main(given: list[str]) -> int:
    from bisect_tui import commands, compare_cli
    from bisect_tui.core.errors import Cancelled, ExitCode, UserError
    from bisect_tui.core.escape import term

    if len(given) > MAX_ARGS:
        # argparse's time grows with the square of the options given: 10,000
        # repeated flags took 4 s before a word was said
        print(f"bisect-tui: error: {len(given):,} command-line arguments; at most {MAX_ARGS:,} are accepted "
              "(a keep-set or mark list that long belongs in the model, or in a --session resumed)",
              file=sys.stderr)
        return int(ExitCode.USAGE)
    parser = build_parser()
    args = parser.parse_args(given)
    handlers = {"check": commands.cmd_check, "bisect": commands.cmd_bisect, "tui": commands.cmd_tui,
                "resume": commands.cmd_resume, "sessions": commands.cmd_sessions, "compare": compare_cli.run}
    from bisect_tui.core import safepath, session as _session
    from bisect_tui.engine_choice import install_registry

    install_registry()  # the core's triages load the registry's engines by name
    _install_signals()
    opened = len(_session._ACTIVE)
    from bisect_tui.libnoise import LibraryNoise

    noise = LibraryNoise().start()  # libraries' warnings to the session's log, one line here
    try:
        if args.command is None:
            return commands.cmd_tui(None)
        return handlers[args.command](args)
    except UserError as exc:
        print(f"bisect-tui: error: {term(exc)}", file=sys.stderr)
        return int(exc.code)
    except (KeyboardInterrupt, Cancelled):
        print("\nbisect-tui: interrupted; rerun the same command to resume from the session directory",
              file=sys.stderr)
        return int(ExitCode.CANCELLED)
    except Exception as exc:
        closed = _closed_streams() if isinstance(exc, BrokenPipeError) else []
        if closed:  # the user's `| head`, not one of our own pipes (a worker's, the second run's: a bug, below)
            _quiet_closed(closed)
            return int(ExitCode.OUTPUT_CLOSED)
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
        second = sys.modules.get("bisect_tui.core.second_run")
        if second is not None:  # a prestarted interpreter nobody took: gone before we return
            second.stop_prestarted()
            second.abort_all()  # reaped before the sweep below: nothing writes into tmp/ after it
        root = _session.active_root() if len(_session._ACTIVE) > opened else None
        said = noise.finish(root)
        if said:
            print(term(said, keep_newlines=True), file=sys.stderr)
        safepath.release_session_temp(root)
        del _session._ACTIVE[opened:]


def _closed_streams() -> list:
    """Our stdout and stderr among those that are pipes whose reader has gone (poll
    says POLLERR or POLLHUP): a BrokenPipeError from there is the user's `| head`,
    not one of our own pipes."""
    import select

    out = []
    for stream in (sys.stdout, sys.stderr):
        try:
            p = select.poll()
            p.register(stream.fileno(), select.POLLOUT)
            if any(ev & (select.POLLERR | select.POLLHUP) for _, ev in p.poll(0)):
                out.append(stream)
        except (AttributeError, OSError, ValueError):
            pass
    return out


def _quiet_closed(closed: list) -> None:
    """Further writes and the final flush of a closed stream go nowhere instead of
    failing again (the buffered rest would raise at exit); one line on stderr
    where it still reads."""
    for stream in closed:
        try:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, stream.fileno())
            os.close(null)
        except (AttributeError, OSError, ValueError):
            pass
    if sys.stderr not in closed:
        try:
            print("bisect-tui: the output was closed (the command reading it exited); stopped here, the "
                  "session keeps what was done: rerun the same command to resume", file=sys.stderr)
        except (OSError, ValueError):
            pass


def _prestart_early(argv: Sequence[str]) -> None:
    """Start the determinism check's second interpreter before this one imports
    anything else (numpy, onnx, the engine contract, the options): on a small
    model that interpreter's imports are the longest path of the command, and each
    module imported before it started made the whole command later by as much.

    The command line is only glanced at: check or bisect, and nothing that may be
    --no-determinism (or an abbreviation argparse would take for it) or --help. A
    guess either way changes no answer: the command's own prestart adopts this
    interpreter or starts one, an unused one is killed when main() ends."""
    if not argv or argv[0] not in ("check", "bisect") or len(argv) > MAX_ARGS:
        return
    for a in argv[1:]:
        flag = a.split("=", 1)[0]
        if flag in ("-h", "--help", "--") or (len(flag) > 4 and "--no-determinism".startswith(flag)):
            return
    from bisect_tui.core.second_run import prestart
    from bisect_tui.engines.registry import default_reference

    prestart(default_reference().spec)


def entry() -> None:
    """The console script: main(), then a quick exit.

    By the time main() returns, every file of the run is written and closed
    (atomic writes, the session, the reports) and its workers are stopped;
    what is left for the interpreter is tearing down the engine's library, numpy and
    the model's thousands of protobuf objects: 50-200 ms that nobody waits
    for. The exit handlers (a determinism run to stop) and the streams are
    run and flushed first; the code is main()'s."""
    from bisect_tui.core.threads import limit_blas

    limit_blas(os.environ)  # before numpy loads its BLAS (core/threads.py)
    _prestart_early(sys.argv[1:])
    if sys.argv[1:2] in (["check"], ["bisect"]):
        from bisect_tui.core import background, startup_gc

        startup_gc.pause()  # this process only: main() called in-process (tests) never freezes
        background.exit_soon()  # the os._exit below: the last engines are left to it
    try:
        code = main()
    finally:  # argparse's SystemExit (--help, a usage error) leaves main() before its own cleanup
        second = sys.modules.get("bisect_tui.core.second_run")
        if second is not None:
            second.stop_prestarted()
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
