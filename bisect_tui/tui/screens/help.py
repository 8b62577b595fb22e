"""Key help (press ?): every key of the app in one place."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from bisect_tui.tui.texts import HELP_TEXT


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
            yield Static(Text(HELP_TEXT))

    def action_close(self) -> None:
        self.dismiss(None)
