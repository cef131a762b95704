"""Train one artifact of the zoo (sample_models/artifact_zoo.py) with ORT's Module/Optimizer API.

Runs in the training interpreter (onnxruntime-training-cpu 1.19.2, numpy<2), not in ckpt's
venv; ``bench/artifacts.py`` drives it. By hand:

    MALLOC_MMAP_THRESHOLD_=65536 python bench/zoo_train.py ARTIFACT_DIR TRAINING_MODEL \\
        [--steps 10] [--settings JSON] [--batch N] [--seq N] [--seed 1]

``Module(TRAINING_MODEL, CheckpointState.load_checkpoint(ARTIFACT_DIR/checkpoint),
ARTIFACT_DIR/eval_model.onnx, device="cpu", session_options=...)`` and
``Optimizer(ARTIFACT_DIR/optimizer_model.onnx, module)``; every step is
``module.train(); loss = module(*inputs); optimizer.step(); module.lazy_reset_grad()``.

Session: without ``--settings`` ORT's defaults, except ``intra_op_num_threads = 1`` (bit-identical
comparisons need one thread). ``--settings`` takes the JSON of
``ckpt_cli.io.session.recorded_settings(path)`` (or ``examples/ort_training_artifacts/artifacts.py``'s
``--settings`` format): ``execution_order`` and ``graph_optimization_level`` by name,
``enable_mem_pattern``, ``enable_mem_reuse``, ``enable_cpu_mem_arena`` and ``config_entries``
are applied; keys that are not SessionOptions attributes (``settings``, ``provider``,
``measurement_only``, ``mem_pattern_off_input``, ...) are listed in ``settings_ignored``.

Feeds, from ARTIFACT_DIR/zoo.json: step ``i`` draws from ``numpy.random.RandomState(seed + i)``,
in zoo.json's order (inputs, then label): int inputs uniform in ``[0, bound)``, float inputs
standard normal; ``"batch"`` in a shape is ``--batch`` (default: zoo.json's ``batch``),
``"batch*32"`` batch times 32, ``"seq"`` ``--seq`` (default: zoo.json's ``seq``), ``"tokens"`` batch times seq. ``onnxruntime.set_seed(--ort-seed)`` (default 0) runs before the
Module is made and again before the steps, so that random ops draw the same numbers in every
process. They are handed to the Module by name, in ``module.input_names()``
order; a Module input zoo.json does not know is an error.

Memory: the process must start with ``MALLOC_MMAP_THRESHOLD_=65536`` (buffers above 64 KiB then
come from mmap and go back to the system when freed); if it is not set the script re-executes
itself with it. Everything (artifacts, optimizer state, all batches) is loaded first, then ``5``
goes to ``/proc/self/clear_refs`` (VmHWM reset) and ``peak_bytes`` is VmHWM after the last step
minus VmRSS before the first: what training added on top of the loaded state.

The session options, the Module loop and its measurement are ``ckpt_cli/verify/module_child.py``'s,
the child ``ckpt check`` trains artifacts in (loaded by path: it needs nothing beyond numpy and
onnxruntime); the feeds from zoo.json are this script's own.

Import: ``import onnxruntime`` in the training wheel imports torch (its build validation loads
ORTModule), about 3.5 s of every run; Module and Optimizer need only ORT's core, so torch is
kept out unless ``--allow-torch``.

Prints one JSON object: losses (also as ``float.hex`` strings), step times, peak_bytes, the
ORT version, the settings applied.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys

MMAP_THRESHOLD = "65536"
# The Module loop and its measurement are ckpt check's own (its Module child runs the same code).
_CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "ckpt_cli", "verify",
                      "module_child.py")


def _module_child():
    """``ckpt_cli/verify/module_child.py`` by path: the training interpreter need not have
    ckpt's dependencies, and that file has none."""
    spec = importlib.util.spec_from_file_location("ckpt_module_child", _CHILD)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def session_options(settings: dict | None):
    """ORT's SessionOptions with one intra-op thread and ``settings`` applied; returns
    (options, applied, ignored)."""
    return _module_child().session_options(settings)


