"""Section 1 of ``python -m bench.run``: speed against the ONNX I/O floor.

Synthetic transformer training graphs (``bench.synthetic``, 142*L+48 nodes). Every command is
a fresh subprocess (``bench.common.run_measured``); commands of one size run interleaved, in a
rotating order, repeat after repeat, and the median is reported. ``render`` writes the
section's tables.
"""

from __future__ import annotations

import json
import pstats
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

from bench.common import (COMMAND_TIMEOUT_S, REPO, RSS_METHOD, ckpt_cmd, error_line, log, median, nbytes,
                          pct, ratio, run_measured, secs)

SIZES = (("1k", 7), ("10k", 70), ("50k", 352), ("100k", 704))
QUICK_SIZES = ("1k", "10k")
SLOW_REPEAT_S = 60.0  # 50k/100k: one repeat only when the first repeat takes longer than this
PROFILE_THRESHOLD_S = 120.0
PLAN_TIMEOUT_S = 300.0  # `ckpt plan` is stopped after this and recorded as timed out
PLAN_ONE_REPEAT = ("50k", "100k")  # `ckpt plan` runs once at these sizes (it is the slow command)
PLAN_OK_RCS = (0, 3)  # exit 3 = budget unreachable: a completed planning run
# Issue targets for planning time (nodes label -> seconds)
PLAN_TARGETS_S = {"10k": 2.0, "100k": 20.0}
# Planning-time targets of the default plan, the knee at every size (nodes label -> seconds)
DEFAULT_PLAN_TARGETS_S = {"100k": 15.0}
SPEED_PLAN_BUDGET = "50%"
SPEED_PLAN_REACHABLE = "65%"  # reachable on the synthetic graphs, and only with recompute (reordering alone reaches ~72%): times the whole search
FLOOR_SNIPPET = "import sys, onnx; onnx.save(onnx.load(sys.argv[1]), sys.argv[2])"
# The machine's pure-Python speed at the time, run with the floor: onnx's load and save are
# C++ and do not show it (on this project's shared machine it moves about 2x between hours).
PYTHON_LOOP_SNIPPET = "s = 0\nfor i in range(10_000_000):\n    s += i"


# --------------------------------------------------------------------------- measuring


def _profile(cmd_args: list[str], work: Path, label: str) -> dict:
    """Run one ckpt command under cProfile; top 8 functions by cumulative time."""
    prof = work / f"{label}.prof"
    cmd = [sys.executable, "-m", "cProfile", "-o", str(prof), "-m", "ckpt_cli.cli", *cmd_args]
    log(f"profiling {label}: {' '.join(cmd_args[:2])} ...")
    r = run_measured(cmd, timeout=COMMAND_TIMEOUT_S * 2)
    if r["rc"] != 0 or not prof.exists():
        return {"label": label, "error": r["stderr_tail"] or f"exit {r['rc']}", "wall_s": r["wall_s"]}
    st = pstats.Stats(str(prof))
    wrappers = ("runpy.py", "cProfile.py", "/click/", "<frozen ", "{built-in method builtins.exec}")
    rows = []
    for (fname, line, func), (cc, nc, tt, ct, _callers) in st.stats.items():  # type: ignore[attr-defined]
        where = f"{fname}:{line}"
        if any(w in fname for w in wrappers) or func in ("<module>",) or "builtins.exec" in func:
            continue
        short = fname
        for marker in ("site-packages/", str(REPO) + "/", sysconfig.get_paths()["stdlib"] + "/"):  # no machine paths
            if marker in short:
                short = short.split(marker, 1)[1]
        rows.append({"function": f"{short}:{line}({func})" if line else func, "ncalls": nc,
                     "tottime_s": tt, "cumtime_s": ct, "where": where})
    total = max((r["cumtime_s"] for r in rows), default=None)
    by_cum = sorted(rows, key=lambda r: -r["cumtime_s"])
    by_own = sorted(rows, key=lambda r: -r["tottime_s"])
    return {"label": label, "command": ["ckpt", *cmd_args], "wall_s": r["wall_s"], "profiled_total_s": total,
            "top_cumulative": [{k: v for k, v in x.items() if k != "where"} for x in by_cum[:8]],
            "top_own_time": [{k: v for k, v in x.items() if k != "where"} for x in by_own[:8]]}


