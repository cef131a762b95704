"""ckpt benchmarks: speed against the ONNX I/O floor, memory and overhead on the samples.

Run from the repository root (``make bench`` / ``make bench-quick``)::

    python -m bench.run            # full: 1k, 10k, 50k, 100k-node graphs + samples (< 15 min)
    python -m bench.run --quick    # 1k and 10k nodes, one repeat of the sample checks (< 2 min)

Writes ``bench/RESULTS.md`` (tables) and ``bench/results.json`` (every raw figure).

1. Speed: synthetic transformer training graphs (``ckpt_cli.synthetic``, 142*L+48 nodes).
   Every command is a fresh subprocess, timed by wall clock, with its peak RSS read by GNU
   time (``os.wait4`` when GNU time is missing). The floor is ``onnx.load`` + ``onnx.save``
   of the same file in a fresh interpreter. Commands of one size run interleaved, in a
   rotating order, repeat after repeat; the median is reported.
2. Memory: ``ckpt rewrite SAMPLE --check --json --runs 5`` per strategy; the check runs the
   original (ckpt settings and ORT default settings) and the rewritten graph on ORT CPU in
   child processes and reads the peaks from ORT's profiler.
3. Plan quality: placeholder until the exact solver exists.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import platform
import pstats
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "bench"
SAMPLES = ("mlp", "gpt", "cnn")
SIZES = (("1k", 7), ("10k", 70), ("50k", 352), ("100k", 704))
QUICK_SIZES = ("1k", "10k")
SLOW_REPEAT_S = 60.0  # 50k/100k: one repeat only when the first repeat takes longer than this
PROFILE_THRESHOLD_S = 120.0
COMMAND_TIMEOUT_S = 600.0
FLOOR_SNIPPET = "import sys, onnx; onnx.save(onnx.load(sys.argv[1]), sys.argv[2])"


# --------------------------------------------------------------------------- formatting


def sig(x: float | None, digits: int = 3) -> str:
    """``x`` with ``digits`` significant digits, never in exponent notation."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    if x == 0:
        return "0"
    mag = math.floor(math.log10(abs(x)))
    r = round(x, digits - 1 - mag)
    if r and math.floor(math.log10(abs(r))) > mag:  # 9.996 -> 10.0: one digit fewer after the point
        mag += 1
    return f"{r:.{max(0, digits - 1 - mag)}f}"


def secs(x: float | None) -> str:
    return "n/a" if x is None else f"{sig(x)} s"


def ms(x: float | None) -> str:
    return "n/a" if x is None else f"{sig(x * 1e3)} ms"


def ratio(x: float | None) -> str:
    return "n/a" if x is None else f"{sig(x)}×"


def nbytes(x: int | float | None) -> str:
    if x is None:
        return "n/a"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(x) >= scale:
            return f"{sig(x / scale)} {unit}"
    return f"{int(x)} B"


def pct(x: float | None) -> str:
    return "n/a" if x is None else f"{sig(100 * x, 2)} %"


def yes_no(x) -> str:
    return "n/a" if x is None else ("yes" if x else "**no**")


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- measuring


def ckpt_cmd() -> list[str]:
    exe = Path(sys.executable).with_name("ckpt")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "ckpt_cli.cli"]


def _gnu_time() -> str | None:
    """GNU time, if it works here: it forks the command from a small process, so the
    command's peak RSS is its own (a child forked or vforked straight from this
    benchmark inherits this process's high-water mark into ``ru_maxrss``)."""
    exe = shutil.which("time", path="/usr/bin:/bin:/usr/local/bin")
    if not exe:
        return None
    with tempfile.NamedTemporaryFile("r", suffix=".rss") as f:
        r = subprocess.run([exe, "-o", f.name, "-f", "%M", "true"], capture_output=True)
        try:
            ok = r.returncode == 0 and int(f.read().split()[-1]) > 0
        except (ValueError, IndexError):
            ok = False
    return exe if ok else None


GNU_TIME = _gnu_time()
RSS_METHOD = ("peak RSS of the command itself, from GNU time (`/usr/bin/time -f %M`)" if GNU_TIME else
              "peak RSS from `os.wait4` ru_maxrss (a floor of this benchmark process's own RSS at spawn "
              "time is included; GNU time was not found)")


