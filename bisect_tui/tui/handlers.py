"""The app's message handlers (UI thread): what the workers report becomes
`app.state`, then every screen on the stack re-renders the part that changed."""

from __future__ import annotations

from pathlib import Path

from bisect_tui.core.report import BISECT_VERDICT
from bisect_tui.tui import messages as msg
from bisect_tui.tui.format import short, show_path
from bisect_tui.tui.screens.bisection import BisectionScreen
from bisect_tui.tui.screens.checklist import ChecklistScreen
from bisect_tui.tui.state import FINAL, BisectView
from bisect_tui.tui.texts import STEP_NAME

# the checklist state of the bisection: finding a culprit is the search succeeding
BISECT_STATE = {"pass": "passed", "culprits": "found", "not_fusion": "unclear", "no_culprit": "unclear"}
BISECT_STAGES = ("bisect", "isolate", "attribute", "workaround")


def bisect_state(verdict: str) -> str:
    return BISECT_STATE.get(verdict, "unclear")


class StateHandlers:
    """The handler half of `BisectApp` (a mixin of the App)."""

    def on_engine_progress(self, m: msg.EngineProgress) -> None:
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

    def on_step_started(self, m: msg.StepStarted) -> None:
        st = self.state
        st.set(m.step, "running")
        self.set_status(f"running: {STEP_NAME[m.step]}...", refresh=False)
        self.notify_screens(m.step)

    def on_step_finished(self, m: msg.StepFinished) -> None:
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
            st.determinism = m.record
        elif m.step == "range_check":
            st.range_check = m.record
        elif m.step == "fused":
            st.fused = m.record
            st.summary = m.summary
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

    def on_step_stopped(self, m: msg.StepStopped) -> None:
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

    def on_bisect_step(self, m: msg.BisectStep) -> None:
        b = self.state.bisect
        b.steps.append(m.step)
        b.builds = max(b.builds, int(m.step.builds))
        self.notify_screens("bisect_step")

    def on_bisect_finished(self, m: msg.BisectFinished) -> None:
        st = self.state
        r = m.result
        st.bisect = BisectView(status="finished", steps=list(r.steps), builds=int(r.engine_builds),
                               total=int(r.engine_builds), result=r)
        if m.summary:
            st.summary = m.summary
        verdict = r.final_verdict
        st.set("bisect", bisect_state(verdict))
        if r.culprits:
            names = "; ".join(f"{c.op_type} from {', '.join(c.optimizers) or '?'}" for c in r.culprits)
            text = f"bisection found {len(r.culprits)} culprit(s): {names}"
        else:
            text = f"bisection: {BISECT_VERDICT.get(verdict, verdict)}"
        if m.loaded:
            text = "session reopened; " + text
        self.set_status(text + "  (e exports the report)", refresh=False)
        self.notify_screens("bisect")

    def on_bisect_interrupted(self, m: msg.BisectInterrupted) -> None:
        st = self.state
        st.bisect = BisectView(status="interrupted", recorded=m.recorded)
        st.set("bisect", "pending", f"interrupted after {m.recorded} recorded step(s); b resumes")
        self.set_status(f"the bisection was interrupted after {m.recorded} recorded step(s): "
                        "r resumes it, recorded steps are reused", refresh=False)
        self.notify_screens("bisect")

    def on_export_done(self, m: msg.ExportDone) -> None:
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

    def on_work_done(self, m: msg.WorkDone) -> None:
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
