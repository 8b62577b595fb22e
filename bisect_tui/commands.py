"""The subcommands' work: `check`, `bisect`, `tui`, `resume`, `sessions`.

cli.py parses and maps outcomes to exit codes; each command here chooses its
engine through the registry (engine_choice.py) and hands it to the core.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Optional

from bisect_tui.core import startup_gc
from bisect_tui.core.escape import term
from bisect_tui.options import options_from_args


def cmd_check(args: argparse.Namespace) -> int:
    _prestart_second_run(args)
    from bisect_tui.core.pipeline import Triage
    from bisect_tui.core.report import check_text
    from bisect_tui.engine_choice import engine_factory
    from bisect_tui.progress_text import TextProgress

    opts = options_from_args(args)
    startup_gc.imports_done()
    progress = TextProgress(enabled=not args.quiet)
    triage = Triage(opts, progress, engine_factory=engine_factory(opts.engine))
    try:
        summary = triage.run_all()
    finally:
        progress.close()
    print(term(check_text(summary), keep_newlines=True))
    from bisect_tui.core.bisect.command import export_session, write_json_copy, write_report_copy

    full, _, paths = export_session(triage, summary, None, with_plots=bool(args.report))
    if args.json:
        write_json_copy(paths, args.json)
    if args.report:
        write_report_copy(full, args.report)
    if getattr(args, "model_explorer", None):
        from bisect_tui.core.report.model_explorer import write_model_explorer

        write_model_explorer(triage.session.root, args.model_explorer)
    return summary["exit_code"]


def _prestart_second_run(args: argparse.Namespace) -> None:
    if not getattr(args, "no_determinism", False):
        from bisect_tui.core.second_run import prestart
        from bisect_tui.engines.registry import default_reference

        prestart(default_reference().spec)  # its imports overlap ours (the determinism check's fresh process)


def cmd_bisect(args: argparse.Namespace) -> int:
    _prestart_second_run(args)
    from bisect_tui.core.bisect.command import run_bisect_command

    opts = options_from_args(args)
    startup_gc.imports_done()
    return run_bisect_command(args, opts)


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

    from bisect_tui.engines.registry import get_engine

    opts = options_from_session(args.session, get_engine)
    if args.headless:
        from bisect_tui.core.bisect.command import run_bisect_command

        ns = argparse.Namespace(json=None, report=None, bundle=None, quiet=args.quiet, max_builds=200,
                                max_culprits=5)
        return run_bisect_command(ns, opts)
    from bisect_tui.tui.app import make_app

    app = make_app(options=opts, resume=True)
    app.run()
    return int(app.return_code or 0)