def run_measured(cmd: list[str], stdout_path: Path | None = None, timeout: float = COMMAND_TIMEOUT_S) -> dict:
    """Run ``cmd`` once: wall time (spawn to reap) and peak RSS."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    rss_file = None
    full = list(cmd)
    if GNU_TIME:
        fd, rss_file = tempfile.mkstemp(suffix=".rss")
        os.close(fd)
        full = [GNU_TIME, "-o", rss_file, "-f", "%M", *cmd]
    with open(stdout_path or os.devnull, "wb") as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        p = subprocess.Popen(full, stdout=out, stderr=err, stdin=subprocess.DEVNULL, cwd=REPO, env=env,
                             start_new_session=True)
        reaped = threading.Event()
        killed = []

        def _kill():
            if not reaped.is_set():
                killed.append(True)
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

        timer = threading.Timer(timeout, _kill)
        timer.start()
        try:
            _, status, ru = os.wait4(p.pid, 0)
        finally:
            reaped.set()
            timer.cancel()
        wall = time.perf_counter() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        tail = err.read()[-3000:].decode(errors="replace")
    rss = None
    if rss_file:
        try:
            rss = int(Path(rss_file).read_text().split()[-1]) * 1024  # KiB
        except (OSError, ValueError, IndexError):
            rss = None
        Path(rss_file).unlink(missing_ok=True)
    else:
        rss = int(ru.ru_maxrss * (1 if sys.platform == "darwin" else 1024))  # bytes on macOS, KiB on Linux
    return {"wall_s": wall, "max_rss_bytes": rss, "rc": p.returncode,
            "timed_out": bool(killed), "stderr_tail": tail.strip()[-1500:] if p.returncode else ""}


# --------------------------------------------------------------------------- environment


def _versions() -> dict:
    out = {"python": platform.python_version()}
    for mod in ("onnx", "onnxruntime", "numpy"):
        try:
            out[mod] = __import__(mod).__version__
        except Exception as e:  # noqa: BLE001
            out[mod] = f"unavailable ({e})"
    try:
        import ckpt_cli

        out["ckpt"] = ckpt_cli.__version__
    except Exception as e:  # noqa: BLE001
        out["ckpt"] = f"unavailable ({e})"
    try:
        import onnxruntime

        out["ort_providers"] = onnxruntime.get_available_providers()
    except Exception:  # noqa: BLE001
        pass
    return out


def _meminfo_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _git() -> dict:
    def git(*a):
        r = subprocess.run(["git", *a], cwd=REPO, capture_output=True, text=True)
        return r.stdout.strip() if r.returncode == 0 else None

    commit = git("rev-parse", "--short", "HEAD")
    dirty = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": bool(dirty) if dirty is not None else None}


def machine_info() -> dict:
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    return {
        "machine": platform.machine(),  # = uname -m
        "system": f"{platform.system()} {platform.release()}",
        "cpu_model": _cpu_model(),
        "nproc": usable,
        "cpu_count": os.cpu_count(),
        "memory_bytes": _meminfo_bytes(),
        "date_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "versions": _versions(),
        "git": _git(),
    }


# --------------------------------------------------------------------------- 1. speed


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
        for marker in ("site-packages/", str(REPO) + "/"):
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


def bench_speed(sizes: list[tuple[str, int]], repeats: int, work: Path, profile: str) -> dict:
    from ckpt_cli.synthetic import save_transformer

    ckpt = ckpt_cmd()
    # warm the OS page cache and .pyc files once, so the first measured run is not special
    run_measured([sys.executable, "-c", "import onnx, onnxruntime, numpy, click, rich, scipy"])
    run_measured([*ckpt, "--version"])

    startup = {}
    for name, cmd in (("python -c 'import onnx'", [sys.executable, "-c", "import onnx"]),
                      ("ckpt --version", [*ckpt, "--version"])):
        rs = [run_measured(cmd) for _ in range(3)]
        startup[name] = {"wall_s": median(r["wall_s"] for r in rs),
                         "max_rss_bytes": median(r["max_rss_bytes"] for r in rs)}

    results = []
    ckpt_args: dict[str, dict[str, list[str]]] = {}
    for label, layers in sizes:
        src = work / f"synthetic_L{layers}.onnx"
        t0 = time.perf_counter()
        info = save_transformer(str(src), layers=layers)
        gen_s = time.perf_counter() - t0
        expect = 142 * layers + 48
        log(f"speed {label}: {info['nodes']} nodes, {nbytes(info['bytes'])} on disk")
        cmds = {
            "floor": [sys.executable, "-c", FLOOR_SNIPPET, str(src), str(work / "floor_out.onnx")],
            "inspect": [*ckpt, "inspect", str(src), "--json"],
            "rewrite": [*ckpt, "rewrite", str(src), "-o", str(work / f"synthetic_L{layers}.ckpt.onnx"),
                        "--force", "--json"],
        }
        ckpt_args[label] = {"inspect": cmds["inspect"][len(ckpt):], "rewrite": cmds["rewrite"][len(ckpt):]}
        runs: dict[str, list[dict]] = {k: [] for k in cmds}
        rewrite_json = None
        n_rep = repeats
        rep = 0
        while rep < n_rep:
            names = list(cmds)
            names = names[rep % len(names):] + names[:rep % len(names)]  # rotate the order
            for name in names:
                out = work / f"{name}.stdout" if name == "rewrite" else None
                r = run_measured(cmds[name], stdout_path=out)
                runs[name].append(r)
                if name == "rewrite" and r["rc"] == 0 and rewrite_json is None:
                    try:
                        rewrite_json = json.loads(out.read_text())
                    except (OSError, json.JSONDecodeError):
                        pass
                if r["rc"] != 0:
                    log(f"  {name} failed (exit {r['rc']}): {r['stderr_tail'][-300:]}")
            first = sum(runs[k][-1]["wall_s"] for k in cmds)
            if rep == 0 and label in ("50k", "100k") and first > SLOW_REPEAT_S:
                n_rep = 1
                log(f"  first repeat took {first:.0f} s > {SLOW_REPEAT_S:.0f} s: one repeat at this size")
            rep += 1
        row = {"size": label, "layers": layers, "nodes": info["nodes"], "nodes_expected": expect,
               "file_bytes": info["bytes"], "generate_s": gen_s, "repeats": n_rep, "commands": {}}
        floor = median(r["wall_s"] for r in runs["floor"])
        for name, rs in runs.items():
            ok = [r for r in rs if r["rc"] == 0]
            wall = median(r["wall_s"] for r in ok)
            row["commands"][name] = {
                "wall_s": wall,
                "wall_s_runs": [r["wall_s"] for r in rs],
                "max_rss_bytes": median(r["max_rss_bytes"] for r in ok),
                "ratio_to_floor": (wall / floor) if (wall is not None and floor) else None,
                "failures": [{"rc": r["rc"], "stderr": r["stderr_tail"]} for r in rs if r["rc"] != 0],
            }
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
        results.append(row)
        c = row["commands"]
        log(f"  floor {secs(c['floor']['wall_s'])}, inspect {secs(c['inspect']['wall_s'])} "
            f"({ratio(c['inspect']['ratio_to_floor'])}), rewrite {secs(c['rewrite']['wall_s'])} "
            f"({ratio(c['rewrite']['ratio_to_floor'])})")
    prof = None
    ckpt_walls = [(c["wall_s"], r["size"], name) for r in results for name, c in r["commands"].items()
                  if name != "floor" and c["wall_s"] is not None]
    over = [w for w in ckpt_walls if w[0] > PROFILE_THRESHOLD_S]
    if results and profile != "never" and (over or profile == "always"):
        last = results[-1]["size"]
        wall, size, name = max(w for w in ckpt_walls if w[1] == last)
        prof = _profile(ckpt_args[size][name], work, f"{size}_{name}")
        prof["reason"] = (f"a ckpt command took {max(over)[0]:.0f} s > {PROFILE_THRESHOLD_S:.0f} s" if over
                          else f"informational: {wall:.3g} s, under the {PROFILE_THRESHOLD_S:.0f} s threshold")
    return {"startup": startup, "sizes": results, "profile": prof,
            "method": "fresh subprocess per command; wall clock; median over repeats; commands of one size "
                      "interleaved in rotating order", "rss_method": RSS_METHOD}


# --------------------------------------------------------------------------- 2. memory


def _sample_analysis(path: Path, work: Path) -> dict:
    from ckpt_cli.analysis import analyse
    from ckpt_cli.load import load_graph
    from ckpt_cli.planning import layer_regions, sqrt_regions

    a = analyse(load_graph(path))
    names = [n.name for n in a.graph.nodes]
    sq = sqrt_regions(a)
    plan_path = work / f"{path.stem}.sqrt.plan.json"
    plan_path.write_text(json.dumps(sq.to_json(names), indent=1))
    layers = layer_regions(a)
    return {
        "nodes": len(a.graph.nodes),
        "predicted_ort_default_activation_peak": a.default.activation_peak_bytes,
        "predicted_ort_default_peak": a.default.peak_bytes,
        "predicted_file_order_activation_peak": a.priority.activation_peak_bytes,
        "predicted_file_order_peak": a.priority.peak_bytes,
        "resident_bytes": a.priority.resident_bytes,
        "sqrt_segments": len(sq.regions),
        "layer_regions": len(layers.regions) if layers else 0,
        "sqrt_plan": str(plan_path),
    }


def bench_memory(repeats: int, runs: int, work: Path) -> dict:
    ckpt = ckpt_cmd()
    out: dict = {"runs_per_check": runs, "repeats": repeats, "samples": {}}
    for s in SAMPLES:
        path = REPO / "sample_models" / f"{s}.onnx"
        if not path.exists():
            out["samples"][s] = {"error": f"{path} missing"}
            continue
        info = _sample_analysis(path, work)
        variants = [
            ("no_recompute", "reorder only (`--no-recompute`)", ["--no-recompute"]),
            ("per_layer", f"per layer (default; {info['layer_regions']} regions)", []),
            ("sqrt", f"sqrt(n) segments ({info['sqrt_segments']}, `--plan`)", ["--plan", info["sqrt_plan"]]),
        ]
        raw: dict[str, list[dict]] = {k: [] for k, _, _ in variants}
        for rep in range(repeats):
            for key, _, extra in variants:
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
                if rep_json is None or "check" not in rep_json:
                    log(f"  {s} {key}: no check report (exit {r['rc']}): {r['stderr_tail'][-300:]}")
                elif r["rc"] != 0:
                    log(f"  {s} {key}: exit {r['rc']} (check failed: outputs_equal="
                        f"{rep_json['check']['outputs_equal']}, memory_lower={rep_json['check']['memory_lower']})")
        log(f"memory {s}: {sum(len(v) for v in raw.values())} checks done")

        def checks(keys=None):
            return [x["report"]["check"] for k, xs in raw.items() if keys is None or k in keys
                    for x in xs if x["report"] and "check" in x["report"]]

        all_checks = checks()
        d_time = median(c["original_ort_default"]["time_s"] for c in all_checks if c["original_ort_default"])
        rows = [{
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
        for key, title, _ in variants:
            reps = [x["report"] for x in raw[key] if x["report"] and "check" in x["report"]]
            cs = [r["check"] for r in reps]
            if not cs:
                rows.append({"row": title, "error": (raw[key][-1]["stderr"] or "no report")[-500:]})
                continue
            rows.append({
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
                "exit_codes": [x["rc"] for x in raw[key]],
                "rewrite_check_wall_s": median(x["wall_s"] for x in raw[key]),
            })
        for pct_budget in (50, 30):
            rows.append({"row": f"budget {pct_budget} % of original peak", "not_implemented": True})
        out["samples"][s] = {"info": info, "rows": rows,
                             "provider": all_checks[0]["provider"] if all_checks else None}
    return out


# --------------------------------------------------------------------------- report


def render_md(res: dict) -> str:
    m = res["machine"]
    v = m["versions"]
    L: list[str] = []
    add = L.append
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
    add(f"| ORT providers | {', '.join(v.get('ort_providers', [])) or 'n/a'} |")
    add("")

    # 1 ------------------------------------------------------------------------------
    sp = res.get("speed")
    add("## 1. Speed against the I/O floor")
    add("")
    if sp is None:
        add("Skipped.")
    elif "error" in sp:
        add(f"Failed: `{sp['error']}`")
    else:
        add("Synthetic transformer training graphs from `ckpt_cli.synthetic` (d_model 64, seq 32, "
            "142·L+48 nodes, no embedded weights). Each command is a fresh subprocess; wall time, "
            "median of the repeats; commands of one size run interleaved. **floor** = "
            "`python -c 'onnx.save(onnx.load(F), OUT)'`; **inspect** = `ckpt inspect F --json > /dev/null`; "
            "**rewrite** = `ckpt rewrite F -o OUT --force --json` (default regions: one per layer). "
            f"Memory: {sp.get('rss_method', RSS_METHOD)}.")
        add("")
        add("| size | layers | nodes | file | repeats | floor | inspect | × floor | rewrite | × floor "
            "| `ckpt plan` |")
        add("|---|---|---|---|---|---|---|---|---|---|---|")
        for r in sp["sizes"]:
            c = r["commands"]
            add(f"| {r['size']} | {r['layers']} | {r['nodes']:,} | {nbytes(r['file_bytes'])} | {r['repeats']} "
                f"| {secs(c['floor']['wall_s'])} | {secs(c['inspect']['wall_s'])} "
                f"| {ratio(c['inspect']['ratio_to_floor'])} | {secs(c['rewrite']['wall_s'])} "
                f"| {ratio(c['rewrite']['ratio_to_floor'])} | not implemented yet |")
        add("")
        add("Peak RSS of each command:")
        add("")
        add("| size | floor | inspect | rewrite | `ckpt plan` |")
        add("|---|---|---|---|---|")
        for r in sp["sizes"]:
            c = r["commands"]
            add(f"| {r['size']} | {nbytes(c['floor']['max_rss_bytes'])} | {nbytes(c['inspect']['max_rss_bytes'])} "
                f"| {nbytes(c['rewrite']['max_rss_bytes'])} | not implemented yet |")
        add("")
        st = sp["startup"]
        add("Fixed start-up cost (median of 3): " + "; ".join(
            f"`{k}` {secs(x['wall_s'])}, {nbytes(x['max_rss_bytes'])} RSS" for k, x in st.items()) + ".")
        add("")
        rw = [r for r in sp["sizes"] if r.get("rewrite")]
        if rw:
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
        fails = [(r["size"], k, f) for r in sp["sizes"] for k, c in r["commands"].items() for f in c["failures"]]
        if fails:
            add("Failures:")
            add("")
            for size, k, f in fails:
                add(f"- {size} {k}: exit {f['rc']}: `{f['stderr'][-300:]}`")
            add("")
        prof = sp.get("profile")
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

    # 2 ------------------------------------------------------------------------------
    mem = res.get("memory")
    add("## 2. Memory and overhead on the sample models")
    add("")
    if mem is None:
        add("Skipped.")
    elif "error" in mem:
        add(f"Failed: `{mem['error']}`")
    else:
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
        add("")
        for s, d in mem["samples"].items():
            if "error" in d:
                add(f"### {s}: {d['error']}")
                continue
            i = d["info"]
            add(f"### {s}.onnx ({i['nodes']} nodes, resident parameters + feeds {nbytes(i['resident_bytes'])}, "
                f"provider {d['provider']})")
            add("")
            add("| row | predicted | measured in use | above baseline | measured tensors | step time "
                "| × ORT default | × original | recompute share | outputs identical | check |")
            add("|---|---|---|---|---|---|---|---|---|---|---|")
            for r in d["rows"]:
                if r.get("not_implemented"):
                    add(f"| {r['row']} | not implemented yet | | | | | | | | | |")
                    continue
                if "error" in r:
                    add(f"| {r['row']} | failed: `{r['error'][-200:]}` | | | | | | | | | |")
                    continue
                passed = r.get("check_passed")
                check = "n/a" if passed is None else ("pass" if passed else
                                                      f"**FAIL** (exit {max(r.get('exit_codes') or [0])}"
                                                      f"{', memory higher' if not r.get('memory_lower') else ''}"
                                                      f"{', order differs' if r.get('order_matches') is False else ''})")
                add(f"| {r['row']} | {nbytes(r['predicted_peak'])} | {nbytes(r['measured_peak'])} "
                    f"| {nbytes(r['measured_above_baseline'])} | {nbytes(r['measured_requested'])} "
                    f"| {ms(r['time_s'])} | {ratio(r['time_vs_ort_default'])} | {ratio(r['time_vs_original'])} "
                    f"| {pct(r['recompute_share_of_step'])} | {yes_no(r['outputs_identical'])} | {check} |")
            add("")

    # 3 ------------------------------------------------------------------------------
    add("## 3. Plan quality")
    add("")
    add("Not implemented yet: this section will compare the plans of `ckpt plan` (per-layer, sqrt(n), "
        "budget heuristics) with the exact solver's optimum (peak memory vs recompute FLOPs) once the "
        "solver exists.")
    add("")
    if res.get("notes"):
        add("## Notes")
        add("")
        for n in res["notes"]:
            add(f"- {n}")
        add("")
    return "\n".join(L)


def _notes(res: dict) -> list[str]:
    """Plain observations computed from the figures (no judgement beyond the numbers)."""
    notes = []
    mem = res.get("memory") or {}
    for s, d in (mem.get("samples") or {}).items():
        rows = {r["row"]: r for r in d.get("rows", [])}
        default = rows.get("original, ORT default settings")
        orig = rows.get("original, ckpt settings (file order)")
        for r in d.get("rows", []):
            if r.get("not_implemented") or "error" in r or r is default or r is orig:
                continue
            r = dict(r, row=r["row"].replace("`", ""))
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


def main(argv=None) -> int:
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
    ap.add_argument("--skip-speed", action="store_true")
    ap.add_argument("--skip-memory", action="store_true")
    ap.add_argument("--out-dir", type=Path, default=BENCH, help="where RESULTS.md and results.json go")
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory")
    a = ap.parse_args(argv)
    # full runs profile the slowest ckpt command at the largest size once (informational);
    # --quick profiles only a command over the threshold; --no-profile never does
    profile = a.profile or ("auto" if a.quick else "always")

    by_label = dict(SIZES)
    if a.sizes:
        labels = [s.strip() for s in a.sizes.split(",") if s.strip()]
        bad = [s for s in labels if s not in by_label]
        if bad:
            ap.error(f"unknown size {bad[0]} (choose from {', '.join(by_label)})")
    else:
        labels = list(QUICK_SIZES) if a.quick else list(by_label)
    sizes = [(s, by_label[s]) for s in labels]
    mem_repeats = a.memory_repeats or (1 if a.quick else 3)

    t0 = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="ckpt_bench_"))
    res: dict = {"command": " ".join(["python -m bench.run", *(argv if argv is not None else sys.argv[1:])]),
                 "quick": a.quick, "machine": machine_info()}
    log(f"scratch {work}; sizes {', '.join(labels)}; {a.repeats} repeats; memory repeats {mem_repeats}")
    try:
        if not a.skip_speed:
            try:
                res["speed"] = bench_speed(sizes, max(1, a.repeats), work, profile)
            except Exception as e:  # noqa: BLE001 - record and go on to the next section
                import traceback

                traceback.print_exc()
                res["speed"] = {"error": f"{type(e).__name__}: {e}"}
        if not a.skip_memory:
            try:
                res["memory"] = bench_memory(mem_repeats, a.runs, work)
            except Exception as e:  # noqa: BLE001
                import traceback

                traceback.print_exc()
                res["memory"] = {"error": f"{type(e).__name__}: {e}"}
    finally:
        if a.keep:
            log(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    res["plan_quality"] = {"not_implemented": True}
    res["total_s"] = time.perf_counter() - t0
    res["notes"] = _notes(res)
    a.out_dir.mkdir(parents=True, exist_ok=True)
    (a.out_dir / "results.json").write_text(json.dumps(res, indent=1, default=str) + "\n")
    (a.out_dir / "RESULTS.md").write_text(render_md(res) + "\n")
    log(f"wrote {a.out_dir / 'RESULTS.md'} and results.json in {res['total_s']:.0f} s")
    failed = [k for k in ("speed", "memory") if isinstance(res.get(k), dict) and "error" in res[k]]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
