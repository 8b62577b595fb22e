#!/usr/bin/env bash
# Check bisect-tui's TensorRT path on a machine with an NVIDIA GPU, once with
# the latest TensorRT 10.x and once with TensorRT 11, each in its own venv.
#
#   scripts/gpu_check.sh
#   OUT_DIR=/tmp/trt-check VENV_ROOT=/tmp/venvs scripts/gpu_check.sh
#   FLAVORS="10" scripts/gpu_check.sh          # only TensorRT 10
#
# Per TensorRT it: creates the venv, installs PyTorch's CPU wheel first (the
# [test] extra pins torch==2.13.0, which on PyPI is the multi-GB CUDA build; the
# CPU wheel satisfies the pin), then `pip install -e '.[test]'` and the TensorRT
# release; writes the real inspector JSON of sample_models/cnn.onnx, maps it
# back to ONNX nodes, runs tests/test_tensorrt_gpu.py (marker `gpu`), and
# bisects the FP16 LayerNorm sample with --engine tensorrt --precision fp16.
#
# Every step runs even when an earlier one failed (no `set -e`); each step's
# output is kept in OUT_DIR/<flavor>/<step>.log and one summary (PASS/FAIL per
# step, the versions) is written to OUT_DIR/summary.txt and printed at the end.
# Attach OUT_DIR to your report: until such a summary exists, the TensorRT
# engine of bisect-tui has never run on a GPU.
#
# Exit 0 when every step passed, 1 otherwise, 5 when there is no GPU/driver.
set -u -o pipefail

repo="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd -P)"
cd -- "$repo" || exit 1
python="${PYTHON:-python3}"
out="${OUT_DIR:-$repo/gpu-check-$(date -u +%Y%m%dT%H%M%SZ)}"
venv_root="${VENV_ROOT:-$repo/.venv-gpu-check}"
flavors="${FLAVORS:-10 11}"
torch_index="${TORCH_INDEX:-https://download.pytorch.org/whl/cpu}"
torch_spec="${TORCH_SPEC:-torch==2.13.0}"

if ! command -v nvidia-smi >/dev/null 2>&1; then
    echo "gpu_check: nvidia-smi not found: this check needs an NVIDIA GPU and its driver" >&2
    exit 5
fi

mkdir -p -- "$out"
summary="$out/summary.txt"
results=()
failed=0

# step FLAVOR NAME CMD...: run CMD with its output in OUT_DIR/FLAVOR/NAME.log, record PASS/FAIL
step() {
    local flavor=$1 name=$2 log rc
    shift 2
    log="$out/$flavor/$name.log"
    mkdir -p -- "$out/$flavor"
    echo "gpu_check: [$flavor] $name"
    "$@" >"$log" 2>&1
    rc=$?
    if [ "$rc" -eq 0 ]; then
        results+=("PASS  trt$flavor  $name")
    else
        results+=("FAIL  trt$flavor  $name (exit $rc, see $flavor/$name.log)")
        failed=1
        tail -n 5 -- "$log" | sed 's/^/    /'
    fi
}

trt_spec() {
    case "$1" in
        10) echo "${TRT10_SPEC:-tensorrt>=10,<11}" ;;  # pip picks the latest 10.x
        11) echo "${TRT11_SPEC:-tensorrt>=11,<12}" ;;
        *) echo "tensorrt==$1" ;;
    esac
}

# shellcheck disable=SC2317  # run through step(), which shellcheck cannot follow
inspector_dump() {  # PY OUT_JSON: build cnn.onnx at FP16, save the inspector JSON, map it back
    "$1" - "$repo/sample_models/cnn.onnx" "$2" <<'PY'
import sys
from pathlib import Path

from bisect_tui.api import EngineConfig
from bisect_tui.engines.tensorrt.engine import TensorRTEngine

built = TensorRTEngine().build(Path(sys.argv[1]), EngineConfig(precision="fp16"))
try:
    Path(sys.argv[2]).write_text(built.inspector_json or "")
    fused = built.fused_nodes
    print(f"{len(fused)} engine layers, precision used {built.precision_used()}")
    for f in fused:
        print(f"  {f.name!r} ({f.op_type}) <- {f.original_nodes}")
    if not any(f.original_nodes for f in fused):
        sys.exit("no engine layer maps to an ONNX node")
finally:
    built.close()
PY
}

