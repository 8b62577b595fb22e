"""Reports that can be pasted into a bug tracker as they are, warnings a user
needs, and help for every option."""

from __future__ import annotations

import json
import shlex
import zipfile

from bisect_tui.cli import build_parser, main, options_from_args
from bisect_tui.core.report import check_markdown, distinct, sensitivity_text
from bisect_tui.core.memory import memory_budget_warning

GELU = ["--ort-config", "optimization.enable_gelu_approximation=1"]


def run(argv, capsys):
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_bisect_report_ready_for_an_issue(samples, tmp_path, capsys):
    model = samples / "transformer_block.onnx"
    sess = tmp_path / "s"
    report = tmp_path / "out" / "issue.md"
    code, out, err = run(["bisect", model, "--session", sess, *GELU, "--atol", "2e-4", "--report", report,
                          "--json", tmp_path / "r.json", "-q"], capsys)
    assert code == 1, err
    md = report.read_text()
    # the title says what this is: a bisection and its culprit, not "check: FAIL"
    assert md.startswith("# bisect-tui bisect: culprit(s) found: FastGelu")
    # no local absolute path: the model by name, the session relative or by name
    assert str(tmp_path) not in md and "/tmp/" not in md
    # the settings as the user writes them, quoted for a shell, and they parse back to the same run
    cmd = next(line for line in md.splitlines() if line.startswith("bisect-tui bisect "))
    argv = shlex.split(cmd)[1:]
    assert argv[1] == "transformer_block.onnx"
    argv[1] = str(model)
    again = options_from_args(build_parser().parse_args(argv))
    orig = options_from_args(build_parser().parse_args(["bisect", str(model), *GELU, "--atol", "2e-4"]))
    assert again.to_dict() == orig.to_dict()
    assert "{'optimization" not in md  # no Python dict
    # plots next to the report, referenced by file name, and in the bundle
    assert "](issue-plots/error-along-graph.png)" in md and "](issue-plots/mlp_residual_0.png)" in md
    assert (tmp_path / "out" / "issue-plots" / "error-along-graph.png").read_bytes()[:4] == b"\x89PNG"
    names = zipfile.ZipFile(sess / "bundle.zip").namelist()
    assert "plots/error-along-graph.png" in names and "plots/mlp_residual_0.png" in names
    inside = zipfile.ZipFile(sess / "bundle.zip").read("REPORT.md").decode()
    assert "](plots/error-along-graph.png)" in inside
    # the worst elements with enough digits that the three values read differently
    r = json.loads((tmp_path / "r.json").read_text())
    w = r["bisect"]["culprits"][0]["worst_elements"][0]
    truth, unfused, fused = distinct([w["truth"], w["unfused"], w["fused"]])
    assert len({truth, unfused, fused}) == len({w["truth"], w["unfused"], w["fused"]})
    assert f"| {truth} | {unfused} | {fused} |" in md
    # user words for the verdict, never the raw JSON word
    assert "**Verdict: culprit(s) found**" in md and "Verdict: culprits" not in md
    assert "_plot_files" not in r and "plots" not in r  # the JSON stays the documented contract


def test_distinct_digits_and_honest_sensitivity():
    assert distinct([2.6940001, 2.6940003, 2.69412]) == ["2.6940001", "2.6940003", "2.69412"]
    assert distinct([1.5, 1.5, None]) == ["1.5", "1.5", "-"]
    close = sensitivity_text({"ratio": 0.95, "amplifies": False})
    assert "well below" not in close and "close to it" in close
    assert "well below" in sensitivity_text({"ratio": 0.01, "amplifies": False})
    assert "not far" in sensitivity_text({"ratio": 0.3, "amplifies": False})
    assert "amplifies" in sensitivity_text({"ratio": 3.0, "amplifies": True})


def test_long_tables_say_how_many_rows_are_left_and_where(samples, tmp_path, capsys):
    run(["check", samples / "transformer_block.onnx", "--session", tmp_path / "s", *GELU,
         "--json", tmp_path / "r.json", "-q"], capsys)
    s = json.loads((tmp_path / "r.json").read_text())
    n = len(s["fused_nodes"])
    md = check_markdown(s)
    assert md.count("| `") >= n and "not shown" not in md  # every fused node listed
    s["fused_nodes"] = s["fused_nodes"] * 50
    md = check_markdown(s)
    assert f"{len(s['fused_nodes']) - 300} more fused node(s) not shown" in md and "report.json" in md


