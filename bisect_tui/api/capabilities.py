"""What an engine can vary between builds (what the search asks it to vary is
a `Switch`, switch.py)."""

from __future__ import annotations

from dataclasses import dataclass

# optimization levels some engine offers, lowest first; each engine lists its own
# in `Capabilities.levels` (most have only "all")
LEVELS = ("disable", "basic", "extended", "all")
# every precision some engine runs; each engine lists its own in `Capabilities.precisions`
PRECISIONS = ("fp32", "fp16", "bf16")


@dataclass(frozen=True)
class Capabilities:
    """Which switches an engine honours, in the words of the capability table
    (docs/engines.md)."""

    marking: bool  # tensors can be made observable (extra outputs, debug tensors)
    # marking a tensor always stops the engine fusing across it. False when the
    # engine may keep a fusion behind a marked tensor (a normalisation kept whole):
    # then each build says which fusions survived (`BuiltEngine.fusions_across`)
    # and the search judges such regions in isolation.
    marking_blocks: bool
    pass_switches: bool  # named passes can be disabled (`EngineConfig.disabled_passes`)
    keep_high_precision: bool  # original nodes can be pinned to FP32 (a keep-set)
    levels: tuple[str, ...] = ("all",)  # optimization levels, lowest first
    precisions: tuple[str, ...] = ("fp32",)
    observation: str = ""  # how `observe` sees fused tensors, one line
    # op domains of nodes a layout rewrite makes: such a node stands for a whole
    # trunk, so a culprit found there is searched again at the lowest failing
    # level, whose map is finer
    coarse_domains: tuple[str, ...] = ()
    # a build may run in a thread beside other work of this process: the library
    # lets go of the GIL while it builds and the engine object holds no per-build
    # state (two session creations at once in two threads took 0.69 s against
    # 1.17 s one after the other on a 5,000-node model); such an engine calls
    # BuildContext.entered as the library takes over
    concurrent_builds: bool = False

    def problem(self, level: str, precision: str) -> str | None:
        """Why a config of this level and precision cannot be this engine's, or None."""
        if level not in self.levels:
            return f"level {level!r} is not one of {', '.join(self.levels)}"
        if precision not in self.precisions:
            return f"precision {precision!r} is not one of {', '.join(self.precisions)}"
        return None