SPEED_COMMANDS = ("floor", "inspect", "rewrite", "plan", "plan_reachable", "plan_default", "stages")
# the plan commands again, in process through bench/stages.py: where their time goes
STAGE_COMMANDS = ("stages_plan_default", "stages_plan", "stages_plan_reachable")
PLAN_COMMANDS = ("plan", "plan_reachable", "plan_default", *STAGE_COMMANDS)


def bench_speed(sizes: list[tuple[str, int]], repeats: int, work: Path, profile: str,
                commands: tuple[str, ...] = SPEED_COMMANDS) -> dict:
    from bench.synthetic import save_transformer

    ckpt = ckpt_cmd()
    startup = _startup(ckpt)
    results = []
    ckpt_args: dict[str, dict[str, list[str]]] = {}
    for label, layers in sizes:
        src = work / f"synthetic_L{layers}.onnx"
        t0 = time.perf_counter()
        info = save_transformer(str(src), layers=layers)
        gen_s = time.perf_counter() - t0
        log(f"speed {label}: {info['nodes']} nodes, {nbytes(info['bytes'])} on disk")
        cmds = _size_commands(ckpt, src, layers, work, commands)
        ckpt_args[label] = {k: v[len(ckpt):] for k, v in cmds.items()
                            if k not in ("floor", "python_loop", *STAGE_COMMANDS)}
        got: dict = {"runs": {k: [] for k in cmds}, "stages": {}, "rewrite_json": None, "plan_json": {}}
        n_rep = _run_size(label, cmds, repeats, work, got)
        row = _size_row(label, layers, info, gen_s, n_rep, got)
        results.append(row)
        c = row["commands"]
        log(f"  floor {secs(c['floor']['wall_s'])}, inspect {secs(c['inspect']['wall_s'])} "
            f"({ratio(c['inspect']['ratio_to_floor'])}), rewrite {secs(c['rewrite']['wall_s'])} "
            f"({ratio(c['rewrite']['ratio_to_floor'])}), plan {_plan_wall(c['plan'])} "
            f"({ratio(c['plan']['ratio_to_floor'])}), plan {SPEED_PLAN_REACHABLE} {_plan_wall(c['plan_reachable'])}")
    prof = _maybe_profile(results, ckpt_args, work, profile)
    return {"startup": startup, "sizes": results, "profile": prof,
            "method": "fresh subprocess per command; wall clock; median over repeats; commands of one size "
                      "interleaved in rotating order", "rss_method": RSS_METHOD}


def _startup(ckpt: list[str]) -> dict:
    """Byte-compile and warm up, then the fixed start-up cost (median of 3)."""
    # ckpt's modules byte-compiled, as a pip install leaves them (an environment with
    # PYTHONDONTWRITEBYTECODE would otherwise compile them in every run: 0.2 s a command)
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(REPO / "ckpt_cli")],
                   check=True, stdout=subprocess.DEVNULL)
    # warm the OS page cache once, so the first measured run is not special
    run_measured([sys.executable, "-c", "import onnx, onnxruntime, numpy, click, rich, highspy"])
    run_measured([*ckpt, "--version"])

    startup = {}
    for name, cmd in (("python -c 'import onnx'", [sys.executable, "-c", "import onnx"]),
                      ("ckpt --version", [*ckpt, "--version"])):
        rs = [run_measured(cmd) for _ in range(3)]
        startup[name] = {"wall_s": median(r["wall_s"] for r in rs),
                         "max_rss_bytes": median(r["max_rss_bytes"] for r in rs)}
    return startup


