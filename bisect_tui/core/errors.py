"""User-facing errors and the exit codes the CLI documents.

They are defined in the contract (`bisect_tui.api.errors`), which engines
import; the rest of the program keeps importing them from here.
"""

from __future__ import annotations

from bisect_tui.api.errors import (  # noqa: F401
    Cancelled,
    EngineBuildError,
    EngineRunError,
    EnvironmentFault,
    ExitCode,
    UserError,
)

__all__ = ["Cancelled", "EngineBuildError", "EngineRunError", "EnvironmentFault", "ExitCode", "UserError"]
