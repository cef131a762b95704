"""Sections 3 and 4 of ``python -m bench.run``: plan quality and the GPT targets.

3. In process, a sweep of budgets per sample, the ``budget`` heuristic against the
   ``optimal`` MILP (exact for the linear memory model, verified with the real cost model).
4. From the gpt sweep, the lowest reachable peak and its recompute share, and what the
   bytes live at the floor's peak are.

``render`` writes both sections, headings included.
"""

from __future__ import annotations

import time

from bench.common import REPO, SAMPLES, log, missing, ms, nbytes, pct, sig, yes_no

SWEEP_PCTS = (100, 95, 90, 85, 80, 75, 72, 70, 65, 60, 55, 50, 45, 40)  # % of the original predicted peak
GAP_TARGET = 0.03  # issue target: the budget heuristic within 3 % of the optimum's recompute FLOPs
GPT_TARGETS = ((0.70, 0.10), (0.85, 0.35))  # (peak reduction at least, recompute share of step at most)


def _run_planner(fn, a, limit: int, cost, intervals) -> dict:
    from ckpt_cli.errors import BudgetUnreachable

    t0 = time.perf_counter()
    try:
        r = fn(a, limit, cost, intervals)
    except BudgetUnreachable as e:
        return {"unreachable": str(e), "time_s": time.perf_counter() - t0}
    except Exception as e:  # noqa: BLE001 - record a planner bug and go on
        return {"error": f"{type(e).__name__}: {e}", "time_s": time.perf_counter() - t0}
    return {"peak_bytes": r.peak_bytes, "recompute_flops": r.recompute_flops, "evaluations": r.evaluations,
            "kept": len(r.kept), "recomputed": len(r.recomputed), "fits": r.peak_bytes <= limit,
            "time_s": time.perf_counter() - t0}


def _floor_breakdown(a, structure) -> dict:
    """Rewrite with every stashed activation of ``structure`` recomputed (its floor) and
    sort the bytes live at the predicted peak into categories."""
    from ckpt_cli.markers import is_recompute_copy
    from ckpt_cli.rewrite import rewrite, written

    r = written(a, rewrite(a, structure))
    pr = r.after.priority
    g = r.after.graph
    outputs = set(g.outputs)
    cats = {"parameters + inputs": pr.resident_bytes, "gradient outputs": 0, "recompute copies": 0,
            "kept forward tensors": 0, "backward temporaries": 0}
    largest: dict[str, list] = {k: [] for k in cats}
    for t in pr.live_at_peak:
        info = r.after.tensors.get(t)
        nb = (info.nbytes or 0) if info is not None else 0
        if t in outputs:
            k = "gradient outputs"
        elif t in g.producer and is_recompute_copy(g.nodes[g.producer[t]]):
            k = "recompute copies"
        elif t in g.producer and r.after.phases.is_forward[g.producer[t]]:
            k = "kept forward tensors"
        else:
            k = "backward temporaries"
        cats[k] += nb
        largest[k].append((nb, t))
    return {"structure": structure.strategy, "regions": len(structure.regions), "peak_bytes": pr.peak_bytes,
            "recompute_flops": r.recompute_flops, "categories": cats, "live_tensors": len(pr.live_at_peak),
            "categorised_bytes": sum(cats.values()),
            "largest": {k: [t for _, t in sorted(v, reverse=True)[:3]] for k, v in largest.items() if v}}


def _segment_scan(a) -> list[dict]:
    """The floor (every stashed activation recomputed) of every segmentation into k pieces,
    k = 2 .. 2*sqrt(n): how low single-level checkpointing goes on this graph."""
    import math

    from ckpt_cli.planning.regions import sqrt_regions
    from ckpt_cli.rewrite import rewrite

    step = a.forward_flops + a.backward_flops
    top = 2 * max(1, round(math.sqrt(sum(a.phases.is_forward))))
    out = []
    for k in range(2, top + 1):
        r = rewrite(a, sqrt_regions(a, k))
        out.append({"segments": k, "peak_bytes": r.after.priority.peak_bytes,
                    "share_of_step": r.recompute_flops / step if step else None})
    return out


