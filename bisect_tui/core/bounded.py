"""Reading files a user or a stranger wrote, with limits set before the reading.

A mapping file, a session's JSON or an array header comes from outside: a YAML
alias bomb expands to gigabytes, JSON nested 100,000 deep overflows the
parser's recursion, an `.npz` member can claim a 37 GiB array in a 1 KiB file.
Each is bounded here before it is trusted (size before reading, depth and node
count while parsing, declared bytes against the file and the memory budget
before allocating), and every error quotes at most a short excerpt of the data.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from bisect_tui.core.errors import UserError
from bisect_tui.core.escape import term

# an error line quotes at most this much of a user's text
EXCERPT = 80
# structured files we read are small; the largest real mapping file we know of has
# a few thousand rules (~200 KiB)
MAX_STRUCTURED_BYTES = 4 << 20
MAX_DEPTH = 64
MAX_NODES = 200_000


def excerpt(text: Any, limit: int = EXCERPT) -> str:
    """`text` made safe for the terminal and cut to `limit` characters."""
    shown = term(text)
    return shown if len(shown) <= limit else shown[: limit - 3] + "..."


def json_depth(text: str) -> int:
    """The deepest nesting of `[`/`{` outside strings, without parsing (linear time)."""
    import re

    import numpy as np

    # strings can hold brackets; drop them (an unterminated one runs to the end)
    bare = re.sub(r'"(?:[^"\\]|\\.)*"?', "", text, flags=re.S)
    if not bare:
        return 0
    codes = np.frombuffer(bare.encode("utf-8", "replace"), dtype=np.uint8)
    step = (np.isin(codes, (ord("["), ord("{"))).astype(np.int32)
            - np.isin(codes, (ord("]"), ord("}"))).astype(np.int32))
    return int(np.cumsum(step).max(initial=0))


def parse_json(text: str, what: str, max_depth: int = MAX_DEPTH) -> Any:
    depth = json_depth(text)
    if depth > max_depth:
        raise UserError(f"{what} is nested {depth} levels deep (at most {max_depth} accepted); refused")
    try:
        return json.loads(text)
    except ValueError as exc:
        raise UserError(f"{what} is not valid JSON ({excerpt(exc)})") from None


def _bounded_yaml_loader(max_depth: int, max_nodes: int):
    import yaml
    from yaml.events import AliasEvent

    class Loader(yaml.SafeLoader):
        """safe_load's loader that refuses aliases (a mapping file needs none, and
        they are how a small file expands to gigabytes) and stops past the
        depth and node limits while composing, before anything is built."""

        def __init__(self, stream):
            super().__init__(stream)
            self._depth = 0
            self._nodes = 0

        def compose_node(self, parent, index):
            if self.check_event(AliasEvent):
                event = self.peek_event()
                raise UserError(f"YAML aliases (*{excerpt(event.anchor, 40)}) are not accepted here, "
                                f"line {event.start_mark.line + 1}; write the values out")
            self._nodes += 1
            if self._nodes > max_nodes:
                raise UserError(f"holds more than {max_nodes:,} YAML nodes; refused")
            self._depth += 1
            try:
                if self._depth > max_depth:
                    raise UserError(f"is nested more than {max_depth} levels deep; refused")
                return super().compose_node(parent, index)
            finally:
                self._depth -= 1

    return Loader


def parse_yaml(text: str, what: str, max_depth: int = MAX_DEPTH, max_nodes: int = MAX_NODES) -> Any:
    import yaml

    loader = _bounded_yaml_loader(max_depth, max_nodes)(text)
    try:
        return loader.get_single_data()
    except UserError as exc:
        raise UserError(f"{what}: {exc}") from None
    except yaml.YAMLError as exc:
        first = str(exc).splitlines()[0] if str(exc) else "syntax error"
        raise UserError(f"{what} is not valid YAML ({excerpt(first)})") from None
    finally:
        loader.dispose()


def read_text_capped(path: Path, what: str, max_bytes: int = MAX_STRUCTURED_BYTES) -> str:
    """A file's text, refused unread when it is larger than `max_bytes`."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if not path.is_file():
            raise UserError(f"{what} {term(path)} is not a regular file")
        if size > max_bytes:
            raise UserError(f"{what} {term(path)} is {size / 2**20:.1f} MiB; at most "
                            f"{max_bytes / 2**20:.0f} MiB accepted")
        with open(path, "rb") as fh:
            data = fh.read(max_bytes + 1)
        if len(data) > max_bytes:  # grew while we looked
            raise UserError(f"{what} {term(path)} is over {max_bytes / 2**20:.0f} MiB; refused")
        return data.decode("utf-8")
    except FileNotFoundError:
        raise UserError(f"{what} {term(path)} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{what} {term(path)} cannot be read ({excerpt(exc)})") from None


def read_structured(path: Path, what: str, max_bytes: int = MAX_STRUCTURED_BYTES) -> Any:
    """A JSON (`.json`) or YAML (`.yaml`/`.yml`) file, bounded in size, depth and nodes."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (".json", ".yaml", ".yml"):
        raise UserError(f"{what} {term(path)}: expected .json, .yaml or .yml")
    text = read_text_capped(path, what, max_bytes)
    label = f"{what} {term(path)}"
    return parse_json(text, label) if suffix == ".json" else parse_yaml(text, label)


def declared_bytes(shape: tuple[int, ...], itemsize: int) -> int:
    """Bytes an array header claims (Python ints: a forged shape cannot overflow)."""
    return math.prod(int(d) for d in shape) * int(itemsize)


def check_declared(shape: tuple[int, ...], itemsize: int, stored: int | None, budget: int | None,
                   what: str, hint: str = "raise it with --max-memory if this machine has the memory") -> int:
    """Refuse an array whose header claims more bytes than are stored after it, or
    more than the memory budget allows, before anything is allocated."""
    need = declared_bytes(shape, itemsize)
    if any(int(d) < 0 for d in shape):
        raise UserError(f"{what}: its header declares a negative dimension {tuple(shape)}; refused")
    if stored is not None and need > stored:
        raise UserError(f"{what}: its header declares {_size(need)} (shape {excerpt(tuple(shape), 60)}) "
                        f"but only {_size(stored)} are stored; a damaged or forged file, refused")
    if budget is not None and need > budget:
        raise UserError(f"{what} needs {_size(need)}, more than the memory budget of {_size(budget)} ({hint})")
    return need


def _size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"
