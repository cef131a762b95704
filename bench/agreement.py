"""``--budget`` (``--auto budget``) against ``--auto optimal`` on every sample, through the
API's planner (``pipeline.make_plan``: the tensor-level cuts and the region-structure search,
judged by the real cost model), at one reachable budget per sample.

    python -m bench.agreement       # prints the table (also section 7 of ``python -m bench.run``)

Too slow for the test suite on the larger samples (``optimal`` runs its exact MILPs
everywhere: about a minute on gpt12); the small ones are in ``tests/test_mincut.py``.
Issue target: ``budget`` within 3 % of ``optimal``'s recompute FLOPs.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TARGET = 0.03
# (sample, budget as % of the original predicted peak): reachable, and needing recompute.
POINTS = (("mlp", 90), ("gpt", 60), ("cnn", 75), ("gpt12", 60), ("resnet18", 90), ("ort_artifact", 92))


def _path(sample: str) -> Path:
    if sample == "ort_artifact":
        return REPO / "sample_models" / "ort_artifact" / "training_model.onnx"
    return REPO / "sample_models" / f"{sample}.onnx"


def bench_agreement(points=POINTS) -> dict:
    from ckpt_cli.analysis import analyse
    from ckpt_cli.errors import BudgetUnreachable
    from ckpt_cli.load import load_graph
    from ckpt_cli.pipeline import make_plan

    rows = []
    for sample, share in points:
        path = _path(sample)
        if not path.exists():
            rows.append({"sample": sample, "share": share, "missing": True})
            continue
        a = analyse(load_graph(path))
        row = {"sample": sample, "share": share, "nodes": len(a.graph.nodes),
               "budget_bytes": int(a.priority.peak_bytes * share / 100)}
        for auto in ("budget", "optimal"):
            t0 = time.perf_counter()
            try:
                s = make_plan(a, auto=auto, budget=f"{share}%").search
                row[auto] = {"peak_bytes": s.peak_bytes, "recompute_flops": s.recompute_flops,
                             "seconds": time.perf_counter() - t0, "how": s.plan.notes[0] if s.plan.notes else ""}
            except BudgetUnreachable as e:
                row[auto] = {"unreachable": str(e), "seconds": time.perf_counter() - t0}
        b, o = row["budget"], row["optimal"]
        if "recompute_flops" in b and "recompute_flops" in o:
            row["gap"] = (b["recompute_flops"] / o["recompute_flops"] - 1) if o["recompute_flops"] else (
                0.0 if not b["recompute_flops"] else None)
        rows.append(row)
    return {"target": TARGET, "rows": rows}


def _cell(x: dict) -> str:
    if "unreachable" in x:
        return "unreachable"
    return f"{x['recompute_flops'] / 1e6:,.1f} MFLOP, peak {x['peak_bytes'] / 2**20:.2f} MiB ({x['seconds']:.1f} s)"


def render(res: dict, add) -> None:
    add("`pipeline.make_plan(a, budget=B)` (the `budget` planner) against `make_plan(a, auto='optimal', "
        "budget=B)` at one reachable budget per sample; **gap** = budget's recompute FLOPs / optimal's − 1. "
        f"Issue target: within {res['target']:.0%}. Seconds are wall time on a shared machine.")
    add("")
    add("| sample | nodes | budget | `budget` | `optimal` | gap | within target | `budget` chose |")
    add("|---|---|---|---|---|---|---|---|")
    for r in res["rows"]:
        if r.get("missing"):
            add(f"| {r['sample']} | | {r['share']} % | missing | | | | |")
            continue
        gap = r.get("gap")
        gap_s = "n/a" if gap is None else f"{gap:+.1%}"
        ok = "n/a" if gap is None else ("yes" if gap <= res["target"] else "**no**")
        add(f"| {r['sample']} | {r['nodes']:,} | {r['share']} % | {_cell(r['budget'])} | {_cell(r['optimal'])} "
            f"| {gap_s} | {ok} | {r['budget'].get('how', '')[:90]} |")
    add("")


def main() -> int:
    lines: list[str] = []
    render(bench_agreement(), lines.append)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
