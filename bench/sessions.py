"""Peak memory of a model under the sessions people actually run (issue 14).

Each measurement runs in a fresh child process: one warm-up run, then one profiled run;
the peak is the most ORT's CPU arena had in use during that run (profiler
``mem_bytes_in_use``), one intra-op thread. Outputs of the warm-up are dropped before
the measured run.

    python -m bench.sessions                  # rewrites the samples, writes bench/SESSIONS.md
    python -m bench.sessions --update NAME..  # re-measures those samples' rows of bench/SESSIONS.md
    python -m bench.sessions --sample NAME..  # those samples' rows, to stdout
    python -m bench.sessions MODEL [...]      # one row per model and session, to stdout
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

# name -> (execution order, optimization level, memory pattern, buffer reuse as recorded)
SESSIONS: dict[str, tuple[str | None, str | None, bool | None, bool]] = {
    "plain": (None, None, None, False),  # InferenceSession(path): nothing set
    "default_all": ("DEFAULT", "ORT_ENABLE_ALL", False, False),
    "ckpt": ("PRIORITY_BASED", "ORT_DISABLE_ALL", False, True),  # what the model's metadata asks for
    "priority_basic": ("PRIORITY_BASED", "ORT_ENABLE_BASIC", False, False),
    "priority_extended": ("PRIORITY_BASED", "ORT_ENABLE_EXTENDED", False, False),
    "priority_all": ("PRIORITY_BASED", "ORT_ENABLE_ALL", False, False),
}
# Measured but not in the table: the plain session without fusions (ckpt's model of it has none).
EXTRA_SESSIONS = {"default_pattern": ("DEFAULT", "ORT_DISABLE_ALL", True, False)}


_HEADER = """# Peak memory of the default rewrite under the sessions people run