def bench_plan_quality() -> dict:
    """Sweep budgets on each sample; budget heuristic vs the exact (for the linear model) MILP."""
    from ckpt_cli.analysis import analyse
    from ckpt_cli.io.load import load_graph

    out: dict = {"sweep_pcts": list(SWEEP_PCTS), "gap_target": GAP_TARGET, "samples": {}}
    for s in SAMPLES:
        path = REPO / "sample_models" / f"{s}.onnx"
        if not path.exists():
            out["samples"][s] = {"error": f"{path} missing"}
            continue
        d = out["samples"][s] = _sample_quality(analyse(load_graph(path)))
        log(f"plan quality {s}: {len(d['rows'])} budgets, max gap {pct(d['max_gap'])}, "
            f"floor {nbytes(d['best_floor']['peak_bytes'])} of {nbytes(d['original_peak_bytes'])}")
    out["gpt_targets"] = _gpt_targets(out["samples"].get("gpt"))
    return out


def _sample_quality(a) -> dict:
    """One sample's sweep: both planners at each budget, the structures' floors, the segment scan."""
    from ckpt_cli.analysis import lowest_peak
    from ckpt_cli.planning.strategies import structures
    from ckpt_cli.rewrite.select import keep_intervals, plan_cost

    base = a.priority.peak_bytes
    step = a.forward_flops + a.backward_flops

    def cost(p, a=a):
        return plan_cost(a, p)

    def intervals(p, a=a):
        return keep_intervals(a, p)

    t0 = time.perf_counter()
    floors = [_floor_breakdown(a, st) for st in structures(a)]
    floor_s = time.perf_counter() - t0
    best = min(floors, key=lambda f: (f["peak_bytes"], f["recompute_flops"]))
    scan = _segment_scan(a)
    rows = [_compare_planners(a, label, limit, base, step, cost, intervals)
            for label, limit in _budgets(base, best, scan)]
    gaps = [r["gap"] for r in rows if r["gap"] is not None]
    reached = [r for r in rows if "peak_bytes" in r["heuristic"]]
    return {
        "nodes": len(a.graph.nodes), "original_peak_bytes": base, "resident_bytes": a.priority.resident_bytes,
        "output_bytes": a.output_bytes, "lower_bound_bytes": lowest_peak(a).bytes,
        "step_flops": step, "rows": rows, "floors": floors, "floors_s": floor_s, "segment_scan": scan,
        "best_floor": best,
        "max_gap": max(gaps) if gaps else None, "min_gap": min(gaps) if gaps else None,
        "gap_rows": len(gaps),
        "both_reachable": sum(1 for r in rows if "peak_bytes" in r["heuristic"] and "peak_bytes" in r["optimal"]),
        "only_heuristic": [r["budget"] for r in rows if "peak_bytes" in r["heuristic"]
                           and "peak_bytes" not in r["optimal"]],
        "only_optimal": [r["budget"] for r in rows if "peak_bytes" in r["optimal"]
                         and "peak_bytes" not in r["heuristic"]],
        "lowest_reached": min(reached, key=lambda r: r["heuristic"]["peak_bytes"])["budget"] if reached else None,
    }


def _budgets(base: int, best: dict, scan: list[dict]) -> list[tuple[str, int]]:
    """(label, bytes) of the sweep, loosest first: the shares, the floor, the lowest segmentation floor."""
    budgets = [(f"{p} %", int(base * p / 100)) for p in SWEEP_PCTS]
    budgets.append((f"floor ({sig(100 * best['peak_bytes'] / base)} %)", best["peak_bytes"]))
    deepest = min(x["peak_bytes"] for x in scan) if scan else best["peak_bytes"]
    if deepest < best["peak_bytes"]:
        budgets.append((f"lowest segmentation floor ({sig(100 * deepest / base)} %)", deepest))
    budgets.sort(key=lambda b: -b[1])
    return budgets


def _compare_planners(a, label: str, limit: int, base: int, step: int, cost, intervals) -> dict:
    """The budget heuristic and the MILP at one budget, and the gap between their recompute FLOPs."""
    from ckpt_cli.planning.solver import optimal_plan
    from ckpt_cli.planning.strategies import budget_plan

    h = _run_planner(budget_plan, a, limit, cost, intervals)
    o = _run_planner(optimal_plan, a, limit, cost, intervals)
    for x in (h, o):
        if "recompute_flops" in x:
            x["share_of_step"] = x["recompute_flops"] / step if step else None
    gap = None
    if "recompute_flops" in h and "recompute_flops" in o and o["recompute_flops"] > 0:
        gap = h["recompute_flops"] / o["recompute_flops"] - 1
    return {"budget": label, "budget_bytes": limit, "budget_share": limit / base,
            "heuristic": h, "optimal": o, "gap": gap}


