"""The bisect-tui app: picker -> checklist -> bisection, all engine work in threads.

Threading rule: engine work runs only in `@work(thread=True, group="engine")`
workers that get the worker's `cancelled_event` as their CancelToken. Worker
threads never touch widgets; they post messages (see messages.py) which the
handlers below turn into `self.state` updates, then every screen on the stack
re-renders the part that changed (`state_changed(what)`).
"""

from __future__ import annotations

import traceback
from pathlib import Path
from typing import Optional

from textual import work
from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.worker import get_current_worker

from bisect_tui.core.cancel import CancelToken, Progress
from bisect_tui.core.errors import Cancelled, ExitCode, UserError
from bisect_tui.core.pipeline import Triage, TriageOptions
from bisect_tui.tui.format import relpath_or_name, short, show_path
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
from bisect_tui.tui.screens.bisection import BisectionScreen
from bisect_tui.tui.screens.checklist import ChecklistScreen
from bisect_tui.tui.screens.help import HelpScreen
from bisect_tui.tui.screens.picker import Picked, PickerScreen
from bisect_tui.tui.screens.settings import SettingsScreen
from bisect_tui.tui.state import ENGINE_STEPS, FINAL, BisectView, TriageState, info_payload
from bisect_tui.core.report import BISECT_VERDICT
from bisect_tui.tui.texts import STEP_NAME

# the checklist state of the bisection: finding a culprit is the search succeeding
BISECT_STATE = {"pass": "passed", "culprits": "found", "not_fusion": "unclear", "no_culprit": "unclear"}


def bisect_state(verdict: str) -> str:
    return BISECT_STATE.get(verdict, "unclear")

DEPS = {
    "inputs": (),
    "baseline": ("inputs",),
    "determinism": ("inputs", "baseline"),
    "range_check": ("inputs", "baseline"),
    "fused": ("inputs", "baseline"),
}
BISECT_STAGES = ("bisect", "isolate", "attribute", "workaround")


