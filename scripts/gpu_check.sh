#!/usr/bin/env bash
# Check bisect-tui's TensorRT path on a machine with an NVIDIA GPU.
#
#   scripts/gpu_check.sh            # uses/creates .venv in the repository
#   VENV=/path/to/venv OUT_DIR=/tmp/trt-check scripts/gpu_check.sh
#
# It installs the optional extra (pip install -e '.[tensorrt,test]'), runs the
# TensorRT tests (tests/test_tensorrt_gpu.py, marker `gpu`), bisects the bundled
# FP16 LayerNorm sample with --engine tensorrt --precision fp16, and prints what
# it found. Everything it produced is kept in OUT_DIR (a report to attach to an
# issue). Exit 0 when the tests pass and the bisection names a culprit, 1
# otherwise, 5 when there is no GPU/driver.
set -euo pipefail

repo="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd -P)"
cd -- "$repo"
python="${PYTHON:-python3}"
venv="${VENV:-$repo/.venv}"
out="${OUT_DIR:-$repo/gpu-check-$(date -u +%Y%m%dT%H%M%SZ)}"

if ! command -v nvidia-smi >/dev/null 2>&1; then
    echo "gpu_check: nvidia-smi not found: this check needs an NVIDIA GPU and its driver" >&2
    exit 5
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader

if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv "$venv"
fi
py="$venv/bin/python"
"$py" -m pip install -q --upgrade pip
"$py" -m pip install -q -e "${repo}[tensorrt,test]"
"$py" -c 'import tensorrt, polygraphy; print("tensorrt", tensorrt.__version__, "| polygraphy", polygraphy.__version__)'
"$py" sample_models/build.py -q

mkdir -p -- "$out"
echo "gpu_check: writing everything to $out"

# the real inspector JSON of one sample, to compare with tests/fixtures/tensorrt/
"$py" - "$repo/sample_models/cnn.onnx" "$out/cnn.inspector.json" <<'PY'
import sys
from pathlib import Path

from bisect_tui.api import EngineConfig
from bisect_tui.engines.tensorrt.engine import TensorRTEngine

built = TensorRTEngine().build(Path(sys.argv[1]), EngineConfig(precision="fp16"))
Path(sys.argv[2]).write_text(built.inspector_json or "")
print(f"inspector JSON: {len(built.fused_nodes)} engine layers, precision used {built.precision_used()}")
built.close()
PY

set +e
"$py" -m pytest -q -m gpu -rs tests/test_tensorrt_gpu.py --junitxml "$out/gpu-tests.xml" 2>&1 | tee "$out/gpu-tests.txt"
tests_rc=${PIPESTATUS[0]}
"$venv/bin/bisect-tui" bisect "$repo/sample_models/layernorm_fp16.onnx" --engine tensorrt --precision fp16 \
    --session "$out/session" --json "$out/bisect.json" --report "$out/report.md" 2>&1 | tee "$out/bisect.txt"
bisect_rc=${PIPESTATUS[0]}
set -e

if [ -f "$out/bisect.json" ]; then
    "$py" - "$out/bisect.json" <<'PY'
import json
import sys

from bisect_tui.core.escape import term

full = json.load(open(sys.argv[1]))
res = full.get("bisect") or {}
print(f"verdict: {term(str(res.get('verdict')))}")
for c in res.get("culprits") or []:
    layer = c.get("fused_node") or "(no single engine layer)"
    nodes = ", ".join(c.get("original_nodes") or [])
    print(f"  culprit: {term(str(layer))} <- ONNX nodes {term(nodes)}")
prec = res.get("precision") or {}
if prec:
    keep = ", ".join(prec.get("keep_fp32") or [])
    print(f"  keep in FP32: {term(keep)} (restores tolerance: {prec.get('passed')})")
PY
fi

echo "gpu_check: tests exit $tests_rc (0 = passed), bisection exit $bisect_rc (1 = culprit found)"
echo "gpu_check: attach $out (report.md, bisect.json, gpu-tests.txt, cnn.inspector.json) to your report"
if [ "$tests_rc" -eq 0 ] && [ "$bisect_rc" -eq 1 ]; then
    exit 0
fi
exit 1