def test_memory_budget_below_the_process_floor_warns(samples, tmp_path, capsys):
    assert memory_budget_warning(512 << 20, 100 << 20, 200 << 20, 1 << 20) == ""
    text = memory_budget_warning(64 << 20, 150 << 20, 230 << 20, 4 << 20)
    assert "below what the process needs" in text and "--max-memory 263M" in text
    code, _, err = run(["check", samples / "transformer_block.onnx", "--session", tmp_path / "s",
                        "--max-memory", "32M", "--json", tmp_path / "r.json"], capsys)
    assert code == 0
    assert "bisect-tui: warning: --max-memory 32 MB is below what the process needs" in err
    r = json.loads((tmp_path / "r.json").read_text())
    assert "one per group" in r["baseline"]["memory_warning"]


def test_every_option_has_help():
    parser = build_parser()
    subs = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    missing = []
    for name, sub in subs.choices.items():
        for action in sub._actions:
            if action.help in (None, "") and action.dest != "help":
                missing.append(f"{name} {'/'.join(action.option_strings) or action.dest}")
    assert missing == []
    text = subs.choices["check"].format_help()
    for flag in ("--atol X", "--rtol X", "--min-cosine X", "--input-value NAME=VALUE"):
        assert flag in text


def test_plots_take_model_names_with_dollar_signs(tmp_path):
    """`$` starts matplotlib mathtext (an unbalanced one raises): names are data."""
    from bisect_tui.core.plots import ErrorProfile, error_profile_png, value_histograms

    prof = ErrorProfile(["a$b", "x$$y$", "c"], ["Mul", "Add", "Relu"], [0.1, 3.0, 5.0], 1, [2])
    error_profile_png(tmp_path / "p.png", prof)
    from bisect_tui.core.triage.records import OutputVerdict

    o = OutputVerdict(metrics={"ref_hist": {"edges": [0, 1, 2], "counts": [1, 2]},
                               "test_hist": {"edges": [0, 1, 2], "counts": [2, 1]}, "error_hist": {}},
                      tolerance={}, passed=False, verdict={}, summary="")
    assert value_histograms(tmp_path / "h.png", "out$put$$", o)
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG" == (tmp_path / "h.png").read_bytes()[:4]


def test_error_profile_text_marks_the_jump():
    from bisect_tui.core.plots import ErrorProfile
    from bisect_tui.tui.widgets.errorprofile import profile_text

    prof = ErrorProfile([f"t{i}" for i in range(6)], ["Add"] * 6, [0, 1e-3, 1e-2, 40.0, 50.0, 60.0], 3, [3])
    text = profile_text(prof, 40, 6).plain
    lines = text.splitlines()
    assert any(line.startswith("x1 tol") and "┄" in line for line in lines)
    marks = lines[6]
    assert marks.strip() == "C"  # the culprit's tensor, at the first crossing
    assert marks.index("C") == 7 + 17  # tensor #3 starts at column ceil(3 * 33 / 6) of 33
    assert "▲ first crossing: #3 t3 (Add, x40 of the tolerance)" in text
    assert "3 above the tolerance" in text


def test_both_renderers_show_the_same_sections(samples, tmp_path, capsys):
    """The text and the Markdown render one section model: the same outputs with the same
    verdicts, the baseline as its manifest says it ran, the engine's own settings lines."""
    from bisect_tui.core.report import check_text, outputs_section
    from bisect_tui.core.report.sections import summary_of

    sess = tmp_path / "s"
    code, _, err = run(["check", samples / "transformer_block.onnx", "--session", sess, *GELU,
                        "--json", tmp_path / "r.json", "-q"], capsys)
    assert code == 1, err
    s = json.loads((tmp_path / "r.json").read_text())
    text, md = check_text(s), check_markdown(s, base=tmp_path)
    rows = outputs_section(summary_of(s).check).table.rows
    assert [r[0] for r in rows] == list(s["outputs"]) == ["mlp/residual:0"]
    for name, passed, *_ in rows:
        word = "PASS" if passed else "FAIL"
        assert f"[{word}] {name}:" in text and f"| {name} | {word} |" in md
    # how the baseline ran, in the words its manifest keeps
    opts = json.loads((sess / "baseline" / "manifest.json").read_text())["options"]
    size = f"{s['baseline']['bytes'] / (1 << 20):.1f} MB"
    assert f"tensors dumped ({size}), {opts['optimization']}, FP32, CPU\n" in md
    # the engine's own describe() lines, kept in report.json
    assert s["engine_settings"] and all(f"- {label}: " in md for label, _ in s["engine_settings"])
    # a report.json read where its session is not: the summary carries the manifest's words
    moved = {**s, "baseline": {**s["baseline"], "dir": str(tmp_path / "elsewhere")}}
    assert f"tensors dumped ({size}), {opts['optimization']}, FP32, CPU\n" in check_markdown(moved, base=tmp_path)
    # one written before the summary carried them: the line without those words
    older = {**moved, "baseline": {k: v for k, v in moved["baseline"].items() if k != "options"}}
    assert f"tensors dumped ({size}), FP32, CPU\n" in check_markdown(older, base=tmp_path)
