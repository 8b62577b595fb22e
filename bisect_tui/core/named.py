"""Names the user gives must name something in the model.

A mark or a keep-set entry that matches nothing was ignored without a word
(`--ov-mark no_such_tensor:0`, `--keep-fp32` with a typo, or 10,000 of them):
the run then "passed" or "failed" on a model the user did not describe. Each
name is checked once the model is read, and the first unknown one stops the run
with the closest real names.
"""

from __future__ import annotations

from typing import Iterable

from bisect_tui.core.errors import UserError


def _unknown(flag: str, given: Iterable[str], known: set[str], what: str) -> None:
    missing = [n for n in dict.fromkeys(given) if n not in known]
    if not missing:
        return
    import difflib

    from bisect_tui.core.bounded import excerpt

    hints = difflib.get_close_matches(missing[0], sorted(known), n=3, cutoff=0.6) if len(known) < 200_000 else []
    more = f" ({len(missing) - 1} more unknown)" if len(missing) > 1 else ""
    raise UserError(f"{flag} {excerpt(missing[0], 60)!r}: the model has no {what} of that name{more}"
                    + (f"; did you mean {', '.join(repr(excerpt(h, 60)) for h in hints)}?" if hints else ""))


def check_names(index, config, engine) -> None:
    """Keep-set entries name nodes, engine marks name tensors (GraphIndex `index`)."""
    if config.keep_fp32:
        _unknown("--keep-fp32", config.keep_fp32, set(index.by_name), "node")
    marks = engine.named_tensors(config)
    if marks:
        tensors = set(index.intermediate_tensors()) | set(index.graph_inputs)
        for flag, names in marks:
            _unknown(flag, names, tensors, "tensor")
