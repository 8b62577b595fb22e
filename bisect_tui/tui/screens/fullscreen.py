"""A table (and the error along the graph) on the whole screen: at 80x24 a
nine-column table shows four columns in its pane; here every column is shown at
its full width, and what still does not fit scrolls with the arrows."""

from __future__ import annotations

from typing import Optional, Sequence

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Static

from bisect_tui.core.plots import ErrorProfile
from bisect_tui.tui.widgets.errorprofile import ErrorProfileChart


class FullScreenTable(Screen):
    BINDINGS = [
        Binding("escape,f", "close", "Back"),
        Binding("q", "close", "Back", show=False),
    ]
    DEFAULT_CSS = """
    FullScreenTable #fs-hint { height: 1; padding: 0 1; color: $text-muted; }
    FullScreenTable #fs-body { height: 1fr; }
    FullScreenTable #fs-table { height: auto; max-height: 100%; border: heavy $accent; }
    FullScreenTable #fs-profile { padding: 0 1; }
    """

    def __init__(self, title: str, columns: Sequence[str], rows: Sequence[Sequence[Text]],
                 profile: Optional[ErrorProfile] = None, cursor: int = 0) -> None:
        super().__init__()
        self.title_text = title
        self.columns = list(columns)
        self.rows = [list(r) for r in rows]
        self.profile = profile
        self.cursor = cursor
        self.sub_title = title

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(Text(f"{self.title_text}: {len(self.rows)} row(s); ↑↓ rows, ←→ columns, "
                          "f or escape goes back"), id="fs-hint")
        with VerticalScroll(id="fs-body"):
            if self.profile is not None:
                yield ErrorProfileChart(id="fs-profile")
            table = DataTable(id="fs-table", cursor_type="row", zebra_stripes=True)
            table.border_title = self.title_text
            yield table
        yield Footer(compact=True)

    def on_mount(self) -> None:
        table = self.query_one("#fs-table", DataTable)
        for i, label in enumerate(self.columns):
            width = max([len(label)] + [r[i].cell_len if isinstance(r[i], Text) else len(str(r[i]))
                                        for r in self.rows])
            table.add_column(label, width=width)
        for r in self.rows:
            table.add_row(*r)
        if self.rows:
            table.move_cursor(row=min(self.cursor, len(self.rows) - 1))
        table.focus()
        if self.profile is not None:
            self.query_one(ErrorProfileChart).show(self.profile, rows=8)

    def action_close(self) -> None:
        self.app.pop_screen()

    def state_changed(self, what: str) -> None:
        pass
