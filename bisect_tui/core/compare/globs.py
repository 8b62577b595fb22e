"""Glob matching with captures in polynomial time.

A mapping rule's test side is a glob whose wildcards capture text for the golden
side (`"dec_*": "decoder/*:0"`). Translated to a regex, each `*` became `(.*)`,
and 25 stars against a 60-character name backtracked for ever: the file is the
user's, so its patterns must not be able to hang the tool. Here a table of
"pattern from j matches text from i" is filled once (O(len(pattern) x
len(text))), and the captures are read off it, each `*` taking the longest text
that still lets the rest match: the same answer a backtracking regex gives,
without the backtracking.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Optional

# longer patterns are refused when a mapping file is read (matching.py): a name
# rule is a name, and the table above grows with the pattern's length
MAX_PATTERN = 1000

_STAR, _ONE, _SET, _LIT = range(4)


@lru_cache(maxsize=512)
def _tokens(pattern: str) -> tuple[tuple[int, object], ...]:
    """`*`, `?`, `[set]` / `[!set]` and literal characters, as fnmatch reads them."""
    out: list[tuple[int, object]] = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "*":
            if not out or out[-1][0] != _STAR:  # `**` matches what `*` matches
                out.append((_STAR, None))
        elif c == "?":
            out.append((_ONE, None))
        elif c == "[":
            j = pattern.find("]", i + 2)
            if j == -1:
                out.append((_LIT, c))
            else:
                body = pattern[i + 1 : j]
                negate = body.startswith("!")
                out.append((_SET, (negate, _char_set(body[1:] if negate else body))))
                i = j
        else:
            out.append((_LIT, c))
        i += 1
    return tuple(out)


def _char_set(body: str) -> tuple[tuple[str, str], ...]:
    """Ranges `a-z` and single characters of a bracket expression."""
    ranges, k = [], 0
    while k < len(body):
        if k + 2 < len(body) and body[k + 1] == "-":
            ranges.append((body[k], body[k + 2]))
            k += 3
        else:
            ranges.append((body[k], body[k]))
            k += 1
    return tuple(ranges)


def _one(tok: tuple[int, object], ch: str) -> bool:
    kind, arg = tok
    if kind == _ONE:
        return True
    if kind == _LIT:
        return ch == arg
    negate, ranges = arg  # type: ignore[misc]
    inside = any(lo <= ch <= hi for lo, hi in ranges)
    return inside != negate


def captures(pattern: str, text: str) -> Optional[tuple[str, ...]]:
    """The text each wildcard (`*`, `?`, `[...]`) matched, left to right, or None
    when `text` does not match `pattern` as a whole."""
    toks = _tokens(pattern)
    n, m = len(toks), len(text)
    # ok[j][i]: toks[j:] matches text[i:]
    ok = [bytearray(m + 1) for _ in range(n + 1)]
    ok[n][m] = 1
    for j in range(n - 1, -1, -1):
        tok, row, nxt = toks[j], ok[j], ok[j + 1]
        if tok[0] == _STAR:
            acc = 0
            for i in range(m, -1, -1):
                acc = acc or nxt[i]
                row[i] = acc
        else:
            for i in range(m - 1, -1, -1):
                if nxt[i + 1] and _one(tok, text[i]):
                    row[i] = 1
    if not ok[0][0]:
        return None
    caps: list[str] = []
    i = 0
    for j, tok in enumerate(toks):
        if tok[0] == _STAR:
            end = m
            while not ok[j + 1][end]:  # the longest span that leaves a match
                end -= 1
            caps.append(text[i:end])
            i = end
        else:
            if tok[0] != _LIT:
                caps.append(text[i])
            i += 1
    return tuple(caps)


def matches(pattern: str, text: str) -> bool:
    return captures(pattern, text) is not None
