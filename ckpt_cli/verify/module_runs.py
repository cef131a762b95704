"""The session a user of an ORT training artifact runs: ORT's Module API, measured.

An artifact (``generate_artifacts``' folder: ``training_model.onnx`` beside ``checkpoint``,
``eval_model.onnx`` and ``optimizer_model.onnx``) is trained through ``Module`` +
``Optimizer``, by default in an untuned session (ORT_ENABLE_ALL's fusions, the memory pattern,
buffer reuse and the arena). The check trains the original and the rewrite there and under
the rewrite's recorded settings, a few steps each from the original's checkpoint, each in a
fresh child (``module_child.py``) under ``--python``: process peak and losses per run.
The rewritten training model runs with the original's checkpoint, eval and optimizer models,
as a user who swaps the file in does.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from collections.abc import Callable, Mapping
from typing import Any

from ..errors import RunFailed
from ..ort import child
from . import module_child as _module_child
from .driver import MODULE_CHILD_ENV, WorkerOptions, _child_env, _parse
from .rules import module_rise_is_noise
from .records import MODULE_SESSIONS, MODULE_SIDES, ModulePredicted, ModuleRun, ModuleSessions

MODULE_CHILD_PATH = os.path.abspath(_module_child.__file__)
# Enough for the optimizer's state to be in place, losses to move and the process peak to
# settle: a rewrite's peak under the memory pattern can still rise over the first few steps
# (the commit that set it has the measurement).
STEPS = 10
ARTIFACT_FILES = {"checkpoint": "checkpoint", "eval_model": "eval_model.onnx",
                  "optimizer_model": "optimizer_model.onnx"}
SESSIONS, SIDES = MODULE_SESSIONS, MODULE_SIDES
# A process's high-water mark only gains from noise: an untuned rewrite measured above the
# original is trained again, both sides, up to this many more times, each side judged by
# its lowest peak. Zoo kan's file measured 4.83-5.05 MiB in two clusters, run one at a
# time or two at once, with ASLR off and malloc held to one arena alike.
REMEASURE = 2
UNTUNED = ("original_untuned", "rewritten_untuned")
# A finding about the model (the child answered why ORT did not run it), not a child gone wrong.
_MODEL_FAILURES = ("load_failed", "run_failed")


def artifact_files(training_model: str | os.PathLike[str]) -> dict[str, str] | str:
    """The artifact's other files beside ``training_model``, or why there are none."""
    folder = Path(training_model).resolve().parent
    files = {k: folder / name for k, name in ARTIFACT_FILES.items()}
    missing = [p.name for p in files.values() if not p.exists()]
    if missing:
        return f"the original's folder has no {', '.join(missing)}"
    return {k: str(p) for k, p in files.items()}


def _checked(answer: dict[str, Any], steps: int, what: str) -> ModuleRun:
    """The figures of a child's answer, strictly: one finite loss per step, a byte count."""
    hexes, times, peak = answer.get("losses_hex"), answer.get("step_s"), answer.get("peak_bytes")
    try:
        if not (isinstance(hexes, list) and len(hexes) == steps and all(isinstance(h, str) and len(h) < 40
                                                                         for h in hexes)):
            raise ValueError("losses_hex")
        for h in hexes:
            float.fromhex(h)
        if not (isinstance(times, list) and len(times) == steps and all(type(t) in (int, float) for t in times)):
            raise ValueError("step_s")
        if type(peak) is not int:
            raise ValueError("peak_bytes")
    except ValueError as e:
        raise RunFailed("bad_answer", f"{what} answered a malformed result ({e})") from e
    return ModuleRun(peak, tuple(hexes), statistics.median(times))


