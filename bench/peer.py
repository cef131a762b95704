"""ckpt's tensor-level front against PyTorch's min-cut partitioner, point by point.

    python -m bench.peer            # writes bench/PEER.md and bench/peer_results.json
    python -m bench.peer --models gpt2s --runs 1   # one model's entry, replaced in the results
    python -m bench.peer --models gpt,gpt12 --activation-budget-only   # only the CLI rows below
    python -m bench.peer --models gpt2s,bert_base --activation-budget-only --runs 0   # predicted, no --check

The PyTorch figures come from ``bench/peer_pytorch.json`` (``bench/peer_pytorch.py``,
run with torch). For each PyTorch point, ckpt's plan is the cut with the least
recompute cost (ckpt's own objective: FLOPs plus bytes moved) that keeps at most
PyTorch's activation bytes (``mincut.solve_bytes``). Both sides count recompute the
same two ways: ``matmul`` (2*M*N*K of matmul-class ops, as torch's flop counter) and
``elements`` (matmul FLOPs plus one per output element of every other recomputed op
that is not a view or a shape read). ckpt's activation bytes are the rewritten graph's
stashed bytes (without pin's guard scalars, a few bytes, reported apart); each ckpt plan is rewritten and checked on ONNX Runtime (``ckpt rewrite
--plan P --check``): measured peak, prediction error, bit-identical outputs.

The same knob through the command line: ``ckpt rewrite --activation-budget F --check`` at
PyTorch's F (0.5, 0.2; the same F keeps more bytes in ckpt, whose reference is the plan
that recomputes nothing, than in PyTorch, whose reference already recomputes cheap ops),
and at the F that lands on PyTorch's own activation bytes, where the matmul recompute of
the two compares like for like. Issue 47's done-when is read from those rows (``cli_verdict``):
at PyTorch's bytes, no more matmul FLOPs recomputed than PyTorch at 0.5 and at 0.2.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.fixtures.flops import element_flops, matmul_flops

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
PEER_JSON = BENCH / "peer_pytorch.json"
COMPARED = (0.5, 0.2)  # the budgets the done-when compares at


def _check(model: Path, plan: dict, work: Path, runs: int) -> dict:
    plan_path = work / "plan.json"
    plan_path.write_text(json.dumps(plan))
    from bench.run import ckpt_cmd

    out = subprocess.run([*ckpt_cmd(), "rewrite", str(model), "--plan", str(plan_path),
                          "-o", str(work / "out.onnx"), "--force", "--check", "--provider", "cpu", "--runs", str(runs),
                          "--json"], capture_output=True, text=True, cwd=REPO)
    if out.returncode not in (0, 1):
        return {"error": out.stderr.strip().splitlines()[-1] if out.stderr.strip() else f"exit {out.returncode}"}
    r = json.loads(out.stdout)
    c = r["check"]
    return {"predicted_peak": r["after"]["peak_bytes"], "predicted_in_use": c["predicted_in_use"]["rewritten"],
            "measured_in_use": c["rewritten"]["peak_bytes"],
            "measured_requested": c["rewritten"]["peak_requested_bytes"],
            "prediction_error": c["prediction_error"]["rewritten"],
            "prediction_error_in_use": c["prediction_error_in_use"]["rewritten"],
            "outputs_equal": c["outputs_equal"], "time_s": c["rewritten"]["time_s"],
            "original_time_s": c["original"]["time_s"], "original_in_use": c["original"]["peak_bytes"]}


BENCH_MODELS = REPO / "out" / "bench_models"  # python -m bench.models (torch) writes the realistic ones here


def model_path(name: str) -> Path | None:
    for folder in (REPO / "sample_models", BENCH_MODELS):
        if (folder / f"{name}.onnx").exists():
            return folder / f"{name}.onnx"
    return None


def _activation_cli(model: Path, share: float, work: Path, runs: int) -> dict:
    """``ckpt rewrite --activation-budget F`` (``--check`` when ``runs``) through the command
    line: its record of the choice, and the check's verdict."""
    from bench.run import ckpt_cmd

    check = ["--check", "--provider", "cpu", "--runs", str(runs)] if runs else []
    out = subprocess.run([*ckpt_cmd(), "rewrite", str(model), "--activation-budget", repr(share),
                          "-o", str(work / "ab.onnx"), "--force", *check, "--json"],
                         capture_output=True, text=True, cwd=REPO)
    if out.returncode not in (0, 1):
        return {"share": share, "error": out.stderr.strip().splitlines()[-1] if out.stderr.strip()
                else f"exit {out.returncode}"}
    r = json.loads(out.stdout)
    row = {**r["planning"]["activation_budget"], "exit_code": out.returncode}
    if runs:
        c = r["check"]
        row |= {"outputs_equal": c["outputs_equal"], "passed": out.returncode == 0,
                "measured_in_use": c["rewritten"]["peak_bytes"], "original_in_use": c["original"]["peak_bytes"]}
    return row


