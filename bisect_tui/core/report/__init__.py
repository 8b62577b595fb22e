"""Human views of the JSON results (`report.json` is the contract).

One section model (`sections.py`, `search.py`, `framework.py`: each section
computed once as data) and two renderers, `text.py` for the terminal and
`markdown.py` / `markdown_search.py` for the report file; `advice.py` says
what to do next. Each section says what was found, why it matters and what to
do next. The names below are what callers import."""

from __future__ import annotations

from bisect_tui.core.report.advice import arbiter_all_too_tight, export_next_step, next_step
from bisect_tui.core.report.framework import framework_lines, framework_section
from bisect_tui.core.report.markdown import MAX_TABLE_ROWS, arbiter_markdown, check_markdown, environment_md, framework_markdown
from bisect_tui.core.report.markdown_search import bisect_markdown, bisect_title
from bisect_tui.core.report.search import (
    culprit_lines, culprits_section, evidence_lines, passes_text, precision_lines, region_lines,
    workaround_line, workaround_section,
)
from bisect_tui.core.report.sections import (
    Section, Table, arbiter_lines, arbiter_section, determinism_line, output_line, outputs_section,
    precision_used_line, range_lines,
)
from bisect_tui.core.report.text import bisect_text, check_text
from bisect_tui.core.report.words import (
    BISECT_VERDICT, VERDICT_TEXT, cos_text, distinct, fmt, sensitivity_text, shown_path, tolerance_text
)

__all__ = [
    "BISECT_VERDICT", "MAX_TABLE_ROWS", "Section", "Table", "VERDICT_TEXT", "arbiter_all_too_tight",
    "arbiter_lines", "arbiter_markdown", "arbiter_section", "bisect_markdown", "bisect_text", "bisect_title",
    "check_markdown", "check_text", "cos_text", "culprit_lines", "culprits_section", "determinism_line",
    "distinct", "environment_md", "evidence_lines", "export_next_step", "fmt", "framework_lines",
    "framework_markdown", "framework_section", "next_step", "output_line", "outputs_section", "passes_text",
    "precision_lines", "precision_used_line", "range_lines", "region_lines", "sensitivity_text", "shown_path",
    "tolerance_text", "workaround_line", "workaround_section",
]
