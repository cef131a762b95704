"""Train an ORT training artifact for a few steps with ORT's Module API.  STANDALONE SCRIPT.

Like ``worker.py`` it imports only the standard library, numpy and onnxruntime (with its
``training`` package) and runs as ``python module_child.py SPEC.json`` in a fresh child
process under the interpreter ``--python`` names (onnxruntime-training, numpy<2). The
parent is ``ckpt_cli.verify.module_runs``; ``bench/zoo_train.py`` imports it by path.

SPEC.json::

    {"training_model": "t.onnx", "checkpoint": "DIR/checkpoint",
     "eval_model": "DIR/eval_model.onnx", "optimizer_model": "DIR/optimizer_model.onnx",
     "feeds": "feeds.npz",        # arrays by input name; the Module's user inputs are taken
     "steps": 3, "seed": 0,       # onnxruntime.set_seed(seed) before the Module and the steps
     "settings": {...} | null}    # null: ORT's defaults, one intra-op thread

``Module(training_model, CheckpointState.load_checkpoint(checkpoint), eval_model,
device="cpu", session_options=...)`` and ``Optimizer(optimizer_model, module)``; every step
is ``module.train(); loss = module(*inputs); optimizer.step(); module.lazy_reset_grad()``.

Memory: the process starts with ``MALLOC_MMAP_THRESHOLD_=65536`` (the parent sets it).
Everything is loaded first, then ``5`` goes to ``/proc/self/clear_refs`` (VmHWM reset) and
``peak_bytes`` is VmHWM after the last step minus VmRSS before the first.

Result (one JSON line on stdout)::

    {"ok": true, "losses_hex": [...], "peak_bytes": int, "step_s": [...],
     "input_names": [...], "ort_version": "1.19.2", "settings_applied": {...},
     "settings_ignored": [...]}
    {"ok": false, "kind": "training_unavailable" | "load_failed" | "run_failed"
                          | "bad_feeds" | "bad_spec", "message": "one line"}
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
import types
from typing import Any, TypedDict

# onnxruntime ships no type information: its options, Module and Optimizer are Any here.
OrtObject = Any


class _StepFigures(TypedDict):
    losses_hex: list[str]
    step_s: list[float]
    peak_bytes: int
    vmrss_before_bytes: int
    vmhwm_after_bytes: int


class StepFigures(_StepFigures, total=False):
    """``run_steps``' measurement; ``losses`` is dropped from the answer (see ``train``)."""

    losses: list[float]

SESSION_ATTRS = ("execution_order", "graph_optimization_level", "enable_mem_pattern",
                 "enable_mem_reuse", "enable_cpu_mem_arena")
MAX_STEPS = 100
EXIT_CODES = {"bad_spec": 2, "bad_feeds": 2, "training_unavailable": 4, "load_failed": 5, "run_failed": 5}


class ChildError(Exception):
    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind, self.message = kind, message


