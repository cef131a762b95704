"""Section 2 of ``python -m bench.run``: memory and overhead on the sample models.

``ckpt rewrite SAMPLE --check --json --runs N`` per strategy; the check runs the original
(ckpt settings and ORT default settings) and the rewritten graph on ORT CPU in child
processes and reads the peaks from ORT's profiler. Budget rows (``--budget 75%/50%/30%``)
and ``--auto balanced`` too; an unreachable budget (exit 3) records ckpt's one-line error.
``render`` writes the section's tables.
"""

from __future__ import annotations

import json
from pathlib import Path

from bench.common import (REPO, SAMPLES, ckpt_cmd, error_line, log, median, ms, nbytes, pct, ratio, run_measured,
                          yes_no)

MEMORY_BUDGETS = (75, 50, 30)  # % of the original predicted peak (parameters and feeds included)


def _sample_analysis(path: Path, work: Path) -> dict:
    from ckpt_cli.analysis import analyse, default_order
    from ckpt_cli.io.load import load_graph
    from ckpt_cli.planning import layer_regions, sqrt_regions

    a = analyse(load_graph(path))
    names = [n.name for n in a.graph.nodes]
    sq = sqrt_regions(a)
    plan_path = work / f"{path.stem}.sqrt.plan.json"
    plan_path.write_text(json.dumps(sq.to_json(names), indent=1))
    layers = layer_regions(a)
    default = default_order(a)
    return {
        "nodes": len(a.graph.nodes),
        "predicted_ort_default_activation_peak": default.activation_peak_bytes,
        "predicted_ort_default_peak": default.peak_bytes,
        "predicted_file_order_activation_peak": a.priority.activation_peak_bytes,
        "predicted_file_order_peak": a.priority.peak_bytes,
        "resident_bytes": a.priority.resident_bytes,
        "predicted_ort_peak": a.ort_peak_bytes,
        "sqrt_segments": len(sq.regions),
        "layer_regions": len(layers.regions) if layers else 0,
        "sqrt_plan": str(plan_path),
    }


def _budget_of(key: str, info: dict) -> int | None:
    """The byte budget ckpt derives from ``--budget N%`` (int(ORT peak * share), as parse_budget does)."""
    if not key.startswith("budget"):
        return None
    return int(info["predicted_ort_peak"] * int(key[len("budget"):]) / 100)


def bench_memory(repeats: int, runs: int, work: Path) -> dict:
    out: dict = {"runs_per_check": runs, "repeats": repeats, "samples": {}}
    for s in SAMPLES:
        path = REPO / "sample_models" / f"{s}.onnx"
        if not path.exists():
            out["samples"][s] = {"error": f"{path} missing"}
            continue
        info = _sample_analysis(path, work)
        variants = _variants(info)
        raw = _run_checks(s, path, variants, repeats, runs, work)
        log(f"memory {s}: {sum(len(v) for v in raw.values())} checks done")
        all_checks = [x["report"]["check"] for xs in raw.values() for x in xs if x["report"] and "check" in x["report"]]
        rows = _original_rows(info, all_checks)
        rows.extend(_variant_row(key, title, raw[key], info) for key, title, _ in variants)
        out["samples"][s] = {"info": info, "rows": rows,
                             "provider": all_checks[0]["provider"] if all_checks else None}
    return out


def _variants(info: dict) -> list[tuple[str, str, list[str]]]:
    """(key, row title, extra `ckpt rewrite` arguments) of each strategy checked on a sample."""
    return [
        ("no_recompute", "reorder only (`--no-recompute`)", ["--no-recompute"]),
        ("per_layer", f"per layer (default; {info['layer_regions']} regions)", []),
        ("sqrt", f"sqrt(n) segments ({info['sqrt_segments']}, `--plan`)", ["--plan", info["sqrt_plan"]]),
        ("balanced", "balanced (`--auto balanced`)", ["--auto", "balanced"]),
        *[(f"budget{b}", f"budget {b} % of original peak (`--budget {b}%`)", ["--budget", f"{b}%"])
          for b in MEMORY_BUDGETS],
    ]


def _run_checks(s: str, path: Path, variants: list, repeats: int, runs: int, work: Path) -> dict[str, list[dict]]:
    """``ckpt rewrite SAMPLE --check --json`` per strategy, ``repeats`` times: key -> its runs."""
    ckpt = ckpt_cmd()
    raw: dict[str, list[dict]] = {k: [] for k, _, _ in variants}
    for rep in range(repeats):
        for key, _, extra in variants:
            if raw[key] and raw[key][-1]["rc"] == 3:
                continue  # an unreachable budget stays unreachable: planning is deterministic
            rout = work / f"{s}.{key}.ckpt.onnx"
            stdout = work / f"{s}.{key}.json"
            cmd = [*ckpt, "rewrite", str(path), "-o", str(rout), "--force", *extra, "--check", "--json",
                   "--runs", str(runs)]
            r = run_measured(cmd, stdout_path=stdout)
            try:
                rep_json = json.loads(stdout.read_text())
            except (OSError, json.JSONDecodeError):
                rep_json = None
            raw[key].append({"wall_s": r["wall_s"], "rc": r["rc"], "report": rep_json,
                             "stderr": r["stderr_tail"]})
            if r["rc"] == 3:
                log(f"  {s} {key}: budget unreachable")
            elif rep_json is None or "check" not in rep_json:
                log(f"  {s} {key}: no check report (exit {r['rc']}): {r['stderr_tail'][-300:]}")
            elif r["rc"] != 0:
                log(f"  {s} {key}: exit {r['rc']} (check failed: outputs_equal="
                    f"{rep_json['check']['outputs_equal']}, memory_lower={rep_json['check']['memory_lower']})")
    return raw


