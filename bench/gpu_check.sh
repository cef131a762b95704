#!/usr/bin/env bash
# gpu-check: rewrite every sample model and check it on ONNX Runtime's CUDA provider.
#
#   make gpu-check            # or: bash bench/gpu_check.sh
#
# Needs an NVIDIA GPU (nvidia-smi) and an onnxruntime build with CUDAExecutionProvider.
# For each sample NAME and each configuration CONFIG:
#   default   ckpt rewrite MODEL -o out/gpu/NAME.default.onnx
#   budget50  ckpt rewrite MODEL -o out/gpu/NAME.budget50.onnx --budget 50%
#   ortopt    ckpt rewrite MODEL -o out/gpu/NAME.ortopt.onnx --ort-optimize cuda
# then `ckpt check MODEL REWRITTEN --provider cuda --json` (original and rewrite under
# ckpt's recorded settings (c), both under plain ORT defaults (a)), the rewrite under
# DEFAULT order + ORT_ENABLE_ALL (b) (bench/gpu_sessions.py), one summary table, and
# bench/GPU_RESULTS.md. Samples: sample_models/*.onnx plus a ~5k-node synthetic
# transformer (python -m bench.synthetic --layers 35).
#
# Exit codes: 0 every check passed; 1 a rewrite or check failed; 2 no NVIDIA GPU;
# 4 onnxruntime has no CUDA provider.
#
# Environment (optional):
#   BIN=.venv/bin              where ckpt and python live (default: .venv/bin, else PATH)
#   GPU_CHECK_SAMPLES="mlp gpt cnn gpt12 resnet18 synthetic"
#   GPU_CHECK_CONFIGS="default budget50 ortopt"
#   GPU_CHECK_PREBUILT=DIR     take NAME.CONFIG.onnx (and synthetic.onnx) from DIR instead of
#                              rewriting: rewrites are CPU work, a GPU lease is short
#   GPU_CHECK_TIMEOUT=300      seconds per ckpt command
#   GPU_CHECK_ARGS="--runs 5"  extra options for `ckpt check`
#   GPU_CHECK_PROVIDER=cpu     dry run on a machine without a GPU (skips the GPU requirement)
#   GPU_RESULTS=bench/GPU_RESULTS.md
set -u -o pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

BIN=${BIN:-.venv/bin}
if [[ -x "$BIN/ckpt" ]]; then
    CKPT="$BIN/ckpt"; PY="$BIN/python"
else
    CKPT=$(command -v ckpt || true); PY=$(command -v python3 || true)
fi
PROVIDER=${GPU_CHECK_PROVIDER:-cuda}
TIMEOUT=${GPU_CHECK_TIMEOUT:-300}
RESULTS=${GPU_RESULTS:-bench/GPU_RESULTS.md}
SAMPLES=(${GPU_CHECK_SAMPLES:-mlp gpt cnn gpt12 resnet18 synthetic})
CONFIGS=(${GPU_CHECK_CONFIGS:-default budget50 ortopt})
PREBUILT=${GPU_CHECK_PREBUILT:-}
OUT=out/gpu

die() { echo "gpu-check: $1" >&2; exit "$2"; }

[[ -n "$CKPT" && -n "$PY" ]] || die "ckpt is not installed (run 'make demo' or 'pip install -e .' first)" 2

# ---------------------------------------------------------------- GPU and provider
GPU="none (dry run on $PROVIDER)"
DRIVER="n/a"
if [[ "$PROVIDER" == "cuda" ]]; then
    command -v nvidia-smi >/dev/null 2>&1 \
        || die "no NVIDIA GPU: nvidia-smi is not installed. Run 'make gpu-check' on a machine with an NVIDIA GPU and its driver." 2
    if ! GPU_LINES=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1) \
            || [[ -z "$GPU_LINES" ]]; then
        die "no NVIDIA GPU usable: nvidia-smi failed: $(echo "$GPU_LINES" | head -n 2)" 2
    fi
    GPU=$(echo "$GPU_LINES" | head -n 1 | cut -d, -f1,2 | sed 's/, */, /')
    DRIVER=$(echo "$GPU_LINES" | head -n 1 | cut -d, -f3 | tr -d ' ')
fi

ORT_INFO=$("$PY" -c 'import onnxruntime as o; print(o.__version__, ",".join(o.get_available_providers()))' 2>&1) \
    || die "cannot import onnxruntime with $PY: $ORT_INFO" 4
