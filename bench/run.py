"""ckpt benchmarks: speed against the ONNX I/O floor, memory and overhead on the samples.

Run from the repository root (``make bench`` / ``make bench-quick``)::

    python -m bench.run            # full: 1k, 10k, 50k, 100k-node graphs + samples (< 15 min)
    python -m bench.run --quick    # 1k and 10k nodes, one repeat of the sample checks (< 2 min)

Writes ``bench/RESULTS.md`` (tables) and ``bench/results.json`` (every raw figure). This file
parses the arguments, runs the sections and puts the report together; each section's
measuring and its tables are in its own module, and what they share (paths, number
formatting, ``run_measured``, the machine description) is in ``bench/common.py``.

1. Speed (``bench/speed.py``): synthetic transformer training graphs (``bench.synthetic``,
   142*L+48 nodes). Every command is a fresh subprocess, timed by wall clock, with its peak RSS
   read by GNU time (``os.wait4`` when GNU time is missing). The floor is ``onnx.load`` +
   ``onnx.save`` of the same file in a fresh interpreter. Commands of one size run interleaved,
   in a rotating order, repeat after repeat; the median is reported.
2. Memory (``bench/memory.py``): ``ckpt rewrite SAMPLE --check --json --runs 5`` per strategy;
   the check runs the original (ckpt settings and ORT default settings) and the rewritten graph
   on ORT CPU in child processes and reads the peaks from ORT's profiler. Budget rows
   (``--budget 75%/50%/30%``) and ``--auto balanced`` too; an unreachable budget (exit 3)
   records ckpt's one-line error.
   Section 1 also times ``ckpt plan F --json`` (the default plan) and ``ckpt plan F --budget 50% --json``
   (and a reachable 65 %) against the issue targets (< 2 s at 10k nodes, < 20 s at 100k), stopped
   after 300 s, and the same three in process through ``bench/stages.py`` (``--commands stages``),
   timed per library stage. Only some rows: ``--sizes 10k,100k --commands plan_default,plan,plan_reachable
   --skip-memory --skip-big --skip-plan-quality --skip-peer --out-dir DIR``; ``--update`` merges
   the sections run into the committed ``results.json`` instead of writing them alone.
3. Plan quality (``bench/plan_quality.py``): in process, a sweep of budgets per sample, the
   ``budget`` heuristic against the ``optimal`` MILP (exact for the linear memory model,
   verified with the real cost model).
4. GPT targets (``bench/plan_quality.py``): from the gpt sweep, the lowest reachable peak and its
   recompute share, and what the bytes live at the floor's peak are.
5. Big weights (``bench/big_weights.py``): ckpt's time and peak RSS on a 1 B-parameter decoder with its
   weights as external data, and on one with 1 GB embedded in the .onnx file; the external
   one's rewrite (first write, and ``--force`` over that identical output) against ``cp`` +
   ``sync`` of its data file, median of 3.
6. Against PyTorch's min-cut partitioner (``bench/peer.py``): at PyTorch's activation bytes per
   ``activation_memory_budget`` (``bench/peer_pytorch.json``), ckpt's tensor-level cut, its
   recompute FLOPs, and its rewrite checked on ORT (measured peak, bit-identical outputs).
7. ``budget`` against ``optimal`` on every sample (``bench/agreement.py``), through ``make_plan``.
8. Install (``bench/install.py``, needs PyPI; not in --quick): the wheel's dependencies resolved for
   Linux x86_64, macOS arm64 and Windows AMD64, a fresh venv's size and ``ckpt --help``'s start time.
9. Data walk (``bench/data_walk.py``, static, in --quick too): following the model from the rewrite and
   inspect commands through every call it reaches, how often the walk returns to a module it left.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from bench import big_weights, data_walk, install, memory, native, plan_quality, speed
from bench.big_weights import bench_big_weights
from bench.common import BENCH, ckpt_cmd, log, machine_info, nbytes, secs
from bench.common import missing as _missing
from bench.memory import bench_memory
from bench.plan_quality import bench_plan_quality
from bench.speed import QUICK_SIZES, SIZES, SPEED_COMMANDS, bench_speed

__all__ = ["ckpt_cmd", "main", "render_md"]  # ckpt_cmd: bench/peer.py imports it from here


# --------------------------------------------------------------------------- report


def render_md(res: dict) -> str:
    L: list[str] = []
    add = L.append
    _render_header(res, add)
    sp = res.get("speed")
    add("## 1. Speed against the I/O floor")
    add("")
    if not _missing(sp, add):
        speed.render(sp, add)
    mem = res.get("memory")
    add("## 2. Memory and overhead on the sample models")
    add("")
    if not _missing(mem, add):
        memory.render(mem, add)
    plan_quality.render(res.get("plan_quality"), add)
    big_weights.render(res, add)
    add("## 6. Against PyTorch's min-cut partitioner")
    add("")
    if not _missing(res.get("peer"), add):
        from bench.peer import render as render_peer

        render_peer(res["peer"], add)
    add("## 7. `budget` against `optimal` on every sample")
    add("")
    if not _missing(res.get("agreement"), add):
        from bench.agreement import render as render_agreement

        render_agreement(res["agreement"], add)
    install.render(res.get("install"), add)
    native.render(res.get("native"), add)
    data_walk.render(res.get("data_walk"), add)
    if res.get("notes"):
        add("## Notes")
        add("")
        for n in res["notes"]:
            add(f"- {n}")
        add("")
    return "\n".join(L)


def _render_header(res: dict, add) -> None:
    """The title, the command and the machine table."""
    m = res["machine"]
    v = m["versions"]
    add("# ckpt benchmarks")
    add("")
    add(f"Generated by `{res['command']}` "
        f"on {m['date_utc']} in {secs(res['total_s'])}. Raw figures: `bench/results.json`.")
    add("")
    add("| machine | |")
    add("|---|---|")
    add(f"| `uname -m` | {m['machine']} ({m['system']}) |")
    add(f"| CPU | {m['cpu_model'] or 'n/a'}, nproc {m['nproc']} |")
    add(f"| memory | {nbytes(m['memory_bytes'])} |")
    add(f"| python / onnx / onnxruntime / numpy | {v['python']} / {v['onnx']} / {v['onnxruntime']} / {v['numpy']} |")
    add(f"| ckpt | {v['ckpt']} (git {m['git']['commit']}{', dirty tree' if m['git']['dirty'] else ''}) |")
    at: dict[str, list[str]] = {}
    for section, commit in (res.get("measured_at") or {}).items():
        at.setdefault(commit, []).append(section.replace("_", " "))
    if len(at) > 1:  # an --update: say which figures are from which commit
        add("| figures from | " + "; ".join(f"{', '.join(names)}: git {c}" for c, names in at.items()) + " |")
    add(f"| ORT providers | {', '.join(v.get('ort_providers', [])) or 'n/a'} |")
    add("")


def _measured_before(kept: dict) -> dict[str, str]:
    """Results written before sections recorded their commits: all from the last run's."""
    commit = kept.get("machine", {}).get("git", {}).get("commit", "?")
    out = {f"speed {s['size']}": commit for s in (kept.get("speed") or {}).get("sizes", [])}
    out.update({k: commit for k in ("memory", "big_weights", "embedded_weights", "plan_quality", "agreement", "peer")
                if kept.get(k)})
    return out


