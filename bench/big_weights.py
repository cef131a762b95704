"""Section 5 of ``python -m bench.run``: ckpt's time and peak RSS on models with big weights:
a 1.2 B-parameter decoder with its weights as external data (5a), and 1 GB embedded in the
.onnx file (5b). ``render`` writes the
section, heading included.

5a also times the rewrite against a plain copy of the weights (``copy_speed``); the same on
any external-data model, e.g. a 1 B-parameter decoder built streaming::

    python -m bench.synthetic --layers 20 --d-model 2048 --heads 16 --vocab 32768 \
        --with-weights --external-data -o DIR/dec.onnx
    python -m bench.big_weights DIR/dec.onnx --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from bench.common import ckpt_cmd, median, missing, nbytes, ratio, run_measured, secs


DECODER_LAYERS = 20  # 5a: 20 layers, d_model raised until the weights reach DECODER_GIGABYTES
DECODER_GIGABYTES = 4.25  # GiB of float32 weights: a 1.1-1.2 B-parameter decoder, built streaming


def bench_big_weights(work: Path, gigabytes: float = DECODER_GIGABYTES, external: bool = True,
                      layers: int = DECODER_LAYERS) -> dict:
    """ckpt's own time and peak RSS on a model with big weights: ``layers`` layers, d_model
    raised until the weights reach ``gigabytes`` GiB, as external data or (``external`` off)
    embedded in the .onnx file."""
    ckpt = ckpt_cmd()
    src = work / ("big" if external else "embedded") / "big.onnx"
    src.parent.mkdir(exist_ok=True)
    gen = run_measured([sys.executable, "-m", "bench.synthetic", "--layers", str(layers), "--big-weights",
                        str(gigabytes), *(["--external-data"] if external else []), "-o", str(src)])
    if gen["rc"] != 0:
        return {"error": f"generator failed: {gen['stderr_tail'][-300:]}"}
    weights = sum(p.stat().st_size for p in src.parent.iterdir())
    rows = {}
    commands = [("inspect", ["inspect", str(src), "--json"]),
                ("plan --budget 90%", ["plan", str(src), "--budget", "90%", "--json"])]
    if not external:
        commands.append(("rewrite", ["rewrite", str(src), "-o", str(src.parent / "out.onnx"), "--force", "--json"]))
    for name, args in commands:
        r = run_measured([*ckpt, *args])
        rows[name] = {"wall_s": r["wall_s"], "max_rss_bytes": r["max_rss_bytes"], "rc": r["rc"]}
    copy = copy_speed(src, src.parent) if external else None
    if copy is not None:
        rows.update(copy.pop("rows"))
    if not external:  # onnx.save cannot write over 2 GB in one file: no floor for external data
        floor = run_measured([sys.executable, "-c", "import onnx, sys; onnx.save(onnx.load(sys.argv[1]), sys.argv[2])",
                              str(src), str(src.parent / "floor.onnx")])
        rows["floor"] = {"wall_s": floor["wall_s"], "max_rss_bytes": floor["max_rss_bytes"], "rc": floor["rc"]}
    out_data = next(src.parent.glob("out.onnx.*.data"), src.parent / "out.onnx.data")
    return {"weights_bytes": weights, "generate_s": gen["wall_s"], "commands": rows, "gigabytes": gigabytes,
            "layers": layers, "parameters": _parameters(src),
            "output_bytes": (src.parent / "out.onnx").stat().st_size if (src.parent / "out.onnx").exists() else None,
            "output_data_bytes": out_data.stat().st_size if out_data.exists() else None, "copy": copy}


COPY_ROWS = ("copy (cp + sync)", "rewrite", "rewrite --force")


def copy_speed(src: Path, work: Path, repeats: int = 3) -> dict:
    """``ckpt rewrite`` of an external-data model against a plain copy of its data file
    (``cp`` then ``sync FILE``, which fsyncs it, as the rewrite does): the first write (no
    output there) and ``--force`` over that identical output. Interleaved, repeat after
    repeat; medians. Page cache warm for all three (the source was just read or written)."""
    data = src.with_name(src.name + ".data")
    out, copied = work / "out.onnx", work / "copy.data"
    rewrite = [*ckpt_cmd(), "rewrite", str(src), "-o", str(out), "--force", "--json"]
    runs: dict[str, list[dict]] = {name: [] for name in COPY_ROWS}
    for _ in range(repeats):
        copied.unlink(missing_ok=True)
        os.sync()  # no writeback left over from the step before charged to this one
        runs[COPY_ROWS[0]].append(run_measured(["sh", "-c", 'cp -- "$1" "$2" && sync -- "$2"', "copy",
                                                str(data), str(copied)]))
        copied.unlink(missing_ok=True)
        for old in [out, *work.glob("out.onnx.*.data")]:
            old.unlink(missing_ok=True)
        os.sync()
        runs[COPY_ROWS[1]].append(run_measured(rewrite))
        os.sync()
        runs[COPY_ROWS[2]].append(run_measured(rewrite))
    rows = {name: {"wall_s": median(r["wall_s"] for r in rs), "max_rss_bytes": max(r["max_rss_bytes"] or 0 for r in rs),
                   "rc": max(r["rc"] for r in rs), "walls_s": [r["wall_s"] for r in rs]} for name, rs in runs.items()}
    floor = rows[COPY_ROWS[0]]["wall_s"]
    return {"data_bytes": data.stat().st_size, "repeats": repeats, "rows": rows,
            "ratios": {name: rows[name]["wall_s"] / floor for name in COPY_ROWS[1:]}}


def _parameters(model: Path) -> int:
    """The parameters of ``model``: the elements of its initializers (their data not read)."""
    import onnx

    m = onnx.load(str(model), load_external_data=False)
    total = 0
    for t in m.graph.initializer:
        n = 1
        for d in t.dims:
            n *= d
        total += n
    return total


def render(res: dict, add) -> None:
    """Section 5 (both sub-sections, heading included) from the results' ``big_weights`` and
    ``embedded_weights``, one line at a time through ``add``."""
    b = res.get("big_weights")
    add("## 5. Models with big weights")
    add("")
    add("### 5a. A 1 B-parameter decoder (external data)")
    add("")
    if not missing(b, add, skipped="Skipped (`--quick` or `--skip-big`)."):
        params = f", {b['parameters'] / 1e9:.2f} B parameters" if b.get("parameters") else ""
        add(f"`python -m bench.synthetic --layers {b.get('layers', 2)} --big-weights {b['gigabytes']} --external-data` "
            f"({nbytes(b['weights_bytes'])} on disk{params}, built streaming). ckpt reads only the graph and the tensors' shapes; "
            "the rewrite streams the weights into the output's external data file "
            f"({nbytes(b['output_data_bytes'])}).")
        add("")
        _big_weights_table(b, add)
        _copy_note(b.get("copy"), add)
    e = res.get("embedded_weights")
    add("### 5b. Weights embedded in the .onnx file")
    add("")
    if not missing(e, add, skipped="Skipped (`--quick` or `--skip-big`)."):
        add(f"`python -m bench.synthetic --layers {e.get('layers', 2)} --big-weights {e['gigabytes']}` "
            f"({nbytes(e['weights_bytes'])}, "
            "one file). ckpt parses and writes such a file a piece at a time (`ckpt_cli/io/serialize.py`): beyond the "
            "model itself it holds at most a tensor's bytes, where `onnx.load` holds the file's bytes beside the "
            "model and one `SerializeToString` a growing buffer and its copy. **floor** = "
            "`python -c 'onnx.save(onnx.load(F), OUT)'`.")
        add("")
        _big_weights_table(e, add)
    add("")


def _copy_note(copy: dict | None, add) -> None:
    if not copy:
        return
    r = copy["ratios"]
    add(f"The last three rows: medians of {copy['repeats']} interleaved runs (`bench.big_weights.copy_speed`). "
        f"The rewrite takes {ratio(r[COPY_ROWS[1]])} a plain copy of the {nbytes(copy['data_bytes'])} data file "
        f"(`cp` + `sync FILE`); `--force` over that identical output {ratio(r[COPY_ROWS[2]])}: it reads the "
        "weights once and writes no data.")
    add("")


def _big_weights_table(b: dict, add) -> None:
    add("| command | wall | peak RSS | peak RSS / file | exit |")
    add("|---|---|---|---|---|")
    for name, c in b["commands"].items():
        label = name if name in ("floor", COPY_ROWS[0]) else f"`ckpt {name}`"
        ratio = f"{c['max_rss_bytes'] / b['weights_bytes']:.2f}×" if c.get("max_rss_bytes") else "n/a"
        add(f"| {label} | {secs(c['wall_s'])} | {nbytes(c['max_rss_bytes'])} | {ratio} | {c['rc']} |")
    add("")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.big_weights",
                                 description="ckpt rewrite of an external-data model against a copy of its weights")
    ap.add_argument("model", type=Path, help="a model whose weights are in MODEL.data (bench.synthetic --external-data)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--work", type=Path, help="where the copies go (default: beside the model)")
    a = ap.parse_args(argv)
    res = copy_speed(a.model.resolve(), (a.work or a.model.parent).resolve(), a.repeats)
    print(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
