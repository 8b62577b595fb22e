"""One truthful install story: every extra is documented the way it installs (from a
clone: bisect-tui is not on PyPI), and no message suggests a command that fails."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_every_extra_is_in_the_readme_as_it_installs():
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    readme = (REPO / "README.md").read_text()
    for name in set(extras) - {"bench"}:
        assert f"pip install -e '.[{name}]'" in readme, name
    assert "not on PyPI" in readme


def test_no_message_suggests_installing_from_pypi():
    bad = re.compile(r"pip install ['\"]?bisect-tui\b")
    offenders = [str(p.relative_to(REPO)) for p in (REPO / "bisect_tui").rglob("*.py") if bad.search(p.read_text())]
    offenders += [n for n in ("README.md", "docs/engines.md", "docs/torch.md", "docs/compare.md",
                              "docs/walkthrough.md", "docs/tensorrt.md") if bad.search((REPO / n).read_text())]
    assert offenders == []


def test_readme_limitations_agree_with_the_engines_doc():
    readme = (REPO / "README.md").read_text()
    limits = readme.split("## Limitations", 1)[1].split("\n## ", 1)[0]
    engines = (REPO / "docs" / "engines.md").read_text()
    assert "OpenVINO" in limits and "planned" not in limits and "CPU only today" not in limits
    assert "| CPU, tested (openvino" in engines  # what the README says runs here
    assert "never run" in limits and "never run here" in engines  # TensorRT, on both sides