def _gpt_targets(d: dict | None) -> dict | None:
    """Lowest predicted peak the gpt sweep reaches, and the best reduction within each FLOPs limit."""
    if not d or "error" in d:
        return None
    base, resident = d["original_peak_bytes"], d["resident_bytes"]
    points = []
    for r in d["rows"]:
        for who in ("heuristic", "optimal"):
            x = r[who]
            if "peak_bytes" in x:
                points.append({"budget": r["budget"], "planner": who, "peak_bytes": x["peak_bytes"],
                               "reduction": 1 - x["peak_bytes"] / base,
                               "activation_reduction": 1 - (x["peak_bytes"] - resident) / (base - resident),
                               "share_of_step": x["share_of_step"]})
    if not points:
        return {"points": 0}
    lowest = min(points, key=lambda p: (p["peak_bytes"], p["share_of_step"]))
    targets = []
    for want, limit in GPT_TARGETS:
        within = [p for p in points if p["share_of_step"] is not None and p["share_of_step"] <= limit]
        top = max(within, key=lambda p: p["reduction"]) if within else None
        targets.append({"reduction_at_least": want, "share_at_most": limit, "best": top,
                        "met": bool(top and top["reduction"] >= want)})
    return {"original_peak_bytes": base, "resident_bytes": resident, "lowest": lowest, "targets": targets,
            "floor": d["best_floor"], "max_possible_reduction_without_resident": 1 - resident / base,
            "segment_scan": d.get("segment_scan"),
            "output_bytes": d.get("output_bytes"), "lower_bound_bytes": d.get("lower_bound_bytes"),
            "max_possible_reduction": 1 - d["lower_bound_bytes"] / base if d.get("lower_bound_bytes") else None}


# --------------------------------------------------------------------------- report


def render(pq: dict | None, add) -> None:
    """Sections 3 and 4, headings included, one line at a time through ``add``."""
    add("## 3. Plan quality")
    add("")
    if missing(pq, add):
        add("")
        return
    _render_intro(pq, add)
    _render_summary(pq, add)
    for s, d in pq["samples"].items():
        if "error" in d:
            continue
        _render_sample(s, d, add)
    _render_gpt_targets(pq, add)


def _render_intro(pq: dict, add) -> None:
    add("In process, on each sample: `budget_plan` (the `budget` heuristic behind `ckpt plan --budget`) and "
        "`optimal_plan` (`--auto optimal`, a mixed-integer program solved by HiGHS through highspy) over the same "
        "region structures (per layer, sqrt(n) and 2·sqrt(n) segments, and the two other segmentations into "
        "k = 2 .. 2·sqrt(n) pieces with the lowest floors that fit), both given the real cost model "
        "(`rewrite.select.plan_cost`: rewrite + liveness simulation) and `rewrite.select.keep_intervals`. Budgets are "
        "shares of the original predicted peak (parameters and feeds included), plus the **floor**: the "
        "lowest predicted peak the three standard structures reach with every stashed activation recomputed, "
        "and, where lower, the **lowest segmentation floor** of the scan (section 4).")
    add("")
    add("`optimal` is exact only for a *linear* memory model (keeping an activation adds its bytes over a "
        "fixed span of the floor plan's schedule; copy chains, buffer reuse and the written order changing with "
        "the keep set are ignored). Both planners run the same limit search (`ckpt_cli/planning/search.py`): "
        "the real cost model judges every keep set, the limit is tightened by each overshoot and loosened "
        "while room is left under the budget. They differ only in how a keep set is chosen for a limit "
        "(greedy fills against the MILP), so `optimal` is not guaranteed optimal under the real model and the "
        "heuristic can beat it (a negative gap). All peaks below are the real cost model's predictions. "
        "**gap** = heuristic recompute FLOPs / optimal recompute FLOPs − 1 (n/a when optimal recomputes "
        "nothing or either planner finds the budget unreachable). **share** = recompute FLOPs / (forward + "
        f"backward FLOPs). Issue target: the heuristic within {100 * pq['gap_target']:g} % of the optimum.")
    add("")


