#!/usr/bin/env bash
# PyTorch model -> ONNX training graph -> ckpt rewrite -> 50 training steps on ONNX Runtime,
# the original graph and the rewrite side by side (loss curves, peak memory, step time).
#
#     bash examples/torch_to_onnx_training/run.sh [--steps N] [--optimizer adam|sgd]
#     make recipe-torch                      # the same, with the repository's .venv
#
# Environment:
#   PY           Python with ckpt installed (default: python3)
#   CKPT         the ckpt command (default: the one next to $PY, else ckpt on the PATH)
#   TORCH_PY     Python with torch 2.13 CPU, onnx, onnxscript (`pip install '.[torch]'`) for
#                the export step (default: $PY). Without torch the committed small_gpt.onnx
#                (made by export.py, byte-identical on rerun) is used.
#   OUT          where the graphs go (default: out/recipe-torch)
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PY="${PY:-python3}"
TORCH_PY="${TORCH_PY:-$PY}"
CKPT="${CKPT:-$(dirname "$(command -v "$PY")")/ckpt}"
[ -x "$CKPT" ] || CKPT=ckpt
OUT="${OUT:-out/recipe-torch}"
mkdir -p "$OUT"

echo "== 1. export the training graph of the small GPT (export.py)"
if "$TORCH_PY" -c "import torch, onnxscript" 2>/dev/null; then
    # the exporter's progress lines and warnings go to stderr; keep errors only
    "$TORCH_PY" -W ignore "$HERE/export.py" --out "$OUT/small_gpt.onnx" 2> >(grep -v -e '^W[0-9]\{4\} ' >&2)
else
    echo "   (no torch in $TORCH_PY: using the committed examples/torch_to_onnx_training/small_gpt.onnx)"
    cp "$HERE/small_gpt.onnx" "$HERE/small_gpt.init.npz" "$OUT/"
fi

echo "== 2. ckpt rewrite"
"$CKPT" rewrite "$OUT/small_gpt.onnx" -o "$OUT/small_gpt.ckpt.onnx" --force -q

echo "== 3. train with both graphs (train.py)"
"$PY" "$HERE/train.py" "$OUT/small_gpt.onnx" "$OUT/small_gpt.ckpt.onnx" "$@"