def _merge_speed(kept: dict, new: dict) -> dict:
    """``--update`` of section 1: the commands run now replace theirs, size by size; the
    other rows keep their committed figures."""
    sizes = {s["size"]: s for s in kept["sizes"]}
    for s in new.get("sizes", []):
        old = sizes.get(s["size"])
        ran = {name: c for name, c in s["commands"].items() if not c.get("skipped")}
        if "floor" not in ran:  # the loop ran for the in-process rows: not the window of the others
            ran.pop("python_loop", None)
        # the rewrite's summary row goes with its command
        summary = {"rewrite": s["rewrite"]} if "rewrite" in ran and s.get("rewrite") else {}
        if s.get("stages"):  # the in-process rows go with theirs, and their window's Python loop
            summary["stages"] = {**(old or {}).get("stages", {}), **s["stages"]}
            summary["stages_python_loop_s"] = s.get("stages_python_loop_s")
        sizes[s["size"]] = {**old, "commands": {**old["commands"], **ran}, **summary} if old else s
    order = [label for label, _ in SIZES]
    return {**kept, **{k: v for k, v in new.items() if k != "sizes" and v is not None},
            "sizes": sorted(sizes.values(), key=lambda s: order.index(s["size"]))}


def _agreement() -> dict:
    from bench.agreement import bench_agreement

    return bench_agreement()


def _peer(runs: int) -> dict:
    from bench.peer import bench_peer

    return bench_peer(runs=runs)