def dims(shape: list, batch: int, seq: int | None = None) -> list[int]:
    out = []
    for d in shape:
        if d in ("seq", "tokens") and seq is not None:
            d = seq * (batch if d == "tokens" else 1)
        elif isinstance(d, str):
            head, _, factor = d.partition("*")
            if head != "batch":
                raise ValueError(f"unknown dimension {d!r} in zoo.json (only batch, batch*N, seq, tokens)")
            d = batch * (int(factor) if factor else 1)
        out.append(int(d))
    return out


def make_batches(zoo: dict, batch: int, steps: int, seed: int, seq: int | None = None) -> list[dict]:
    import numpy as np

    tensors = [*zoo["inputs"], zoo["label"]]
    out = []
    for step in range(steps):
        rng = np.random.RandomState(seed + step)
        feeds = {}
        for t in tensors:
            shape = dims(t["shape"], batch, seq or zoo.get("seq"))
            if t["dtype"].startswith("int"):
                if "bound" not in t:
                    raise ValueError(f"int input {t['name']} has no bound in zoo.json")
                feeds[t["name"]] = rng.randint(0, t["bound"], shape).astype(t["dtype"])
            else:
                feeds[t["name"]] = rng.standard_normal(shape).astype(t["dtype"])
        out.append(feeds)
    return out


def train(art_dir: str, training_model: str, steps: int, settings: dict | None,
          batch: int | None, seed: int, ort_seed: int | None = 0, seq: int | None = None) -> dict:
    import numpy as np
    import onnxruntime as ort

    child = _module_child()
    api = child.import_training("api")
    with open(os.path.join(art_dir, "zoo.json"), encoding="utf-8") as f:
        zoo = json.load(f)
    batch = batch or int(zoo["batch"])
    so, applied, ignored = child.session_options(settings)
    child.seed_ort(ort_seed)
    module, optimizer = child.open_module(api, training_model, os.path.join(art_dir, "checkpoint"),
                                          os.path.join(art_dir, "eval_model.onnx"),
                                          os.path.join(art_dir, "optimizer_model.onnx"), so)
    names = list(module.input_names())
    known = [t["name"] for t in (*zoo["inputs"], zoo["label"])]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise RuntimeError(f"Module inputs {unknown} are not in zoo.json (Module wants {names}, "
                           f"zoo.json has {known})")
    data = [[feeds[n] for n in names] for feeds in make_batches(zoo, batch, steps, seed, seq)]
    measured = child.run_steps(module, optimizer, data, ort_seed)
    return {
        "artifact_dir": art_dir, "training_model": training_model, "steps": steps,
        "batch": batch, "seq": seq or zoo.get("seq"), "seed": seed, "ort_seed": ort_seed, "input_names": names,
        **measured,
        "settings_applied": applied, "settings_ignored": ignored,
        "intra_op_num_threads": so.intra_op_num_threads,
        "ort_version": ort.__version__, "numpy_version": np.__version__,
        "torch_imported": "torch" in sys.modules and sys.modules["torch"] is not None,
        "malloc_mmap_threshold": os.environ.get("MALLOC_MMAP_THRESHOLD_"),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("artifact_dir")
    ap.add_argument("training_model")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--settings", type=json.loads, default=None,
                    help="SessionOptions settings as JSON (ckpt's recorded_settings)")
    ap.add_argument("--batch", type=int, default=None, help="default: zoo.json's batch")
    ap.add_argument("--seq", type=int, default=None, help="default: zoo.json's seq")
    ap.add_argument("--seed", type=int, default=1, help="step i's feeds use seed + i")
    ap.add_argument("--ort-seed", type=int, default=0,
                    help="onnxruntime.set_seed before the Module and the steps; -1: not set")
    ap.add_argument("--allow-torch", action="store_true",
                    help="let onnxruntime import torch (slower start, same results)")
    args = ap.parse_args(argv)
    if argv is None and os.environ.get("MALLOC_MMAP_THRESHOLD_") != MMAP_THRESHOLD:
        # glibc reads it at process start only
        env = dict(os.environ, MALLOC_MMAP_THRESHOLD_=MMAP_THRESHOLD)
        os.execve(sys.executable, [sys.executable, os.path.abspath(__file__), *sys.argv[1:]], env)
    if not args.allow_torch:
        _module_child().keep_torch_out()
    result = train(args.artifact_dir, args.training_model, args.steps, args.settings,
                   args.batch, args.seed, None if args.ort_seed < 0 else args.ort_seed, args.seq)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