`python -m bench.sessions` (ORT CPU, one intra-op thread; peak = ORT's arena bytes in use
during one run after a warm-up, profiler `mem_bytes_in_use`). Ratios are against the
original graph in a plain `InferenceSession(path)` (ORT's defaults).
Sessions: `plain` = nothing set (DEFAULT order, ORT_ENABLE_ALL, memory pattern on) (a);
`default_all` = DEFAULT order + ORT_ENABLE_ALL, memory pattern off (b); `ckpt` = the
settings the model records (`ckpt_cli.session_options`: PRIORITY_BASED, ORT_DISABLE_ALL,
its enable_mem_reuse; ORT's defaults for a graph written unchanged) (c);
`priority_*` = PRIORITY_BASED at each optimization level. `ckpt predicted (c)`: what ckpt
predicts for (c) before any run (the arena peak of the file order; for a graph written
unchanged, whose (c) is ORT's defaults, its model of the graph ORT builds at ORT_ENABLE_ALL,
`ckpt_cli/verify/plain_model.py`), and its error against the measured (c). The rewrites are written as
`ckpt rewrite` writes them by default: the model's inputs kept, so ORT's memory pattern is
on in (a), and the default plan judged in that session (`ckpt_cli/verify/plain_choice.py`). Step time: the fastest of 10 runs
(two alternating rounds of 5 per graph) under (c), ORT's profiler on; the
machine is shared, so only large differences mean anything. The ORT training artifact runs
only in onnxruntime-training-cpu 1.19.2 (`.venv-ort-training`), whose profiler has no memory
fields: its row is the process peak (VmHWM above the state before the run, ORT's arena off,
median of 3 runs) through ckpt's check worker, in every column.

"""


def _child(spec: dict) -> dict:
    import gc
    import time

    import numpy as np
    import onnx
    import onnxruntime as ort

    from ckpt_cli.markers import MEM_REUSE_META

    order, level, pattern, recorded = {**SESSIONS, **EXTRA_SESSIONS}[spec["session"]]
    if recorded:  # what the model's metadata asks for (ORT's defaults for a graph ckpt left unchanged)
        from ckpt_cli.ort.session import recorded_settings

        s = recorded_settings(spec["model"])
        order, level, pattern = s["execution_order"], s["graph_optimization_level"], s["enable_mem_pattern"]
    so = ort.SessionOptions()
    if order is not None:
        so.execution_order = getattr(ort.ExecutionOrder, order)
    if level is not None:
        so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    if pattern is not None:
        so.enable_mem_pattern = pattern
    model = onnx.load(spec["model"], load_external_data=False)
    meta = {p.key: p.value for p in model.metadata_props}
    if recorded and meta.get(MEM_REUSE_META) == "0":
        so.enable_mem_reuse = False
    so.intra_op_num_threads = 1
    so.enable_profiling = True
    so.profile_file_prefix = os.path.join(spec["dir"], "p")
    so.log_severity_level = 3
    sess = ort.InferenceSession(spec["model"], so, providers=["CPUExecutionProvider"])
    feeds = dict(np.load(spec["feeds"]))
    sess.run(None, feeds)
    gc.collect()
    t0 = time.perf_counter()
    out = sess.run(None, feeds)
    elapsed = time.perf_counter() - t0
    times = []
    for _ in range(spec.get("timed_runs", 0)):
        out = None
        t0 = time.perf_counter()
        out = sess.run(None, feeds)
        times.append(time.perf_counter() - t0)
    events = json.load(open(sess.end_profiling()))
    runs = [e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"]
    run = runs[1]
    nodes = [e for e in events if e.get("cat") == "Node" and run["ts"] <= e["ts"] <= run["ts"] + run["dur"]
             and e["name"].endswith("_kernel_time")]
    peak = max((int(e["args"].get("mem_bytes_in_use", 0)) for e in nodes), default=0)
    if spec.get("outputs"):
        np.savez(spec["outputs"], **{o.name: v for o, v in zip(sess.get_outputs(), out)})
    times = sorted(times) or [elapsed]
    return {"peak_bytes": peak, "time_s": times[len(times) // 2], "min_s": times[0],
            "executed": [e["name"][: -len("_kernel_time")] for e in nodes]}


def make_feeds(model_path: str | Path, path: str | Path, seed: int = 0) -> None:
    """Deterministic feeds: floats uniform in [-0.1, 0.1), integers alternate 0 and 1 (valid
    token ids and labels for any vocabulary), the backward seed (a scalar float) 1.0."""
    import numpy as np
    import onnx

    model = onnx.load(str(model_path), load_external_data=False)
    init = {t.name for t in model.graph.initializer}
    rng = np.random.default_rng(seed)
    feeds = {}
    for v in model.graph.input:
        if v.name in init or v.type.WhichOneof("value") != "tensor_type":
            continue  # an optional input (ckpt's memory-pattern switch) is left out: ORT runs it as None
        t = v.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else 1 for d in t.shape.dim]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(t.elem_type)
        if np.issubdtype(dtype, np.floating):
            value = np.ones(shape, dtype) if not shape else rng.uniform(-0.1, 0.1, shape).astype(dtype)
        else:
            value = (np.arange(int(np.prod(shape)), dtype=np.int64) % 2).reshape(shape).astype(dtype)
        feeds[v.name] = value
    np.savez(path, **feeds)


def measure(model: str | Path, session: str, feeds: str | Path, outputs: str | Path | None = None,
            timed_runs: int = 0, python: str | None = None) -> dict:
    """Measure ``model`` under ``session`` (a key of SESSIONS) in a fresh child process:
    ``peak_bytes``, ``time_s`` (median of ``timed_runs``, else the profiled run) and the
    ``executed`` node order (``min_s``: the fastest timed run)."""
    with tempfile.TemporaryDirectory(prefix="ckpt_sessions_") as tmp:
        spec = {"model": os.path.abspath(model), "session": session, "feeds": os.path.abspath(feeds),
                "dir": tmp, "outputs": os.path.abspath(outputs) if outputs else None, "timed_runs": timed_runs}
        spec_path = os.path.join(tmp, "spec.json")
        Path(spec_path).write_text(json.dumps(spec))
        env = dict(os.environ, OMP_NUM_THREADS="1")
        done = subprocess.run([python or sys.executable, __file__, "--child", spec_path], capture_output=True,
                              text=True, env=env, timeout=600)
        if done.returncode != 0:
            raise RuntimeError(f"measuring {model} under {session} failed: {done.stderr.strip()[-2000:]}")
        return json.loads(done.stdout.strip().splitlines()[-1])


def measure_process_peak(model: str | Path, session: str, feeds: str | Path, python: str,
                         runs: int = 3) -> dict:
    """``measure`` for ORT builds whose profiler has no memory fields (onnxruntime-training
    1.19.2, the only build that runs ORT training artifacts): ckpt's check worker under
    ``python`` reads the process peak, VmHWM above the state before the run, with ORT's arena
    off (``ckpt_cli/verify/worker.py``). ``peak_bytes`` is the median of ``runs``."""
    from ckpt_cli.ort.session import recorded_settings
    from ckpt_cli.verify import driver
    from ckpt_cli.verify.settings import ort_default_session_settings

    order, level, pattern, recorded = SESSIONS[session]
    if recorded:
        settings = recorded_settings(model)
    else:
        settings = ort_default_session_settings("cpu")
        settings["measurement_only"] = dict(settings["measurement_only"], process_peak_with_arena=False)
        for key, value in (("execution_order", order), ("graph_optimization_level", level),
                           ("enable_mem_pattern", pattern)):
            if value is not None:
                settings[key] = value
    r = driver.run_model(model, feeds, provider="cpu", settings=settings, runs=runs,
                         worker=driver.WorkerOptions(python=python, memory_method="process_peak"))
    return {"peak_bytes": r["peak_bytes"], "min_s": min(run["time_s"] for run in r["runs"]),
            "executed": r["executed_order"]}


ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ("gpt", "gpt12", "mlp", "cnn", "resnet18", "synthetic", "ort_artifact")
ARTIFACT = ROOT / "sample_models" / "ort_artifact" / "training_model.onnx"
# An interpreter with onnxruntime-training-cpu 1.19.2 (tests/test_ort_training.py builds it).
TRAINING_PYTHON = ROOT / ".venv-ort-training" / "bin" / "python"
MiB = 2**20


def _rewrite(source: Path, out: Path, pin: bool):
    """The rewrite as ``ckpt rewrite`` writes it by default (``--no-pin`` when not ``pin``)."""
    from ckpt_cli.api import rewrite_model

    return rewrite_model(source, out, pin=pin, force=True).result


def predicted_recorded(result, path: Path, process_peak: bool = False) -> int:
    """ckpt's prediction, before any run, for session (c), the settings the written model
    ``path`` records: the arena peak of its file order; for a graph written unchanged, whose
    (c) is ORT's defaults, its model of ORT's own ORT_ENABLE_ALL graph (``fused_plain``; the
    file's graph where that cannot be had); with ``process_peak`` (ORT's arena off) the
    live tensor bytes."""
    from ckpt_cli.analysis.pattern import predict_plain
    from ckpt_cli.verify.plain_model import fused_plain

    if process_peak:
        return result.after.profile(result.mem_reuse).activation_peak_bytes
    if result.session == "ort_default":
        fused = fused_plain(path, result.after.tensors)
        if fused is not None:
            return fused.peak_in_use_bytes
        if result.pattern_off is not None:
            return result.pattern_off.without_pattern_bytes
        return predict_plain(result.graph, result.after.tensors).peak_in_use_bytes
    return result.after.arena_in_use(result.mem_reuse)


def _source(name: str, tmp: Path) -> Path:
    if name == "synthetic":
        import onnx

        from bench.synthetic import build_transformer

        onnx.save(build_transformer(4), tmp / "synthetic.onnx")
        return tmp / "synthetic.onnx"
    return ARTIFACT if name == "ort_artifact" else ROOT / "sample_models" / f"{name}.onnx"


def row(name: str, tmp: Path, timed_runs: int = 5, training_python: str | None = None) -> str | None:
    """One sample's row of the session matrix; None when it cannot be measured here (the ORT
    artifact without a training build of ORT)."""
    source = _source(name, tmp)
    feeds = tmp / f"{name}.npz"
    label = name
    if name == "ort_artifact":
        if not training_python:
            return None
        label = f"{name} (training build, process peak)"
    if not source.exists():
        return None
    make_feeds(source, feeds)

    def run(model: Path, session: str, timed: int = 0) -> dict:
        if name == "ort_artifact":
            return measure_process_peak(model, session, feeds, training_python, runs=max(3, timed))
        return measure(model, session, feeds, timed_runs=timed)

    pinned = _rewrite(source, tmp / f"{name}.pin.onnx", True)
    _rewrite(source, tmp / f"{name}.nopin.onnx", False)
    original = run(source, "plain")["peak_bytes"]
    cells = []
    for session in SESSIONS:
        peak = run(tmp / f"{name}.pin.onnx", session)["peak_bytes"]
        cells.append(f"{peak / MiB:.2f} ({peak / original:.2f}x)")
        if session == "ckpt":
            predicted = predicted_recorded(pinned, tmp / f"{name}.pin.onnx", process_peak=name == "ort_artifact")
            cells.append(f"{predicted / MiB:.2f} ({predicted / peak - 1:+.1%})")
    # Alternate the two graphs and keep each one's fastest run: on a shared machine the
    # minimum is what the graph costs, the median mostly what the neighbours cost.
    t_pin = t_nopin = float("inf")
    for _ in range(2):
        t_pin = min(t_pin, run(tmp / f"{name}.pin.onnx", "ckpt", timed_runs)["min_s"])
        t_nopin = min(t_nopin, run(tmp / f"{name}.nopin.onnx", "ckpt", timed_runs)["min_s"])
    note = " (no gain: written unchanged)" if pinned.no_gain_reason else ""
    return (f"| {label}{note} | {original / MiB:.2f} | " + " | ".join(cells)
            + f" | {pinned.guard_nodes} | {t_pin * 1e3:.1f} / {t_nopin * 1e3:.1f} ms |")


def _head() -> list[str]:
    """The session matrix's header and separator lines."""
    names = [n for s in SESSIONS for n in ((s, "ckpt predicted (c)") if s == "ckpt" else (s,))]
    head = ("| sample | original, ORT defaults | "
            + " | ".join(n if n.startswith("ckpt predicted") else f"rewrite: {n}" for n in names)
            + " | guard nodes | step time (c), pinned / --no-pin |")
    return [head, "|" + "---|" * (len(names) + 4)]


def table(tmp: Path, timed_runs: int = 5, training_python: str | None = None,
          samples: tuple[str, ...] = SAMPLES) -> str:
    """The session matrix of every sample's default rewrite, as Markdown."""
    lines = _head()
    for name in samples:
        line = row(name, tmp, timed_runs, training_python)
        if line is not None:
            lines.append(line)
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    if argv[:1] == ["--child"]:
        print(json.dumps(_child(json.loads(Path(argv[1]).read_text()))))
        return 0
    training = str(TRAINING_PYTHON) if TRAINING_PYTHON.exists() else None
    if argv[:1] == ["--sample"]:  # rows to stdout
        with tempfile.TemporaryDirectory() as tmp:
            print(table(Path(tmp), training_python=training, samples=tuple(argv[1:])))
        return 0
    if argv[:1] == ["--update"]:  # re-measure some rows of the committed table
        path = ROOT / "bench" / "SESSIONS.md"
        lines = path.read_text().splitlines()
        # this version's header: rows kept from before a column was added need a full run
        lines = _head() + lines[next(i for i, l in enumerate(lines) if l.startswith("| sample |")) + 2:]
        with tempfile.TemporaryDirectory() as tmp:
            for name in argv[1:]:
                new_row = row(name, Path(tmp), training_python=training)
                if new_row is None:
                    raise SystemExit(f"cannot measure {name} here")
                at = [i for i, l in enumerate(lines[2:], 2) if l.split("|")[1].split()[0] == name]
                if at:
                    lines[at[0]] = new_row
                else:
                    lines.append(new_row)
        path.write_text(_HEADER + "\n".join(lines) + "\n")
        print(path.read_text())
        return 0
    if not argv:
        if training is None:
            print(f"no {TRAINING_PYTHON}: the ORT artifact's row needs onnxruntime-training-cpu 1.19.2 "
                  "(`make recipe-ort-training` or the slow tests build it)", file=sys.stderr)
        with tempfile.TemporaryDirectory() as tmp:
            rows = table(Path(tmp), training_python=training)
        text = (_HEADER + rows)
        (ROOT / "bench" / "SESSIONS.md").write_text(text)
        print(text)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        for model in argv:
            feeds = os.path.join(tmp, "feeds.npz")
            make_feeds(model, feeds)
            for name in SESSIONS:
                r = measure(model, name, feeds)
                print(f"{model}\t{name}\t{r['peak_bytes'] / 2**20:.2f} MiB\t{len(r['executed'])} nodes")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
