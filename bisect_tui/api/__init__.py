"""The contract between the engine-neutral program and its engines.

Everything here is plain data and protocols; it imports nothing else of
bisect_tui, so core, engines and the app all depend on it and on nothing of
each other.

The names are loaded on first use (PEP 562): importing `bisect_tui.api.errors`
runs this file first, and the determinism check's second interpreter, which
needs the errors and the reference but no engine contract, paid for every
module and dataclass of the contract before."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bisect_tui.api.capabilities import LEVELS, PRECISIONS, Capabilities
    from bisect_tui.api.config import DISABLED_KEY, EngineConfig
    from bisect_tui.api.engine import BuildContext, BuiltEngine, Engine, EngineBase, Observer
    from bisect_tui.api.errors import (
        Cancelled,
        EngineBuildError,
        EngineRunError,
        EnvironmentFault,
        ExitCode,
        UserError,
        did_you_mean,
    )
    from bisect_tui.api.graph import FusedNode
    from bisect_tui.api.options import EngineOption
    from bisect_tui.api.repro import ReproSpec
    from bisect_tui.api.switch import Switch

# name -> the module of bisect_tui.api that defines it
_WHERE = {
    **dict.fromkeys(("LEVELS", "PRECISIONS", "Capabilities"), "capabilities"),
    **dict.fromkeys(("DISABLED_KEY", "EngineConfig"), "config"),
    **dict.fromkeys(("BuildContext", "BuiltEngine", "Engine", "EngineBase", "Observer"), "engine"),
    **dict.fromkeys(("Cancelled", "EngineBuildError", "EngineRunError", "EnvironmentFault", "ExitCode",
                     "UserError", "did_you_mean"), "errors"),
    "FusedNode": "graph",
    "ReproSpec": "repro",
    "EngineOption": "options",
    "Switch": "switch",
}

__all__ = ["DISABLED_KEY", "LEVELS", "PRECISIONS", "BuildContext", "BuiltEngine", "Cancelled", "Capabilities", "Engine",
           "EngineBase", "EngineBuildError", "EngineConfig", "EngineOption", "EngineRunError",
           "EnvironmentFault", "ExitCode", "FusedNode", "Observer", "ReproSpec", "Switch", "UserError",
           "did_you_mean"]


def __getattr__(name: str):
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # the next look-up is an ordinary one
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
