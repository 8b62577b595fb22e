"""The bisection: a live table of steps, builds so far vs expected, the candidate
region, and the culprit with its evidence once it is proved."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, ProgressBar, Static

from bisect_tui.core.bisect.records import Step
from bisect_tui.core.report.search import step_failure, step_ratio
from bisect_tui.tui.format import ratio, short
from bisect_tui.tui.widgets.common import StatusLine, WhyPanel
from bisect_tui.tui.widgets.culprit import CulpritPanel

STATUS_WORD = {
    "idle": "· not started",
    "running": "… running",
    "cancelled": "– cancelled",
    "interrupted": "– interrupted",
    "finished": "✔ finished",
    "found": "✔ found the culprit",
    "error": "✘ stopped by an error",
}
COLUMNS = [("n", "#"), ("kind", "kind"), ("region", "region"), ("marks", "marked"),
           ("builds", "builds"), ("ratio", "x tol"), ("verdict", "verdict")]
FIXED_WIDTHS = {"n": 3, "marks": 6, "builds": 6, "ratio": 8, "verdict": 8}
SHORT = 30  # below this many rows the steps get as much room as the culprit
NARROW = 100  # below this the "marked" count gives its room to the full pass names (f shows it)


def columns_for(width: int) -> list[tuple[str, str]]:
    return [c for c in COLUMNS if not (c[0] == "marks" and width < NARROW)]


# the ratio column is 8 cells wide at 80x24
SHORT_FAILURE = {"build error": "no build", "run error": "run fail"}


def step_row(st: Step, kind_w: int = 14, region_w: int = 16, keys=None) -> list[Text]:
    """One row; the kind is never cut when it fits (`disable GeluFusionL2` vs
    `disable GeluApproximation`: which one passes is the evidence). The ratio
    is the report's figure for the same step."""
    verdict = "✔ pass" if st.passed else "✘ FAIL"
    if st.cached:
        verdict += " ↺"
    cells = {"n": st.n, "kind": short(st.kind, kind_w), "region": short(st.region, region_w),
             "marks": st.marks, "builds": st.builds,
             "ratio": SHORT_FAILURE.get(step_failure(st) or "") or ratio(step_ratio(st)), "verdict": verdict}
    return [Text(str(cells[k])) for k in (keys or [c[0] for c in COLUMNS])]


def column_widths(width: int, kinds: list[str] = (), regions: list[str] = ()) -> tuple[int, int]:
    """Widths of the kind and region columns that fit a table `width` cells wide:
    the kind gets what its longest entry needs first (the region is often just
    "whole graph"), the region the rest."""
    keys = [k for k, _ in columns_for(width)]
    fixed = sum(v for k, v in FIXED_WIDTHS.items() if k in keys) + len(keys) * 2 + 4  # + padding, border
    room = max(width - fixed, 24)
    want_kind = max([len(k) for k in kinds] + [12])
    want_region = max([len(r) for r in regions] + [12])
    kind_w = min(want_kind, max(room - 9, 12))
    region_w = max(min(room - kind_w, max(want_region, 9)), 9)
    return kind_w, region_w


