"""The verdict on one compared tensor: every criterion checked, with its
measured value, its limit and its ratio, so a failure names what broke and by
how much, and a stored verdict can be read back from JSON.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field


@dataclass
class Criterion:
    """One evaluated criterion. ``ratio`` is how many times over the limit the
    measurement is (<= 1 passes), comparable across criteria."""

    name: str
    measured: float
    limit: float
    op: str  # "<=" or ">=": the relation that must hold
    text: str
    ok: bool
    ratio: float

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Criterion":
        return cls(**data)


@dataclass
class Verdict:
    passed: bool
    checked: list[Criterion] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # "min_topk: no class axis of size >= 2"

    @property
    def failed(self) -> list[Criterion]:
        return [c for c in self.checked if not c.ok]

    @property
    def ratio(self) -> float:
        """Worst ratio over the checked criteria (0.0 when nothing was checked)."""
        return max((c.ratio for c in self.checked), default=0.0)

    def summary(self) -> str:
        failed = self.failed
        if not failed:
            return "PASS"
        more = f"; +{len(failed) - 1} more" if len(failed) > 1 else ""
        return f"FAIL: {failed[0].text}{more}"

    def to_dict(self) -> dict:
        return {
            "passed": self.passed,
            "summary": self.summary(),
            "ratio": self.ratio,
            "failed": [c.name for c in self.failed],
            "checked": [c.to_dict() for c in self.checked],
            "skipped": list(self.skipped),
        }

    @classmethod
    def from_dict(cls, data: dict) -> "Verdict":
        return cls(
            passed=bool(data["passed"]),
            checked=[Criterion.from_dict(c) for c in data.get("checked", ())],
            skipped=list(data.get("skipped", ())),
        )
