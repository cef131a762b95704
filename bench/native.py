"""The compiled passes (``ckpt_cli/native.py``, ``native_orders.py``) against the plain-Python paths they replace.

    python -m bench.native                 # a 100k-node synthetic transformer, best of 3
    python -m bench.native --layers 70     # 10k nodes

Each pass runs in this process on the same analysed graph, best of ``--repeats``, plain
(``CKPT_PURE_PYTHON=1``) and compiled (``fast.NATIVE_MIN_STEPS`` lifted), its inputs made
beforehand in each mode, with its conversions to and from the lists the rest of ckpt reads;
the two results must be equal.
numba's fixed cost is measured in fresh interpreters: ``import numba`` after onnx, and the
first call of the cached kernels (an analysis of the mlp sample). End to end, ``ckpt rewrite``
of the same graph runs in fresh processes, as without numba (no pass compiled) and with it, in
turn, ``--rewrites`` times each (0: not run); the medians, the peak RSS and whether the written
files are identical.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from bench.common import BENCH, log, run_measured

ROOT = BENCH.parent
FIXED_COST = """
import time
import onnx, numpy
t = time.perf_counter(); import numba; imported = time.perf_counter() - t
from ckpt_cli import fast; fast.NATIVE_MIN_STEPS = 0
from ckpt_cli.analysis import analyse
from ckpt_cli.io.load import load_graph
g = load_graph("sample_models/mlp.onnx")
t = time.perf_counter(); analyse(g); first = time.perf_counter() - t
t = time.perf_counter(); analyse(g); again = time.perf_counter() - t
print(imported, first - again)
"""


def _passes(g, a) -> dict[str, Callable[[], Any]]:
    """Each pass, its inputs made beforehand in the mode set now (plain or compiled)."""
    from ckpt_cli.analysis.arena import arena_peak, kernel_plans, small_initializer_bytes
    from ckpt_cli.analysis.lifetimes import lifetimes
    from ckpt_cli.analysis.memory import buffer_roots
    from ckpt_cli.analysis.planner import plan_buffers, tensor_facts, without_reuse
    from ckpt_cli.analysis.schedules import ort_default, priority_based
    from ckpt_cli.rewrite.order import buffer_reads, memory_aware

    order = list(a.priority.order)
    facts, life = tensor_facts(g, a.tensors), lifetimes(g, order)
    walked = plan_buffers(g, order, facts, life, True)
    base = small_initializer_bytes(g, a.tensors)
    on, off = a.profile(True), a.profile(False)
    plans = {p.order: kernel_plans(g, p.order, a.tensors) for p in (on, off)}
    sizes, roots = {t: info.nbytes for t, info in a.tensors.items() if info.nbytes}, buffer_roots(g)
    reads, written = buffer_reads(g, sizes, roots), list(range(len(g.nodes)))
    backward = [not a.phases.is_forward[n.index] for n in g.nodes]
    return {"ORT's PRIORITY_BASED order, of the file reversed (Kahn's queue)": lambda: priority_based(g, written[::-1]),
            "ORT's DEFAULT order": lambda: ort_default(g),
            "buffer_reads": lambda: buffer_reads(g, sizes, roots),
            "memory_aware order (backward movable)": lambda: memory_aware(g, reads, backward),
            "lifetimes": lambda: lifetimes(g, order),
            "ORT's planner walk (plan_buffers, reuse on)": lambda: plan_buffers(g, order, facts, life, True),
            "without_reuse": lambda: without_reuse(walked, life),
            "arena_peak, reuse on": lambda: arena_peak(on, base, plans=plans[on.order]),
            "arena_peak, reuse off": lambda: arena_peak(off, base, plans=plans[off.order])}


def _listed(reads: Any) -> tuple[list[list[int]], list[int], list[int], list[list[int]]]:
    """``buffer_reads``' figures as lists whichever way they were made (a node's buffers sorted:
    the plain pass gives them in a set's order), for the comparison (not timed)."""
    if hasattr(reads, "read_ptr"):
        def rows(ptr: Any, idx: Any) -> list[list[int]]:
            return [sorted(idx[ptr[i]:ptr[i + 1]].tolist()) for i in range(len(ptr) - 1)]
        return (rows(reads.read_ptr, reads.read_idx), reads.allocs.tolist(), reads.size.tolist(),
                rows(reads.reader_ptr, reads.reader_idx))
    return [sorted(r) for r in reads.reads], list(reads.allocs), list(reads.size), [sorted(r) for r in reads.readers]


