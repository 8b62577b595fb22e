"""The engine interface moved to `bisect_tui.api`; this name is kept while
callers move over."""

from bisect_tui.api import *  # noqa: F401,F403
from bisect_tui.api import __all__  # noqa: F401