def _size_commands(ckpt: list[str], src: Path, layers: int, work: Path, commands: tuple[str, ...]) -> dict:
    """The command lines run at one size, those ``commands`` asks for."""
    cmds = {
        "floor": [sys.executable, "-c", FLOOR_SNIPPET, str(src), str(work / "floor_out.onnx")],
        "inspect": [*ckpt, "inspect", str(src), "--json"],
        "rewrite": [*ckpt, "rewrite", str(src), "-o", str(work / f"synthetic_L{layers}.ckpt.onnx"),
                    "--force", "--json"],
        "plan": [*ckpt, "plan", str(src), "--budget", SPEED_PLAN_BUDGET, "--json"],
        "plan_reachable": [*ckpt, "plan", str(src), "--budget", SPEED_PLAN_REACHABLE, "--json"],
        "plan_default": [*ckpt, "plan", str(src), "--json"],
    }
    for name in ("plan_default", "plan", "plan_reachable"):
        cmds[f"stages_{name}"] = [sys.executable, "-m", "bench.stages", *cmds[name][len(ckpt):]]
    cmds["python_loop"] = [sys.executable, "-c", PYTHON_LOOP_SNIPPET]
    return {k: v for k, v in cmds.items() if k in commands
            or (k == "python_loop" and ("floor" in commands or "stages" in commands))
            or (k in STAGE_COMMANDS and "stages" in commands)}


def _run_size(label: str, cmds: dict, repeats: int, work: Path, got: dict) -> int:
    """Run one size's commands interleaved, repeat after repeat, into ``got``; the repeats done."""
    runs = got["runs"]
    n_rep = repeats
    rep = 0
    while rep < n_rep:
        names = [k for k in cmds if k not in PLAN_COMMANDS or rep == 0 or label not in PLAN_ONE_REPEAT]
        names = names[rep % len(names):] + names[:rep % len(names)]  # rotate the order
        for name in names:
            _run_one(name, cmds[name], work, got)
        # the slow-size rule looks at the original three commands (plan runs once there anyway)
        first = sum(runs[k][-1]["wall_s"] for k in ("floor", "inspect", "rewrite") if k in runs)
        if rep == 0 and label in ("50k", "100k") and first > SLOW_REPEAT_S:
            n_rep = 1
            log(f"  first repeat took {first:.0f} s > {SLOW_REPEAT_S:.0f} s: one repeat at this size")
        rep += 1
    return n_rep


def _run_one(name: str, cmd: list[str], work: Path, got: dict) -> None:
    """Run one command once; keep what its JSON output says in ``got``."""
    out = work / f"{name}.stdout" if name in ("rewrite", *PLAN_COMMANDS) else None
    timeout = PLAN_TIMEOUT_S if name in PLAN_COMMANDS else COMMAND_TIMEOUT_S
    r = run_measured(cmd, stdout_path=out, timeout=timeout)
    got["runs"][name].append(r)
    if name == "rewrite" and r["rc"] == 0 and got["rewrite_json"] is None:
        try:
            got["rewrite_json"] = json.loads(out.read_text())
        except (OSError, json.JSONDecodeError):
            pass
    if name in STAGE_COMMANDS and not r["timed_out"] and r["rc"] == 0:
        try:
            got["stages"].setdefault(name, []).append(json.loads(out.read_text()))
        except (OSError, json.JSONDecodeError):
            pass
    elif name in PLAN_COMMANDS and name not in got["plan_json"] and not r["timed_out"] and r["rc"] in PLAN_OK_RCS:
        got["plan_json"][name] = _plan_summary(out, r)
    if r["timed_out"]:
        log(f"  {name} timed out after {r['wall_s']:.0f} s")
    elif r["rc"] != 0 and not (name in PLAN_COMMANDS and r["rc"] in PLAN_OK_RCS):
        log(f"  {name} failed (exit {r['rc']}): {r['stderr_tail'][-300:]}")


