"""Summary table of bench/gpu_check.sh: reads out/gpu/NAME.CONFIG.check.json, prints the
table and writes bench/GPU_RESULTS.md. Exit 1 when any rewrite or check failed.

Run by gpu_check.sh with its settings in the environment (OUT, SAMPLES, CONFIGS, GPU, ...).
"""

from __future__ import annotations

import datetime
import json
import os
import sys
from pathlib import Path

COLUMNS = [
    ("sample", "sample"), ("config", "rewrite"), ("outputs", "outputs"), ("order", "executed order"),
    ("peak_default", "original, ORT defaults"), ("peak_original", "original, ckpt settings"),
    ("peak_rewritten", "rewrite, ckpt settings (c)"), ("ratio", "rewrite / original ORT defaults"),
    ("plain", "rewrite, ORT defaults (a)"), ("default_all", "rewrite, DEFAULT + ENABLE_ALL (b)"),
    ("error", "prediction error"),
    ("step_default", "step, original ORT defaults"), ("step_rewritten", "step, rewrite"),
    ("step_ratio", "step ratio"), ("result", "result"),
]


def mib(x: int | None) -> str:
    return "n/a" if x is None else f"{x / 2**20:.2f} MiB"


def ms(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 1e3:.2f} ms"


def read(p: Path) -> str:
    try:
        return p.read_text().strip()
    except OSError:
        return ""


def last_line(p: Path) -> str:
    lines = read(p).splitlines()
    return lines[-1] if lines else "no output"


def outputs_cell(r: dict) -> str:
    if r.get("outputs_equal"):
        return "bit-identical"
    rr = r.get("run_to_run") or {}
    varying = rr.get("outputs") or {}
    if not varying:
        return f"differ (max abs {r.get('max_abs_diff'):.3g})"
    kernels = ", ".join(sorted({e.get("kernel") or "?" for e in varying.values()}))
    rew = max(e["rewrite_diff"] or 0.0 for e in varying.values())
    own = max(e["original_spread"] or 0.0 for e in varying.values())
    verdict = "within the original's own spread" if rr.get("accepted") else "**beyond the original's spread**"
    return (f"{len(varying)} vary run to run ({kernels}): max abs {rew:.2g}, original vs itself {own:.2g}; "
            f"{verdict}")


def default_all_cell(path: Path, base: int | None) -> str:
    try:
        peak = json.loads(path.read_text())["rewritten"]["peak_bytes"]
    except (OSError, json.JSONDecodeError, KeyError):
        return "n/a"
    return f"{mib(peak)} ({peak / base:.2f}x)" if base and peak else mib(peak)


def row_of(out: Path, name: str, config: str) -> tuple[dict, bool]:
    tag = f"{name}.{config}"
    row = {"sample": name, "config": config}
    rw_rc = read(out / f"{tag}.rewrite.rc")
    if rw_rc == "3" and config == "budget50":  # ckpt's documented "budget unreachable"
        row["result"] = f"budget unreachable (exit 3): {last_line(out / f'{tag}.rewrite.err')}"
        return row, True
    if rw_rc != "0":
        row["result"] = f"**rewrite failed** (exit {rw_rc}): {last_line(out / f'{tag}.rewrite.err')}"
        return row, False
    try:
        r = json.loads(read(out / f"{tag}.check.json"))
    except json.JSONDecodeError:
        row["result"] = (f"**check failed** (exit {read(out / f'{tag}.check.rc')}): "
                         f"{last_line(out / f'{tag}.check.err')}")
        return row, False
    o, w = r.get("original") or {}, r.get("rewritten") or {}
    d, rd = r.get("original_ort_default") or {}, r.get("rewritten_ort_default") or {}
    order = r.get("order") or {}
    copies = order.get("n_provider_copies") or 0
    err = (r.get("prediction_error") or {}).get("rewritten")
    base = d.get("peak_bytes")
    row.update({
        "outputs": outputs_cell(r),
        "order": ("kept" if r.get("order_matches") else "**differs**") + (f" ({copies} copies)" if copies else ""),
        "peak_default": mib(base),
        "peak_original": mib(o.get("peak_bytes")),
        "peak_rewritten": mib(w.get("peak_bytes")),
        "ratio": f"{w['peak_bytes'] / base:.2f}x" if base and w.get("peak_bytes") else "n/a",
        "plain": (f"{mib(rd.get('peak_bytes'))} ({rd['peak_bytes'] / base:.2f}x)"
                  if base and rd.get("peak_bytes") else "n/a"),
        "default_all": default_all_cell(out / f"{tag}.default_all.json", base),
        "error": "n/a" if err is None else f"{err:+.1%}",
        "step_default": ms(d.get("time_s")),
        "step_rewritten": ms(w.get("time_s")),
        "step_ratio": f"{w['time_s'] / d['time_s']:.2f}x" if d.get("time_s") and w.get("time_s") else "n/a",
        "result": "pass" if r.get("passed") else "**FAIL**: " + "; ".join(r.get("failures") or ["see JSON"]),
    })
    return row, bool(r.get("passed"))


def main() -> int:
    env = os.environ
    out = Path(env["OUT"])
    rows, ok = [], True
    for name in env["SAMPLES"].split():
        for config in env["CONFIGS"].split():
            row, passed = row_of(out, name, config)
            rows.append(row)
            ok &= passed
    head = (f"GPU: {env['GPU']} (driver {env['DRIVER']}); onnxruntime {env['ORT_VERSION']}; "
            f"ckpt {env['CKPT_VERSION']}; provider {env['PROVIDER']}; {env['ELAPSED']} s")
    lines = ["| " + " | ".join(c[1] for c in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(str(row.get(k, "")) for k, _ in COLUMNS) + " |" for row in rows]
    print(head)
    print("\n".join(lines))
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    md = ["# ckpt on the CUDA provider", "",
          f"Written by `make gpu-check` (bench/gpu_check.sh) on {date}.", "", head + ".", "",
          "Each row: a rewrite (`default`: `ckpt rewrite`; `budget50`: `--budget 50%`; `ortopt`: "
          "`--ort-optimize cuda`), then `ckpt check MODEL REWRITE --provider cuda --json` (raw JSON in "
          "`out/gpu/NAME.CONFIG.check.json`). Peaks are the CUDA arena's bytes in use, the maximum of "
          "`mem_bytes_in_use` over the profiler's CUDA node events of one run (median of the runs). "
          "\"ORT defaults\" (a) is a session with only the providers set; (b) is DEFAULT order + "
          "ORT_ENABLE_ALL with the memory pattern off (`bench/gpu_sessions.py`). The prediction error compares "
          "ckpt's liveness prediction with the peak of bytes requested on the CUDA allocator. Step "
          "times are the median `session.run` wall time with profiling on.", "", *lines, ""]
    Path(env["RESULTS"]).write_text("\n".join(md))
    print(f"\nwrote {env['RESULTS']}", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
