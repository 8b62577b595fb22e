"""report.md pasted whole into a GitHub issue: rendered as GitHub would (CommonMark
with tables and HTML, markdown-it-py) and read as a maintainer reads it: the summary
first, the evidence as text, long tables folded, no repro section without a bundle,
nothing that needs an image."""

from __future__ import annotations

import json

from markdown_it import MarkdownIt

from bisect_tui.cli import main
from bisect_tui.core.report import check_markdown

GELU = ["--ort-config", "optimization.enable_gelu_approximation=1"]


def rendered(text: str):
    return MarkdownIt("commonmark", {"html": True}).enable("table").parse(text)


def headings(tokens) -> list[str]:
    return [tokens[i + 1].content for i, t in enumerate(tokens) if t.type == "heading_open"]


def section_text(tokens, title: str) -> list[str]:
    """The inline text a reader sees under heading `title`, up to the next heading of any level."""
    out, inside = [], False
    for i, t in enumerate(tokens):
        if t.type == "heading_open":
            inside = tokens[i + 1].content == title
            continue
        if inside and t.type == "inline" and tokens[i - 1].type != "heading_open":
            out.append("".join(c.content for c in t.children if c.type in ("text", "code_inline")))
        if inside and t.type == "fence":
            out.append(t.content)
    return out


def images(tokens) -> list[str]:
    return [c.attrs["src"] for t in tokens if t.type == "inline" for c in t.children if c.type == "image"]


def run(argv, capsys):
    code = main([str(a) for a in argv])
    capsys.readouterr()
    return code


def test_bisect_report_reads_as_a_bug_report(samples, tmp_path, capsys):
    sess, report = tmp_path / "s", tmp_path / "out" / "issue.md"
    assert run(["bisect", samples / "transformer_block.onnx", "--session", sess, *GELU, "--atol", "2e-4",
                "--report", report, "--json", tmp_path / "r.json", "-q"], capsys) == 1
    r = json.loads((tmp_path / "r.json").read_text())
    tokens = rendered(report.read_text())
    heads = headings(tokens)
    assert heads[0].startswith("bisect-tui bisect: culprit(s) found: FastGelu")
    assert heads[1] == "Summary"  # before the run, the environment and the evidence
    assert heads.index("Environment") < heads.index("Error along the graph") < heads.index("Bisection: culprit(s) found")
    assert heads.index("How to reproduce") < heads.index("Plots (optional)") == len(heads) - 1
    summary = section_text(tokens, "Summary")
    by_key = {line.split(":", 1)[0]: line.split(":", 1)[1].strip() for line in summary}
    assert by_key["verdict"].startswith("FAIL: the fused engine breaks tolerance; bisection: culprit(s) found")
    assert by_key["engine"].startswith("ONNX Runtime, ORT_ENABLE_ALL, FP32")
    for lib, version in r["versions"].items():  # every library's version, as report.json has it
        if isinstance(version, str):
            assert f"{lib} {version}" in by_key["versions"]
    assert by_key["culprit"] == "FastGelu FastGelu made by GeluApproximation, replacing 5 original node(s)"
    assert by_key["workaround"].startswith("disable GeluApproximation: the full engine then passes")
    assert by_key["reproduce"] == ("bisect-tui bisect transformer_block.onnx --ort-config "
                                   "optimization.enable_gelu_approximation=1 --atol 0.0002")
    # the evidence as text: the error along the graph marks the first crossing, histograms per output
    graph = "\n".join(section_text(tokens, "Error along the graph"))
    first = r["shared_tensors"]["first_failing_tensor"]
    assert f"▲ first crossing: #" in graph and first in graph and "x1 tol ┄" in graph
    hist = "\n".join(section_text(tokens, "Output histograms"))
    assert "mlp/residual:0 (FAIL)" in hist and "log10 |error|" in hist
    # images only in the optional last section; the bundle's repro as it is in bundle.zip
    plots_at = heads.index("Plots (optional)")
    assert images(tokens) == ["issue-plots/error-along-graph.png", "issue-plots/mlp_residual_0.png"]
    assert all(t.type != "image" for t in tokens[:[i for i, t in enumerate(tokens)
                                                   if t.type == "heading_open"][plots_at]])
    repro = "\n".join(section_text(tokens, "How to reproduce"))
    assert "python repro/repro.py --disable GeluApproximation" in repro
    assert (sess / "bundle.zip").exists()


