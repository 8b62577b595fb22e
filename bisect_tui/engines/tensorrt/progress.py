"""Build progress: TensorRT's builder phases as one line of user text.

Engine builds take seconds to minutes, so the engine reports where the
builder is. TensorRT calls an `IProgressMonitor` (TensorRT 10+, the method
names of NVIDIA/TensorRT samples/python/simple_progress_monitor):
`phase_start(phase_name, parent_phase, num_steps)`, `step_complete(phase_name,
step) -> bool` (False cancels the build), `phase_finish(phase_name)`.
`BuildProgress` is the pure bookkeeping (tested anywhere); `make_monitor`
wraps it for TensorRT when the installed module has the class."""

from __future__ import annotations

from typing import Callable, Optional


class BuildProgress:
    def __init__(self, report: Callable[[str], Optional[bool]]):
        self._report = report
        self._phases: dict = {}  # name -> [step, total, parent]
        self._order: list = []
        # set once the user said stop: the failed build that follows is a cancel, not a finding
        self.cancelled = False

    def _line(self) -> str:
        parts = []
        for name in self._order:
            step, total, _ = self._phases[name]
            parts.append(f"{name} {min(step, total)}/{total}" if total else name)
        return "building the TensorRT engine: " + (" > ".join(parts) if parts else "done")

    def phase_start(self, phase_name, parent_phase, num_steps) -> None:
        self._phases[str(phase_name)] = [0, int(num_steps or 0), parent_phase]
        self._order.append(str(phase_name))
        self._report(self._line())

    def step_complete(self, phase_name, step) -> bool:
        p = self._phases.get(str(phase_name))
        if p is not None:
            p[0] = int(step) + 1
        keep_going = self._report(self._line()) is not False
        self.cancelled = self.cancelled or not keep_going
        return keep_going

    def phase_finish(self, phase_name) -> None:
        name = str(phase_name)
        self._phases.pop(name, None)
        if name in self._order:
            self._order.remove(name)
        self._report(self._line())


def make_monitor(trt, report: Callable[[str], Optional[bool]]):
    """A `trt.IProgressMonitor` forwarding to `report`, or None when the
    installed TensorRT has no progress monitor."""
    base = getattr(trt, "IProgressMonitor", None)
    if base is None:
        return None

    class _Monitor(base):
        def __init__(self):
            base.__init__(self)
            self.state = BuildProgress(report)

        def phase_start(self, phase_name, parent_phase, num_steps):
            self.state.phase_start(phase_name, parent_phase, num_steps)

        def step_complete(self, phase_name, step):
            return self.state.step_complete(phase_name, step)

        def phase_finish(self, phase_name):
            self.state.phase_finish(phase_name)

    return _Monitor()
