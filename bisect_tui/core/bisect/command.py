"""`bisect-tui bisect`: the checklist, then the search, headless."""

from __future__ import annotations

import functools
import os
from pathlib import Path

from bisect_tui import __version__
from bisect_tui.core import atomic
from bisect_tui.core.errors import ExitCode
from bisect_tui.core.escape import term


def bisect_exit(result: dict) -> ExitCode:
    if result["verdict"] == "engine_error":
        return ExitCode.ENGINE
    return ExitCode.OK if result["verdict"] == "pass" else ExitCode.TOLERANCE


def export_session(triage, summary: dict, result, with_plots: bool = True) -> tuple[dict, str, dict]:
    """Write report.md, report.json, plots/ and (with culprits) bundle.zip into the
    session directory: the one export shared by the CLI and the app.

    Returns the full JSON, the Markdown and the paths written ("plots" maps each
    plot's name to its file)."""
    from bisect_tui.core.bisect.bundle import write_bundle
    from bisect_tui.core.plots import plot_links, write_plots
    from bisect_tui.core.report import bisect_markdown, check_markdown
    from bisect_tui.core.report.summary import BUNDLE_KEY, bundle_plan

    session = triage.session
    full = {**summary, "bisect": result} if result else dict(summary)
    full[BUNDLE_KEY] = bundle_plan(result, triage.engine.capabilities.keep_high_precision)  # the report names only it
    plots = {}
    if with_plots:
        plots = write_plots(session.path("plots"), summary["outputs"], summary.get("shared_tensors"), result)
        full["plots"] = plot_links(plots, session.path("report.md"))
    md = bisect_markdown(full, base=session.root) if result else check_markdown(full, base=session.root)
    atomic.write_text(session.path("report.md"), md)
    session.write_json("report.json", public_json(full))
    paths = {"report.md": str(session.path("report.md")), "report.json": str(session.path("report.json"))}
    if full[BUNDLE_KEY] is not None:
        isolated = [c for c in result.get("culprits", []) if (c.get("isolated") or {}).get("subgraph")]
        paths["bundle.zip"] = str(write_bundle(session.path("bundle.zip"), isolated, summary["config"],
                                               triage.opts.tolerance.default.to_dict(), md, __version__,
                                               triage.engine, result.get("workaround")))
        # the keep-set repro is the engine's own (it knows its precision pin)
        keepset = (result.get("precision") or {}).get("kind") != "precision_setting"
        if keepset and ((result.get("precision") or {}).get("passed") or result.get("engine_error")):
            triage.engine.add_keepset_repro(Path(paths["bundle.zip"]), triage, result, __version__)
        _attach_plots(paths["bundle.zip"], plots)
    full["_plot_files"] = plots
    return full, md, paths


def _attach_plots(bundle, plots: dict) -> None:
    """The pictures the report names travel with it, under plots/ in the bundle."""
    import zipfile

    with zipfile.ZipFile(bundle, "a", compression=zipfile.ZIP_DEFLATED) as z:
        have = set(z.namelist())
        for path in plots.values():
            arc = f"plots/{Path(path).name}"
            if arc not in have:
                z.write(path, arc)


def write_report_copy(full: dict, report_path) -> None:
    """The user's --report FILE.md: the plots copied next to it (FILE-plots/), so
    the folder can be attached to an issue as it is, with links relative to it."""
    import shutil

    from bisect_tui.core.escape import safe_filename
    from bisect_tui.core.plots import plot_links
    from bisect_tui.core.report import bisect_markdown, check_markdown

    report = Path(report_path)
    plots = full.get("_plot_files") or {}
    copied = {}
    if plots:
        folder = report.parent / f"{safe_filename(report.stem)}-plots"
        folder.mkdir(parents=True, exist_ok=True)
        for name, path in plots.items():
            dest = folder / Path(path).name
            shutil.copyfile(path, dest)
            copied[name] = str(dest)
    view = {k: v for k, v in full.items() if k != "_plot_files"}
    view["plots"] = plot_links(copied, report)
    md = bisect_markdown(view, base=report.parent) if view.get("bisect") else check_markdown(view, base=report.parent)
    atomic.write_text(report, md)


def write_json_copy(paths: dict, target) -> None:
    """The user's --json FILE: report.json's bytes, just written from the same object
    (at 21,000 nodes a second serialisation cost 0.09 s)."""
    atomic.write_bytes(Path(target), Path(paths["report.json"]).read_bytes())