class BisectionScreen(Screen):
    BINDINGS = [
        Binding("r", "resume", "Run/resume"),
        Binding("x", "cancel", "Cancel"),
        Binding("e", "export", "Export"),
        Binding("c", "copy", "Copy MD", show=False),
        Binding("f", "fullscreen", "Full screen"),
        Binding("h", "back", "Checklist"),
        Binding("escape", "back", "Checklist", show=False),
    ]

    def compose(self) -> ComposeResult:
        yield Header()
        with Vertical(id="bis-top"):
            yield Static("", id="bis-status")
            yield ProgressBar(id="bis-progress", show_eta=False)
        with Vertical(id="bis-main"):
            table = DataTable(id="bis-steps", cursor_type="row", zebra_stripes=True)
            table.border_title = "Steps (↺ = reused from the session)"
            yield table
            with Horizontal(id="bis-lower"):
                with VerticalScroll(id="bis-side"):
                    yield CulpritPanel(id="culprit")
                    yield WhyPanel("bisect", id="why-inline", classes="why-inline")
                yield WhyPanel("bisect", id="why-side", classes="why-side")
        yield StatusLine(id="status")
        yield Footer(compact=True)

    _ready = False

    def on_mount(self) -> None:
        self._ready = True
        self.query_one("#bis-side").border_title = "Culprit"
        self.query_one("#bis-side").border_subtitle = "tab: focus here · ↑↓ scroll · f full screen"
        self.set_class(not getattr(self.app, "why_shown", True), "-nowhy")
        self.state_changed("all")
        self.query_one("#bis-steps", DataTable).focus()

    # -- rendering -------------------------------------------------------------------
    def state_changed(self, what: str) -> None:
        st = self.app.state
        if st is None or not self._ready:
            return
        self.sub_title = self.app.header_subtitle()
        b = st.bisect
        if what == "lang":
            for w in self.query(WhyPanel):
                w.show(lang=self.app.lang)
            return
        table = self.query_one("#bis-steps", DataTable)
        if what in ("all", "bisect_reset", "bisect", "resize"):
            self._fill_table()
            if b.status == "finished" and table.row_count:
                # the last steps hold the proof; after the refresh, once the rows are measured,
                # so the scroll position never depends on timing
                self.call_after_refresh(self._cursor_to_end)
        elif what == "bisect_step" and b.steps:
            s = b.steps[-1]
            if len(s.kind) > self._widths[0]:
                self._fill_table()  # a longer kind (disable GeluApproximation): widen, never cut
                table.move_cursor(row=table.row_count - 1)
            elif str(s.n) not in {str(k.value) for k in table.rows}:
                table.add_row(*step_row(s, *self._widths, self._keys), key=str(s.n))
                table.move_cursor(row=table.row_count - 1)
        self._header(b)
        self.set_class(b.status == "finished", "-finished")
        self._fit_height(b.status == "finished")
        if what in ("all", "bisect_reset", "bisect", "busy", "status"):
            fused = st.fused.fused_nodes if st.fused is not None else None
            triage = getattr(self.app, "triage", None)
            # the engine adds its keep-set repro to the bundle; asked only once there is a result
            # (the engine has been built by then: asking never loads one on the UI thread)
            writer = bool(b.result) and triage is not None and hasattr(triage.engine, "add_keepset_repro")
            self.query_one(CulpritPanel).show(b.result, b.status, len(fused) if fused is not None else None, writer)
        self.query_one(StatusLine).show(self.app.status_text, self.app.status_error)
        self.refresh_bindings()

    _widths = (14, 16)
    _keys: list = [c[0] for c in COLUMNS]

    def _fill_table(self) -> None:
        table = self.query_one("#bis-steps", DataTable)
        # the table spans the screen (steps above, culprit below): size it from the
        # terminal width, which is known before layout, so widths never depend on timing
        steps = self.app.state.bisect.steps
        self._widths = column_widths(self.app.size.width, [s.kind for s in steps], [s.region for s in steps])
        table.clear(columns=True)
        widths = {**FIXED_WIDTHS, "kind": self._widths[0], "region": self._widths[1]}
        cols = columns_for(self.app.size.width)
        self._keys = [k for k, _ in cols]
        for key, label in cols:
            table.add_column(label, key=key, width=widths[key])
        for s in self.app.state.bisect.steps:
            table.add_row(*step_row(s, *self._widths, self._keys), key=str(s.n))

    def _fit_height(self, finished: bool) -> None:
        """On a short terminal (24 rows) the steps and the culprit share the room
        evenly (the stylesheet gives the evidence twice the steps' height, which
        leaves two step rows), and a finished search drops its full progress bar.
        Inline styles: they win over the app's stylesheet for this screen only."""
        short = self.app.size.height < SHORT
        self.query_one("#bis-progress").display = not (short and finished)
        self.query_one("#bis-lower").styles.height = "1fr" if short else None

    def _cursor_to_end(self) -> None:
        table = self.query_one("#bis-steps", DataTable)
        if table.row_count:
            table.move_cursor(row=table.row_count - 1, animate=False)

    def on_resize(self) -> None:
        if self._ready:
            self.call_after_refresh(self.state_changed, "resize")

    def _header(self, b) -> None:
        total = max(b.total, b.builds, 1)
        bar = self.query_one("#bis-progress", ProgressBar)
        if b.status == "idle" and not b.steps:
            bar.update(total=None, progress=0)
        else:
            bar.update(total=total, progress=b.builds if b.status != "finished" else total)
        status = "found" if b.status == "finished" and b.result and b.result.culprits else b.status
        lines = [f"state: {STATUS_WORD.get(status, status)}   builds {b.builds} of ~{total} expected"]
        if b.status in ("cancelled", "interrupted"):
            recorded = len(b.steps) or b.recorded
            lines[0] += f"   ({recorded} step(s) recorded; r resumes)"
        elif b.stage_text and b.status == "running":
            lines[0] += f"   {b.stage_text}"
        elif b.error:
            lines[0] += f"   {b.error}"
        cand = b.candidate
        if b.result and b.result.culprits:
            names = "; ".join(f"{c.op_type} ({c.fused_node or c.kind})" for c in b.result.culprits)
            lines.append(f"culprit: {names}")
        elif cand:
            last = b.steps[-1] if b.steps else None
            lines.append(f"candidate region: {cand}")
            if last and b.status == "running":
                lines[-1] += f"   last: {short(last.region, 24)} {'pass' if last.passed else 'FAIL'}"
        else:
            lines.append("candidate region: whole graph")
        self.query_one("#bis-status", Static).update(Text("\n".join(lines[:2])))

    # -- actions -----------------------------------------------------------------------
    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """True: shown; None: shown greyed out (not now); False: hidden (not relevant)."""
        busy = bool(self.app.busy)
        st = self.app.state
        if action == "cancel":
            return busy
        if action == "resume":
            return None if busy else True
        if action in ("export", "copy"):
            return None if busy or st is None or st.fused is None else True
        return True

    def action_resume(self) -> None:
        self.app.start_bisect()

    def action_cancel(self) -> None:
        self.app.cancel_work()

    def action_export(self) -> None:
        self.app.export(copy=False)

    def action_copy(self) -> None:
        self.app.export(copy=True)

    def action_back(self) -> None:
        if self.has_class("-max-steps") or self.has_class("-max-culprit"):
            self.remove_class("-max-steps", "-max-culprit")
            return
        self.app.pop_screen()

    def action_fullscreen(self) -> None:
        """The steps with every column, untruncated, on the whole screen; on the culprit
        pane, that pane on the whole screen (f again restores)."""
        if self.has_class("-max-steps") or self.has_class("-max-culprit"):
            self.remove_class("-max-steps", "-max-culprit")
            return
        side = self.query_one("#bis-side")
        on_culprit = self.focused is not None and (self.focused is side or side in self.focused.ancestors)
        if on_culprit:
            self.add_class("-max-culprit")
            return
        from bisect_tui.tui.screens.fullscreen import FullScreenTable

        steps = self.app.state.bisect.steps
        rows = [step_row(s, 200, 200) for s in steps]
        table = self.query_one("#bis-steps", DataTable)
        self.app.push_screen(FullScreenTable("Bisection steps", [label for _, label in COLUMNS], rows,
                                             cursor=table.cursor_row or 0))


__all__ = ["BisectionScreen"]