def _one_line(e: object, limit: int = 500) -> str:
    text = " ".join(str(e).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def keep_torch_out() -> None:
    """``import onnxruntime`` in the training wheel imports torch (its build validation loads
    ORTModule), about 3.5 s of every run; Module and Optimizer need only ORT's core. Call it
    before onnxruntime is imported."""
    if "torch" not in sys.modules:
        sys.modules["torch"] = None  # type: ignore[assignment]  # import torch -> ImportError


def import_training(module: str) -> types.ModuleType:
    """``onnxruntime.training.<module>``, also where torch is absent or kept out: the package
    ``__init__`` imports its torch-based parts; without torch the submodule is loaded from a
    bare package."""
    try:
        return importlib.import_module(f"onnxruntime.training.{module}")
    except ModuleNotFoundError as err:
        if err.name != "torch":
            raise
    import onnxruntime

    for name in [m for m in sys.modules if m.startswith("onnxruntime.training")]:
        del sys.modules[name]
    package = types.ModuleType("onnxruntime.training")
    package.__path__ = [os.path.join(os.path.dirname(onnxruntime.__file__), "training")]
    sys.modules["onnxruntime.training"] = package
    return importlib.import_module(f"onnxruntime.training.{module}")


def session_options(settings: dict[str, Any] | None) -> tuple[OrtObject, dict[str, Any], list[str]]:
    """ORT's SessionOptions with one intra-op thread (bit-identical comparisons need one)
    and ``settings`` (ckpt's recorded_settings) applied; returns (options, applied, ignored)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    applied: dict[str, Any] = {}
    ignored: list[str] = []
    for key, value in (settings or {}).items():
        if key == "execution_order":
            so.execution_order = getattr(ort.ExecutionOrder, value)
        elif key == "graph_optimization_level":
            so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, value)
        elif key == "config_entries":
            for k, v in (value or {}).items():
                so.add_session_config_entry(str(k), str(v))
        elif key in SESSION_ATTRS:
            setattr(so, key, bool(value))
        else:
            ignored.append(key)
            continue
        applied[key] = value
    return so, applied, sorted(ignored)


def process_status() -> dict[str, int]:
    with open("/proc/self/status", encoding="ascii") as f:
        fields = dict(line.split(":", 1) for line in f if ":" in line)
    return {k: int(fields[k].split()[0]) * 1024 for k in ("VmRSS", "VmHWM")}


def open_module(api: types.ModuleType, training_model: str, checkpoint: str, eval_model: str, optimizer_model: str,
                so: OrtObject) -> tuple[OrtObject, OrtObject]:
    state = api.CheckpointState.load_checkpoint(checkpoint)
    module = api.Module(training_model, state, eval_model, device="cpu", session_options=so)
    return module, api.Optimizer(optimizer_model, module)


def seed_ort(ort_seed: int | None) -> None:
    """Seed ORT's random generators. Called before the sessions are made and again before
    the steps: RandomNormal(Like) and RandomUniform(Like) without a seed attribute seed
    their own engine from ORT's global seed plus their node index when the session makes
    their kernel (the clock's time unless set first), and Dropout draws from ORT's default
    generator at run time, which ``set_seed`` resets."""
    import onnxruntime as ort

    if ort_seed is not None and hasattr(ort, "set_seed"):
        ort.set_seed(ort_seed)


def run_steps(module: OrtObject, optimizer: OrtObject, batches: list[list[Any]], ort_seed: int | None
              ) -> StepFigures:
    """The training loop, measured: losses, step times, and the process peak it added."""
    import numpy as np

    seed_ort(ort_seed)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = process_status()
    losses: list[float] = []
    times: list[float] = []
    for inputs in batches:
        start = time.perf_counter()
        module.train()
        loss = module(*inputs)
        optimizer.step()
        module.lazy_reset_grad()
        times.append(time.perf_counter() - start)
        losses.append(float(np.asarray(loss).reshape(())))
    after = process_status()
    return {"losses": losses, "losses_hex": [x.hex() for x in losses], "step_s": times,
            "peak_bytes": after["VmHWM"] - before["VmRSS"], "vmrss_before_bytes": before["VmRSS"],
            "vmhwm_after_bytes": after["VmHWM"]}


def _parse_spec(spec: object) -> dict[str, Any]:
    if not isinstance(spec, dict):
        raise ChildError("bad_spec", "the spec is not a JSON object")
    for key in ("training_model", "checkpoint", "eval_model", "optimizer_model", "feeds"):
        if not isinstance(spec.get(key), str):
            raise ChildError("bad_spec", f"spec needs a string {key!r}")
    steps, seed, settings = spec.get("steps", 3), spec.get("seed", 0), spec.get("settings")
    if type(steps) is not int or not 1 <= steps <= MAX_STEPS:
        raise ChildError("bad_spec", f"steps must be an integer in [1, {MAX_STEPS}]")
    if type(seed) is not int or not (settings is None or isinstance(settings, dict)):
        raise ChildError("bad_spec", "seed must be an integer and settings an object or null")
    return spec


def _inputs(np: types.ModuleType, path: str, names: list[str]) -> list[Any]:
    try:
        with np.load(path, allow_pickle=False) as npz:
            missing = [n for n in names if n not in npz.files]
            if missing:
                raise ChildError("bad_feeds", f"the feeds have no array for the Module's inputs {missing[:5]}")
            return [npz[n] for n in names]
    except (OSError, ValueError) as e:
        raise ChildError("bad_feeds", f"cannot read the feeds: {_one_line(e)}") from e


def train(raw: dict[str, Any]) -> dict[str, Any]:
    spec = _parse_spec(raw)

    try:
        import numpy as np
        import onnxruntime as ort

        api = import_training("api")
    except Exception as e:  # any import failure: no Module API here
        raise ChildError("training_unavailable", f"no onnxruntime.training.api under {sys.executable}: "
                                                 f"{_one_line(e)}") from e
    so, applied, ignored = session_options(spec["settings"])
    seed_ort(spec["seed"])
    try:
        module, optimizer = open_module(api, spec["training_model"], spec["checkpoint"], spec["eval_model"],
                                        spec["optimizer_model"], so)
    except Exception as e:  # ORT's errors have no common type
        raise ChildError("load_failed", f"{type(e).__name__}: {_one_line(e)}") from e
    names = list(module.input_names())
    inputs = _inputs(np, spec["feeds"], names)
    try:
        measured = run_steps(module, optimizer, [inputs] * spec["steps"], spec["seed"])
    except Exception as e:  # ORT's training errors have no common type
        raise ChildError("run_failed", f"{type(e).__name__}: {_one_line(e)}") from e
    measured.pop("losses")  # a NaN has no JSON number: the hex strings carry every loss
    return {"ok": True, **measured, "input_names": names, "ort_version": ort.__version__,
            "settings_applied": applied, "settings_ignored": ignored}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # Native libraries and Python warnings must not pollute the JSON on stdout.
    real_stdout = os.fdopen(os.dup(1), "w")
    sys.stdout.flush()
    os.dup2(2, 1)
    try:
        if len(argv) != 1:
            raise ChildError("bad_spec", "usage: module_child.py SPEC.json")
        keep_torch_out()
        with open(argv[0], encoding="utf-8") as f:
            result = train(json.load(f))
    except ChildError as e:
        result = {"ok": False, "kind": e.kind, "message": _one_line(e.message)}
    except (OSError, ValueError) as e:
        result = {"ok": False, "kind": "bad_spec", "message": _one_line(e)}
    except Exception as e:  # noqa: BLE001 - last resort: still answer in JSON
        result = {"ok": False, "kind": "run_failed", "message": _one_line(f"{type(e).__name__}: {e}")}
    real_stdout.write(json.dumps(result) + "\n")
    real_stdout.flush()
    return 0 if result.get("ok") else EXIT_CODES.get(result.get("kind", ""), 1)


if __name__ == "__main__":
    sys.exit(main())
