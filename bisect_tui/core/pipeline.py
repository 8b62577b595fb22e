"""The triage's public names in one import, for the CLI, the app, `resume` and
the tests: the code lives in bisect_tui/core/triage/."""

from __future__ import annotations

from bisect_tui.core.triage.options import TriageOptions
from bisect_tui.core.triage.records import SCHEMA_VERSION, CheckResult, OutputVerdict, Summary
from bisect_tui.core.triage.steps import CHECK_STEPS, NEEDS, plan_steps
from bisect_tui.core.triage.summary import overall_exit
from bisect_tui.core.triage.triage import Triage

__all__ = ["CHECK_STEPS", "NEEDS", "SCHEMA_VERSION", "CheckResult", "OutputVerdict", "Summary", "Triage",
           "TriageOptions", "overall_exit", "plan_steps"]
