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
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

step() {  # step NAME COMMAND...: run it, then say how long it took
    local name=$1 start=$SECONDS
    shift
    "$@"
    echo "wheel-check: $name: $((SECONDS - start)) s" >&2
}

rm -rf "${WHEEL_DIR:?}"/*
mkdir "$WORK/src"
git ls-files -z --cached --others --exclude-standard | xargs -0 sh -c 'for f; do [ -e "$f" ] && echo "$f"; done' sh \
    | tar -cf - -T - | tar -xf - -C "$WORK/src"
step "build the wheel" "$PY" -m pip wheel -q --no-deps -w "$WHEEL_DIR" "$WORK/src"
step "create the venv" "$PY" -m venv "$WHEEL_DIR/venv"
VENV_BIN=$WHEEL_DIR/venv/bin
step "install the wheel and its dependencies" "$VENV_BIN/python" -m pip install -q "$WHEEL_DIR"/onnx_ckpt-*.whl
cp sample_models/gpt.onnx "$WORK/"
cd "$WORK"
step "ckpt --version" "$VENV_BIN/ckpt" --version
step "ckpt inspect" "$VENV_BIN/ckpt" inspect gpt.onnx
step "ckpt rewrite --check" "$VENV_BIN/ckpt" rewrite gpt.onnx -o gpt.ckpt.onnx --check
step "pip check" "$VENV_BIN/python" -m pip check
echo "wheel-check: $SECONDS s in all" >&2