def activation_rows(m: dict, model: Path, runs: int, checked: set[float] | None = None) -> list[dict]:
    """Per compared PyTorch budget: ckpt at the same F, and at the F that keeps PyTorch's bytes."""
    from ckpt_cli.analysis import analyse
    from ckpt_cli.io.load import load_graph

    base = analyse(load_graph(model)).stashed_bytes  # the no-recompute plan's activation bytes
    rows = []
    with tempfile.TemporaryDirectory(prefix="ckpt_peer_ab_") as tmp:
        for pt in m["points"]:
            if pt["partitioner"] != "min_cut" or pt["budget"] not in COMPARED:
                continue
            at_bytes = (pt["activation_bytes"] + 0.5) / base  # its limit rounds down to PyTorch's bytes
            here = _runs_at(pt["budget"], model, runs, checked)
            rows.append({"budget": pt["budget"], "torch": pt,
                         "same_share": _activation_cli(model, pt["budget"], Path(tmp), here),
                         "torch_bytes": _activation_cli(model, at_bytes, Path(tmp), here)})
    return rows


def _budget_point(a, model: Path, cut_peak: int, work: Path, runs: int) -> dict:  # runs 0: predicted only
    """Peak space: ``--budget`` at what ORT is predicted to hold for the cut's written graph
    (arena in use plus inputs: what a budget bounds, and the check measures the arena's part)."""
    from ckpt_cli.rewrite.select import make_plan, rewrite_plan

    planned = make_plan(a, budget=str(cut_peak))
    result = rewrite_plan(a, planned)
    index = {n.name: i for i, n in enumerate(a.graph.nodes)}
    copied = [index[name] for r in result.regions for name in r.copies]
    return {"budget_bytes": cut_peak, "predicted_peak": result.after.priority.peak_bytes,
            "predicted_ort_peak": result.after.ort_peak_bytes,
            "recompute_flops": result.recompute_flops, "recompute_matmul_flops": matmul_flops(a, copied),
            "recomputed_nodes": len(copied),
            **(_check(model, planned.plan.to_json([n.name for n in a.graph.nodes]), work, runs) if runs else {})}


def _runs_at(budget: float, model: Path, runs: int, checked: set[float] | None) -> int:
    """ORT runs at one PyTorch point: every point of a sample; on the bench models (a step
    takes tens of seconds here) one run at the compared points, unless ``checked`` says."""
    if checked is not None:
        return runs if budget in checked else 0
    if model.parent == BENCH_MODELS:
        return min(runs, 1) if budget in COMPARED else 0
    return runs


