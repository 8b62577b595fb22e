"""The unfused side of every comparison, as a contract.

Every verdict compares the fused engine with a *reference*: the FP32 baseline
(the prepared model run unfused, every optimization off), a float64 truth, or
the framework's own hooks. Core holds no library of its own for that: it is
handed an `UnfusedReference` and asks it for sessions, so the baseline dump,
the determinism check's second run, the 1-ulp run, the input probe and the
subgraph judgements speak to one object whose name and versions go into the
session, and a new reference is one class beside the engine that owns its
library.

What is core's stays core's: the memory-bounded marking loop (which tensors
in which group, streamed to a `Sink`), the engine log and the wording of
errors. A reference only opens sessions and says who it is.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping, Protocol, Sequence, runtime_checkable

if TYPE_CHECKING:  # annotations only: the contract stays free to import
    import numpy as np
    import onnx


@runtime_checkable
class Reference(Protocol):
    """One sample in, the requested tensors out: what the arbiter and the
    cross-checks hold, whichever reference computed it (`name` says which)."""

    name: str

    def run(self, feeds: dict[str, "np.ndarray"], tensors: Sequence[str]) -> dict[str, "np.ndarray"]:
        """Graph inputs by name -> the requested tensors (no samples axis)."""
        ...


class Sink(Protocol):
    """Where a group run streams its arrays, tensor by tensor and sample by
    sample (a sink may also have `end_group()`, called after each group)."""

    def write(self, tensor: str, sample: int, array: "np.ndarray") -> None: ...

    def end(self, tensor: str) -> None: ...


@dataclass(frozen=True)
class GroupRun:
    groups: int
    tensors: int
    skipped: list[str] = field(default_factory=list)  # tensors not returned as arrays (sequences, maps)


class UnfusedSession(Protocol):
    """One model opened unfused: run as often as needed, for every sample."""

    def output_names(self) -> list[str]:
        """The model's outputs, marked tensors included, in the session's order."""
        ...

    def run(self, names: Sequence[str], feeds: Mapping[str, "np.ndarray"]) -> list:
        """The `names` outputs for one sample's `feeds` (arrays, or the library's
        own objects for outputs that are not tensors)."""
        ...


class UnfusedReference(Protocol):
    """The FP32 baseline's runner: the prepared model with nothing fused.

    `session` raises the error its library gave (core words it and writes the
    whole text to the engine log); one it has worded already may be a
    `UserError`, which core passes on as it is."""

    name: str  # what computed the baseline, in reports: "onnxruntime unfused (..., FP32)"
    label: str  # the library as messages name it: "... could not load the model"
    library: str  # the package computing the values (also in float64 where asked)
    mode: str  # its unfused setting, short
    spec: str  # "module:attribute" that makes it again in another process of this tool
    # optional (read with getattr): True when it runs each node as its own kernel on its
    # own inputs, so the graph cut at a tensor that alone carries it, run as parts, gives
    # every tensor bit for bit (the determinism check's second run is then made so)

    def session(self, model: "onnx.ModelProto") -> UnfusedSession:
        """`model` opened unfused, in FP32, on the CPU, quietly and without
        busy-waiting threads (it runs beside builds and other work)."""
        ...

    def versions(self) -> dict[str, str]:
        """Its own libraries' versions, recorded with every baseline."""
        ...

    def cache_key(self) -> str:
        """What identifies its numbers in the baseline's cache key (a library
        upgrade may change them, so a saved dump is not reused across it)."""
        ...

    def settings(self) -> dict[str, str]:
        """How it ran, for the baseline manifest's options."""
        ...

    def error_text(self, exc: BaseException) -> str:
        """The first line of a library error, without the library's own prefixes."""
        ...

    def check_loadable(self, model: "onnx.ModelProto", path: Path) -> None:
        """Raise `UserError` (one line) for a model this reference cannot load at
        all and the user can fix (an opset its runtime has no kernels for), before
        any work. Nothing to say: return."""
        ...

    def warm_up(self) -> None:
        """Import the library now (a process waiting for work does it ahead)."""
        ...
