#!/usr/bin/env bash
# gpu-check: rewrite every sample model and check it on ONNX Runtime's CUDA provider.
#
#   make gpu-check            # or: bash bench/gpu_check.sh
#
# Needs an NVIDIA GPU (nvidia-smi) and an onnxruntime build with CUDAExecutionProvider.
# For each sample_models/NAME.onnx:
#   ckpt rewrite sample_models/NAME.onnx -o out/NAME.ckpt.onnx --force
#   ckpt check   sample_models/NAME.onnx out/NAME.ckpt.onnx --provider cuda --json
# then prints one summary table and writes bench/GPU_RESULTS.md.
#
# Exit codes: 0 every check passed; 1 a rewrite or check failed; 2 no NVIDIA GPU;
# 4 onnxruntime has no CUDA provider.
#
# Environment (optional):
#   BIN=.venv/bin              where ckpt and python live (default: .venv/bin, else PATH)
#   GPU_CHECK_TIMEOUT=150      seconds per ckpt command (3 samples x 2 commands stay < 10 min)
#   GPU_CHECK_ARGS="--runs 5"  extra options for `ckpt check` (e.g. --atol 1e-6)
#   GPU_CHECK_PROVIDER=cpu     dry run of this script on a machine without a GPU (skips the
#                              GPU requirement; results go to GPU_RESULTS, default below)
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
TIMEOUT=${GPU_CHECK_TIMEOUT:-150}
RESULTS=${GPU_RESULTS:-bench/GPU_RESULTS.md}
OUT=out
SAMPLES=(mlp gpt cnn)

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
    NGPU=$(echo "$GPU_LINES" | wc -l)
    [[ "$NGPU" -gt 1 ]] && GPU="$GPU (x$NGPU, CUDA device 0 used)"
fi

ORT_INFO=$("$PY" -c 'import onnxruntime as o; print(o.__version__, ",".join(o.get_available_providers()))' 2>&1) \
    || die "cannot import onnxruntime with $PY: $ORT_INFO" 4