def _notes(res: dict) -> list[str]:
    """Plain observations computed from the figures (no judgement beyond the numbers)."""
    notes = []
    mem = res.get("memory") or {}
    for s, d in (mem.get("samples") or {}).items():
        rows = {r["row"]: r for r in d.get("rows", [])}
        default = rows.get("original, ORT default settings")
        orig = rows.get("original, ckpt settings (file order)")
        for r in d.get("rows", []):
            if r.get("not_implemented") or "error" in r or "unreachable" in r or r is default or r is orig:
                continue
            r = dict(r, row=r["row"].replace("`", ""))
            if r.get("measured_within_budget") is False:
                notes.append(f"{s}: `{r['row']}` measured in use + inputs ({nbytes(r['measured_plus_resident'])}) "
                             f"exceed the budget ({nbytes(r['budget_bytes'])}) although the predicted peak fits.")
            if r.get("check_passed") is False:
                notes.append(f"{s}: `{r['row']}` fails the check (exit codes {r.get('exit_codes')}): measured "
                             f"in-use peak {nbytes(r['measured_peak'])} vs original {nbytes(orig['measured_peak'])}"
                             f"; predicted {nbytes(r['predicted_peak'])} vs {nbytes(orig['predicted_peak'])}.")
            if default and default.get("measured_peak") and r.get("measured_peak") and \
                    r["measured_peak"] > default["measured_peak"]:
                notes.append(f"{s}: `{r['row']}` peaks higher ({nbytes(r['measured_peak'])}) than the original "
                             f"under plain ORT defaults ({nbytes(default['measured_peak'])}).")
            if orig and r.get("predicted_peak") and orig.get("predicted_peak") and \
                    r["predicted_peak"] > orig["predicted_peak"]:
                notes.append(f"{s}: `{r['row']}` has a higher *predicted* peak than the original "
                             f"({nbytes(r['predicted_peak'])} vs {nbytes(orig['predicted_peak'])}).")
    return notes


# --------------------------------------------------------------------------- main


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="1k and 10k nodes only, one repeat of the memory checks")
    ap.add_argument("--sizes", help="comma-separated subset of 1k,10k,50k,100k")
    ap.add_argument("--repeats", type=int, default=3, help="repeats per speed measurement (default 3)")
    ap.add_argument("--memory-repeats", type=int, help="repeats of each sample check (default 3, --quick 1)")
    ap.add_argument("--runs", type=int, default=5, help="measured ORT runs per check (default 5)")
    prof = ap.add_mutually_exclusive_group()
    prof.add_argument("--profile", dest="profile", action="store_const", const="always",
                      help="profile the slowest ckpt command at the largest size (default in full runs)")
    prof.add_argument("--no-profile", dest="profile", action="store_const", const="never")
    ap.add_argument("--commands", help=f"comma-separated subset of the speed rows: {','.join(SPEED_COMMANDS)} "
                    "(floor brings the Python loop that calibrates the window)")
    ap.add_argument("--skip-speed", action="store_true")
    ap.add_argument("--skip-memory", action="store_true")
    ap.add_argument("--skip-big", action="store_true", help="skip the big-weight models (a 1 B-parameter decoder's 4.25 GiB external, 1 GB embedded)")
    ap.add_argument("--skip-plan-quality", action="store_true")
    ap.add_argument("--skip-peer", action="store_true", help="skip the comparison with PyTorch's partitioner")
    ap.add_argument("--skip-agreement", action="store_true", help="skip budget against optimal on every sample")
    ap.add_argument("--skip-install", action="store_true", help="skip the install section (needs PyPI)")
    ap.add_argument("--skip-native", action="store_true", help="skip the compiled passes against plain Python")
    ap.add_argument("--out-dir", type=Path, default=BENCH, help="where RESULTS.md and results.json go")
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory")
    ap.add_argument("--update", action="store_true",
                    help="start from the committed results.json: sections skipped now keep their figures")
    return ap


def _sizes_and_commands(ap: argparse.ArgumentParser, a) -> tuple[list[str], list[tuple[str, int]], tuple[str, ...]]:
    """The size labels, (label, layers) and speed commands asked for; an unknown one is a usage error."""
    by_label = dict(SIZES)
    if a.sizes:
        labels = [s.strip() for s in a.sizes.split(",") if s.strip()]
        bad = [s for s in labels if s not in by_label]
        if bad:
            ap.error(f"unknown size {bad[0]} (choose from {', '.join(by_label)})")
    else:
        labels = list(QUICK_SIZES) if a.quick else list(by_label)
    sizes = [(s, by_label[s]) for s in labels]
    commands = SPEED_COMMANDS
    if a.commands:
        commands = tuple(c.strip() for c in a.commands.split(",") if c.strip())
        bad = [c for c in commands if c not in SPEED_COMMANDS]
        if bad:
            ap.error(f"unknown command {bad[0]} (choose from {', '.join(SPEED_COMMANDS)})")
    return labels, sizes, commands


