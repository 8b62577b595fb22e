"""`bisect-tui bisect`: the checklist, then the search, headless."""

from __future__ import annotations

from pathlib import Path

from bisect_tui import __version__
from bisect_tui.core import atomic
from bisect_tui.core.errors import ExitCode
from bisect_tui.core.escape import term


def bisect_exit(result: dict) -> ExitCode:
    return ExitCode.OK if result["verdict"] == "pass" else ExitCode.TOLERANCE


def export_session(triage, summary: dict, result, plots: dict | None = None) -> tuple[dict, str, dict]:
    """Write report.md, report.json and (with culprits) bundle.zip into the
    session directory: the one export shared by the CLI and the app.

    Returns the full JSON, the Markdown and the paths written."""
    from bisect_tui.core.bisect.bundle import write_bundle
    from bisect_tui.core.report import bisect_markdown, check_markdown

    session = triage.session
    full = {**summary, "bisect": result} if result else dict(summary)
    if plots:
        from bisect_tui.core.plots import plot_links

        full["plots"] = plot_links(plots, session.path("report.md"))
    md = bisect_markdown(full) if result else check_markdown(full)
    atomic.write_text(session.path("report.md"), md)
    session.write_json("report.json", full)
    paths = {"report.md": str(session.path("report.md")), "report.json": str(session.path("report.json"))}
    if result and (result.get("culprits") or (result.get("precision") or {}).get("passed")):
        isolated = [c for c in result.get("culprits", []) if (c.get("isolated") or {}).get("subgraph")]
        paths["bundle.zip"] = str(write_bundle(session.path("bundle.zip"), isolated, summary["config"],
                                               triage.opts.tolerance.default.to_dict(), md, __version__))
        if (result.get("precision") or {}).get("passed") or result.get("engine_error"):
            from bisect_tui.core.bisect.keepset_bundle import add_keepset_repro

            add_keepset_repro(Path(paths["bundle.zip"]), triage, result, __version__)
    return full, md, paths


def run_bisect_command(args, opts) -> int:
    from bisect_tui.core.bisect.run import run_bisection
    from bisect_tui.core.pipeline import Triage
    from bisect_tui.core.plots import plot_links
    from bisect_tui.core.report import bisect_markdown, bisect_text, check_text
    from bisect_tui.progress_text import TextProgress

    progress = TextProgress(enabled=not getattr(args, "quiet", False))
    triage = Triage(opts, progress)
    try:
        summary = triage.run_all()
        if summary["verdict"] in ("nondeterministic", "nan_inf", "export_mismatch"):
            progress.close()
            print(term(check_text(summary), keep_newlines=True))
            return summary["exit_code"]
        result = run_bisection(triage, max_builds=getattr(args, "max_builds", 200),
                               max_culprits=getattr(args, "max_culprits", 5))
    finally:
        progress.close()
    report = getattr(args, "report", None)
    plots = {}
    if report:  # pictures cost a matplotlib import: only for a report asked for
        from bisect_tui.core.plots import write_plots

        plots = write_plots(triage.session.path("plots"), summary["outputs"])
    full, md, paths = export_session(triage, summary, result, plots)
    print(term(check_text(summary), keep_newlines=True))
    print(term(bisect_text(full), keep_newlines=True))
    if getattr(args, "json", None):
        atomic.write_json(args.json, full)
    if report:  # links re-made relative to where this copy lives
        atomic.write_text(report, bisect_markdown({**full, "plots": plot_links(plots, report)}))
    if getattr(args, "bundle", None):
        if "bundle.zip" not in paths:
            print("no culprit, so no repro bundle was written")
        else:
            with open(paths["bundle.zip"], "rb") as fh:
                atomic.write_bytes(args.bundle, fh.read())
    return int(bisect_exit(result))