def run_module(training_model: str | os.PathLike[str], files: dict[str, str], feeds_path: str | os.PathLike[str],
               settings: dict[str, Any] | None, worker: WorkerOptions, steps: int = STEPS) -> ModuleRun:
    """Train ``training_model`` for ``steps`` steps in a fresh child: its peak_bytes (process
    peak above the loaded state), losses_hex and median step time. Raises RunFailed."""
    session = "untuned" if settings is None else "recorded settings"
    what = f"the Module child training {os.path.basename(os.fspath(training_model))} ({session})"
    spec = {"training_model": os.path.abspath(os.fspath(training_model)), **files,
            "feeds": os.path.abspath(os.fspath(feeds_path)), "steps": steps, "seed": int(worker.seed),
            "settings": settings}
    with tempfile.TemporaryDirectory(prefix="ckpt_module_") as tmp:
        spec_path = os.path.join(tmp, "spec.json")
        with open(spec_path, "w", encoding="utf-8") as f:
            json.dump(spec, f)
        out = child.run_child([worker.python or sys.executable, MODULE_CHILD_PATH, spec_path], _child_env(MODULE_CHILD_ENV),
                              worker.timeout, what)
    return _checked(_parse(out, what), steps, what)


def module_sessions(original: str | os.PathLike[str], rewritten: str | os.PathLike[str], feeds_path: str | os.PathLike[str],
                    worker: WorkerOptions, steps: int = STEPS, dims: Mapping[str, int] | None = None) -> ModuleSessions:
    """Both training models in the Module API, untuned and under the rewrite's recorded
    settings, or ``skipped`` and why when the original cannot be trained here; with
    ``dims`` (the feeds' symbolic dimensions), ckpt's prediction of the untuned runs too."""
    from ..io.session import recorded_settings

    files = artifact_files(original)
    if isinstance(files, str):
        return ModuleSessions(files)
    settings = recorded_settings(rewritten)
    runs: dict[str, ModuleRun] = {}
    errors: dict[str, str] = {}
    for session in SESSIONS:
        for side, model in zip(SIDES, (original, rewritten)):
            key = f"{side}_{session}"
            try:
                runs[key] = run_module(model, files, feeds_path, settings if session == "settings" else None,
                                       worker, steps)
            except RunFailed as e:
                if key == "original_untuned" and e.kind in (*_MODEL_FAILURES, "training_unavailable"):
                    return ModuleSessions(f"the Module API did not train the original ({e.kind}: {e.message})")
                if e.kind not in _MODEL_FAILURES:
                    raise
                errors[key] = f"{e.kind}: {e.message}"
    runs = _remeasured(runs, lambda model: run_module(model, files, feeds_path, None, worker, steps),
                       dict(zip(UNTUNED, (original, rewritten))))
    predicted = {} if dims is None else {side: _predicted(model, dims, worker, steps)
                                         for side, model in zip(SIDES, (original, rewritten))}
    return ModuleSessions(None, steps, settings, runs, errors, predicted)


def _remeasured(runs: dict[str, ModuleRun], train: Callable[[str | os.PathLike[str]], ModuleRun],
                models: Mapping[str, str | os.PathLike[str]]) -> dict[str, ModuleRun]:
    """``runs`` with both untuned sides trained again while the rewrite stays above the
    original beyond the noise (``rules.module_rise_is_noise``), at most ``REMEASURE`` times."""
    for _ in range(REMEASURE):
        o, r = (runs.get(k) for k in UNTUNED)
        if o is None or r is None or module_rise_is_noise(o, r):
            break
        runs = {**runs, **{k: runs[k].again(train(models[k]).peak_bytes) for k in UNTUNED}}
    return runs


def _predicted(model: str | os.PathLike[str], dims: Mapping[str, int], worker: WorkerOptions,
               steps: int) -> ModulePredicted | None:
    from .module_model import predict_module_session

    try:
        prediction = predict_module_session(Path(model), dict(dims), worker.python, worker.timeout)
    except RunFailed as e:
        if e.kind not in _MODEL_FAILURES:
            raise
        return None
    if prediction is None:
        return None
    return ModulePredicted(prediction.after(steps), prediction.peak_bytes,
                           len(prediction.step_peaks) if prediction.settled else None)