# shellcheck disable=SC2317  # run through step()
bisect_sample() {  # VENV FLAVOR_DIR: the FP16 LayerNorm sample must give a culprit (exit 1)
    local rc
    "$1/bin/bisect-tui" bisect "$repo/sample_models/layernorm_fp16.onnx" --engine tensorrt --precision fp16 \
        --session "$2/session" --json "$2/bisect.json" --report "$2/report.md"
    rc=$?
    [ "$rc" -eq 1 ] || { echo "bisect exit $rc, expected 1 (culprit found)"; return 1; }
    "$1/bin/python" - "$2/bisect.json" <<'PY'
import json
import sys

from bisect_tui.core.escape import term

res = json.load(open(sys.argv[1])).get("bisect") or {}
print(f"verdict: {term(str(res.get('verdict')))}")
for c in res.get("culprits") or []:
    nodes = ", ".join(c.get("original_nodes") or [])
    print(f"  culprit: {term(str(c.get('fused_node')))} <- ONNX nodes {term(nodes)}")
prec = res.get("precision") or {}
if prec:
    print(f"  keep in FP32: {term(', '.join(prec.get('keep_fp32') or []))} (restores tolerance: {prec.get('passed')})")
PY
}

nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader >"$out/gpu.txt" 2>&1 \
    || nvidia-smi >"$out/gpu.txt" 2>&1
cat -- "$out/gpu.txt"
echo "gpu_check: writing everything to $out"

for flavor in $flavors; do
    venv="$venv_root/trt$flavor"
    py="$venv/bin/python"
    dir="$out/$flavor"
    mkdir -p -- "$dir"
    step "$flavor" venv "$python" -m venv "$venv"
    step "$flavor" pip-upgrade "$py" -m pip install -q --upgrade pip
    step "$flavor" torch-cpu "$py" -m pip install -q "$torch_spec" --index-url "$torch_index"
    step "$flavor" install "$py" -m pip install -q -e "${repo}[test]" "$(trt_spec "$flavor")"
    step "$flavor" versions "$py" -c 'import tensorrt, polygraphy, torch; print("tensorrt", tensorrt.__version__, "| polygraphy", polygraphy.__version__, "| torch", torch.__version__)'
    step "$flavor" samples "$py" sample_models/build.py -q
    step "$flavor" inspector inspector_dump "$py" "$dir/cnn.inspector.json"
    step "$flavor" translation-tests "$py" -m pytest -q -p no:cacheprovider tests/test_tensorrt_translation.py \
        tests/test_tensorrt_engine.py tests/test_tensorrt_defects_map.py tests/test_tensorrt_defects_build.py
    step "$flavor" gpu-tests "$py" -m pytest -q -p no:cacheprovider -m gpu -rs tests/test_tensorrt_gpu.py \
        --junitxml "$dir/gpu-tests.xml"
    step "$flavor" bisect bisect_sample "$venv" "$dir"
done

{
    echo "bisect-tui gpu_check $(date -u +%Y-%m-%dT%H:%M:%SZ) ($(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo 'no git'))"
    echo "gpu: $(head -n 1 -- "$out/gpu.txt")"
    for flavor in $flavors; do
        echo "trt$flavor: $(grep -m 1 '^tensorrt ' -- "$out/$flavor/versions.log" 2>/dev/null || echo 'not installed')"
    done
    printf '%s\n' "${results[@]}"
} >"$summary"
echo
cat -- "$summary"
echo "gpu_check: attach $out (summary.txt and the per-step logs) to your report"
exit "$failed"
