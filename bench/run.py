"""ckpt benchmarks: speed against the ONNX I/O floor, memory and overhead on the samples.

Run from the repository root (``make bench`` / ``make bench-quick``)::

    python -m bench.run            # full: 1k, 10k, 50k, 100k-node graphs + samples (< 15 min)
    python -m bench.run --quick    # 1k and 10k nodes, one repeat of the sample checks (< 2 min)

Writes ``bench/RESULTS.md`` (tables) and ``bench/results.json`` (every raw figure).

1. Speed: synthetic transformer training graphs (``bench.synthetic``, 142*L+48 nodes).
   Every command is a fresh subprocess, timed by wall clock, with its peak RSS read by GNU
   time (``os.wait4`` when GNU time is missing). The floor is ``onnx.load`` + ``onnx.save``
   of the same file in a fresh interpreter. Commands of one size run interleaved, in a
   rotating order, repeat after repeat; the median is reported.
2. Memory: ``ckpt rewrite SAMPLE --check --json --runs 5`` per strategy; the check runs the
   original (ckpt settings and ORT default settings) and the rewritten graph on ORT CPU in
   child processes and reads the peaks from ORT's profiler. Budget rows (``--budget 75%/50%/30%``)
   and ``--auto balanced`` too; an unreachable budget (exit 3) records ckpt's one-line error.
   Section 1 also times ``ckpt plan F --json`` (the default plan) and ``ckpt plan F --budget 50% --json``
   (and a reachable 65 %) against the issue targets (< 2 s at 10k nodes, < 20 s at 100k), stopped
   after 300 s, and the same three in process through ``bench/stages.py`` (``--commands stages``),
   timed per library stage. Only some rows: ``--sizes 10k,100k --commands plan_default,plan,plan_reachable
   --skip-memory --skip-big --skip-plan-quality --skip-peer --out-dir DIR``; ``--update`` merges
   the sections run into the committed ``results.json`` instead of writing them alone.
3. Plan quality: in process, a sweep of budgets per sample, the ``budget`` heuristic against the
   ``optimal`` MILP (exact for the linear memory model, verified with the real cost model).
4. GPT targets: from the gpt sweep, the lowest reachable peak and its recompute share, and what
   the bytes live at the floor's peak are.
7. ``budget`` against ``optimal`` on every sample (``bench/agreement.py``), through ``make_plan``.
6. Against PyTorch's min-cut partitioner (``bench/peer.py``): at PyTorch's activation bytes per
   ``activation_memory_budget`` (``bench/peer_pytorch.json``), ckpt's tensor-level cut, its
   recompute FLOPs, and its rewrite checked on ORT (measured peak, bit-identical outputs).
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
import sysconfig
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
PLAN_TIMEOUT_S = 300.0  # `ckpt plan` is stopped after this and recorded as timed out
PLAN_ONE_REPEAT = ("50k", "100k")  # `ckpt plan` runs once at these sizes (it is the slow command)
PLAN_OK_RCS = (0, 3)  # exit 3 = budget unreachable: a completed planning run
# Issue targets for planning time (nodes label -> seconds)
PLAN_TARGETS_S = {"10k": 2.0, "100k": 20.0}
SPEED_PLAN_BUDGET = "50%"
SPEED_PLAN_REACHABLE = "65%"  # reachable on the synthetic graphs, and only with recompute (reordering alone reaches ~72%): times the whole search
FLOOR_SNIPPET = "import sys, onnx; onnx.save(onnx.load(sys.argv[1]), sys.argv[2])"
# The machine's pure-Python speed at the time, run with the floor: onnx's load and save are
# C++ and do not show it (on this project's shared machine it moves about 2x between hours).
PYTHON_LOOP_SNIPPET = "s = 0\nfor i in range(10_000_000):\n    s += i"


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
    # the bench's own results change no figure: an --update after a run is still a clean tree
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", ".",
                ":(exclude)bench/RESULTS.md", ":(exclude)bench/results.json")
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
    # ckpt's modules byte-compiled, as a pip install leaves them (an environment with
    # PYTHONDONTWRITEBYTECODE would otherwise compile them in every run: 0.2 s a command)
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(REPO / "ckpt_cli")],
                   check=True, stdout=subprocess.DEVNULL)
    # warm the OS page cache once, so the first measured run is not special
    run_measured([sys.executable, "-c", "import onnx, onnxruntime, numpy, click, rich, highspy; from ortools.graph.python import max_flow"])
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
            "plan": [*ckpt, "plan", str(src), "--budget", SPEED_PLAN_BUDGET, "--json"],
            "plan_reachable": [*ckpt, "plan", str(src), "--budget", SPEED_PLAN_REACHABLE, "--json"],
            "plan_default": [*ckpt, "plan", str(src), "--json"],
        }
        for name in ("plan_default", "plan", "plan_reachable"):
            cmds[f"stages_{name}"] = [sys.executable, "-m", "bench.stages", *cmds[name][len(ckpt):]]
        cmds["python_loop"] = [sys.executable, "-c", PYTHON_LOOP_SNIPPET]
        cmds = {k: v for k, v in cmds.items() if k in commands
                or (k == "python_loop" and ("floor" in commands or "stages" in commands))
                or (k in STAGE_COMMANDS and "stages" in commands)}
        plan_names = PLAN_COMMANDS
        ckpt_args[label] = {k: v[len(ckpt):] for k, v in cmds.items()
                            if k not in ("floor", "python_loop", *STAGE_COMMANDS)}
        stages: dict[str, list[dict]] = {}
        runs: dict[str, list[dict]] = {k: [] for k in cmds}
        rewrite_json = None
        plan_json: dict[str, dict] = {}
        n_rep = repeats
        rep = 0
        while rep < n_rep:
            names = [k for k in cmds if k not in plan_names or rep == 0 or label not in PLAN_ONE_REPEAT]
            names = names[rep % len(names):] + names[:rep % len(names)]  # rotate the order
            for name in names:
                out = work / f"{name}.stdout" if name in ("rewrite", *plan_names) else None
                timeout = PLAN_TIMEOUT_S if name in plan_names else COMMAND_TIMEOUT_S
                r = run_measured(cmds[name], stdout_path=out, timeout=timeout)
                runs[name].append(r)
                if name == "rewrite" and r["rc"] == 0 and rewrite_json is None:
                    try:
                        rewrite_json = json.loads(out.read_text())
                    except (OSError, json.JSONDecodeError):
                        pass
                if name in STAGE_COMMANDS and not r["timed_out"] and r["rc"] == 0:
                    try:
                        stages.setdefault(name, []).append(json.loads(out.read_text()))
                    except (OSError, json.JSONDecodeError):
                        pass
                elif name in plan_names and name not in plan_json and not r["timed_out"] and r["rc"] in PLAN_OK_RCS:
                    plan_json[name] = _plan_summary(out, r)
                if r["timed_out"]:
                    log(f"  {name} timed out after {r['wall_s']:.0f} s")
                elif r["rc"] != 0 and not (name in plan_names and r["rc"] in PLAN_OK_RCS):
                    log(f"  {name} failed (exit {r['rc']}): {r['stderr_tail'][-300:]}")
            # the slow-size rule looks at the original three commands (plan runs once there anyway)
            first = sum(runs[k][-1]["wall_s"] for k in ("floor", "inspect", "rewrite") if k in runs)
            if rep == 0 and label in ("50k", "100k") and first > SLOW_REPEAT_S:
                n_rep = 1
                log(f"  first repeat took {first:.0f} s > {SLOW_REPEAT_S:.0f} s: one repeat at this size")
            rep += 1
        row = {"size": label, "layers": layers, "nodes": info["nodes"], "nodes_expected": expect,
               "file_bytes": info["bytes"], "generate_s": gen_s, "repeats": n_rep, "commands": {}}
        floor = median(r["wall_s"] for r in runs.get("floor", []))
        for name, rs in runs.items():
            oks = PLAN_OK_RCS if name in plan_names else (0,)
            ok = [r for r in rs if r["rc"] in oks and not r["timed_out"]]
            wall = median(r["wall_s"] for r in ok)
            row["commands"][name] = {
                "wall_s": wall,
                "wall_s_runs": [r["wall_s"] for r in rs],
                "max_rss_bytes": median(r["max_rss_bytes"] for r in ok),
                "ratio_to_floor": (wall / floor) if (wall is not None and floor) else None,
                "failures": [{"rc": r["rc"], "stderr": r["stderr_tail"]} for r in rs
                             if r["rc"] not in oks and not r["timed_out"]],
            }
            if name in plan_names:
                target = PLAN_TARGETS_S.get(label) if name not in STAGE_COMMANDS else None
                row["commands"][name].update({
                    "repeats": len(rs),
                    "exit_codes": [r["rc"] for r in rs],
                    "timed_out": any(r["timed_out"] for r in rs),
                    "timed_out_after_s": max((r["wall_s"] for r in rs if r["timed_out"]), default=None),
                    "target_s": target,
                    "target_met": (None if target is None else
                                   (wall is not None and wall < target and not any(r["timed_out"] for r in rs))),
                    "result": plan_json.get(name),
                })
        row["stages"] = {name: _median_stages(runs_) for name, runs_ in stages.items()}
        if stages and runs.get("python_loop"):
            row["stages_python_loop_s"] = median(r["wall_s"] for r in runs["python_loop"])
        for name in SPEED_COMMANDS:  # left out by --commands: empty cells, same table
            row["commands"].setdefault(name, {"wall_s": None, "max_rss_bytes": None, "ratio_to_floor": None,
                                              "failures": [], "skipped": True})
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
            f"({ratio(c['rewrite']['ratio_to_floor'])}), plan {_plan_wall(c['plan'])} "
            f"({ratio(c['plan']['ratio_to_floor'])}), plan {SPEED_PLAN_REACHABLE} {_plan_wall(c['plan_reachable'])}")
    prof = None
    # plan_reachable is left out of profiling: it is the slowest by far and would double the bench
    ckpt_walls = [(c["wall_s"], r["size"], name) for r in results for name, c in r["commands"].items()
                  if name not in ("floor", "python_loop", "plan_reachable", "stages", *STAGE_COMMANDS)
                  and c["wall_s"] is not None]
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
        return {"rc": 3, "unreachable": _error_line(r["stderr_tail"])}
    try:
        d = json.loads(out.read_text())
    except (OSError, json.JSONDecodeError):
        return {"rc": r["rc"], "error": "no JSON report"}
    keys = ("strategy", "budget_bytes", "peak_bytes_before", "peak_bytes_after", "recompute_flops",
            "recompute_share_of_step", "evaluations")
    return {"rc": r["rc"], **{k: d.get(k) for k in keys}}


def _error_line(stderr: str) -> str:
    """The one-line `ckpt: error: ...` message of a failed command, without its prefix."""
    lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
    for ln in reversed(lines):
        if ln.startswith("ckpt: error: "):
            return ln[len("ckpt: error: "):]
    return lines[-1] if lines else ""


def _plan_wall(c: dict) -> str:
    if c.get("timed_out") and c.get("wall_s") is None:
        return f"timed out after {c['timed_out_after_s']:.0f} s"
    return secs(c.get("wall_s"))


# --------------------------------------------------------------------------- 2. memory


def _sample_analysis(path: Path, work: Path) -> dict:
    from ckpt_cli.analysis import analyse
    from ckpt_cli.io.load import load_graph
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


MEMORY_BUDGETS = (75, 50, 30)  # % of the original predicted peak (parameters and feeds included)


def _budget_of(key: str, info: dict) -> int | None:
    """The byte budget ckpt derives from ``--budget N%`` (int(peak * share), as parse_budget does)."""
    if not key.startswith("budget"):
        return None
    return int(info["predicted_file_order_peak"] * int(key[len("budget"):]) / 100)


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
            ("balanced", "balanced (`--auto balanced`)", ["--auto", "balanced"]),
            *[(f"budget{b}", f"budget {b} % of original peak (`--budget {b}%`)", ["--budget", f"{b}%"])
              for b in MEMORY_BUDGETS],
        ]
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
            if raw[key] and raw[key][-1]["rc"] == 3:
                rows.append({"row": title, "unreachable": _error_line(raw[key][-1]["stderr"]),
                             "budget_bytes": _budget_of(key, info), "exit_codes": [x["rc"] for x in raw[key]]})
                continue
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
            planning = [r.get("planning") or {} for r in reps]
            if key.startswith("budget"):
                # resident (parameters + feeds) = predicted peak with resident - predicted tensor peak
                resident = median(r["after"]["peak_bytes"] - r["check"]["predicted"]["rewritten"] for r in reps)
                budget = median(p.get("budget_bytes") for p in planning)
                measured = rows[-1]["measured_requested"]
                rows[-1].update({
                    "budget_bytes": budget, "resident_bytes": resident,
                    "predicted_peak_within_budget": all(p.get("budget_met") for p in planning),
                    "measured_plus_resident": (measured + resident) if measured is not None else None,
                    "measured_within_budget": (measured + resident <= budget
                                               if None not in (measured, resident, budget) else None),
                    "planning_evaluations": median(p.get("evaluations") for p in planning),
                })
        out["samples"][s] = {"info": info, "rows": rows,
                             "provider": all_checks[0]["provider"] if all_checks else None}
    return out


# --------------------------------------------------------------------------- 3. plan quality

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
    from ckpt_cli.rewrite import rewrite

    r = rewrite(a, structure)
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
    from ckpt_cli.rewrite.select import keep_intervals, plan_cost
    from ckpt_cli.planning.solver import optimal_plan
    from ckpt_cli.planning.strategies import budget_plan, structures

    out: dict = {"sweep_pcts": list(SWEEP_PCTS), "gap_target": GAP_TARGET, "samples": {}}
    for s in SAMPLES:
        path = REPO / "sample_models" / f"{s}.onnx"
        if not path.exists():
            out["samples"][s] = {"error": f"{path} missing"}
            continue
        a = analyse(load_graph(path))
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
        budgets = [(f"{p} %", int(base * p / 100)) for p in SWEEP_PCTS]
        budgets.append((f"floor ({sig(100 * best['peak_bytes'] / base)} %)", best["peak_bytes"]))
        scan = _segment_scan(a)
        deepest = min(x["peak_bytes"] for x in scan) if scan else best["peak_bytes"]
        if deepest < best["peak_bytes"]:
            budgets.append((f"lowest segmentation floor ({sig(100 * deepest / base)} %)", deepest))
        budgets.sort(key=lambda b: -b[1])
        rows = []
        for label, limit in budgets:
            h = _run_planner(budget_plan, a, limit, cost, intervals)
            o = _run_planner(optimal_plan, a, limit, cost, intervals)
            for x in (h, o):
                if "recompute_flops" in x:
                    x["share_of_step"] = x["recompute_flops"] / step if step else None
            gap = None
            if "recompute_flops" in h and "recompute_flops" in o and o["recompute_flops"] > 0:
                gap = h["recompute_flops"] / o["recompute_flops"] - 1
            rows.append({"budget": label, "budget_bytes": limit, "budget_share": limit / base,
                         "heuristic": h, "optimal": o, "gap": gap})
        gaps = [r["gap"] for r in rows if r["gap"] is not None]
        reached = [r for r in rows if "peak_bytes" in r["heuristic"]]
        out["samples"][s] = {
            "nodes": len(a.graph.nodes), "original_peak_bytes": base, "resident_bytes": a.priority.resident_bytes,
            "output_bytes": a.output_bytes, "lower_bound_bytes": a.lower_bound_bytes,
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
        log(f"plan quality {s}: {len(rows)} budgets, max gap {pct(out['samples'][s]['max_gap'])}, "
            f"floor {nbytes(best['peak_bytes'])} of {nbytes(base)}")
    out["gpt_targets"] = _gpt_targets(out["samples"].get("gpt"))
    return out


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
    at: dict[str, list[str]] = {}
    for section, commit in (res.get("measured_at") or {}).items():
        at.setdefault(commit, []).append(section.replace("_", " "))
    if len(at) > 1:  # an --update: say which figures are from which commit
        add("| figures from | " + "; ".join(f"{', '.join(names)}: git {c}" for c, names in at.items()) + " |")
    add(f"| ORT providers | {', '.join(v.get('ort_providers', [])) or 'n/a'} |")
    add("")

    # 1 ------------------------------------------------------------------------------
    sp = res.get("speed")
    add("## 1. Speed against the I/O floor")
    add("")
    if not _missing(sp, add):
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
        add("Generating each synthetic graph (`save_transformer`: build and save, in this process, once):")
        add("")
        add("| size | nodes | generate |")
        add("|---|---|---|")
        for r in sp["sizes"]:
            add(f"| {r['size']} | {r['nodes']:,} | {secs(r.get('generate_s'))} |")
        add("")
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
        _render_stages(sp, add)
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
    if not _missing(mem, add):
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
        add("- **budget** rows: `--budget N%` is N % of the original's predicted peak *including* parameters and "
            "feeds (resident bytes). **fits budget**: measured tensors + resident ≤ budget, where resident = "
            "the report's `after.peak_bytes` − `check.predicted.rewritten`. An unreachable budget (exit 3) shows "
            "ckpt's one-line error, which names the lowest reachable predicted peak.")
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
                "| × ORT default | × original | recompute share | outputs identical | check | budget "
                "| fits budget (tensors + resident) |")
            add("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
            for r in d["rows"]:
                if r.get("not_implemented"):
                    add(f"| {r['row']} | not implemented yet | | | | | | | | | | | |")
                    continue
                if "unreachable" in r:
                    add(f"| {r['row']} | unreachable: {r['unreachable']} | | | | | | | | | "
                        f"| {nbytes(r.get('budget_bytes'))} | n/a |")
                    continue
                if "error" in r:
                    add(f"| {r['row']} | failed: `{r['error'][-200:]}` | | | | | | | | | | | |")
                    continue
                fits = ""
                if r.get("budget_bytes") is not None:
                    fits = (f"{yes_no(r.get('measured_within_budget'))} "
                            f"({nbytes(r.get('measured_plus_resident'))})")
                passed = r.get("check_passed")
                check = "n/a" if passed is None else ("pass" if passed else
                                                      f"**FAIL** (exit {max(r.get('exit_codes') or [0])}"
                                                      f"{', memory higher' if not r.get('memory_lower') else ''}"
                                                      f"{', order differs' if r.get('order_matches') is False else ''})")
                add(f"| {r['row']} | {nbytes(r['predicted_peak'])} | {nbytes(r['measured_peak'])} "
                    f"| {nbytes(r['measured_above_baseline'])} | {nbytes(r['measured_requested'])} "
                    f"| {ms(r['time_s'])} | {ratio(r['time_vs_ort_default'])} | {ratio(r['time_vs_original'])} "
                    f"| {pct(r['recompute_share_of_step'])} | {yes_no(r['outputs_identical'])} | {check} "
                    f"| {nbytes(r.get('budget_bytes')) if r.get('budget_bytes') is not None else ''} | {fits} |")
            add("")

    # 3 ------------------------------------------------------------------------------
    _render_plan_quality(res.get("plan_quality"), add)
    _render_big_weights(res, add)
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
    if res.get("notes"):
        add("## Notes")
        add("")
        for n in res["notes"]:
            add(f"- {n}")
        add("")
    return "\n".join(L)


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


def _missing(section: dict | None, add, skipped: str = "Skipped.") -> bool:
    """Say so when a section was skipped or failed; True if there is nothing else to show."""
    if not section:
        add(skipped)
    elif "error" in section:
        add(f"Failed: `{section['error']}`")
    else:
        return False
    return True


def _render_plan_quality(pq: dict | None, add) -> None:
    add("## 3. Plan quality")
    add("")
    if _missing(pq, add):
        add("")
        return
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
    for s, d in pq["samples"].items():
        if "error" in d:
            continue
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
    _render_gpt_targets(pq, add)


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
        unreachable = [x for x in GPT_TARGETS if x[0] > t["max_possible_reduction"]]
        add("")
        add(f"No plan, at any recompute cost, goes below **{nbytes(t['lower_bound_bytes'])}** "
            f"(`Analysis.lower_bound_bytes`): the parameters and feeds ({nbytes(t['resident_bytes'])}) plus the "
            f"graph's outputs ({nbytes(t['output_bytes'])}: the loss and one gradient per parameter, which ORT holds "
            f"until the run ends, so all are live at its last step). The peak can fall by at most "
            f"**{pct(t['max_possible_reduction'])}**"
            + (", so " + " and ".join(f"the {pct(w)} target" for w, _ in unreachable) + " cannot be met by any "
               "planner." if unreachable else "."))
    add("")
    scan = t.get("segment_scan")
    if scan:
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
    f = t["floor"]
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


def _render_big_weights(res: dict, add) -> None:
    b = res.get("big_weights")
    add("## 5. Models with big weights")
    add("")
    add("### 5a. Over 2 GB of weights (external data)")
    add("")
    if not _missing(b, add, skipped="Skipped (`--quick` or `--skip-big`)."):
        add(f"`python -m bench.synthetic --layers 2 --big-weights 2.1 --external-data` "
            f"({nbytes(b['weights_bytes'])} on disk). ckpt reads only the graph and the tensors' shapes; "
            "the rewrite streams the weights into the output's external data file "
            f"({nbytes(b['output_data_bytes'])}).")
        add("")
        _big_weights_table(b, add)
    e = res.get("embedded_weights")
    add("### 5b. Weights embedded in the .onnx file")
    add("")
    if not _missing(e, add, skipped="Skipped (`--quick` or `--skip-big`)."):
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
                notes.append(f"{s}: `{r['row']}` measured tensors + resident ({nbytes(r['measured_plus_resident'])}) "
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
    ap.add_argument("--commands", help=f"comma-separated subset of the speed rows: {','.join(SPEED_COMMANDS)} "
                    "(floor brings the Python loop that calibrates the window)")
    ap.add_argument("--skip-speed", action="store_true")
    ap.add_argument("--skip-memory", action="store_true")
    ap.add_argument("--skip-big", action="store_true", help="skip the big-weight models (2 GB external, 1 GB embedded)")
    ap.add_argument("--skip-plan-quality", action="store_true")
    ap.add_argument("--skip-peer", action="store_true", help="skip the comparison with PyTorch's partitioner")
    ap.add_argument("--skip-agreement", action="store_true", help="skip budget against optimal on every sample")
    ap.add_argument("--out-dir", type=Path, default=BENCH, help="where RESULTS.md and results.json go")
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory")
    ap.add_argument("--update", action="store_true",
                    help="start from the committed results.json: sections skipped now keep their figures")
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
    commands = SPEED_COMMANDS
    if a.commands:
        commands = tuple(c.strip() for c in a.commands.split(",") if c.strip())
        bad = [c for c in commands if c not in SPEED_COMMANDS]
        if bad:
            ap.error(f"unknown command {bad[0]} (choose from {', '.join(SPEED_COMMANDS)})")
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
        ("embedded_weights", a.quick or a.skip_big, lambda: bench_big_weights(work, 1.0, external=False)),
        ("plan_quality", a.skip_plan_quality, bench_plan_quality),
        ("agreement", a.skip_agreement, _agreement),
        ("peer", a.skip_peer, lambda: _peer(a.runs)),
    ]
    measured_at: dict[str, str] = {}  # section (speed: per size) -> the commit its figures are from
    if a.update and (a.out_dir / "results.json").exists():  # keep the sections not run now
        kept = json.loads((a.out_dir / "results.json").read_text())
        steps = kept.get("command", "").split("; then ")
        if steps[-1] != res["command"]:  # the same update again adds no step
            steps.append(res["command"])
        measured_at = kept.get("measured_at") or _measured_before(kept)
        res = {**kept, **{k: v for k, v in res.items() if k != "command"}, "command": "; then ".join(steps)}
    commit = res["machine"]["git"]["commit"] + ("+dirty" if res["machine"]["git"]["dirty"] else "")
    res["measured_at"] = measured_at
    try:
        for key, skip, run_section in sections:
            if skip:
                continue
            try:
                before = res.get(key)
                res[key] = run_section()
                if key == "speed":
                    # a subset of the commands (--commands) is named: the size's other rows keep their commit
                    subset = "" if set(commands) >= set(SPEED_COMMANDS) else f" ({', '.join(commands)})"
                    measured_at.update({f"speed {s['size']}{subset}": commit for s in res[key].get("sizes", [])})
                else:
                    measured_at[key] = commit
                if key == "speed" and a.update and isinstance(before, dict) and "sizes" in before:
                    res[key] = _merge_speed(before, res[key])
            except Exception as e:  # noqa: BLE001 - record it and go on to the next section
                import traceback

                traceback.print_exc()
                res[key] = {"error": f"{type(e).__name__}: {e}"}
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
