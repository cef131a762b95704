#!/usr/bin/env bash
# wheel-check: what a user gets from `pip install` of the wheel, not from the source tree.
#
#   make wheel-check          # or: PY=python3.11 bash bench/wheel_check.sh
#
# Builds the wheel (pip wheel --no-deps) from a copy of the files git sees (a build/ folder
# left in the tree would put stale modules in the wheel, and building leaves one), installs it into a fresh venv (its dependencies
# from the index, pip's cache making that quick), then, from a temporary folder outside the
# tree (so nothing imports the checkout): `ckpt --version`, the demo (inspect, and rewrite
# --check of the GPT sample, copied there) and `pip check`. Each step's time goes to stderr.
#
# Environment (optional): PY, the interpreter for the venv and the build (default python3);
# WHEEL_DIR, where the wheel and the venv go (default out/wheel, emptied first).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
WHEEL_DIR=$(mkdir -p "${WHEEL_DIR:-out/wheel}" && cd "${WHEEL_DIR:-out/wheel}" && pwd)
. bench/wheel_venv.sh

step() {  # step NAME COMMAND...: run it, then say how long it took
    local name=$1 start=$SECONDS
    shift
    "$@"
    echo "wheel-check: $name: $((SECONDS - start)) s" >&2
}

step "build the wheel and create the venv" wheel_venv "$WHEEL_DIR"
VENV_BIN=$WHEEL_DIR/venv/bin
step "install the wheel and its dependencies" "$VENV_BIN/python" -m pip install -q "$WHEEL_DIR"/onnx_ckpt-*.whl
cp sample_models/gpt.onnx "$WORK/"
cd "$WORK"
step "ckpt --version" "$VENV_BIN/ckpt" --version
step "ckpt inspect" "$VENV_BIN/ckpt" inspect gpt.onnx
step "ckpt rewrite --check" "$VENV_BIN/ckpt" rewrite gpt.onnx -o gpt.ckpt.onnx --check
step "pip check" "$VENV_BIN/python" -m pip check
echo "wheel-check: $SECONDS s in all" >&2