def public_json(full: dict) -> dict:
    return {k: v for k, v in full.items() if k not in ("_plot_files", "plots", "_bundle")}


def start_pool(engine_factory, workers: int, ray_address=None, now: bool = True, devices=None):
    """The build pool, made before the checklist runs. Started `now`, its workers
    load the engine (`engine_factory()`, in each) while this process makes the
    baseline; otherwise it starts when builds prove slow
    (pool.LAZY_START_BUILD_SECONDS)."""
    if ray_address:
        from bisect_tui.core.bisect.ray_pool import RayBuildPool

        pool = RayBuildPool(ray_address, workers, engine_factory)
    else:
        from bisect_tui.core.bisect.pool import BuildPool

        pool = BuildPool(workers, engine_factory, devices)
    if now:
        pool.start()
    return pool


def run_bisect_command(args, opts) -> int:
    from bisect_tui.core.bisect.run import run_bisection
    from bisect_tui.core.pipeline import Triage
    from bisect_tui.core.report import bisect_text, check_text
    from bisect_tui.progress_text import TextProgress

    from bisect_tui.core.bisect.pool import default_workers

    progress = TextProgress(enabled=not getattr(args, "quiet", False))
    asked = getattr(args, "workers", None)
    workers = asked or default_workers()
    fanout = getattr(args, "fanout", 1) or 1
    ray = getattr(args, "ray", None)
    # First of all, when parallel builds were asked for: the workers import the
    # engine while this process makes the baseline. The default (one worker per
    # core, binary search) starts them only once builds prove slow.
    devices = getattr(args, "devices", None)
    from bisect_tui.core.bisect.limits import check_parallelism

    check_parallelism(len(devices) if devices else workers, fanout, bool(ray))
    if devices and ray:
        from bisect_tui.core.errors import UserError

        raise UserError("--devices is for local worker processes; on Ray, GPUs are the cluster's "
                        "to assign (give the actors num_gpus there)")
    if devices:
        # this process builds on the first device; it must see only that one before any engine loads
        os.environ["CUDA_VISIBLE_DEVICES"] = devices[0]
    from bisect_tui.core.bisect.limits import precheck_build_memory

    precheck_build_memory(opts)  # a --max-memory below one whole-graph build: refused before the dump
    triage = Triage(opts, progress)  # loads no engine yet: its factory is for the workers
    pool = start_pool(triage.engine_factory, workers, ray,
                      now=bool(ray) or fanout > 1 or (asked or 1) > 1 or bool(devices), devices=devices)
    triage.search_ahead = fanout == 1 and not ray  # the blocked build starts while the check runs
    if triage.search_ahead:
        from bisect_tui.core.bisect.early import start_attribution_build

        # the probe's suspect without its pass, built from the moment the probe names it
        triage.after_probe = functools.partial(start_attribution_build, triage)
    try:
        summary = triage.run_all()
        if triage.search_ahead and summary["verdict"] == "fail":
            from bisect_tui.core.bisect.early import start_attribution_build

            start_attribution_build(triage)  # where the check's hook did not (a check.json reused)
        if summary["verdict"] in ("nondeterministic", "nan_inf", "export_mismatch"):
            progress.close()
            print(term(check_text(summary), keep_newlines=True))
            return summary["exit_code"]
        result = run_bisection(triage, max_builds=getattr(args, "max_builds", 200),
                               max_culprits=getattr(args, "max_culprits", 5),
                               workers=workers, fanout=fanout,
                               use_probe=not getattr(args, "no_probe", False), pool=pool)
    finally:
        from bisect_tui.core import background

        background.run_later(last=True)  # what the check and the search left (close_later)
        pool.close()
        progress.close()
    report = getattr(args, "report", None)
    # pictures cost a matplotlib import: only for a report asked for
    full, md, paths = export_session(triage, summary, result, with_plots=bool(report))
    print(term(check_text(summary, bisecting=True), keep_newlines=True))
    print(term(bisect_text(full), keep_newlines=True))
    if getattr(args, "json", None):
        write_json_copy(paths, args.json)
    if report:
        write_report_copy(full, report)
    if getattr(args, "model_explorer", None):
        from bisect_tui.core.report.model_explorer import write_model_explorer

        write_model_explorer(triage.session.root, args.model_explorer)
    if getattr(args, "bundle", None):
        if "bundle.zip" not in paths:
            print("no culprit, so no repro bundle was written")
        else:
            with open(paths["bundle.zip"], "rb") as fh:
                atomic.write_bytes(args.bundle, fh.read())
    return int(bisect_exit(result))