def _original_rows(info: dict, all_checks: list[dict]) -> list[dict]:
    """The original graph's two rows: under ORT's default settings and under ckpt's."""
    d_time = median(c["original_ort_default"]["time_s"] for c in all_checks if c["original_ort_default"])
    return [{
        "row": "original, ORT default settings",
        "predicted_peak": info["predicted_ort_default_activation_peak"],
        "measured_peak": median(c["original_ort_default"]["peak_bytes"] for c in all_checks
                                if c["original_ort_default"]),
        "measured_above_baseline": median(c["original_ort_default"]["peak_above_baseline_bytes"]
                                          for c in all_checks if c["original_ort_default"]),
        "measured_requested": None,
        "time_s": d_time, "time_vs_ort_default": 1.0 if d_time else None,
        "time_vs_original": median(c["original_ort_default"]["time_s"] / c["original"]["time_s"]
                                   for c in all_checks if c["original_ort_default"] and c["original"]["time_s"]),
        "recompute_share_of_step": 0.0, "outputs_identical": None, "check_passed": None,
    }, {
        "row": "original, ckpt settings (file order)",
        "predicted_peak": info["predicted_file_order_activation_peak"],
        "measured_peak": median(c["original"]["peak_bytes"] for c in all_checks),
        "measured_above_baseline": median(c["original"]["peak_above_baseline_bytes"] for c in all_checks),
        "measured_requested": median(c["original"]["peak_requested_bytes"] for c in all_checks),
        "time_s": median(c["original"]["time_s"] for c in all_checks),
        "time_vs_ort_default": median(c["original"]["time_s"] / c["original_ort_default"]["time_s"]
                                      for c in all_checks if c["original_ort_default"]),
        "time_vs_original": 1.0,
        "recompute_share_of_step": 0.0, "outputs_identical": None, "check_passed": None,
    }]


def _variant_row(key: str, title: str, raw: list[dict], info: dict) -> dict:
    """One strategy's row from its check runs: medians, or its unreachable budget, or its error."""
    reps = [x["report"] for x in raw if x["report"] and "check" in x["report"]]
    cs = [r["check"] for r in reps]
    if raw and raw[-1]["rc"] == 3:
        return {"row": title, "unreachable": error_line(raw[-1]["stderr"]),
                "budget_bytes": _budget_of(key, info), "exit_codes": [x["rc"] for x in raw]}
    if not cs:
        return {"row": title, "error": (raw[-1]["stderr"] or "no report")[-500:]}
    row = {
        "row": title,
        "strategy": reps[0].get("strategy"),
        "predicted_peak": median(c["predicted"]["rewritten"] for c in cs),
        "predicted_peak_incl_resident": median(r["after"]["peak_bytes"] for r in reps),
        "measured_peak": median(c["rewritten"]["peak_bytes"] for c in cs),
        "measured_above_baseline": median(c["rewritten"]["peak_above_baseline_bytes"] for c in cs),
        "measured_requested": median(c["rewritten"]["peak_requested_bytes"] for c in cs),
        "time_s": median(c["rewritten"]["time_s"] for c in cs),
        # ratios within one check run (same process conditions), then the median
        "time_vs_ort_default": median(c["rewritten"]["time_s"] / c["original_ort_default"]["time_s"]
                                      for c in cs if c["original_ort_default"]),
        "time_vs_original": median(c["rewritten"]["time_s"] / c["original"]["time_s"] for c in cs),
        "recompute_share_of_step": median(r["recompute_share_of_step"] for r in reps),
        "recompute_nodes": median(r["recompute_nodes"] for r in reps),
        "outputs_identical": all(c["outputs_equal"] for c in cs),
        "order_matches": all(c["order_matches"] for c in cs),
        "memory_lower": all(c["memory_lower"] for c in cs),
        "check_passed": all(c["passed"] for c in cs),
        "exit_codes": [x["rc"] for x in raw],
        "rewrite_check_wall_s": median(x["wall_s"] for x in raw),
    }
    if key.startswith("budget"):
        row.update(_budget_figures(reps, row["measured_peak"]))
    return row


