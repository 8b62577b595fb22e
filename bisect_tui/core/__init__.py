"""Pure domain logic. Nothing under here may import Textual (a test enforces it),
and heavy engines (onnxruntime, torch, tensorrt) are imported inside functions so
that `bisect-tui --help` stays fast."""
