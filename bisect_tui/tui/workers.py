"""The app's engine work, in worker threads: the checklist's steps, the
bisection, the session's restore, the export and the value plots.

Threading rule: engine work runs only in `@work(thread=True, group="engine")`
workers that get the worker's `cancelled_event` as their CancelToken. These
methods never touch widgets; they post messages (messages.py) that the
handlers (handlers.py) turn into state updates.
"""

from __future__ import annotations

import traceback
from pathlib import Path
from typing import Optional

from textual import work
from textual.worker import get_current_worker

from bisect_tui.core.bisect.records import BisectResult, Step
from bisect_tui.core.cancel import CancelToken, Progress
from bisect_tui.core.errors import Cancelled, UserError
from bisect_tui.core.pipeline import Triage
from bisect_tui.core.triage.records import OutputVerdict
from bisect_tui.tui.format import short, show_path
from bisect_tui.tui.messages import (
    BisectFinished,
    BisectInterrupted,
    BisectStep,
    EngineProgress,
    ExportDone,
    StepFinished,
    StepStarted,
    StepStopped,
    WorkDone,
)
from bisect_tui.tui.state import info_payload


class EngineWorkers:
    """The worker half of `BisectApp` (a mixin of the App)."""

    def _progress(self, p: Progress) -> None:
        """Called in the worker thread by the core: only posts messages."""
        data = dict(p.data or {})
        step = data.pop("step", None)
        if p.stage == "bisect" and step is not None:
            self.post_message(BisectStep(step if isinstance(step, Step) else Step.from_json(step)))
        self.post_message(EngineProgress(p.stage, p.message, p.done, p.total, data))

    def _arm(self, t: Triage) -> None:
        worker = get_current_worker()
        t.progress = self._progress
        t.cancel = CancelToken(worker.cancelled_event)

    def _run_plan(self, t: Triage, plan: list[str], stop_on_bad: bool, cur: list) -> bool:
        """Run checklist steps in this thread; True when a bad baseline stopped the run."""
        for step in plan:
            cur[0] = step
            self.post_message(StepStarted(step))
            record = summary = None
            payload: dict = {}
            if step == "inputs":
                t.prepare()
                payload = {"info": info_payload(t.info),
                           "inputs": {"arrays": t.inputs.describe(), "source": dict(t.inputs.source)},
                           "session": str(t.session.root)}
                state = "passed"
            elif step == "baseline":
                res = t.run_baseline()
                payload = {"manifest": res.manifest, "reused": res.reused}
                state = "passed"
            elif step == "determinism":
                t.run_determinism()
                record = t.determinism_result
                state = "skipped" if record.skipped else ("passed" if record.deterministic else "failed")
            elif step == "range_check":
                t.run_range_check()
                record = t.range_result
                state = "passed" if record.ok else "failed"
            elif step == "fused":
                t.run_framework()  # PyTorch models only: golden data and the export cross-check
                t.run_fused()
                t.run_arbiter()
                record, summary = t.check, t.summary_record()
                state = "passed" if record.passed else "failed"
            else:  # pragma: no cover - plans only hold engine steps
                continue
            self.post_message(StepFinished(step, state, payload, record, summary))
            if stop_on_bad and step == "determinism" and record.deterministic is False:
                self.post_message(StepStopped(None, "halt", "stopped: the baseline is not deterministic: "
                                              + (record.advice or "fix it first")))
                return True
            if stop_on_bad and step == "range_check" and record.nan_inf:
                origin = record.nan_inf_origin
                self.post_message(StepStopped(None, "halt", "stopped: NaN/Inf in the baseline: "
                                              + (origin["advice"] if origin else "fix the model or inputs first")))
                return True
        return False

    def _fail_text(self, exc: BaseException) -> str:
        root = self.state.session_root if self.state else None
        where = ""
        if root is not None and Path(root).is_dir():
            try:
                log = Path(root) / "tui-error.log"
                log.write_text("".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
                               encoding="utf-8")
                where = f" (traceback in {show_path(log)})"
            except OSError:
                pass
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return f"internal error: {type(exc).__name__}: {short(first, 160)}{where}"

    @work(thread=True, exclusive=True, group="engine", exit_on_error=False)
    def _engine_worker(self, plan: list[str], stop_on_bad: bool, then_bisect: bool) -> None:
        from bisect_tui.core.bisect.search import BuildBudgetExceeded

        kind = "bisect" if then_bisect else "checks"
        outcome = "done"
        cur: list = [None]
        t = self.triage
        try:
            self._arm(t)
            halted = self._run_plan(t, plan, stop_on_bad, cur)
            if halted:
                outcome = "halted"
                if then_bisect:
                    self.post_message(StepStopped("bisect", "halt", "the bisection needs a sane baseline"))
            elif then_bisect:
                from bisect_tui.core.bisect.run import run_bisection

                cur[0] = "bisect"
                result = run_bisection(t, max_builds=self.max_builds)  # its JSON, as written to the session
                self.post_message(BisectFinished(BisectResult.from_json(result), t.summary_record()))
        except Cancelled:
            outcome = "cancelled"
            self.post_message(StepStopped(cur[0], "cancelled", "cancelled"))
        except (UserError, BuildBudgetExceeded) as exc:
            outcome = "error"
            suggestion = getattr(exc, "suggestion", None)
            self.post_message(StepStopped(cur[0], "error", str(exc), suggestion))
        except Exception as exc:  # a bug: still one line on screen, traceback in the session
            outcome = "error"
            self.post_message(StepStopped(cur[0], "error", self._fail_text(exc)))
        finally:
            self.post_message(WorkDone(kind, outcome))

    @work(thread=True, exclusive=True, group="engine", exit_on_error=False)
    def _restore_worker(self, plan: list[str], bisect_state: Optional[str]) -> None:
        outcome = "done"
        cur: list = [None]
        t = self.triage
        try:
            self._arm(t)
            self._run_plan(t, plan, False, cur)
            if bisect_state in ("passed", "failed") and t.check is not None:
                result = t.session.read_json("bisect/result.json")
                if result:
                    self.post_message(BisectFinished(BisectResult.from_json(result), t.summary_record(),
                                                     loaded=True))
            elif bisect_state in ("running", "cancelled"):
                path = t.session.bisect_dir / "steps.jsonl"
                n = len(path.read_text(encoding="utf-8").splitlines()) if path.exists() else 0
                self.post_message(BisectInterrupted(n))
        except Cancelled:
            outcome = "cancelled"
            self.post_message(StepStopped(cur[0], "cancelled", "cancelled"))
        except UserError as exc:
            outcome = "error"
            self.post_message(StepStopped(cur[0], "error", str(exc)))
        except Exception as exc:
            outcome = "error"
            self.post_message(StepStopped(cur[0], "error", self._fail_text(exc)))
        finally:
            self.post_message(WorkDone("restore", outcome))

    @work(thread=True, exclusive=True, group="engine", exit_on_error=False)
    def _export_worker(self, result: Optional[BisectResult], copy: bool) -> None:
        outcome = "done"
        t = self.triage
        try:
            paths, md = self.write_outputs(t, result)
            self.post_message(ExportDone(paths, md, copy))
        except UserError as exc:
            outcome = "error"
            self.post_message(StepStopped(None, "error", str(exc)))
        except Exception as exc:
            outcome = "error"
            self.post_message(StepStopped(None, "error", self._fail_text(exc)))
        finally:
            self.post_message(WorkDone("export", outcome))

    def write_outputs(self, t: Triage, result: Optional[BisectResult]) -> tuple[dict, str]:
        """The session's report.md/json, plots and bundle, plus `tui --json/--report`
        copies: the same files the CLI writes, from the same JSON (the record's, made
        here: the files are the edge). Safe to call from a worker thread."""
        from bisect_tui.core.bisect.command import export_session, write_json_copy, write_report_copy
        from bisect_tui.core.report.model_explorer import write_model_explorer

        full, md, paths = export_session(t, t.summary(), result.to_json() if result is not None else None)
        paths["model-explorer.json"] = str(write_model_explorer(t.session.root))
        if self.output_json:
            write_json_copy(paths, self.output_json)
            paths["--json"] = str(self.output_json)
        if self.output_report:
            write_report_copy(full, self.output_report)
            paths["--report"] = str(self.output_report)
        self._outputs_written_for = (id(t.check), id(result))
        return paths, md

    def save_value_plot(self, output: Optional[str]) -> None:
        """p: the selected output's baseline/fused value histograms overlaid, as a PNG."""
        st = self.state
        if st is None or not st.fused or not output or st.session_root is None:
            self.set_status("nothing to plot yet: run the comparison first (a runs every check)", error=True)
            return
        self.set_status(f"drawing the value histograms of {output}...")
        self._plot_worker(output, st.fused.outputs[output], Path(st.session_root) / "plots")

    @work(thread=True, group="plot", exit_on_error=False)
    def _plot_worker(self, output: str, o: OutputVerdict, folder: Path) -> None:
        from bisect_tui.core.escape import safe_filename
        from bisect_tui.core.plots import value_histograms

        try:
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / f"{safe_filename(output)}.png"
            ok = value_histograms(path, output, o)
            text = f"saved {show_path(path)}: baseline and fused values overlaid, and the error" if ok \
                else f"{output}: no histogram to draw"
        except OSError as exc:
            text = f"error: could not write the plot: {exc}"
        self.call_from_thread(self.set_status, text, text.startswith("error"))

    def _write_outputs_on_quit(self) -> None:
        """`tui --json/--report` promise files: write what the app holds when it closes."""
        if not (self.output_json or self.output_report) or self.busy:
            return
        t, st = self.triage, self.state
        if t is None or t.check is None or st is None:
            return
        result = st.bisect.result
        if self._outputs_written_for == (id(t.check), id(result)):
            return
        try:
            self.write_outputs(t, result)
        except (UserError, OSError) as exc:
            self.set_status(f"error: could not write --json/--report: {exc}", error=True)
