#!/usr/bin/env bash
# Memory gate for CI: rewrite a training graph with ckpt, prove it on ONNX Runtime,
# and fail the build when the rewritten graph needs more memory than a budget.
#
#   usage: memory_gate.sh MODEL.onnx BUDGET [OUT_DIR]
#     BUDGET   bytes, or with a binary unit: 512MiB, 2GiB
#     OUT_DIR  where the artifacts go (default: ckpt-out):
#              MODEL.ckpt.onnx, rewrite.json, compare.json, compare.txt, compare.md
#              (markdown, for a CI job summary), memory.svg
#
#   environment (all optional):
#     CKPT           the ckpt command (default: ckpt; may be several words)
#     CKPT_PROVIDER  ONNX Runtime provider of the check: auto, cuda, cpu (default: cpu)
#     CKPT_RUNS      measured runs per graph (default: 3)
#     GATE_FIELD     the figure held against BUDGET (default: measured_peak_bytes,
#                    the arena peak ORT measured; peak_bytes gates on the prediction)
#     CKPT_REWRITE_ARGS  extra options for `ckpt rewrite` (region options, --dim ...)
#
#   exit codes:
#     0  the rewrite is correct (bit-identical outputs) and fits the budget
#     1  over budget, the prediction got worse, or the check failed
#        (outputs differ or measured memory got worse)
#     2  bad input or usage (missing model, bad budget, ...)
#     4  the requested ONNX Runtime provider is unavailable
#     70 internal error in ckpt
set -euo pipefail

if [[ $# -lt 2 || $# -gt 3 ]]; then
    echo "usage: $0 MODEL.onnx BUDGET [OUT_DIR]" >&2
    exit 2
fi
model=$1
budget=$2
out=${3:-ckpt-out}
read -r -a ckpt <<< "${CKPT:-ckpt}"
read -r -a rewrite_args <<< "${CKPT_REWRITE_ARGS:-}"
field=${GATE_FIELD:-measured_peak_bytes}

mkdir -p "$out"
name=$(basename "$model")
rewritten="$out/${name%.onnx}.ckpt.onnx"

# 1. Rewrite and check on ONNX Runtime. Exit 1 here means the check failed; the
#    comparison still runs so that its report and chart are there to look at.
status=0
"${ckpt[@]}" rewrite "$model" -o "$rewritten" --force --check \
    --provider "${CKPT_PROVIDER:-cpu}" --runs "${CKPT_RUNS:-3}" \
    --report "$out/rewrite.json" "${rewrite_args[@]}" || status=$?
if [[ $status -ne 0 && $status -ne 1 ]]; then
    exit "$status"
fi

# 2. Compare the original model (analysed now) with the rewrite report, and gate:
#    the rewritten model must fit the budget and its predicted peak must not grow.
gate=0
"${ckpt[@]}" compare "$model" "$out/rewrite.json" \
    --svg "$out/memory.svg" --report "$out/compare.json" \
    --fail-if "$field>$budget" \
    --fail-if "ratio(peak_bytes)>100%" | tee "$out/compare.txt" || gate=${PIPESTATUS[0]}

# 3. The same comparison as markdown for the job summary; the gate above already decided,
#    and said on stderr which condition held.
"${ckpt[@]}" compare "$model" "$out/rewrite.json" --format markdown \
    --fail-if "$field>$budget" --fail-if "ratio(peak_bytes)>100%" > "$out/compare.md" 2> /dev/null || true

if [[ $gate -ne 0 ]]; then
    exit "$gate"
fi
exit "$status"
