"""The core is UI-free and cheap to import; the CLI's --help stays fast."""

import subprocess
import sys


def _modules_after(stmt: str) -> set[str]:
    code = f"import sys; {stmt}; print('\\n'.join(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def test_core_does_not_import_textual():
    mods = _modules_after(
        "import bisect_tui.core, bisect_tui.core.pipeline, bisect_tui.core.bisect.run, "
        "bisect_tui.core.report, bisect_tui.engines.ort"
    )
    assert "bisect_tui.core.pipeline" in mods  # the import really happened
    assert not {m for m in mods if m == "textual" or m.startswith("textual.")}


def test_cli_module_imports_no_heavy_library():
    mods = _modules_after("import bisect_tui.cli")
    for heavy in ("onnxruntime", "textual", "torch", "tensorrt", "onnx"):
        assert heavy not in mods, heavy