def bench_peer(runs: int = 3, only: set[str] | None = None, checked: set[float] | None = None) -> dict:
    """Every model of ``peer_pytorch.json`` (or ``only`` those); ``runs`` 0: predicted figures
    only, no ORT check; ``checked``: the PyTorch budgets checked on ORT (None: all)."""
    from ckpt_cli.analysis import analyse
    from ckpt_cli.io.load import load_graph
    from ckpt_cli.planning import mincut
    from ckpt_cli.rewrite import rewrite, written as analysed

    peer = json.loads(PEER_JSON.read_text())
    out: dict = {"torch": peer["torch"], "models": []}
    for m in peer["models"]:
        if only is not None and m["model"] not in only:
            continue
        model = model_path(m["model"])
        if model is None:
            print(f"{m['model']}: no ONNX file (run python -m bench.models); skipped", file=sys.stderr)
            continue
        a = analyse(load_graph(model))
        problem = mincut.build(a)
        fwd = [i for i in range(len(a.graph.nodes)) if a.phases.is_forward[i]]
        entry = {"model": m["model"], "ckpt_forward_matmul_flops": matmul_flops(a, fwd),
                 "torch_forward_matmul_flops": m["forward_matmul_flops"], "stashed_bytes": a.stashed_bytes,
                 "points": [], "front": []}
        for cut in mincut.front(problem):
            entry["front"].append({"kept_bytes": cut.kept_bytes, "matmul_flops": matmul_flops(a, cut.copied),
                                   "element_flops": element_flops(a, cut.copied)})
        with tempfile.TemporaryDirectory(prefix="ckpt_peer_") as tmp:
            for pt in m["points"]:
                if pt["partitioner"] != "min_cut":
                    continue
                runs_here = _runs_at(pt["budget"], model, runs, checked)
                cut = mincut.solve_bytes(problem, pt["activation_bytes"])
                plan = mincut.to_plan(a, cut, "mincut")
                # The plan's activations; pinning adds a few bytes of guard scalars (counted apart).
                result = analysed(a, rewrite(a, plan, pin=False))
                written = analysed(a, rewrite(a, plan))
                pinned = written.after.stashed_bytes
                row = {"budget": pt["budget"], "torch": pt,
                       "budget_search": _budget_point(a, model, written.after.ort_peak_bytes, Path(tmp), runs_here),
                       "ckpt": {"activation_bytes": result.after.stashed_bytes, "kept_bytes": cut.kept_bytes,
                                "written_peak": written.after.priority.peak_bytes,
                                "written_ort_peak": written.after.ort_peak_bytes,
                                "written_recompute_flops": written.recompute_flops,
                                "pin_guard_bytes": pinned - result.after.stashed_bytes,
                                "recompute_matmul_flops": matmul_flops(a, cut.copied),
                                "recompute_element_flops": element_flops(a, cut.copied),
                                "recompute_flops": result.recompute_flops,
                                **(_check(model, plan.to_json([n.name for n in a.graph.nodes]), Path(tmp), runs_here)
                                   if runs_here else {})}}
                entry["points"].append(row)
        entry["activation_budget"] = activation_rows(m, model, runs, checked)
        out["models"].append(entry)
    return out


def _with_activation_rows(res: dict, only: set[str] | None, runs: int) -> dict:
    """The results with the ``--activation-budget`` rows of ``only`` (None: every model) run anew."""
    peer = {m["model"]: m for m in json.loads(PEER_JSON.read_text())["models"]}
    for entry in res["models"]:
        model = model_path(entry["model"])
        if (only is not None and entry["model"] not in only) or model is None:
            continue
        entry["activation_budget"] = activation_rows(peer[entry["model"]], model, runs)
    return res


def cli_verdict(m: dict) -> dict[float, bool | None]:
    """Issue 47's done-when on one model, per compared PyTorch budget, from its
    ``--activation-budget`` rows: whether the F whose limit is PyTorch's activation bytes
    keeps at most those bytes and recomputes no more matmul FLOPs than PyTorch (None: no row,
    or the command failed)."""
    rows = {row["budget"]: row for row in m.get("activation_budget") or []}
    verdict: dict[float, bool | None] = {}
    for budget in COMPARED:
        row = rows.get(budget)
        c = row["torch_bytes"] if row else {"error": "not run"}
        verdict[budget] = None if "error" in c else (
            c["kept_bytes"] <= row["torch"]["activation_bytes"]
            and c["recompute_matmul_flops"] <= row["torch"]["recompute_matmul_flops"])
    return verdict