def _size_row(label: str, layers: int, info: dict, gen_s: float, n_rep: int, got: dict) -> dict:
    """One size's figures: each command's medians, the in-process stages, the rewrite's summary."""
    runs, stages = got["runs"], got["stages"]
    row = {"size": label, "layers": layers, "nodes": info["nodes"], "nodes_expected": 142 * layers + 48,
           "file_bytes": info["bytes"], "generate_s": gen_s, "repeats": n_rep, "commands": {}}
    floor = median(r["wall_s"] for r in runs.get("floor", []))
    for name, rs in runs.items():
        row["commands"][name] = _command_figures(name, rs, label, floor, got["plan_json"].get(name))
    row["stages"] = {name: _median_stages(runs_) for name, runs_ in stages.items()}
    if stages and runs.get("python_loop"):
        row["stages_python_loop_s"] = median(r["wall_s"] for r in runs["python_loop"])
    for name in SPEED_COMMANDS:  # left out by --commands: empty cells, same table
        row["commands"].setdefault(name, {"wall_s": None, "max_rss_bytes": None, "ratio_to_floor": None,
                                          "failures": [], "skipped": True})
    rewrite_json = got["rewrite_json"]
    if rewrite_json:
        row["rewrite"] = {
            "strategy": rewrite_json.get("strategy"),
            "regions": len(rewrite_json.get("regions") or []),
            "nodes_after": rewrite_json["after"]["nodes"],
            "recompute_nodes": rewrite_json.get("recompute_nodes"),
            "predicted_peak_before": rewrite_json["before"]["peak_bytes"],
            "predicted_peak_after": rewrite_json["after"]["peak_bytes"],
            "recompute_share_of_step": rewrite_json.get("recompute_share_of_step"),
        }
    return row


def _command_figures(name: str, rs: list[dict], label: str, floor: float | None, plan_json: dict | None) -> dict:
    """One command's runs at one size: median wall time and RSS, failures; the plan commands' extras."""
    oks = PLAN_OK_RCS if name in PLAN_COMMANDS else (0,)
    ok = [r for r in rs if r["rc"] in oks and not r["timed_out"]]
    wall = median(r["wall_s"] for r in ok)
    c = {
        "wall_s": wall,
        "wall_s_runs": [r["wall_s"] for r in rs],
        "max_rss_bytes": median(r["max_rss_bytes"] for r in ok),
        "ratio_to_floor": (wall / floor) if (wall is not None and floor) else None,
        "failures": [{"rc": r["rc"], "stderr": r["stderr_tail"]} for r in rs
                     if r["rc"] not in oks and not r["timed_out"]],
    }
    if name in PLAN_COMMANDS:
        targets = {**PLAN_TARGETS_S, **DEFAULT_PLAN_TARGETS_S} if name == "plan_default" else PLAN_TARGETS_S
        target = targets.get(label) if name not in STAGE_COMMANDS else None
        c.update({
            "repeats": len(rs),
            "exit_codes": [r["rc"] for r in rs],
            "timed_out": any(r["timed_out"] for r in rs),
            "timed_out_after_s": max((r["wall_s"] for r in rs if r["timed_out"]), default=None),
            "target_s": target,
            "target_met": (None if target is None else
                           (wall is not None and wall < target and not any(r["timed_out"] for r in rs))),
            "result": plan_json,
        })
    return c