def _render_summary(pq: dict, add) -> None:
    add("| sample | nodes | original peak | floor (structure) | budgets with a gap | max gap | min gap "
        f"| max gap ≤ {100 * pq['gap_target']:g} % | reachable by one planner only |")
    add("|---|---|---|---|---|---|---|---|---|")
    for s, d in pq["samples"].items():
        if "error" in d:
            add(f"| {s} | {d['error']} | | | | | | | |")
            continue
        f = d["best_floor"]
        only = "; ".join(x for x in (
            ("heuristic: " + ", ".join(d["only_heuristic"])) if d["only_heuristic"] else "",
            ("optimal: " + ", ".join(d["only_optimal"])) if d["only_optimal"] else "") if x) or "none"
        within = "n/a (no reachable budget below 100 %)" if d["max_gap"] is None else \
            yes_no(d["max_gap"] <= pq["gap_target"])
        add(f"| {s} | {d['nodes']} | {nbytes(d['original_peak_bytes'])} | {nbytes(f['peak_bytes'])} "
            f"({pct(f['peak_bytes'] / d['original_peak_bytes'])}; {f['structure']}, {f['regions']} regions) "
            f"| {d['gap_rows']} of {len(d['rows'])} | {_gap(d['max_gap'])} | {_gap(d['min_gap'])} | {within} "
            f"| {only} |")
    add("")


