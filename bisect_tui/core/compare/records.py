"""Typed results of `compare`: what was loaded, converted, matched, found and judged.

Frozen so a result built by the core can be handed to the CLI, the report and
the app without anyone editing it on the way; `to_dict` is the JSON contract.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from bisect_tui.core.tolerance import Tolerance, ToleranceSpec, Verdict


@dataclass(frozen=True)
class Loaded:
    """One tensor read from a dump: the name it is matched by and where it came from."""

    name: str
    file: Path
    key: Optional[str]  # the member of an .npz, None for a .npy
    dtype: str  # as stored on disk (uint16 for raw half-precision bits)
    shape: tuple[int, ...]
    sha256: Optional[str] = None  # a session baseline file: its manifest digest, checked on read
    offset: Optional[int] = None  # a packed session tensor: where its .npy starts in the pack

    @property
    def where(self) -> str:
        return f"{self.file.name}[{self.key}]" if self.key is not None else self.file.name


@dataclass(frozen=True)
class Source:
    """GOLDEN or TEST: a file or a folder of dumps, or a session's baseline."""

    path: Path
    kind: str  # "npy" | "npz" | "dir" | "session"
    tensors: tuple[Loaded, ...]
    note: str = ""  # e.g. "session baseline, 32 files match their manifest SHA-256"
    samples_axis: bool = False  # a session baseline stores a leading samples axis

    def by_name(self) -> dict[str, Loaded]:
        return {t.name: t for t in self.tensors}


@dataclass(frozen=True)
class Conversion:
    """What was done to one side's values before subtracting, and whether it was exact."""

    side: str  # "golden" | "test"
    from_dtype: str
    to_dtype: str
    how: str
    exact: bool = True

    def text(self) -> str:
        loss = "" if self.exact else " (not exact)"
        return f"{self.side}: {self.from_dtype} -> {self.to_dtype}, {self.how}{loss}"


@dataclass(frozen=True)
class Finding:
    """A pitfall detector's result in plain words: what it saw, why, what to do."""

    kind: str  # "softmax" | "batch_order" | "ranking"
    text: str
    fix: str
    permutation: Optional[tuple[int, ...]] = None  # batch_order: test row i holds golden row permutation[i]
    axis: Optional[int] = None


@dataclass(frozen=True)
class Pair:
    """A test tensor and the golden tensor it is judged against."""

    test: Loaded
    golden: Loaded
    how: str  # "same name" | "mapping file rule 'x*' -> 'y*'" | "file-safe name"
    dtype_hint: Optional[str] = None  # "fp16" | "bf16" | ... from --test-dtype or the mapping file
    scale: Optional[float] = None
    zero_point: float = 0.0


@dataclass(frozen=True)
class TensorResult:
    pair: Pair
    shape: tuple[int, ...]
    conversions: tuple[Conversion, ...]
    tolerance: Tolerance
    tolerance_from: str  # "--preset fp16" | "the test's dtype float16" | "--tol override"
    metrics: dict  # metrics.compare() output (plain JSON types)
    verdict: Verdict
    findings: tuple[Finding, ...] = ()
    naive_max_abs: Optional[float] = None  # |golden - test| with no alignment, when it differs

    @property
    def passed(self) -> bool:
        return self.verdict.passed

    def to_dict(self) -> dict:
        p = self.pair
        return {
            "test": p.test.name,
            "golden": p.golden.name,
            "test_file": p.test.where,
            "golden_file": p.golden.where,
            "matched_by": p.how,
            "shape": list(self.shape),
            "conversions": [dataclasses.asdict(c) for c in self.conversions],
            "tolerance": self.tolerance.to_dict(),
            "tolerance_from": self.tolerance_from,
            "passed": self.passed,
            "verdict": self.verdict.to_dict(),
            "findings": [_finding_dict(f) for f in self.findings],
            "naive_max_abs": self.naive_max_abs,
            "metrics": self.metrics,
        }


def _finding_dict(f: Finding) -> dict:
    d = dataclasses.asdict(f)
    if f.permutation is not None:
        d["permutation"] = list(f.permutation)
    return d


@dataclass(frozen=True)
class Unmatched:
    side: str  # which side the name is on
    name: str
    suggestions: tuple[str, ...] = ()

    def text(self) -> str:
        hint = f" (did you mean {', '.join(repr(s) for s in self.suggestions)}?)" if self.suggestions else ""
        return f"{self.name!r}{hint}"


@dataclass(frozen=True)
class CompareResult:
    golden: Source
    test: Source
    spec: ToleranceSpec
    tensors: tuple[TensorResult, ...]
    unmatched_test: tuple[Unmatched, ...] = ()
    unmatched_golden: tuple[Unmatched, ...] = ()
    mapping_file: Optional[Path] = None
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def passed(self) -> bool:
        return bool(self.tensors) and all(t.passed for t in self.tensors)

    @property
    def exit_code(self) -> int:
        return 0 if self.passed else 1

    @property
    def failing(self) -> list[TensorResult]:
        return [t for t in self.tensors if not t.passed]

    def to_dict(self) -> dict[str, Any]:
        return {
            "tool": "bisect-tui compare",
            "verdict": "pass" if self.passed else "fail",
            "exit_code": self.exit_code,
            "golden": _source_dict(self.golden),
            "test": _source_dict(self.test),
            "mapping_file": str(self.mapping_file) if self.mapping_file else None,
            "tolerance": self.spec.to_dict(),
            "tensors": [t.to_dict() for t in self.tensors],
            "failing": [t.pair.test.name for t in self.failing],
            "unmatched_test": [dataclasses.asdict(u) for u in self.unmatched_test],
            "unmatched_golden": [dataclasses.asdict(u) for u in self.unmatched_golden],
            "notes": list(self.notes),
        }


def _source_dict(s: Source) -> dict:
    return {"path": str(s.path), "kind": s.kind, "tensors": len(s.tensors), "note": s.note}
