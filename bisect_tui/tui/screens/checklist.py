"""The checklist: model & input, baseline, determinism, range check, engine settings,
comparison, bisection. Each step shows its state (symbol and word), its results
and a "why this matters / common pitfall" panel."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.screen import Screen
from textual.widgets import ContentSwitcher, Footer, Header, OptionList

from bisect_tui.tui.texts import STEP_IDS
from bisect_tui.tui.widgets.common import StatusLine, StepList, WhyPanel
from bisect_tui.tui.widgets.stepviews import VIEWS


class ChecklistScreen(Screen):
    # short labels: with q Quit and ? Help they fit the footer at 80 columns; the rest
    # (c, f, w, p, l, s) are in ? help and the command palette (ctrl+p)
    BINDINGS = [
        Binding("r", "run_next", "Run"),
        Binding("a", "run_all", "All"),
        Binding("x", "cancel", "Cancel"),
        Binding("o", "settings", "Settings"),
        Binding("b", "bisect", "Bisect"),
        Binding("e", "export", "Export"),
        Binding("c", "copy", "Copy MD", show=False),
        Binding("m", "models", "Models"),
        Binding("f", "fullscreen", "Full screen", show=False),
        Binding("w", "toggle_why", "Why panel", show=False),
        Binding("p", "plot", "Plot PNG", show=False),
    ]

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="main"):
            yield StepList(id="steps")
            with VerticalScroll(id="detail"):
                with ContentSwitcher(initial="view-inputs", id="views"):
                    for step in STEP_IDS:
                        yield VIEWS[step](id=f"view-{step}")
                yield WhyPanel(id="why-inline", classes="why-inline")
            yield WhyPanel(id="why-side", classes="why-side")
        yield StatusLine(id="status")
        yield Footer(compact=True)

    _ready = False

    def on_mount(self) -> None:
        self._ready = True
        self.set_class(not getattr(self.app, "why_shown", True), "-nowhy")
        self.query_one(StepList).focus()
        self.state_changed("all")
        st = self.app.state
        if st is not None:
            self.select(st.next_step() or "fused")

    # -- rendering from the app state -------------------------------------------------
    def state_changed(self, what: str) -> None:
        st = self.app.state
        if st is None or not self._ready:
            return
        steps = self.query_one(StepList)
        steps.show_states(st.states, self.app.lang)
        self.sub_title = self.app.header_subtitle()
        if what.startswith("progress:"):
            # only the live part of the running step, for every (coalesced) progress message
            stage = what.split(":", 1)[1]
            if stage in ("baseline", "determinism", "fused"):
                self.query_one(f"#view-{stage}").render_state(st)
            self._status()
            return
        if what == "lang":
            for w in self.query(WhyPanel):
                w.show(lang=self.app.lang)
            return
        if what == "all":
            for step in STEP_IDS:
                self.query_one(f"#view-{step}").render_state(st)
        elif what in STEP_IDS:
            self.query_one(f"#view-{what}").render_state(st)
            if st.states.get(what) == "running" and what != "bisect":
                self.select(what)  # follow the work as it moves down the checklist
            if what != "bisect":
                self.query_one("#view-bisect").render_state(st)
        self._status()
        self.refresh_bindings()

    def _status(self) -> None:
        self.query_one(StatusLine).show(self.app.status_text, self.app.status_error)

    def select(self, step: str) -> None:
        self.query_one(StepList).select_step(step)
        self._show_step(step)

    def _show_step(self, step: str) -> None:
        self.query_one("#views", ContentSwitcher).current = f"view-{step}"
        for w in self.query(WhyPanel):
            w.show(step=step, lang=self.app.lang)
        self.query_one("#detail", VerticalScroll).scroll_home(animate=False)

    def on_option_list_option_highlighted(self, event: OptionList.OptionHighlighted) -> None:
        if event.option.id:
            self._show_step(event.option.id)

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        step = event.option.id
        if step == "settings":
            self.action_settings()
        elif step == "bisect":
            self.action_bisect()
        elif step:
            self._show_step(step)

    # -- actions --------------------------------------------------------------------
    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """True: shown; None: shown greyed out (not now); False: hidden (not relevant)."""
        busy = bool(self.app.busy)
        st = self.app.state
        if action == "cancel":
            return busy
        if busy and action in ("run_next", "run_all", "settings", "bisect", "export", "copy", "models"):
            return False  # hidden while working: the footer then shows x Cancel, q Quit, ? Help
        if action in ("run_next", "run_all"):
            if st is not None and st.next_step() is None:
                return False
            return True
        if action in ("export", "copy"):
            return None if st is None or st.fused is None else True
        return True

    def action_run_next(self) -> None:
        step = self.app.run_next()
        if step:
            self.select(step)

    def action_run_all(self) -> None:
        self.app.run_all()

    def action_cancel(self) -> None:
        self.app.cancel_work()

    def action_settings(self) -> None:
        self.select("settings")
        self.app.open_settings()

    def action_bisect(self) -> None:
        self.app.start_bisect()

    def action_export(self) -> None:
        self.app.export(copy=False)

    def action_copy(self) -> None:
        self.app.export(copy=True)

    def action_models(self) -> None:
        self.app.open_picker()

    def _current_view(self):
        return self.query_one(f"#{self.query_one('#views', ContentSwitcher).current}")

    def action_fullscreen(self) -> None:
        """The focused table (or the current step's first table) on the whole screen."""
        from textual.widgets import DataTable

        from bisect_tui.tui.screens.fullscreen import FullScreenTable

        focused = self.focused if isinstance(self.focused, DataTable) else None
        view = self._current_view()
        tables = [t for t in view.query(DataTable) if getattr(t, "full_data", None) and not t.has_class("hidden")]
        table = focused if focused is not None and getattr(focused, "full_data", None) else (
            tables[0] if tables else None)
        if table is None:
            self.app.set_status("no table on this step yet: run it first (r)")
            return
        title, columns, rows = table.full_data
        profile = view.profile(self.app.state) if hasattr(view, "profile") else None
        self.app.push_screen(FullScreenTable(title, columns, rows, profile, table.cursor_row or 0))

    def action_toggle_why(self) -> None:
        self.app.why_shown = not getattr(self.app, "why_shown", True)
        for scr in self.app.screen_stack:
            scr.set_class(not self.app.why_shown, "-nowhy")
        self.app.set_status("why panel hidden: w shows it again" if not self.app.why_shown
                            else "why panel shown: w hides it")
        self.state_changed("all")

    def action_plot(self) -> None:
        """Overlaid baseline/fused value histograms of the selected output, as a PNG."""
        self.select("fused")
        self.app.save_value_plot(self._current_view().selected_output)


__all__ = ["ChecklistScreen"]