def _best(make: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    best, out = float("inf"), None
    for _ in range(repeats):
        t = time.perf_counter()
        out = make()
        best = min(best, time.perf_counter() - t)
    return best, out


_REWRITE = ("import sys; from ckpt_cli import fast; fast.NATIVE_MIN_STEPS = int(sys.argv[1]); "
            "sys.argv = ['ckpt', *sys.argv[2:]]; from ckpt_cli.cli import main; main()")


def _rewrites(src: Path, work: Path, runs: int) -> dict[str, Any]:
    """``ckpt rewrite`` of ``src`` in fresh processes, as a user without numba runs it (no pass
    compiled: ``fast.NATIVE_MIN_STEPS`` out of reach) and as ckpt runs with it, in turn: per
    mode the wall time and peak RSS of each run, and whether both wrote the same bytes."""
    times: dict[str, list[dict]] = {"plain": [], "compiled": []}
    from ckpt_cli import fast

    for _ in range(runs):
        for mode in times:
            threshold = 2**62 if mode == "plain" else fast.NATIVE_MIN_STEPS
            r = run_measured([sys.executable, "-c", _REWRITE, str(threshold), "rewrite", str(src),
                              "-o", str(work / f"{mode}.onnx"), "--force"])
            times[mode].append({"wall_s": r["wall_s"], "max_rss_bytes": r.get("max_rss_bytes"), "rc": r.get("rc")})
    same = (work / "plain.onnx").read_bytes() == (work / "compiled.onnx").read_bytes()
    return {"runs": runs, **times, "same_output": same}


def measure(layers: int = 704, repeats: int = 3, rewrites: int = 3) -> dict:
    """The passes' times both ways on a ``layers``-layer ``bench.synthetic`` transformer, and
    ``rewrites`` end-to-end rewrites of it each way."""
    try:
        import numba
    except ImportError:
        return {"error": "numba is not installed (pip install 'onnx-ckpt[fast]')"}
    from bench.synthetic import save_transformer
    from ckpt_cli import fast
    from ckpt_cli.analysis import analyse
    from ckpt_cli.io.load import load_graph

    with tempfile.TemporaryDirectory(prefix="ckpt_native_") as tmp:
        info = save_transformer(str(Path(tmp) / "g.onnx"), layers=layers)
        g = load_graph(info["path"])
        end_to_end = _rewrites(Path(info["path"]), Path(tmp), rewrites) if rewrites else None
    a = analyse(g)
    rows = []
    fast.NATIVE_MIN_STEPS, kept = 0, fast.NATIVE_MIN_STEPS
    try:
        os.environ["CKPT_PURE_PYTHON"] = "1"
        plain_passes = _passes(g, a)
        os.environ["CKPT_PURE_PYTHON"] = "0"
        for name, run in _passes(g, a).items():
            os.environ["CKPT_PURE_PYTHON"] = "1"
            plain, expected = _best(plain_passes[name], repeats)
            os.environ["CKPT_PURE_PYTHON"] = "0"
            compiled, got = _best(run, repeats)
            same = _listed(got) == _listed(expected) if name == "buffer_reads" else got == expected
            rows.append({"pass": name, "plain_s": plain, "compiled_s": compiled, "same": same})
            log(f"native: {name}: {plain * 1e3:.1f} -> {compiled * 1e3:.1f} ms")
    finally:
        fast.NATIVE_MIN_STEPS = kept
        os.environ.pop("CKPT_PURE_PYTHON", None)
    fixed = subprocess.run([sys.executable, "-c", FIXED_COST], cwd=ROOT, capture_output=True, text=True, check=True)
    imported, loaded = (float(x) for x in fixed.stdout.split())
    return {"nodes": len(g.nodes), "repeats": repeats, "numba": numba.__version__, "passes": rows,
            "import_s": imported, "first_call_s": loaded, "threshold": fast.NATIVE_MIN_STEPS,
            "end_to_end": end_to_end}


def render(res: dict | None, add) -> None:
    add("## 9. Compiled passes")
    add("")
    if not res or "error" in res:
        add(f"Not measured: {(res or {}).get('error', 'not run')}.")
        add("")
        return
    add(f"`python -m bench.native`: each whole-graph pass on a {res['nodes']:,}-node `bench.synthetic` "
        f"transformer, plain Python against the numba {res['numba']} kernel of `ckpt_cli/native.py` "
        f"or `ckpt_cli/native_orders.py` (`pip install 'onnx-ckpt[fast]'`), best of {res['repeats']} in one process, conversions included; "
        "both give equal results. Issue 47's target: at least 5x.")
    add("")
    add("| pass | plain | compiled | × faster | same result |")
    add("|---|---|---|---|---|")
    for r in res["passes"]:
        add(f"| {r['pass']} | {r['plain_s'] * 1e3:.1f} ms | {r['compiled_s'] * 1e3:.1f} ms | "
            f"{r['plain_s'] / r['compiled_s']:.1f}× | {'yes' if r['same'] else '**no**'} |")
    add("")
    add(f"Fixed cost, once per process: `import numba` {res['import_s']:.2f} s, the cached kernels' first calls "
        f"{res['first_call_s']:.2f} s more. ckpt compiles passes of {res['threshold']:,} steps and more "
        "(`fast.NATIVE_MIN_STEPS`), where they repay it.")
    add("")
    _render_end_to_end(res.get("end_to_end"), add)


def _render_end_to_end(e: dict | None, add: Callable[[str], None]) -> None:
    if not e:
        return
    def median(mode: str, key: str) -> float:
        values = sorted(r[key] or 0 for r in e[mode])
        return values[len(values) // 2]

    add(f"End to end, `ckpt rewrite F -o OUT --force` of the same graph in fresh processes, without the "
        f"kernels (as without numba: numpy's paths, no pass compiled) and with them, in turn, {e['runs']} runs "
        "each (median): "
        f"{median('plain', 'wall_s'):.2f} s without, {median('compiled', 'wall_s'):.2f} s with "
        f"({median('plain', 'wall_s') / median('compiled', 'wall_s'):.2f}x); peak RSS "
        f"{median('plain', 'max_rss_bytes') / 2**20:.0f} MiB without, {median('compiled', 'max_rss_bytes') / 2**20:.0f} MiB "
        f"with; the written files {'byte-identical' if e['same_output'] else '**differ**'}.")
    add("")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=704, help="synthetic transformer layers (704: 100,016 nodes)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rewrites", type=int, default=3, help="end-to-end rewrites each way (0: none)")
    a = ap.parse_args(argv)
    res = measure(a.layers, a.repeats, a.rewrites)
    lines: list[str] = []
    render(res, lines.append)
    print("\n".join(lines))
    print(json.dumps(res, indent=1))
    same = all(r["same"] for r in res.get("passes", [])) and (res.get("end_to_end") or {}).get("same_output", True)
    return 0 if "error" in res or same else 1


if __name__ == "__main__":
    sys.exit(main())
