"""Pure domain logic. Nothing under here may import Textual (a test enforces it),
and no engine at all: engines reach the core through `bisect_tui.api`; heavy
libraries (torch, the engines' own) are imported inside functions so
that `bisect-tui --help` stays fast."""