ORT_VERSION=${ORT_INFO%% *}
if [[ "$PROVIDER" == "cuda" && "$ORT_INFO" != *CUDAExecutionProvider* ]]; then
    die "onnxruntime $ORT_VERSION has no CUDAExecutionProvider ($ORT_INFO); install onnxruntime-gpu" 4
fi
CKPT_VERSION=$("$CKPT" --version 2>/dev/null | awk '{print $NF}')
echo "gpu-check: GPU: $GPU, driver $DRIVER; onnxruntime $ORT_VERSION; ckpt $CKPT_VERSION" >&2

# ---------------------------------------------------------------- rewrite + check
mkdir -p "$OUT"
config_args() {
    case "$1" in
        default) ;;
        budget50) echo "--budget 50%" ;;
        ortopt) echo "--ort-optimize $PROVIDER" ;;
        *) die "unknown configuration $1" 2 ;;
    esac
}
model_of() {
    if [[ "$1" == synthetic ]]; then
        local src="$OUT/synthetic.onnx"
        if [[ -n "$PREBUILT" && -f "$PREBUILT/synthetic.onnx" ]]; then cp "$PREBUILT/synthetic.onnx" "$src"
        elif [[ ! -f "$src" ]]; then "$PY" -m bench.synthetic --layers 35 -o "$src" >&2; fi
        echo "$src"
    else
        echo "sample_models/$1.onnx"
    fi
}

START=$(date +%s)
for name in "${SAMPLES[@]}"; do
    model=$(model_of "$name")
    for config in "${CONFIGS[@]}"; do
        tag="$name.$config"
        rewritten="$OUT/$tag.onnx"
        rm -f "$OUT/$tag".{check.json,check.err,rewrite.err,rewrite.rc,check.rc,seconds,default_all.json,default_all.err}
        t0=$(date +%s)
        if [[ -n "$PREBUILT" && -f "$PREBUILT/$tag.onnx" && "$config" != ortopt ]]; then
            cp "$PREBUILT/$tag.onnx" "$rewritten"; echo 0 >"$OUT/$tag.rewrite.rc"
        else
            echo "gpu-check: $tag: rewrite" >&2
            # shellcheck disable=SC2046  # the configuration's options are a list
            timeout "$TIMEOUT" "$CKPT" rewrite "$model" -o "$rewritten" --force -q $(config_args "$config") \
                2>"$OUT/$tag.rewrite.err"
            echo $? >"$OUT/$tag.rewrite.rc"
        fi
        if [[ $(cat "$OUT/$tag.rewrite.rc") == 0 ]]; then
            echo "gpu-check: $tag: check on $PROVIDER" >&2
            # shellcheck disable=SC2086  # GPU_CHECK_ARGS is a list of options
            timeout "$TIMEOUT" "$CKPT" check "$model" "$rewritten" --provider "$PROVIDER" --json ${GPU_CHECK_ARGS:-} \
                >"$OUT/$tag.check.json" 2>"$OUT/$tag.check.err"
            echo $? >"$OUT/$tag.check.rc"
            # session (b): DEFAULT order + ORT_ENABLE_ALL (the check measures (a) and (c))
            timeout "$TIMEOUT" "$PY" bench/gpu_sessions.py "$model" "$rewritten" "$PROVIDER" \
                "$OUT/$tag.default_all.json" 2>"$OUT/$tag.default_all.err"
        else
            echo "gpu-check: $tag: rewrite failed: $(tail -n 2 "$OUT/$tag.rewrite.err")" >&2
        fi
        echo $(( $(date +%s) - t0 )) >"$OUT/$tag.seconds"
    done
done
ELAPSED=$(( $(date +%s) - START ))

GPU="$GPU" DRIVER="$DRIVER" ORT_VERSION="$ORT_VERSION" PROVIDER="$PROVIDER" RESULTS="$RESULTS" \
ELAPSED="$ELAPSED" OUT="$OUT" SAMPLES="${SAMPLES[*]}" CONFIGS="${CONFIGS[*]}" CKPT_VERSION="$CKPT_VERSION" \
"$PY" bench/gpu_table.py
rc=$?
[[ $rc -eq 0 ]] && echo "gpu-check: all checks passed" >&2 || echo "gpu-check: FAILED (see the table above and $OUT/*.err)" >&2
exit $rc
