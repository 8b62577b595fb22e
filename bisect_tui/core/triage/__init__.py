"""One triage of one model, split by idea: options.py (what was asked), steps.py
(the checklist's order), triage.py (the steps), overlap.py (work started beside
the dump), fused.py (the engine under test), summary.py (verdict and JSON
contract), records.py (typed results), frontend.py (PyTorch), catalog.py (where
engines come from). `bisect_tui.core.pipeline` re-exports the public names."""