def _maybe_profile(results: list[dict], ckpt_args: dict, work: Path, profile: str) -> dict | None:
    """Profile the slowest ckpt command at the largest size when one is over the threshold
    (``profile`` "auto"), always ("always") or never ("never")."""
    # plan_reachable is left out of profiling: it is the slowest by far and would double the bench
    ckpt_walls = [(c["wall_s"], r["size"], name) for r in results for name, c in r["commands"].items()
                  if name not in ("floor", "python_loop", "plan_reachable", "stages", *STAGE_COMMANDS)
                  and c["wall_s"] is not None]
    over = [w for w in ckpt_walls if w[0] > PROFILE_THRESHOLD_S]
    if not (results and profile != "never" and (over or profile == "always")):
        return None
    last = results[-1]["size"]
    wall, size, name = max(w for w in ckpt_walls if w[1] == last)
    prof = _profile(ckpt_args[size][name], work, f"{size}_{name}")
    prof["reason"] = (f"a ckpt command took {max(over)[0]:.0f} s > {PROFILE_THRESHOLD_S:.0f} s" if over
                      else f"informational: {wall:.3g} s, under the {PROFILE_THRESHOLD_S:.0f} s threshold")
    return prof


def _median_stages(runs: list[dict]) -> dict:
    """bench/stages.py's figures, each the median over the runs; the runs' exit codes."""
    keys = runs[0]["stages_s"].keys()
    return {"runs": len(runs), "rc": [r["rc"] for r in runs],
            "imports_s": median(r["imports_s"] for r in runs), "other_s": median(r["other_s"] for r in runs),
            "total_s": median(r["total_s"] for r in runs),
            "stages_s": {k: median(r["stages_s"][k] for r in runs) for k in keys}}


def _plan_summary(out: Path, r: dict) -> dict:
    """What one `ckpt plan --json` run said: its JSON figures (exit 0) or its error line (exit 3)."""
    if r["rc"] == 3:
        return {"rc": 3, "unreachable": error_line(r["stderr_tail"])}
    try:
        d = json.loads(out.read_text())
    except (OSError, json.JSONDecodeError):
        return {"rc": r["rc"], "error": "no JSON report"}
    keys = ("strategy", "budget_bytes", "peak_bytes_before", "peak_bytes_after", "recompute_flops",
            "recompute_share_of_step", "evaluations")
    return {"rc": r["rc"], **{k: d.get(k) for k in keys}, "knee_candidates": (d.get("knee") or {}).get("candidates")}


def _plan_wall(c: dict) -> str:
    if c.get("timed_out") and c.get("wall_s") is None:
        return f"timed out after {c['timed_out_after_s']:.0f} s"
    return secs(c.get("wall_s"))


# --------------------------------------------------------------------------- report


def render(sp: dict, add) -> None:
    """Section 1's text and tables (below its heading), one line at a time through ``add``."""
    _render_intro(sp, add)
    _render_times(sp, add)
    _render_rss(sp, add)
    _render_generate(sp, add)
    _render_plans(sp, add)
    _render_targets(sp, add)
    _render_stages(sp, add)
    st = sp["startup"]
    add("Fixed start-up cost (median of 3): " + "; ".join(
        f"`{k}` {secs(x['wall_s'])}, {nbytes(x['max_rss_bytes'])} RSS" for k, x in st.items()) + ".")
    add("")
    _render_rewrite(sp, add)
    _render_failures(sp, add)
    _render_profile(sp.get("profile"), add)


def _render_intro(sp: dict, add) -> None:
    add("Synthetic transformer training graphs from `bench.synthetic` (d_model 64, seq 32, "
        "142·L+48 nodes, no embedded weights). Each command is a fresh subprocess, ckpt's modules "
        "byte-compiled first as a pip install leaves them; wall time, "
        "median of the repeats; commands of one size run interleaved. **floor** = "
        "`python -c 'onnx.save(onnx.load(F), OUT)'`; **inspect** = `ckpt inspect F --json > /dev/null`; "
        "**rewrite** = `ckpt rewrite F -o OUT --force --json` (default regions: one per layer); "
        f"**plan** = `ckpt plan F --budget {SPEED_PLAN_BUDGET} --json` (exit 0 = planned, exit 3 = budget "
        "unreachable; both are completed runs, the exit code is shown). "
        f"`ckpt plan` runs once at {', '.join(PLAN_ONE_REPEAT)} nodes and is stopped after "
        f"{PLAN_TIMEOUT_S:.0f} s. Issue targets: planning under "
        + " and under ".join(f"{t:g} s at {k} nodes" for k, t in PLAN_TARGETS_S.items()) + ". "
        f"Memory: {sp.get('rss_method', RSS_METHOD)}.")
    add("")


