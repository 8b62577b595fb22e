"""The bisect-tui app: picker -> checklist -> bisection, all engine work in threads.

Threading rule: engine work runs only in `@work(thread=True, group="engine")`
workers (workers.py) that get the worker's `cancelled_event` as their
CancelToken. Worker threads never touch widgets; they post messages (see
messages.py) which the handlers (handlers.py) turn into `self.state` updates,
then every screen on the stack re-renders the part that changed
(`state_changed(what)`). This module opens models and runs the commands.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from textual.app import App, SystemCommand
from textual.binding import Binding

from bisect_tui.core.errors import ExitCode
from bisect_tui.core.pipeline import Triage, TriageOptions, plan_steps
from bisect_tui.engine_choice import engine_factory, install_registry
from bisect_tui.tui.format import relpath_or_name, show_path
from bisect_tui.tui.handlers import StateHandlers
from bisect_tui.tui.screens.bisection import BisectionScreen
from bisect_tui.tui.screens.checklist import ChecklistScreen
from bisect_tui.tui.screens.help import HelpScreen
from bisect_tui.tui.screens.picker import Picked, PickerScreen
from bisect_tui.tui.screens.settings import SettingsScreen
from bisect_tui.tui.state import ENGINE_STEPS, FINAL, BisectView, TriageState
from bisect_tui.tui.workers import EngineWorkers


class BisectApp(EngineWorkers, StateHandlers, App[int]):
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
        install_registry()  # the core's triages load the registry's engines by name
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
            opts = self.state.options
            self.triage = Triage(opts, engine=self.engine, engine_factory=engine_factory(opts.engine))
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
        plan = plan_steps(targets, have)
        if st.options_dirty and "fused" in plan:
            plan = plan_steps([*plan, "inputs"], have)  # re-prepare: the session records the new engine settings
        return plan

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
