"""The checklist's steps, their order and what each needs first.

One declaration for the pipeline and the app: the app plans a run of some steps
from it (the missing ones they need, in checklist order), the pipeline's
`run_all` walks the same order, and a new step is added here once.
"""

from __future__ import annotations

from typing import Iterable, Mapping

# checklist order: the order the steps are shown and run in
CHECK_STEPS: tuple[str, ...] = ("inputs", "baseline", "determinism", "range_check", "fused")

# what a step reads from the steps before it (each writes its own result to the session)
NEEDS: dict[str, tuple[str, ...]] = {
    "inputs": (),
    "baseline": ("inputs",),
    "determinism": ("inputs", "baseline"),
    "range_check": ("inputs", "baseline"),
    "fused": ("inputs", "baseline"),
}


def plan_steps(targets: Iterable[str], have: Mapping[str, bool]) -> list[str]:
    """The steps to run for `targets`: each target plus what it needs that is not
    held yet (`have[step]`), in checklist order."""
    plan: set[str] = set()
    for target in targets:
        plan.update(d for d in NEEDS[target] if not have.get(d, False))
        plan.add(target)
    return [s for s in CHECK_STEPS if s in plan]
