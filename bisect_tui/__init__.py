"""bisect-tui: find the fused operator that breaks numerical tolerance."""

__version__ = "0.1.0"
