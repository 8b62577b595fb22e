"""What every checklist step's detail pane shares: the view base class, safe
text for model names, and tables that fit the pane (columns dropped when too
wide, explicit sizes so the screen never depends on timing)."""

from __future__ import annotations

from rich.cells import cell_len
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import DataTable, Static

from bisect_tui.tui.format import shown, state_label
from bisect_tui.tui.state import TriageState
from bisect_tui.tui.texts import STEP_NAME

MAX_ROWS = 400  # rows shown in per-tensor tables (sorted so the interesting ones come first)
SPARK_LO, SPARK_HI = -26, 16  # log2 range of the headroom sparkline: FP16 zero .. FP16 overflow


def T(s: str, style: str = "") -> Text:
    return Text(shown(s), style=style)  # names from the model never reach the terminal raw


class StepView(Vertical):
    """Base: a title line, then the step's own widgets."""

    step = "inputs"

    DEFAULT_CSS = """
    StepView { height: auto; }
    StepView > .view-title { text-style: bold; height: 1; }
    StepView > .view-text { height: auto; }
    StepView DataTable { height: 3; margin-top: 1; border: round $primary-darken-3; }
    StepView DataTable:focus { border: heavy $accent; }
    StepView .hidden { display: none; }
    """

    def compose_body(self) -> ComposeResult:
        yield from ()

    def compose(self) -> ComposeResult:
        yield Static("", classes="view-title")
        yield from self.compose_body()

    def render_state(self, st: TriageState) -> None:
        from bisect_tui.tui.widgets.common import ROW_SYMBOL, row_states

        state = row_states(st.states, st).get(self.step, "pending")  # the checklist row's word
        note = st.notes.get(self.step)
        label = f"{ROW_SYMBOL[state]} {state}" if state == "warning" else state_label(state)
        title = f"{STEP_NAME[self.step]}: {label}" + (f" ({note})" if note else "")
        self.query_one(".view-title", Static).update(T(title))
        self.render_body(st)

    def render_body(self, st: TriageState) -> None:
        pass


STEP_LIST_W = 27  # the checklist column (widgets/common.py)
WHY_SIDE_W = 34  # the why panel beside the detail from 140 columns (app.tcss)


def pane_width(app) -> int:
    """Cells the detail pane gives a table, from the terminal width (known before
    layout, so the hints never depend on timing)."""
    w = app.size.width - STEP_LIST_W - 8  # the pane's border, padding and scrollbar; the table's border
    if app.size.width >= 140 and getattr(app, "why_shown", True):
        w -= WHY_SIDE_W
    return max(w, 20)


def _col_width(label: str, cells: list[list[Text]], i: int) -> int:
    return min(max([cell_len(label)] + [r[i].cell_len for r in cells]), 40)


def _fill(table: DataTable, columns: list[str], rows: list[list], max_height: int = 12,
          title: str = "", optional: tuple[str, ...] = ()) -> None:
    """Fill a table; `optional` columns (least useful first) leave the pane when
    the rest would not fit. The full-screen view (f) always has every column."""
    cells = [[c if isinstance(c, Text) else T(c) for c in r] for r in rows]
    table.full_data = (title or table.border_title or "table", list(columns), cells)
    keep = list(range(len(columns)))
    room = pane_width(table.app)
    for name in optional:
        if sum(_col_width(columns[i], cells, i) + 2 for i in keep) <= room:
            break
        keep.remove(columns.index(name))
    dropped = len(columns) - len(keep)
    columns = [columns[i] for i in keep]
    cells = [[r[i] for i in keep] for r in cells]
    table.clear(columns=True)
    # Explicit column widths: DataTable measures new rows lazily, so its own widths
    # (and so the screen) would depend on when the screen is drawn.
    for i, label in enumerate(columns):
        width = max([cell_len(label)] + [c.cell_len for c in (r[i] for r in cells)])
        table.add_column(label, width=min(width, 40))
    for r in cells:
        table.add_row(*r)
    # An explicit height (header + rows + a row for the horizontal scrollbar + the border)
    # instead of `auto`: the table's auto height is known only after it measured its new
    # rows, so the layout would depend on timing.
    table.styles.height = min(len(rows) + 4, max_height + 2)
    widths = sum(_col_width(label, cells, i) + 2 for i, label in enumerate(columns))
    hints = []
    if widths > room:
        hints.append("←→ scroll")
    if dropped:
        hints.append(f"{dropped} more column(s)")
    if len(rows) > max_height - 1:
        hints.append(f"↑↓ {len(rows)} rows")
    hints.append("f full screen")
    table.border_subtitle = " · ".join(hints)