def _budget_figures(reps: list[dict], measured: int | None) -> dict:
    """A budget row's extras: the budget, the bytes ORT holds outside its arena, and
    whether the peaks fit. ``measured``: the arena's bytes in use at the peak."""
    planning = [r.get("planning") or {} for r in reps]
    # outside the arena (parameters + feeds) = predicted ORT peak - predicted arena in use
    resident = median(p["ort_peak_bytes_after"] - r["check"]["predicted_in_use"]["rewritten"]
                      for p, r in zip(planning, reps))
    budget = median(p.get("budget_bytes") for p in planning)
    return {
        "budget_bytes": budget, "resident_bytes": resident,
        "predicted_peak_within_budget": all(p.get("budget_met") for p in planning),
        "measured_plus_resident": (measured + resident) if measured is not None else None,
        "measured_within_budget": (measured + resident <= budget
                                   if None not in (measured, resident, budget) else None),
        "planning_evaluations": median(p.get("evaluations") for p in planning),
    }


# --------------------------------------------------------------------------- report


def render(mem: dict, add) -> None:
    """Section 2's text and tables (below its heading), one line at a time through ``add``."""
    _render_intro(mem, add)
    for s, d in mem["samples"].items():
        if "error" in d:
            add(f"### {s}: {d['error']}")
            continue
        i = d["info"]
        add(f"### {s}.onnx ({i['nodes']} nodes, resident parameters + feeds {nbytes(i['resident_bytes'])}, "
            f"provider {d['provider']})")
        add("")
        add("| row | predicted | measured in use | above baseline | measured tensors | step time "
            "| × ORT default | × original | recompute share | outputs identical | check | budget "
            "| fits budget (in use + inputs) |")
        add("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for r in d["rows"]:
            add(_row(r))
        add("")


def _render_intro(mem: dict, add) -> None:
    add(f"`ckpt rewrite SAMPLE -o OUT --force [strategy] --check --json --runs {mem['runs_per_check']}`, "
        f"{mem['repeats']} time(s) per strategy; each check runs the original under ckpt's settings "
        "(PRIORITY_BASED, file order) and under ORT's defaults, and the rewritten graph under ckpt's "
        "settings, each in a fresh ORT CPU child process with intra_op_num_threads=1 and the profiler on. "
        "Figures are medians over all runs.")
    add("")
    add("- **predicted**: ckpt's liveness simulation of tensor bytes (parameters and feeds excluded); for "
        "the ORT-default row the simulation of ORT's DEFAULT order.")
    add("- **measured in use**: max of ORT's arena `mem_bytes_in_use` (absolute, 256-byte chunks; under ORT "
        "defaults this includes the memory-pattern block planned at the first run, see *above baseline*).")
    add("- **measured tensors**: max `mem_bytes_requested_in_use` minus the session baseline (what the "
        "prediction models; not reported under ORT defaults).")
    add("- **step time**: median `session.run` wall time; ratios are taken within each check run, then the "
        "median. **recompute share**: recomputed FLOPs / (forward + backward FLOPs) of the original.")
    add("- **outputs identical**: loss and every gradient bit-identical to the original's; **check**: "
        "outputs identical and measured in-use peak not above the original's (ckpt settings).")
    add("- **budget** rows: `--budget N%` is N % of what ORT is predicted to hold for the original: its "
        "arena in use plus the parameters and feeds outside it. **fits budget**: measured in use + those "
        "inputs ≤ budget, the inputs being the report's `planning.ort_peak_bytes_after` − "
        "`check.predicted_in_use.rewritten`. An unreachable budget (exit 3) shows ckpt's one-line error, "
        "which names the lowest reachable predicted peak.")
    add("")


def _row(r: dict) -> str:
    """One row of a sample's table."""
    if r.get("not_implemented"):
        return f"| {r['row']} | not implemented yet | | | | | | | | | | | |"
    if "unreachable" in r:
        return (f"| {r['row']} | unreachable: {r['unreachable']} | | | | | | | | | "
                f"| {nbytes(r.get('budget_bytes'))} | n/a |")
    if "error" in r:
        return f"| {r['row']} | failed: `{r['error'][-200:]}` | | | | | | | | | | | |"
    fits = ""
    if r.get("budget_bytes") is not None:
        fits = (f"{yes_no(r.get('measured_within_budget'))} "
                f"({nbytes(r.get('measured_plus_resident'))})")
    passed = r.get("check_passed")
    check = "n/a" if passed is None else ("pass" if passed else
                                          f"**FAIL** (exit {max(r.get('exit_codes') or [0])}"
                                          f"{', memory higher' if not r.get('memory_lower') else ''}"
                                          f"{', order differs' if r.get('order_matches') is False else ''})")
    return (f"| {r['row']} | {nbytes(r['predicted_peak'])} | {nbytes(r['measured_peak'])} "
            f"| {nbytes(r['measured_above_baseline'])} | {nbytes(r['measured_requested'])} "
            f"| {ms(r['time_s'])} | {ratio(r['time_vs_ort_default'])} | {ratio(r['time_vs_original'])} "
            f"| {pct(r['recompute_share_of_step'])} | {yes_no(r['outputs_identical'])} | {check} "
            f"| {nbytes(r.get('budget_bytes')) if r.get('budget_bytes') is not None else ''} | {fits} |")
