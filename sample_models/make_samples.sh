#!/usr/bin/env bash
# Regenerate the sample training graphs. Run from the repository root:
#
#     bash sample_models/make_samples.sh
#
# Creates (if missing) two virtual environments in the repository root (gitignored):
#   .venv-gen    torch 2.13.0 (the CPU build this machine serves from local disk), onnx, onnxscript,
#                onnxruntime 1.31.1  -> runs sample_models/generate.py
#   .venv-train  onnxruntime-training-cpu 1.19.2, numpy<2, onnx 1.16.2
#                                    -> runs sample_models/make_artifact.py
# They cannot be one environment: both ORT wheels install the `onnxruntime` module.
#
# Environment overrides:
#   PYTHON           interpreter for the venvs (default: python3.11)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

PYTHON="${PYTHON:-python3.11}"
GEN=.venv-gen
TRAIN=.venv-train

if ! "$GEN/bin/python" -c "import torch, onnx, onnxscript, onnxruntime, numpy" 2>/dev/null; then
    # Pin torch exactly: an open range would pull a multi-GB CUDA build from the index.
    echo "== creating $GEN"
    rm -rf "$GEN"
    "$PYTHON" -m venv "$GEN"
    "$GEN/bin/pip" install --quiet \
        "torch==2.13.0" "onnx==1.23.2" "onnxscript==0.7.2" "onnxruntime==1.31.1" numpy
fi

if ! "$TRAIN/bin/python" -c "import onnxruntime.capi._pybind_state as C, onnx, numpy; assert hasattr(C, 'GradientGraphBuilder')" 2>/dev/null; then
    echo "== creating $TRAIN"
    rm -rf "$TRAIN"
    "$PYTHON" -m venv "$TRAIN"
    "$TRAIN/bin/pip" install --quiet "onnxruntime-training-cpu==1.19.2" "numpy<2" "onnx==1.16.2"
fi

echo "== generate.py (torch joint graphs: mlp, gpt, cnn, gpt12, resnet18)"
# Quiet the exporter's progress lines and warnings; errors still surface.
"$GEN/bin/python" -W ignore sample_models/generate.py "$@" 2> >(grep -v -e '^W[0-9]\{4\} ' -e 'torchvision is not installed' >&2)

echo "== make_artifact.py (ORT training artifact)"
"$TRAIN/bin/python" sample_models/make_artifact.py

echo "== done"
ls -l sample_models/*.onnx sample_models/*.phases.json sample_models/ort_artifact/