def _start_from_kept(a, res: dict) -> tuple[dict, dict[str, str]]:
    """``--update``: the committed results.json under this run's, so the sections not run now keep
    their figures; and which commit each section's figures are from (speed: per size)."""
    if not (a.update and (a.out_dir / "results.json").exists()):
        return res, {}
    kept = json.loads((a.out_dir / "results.json").read_text())
    steps = kept.get("command", "").split("; then ")
    if steps[-1] != res["command"]:  # the same update again adds no step
        steps.append(res["command"])
    measured_at = kept.get("measured_at") or _measured_before(kept)
    return {**kept, **{k: v for k, v in res.items() if k != "command"}, "command": "; then ".join(steps)}, measured_at


def _run_section(res: dict, key: str, run_section, measured_at: dict[str, str], commit: str,
                 commands: tuple[str, ...], update: bool) -> None:
    """Run one section into ``res[key]``; a failure is recorded there and the run goes on."""
    try:
        before = res.get(key)
        res[key] = run_section()
        if key == "speed":
            # a subset of the commands (--commands) is named: the size's other rows keep their commit
            subset = "" if set(commands) >= set(SPEED_COMMANDS) else f" ({', '.join(commands)})"
            measured_at.update({f"speed {s['size']}{subset}": commit for s in res[key].get("sizes", [])})
        else:
            measured_at[key] = commit
        if key == "speed" and update and isinstance(before, dict) and "sizes" in before:
            res[key] = _merge_speed(before, res[key])
    except Exception as e:  # noqa: BLE001 - record it and go on to the next section
        import traceback

        traceback.print_exc()
        res[key] = {"error": f"{type(e).__name__}: {e}"}


def main(argv=None) -> int:
    ap = _parser()
    a = ap.parse_args(argv)
    # full runs profile the slowest ckpt command at the largest size once (informational);
    # --quick profiles only a command over the threshold; --no-profile never does
    profile = a.profile or ("auto" if a.quick else "always")
    labels, sizes, commands = _sizes_and_commands(ap, a)
    mem_repeats = a.memory_repeats or (1 if a.quick else 3)

    t0 = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="ckpt_bench_"))
    res: dict = {"command": " ".join(["python -m bench.run", *(argv if argv is not None else sys.argv[1:])]),
                 "quick": a.quick, "machine": machine_info()}
    log(f"scratch {work}; sizes {', '.join(labels)}; {a.repeats} repeats; memory repeats {mem_repeats}")
    sections = [
        ("speed", a.skip_speed, lambda: bench_speed(sizes, max(1, a.repeats), work, profile, commands)),
        ("memory", a.skip_memory, lambda: bench_memory(mem_repeats, a.runs, work)),
        ("big_weights", a.quick or a.skip_big, lambda: bench_big_weights(work)),
        ("embedded_weights", a.quick or a.skip_big, lambda: bench_big_weights(work, 1.0, external=False, layers=2)),
        ("plan_quality", a.skip_plan_quality, bench_plan_quality),
        ("agreement", a.skip_agreement, _agreement),
        ("peer", a.skip_peer, lambda: _peer(a.runs)),
        ("install", a.quick or a.skip_install, install.measure),
        ("native", a.quick or a.skip_native, native.measure),
        ("data_walk", False, data_walk.measure),
    ]
    res, measured_at = _start_from_kept(a, res)
    commit = res["machine"]["git"]["commit"] + ("+dirty" if res["machine"]["git"]["dirty"] else "")
    res["measured_at"] = measured_at
    try:
        for key, skip, run_section in sections:
            if not skip:
                _run_section(res, key, run_section, measured_at, commit, commands, a.update)
    finally:
        if a.keep:
            log(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    res["total_s"] = time.perf_counter() - t0
    res["notes"] = _notes(res)
    a.out_dir.mkdir(parents=True, exist_ok=True)
    (a.out_dir / "results.json").write_text(json.dumps(res, indent=1, default=str) + "\n")
    (a.out_dir / "RESULTS.md").write_text(render_md(res) + "\n")
    log(f"wrote {a.out_dir / 'RESULTS.md'} and results.json in {res['total_s']:.0f} s")
    failed = [k for k in ("speed", "memory", "plan_quality") if isinstance(res.get(k), dict) and "error" in res[k]]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