def _render_times(sp: dict, add) -> None:
    add("| size | layers | nodes | file | repeats | floor | inspect | × floor | rewrite | × floor "
        f"| plan {SPEED_PLAN_BUDGET} | × floor | exit | target |")
    add("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in sp["sizes"]:
        c = r["commands"]
        pl = c.get("plan") or {}
        add(f"| {r['size']} | {r['layers']} | {r['nodes']:,} | {nbytes(r['file_bytes'])} | {r['repeats']} "
            f"| {secs(c['floor']['wall_s'])} | {secs(c['inspect']['wall_s'])} "
            f"| {ratio(c['inspect']['ratio_to_floor'])} | {secs(c['rewrite']['wall_s'])} "
            f"| {ratio(c['rewrite']['ratio_to_floor'])} | {_plan_cell(pl)} | {ratio(pl.get('ratio_to_floor'))} "
            f"| {_exit_codes(pl)} | {_target_cell(pl)} |")
    add("")


def _render_rss(sp: dict, add) -> None:
    add("Peak RSS of each command:")
    add("")
    add(f"| size | floor | inspect | rewrite | plan {SPEED_PLAN_BUDGET} | plan {SPEED_PLAN_REACHABLE} |")
    add("|---|---|---|---|---|---|")
    for r in sp["sizes"]:
        c = r["commands"]
        add(f"| {r['size']} | {nbytes(c['floor']['max_rss_bytes'])} | {nbytes(c['inspect']['max_rss_bytes'])} "
            f"| {nbytes(c['rewrite']['max_rss_bytes'])} | {nbytes((c.get('plan') or {}).get('max_rss_bytes'))} "
            f"| {nbytes((c.get('plan_reachable') or {}).get('max_rss_bytes'))} |")
    add("")


def _render_generate(sp: dict, add) -> None:
    add("Generating each synthetic graph (`save_transformer`: build and save, in this process, once):")
    add("")
    add("| size | nodes | generate |")
    add("|---|---|---|")
    for r in sp["sizes"]:
        add(f"| {r['size']} | {r['nodes']:,} | {secs(r.get('generate_s'))} |")
    add("")


def _render_plans(sp: dict, add) -> None:
    add(f"What `ckpt plan` did. At {SPEED_PLAN_BUDGET} the synthetic graphs' budget is unreachable, so the "
        "search stops after evaluating each structure's floor; "
        f"`ckpt plan F --budget {SPEED_PLAN_REACHABLE} --json` (reachable) times the whole search "
        "(same repeats and timeout):")
    add("")
    add(f"| size | plan {SPEED_PLAN_BUDGET}: result | plan {SPEED_PLAN_REACHABLE} | × floor | exit | target "
        "| predicted peak before → after | recompute share of step | evaluations |")
    add("|---|---|---|---|---|---|---|---|---|")
    for r in sp["sizes"]:
        c = r["commands"]
        pl, pr = c.get("plan") or {}, c.get("plan_reachable") or {}
        res50 = pl.get("result") or {}
        first = (f"unreachable: {res50['unreachable']}" if "unreachable" in res50 else
                 f"{nbytes(res50.get('peak_bytes_after'))} ({res50.get('evaluations')} evaluations)"
                 if res50.get("rc") == 0 else ("timed out" if pl.get("timed_out") else "n/a"))
        rr = pr.get("result") or {}
        after = (f"{nbytes(rr.get('peak_bytes_before'))} → {nbytes(rr.get('peak_bytes_after'))}"
                 if rr.get("rc") == 0 else (f"unreachable: {rr['unreachable']}" if "unreachable" in rr else "n/a"))
        add(f"| {r['size']} | {first} | {_plan_cell(pr)} | {ratio(pr.get('ratio_to_floor'))} | {_exit_codes(pr)} "
            f"| {_target_cell(pr)} | {after} | {pct(rr.get('recompute_share_of_step'))} "
            f"| {rr.get('evaluations', 'n/a')} |")
    add("")


def _render_targets(sp: dict, add) -> None:
    add("Planning time against the issue targets (the default plan, `ckpt plan F --json`, and the two "
        "`--budget` plans above; wall time of the whole command, load and report included). "
        "**Python loop**: `python -c` of 10⁷ integer additions, run interleaved with the commands, "
        "gives the machine's pure-Python speed in that window (ckpt's planning is Python; onnx's "
        "load and save, the floor, are C++):")
    add("")
    add(f"| size | nodes | Python loop | default plan | exit | target | --budget {SPEED_PLAN_BUDGET} | target "
        f"| --budget {SPEED_PLAN_REACHABLE} | target |")
    add("|---|---|---|---|---|---|---|---|---|---|")
    for r in sp["sizes"]:
        c = r["commands"]
        cells = [(c.get(k) or {}) for k in ("plan_default", "plan", "plan_reachable")]
        add(f"| {r['size']} | {r['nodes']:,} | {secs((c.get('python_loop') or {}).get('wall_s'))} "
            f"| {_plan_cell(cells[0])} | {_exit_codes(cells[0])} "
            f"| {_target_cell(cells[0])} | {_plan_cell(cells[1])} | {_target_cell(cells[1])} "
            f"| {_plan_cell(cells[2])} | {_target_cell(cells[2])} |")
    add("")
    _render_default_choice(sp, add)


def _render_default_choice(sp: dict, add) -> None:
    add("What the default plan chose: the knee of the plans it judged (every min-cut corner and the "
        "per-layer plan while their rewrites stay within `KNEE_JUDGED_NODES` nodes, else the corners "
        "nearest the knee of their estimated peaks):")
    add("")
    add("| size | strategy | predicted peak before → after | recompute share of step | plans judged |")
    add("|---|---|---|---|---|")
    for r in sp["sizes"]:
        d = (r["commands"].get("plan_default") or {}).get("result") or {}
        if d.get("rc") != 0:
            continue
        add(f"| {r['size']} | {d.get('strategy')} | {nbytes(d.get('peak_bytes_before'))} → "
            f"{nbytes(d.get('peak_bytes_after'))} | {pct(d.get('recompute_share_of_step'))} "
            f"| {d.get('knee_candidates', 'n/a')} |")
    add("")


def _render_stages(sp: dict, add) -> None:
    rows = [(r["size"], name, st) for r in sp["sizes"] for name, st in (r.get("stages") or {}).items()]
    if not rows:
        return
    names = {"stages_plan_default": "default plan", "stages_plan": f"--budget {SPEED_PLAN_BUDGET}",
             "stages_plan_reachable": f"--budget {SPEED_PLAN_REACHABLE}"}
    add("Where those commands' time goes (`python -m bench.stages plan F [--budget B] --json`: ckpt's CLI in "
        "one process, run interleaved with the rows above, its library stages timed where `ckpt_cli/api.py` "
        "calls them; median of the runs). **imports**: ckpt's, onnx and numpy with it; the interpreter's "
        "start-up before them is not counted. **load**: read, check, expand function ops. **planning**: the "
        "search and the chosen plan's written rewrite (pinned and analysed again). **other**: click, JSON "
        "output:")
    add("")
    add("| size | Python loop | command | runs | imports | load | analysis | planning | report | other | total "
        "| exit |")
    add("|---|---|---|---|---|---|---|---|---|---|---|---|")
    loops = {r["size"]: r.get("stages_python_loop_s") for r in sp["sizes"]}
    for size, name, st in rows:
        s = st["stages_s"]
        add(f"| {size} | {secs(loops.get(size))} | {names.get(name, name)} | {st['runs']} | {secs(st['imports_s'])} "
            f"| {secs(s['load'])} "
            f"| {secs(s['analysis'])} | **{secs(s['planning'])}** | {secs(s['report'])} | {secs(st['other_s'])} "
            f"| {secs(st['total_s'])} | {', '.join(map(str, sorted(set(st['rc']))))} |")
    add("")


def _render_rewrite(sp: dict, add) -> None:
    rw = [r for r in sp["sizes"] if r.get("rewrite")]
    if not rw:
        return
    add("What the rewrite did (from its JSON report):")
    add("")
    add("| size | strategy | regions | nodes before → after | recompute nodes | predicted peak before → after "
        "| recompute share of step |")
    add("|---|---|---|---|---|---|---|")
    for r in rw:
        w = r["rewrite"]
        add(f"| {r['size']} | {w['strategy']} | {w['regions']} | {r['nodes']:,} → {w['nodes_after']:,} "
            f"| {w['recompute_nodes']:,} | {nbytes(w['predicted_peak_before'])} → "
            f"{nbytes(w['predicted_peak_after'])} | {pct(w['recompute_share_of_step'])} |")
    add("")


def _render_failures(sp: dict, add) -> None:
    fails = [(r["size"], k, f) for r in sp["sizes"] for k, c in r["commands"].items() for f in c["failures"]]
    if not fails:
        return
    add("Failures:")
    add("")
    for size, k, f in fails:
        add(f"- {size} {k}: exit {f['rc']}: `{f['stderr'][-300:]}`")
    add("")


def _render_profile(prof: dict | None, add) -> None:
    add("### What dominates")
    add("")
    if not prof:
        add(f"No ckpt command took more than {PROFILE_THRESHOLD_S:.0f} s, so none was profiled "
            "(`python -m bench.run --profile` profiles the slowest one anyway; full runs do by default).")
    elif "error" in prof:
        add(f"Profiling `{prof['label']}` failed: `{prof['error'][-300:]}`")
    else:
        add(f"`{' '.join(prof['command'][:2])}` at the largest size, run once under "
            f"`python -m cProfile` ({prof['reason']}; {secs(prof['wall_s'])} with the profiler on). "
            "Top 8 by cumulative time (runpy/click/cProfile wrappers left out):")
        add("")
        add("| function | calls | cumulative | own |")
        add("|---|---|---|---|")
        for x in prof["top_cumulative"]:
            add(f"| `{x['function']}` | {x['ncalls']:,} | {secs(x['cumtime_s'])} | {secs(x['tottime_s'])} |")
        add("")
        add("Top 8 by own time:")
        add("")
        add("| function | calls | own | cumulative |")
        add("|---|---|---|---|")
        for x in prof["top_own_time"]:
            add(f"| `{x['function']}` | {x['ncalls']:,} | {secs(x['tottime_s'])} | {secs(x['cumtime_s'])} |")
    add("")


def _plan_cell(c: dict) -> str:
    if not c:
        return "n/a"
    if c.get("wall_s") is None and c.get("timed_out"):
        return f"timed out after {c['timed_out_after_s']:.0f} s"
    return secs(c.get("wall_s")) + (f" ({c['repeats']} run{'s' if c['repeats'] != 1 else ''})"
                                    if c.get("repeats") else "")


def _exit_codes(c: dict) -> str:
    codes = c.get("exit_codes") or []
    if not codes:
        return "n/a"
    shown = sorted(set(codes))
    return "/".join(("timeout" if x in (-9, 137) and c.get("timed_out") else str(x)) for x in shown)


def _target_cell(c: dict) -> str:
    t = c.get("target_s")
    if t is None:
        return ""
    return f"< {t:g} s: " + ("met" if c.get("target_met") else "**missed**")