def test_no_repro_section_without_a_bundle(samples, tmp_path, capsys):
    """A passing model: no bundle is written, so the report names none (--report and the session's)."""
    sess, report = tmp_path / "s", tmp_path / "r.md"
    assert run(["bisect", samples / "cnn.onnx", "--session", sess, "--report", report, "-q"], capsys) == 0
    assert not (sess / "bundle.zip").exists()
    for text in (report.read_text(), (sess / "report.md").read_text()):
        tokens = rendered(text)
        assert "How to reproduce" not in headings(tokens)
        assert "unzip" not in text and "repro.py" not in text and "bundle.zip" not in text
        summary = section_text(tokens, "Summary")
        assert any(line.startswith("culprit: none: nothing to find") for line in summary)
        assert any(line == "reproduce: bisect-tui bisect cnn.onnx" for line in summary)


def test_long_tables_fold_into_details(samples, tmp_path, capsys):
    run(["check", samples / "transformer_block.onnx", "--session", tmp_path / "s", *GELU,
         "--json", tmp_path / "r.json", "-q"], capsys)
    s = json.loads((tmp_path / "r.json").read_text())
    short = rendered(check_markdown(s))
    assert not [t for t in short if t.type == "html_block"]  # 7 fused nodes: shown as they are
    s["fused_nodes"] = s["fused_nodes"] * 15  # 105, like a real detector's
    tokens = rendered(check_markdown(s))
    blocks = [t.content for t in tokens if t.type == "html_block"]
    assert blocks[0].startswith("<details>\n<summary>105 fused nodes</summary>") and blocks[1] == "</details>\n"
    at = [i for i, t in enumerate(tokens) if t.type == "html_block"]
    table_rows = [t for t in tokens[at[0]:at[1]] if t.type == "tr_open"]
    assert len(table_rows) == 106  # the header and every row, inside the fold


def test_openvino_version_in_the_summary_and_environment(samples, tmp_path, capsys):
    """OpenVINO as the engine: its own version (after the machine's counts in report.json) is listed."""
    report = tmp_path / "r.md"
    assert run(["check", samples / "cnn.onnx", "--engine", "openvino", "--session", tmp_path / "s",
                "--report", report, "--json", tmp_path / "r.json", "-q"], capsys) == 0
    v = json.loads((tmp_path / "r.json").read_text())["versions"]
    assert list(v).index("openvino") > list(v).index("cpu_count")
    tokens = rendered(report.read_text())
    summary = " ".join(section_text(tokens, "Summary"))
    assert f"openvino {v['openvino']}" in summary and "engine: OpenVINO" in summary
    assert f"openvino: {v['openvino']}" in section_text(tokens, "Environment")


def test_engine_error_report_names_only_the_keepset_repro(samples, tmp_path, capsys):
    """The FP16 engine does not build: the bundle holds the keep-set repro and no repro/ folder,
    and the report says exactly that; the engine's message without this machine's paths."""
    import zipfile

    sess, report = tmp_path / "s", tmp_path / "r.md"
    assert run(["bisect", samples / "hann_fp16.onnx", "--precision", "fp16", "--session", sess,
                "--report", report, "-q"], capsys) == 1
    names = zipfile.ZipFile(sess / "bundle.zip").namelist()
    assert "keepset/repro_keepset.py" in names and not any(n.startswith("repro/") for n in names)
    text = report.read_text()
    tokens = rendered(text)
    assert headings(tokens)[0] == "bisect-tui bisect: culprit(s) found: HannWindow (build error at this precision)"
    repro = "\n".join(section_text(tokens, "How to reproduce"))
    assert "python keepset/repro_keepset.py --keep" in repro and "repro/repro.py" not in repro
    summary = {line.split(":", 1)[0]: line for line in section_text(tokens, "Summary")}
    assert "Type Error" in summary["engine error"] and str(tmp_path) not in summary["engine error"]
    assert "<session>/engines/" in summary["engine error"]
    assert "node_block_list=['window/hann']" in summary["workaround"]