class BisectApp(App[int]):
    """Find the fused operator that breaks tolerance, step by step."""

    CSS_PATH = "app.tcss"
    TITLE = "bisect-tui"
    # the why panel goes beside the detail only from 140 columns: at 120 the tables need the width
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (140, "-wide")]
    # q and ? always fit the footer at 80 columns; the rest are in ? help and ctrl+p
    BINDINGS = [
        Binding("q", "quit_app", "Quit"),
        Binding("question_mark", "help", "Help"),
        Binding("l", "language", "中文/EN", show=False),
        Binding("s", "screenshot", "Screenshot", show=False),
    ]

    def __init__(self, options: Optional[TriageOptions] = None, resume: bool = False,
                 max_builds: int = 200, engine=None) -> None:
        super().__init__()
        self.engine = engine  # injected engine object (tests); None: the registry's, by name
        self.initial_options = options
        self.initial_resume = resume
        self.max_builds = max_builds
        self.lang = "en"
        self.state: Optional[TriageState] = None
        self.triage: Optional[Triage] = None
        self.busy: Optional[str] = None  # kind of engine work running: checks | bisect | export | restore
        self.status_text = ""
        self.status_error = False
        self.last_screenshot: Optional[str] = None
        self._restore_bisect: Optional[str] = None
        # `tui --json/--report`: written by every export and, for what was not exported, on quit
        self.output_json: Optional[Path] = None
        self.output_report: Optional[Path] = None
        self._outputs_written_for: Optional[tuple] = None
        self.why_shown = True  # w hides the why panels so tables get the width

    # ------------------------------------------------------------------ opening
    async def on_mount(self) -> None:
        if self.initial_options is None:
            await self.push_screen(PickerScreen())
        else:
            await self.open_options(self.initial_options, self.initial_resume)

    async def on_picked(self, message: Picked) -> None:
        await self.open_options(message.options, message.resume)

    async def open_options(self, options: TriageOptions, resume: bool = False) -> None:
        """Show the checklist for `options` (resume: reload what the session holds)."""
        if self.busy:
            self.notify("still working: press x to cancel first", severity="warning")
            return
        self.state = TriageState(options)
        if options.session_dir:
            self.state.session_dir = Path(options.session_dir)
        self.triage = None
        self.set_status("r runs the next step, a runs every check, b bisects, ? lists the keys")
        while len(self.screen_stack) > 1:
            await self.pop_screen()
        await self.push_screen(ChecklistScreen())
        if resume:
            self._start_restore()

    def open_picker(self) -> None:
        if self.busy:
            self.notify("still working: press x to cancel first", severity="warning")
            return
        self.push_screen(PickerScreen())

    def open_settings(self) -> None:
        if self.state is None:
            return
        if self.busy:
            self.notify("settings can change when nothing runs: press x to cancel first", severity="warning")
            return

        def done(opts: Optional[TriageOptions]) -> None:
            if opts is not None:
                self.apply_settings(opts)

        self.push_screen(SettingsScreen(self.state.options, suggestion=self.state.suggestion), done)

    def apply_settings(self, opts: TriageOptions) -> None:
        st = self.state
        assert st is not None
        changed = opts.to_dict() != st.options.to_dict()
        if opts.input_options() != st.options.input_options() or opts.session_dir != st.options.session_dir:
            # other inputs: another session (its own directory), every step again
            self.state = TriageState(opts)
            if opts.session_dir:
                self.state.session_dir = Path(opts.session_dir)
            self.triage = None
            self.state.set("settings", "passed")
            self.set_status("inputs changed: r runs every step again on the new inputs (their own session)")
            self.notify_screens("all")
            return
        st.options = opts
        st.set("settings", "passed")
        if changed:
            if self.triage is not None:
                self.triage.opts = opts
                self.triage.fused = None
            st.reset_engine_results()
            st.options_dirty = True
            self.set_status("settings applied: the comparison and the bisection will run again")
        else:
            self.set_status("settings unchanged")
        self.notify_screens("all")

    # ------------------------------------------------------------------ state -> screens
    def notify_screens(self, what: str) -> None:
        for screen in list(self.screen_stack):
            handler = getattr(screen, "state_changed", None)
            if handler is not None:
                handler(what)

    def set_status(self, text: str, error: bool = False, refresh: bool = True) -> None:
        self.status_text = text.splitlines()[0] if text else ""
        self.status_error = error
        if refresh:
            self.notify_screens("status")

    def header_subtitle(self) -> str:
        if self.state is None:
            return ""
        root = self.state.session_root
        return relpath_or_name(self.state.options.model) + (f"  ·  session {show_path(root)}" if root else "")

    def _begin(self, kind: str) -> None:
        self.busy = kind
        self.notify_screens("busy")

    def _get_triage(self) -> Triage:
        assert self.state is not None
        if self.triage is None:
            self.triage = Triage(self.state.options, engine=self.engine)
        return self.triage

    def _plan(self, targets: list[str]) -> list[str]:
        """The steps to run for `targets`, with whatever they need first, in checklist order."""
        t = self._get_triage()
        st = self.state
        assert st is not None
        have = {
            "inputs": t.inputs is not None and not st.options_dirty,
            "baseline": t.baseline is not None,
            "determinism": t.determinism is not None,
            "range_check": t.range_check is not None,
            "fused": t.fused is not None and not st.options_dirty,
        }
        plan: set[str] = set()
        for target in targets:
            plan.update(d for d in DEPS[target] if not have[d])
            plan.add(target)
        if st.options_dirty and "fused" in plan:
            plan.add("inputs")  # re-prepare: the session records the new engine settings
        return [s for s in ENGINE_STEPS if s in plan]

    # ------------------------------------------------------------------ commands
    def _refuse_if_busy(self) -> bool:
        if self.busy:
            self.notify(f"{self.busy} is running: wait, or press x to cancel it", severity="warning")
            return True
        if self.state is None:
            return True
        return False

    def run_next(self) -> Optional[str]:
        if self._refuse_if_busy():
            return None
        st = self.state
        step = st.next_step()
        if step is None:
            self.set_status("every check has run: b bisects, e exports the report")
            return None
        if step == "settings":
            st.set("settings", "passed")
            self.set_status("engine settings confirmed as shown; r runs the comparison")
            self.notify_screens("settings")
            return "settings"
        self._start_steps(self._plan([step]))
        return step

    def run_all(self) -> None:
        if self._refuse_if_busy():
            return
        st = self.state
        if st.states["settings"] not in FINAL:
            st.set("settings", "passed")
        targets = [s for s in ENGINE_STEPS if not st.done(s) or (s == "fused" and st.options_dirty)]
        if not targets:
            self.set_status("every check has run: b bisects, e exports the report")
            self.notify_screens("all")
            return
        self._start_steps(self._plan(targets), stop_on_bad=True)

    def _start_steps(self, plan: list[str], stop_on_bad: bool = False) -> None:
        st = self.state
        st.halted = ""
        self._begin("checks")
        self._engine_worker(plan, stop_on_bad, False)

    def start_bisect(self) -> None:
        if self._refuse_if_busy():
            return
        st = self.state
        if not isinstance(self.screen, BisectionScreen):
            self.push_screen(BisectionScreen())
        if st.states["settings"] not in FINAL:
            st.set("settings", "passed")
        t = self._get_triage()
        missing = [s for s in ENGINE_STEPS
                   if getattr(t, s) is None or (s == "fused" and st.options_dirty)]
        plan = self._plan(missing) if missing else []
        resumed = st.bisect.steps and st.bisect.status in ("cancelled", "interrupted")
        st.bisect = BisectView(status="running")
        st.set("bisect", "running")
        self.set_status("resuming the bisection: recorded steps are reused" if resumed
                        else "bisecting: x cancels, r resumes later")
        self._begin("bisect")
        self.notify_screens("bisect_reset")
        self._engine_worker(plan, True, True)

    def cancel_work(self) -> None:
        if not self.busy:
            self.set_status("nothing is running")
            return
        self.workers.cancel_group(self, "engine")
        self.set_status("cancelling: stops at the next safe point; what is written stays valid")

    def export(self, copy: bool = False) -> None:
        if self._refuse_if_busy():
            return
        st = self.state
        if st.fused is None or self.triage is None or self.triage.fused is None:
            self.set_status("nothing to export yet: run the comparison first (a runs every check)", error=True)
            return
        self._begin("export")
        self._export_worker(st.bisect.result, copy)

    def _start_restore(self) -> None:
        """Reload every step the session finished (all cached on disk), as it was."""
        from bisect_tui.core.session import Session

        st = self.state
        root = st.session_root
        meta = Session(root).meta() if root else {}
        steps = meta.get("steps", {})
        done = [s for s in ENGINE_STEPS if steps.get(s, {}).get("state") in FINAL]
        for s in ENGINE_STEPS:
            if steps.get(s, {}).get("state") == "running":
                st.set(s, "pending", "interrupted; r resumes it, finished parts are reused")
        self._restore_bisect = steps.get("bisect", {}).get("state")
        plan = self._plan(done) if done else []
        if not plan:
            self.set_status("session reopened: nothing had finished yet, r starts")
            self.notify_screens("all")
            return
        self.set_status("reopening the session: reloading finished steps...")
        self._begin("restore")
        self._restore_worker(plan, self._restore_bisect)

    # ------------------------------------------------------------------ workers (threads)
    def _progress(self, p: Progress) -> None:
        """Called in the worker thread by the core: only posts messages."""
        data = dict(p.data or {})
        step = data.pop("step", None)
        if p.stage == "bisect" and step is not None:
            self.post_message(BisectStep(dict(step)))
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
                d = t.run_determinism()
                payload = {"determinism": d}
                state = "skipped" if d.get("skipped") else ("passed" if d["deterministic"] else "failed")
            elif step == "range_check":
                rc = t.run_range_check()
                payload = {"range_check": rc}
                state = "passed" if rc["ok"] else "failed"
            elif step == "fused":
                t.run_framework()  # PyTorch models only: golden data and the export cross-check
                f = t.run_fused()
                t.run_arbiter()
                payload = {"fused": f, "summary": t.summary()}
                state = "passed" if f["passed"] else "failed"
            else:  # pragma: no cover - plans only hold engine steps
                continue
            self.post_message(StepFinished(step, state, payload))
            if stop_on_bad and step == "determinism" and t.determinism.get("deterministic") is False:
                self.post_message(StepStopped(None, "halt", "stopped: the baseline is not deterministic: "
                                              + (t.determinism.get("advice") or "fix it first")))
                return True
            if stop_on_bad and step == "range_check" and t.range_check["nan_inf"]:
                origin = t.range_check.get("nan_inf_origin")
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
                result = run_bisection(t, max_builds=self.max_builds)
                self.post_message(BisectFinished(result, t.summary()))
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
            if bisect_state in ("passed", "failed") and t.fused is not None:
                result = t.session.read_json("bisect/result.json")
                if result:
                    self.post_message(BisectFinished(result, t.summary(), loaded=True))
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
    def _export_worker(self, result: Optional[dict], copy: bool) -> None:
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

    def write_outputs(self, t: Triage, result: Optional[dict]) -> tuple[dict, str]:
        """The session's report.md/json, plots and bundle, plus `tui --json/--report`
        copies: the same files the CLI writes. Safe to call from a worker thread."""
        from bisect_tui.core import atomic
        from bisect_tui.core.bisect.command import export_session, public_json, write_report_copy

        full, md, paths = export_session(t, t.summary(), result)
        if self.output_json:
            atomic.write_json(self.output_json, public_json(full))
            paths["--json"] = str(self.output_json)
        if self.output_report:
            write_report_copy(full, self.output_report)
            paths["--report"] = str(self.output_report)
        self._outputs_written_for = (id(t.fused), id(result))
        return paths, md

    def save_value_plot(self, output: Optional[str]) -> None:
        """p: the selected output's baseline/fused value histograms overlaid, as a PNG."""
        st = self.state
        if st is None or not st.fused or not output or st.session_root is None:
            self.set_status("nothing to plot yet: run the comparison first (a runs every check)", error=True)
            return
        self.set_status(f"drawing the value histograms of {output}...")
        self._plot_worker(output, dict(st.fused["outputs"][output]), Path(st.session_root) / "plots")

    @work(thread=True, group="plot", exit_on_error=False)
    def _plot_worker(self, output: str, o: dict, folder: Path) -> None:
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
        if t is None or t.fused is None or st is None:
            return
        result = st.bisect.result
        if self._outputs_written_for == (id(t.fused), id(result)):
            return
        try:
            self.write_outputs(t, result)
        except (UserError, OSError) as exc:
            self.set_status(f"error: could not write --json/--report: {exc}", error=True)

    # ------------------------------------------------------------------ message handlers (UI thread)
    def on_engine_progress(self, m: EngineProgress) -> None:
        st = self.state
        if st is None:
            return
        st.live[m.stage] = {"text": m.text, "done": m.done, "total": m.total, "data": m.data}
        if m.stage in BISECT_STAGES:
            st.bisect.stage_text = f"{m.stage}: {m.text}"
            if m.stage == "bisect":
                st.bisect.builds = int(m.done)
                st.bisect.total = int(m.total or 0)
        done = f" ({m.done:g}/{m.total:g})" if m.total else ""
        self.set_status(f"{m.stage}: {m.text}{done}", refresh=False)
        self.notify_screens(f"progress:{m.stage}")

    def on_step_started(self, m: StepStarted) -> None:
        st = self.state
        st.set(m.step, "running")
        self.set_status(f"running: {STEP_NAME[m.step]}...", refresh=False)
        self.notify_screens(m.step)

    def on_step_finished(self, m: StepFinished) -> None:
        st = self.state
        p = m.payload
        if m.step == "inputs":
            st.info = p["info"]
            st.inputs = p["inputs"]
            st.session_dir = Path(p["session"])
        elif m.step == "baseline":
            st.manifest = p["manifest"]
            st.baseline_reused = p["reused"]
        elif m.step == "determinism":
            st.determinism = p["determinism"]
        elif m.step == "range_check":
            st.range_check = p["range_check"]
        elif m.step == "fused":
            st.fused = p["fused"]
            st.summary = p["summary"]
            st.options_dirty = False
            if st.states["settings"] not in FINAL:
                st.set("settings", "passed")
        st.set(m.step, m.state)
        st.live.pop(m.step, None)
        verdict = {"passed": "✔ passed", "failed": "✘ failed", "skipped": "– skipped"}[m.state]
        extra = ""
        if m.step == "fused" and m.state == "failed":
            extra = ": tolerance broken, press b to find the fused op at fault"
        elif m.step == "fused":
            extra = ": within tolerance"
        self.set_status(f"{STEP_NAME[m.step]} {verdict}{extra}", error=False, refresh=False)
        self.notify_screens(m.step)
        if m.step == "fused":
            self.notify_screens("settings")

    def on_step_stopped(self, m: StepStopped) -> None:
        st = self.state
        if st is None:
            return
        step = m.step
        if m.reason == "cancelled":
            if step == "bisect" or self.busy == "bisect":
                st.bisect.status = "cancelled"
                st.set("bisect", "pending", "cancelled; b resumes it")
            if step and step != "bisect" and st.states.get(step) == "running":
                st.set(step, "pending", "cancelled; r runs it again, finished parts are reused")
            if step == "bisect":
                self.set_status("bisection cancelled: r resumes it, recorded steps are reused", refresh=False)
            else:
                self.set_status(f"{STEP_NAME[step] if step else 'work'} cancelled: run it again to resume, "
                                "finished parts are reused", refresh=False)
        elif m.reason == "halt":
            st.halted = m.text
            if step == "bisect":
                st.bisect.status = "error"
                st.bisect.error = m.text
                st.set("bisect", "pending", "needs a sane baseline")
            self.set_status(m.text if step != "bisect" else st.halted or m.text, error=True, refresh=False)
            if step != "bisect":
                self.notify(short(m.text, 200), severity="error", timeout=6)
        else:
            if step == "bisect" or (self.busy == "bisect" and step is None):
                st.bisect.status = "error"
                st.bisect.error = m.text
                st.set("bisect", "failed", "stopped by an error")
            elif step:
                st.set(step, "failed", short(m.text, 60))
            if m.suggestion is not None:  # dynamic inputs: the settings form opens with the suggestion
                st.suggestion = m.suggestion
                st.input_error = m.text
                st.set("inputs", "failed", "press o")
                self.set_status("inputs need shapes or values: press o, the form holds a suggestion that ran",
                                error=True, refresh=False)
                self.notify(short(m.text, 300), title="inputs", severity="warning", timeout=10)
            else:
                self.set_status(f"error: {m.text}", error=True, refresh=False)
                self.notify(short(m.text, 200), title="error", severity="error", timeout=6)
        self.notify_screens(step or "all")

    def on_bisect_step(self, m: BisectStep) -> None:
        b = self.state.bisect
        b.steps.append(m.step)
        b.builds = max(b.builds, int(m.step.get("builds", 0)))
        self.notify_screens("bisect_step")

    def on_bisect_finished(self, m: BisectFinished) -> None:
        st = self.state
        r = m.result
        st.bisect = BisectView(status="finished", steps=list(r.get("steps", [])),
                               builds=int(r.get("engine_builds", 0)),
                               total=int(r.get("engine_builds", 0)), result=r)
        if m.summary:
            st.summary = m.summary
        st.set("bisect", bisect_state(r["verdict"]))
        if r["culprits"]:
            names = "; ".join(f"{c['op_type']} from {', '.join(c['optimizers']) or '?'}" for c in r["culprits"])
            text = f"bisection found {len(r['culprits'])} culprit(s): {names}"
        else:
            text = f"bisection: {BISECT_VERDICT.get(r['verdict'], r['verdict'])}"
        if m.loaded:
            text = "session reopened; " + text
        self.set_status(text + "  (e exports the report)", refresh=False)
        self.notify_screens("bisect")

    def on_bisect_interrupted(self, m: BisectInterrupted) -> None:
        st = self.state
        st.bisect = BisectView(status="interrupted", recorded=m.recorded)
        st.set("bisect", "pending", f"interrupted after {m.recorded} recorded step(s); b resumes")
        self.set_status(f"the bisection was interrupted after {m.recorded} recorded step(s): "
                        "r resumes it, recorded steps are reused", refresh=False)
        self.notify_screens("bisect")

    def on_export_done(self, m: ExportDone) -> None:
        st = self.state
        st.exported = dict(m.paths)
        st.markdown = m.markdown
        shown = ", ".join(show_path(p) for k, p in m.paths.items() if k != "plots")
        text = f"exported {shown}"
        if m.copy:
            self.copy_to_clipboard(m.markdown)
            text += "; Markdown copied to the clipboard"
        self.set_status(text, refresh=False)
        self.notify(text, title="export", timeout=6)
        self.notify_screens("status")

    def on_work_done(self, m: WorkDone) -> None:
        self.busy = None
        st = self.state
        if m.kind == "bisect" and st is not None and st.bisect.status == "running":
            st.bisect.status = "cancelled" if m.outcome == "cancelled" else (
                "error" if m.outcome in ("error", "halted") else st.bisect.status)
        if m.kind == "restore" and st is not None and m.outcome == "done":
            if st.bisect.result is not None or st.bisect.status == "interrupted":
                if not isinstance(self.screen, BisectionScreen):
                    self.push_screen(BisectionScreen())
            else:
                for screen in self.screen_stack:
                    if isinstance(screen, ChecklistScreen):
                        screen.select(st.next_step() or "fused")
            if st.bisect.result is None and st.bisect.status != "interrupted":
                self.set_status("session reopened: r runs the next step"
                                if st.next_step() else "session reopened: b bisects, e exports",
                                refresh=False)
        self.notify_screens("all")
        self.notify_screens("busy")

    # ------------------------------------------------------------------ global actions
    def action_quit_app(self) -> None:
        if self.busy:
            self.workers.cancel_group(self, "engine")
            self.exit(return_code=int(ExitCode.CANCELLED))
        else:
            self._write_outputs_on_quit()
            self.exit(return_code=0)

    # ------------------------------------------------------------------ command palette
    def get_system_commands(self, screen):
        """ctrl+p: every action of the app, with the key that does it."""
        yield from super().get_system_commands(screen)
        for title, help_text, callback in self.palette_commands():
            yield SystemCommand(title, help_text, callback)

    def palette_commands(self) -> list[tuple[str, str, object]]:
        def on_checklist(action: str):
            def run() -> None:
                for scr in self.screen_stack:
                    if isinstance(scr, ChecklistScreen):
                        getattr(scr, f"action_{action}")()
                        return
            return run

        def on_screen(action: str):
            def run() -> None:
                handler = getattr(self.screen, f"action_{action}", None)
                if handler is not None:
                    handler()
                else:
                    self.set_status(f"{action.replace('_', ' ')}: not on this screen")
            return run

        cmds: list[tuple[str, str, object]] = [
            ("Run next step (r)", "run the next step of the checklist", self.run_next),
            ("Run all checks (a)", "inputs, baseline, determinism, range check, comparison", self.run_all),
            ("Bisect (b)", "find the fused op(s) that break tolerance", self.start_bisect),
            ("Cancel (x)", "stop the running work at the next safe point", self.cancel_work),
            ("Settings (o)", "inputs (shapes, fixed values, file), engine settings, tolerance",
             on_checklist("settings")),
            ("Export report (e)", "report.md, report.json, plots and the repro bundle", lambda: self.export(False)),
            ("Copy Markdown report (c)", "export and copy the Markdown to the clipboard", lambda: self.export(True)),
            ("Full-screen table (f)", "the focused table (or the error along the graph) on the whole screen",
             on_screen("fullscreen")),
            ("Why panel (w)", "show or hide the why-this-matters panel", on_screen("toggle_why")),
            ("Save value histograms (p)", "matplotlib PNG of baseline vs fused values of the selected output",
             on_screen("plot")),
            ("Models (m)", "open another model or a recent session", self.open_picker),
            ("Help: keys (?)", "every key of the app", self.action_help),
            ("Language 中文/EN (l)", "switch the why panels between English and Chinese", self.action_language),
            ("Screenshot (s)", "save an SVG of the screen into the session", self.action_screenshot),
        ]
        return cmds

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())

    def action_language(self) -> None:
        self.lang = "zh" if self.lang == "en" else "en"
        self.notify_screens("lang")

    def action_screenshot(self) -> None:
        root = self.state.session_root if self.state else None
        folder = Path(root) if root is not None and Path(root).is_dir() else Path.cwd()
        kind = type(self.screen).__name__.replace("Screen", "").lower() or "screen"
        path = self.save_screenshot(filename=f"screenshot-{kind}.svg", path=str(folder))
        self.last_screenshot = path
        self.set_status(f"screenshot saved: {show_path(path)}")
        self.notify(f"screenshot saved: {show_path(path)}", timeout=4)


def make_app(options: Optional[TriageOptions] = None, resume: bool = False, engine=None) -> BisectApp:
    """The app for the CLI and the tests: no options opens the model picker;
    options open the checklist on that model; resume=True reloads its session;
    `engine` injects an engine object (the tests' programmed fake engine)."""
    return BisectApp(options=options, resume=resume, engine=engine)