def _render_cli_summary(res: dict, add) -> None:
    """One line for every model: issue 47's done-when, as ``cli_verdict`` reads it."""
    met, failed, missing = [], [], []
    for m in res["models"]:
        v = cli_verdict(m).values()
        (missing if None in v else met if all(v) else failed).append(m["model"])
    add(f"Issue 47's done-when through the command line (`--activation-budget F` at the F whose limit is "
        f"PyTorch's activation bytes recomputes no more matmul FLOPs than PyTorch's min-cut at budgets "
        f"{list(COMPARED)}; the per-model tables below): met on {', '.join(met) or 'none'}; not met on "
        f"{', '.join(failed) or 'none'}" + (f"; no CLI rows on {', '.join(missing)}" if missing else "") + ".")
    add("")


def _render_cli_verdict(m: dict, add) -> None:
    rows = {row["budget"]: row for row in m.get("activation_budget") or []}
    verdict = cli_verdict(m)
    parts = []
    for budget, ok in verdict.items():
        if ok is None:
            parts.append(f"{budget}: no row")
            continue
        t, c = rows[budget]["torch"], rows[budget]["torch_bytes"]
        parts.append(f"{budget}: {'yes' if ok else 'NO'} (activations "
                     f"{_ratio(c['kept_bytes'], t['activation_bytes'])}, matmul recompute "
                     f"{_ratio(c['recompute_matmul_flops'], t['recompute_matmul_flops'])})")
    add("Through the command line (issue 47's done-when, the `--activation-budget` rows below at PyTorch's "
        "bytes; ratios ckpt/torch): recomputes no more matmul FLOPs than PyTorch at the same activation "
        "bytes: " + "; ".join(parts) + ".")
    add("")


def _mib(x) -> str:
    return "n/a" if x is None else f"{x / 2**20:.3f} MiB"


def _ratio(ours: int, theirs: int) -> str:
    if not theirs:
        return "0 = 0" if not ours else "n/a"
    return f"{ours / theirs:.3f}"