def _render_sample(s: str, d: dict, add) -> None:
    add(f"### {s}.onnx (original predicted peak {nbytes(d['original_peak_bytes'])}, of which parameters + "
        f"feeds {nbytes(d['resident_bytes'])}; step {_flops(d['step_flops'])})")
    add("")
    add("| budget | bytes | heuristic peak | heuristic FLOPs | share | time | optimal peak | optimal FLOPs "
        "| share | time | gap |")
    add("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in d["rows"]:
        add(f"| {r['budget']} | {nbytes(r['budget_bytes'])} | {_planner_cells(r['heuristic'])} "
            f"| {_planner_cells(r['optimal'])} | {_gap(r['gap'])} |")
    add("")
    unreach = next((r["heuristic"]["unreachable"] for r in d["rows"] if "unreachable" in r["heuristic"]), None)
    if unreach:
        add(f"First unreachable budget, heuristic's message: `{unreach}`")
        add("")


def _render_gpt_targets(pq: dict, add) -> None:
    t = pq.get("gpt_targets")
    add("## 4. GPT targets")
    add("")
    if not t or not t.get("lowest"):
        add("No gpt sweep figures.")
        add("")
        return
    low = t["lowest"]
    base = t["original_peak_bytes"]
    add(f"From section 3's gpt sweep (original predicted peak {nbytes(base)}, parameters + feeds "
        f"{nbytes(t['resident_bytes'])} of it). Lowest predicted peak reached: **{nbytes(low['peak_bytes'])}**, "
        f"**{pct(low['reduction'])} lower** than the original ({pct(low['activation_reduction'])} lower counting "
        f"only bytes above the resident parameters and feeds), at budget {low['budget']} by the {low['planner']} "
        f"planner, recomputing **{pct(low['share_of_step'])}** of the step's FLOPs.")
    if t.get("lower_bound_bytes"):
        _render_lower_bound(t, add)
    add("")
    if t.get("segment_scan"):
        _render_segment_scan(t["segment_scan"], base, add)
    add("")
    add("| issue target | best reached within the FLOPs limit | met |")
    add("|---|---|---|")
    for x in t["targets"]:
        b = x["best"]
        got = "nothing reachable" if b is None else (
            f"{pct(b['reduction'])} lower ({nbytes(b['peak_bytes'])}) at {pct(b['share_of_step'])} "
            f"({b['planner']}, budget {b['budget']})")
        add(f"| ≥ {pct(x['reduction_at_least'])} lower at ≤ {pct(x['share_at_most'])} extra step FLOPs "
            f"| {got} | {yes_no(x['met'])} |")
    add("")
    _render_floor(t["floor"], add)
    _render_floors(pq, t["floor"], add)


def _render_lower_bound(t: dict, add) -> None:
    unreachable = [x for x in GPT_TARGETS if x[0] > t["max_possible_reduction"]]
    add("")
    add(f"No plan, at any recompute cost, goes below **{nbytes(t['lower_bound_bytes'])}** "
        f"(`analysis.lowest_peak`): the parameters and feeds ({nbytes(t['resident_bytes'])}) plus the "
        f"graph's outputs ({nbytes(t['output_bytes'])}: the loss and one gradient per parameter, which ORT holds "
        f"until the run ends, so all are live at its last step). The peak can fall by at most "
        f"**{pct(t['max_possible_reduction'])}**"
        + (", so " + " and ".join(f"the {pct(w)} target" for w, _ in unreachable) + " cannot be met by any "
           "planner." if unreachable else "."))


def _render_segment_scan(scan: list[dict], base: int, add) -> None:
    low_k = min(scan, key=lambda x: x["peak_bytes"])
    within = [x for x in scan if x["share_of_step"] is not None and x["share_of_step"] <= GPT_TARGETS[0][1]]
    add("")
    add(f"Single-level checkpointing, every segmentation of the forward pass into k = 2 .. {scan[-1]['segments']} "
        f"pieces (`sqrt_regions(a, k)`) with everything inside recomputed: the lowest floor is "
        f"**{nbytes(low_k['peak_bytes'])}** ({pct(1 - low_k['peak_bytes'] / base)} lower) at k = "
        f"{low_k['segments']}, recomputing {pct(low_k['share_of_step'])} of the step"
        + (f"; of those recomputing at most {pct(GPT_TARGETS[0][1])}, the lowest is "
           f"{nbytes(min(x['peak_bytes'] for x in within))} "
           f"({pct(1 - min(x['peak_bytes'] for x in within) / base)} lower)" if within else
           f"; none recomputes {pct(GPT_TARGETS[0][1])} or less")
        + ". The budget planner searches keep sets above these floors (keeping an activation can also "
        "move the written order, so it may land slightly below one).")
    add("")
    add("| k | " + " | ".join(str(x["segments"]) for x in scan) + " |")
    add("|---|" + "---|" * len(scan))
    add("| floor | " + " | ".join(nbytes(x["peak_bytes"]) for x in scan) + " |")
    add("| lower by | " + " | ".join(pct(1 - x["peak_bytes"] / base) for x in scan) + " |")
    add("| recompute | " + " | ".join(pct(x["share_of_step"]) for x in scan) + " |")


def _render_floor(f: dict, add) -> None:
    add(f"What dominates the floor: the best structure (`{f['structure']}`, {f['regions']} regions) rewritten with "
        "every stashed activation recomputed (`ckpt_cli.rewrite.rewrite(a, s)` for each s of "
        f"`planning.strategies.structures(a)`), peak {nbytes(f['peak_bytes'])}. The "
        f"{f['live_tensors']} tensors holding buffers live at that peak (`after.priority.live_at_peak`), by "
        "category: parameters + inputs = `after.priority.resident_bytes`; gradient outputs = graph outputs; "
        "recompute copies = made by ckpt's copies (node metadata `ckpt.recompute_of`); kept forward tensors = produced by a forward node; "
        "backward temporaries = the rest.")
    add("")
    add("| category | bytes | share of peak | largest tensors |")
    add("|---|---|---|---|")
    for k, v in f["categories"].items():
        big = ", ".join(f"`{x}`" for x in f["largest"].get(k, []))
        add(f"| {k} | {nbytes(v)} | {pct(v / f['peak_bytes'] if f['peak_bytes'] else None)} | {big} |")
    add(f"| total | {nbytes(f['categorised_bytes'])} | {pct(f['categorised_bytes'] / f['peak_bytes'])} | |")
    add("")


def _render_floors(pq: dict, f: dict, add) -> None:
    floors = (pq["samples"].get("gpt") or {}).get("floors") or []
    if len(floors) > 1:
        add("Floors of every structure (same categories):")
        add("")
        cats = list(f["categories"])
        add("| structure | regions | peak | recompute share | " + " | ".join(cats) + " |")
        add("|---|---|---|---|" + "---|" * len(cats))
        step = pq["samples"]["gpt"]["step_flops"]
        for x in floors:
            add(f"| {x['structure']} | {x['regions']} | {nbytes(x['peak_bytes'])} "
                f"| {pct(x['recompute_flops'] / step if step else None)} | "
                + " | ".join(nbytes(x["categories"][c]) for c in cats) + " |")
        add("")


def _flops(x: int | None) -> str:
    if x is None:
        return "n/a"
    for unit, scale in (("GFLOP", 1e9), ("MFLOP", 1e6), ("kFLOP", 1e3)):
        if abs(x) >= scale:
            return f"{sig(x / scale)} {unit}"
    return f"{int(x)} FLOP"


def _planner_cells(x: dict) -> str:
    if "unreachable" in x:
        return f"unreachable | | | {ms(x['time_s'])}"
    if "error" in x:
        return f"failed: `{x['error'][-120:]}` | | | {ms(x['time_s'])}"
    return (f"{nbytes(x['peak_bytes'])} | {_flops(x['recompute_flops'])} | {pct(x['share_of_step'])} "
            f"| {ms(x['time_s'])}")


def _gap(x: float | None) -> str:
    return "n/a" if x is None else f"{'+' if x > 0 else ''}{sig(100 * x, 2)} %"
