"""Key help (press ?): every key of the app in one place."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from bisect_tui.tui.texts import HELP_CLOSE, HELP_SECTIONS, HELP_STATES, HELP_TITLE

KEY_W = 17  # "  tab / shift+tab": the widest key, so every section's descriptions line up


def help_renderable() -> Group:
    """Each section a two-column grid: the keys never wrap, their description
    wraps at word boundaries in its own column (hanging under itself)."""
    parts: list = [Text(HELP_TITLE, style="bold"), Text("")]
    sections = (*HELP_SECTIONS, ("States (symbol and word, never colour alone)", HELP_STATES))
    for title, rows in sections:
        grid = Table.grid(padding=(0, 2))
        grid.add_column(no_wrap=True, width=KEY_W)
        grid.add_column(ratio=1)
        for key, what in rows:
            grid.add_row(Text("  " + key, style="bold"), Text(what))
        parts += [Text(title, style="bold"), grid, Text("")]
    parts.append(Text(HELP_CLOSE))
    return Group(*parts)


class HelpScreen(ModalScreen[None]):
    BINDINGS = [
        Binding("escape,enter,question_mark,q", "close", "Close"),
    ]
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen #help {
        width: 80; max-width: 100%; height: auto; max-height: 100%;
        border: round $primary; padding: 0 1; background: $surface;
    }
    """

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help") as v:
            v.border_title = "Keys"
            yield Static(help_renderable())

    def action_close(self) -> None:
        self.dismiss(None)
