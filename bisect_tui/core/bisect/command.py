"""`bisect-tui bisect`: the checklist, then the search, headless."""

from __future__ import annotations

from pathlib import Path

from bisect_tui import __version__
from bisect_tui.core import atomic
from bisect_tui.core.errors import ExitCode


def bisect_exit(result: dict) -> ExitCode:
    return ExitCode.OK if result["verdict"] == "pass" else ExitCode.TOLERANCE


def run_bisect_command(args, opts) -> int:
    from bisect_tui.core.bisect.bundle import write_bundle
    from bisect_tui.core.bisect.run import run_bisection
    from bisect_tui.core.pipeline import Triage
    from bisect_tui.core.report import bisect_markdown, bisect_text, check_text
    from bisect_tui.progress_text import TextProgress

    progress = TextProgress(enabled=not getattr(args, "quiet", False))
    triage = Triage(opts, progress)
    try:
        summary = triage.run_all()
        if summary["verdict"] in ("nondeterministic", "nan_inf"):
            progress.close()
            print(check_text(summary))
            return summary["exit_code"]
        result = run_bisection(triage, max_builds=getattr(args, "max_builds", 200),
                               max_culprits=getattr(args, "max_culprits", 5))
    finally:
        progress.close()
    from bisect_tui.core.plots import write_plots

    full = {**summary, "bisect": result}
    if getattr(args, "report", None):  # pictures cost a matplotlib import: only for a report asked for
        plots = write_plots(triage.session.path("plots"), summary["outputs"])
        full["plots"] = {k: str(Path(v).relative_to(triage.session.root)) for k, v in plots.items()}
    md = bisect_markdown(full)
    print(check_text(summary))
    print(bisect_text(full))
    session = triage.session
    atomic.write_text(session.path("report.md"), md)
    session.write_json("report.json", full)
    bundle_path = None
    if result["culprits"]:
        bundle_path = write_bundle(session.path("bundle.zip"), result["culprits"], summary["config"],
                                   opts.tolerance.default.to_dict(), md, __version__)
    if getattr(args, "json", None):
        atomic.write_json(args.json, full)
    if getattr(args, "report", None):
        atomic.write_text(args.report, md)
    if getattr(args, "bundle", None):
        if bundle_path is None:
            print("no culprit, so no repro bundle was written")
        else:
            atomic.write_bytes(args.bundle, bundle_path.read_bytes())
    return int(bisect_exit(result))
