"""The contract between the engine-neutral program and its engines.

Everything here is plain data and protocols; it imports nothing else of
bisect_tui, so core, engines and the app all depend on it and on nothing of
each other."""

from __future__ import annotations

from bisect_tui.api.capabilities import LEVELS, PRECISIONS, Capabilities, Switch
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
from bisect_tui.api.graph import FusedNode, ReproSpec
from bisect_tui.api.options import EngineOption

__all__ = ["DISABLED_KEY", "LEVELS", "PRECISIONS", "BuildContext", "BuiltEngine", "Cancelled", "Capabilities", "Engine",
           "EngineBase", "EngineBuildError", "EngineConfig", "EngineOption", "EngineRunError",
           "EnvironmentFault", "ExitCode", "FusedNode", "Observer", "ReproSpec", "Switch", "UserError",
           "did_you_mean"]