def render(res: dict, add) -> None:
    add(f"PyTorch {res['torch']} `min_cut_rematerialization_partition` with `activation_memory_budget` "
        "(figures from `bench/peer_pytorch.py`, committed in `bench/peer_pytorch.json`) against ckpt's "
        "tensor-level cut keeping at most PyTorch's activation bytes (`mincut.solve_bytes`, ckpt's own "
        "objective), rewritten and checked on ORT CPU. Recompute as a share of each side's forward matmul "
        "FLOPs; *elements*: matmul FLOPs plus one per output element of other non-view recomputed ops. "
        "ckpt activations exclude the pinned rewrite's guard scalars (a few bytes, `pin_guard_bytes` in "
        "`bench/peer_results.json`). Step time: the rewritten graph's ORT step against the original's, "
        "from `ckpt check` (a small shared CPU machine: indicative only).")
    add("")
    add("Models: the gpt and gpt12 samples, and the activation-bound models of `bench/models.py` (`make "
        "bench-models`): gpt2s (GPT-2 small, batch 4, seq 512), resnet18_224 (batch 16, 224×224) and bert_base "
        "(batch 2, seq 512). On gpt2s and bert_base only PyTorch's 0.5 and 0.2 points are run on ORT "
        "(`--check-budgets 0.5,0.2 --runs 1`: a step takes tens of seconds on this machine); their other rows "
        "are predicted (n/a in the measured columns).")
    add("")
    _render_cli_summary(res, add)
    for m in res["models"]:
        add(f"**{m['model']}** (forward matmul FLOPs: ckpt {m['ckpt_forward_matmul_flops']:,}, "
            f"torch {m['torch_forward_matmul_flops']:,}; both 2·M·N·K, as torch's flop counter)")
        add("")
        add("| budget | torch activations | torch matmul recompute | torch elements | ckpt activations | "
            "ckpt matmul recompute | ckpt elements | matmul ratio ckpt/torch | ckpt predicted (in use) | "
            "measured (in use) | error (in use / requested) | outputs equal | step time × original |")
        add("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for row in m["points"]:
            t, c = row["torch"], row["ckpt"]
            tm = t["recompute_matmul_flops"] / m["torch_forward_matmul_flops"]
            cm = c["recompute_matmul_flops"] / m["ckpt_forward_matmul_flops"]
            ratio = _ratio(c["recompute_matmul_flops"], t["recompute_matmul_flops"])
            err = (f"{c['prediction_error_in_use']:+.1%} / {c['prediction_error']:+.1%}"
                   if "prediction_error" in c else c.get("error", "n/a"))
            slow = f"{c['time_s'] / c['original_time_s']:.2f}×" if c.get("original_time_s") else "n/a"
            add(f"| {row['budget']} | {_mib(t['activation_bytes'])} | {tm:.1%} "
                f"| {t['recompute_element_flops'] / 1e6:.2f} M "
                f"| {_mib(c['activation_bytes'])} | {cm:.1%} | {c['recompute_element_flops'] / 1e6:.2f} M | {ratio} "
                f"| {_mib(c.get('predicted_in_use'))} | {_mib(c.get('measured_in_use'))} | {err} "
                f"| {c.get('outputs_equal', 'n/a')} | {slow} |")
        add("")
        dominated = [row["budget"] for row in m["points"] if row["budget"] in COMPARED
                     and row["ckpt"]["activation_bytes"] <= row["torch"]["activation_bytes"]
                     and row["ckpt"]["recompute_matmul_flops"] <= row["torch"]["recompute_matmul_flops"]]
        add(f"ckpt's front dominates PyTorch's at budgets {dominated or 'none'} of {list(COMPARED)} "
            "(activation bytes ≤ and matmul recompute FLOPs ≤). Ratios ckpt/torch: " + "; ".join(
                f"{row['budget']}: activations {_ratio(row['ckpt']['activation_bytes'], row['torch']['activation_bytes'])}, "
                f"matmul recompute {_ratio(row['ckpt']['recompute_matmul_flops'], row['torch']['recompute_matmul_flops'])}, "
                f"elements {_ratio(row['ckpt']['recompute_element_flops'], row['torch']['recompute_element_flops'])}"
                for row in m["points"] if row["budget"] in COMPARED) + ".")
        add("")
        _render_cli_verdict(m, add)
        _render_activation_budget(m, add)
        _render_peak_space(m, add)
        add("ckpt's min-cut front (corners of the price sweep): " + ", ".join(
            f"{_mib(f['kept_bytes'])} @ {f['matmul_flops'] / m['ckpt_forward_matmul_flops']:.1%}" for f in m["front"]))
        add("")


def _render_activation_budget(m: dict, add) -> None:
    rows = m.get("activation_budget")
    if not rows:
        return
    fwd = m["ckpt_forward_matmul_flops"]
    checked = all("passed" in c for row in rows for c in (row["same_share"], row["torch_bytes"]) if "error" not in c)
    how = ("`ckpt rewrite --activation-budget F --check`" if checked else
           "`ckpt rewrite --activation-budget F`, predicted: the plan's own figures, no `--check` run on this "
           "model, whose step takes tens of seconds on this machine; n/a in the check columns")
    add(f"The same knob through the command line ({how}): at PyTorch's F, "
        "and at the F whose limit is PyTorch's activation bytes (matmul recompute compared like for like). "
        "Activations: the bytes the plan keeps for the backward, and their share of ckpt's reference (the "
        "no-recompute plan's); check: `--check` on ORT CPU (bit-identical outputs among its premises), arena in use "
        "measured against the original's.")
    add("")
    add("| budget | torch activations | torch matmul recompute | ckpt F | ckpt activations (share) "
        "| ckpt matmul recompute | matmul ratio ckpt/torch | outputs equal | check | measured (in use) |")
    add("|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        t = row["torch"]
        for c in (row["same_share"], row["torch_bytes"]):
            if "error" in c:
                add(f"| {row['budget']} | {_mib(t['activation_bytes'])} | | {c['share']:.4g} | {c['error']} "
                    "| | | | | |")
                continue
            add(f"| {row['budget']} | {_mib(t['activation_bytes'])} "
                f"| {t['recompute_matmul_flops'] / m['torch_forward_matmul_flops']:.1%} | {c['share']:.4g} "
                f"| {_mib(c['kept_bytes'])} ({c['kept_share']:.3f}) | {c['recompute_matmul_flops'] / fwd:.1%} "
                f"| {_ratio(c['recompute_matmul_flops'], t['recompute_matmul_flops'])} "
                f"| {c.get('outputs_equal', 'n/a')} | {_passed(c)} "
                f"| {_measured(c)} |")
    add("")


def _measured(c: dict) -> str:
    if c.get("measured_in_use") is None:
        return "n/a"
    return f"{_mib(c['measured_in_use'])} of {_mib(c.get('original_in_use'))}"


def _passed(c: dict) -> str:
    return "n/a" if "passed" not in c else "PASS" if c["passed"] else "FAIL"


def _render_peak_space(m: dict, add) -> None:
    rows = [r for r in m["points"] if "budget_search" in r]
    if not rows:
        return
    fwd = m["ckpt_forward_matmul_flops"]
    add("Peak space: the cut's written graph (P: what ORT is predicted to hold, arena in use plus inputs; "
        "recompute R), then `--budget P`. Recompute in ckpt's FLOPs (all ops) and as matmul share of the "
        "forward; peaks measured on ORT CPU (arena in use: the inputs are the same on both sides); step time "
        "against the original's.")
    add("")
    add("| budget | P (cut, predicted) | cut measured | cut recompute | cut step × | --budget P predicted "
        "| --budget measured | measured ≤ cut | --budget recompute | --budget step × | recompute --budget/cut |")
    add("|---|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        c, b = row["ckpt"], row["budget_search"]
        add(f"| {row['budget']} | {_mib(c.get('written_ort_peak'))} | {_mib(c.get('measured_in_use'))} "
            f"| {c['written_recompute_flops'] / 1e6:.2f} M ({c['recompute_matmul_flops'] / fwd:.1%}) | {_slow(c)} "
            f"| {_mib(b.get('predicted_ort_peak'))} | {_mib(b.get('measured_in_use'))} | {_within(b, c)} "
            f"| {b['recompute_flops'] / 1e6:.2f} M ({b['recompute_matmul_flops'] / fwd:.1%}) | {_slow(b)} "
            f"| {_ratio(b['recompute_flops'], c['written_recompute_flops'])} |")
    add("")


def _within(budget: dict, cut: dict) -> str:
    """Whether the budget plan's measured arena stays at or under the cut's."""
    if budget.get("measured_in_use") is None or cut.get("measured_in_use") is None:
        return "n/a"
    return "yes" if budget["measured_in_use"] <= cut["measured_in_use"] else "no"


def _slow(r: dict) -> str:
    return f"{r['time_s'] / r['original_time_s']:.2f}×" if r.get("original_time_s") else "n/a"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", help="comma-separated; their entries replace those in peer_results.json")
    p.add_argument("--runs", type=int, default=3, help="ORT runs per check (0: predicted figures only)")
    p.add_argument("--check-budgets", help="comma-separated PyTorch budgets to check on ORT (default: all)")
    p.add_argument("--activation-budget-only", action="store_true",
                   help="only the `--activation-budget` rows of --models, added to the results as they are")
    args = p.parse_args(argv)
    only = set(args.models.split(",")) if args.models else None
    checked = {float(b) for b in args.check_budgets.split(",")} if args.check_budgets else None
    results = BENCH / "peer_results.json"
    if args.activation_budget_only:
        res = _with_activation_rows(json.loads(results.read_text()), only, args.runs)
    else:
        res = bench_peer(args.runs, only, checked)
    if only is not None and results.exists():
        fresh = {m["model"]: m for m in res["models"]}
        kept = json.loads(results.read_text())["models"]
        res["models"] = [fresh.pop(m["model"], m) for m in kept] + list(fresh.values())
    results.write_text(json.dumps(res, indent=1) + "\n")
    lines: list[str] = ["# ckpt against PyTorch's min-cut partitioner", "", "Generated by `python -m bench.peer`.", ""]
    render(res, lines.append)
    (BENCH / "PEER.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
