#!/usr/bin/env bash
# compat-check: ckpt at the lowest versions pyproject.toml allows, and on an ONNX Runtime release
# with a known loader defect, installed from the wheel into fresh venvs.
#
#   make compat-check          # or: PY=python3.11 bash bench/compat_check.sh
#
# 1. Every dependency pinned to its lower bound (`name>=X` read from pyproject.toml, markers
#    evaluated for this machine, pinned as `name==X`); from a folder outside the tree: `ckpt
#    --version`, `ckpt inspect` and `ckpt rewrite` (the default) of every sample, then each
#    rewrite run beside its original in a plain InferenceSession (ORT_ENABLE_ALL, one thread):
#    every output bit for bit. `ckpt check`'s peak prediction is not judged here: the memory
#    model is validated on ONNX Runtime 1.31 and the 1.19 training build, not the 1.19
#    inference build (the gpt sample's rewrite measures 12% above the prediction there).
# 2. onnxruntime 1.28.0 in place of that (1.25 to 1.30 merge a Reshape with a computed shape
#    into a following one and fail to load the graph): every rewrite loads at basic, extended
#    and all.
#
# Environment (optional): PY, the interpreter (default python3); COMPAT_DIR, where the wheel and
# the venv go (default out/compat, emptied first).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
DIR=$(mkdir -p "${COMPAT_DIR:-out/compat}" && cd "${COMPAT_DIR:-out/compat}" && pwd)
SAMPLES="gpt mlp cnn resnet18 gpt12"
AFFECTED_ORT=1.28.0
. bench/wheel_venv.sh
wheel_venv "$DIR"
BIN=$DIR/venv/bin
"$BIN/python" - pyproject.toml > "$DIR/lowest.txt" <<'EOF'
import re, sys, tomllib
from pip._vendor.packaging.markers import Marker

for dep in tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]:
    spec, _, marker = dep.partition(";")
    if marker.strip() and not Marker(marker.strip()).evaluate():
        continue
    found = re.match(r"\s*([A-Za-z0-9_.-]+)\s*>=\s*([^,\s]+)", spec)
    if found:
        print(f"{found[1]}=={found[2]}")
EOF
echo "compat-check: lower bounds: $(tr '\n' ' ' < "$DIR/lowest.txt")" >&2
"$BIN/python" -m pip install -q -c "$DIR/lowest.txt" "$DIR"/onnx_ckpt-*.whl
"$BIN/python" -m pip check
for s in $SAMPLES; do cp "sample_models/$s.onnx" "$WORK/"; done
cp bench/compat_run.py "$WORK/"
cd "$WORK"
"$BIN/ckpt" --version
for s in $SAMPLES; do
    "$BIN/ckpt" inspect "$s.onnx" -q > /dev/null
    "$BIN/ckpt" rewrite "$s.onnx" -o "$s.ckpt.onnx" -q
done
"$BIN/python" compat_run.py same $SAMPLES
"$BIN/python" -m pip install -q --no-deps --force-reinstall "onnxruntime-gpu==$AFFECTED_ORT"
"$BIN/python" compat_run.py load $SAMPLES
echo "compat-check: passed in $SECONDS s" >&2
