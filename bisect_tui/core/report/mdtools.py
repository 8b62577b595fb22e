"""Markdown building blocks for the report: escaping of model text, tables,
fenced blocks and image links that stay inside the report's folder."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote

from bisect_tui.core.escape import is_safe_relative_target, md, md_code, term
from bisect_tui.core.report.words import fmt

# Plain names (letters, digits, `.`, `/`, `-`, underscores inside words) read
# the same raw and escaped; anything else goes through md().
_PLAIN = re.compile(r"[A-Za-z0-9./-]+(?:_[A-Za-z0-9./-]+)*")


def text(x: Any) -> str:
    """Model- or user-supplied text for Markdown: left as is when plain, else escaped."""
    s = str(x)
    return s if _PLAIN.fullmatch(s) else md(s)


def code_cell(x: Any) -> str:
    """A code span for a table cell (GFM splits cells at `|` even inside code)."""
    return md_code(x).replace("|", "\\|")


def table(headers: list[str] | tuple[str, ...], rows: list[list[Any]]) -> str:
    """Cells are already escaped by the caller (text, code_cell, numbers we format)."""
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for r in rows:
        out.append("| " + " | ".join(_cell(c) for c in r) + " |")
    return "\n".join(out)


def _cell(c: Any) -> str:
    if isinstance(c, (int, float)) or c is None:
        return fmt(c) if c is not None else ""
    if isinstance(c, list):
        return text(", ".join(str(x) for x in c))
    return str(c).replace("\n", " ")


def fenced(lines: list[str]) -> list[str]:
    """A code block no backtick run inside can close early, controls shown."""
    body = [term(line) for line in lines]
    longest = max((len(r) for line in body for r in re.findall(r"`+", line)), default=0)
    fence = "`" * max(3, longest + 1)
    return [fence, *body, fence]


def image(alt: str, target: str) -> str:
    """An image link to a plot we wrote: the path is relative to the report
    (it may climb with `..` to the session's plots folder) and percent-encoded;
    anything with a scheme or an absolute path is not linked."""
    rel = str(target).replace("\\", "/")
    if rel.startswith("/") or ":" in rel or not rel:
        return md(alt)
    url = rel if is_safe_relative_target(rel) else quote(rel, safe="/._-")
    return f"![{md(alt)}]({url})"


LONG_TABLE_ROWS = 20  # longer tables fold away in <details> (GitHub shows them on a click)


def details(summary: str, lines: list[str], fold: bool = True) -> list[str]:
    """`lines` inside a <details> block when `fold`, else as they are; the blank
    lines around them let GitHub render the Markdown inside the HTML."""
    import html

    if not fold:
        return lines
    return ["<details>", f"<summary>{html.escape(summary)}</summary>", "", *lines, "", "</details>"]
