"""Section 5 of ``python -m bench.run``: ckpt's time and peak RSS on models with big weights,
over 2 GB as external data (5a) and embedded in the .onnx file (5b). ``render`` writes the
section, heading included."""

from __future__ import annotations

import sys
from pathlib import Path

from bench.common import ckpt_cmd, missing, nbytes, run_measured, secs


def bench_big_weights(work: Path, gigabytes: float = 2.1, external: bool = True) -> dict:
    """ckpt's own time and peak RSS on a model with big weights: over 2 GB as external data,
    or (``external`` off) embedded in the .onnx file."""
    ckpt = ckpt_cmd()
    src = work / ("big" if external else "embedded") / "big.onnx"
    src.parent.mkdir(exist_ok=True)
    gen = run_measured([sys.executable, "-m", "bench.synthetic", "--layers", "2", "--big-weights",
                        str(gigabytes), *(["--external-data"] if external else []), "-o", str(src)])
    if gen["rc"] != 0:
        return {"error": f"generator failed: {gen['stderr_tail'][-300:]}"}
    weights = sum(p.stat().st_size for p in src.parent.iterdir())
    rows = {}
    for name, args in (("inspect", ["inspect", str(src), "--json"]),
                       ("plan --budget 90%", ["plan", str(src), "--budget", "90%", "--json"]),
                       ("rewrite", ["rewrite", str(src), "-o", str(src.parent / "out.onnx"), "--force", "--json"])):
        r = run_measured([*ckpt, *args])
        rows[name] = {"wall_s": r["wall_s"], "max_rss_bytes": r["max_rss_bytes"], "rc": r["rc"]}
    if not external:  # onnx.save cannot write over 2 GB in one file: no floor for external data
        floor = run_measured([sys.executable, "-c", "import onnx, sys; onnx.save(onnx.load(sys.argv[1]), sys.argv[2])",
                              str(src), str(src.parent / "floor.onnx")])
        rows["floor"] = {"wall_s": floor["wall_s"], "max_rss_bytes": floor["max_rss_bytes"], "rc": floor["rc"]}
    out_data = next(src.parent.glob("out.onnx.*.data"), src.parent / "out.onnx.data")
    return {"weights_bytes": weights, "generate_s": gen["wall_s"], "commands": rows, "gigabytes": gigabytes,
            "output_bytes": (src.parent / "out.onnx").stat().st_size if (src.parent / "out.onnx").exists() else None,
            "output_data_bytes": out_data.stat().st_size if out_data.exists() else None}


def render(res: dict, add) -> None:
    """Section 5 (both sub-sections, heading included) from the results' ``big_weights`` and
    ``embedded_weights``, one line at a time through ``add``."""
    b = res.get("big_weights")
    add("## 5. Models with big weights")
    add("")
    add("### 5a. Over 2 GB of weights (external data)")
    add("")
    if not missing(b, add, skipped="Skipped (`--quick` or `--skip-big`)."):
        add(f"`python -m bench.synthetic --layers 2 --big-weights 2.1 --external-data` "
            f"({nbytes(b['weights_bytes'])} on disk). ckpt reads only the graph and the tensors' shapes; "
            "the rewrite streams the weights into the output's external data file "
            f"({nbytes(b['output_data_bytes'])}).")
        add("")
        _big_weights_table(b, add)
    e = res.get("embedded_weights")
    add("### 5b. Weights embedded in the .onnx file")
    add("")
    if not missing(e, add, skipped="Skipped (`--quick` or `--skip-big`)."):
        add(f"`python -m bench.synthetic --layers 2 --big-weights {e['gigabytes']}` ({nbytes(e['weights_bytes'])}, "
            "one file). ckpt parses and writes such a file a piece at a time (`ckpt_cli/io/serialize.py`): beyond the "
            "model itself it holds at most a tensor's bytes, where `onnx.load` holds the file's bytes beside the "
            "model and one `SerializeToString` a growing buffer and its copy. **floor** = "
            "`python -c 'onnx.save(onnx.load(F), OUT)'`.")
        add("")
        _big_weights_table(e, add)
    add("")


def _big_weights_table(b: dict, add) -> None:
    add("| command | wall | peak RSS | peak RSS / file | exit |")
    add("|---|---|---|---|---|")
    for name, c in b["commands"].items():
        label = name if name == "floor" else f"`ckpt {name}`"
        ratio = f"{c['max_rss_bytes'] / b['weights_bytes']:.2f}×" if c.get("max_rss_bytes") else "n/a"
        add(f"| {label} | {secs(c['wall_s'])} | {nbytes(c['max_rss_bytes'])} | {ratio} | {c['rc']} |")
    add("")
