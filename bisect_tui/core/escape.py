"""Model-supplied text made safe for the places we show it.

Node, tensor and file names come from other people's models and session
directories. They are data: in Markdown/HTML they must not open tags, links or
code spans; on a terminal they must not move the cursor, clear the screen or
retitle the window. Every report, the CLI and the app go through these helpers,
so one fix covers every view.
"""

from __future__ import annotations

import re
from typing import Any

# C0/C1 controls, DEL, and the Unicode bidi overrides that can reorder what a
# reader sees ("Trojan source").
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_CONTROL_ALL = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
# Markdown and HTML metacharacters a name can use to escape its cell or span.
_MD_SPECIAL = re.compile(r"([\\`*_\[\]#!|<>~&$])")


def _show_control(ch: str) -> str:
    code = ord(ch)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}"


def term(text: Any, keep_newlines: bool = False) -> str:
    """Text for a terminal: control characters are shown as \\x1b etc., never sent."""
    s = str(text)
    pattern = _CONTROL if keep_newlines else _CONTROL_ALL
    return pattern.sub(lambda m: _show_control(m.group(0)), s)


def md(text: Any) -> str:
    """Inline Markdown text (table cells, headings, list items): every metacharacter
    backslash-escaped, HTML's `<`/`>`/`&` as entities, newlines and controls shown."""
    s = term(text)
    s = s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")

    def esc(m: re.Match) -> str:
        ch = m.group(1)
        if ch in "<>&":  # already entities above; the regex sees the ';' forms
            return ch
        return "\\" + ch

    # entities contain '&' and ';' only; escape the rest after turning <>& into entities
    out = []
    i = 0
    for m in re.finditer(r"&(amp|lt|gt);", s):
        out.append(_MD_SPECIAL.sub(esc, s[i:m.start()]))
        out.append(m.group(0))
        i = m.end()
    out.append(_MD_SPECIAL.sub(esc, s[i:]))
    return "".join(out)


def md_code(text: Any) -> str:
    """An inline code span that no backtick inside the text can close early.

    CommonMark: a span opened by N backticks ends at the next run of exactly N,
    so the fence is one longer than the longest run inside. Controls are shown,
    and `<` cannot start HTML inside a code span anyway."""
    s = term(text)
    longest = max((len(r) for r in re.findall(r"`+", s)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if (s.startswith("`") or s.endswith("`") or not s.strip()) else ""
    return f"{fence}{pad}{s}{pad}{fence}"


_SAFE_TARGET = re.compile(r"^[A-Za-z0-9._\-/]+$")


def md_link(text: Any, target: str) -> str:
    """A link or image target that can only be a relative file name we wrote.

    Targets with a scheme (`javascript:`), absolute paths, `..` or characters
    outside a plain file name are refused: the text is shown without a link."""
    if not is_safe_relative_target(target):
        return md(text)
    return f"[{md(text)}]({target})"


def md_image(alt: Any, target: str) -> str:
    if not is_safe_relative_target(target):
        return md(alt)
    return f"![{md(alt)}]({target})"


def is_safe_relative_target(target: str) -> bool:
    if not target or not _SAFE_TARGET.match(target):
        return False
    if target.startswith("/") or ":" in target:
        return False
    return ".." not in target.split("/")


def safe_filename(name: Any, taken: set[str] | None = None, max_len: int = 80) -> str:
    """A file name (no directory part) made from model-supplied text.

    Unique within `taken` (which it updates): two outputs whose names sanitize
    alike get `-2`, `-3`... instead of silently overwriting each other."""
    base = re.sub(r"[^A-Za-z0-9._-]+", "_", str(name)).strip("._") or "tensor"
    base = base[:max_len]
    if taken is None:
        return base
    cand, n = base, 2
    while cand.lower() in taken:
        cand = f"{base}-{n}"
        n += 1
    taken.add(cand.lower())
    return cand