ORT_VERSION=${ORT_INFO%% *}
ORT_PROVIDERS=${ORT_INFO#* }
if [[ "$PROVIDER" == "cuda" && "$ORT_PROVIDERS" != *CUDAExecutionProvider* ]]; then
    die "onnxruntime $ORT_VERSION has no CUDAExecutionProvider (providers: $ORT_PROVIDERS); install onnxruntime-gpu" 4
fi

echo "gpu-check: GPU: $GPU, driver $DRIVER; onnxruntime $ORT_VERSION; ckpt $("$CKPT" --version 2>/dev/null | awk '{print $NF}')" >&2

# ---------------------------------------------------------------- rewrite + check
mkdir -p "$OUT"
START=$(date +%s)
for name in "${SAMPLES[@]}"; do
    model="sample_models/$name.onnx"
    rewritten="$OUT/$name.ckpt.onnx"
    rm -f "$OUT/$name.gpu-check.json" "$OUT/$name.gpu-check.err" "$OUT/$name.gpu-rewrite.rc" "$OUT/$name.gpu-check.rc"
    echo "gpu-check: $name: rewrite" >&2
    timeout "$TIMEOUT" "$CKPT" rewrite "$model" -o "$rewritten" --force -q 2>"$OUT/$name.gpu-rewrite.err"
    echo $? >"$OUT/$name.gpu-rewrite.rc"
    if [[ $(cat "$OUT/$name.gpu-rewrite.rc") != 0 ]]; then
        echo "gpu-check: $name: rewrite failed: $(tail -n 3 "$OUT/$name.gpu-rewrite.err")" >&2
        continue
    fi
    echo "gpu-check: $name: check on $PROVIDER" >&2
    # shellcheck disable=SC2086  # GPU_CHECK_ARGS is a list of options
    timeout "$TIMEOUT" "$CKPT" check "$model" "$rewritten" --provider "$PROVIDER" --json ${GPU_CHECK_ARGS:-} \
        >"$OUT/$name.gpu-check.json" 2>"$OUT/$name.gpu-check.err"
    echo $? >"$OUT/$name.gpu-check.rc"
done
ELAPSED=$(( $(date +%s) - START ))

# ---------------------------------------------------------------- summary
GPU="$GPU" DRIVER="$DRIVER" ORT_VERSION="$ORT_VERSION" PROVIDER="$PROVIDER" RESULTS="$RESULTS" \
ELAPSED="$ELAPSED" OUT="$OUT" SAMPLES="${SAMPLES[*]}" CKPT_VERSION="$("$CKPT" --version 2>/dev/null | awk '{print $NF}')" \
"$PY" - <<'EOF'
import datetime, json, os, sys
from pathlib import Path

env = os.environ
out = Path(env["OUT"])


def nbytes(x):
    if x is None:
        return "n/a"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {unit}"
    return f"{int(x)} B"


def ms(x):
    return "n/a" if x is None else f"{x * 1e3:.3g} ms"


def read(p):
    try:
        return Path(p).read_text().strip()
    except OSError:
        return ""


rows, failed = [], False
for name in env["SAMPLES"].split():
    rw_rc, ck_rc = read(out / f"{name}.gpu-rewrite.rc"), read(out / f"{name}.gpu-check.rc")
    row = {"sample": name}
    if rw_rc != "0":
        failed = True
        why = "timed out" if rw_rc == "124" else f"exit {rw_rc}"
        row["result"] = f"rewrite failed ({why}): {read(out / f'{name}.gpu-rewrite.err').splitlines()[-1:] or ''}"
        rows.append(row)
        continue
    try:
        r = json.loads(read(out / f"{name}.gpu-check.json"))
    except json.JSONDecodeError:
        failed = True
        err = read(out / f"{name}.gpu-check.err").splitlines()
        why = "timed out" if ck_rc == "124" else f"exit {ck_rc}"
        row["result"] = f"check failed ({why}): {err[-1] if err else 'no output'}"
        rows.append(row)
        continue
    o, w = r.get("original") or {}, r.get("rewritten") or {}
    d = r.get("original_ort_default") or {}
    if not r.get("passed"):
        failed = True
    row.update({
        "provider": r.get("provider"),
        "outputs": "bit-identical" if r.get("outputs_equal") else f"differ (max abs {r.get('max_abs_diff')})",
        "method": o.get("method"),
        "peak_default": nbytes(d.get("peak_bytes")),
        "peak_original": nbytes(o.get("peak_bytes")),
        "peak_rewritten": nbytes(w.get("peak_bytes")),
        "memory": (f"{w['peak_bytes'] / o['peak_bytes']:.2f}x" if o.get("peak_bytes") and w.get("peak_bytes")
                   else "n/a"),
        "time_original": ms(o.get("time_s")),
        "time_rewritten": ms(w.get("time_s")),
        "order": "kept" if r.get("order_matches") else "**differs**",
        "result": ("pass" if r.get("passed") else f"**FAIL** (exit {ck_rc})"),
    })
    rows.append(row)

cols = [("sample", "sample"), ("provider", "provider"), ("outputs", "outputs"), ("method", "memory method"),
        ("peak_default", "peak, ORT default"), ("peak_original", "peak, original"),
        ("peak_rewritten", "peak, rewritten"), ("memory", "rewritten/original"),
        ("time_original", "step, original"), ("time_rewritten", "step, rewritten"), ("order", "order"),
        ("result", "result")]
head = (f"GPU: {env['GPU']} (driver {env['DRIVER']}); onnxruntime {env['ORT_VERSION']}; "
        f"ckpt {env['CKPT_VERSION']}; provider {env['PROVIDER']}; {env['ELAPSED']} s")
lines = ["| " + " | ".join(c[1] for c in cols) + " |", "|" + "---|" * len(cols)]
for row in rows:
    lines.append("| " + " | ".join(str(row.get(k, "")) for k, _ in cols) + " |")

print()
print(head)
widths = [max(len(c[1]), *(len(str(r.get(c[0], ""))) for r in rows)) for c in cols]
print("  ".join(c[1].ljust(wd) for c, wd in zip(cols, widths)))
for row in rows:
    print("  ".join(str(row.get(c[0], "")).ljust(wd) for c, wd in zip(cols, widths)))

date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
md = ["# ckpt on the CUDA provider", "",
      f"Written by `make gpu-check` (bench/gpu_check.sh) on {date}.", "", head + ".", "",
      "Each sample: `ckpt rewrite sample_models/NAME.onnx -o out/NAME.ckpt.onnx --force`, then "
      "`ckpt check sample_models/NAME.onnx out/NAME.ckpt.onnx --provider cuda --json` (raw JSON in "
      "`out/NAME.gpu-check.json`). Peaks are what ckpt's runtime reads from ORT's profiler on the "
      "provider's allocator (`n/a` when the profiler gives no memory fields).", "", *lines, ""]
Path(env["RESULTS"]).write_text("\n".join(md))
print(f"\nwrote {env['RESULTS']}", file=sys.stderr)
sys.exit(1 if failed else 0)
EOF
rc=$?
[[ $rc -eq 0 ]] && echo "gpu-check: all samples passed" >&2 || echo "gpu-check: FAILED (see the table above and out/*.gpu-check.err)" >&2
exit $rc
