"""Peak memory of a model under the sessions people actually run (issue 14).

Each measurement is ``tests/fixtures/sessions.py``'s (the tests measure with it too): a
fresh child process, one warm-up run, then one profiled run; the peak is the most ORT's CPU
arena had in use during that run (profiler ``mem_bytes_in_use``), one intra-op thread.

    python -m bench.sessions                  # rewrites the samples, writes bench/SESSIONS.md
    python -m bench.sessions --update NAME..  # re-measures those samples' rows of bench/SESSIONS.md
    python -m bench.sessions --sample NAME..  # those samples' rows, to stdout
    python -m bench.sessions MODEL [...]      # one row per model and session, to stdout
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from tests.fixtures.sessions import SESSIONS, make_feeds, measure, measure_process_peak

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
median of 3 runs) through ckpt's check worker, in every column. `plain, process peak`: what a
user's process holds for a plain `InferenceSession(path)` (ORT's defaults, its arena on):
VmHWM above the state before the first of 4 runs in one session (outputs dropped between
runs; the median of runs 2-4, where the memory pattern is in effect), original → rewrite.
The arena's chunks count there as the pages the runs touched, not as the chunk sizes the
`plain` column's bytes in use count (a 3.3 MiB pattern block takes a 4 MiB chunk whole).

"""


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
    cells.append(_plain_process_peaks(name, source, tmp / f"{name}.pin.onnx", feeds))
    # Alternate the two graphs and keep each one's fastest run: on a shared machine the
    # minimum is what the graph costs, the median mostly what the neighbours cost.
    t_pin = t_nopin = float("inf")
    for _ in range(2):
        t_pin = min(t_pin, run(tmp / f"{name}.pin.onnx", "ckpt", timed_runs)["min_s"])
        t_nopin = min(t_nopin, run(tmp / f"{name}.nopin.onnx", "ckpt", timed_runs)["min_s"])
    note = " (no gain: written unchanged)" if pinned.no_gain_reason else ""
    return (f"| {label}{note} | {original / MiB:.2f} | " + " | ".join(cells)
            + f" | {pinned.guard_nodes} | {t_pin * 1e3:.1f} / {t_nopin * 1e3:.1f} ms |")


def _plain_process_peaks(name: str, original: Path, rewrite: Path, feeds: Path) -> str:
    """The ``plain, process peak`` cell: original -> rewrite (ratio); n/a for the ORT
    artifact, whose every column is a process peak already."""
    if name == "ort_artifact":
        return "n/a"
    before, after = (measure_process_peak(m, "plain", feeds, sys.executable, runs=3, arena=True)["peak_bytes"]
                     for m in (original, rewrite))
    return f"{before / MiB:.2f} → {after / MiB:.2f} ({after / before:.2f}x)"


def _head() -> list[str]:
    """The session matrix's header and separator lines."""
    names = [n for s in SESSIONS for n in ((s, "ckpt predicted (c)") if s == "ckpt" else (s,))]
    head = ("| sample | original, ORT defaults | "
            + " | ".join(n if n.startswith("ckpt predicted") else f"rewrite: {n}" for n in names)
            + " | plain, process peak | guard nodes | step time (c), pinned / --no-pin |")
    return [head, "|" + "---|" * (len(names) + 5)]


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
