"""Small widgets shared by the screens: step list, why panel, labelled sparkline, status line."""

from __future__ import annotations

from typing import Optional, Sequence

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Label, OptionList, Sparkline, Static
from textual.widgets.option_list import Option

from bisect_tui.core.report.sections import range_warnings
from bisect_tui.tui.format import STATE_SYMBOL
from bisect_tui.tui.texts import LABELS, STEP_IDS, STEP_NAME, STEP_NAME_ZH, TITLE, TOGGLE_HINT, WHY


ROW_SYMBOL = {**STATE_SYMBOL, "warning": "⚠"}


def row_states(states: dict[str, str], app_state=None) -> dict[str, str]:
    """The checklist's rows: each step's state, with "warning" for a passed range
    check whose findings say a reduced-precision engine will overflow (its pane
    says so; a plain ✔ would hide it). Display only: the step stays passed."""
    out = dict(states)
    rc = getattr(app_state, "range_check", None)
    if out.get("range_check") == "passed" and range_warnings(rc):
        out["range_check"] = "warning"
    return out


class StepList(OptionList):
    """The checklist: one row per step, state as symbol and word."""

    DEFAULT_CSS = """
    StepList {
        width: 27;
        height: 1fr;
        border: round $primary-darken-2;
        border-title-color: $text;
        padding: 0;
    }
    StepList:focus { border: heavy $accent; }
    """

    def __init__(self, **kwargs) -> None:
        super().__init__(*[Option(self.prompt_for(s, "pending"), id=s) for s in STEP_IDS], **kwargs)
        self.border_title = "Checklist"

    @staticmethod
    def prompt_for(step: str, state: str, lang: str = "en") -> Text:
        name = STEP_NAME_ZH[step] if lang == "zh" else STEP_NAME[step]
        t = Text()
        t.append(f"{ROW_SYMBOL.get(state, '?')} {state:<7} ", style="bold" if state != "pending" else "")
        t.append(name)
        return t

    def show_states(self, states: dict[str, str], lang: str = "en") -> None:
        """The rows as the steps' states, a passed step with findings to read as ⚠ warning."""
        shown_states = row_states(states, getattr(self.app, "state", None))
        for s in STEP_IDS:
            self.replace_option_prompt(s, self.prompt_for(s, shown_states.get(s, "pending"), lang))

    @property
    def current_step(self) -> str:
        idx = self.highlighted
        if idx is None:
            return STEP_IDS[0]
        return STEP_IDS[idx]

    def select_step(self, step: str) -> None:
        self.highlighted = STEP_IDS.index(step)


def wrap_cjk(text: str, width: int) -> str:
    """Wrap mixed Chinese/Latin text to `width` cells: break between CJK characters
    (Rich only breaks at spaces, which Chinese prose does not have)."""
    from rich.cells import cell_len

    if width < 4:
        return text
    tokens: list[str] = []
    word = ""
    for ch in text:
        if ch == " " or cell_len(ch) == 2:
            if word:
                tokens.append(word)
                word = ""
            tokens.append(ch)
        else:
            word += ch
    if word:
        tokens.append(word)
    lines: list[str] = []
    line, used = "", 0
    for tok in tokens:
        w = cell_len(tok)
        if used + w > width and line:
            lines.append(line.rstrip())
            line, used = "", 0
            if tok == " ":
                continue
        line += tok
        used += w
    if line:
        lines.append(line.rstrip())
    return "\n".join(lines)


class WhyPanel(Static):
    """"Why this matters / common pitfall" for one step, English or Chinese."""

    DEFAULT_CSS = """
    WhyPanel {
        height: auto;
        border: round $secondary-darken-2;
        padding: 0 1;
        margin-top: 1;
    }
    """

    def __init__(self, step: str = "inputs", lang: str = "en", **kwargs) -> None:
        super().__init__("", **kwargs)
        self.step = step
        self.lang = lang

    def on_mount(self) -> None:
        self._render_text()

    def show(self, step: Optional[str] = None, lang: Optional[str] = None) -> None:
        if step is not None:
            self.step = step
        if lang is not None:
            self.lang = lang
        self._render_text()

    def on_resize(self) -> None:
        if self.lang == "zh":
            self._render_text()

    def _render_text(self) -> None:
        why, pitfall = WHY[self.step][self.lang]
        lw, lp = LABELS[self.lang]
        self.border_title = TITLE[self.lang]
        self.border_subtitle = TOGGLE_HINT[self.lang]
        if self.lang == "zh":
            width = self.content_size.width
            if width > 0:  # wrap ourselves: Rich would only break Chinese at spaces
                why = wrap_cjk(f"{lw}：{why}", width)
                pitfall = wrap_cjk(f"{lp}：{pitfall}", width)
            else:
                why, pitfall = f"{lw}：{why}", f"{lp}：{pitfall}"
            self.update(Text(f"{why}\n\n{pitfall}"))
            return
        t = Text()
        t.append(f"{lw}: ", style="bold")
        t.append(why)
        t.append("\n\n")
        t.append(f"{lp}: ", style="bold")
        t.append(pitfall)
        self.update(t)


class LabeledSparkline(Vertical):
    """A Sparkline with a title above and the range of its x axis below."""

    DEFAULT_CSS = """
    LabeledSparkline { height: auto; margin-top: 1; }
    LabeledSparkline > .spark-title { height: 1; text-style: bold; }
    LabeledSparkline > Sparkline { height: 3; width: 100%; }
    LabeledSparkline > .spark-axis { height: 1; }
    LabeledSparkline > .spark-axis > Label { width: 1fr; color: $text-muted; }
    LabeledSparkline > .spark-axis > .right { text-align: right; }
    """

    def compose(self) -> ComposeResult:
        yield Label("", classes="spark-title")
        yield Sparkline([], summary_function=max)
        with Horizontal(classes="spark-axis"):
            yield Label("", classes="left")
            yield Label("", classes="right")

    def set(self, title: str, counts: Sequence[float], left: str = "", right: str = "") -> None:
        """Bar heights are 1 + log(1 + count) for a non-empty bin, 0 for an empty one:
        with linear heights the one crowded bin flattens every other to nothing and
        the histogram looks one cell wide; this way every value seen shows."""
        import math

        self.query_one(".spark-title", Label).update(Text(title + " (log count)" if counts else title))
        self.query_one(Sparkline).data = [1.0 + math.log1p(float(c)) if c > 0 else 0.0 for c in counts]
        self.query_one(".spark-axis .left", Label).update(Text(left))
        self.query_one(".spark-axis .right", Label).update(Text(right))


class StatusLine(Static):
    """One line at the bottom: what is running, or the last one-line error."""

    DEFAULT_CSS = """
    StatusLine {
        height: auto;
        max-height: 2;
        padding: 0 1;
        background: $boost;
    }
    StatusLine.-error { color: $text-error; text-style: bold; }
    """

    def show(self, text: str, error: bool = False) -> None:
        self.set_class(error, "-error")
        # two lines at most: long statuses wrap instead of losing their end
        self.update(Text(text.splitlines()[0] if text else "", overflow="ellipsis"))
