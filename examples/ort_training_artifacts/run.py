"""ORT training artifacts -> ckpt rewrite -> onnxruntime.training.api.Module, original vs rewrite.

    python run.py --python PATH/TO/TRAINING/python [--steps 20] [--out out/recipe-ort-training]
    make recipe-ort-training        # the same, building .venv-ort-training if it is missing

Runs in ckpt's environment; ``--python`` is an interpreter with onnxruntime-training-cpu 1.19.2
and numpy<2 (see ``artifacts.py``, which it runs):
  1. ``artifacts.py make``: a residual MLP through ``generate_artifacts``.
  2. ``ckpt rewrite training_model.onnx -o training_model.ckpt.onnx``.
  3. ``artifacts.py train``, each in a fresh process, 4 runs from the same checkpoint and batches:
       original @ Module defaults    the Module API's own session (ORT's defaults)
       rewrite @ Module defaults     the rewrite, same untuned session
       original @ rewrite's          ``Module(..., session_options=...)`` with the settings
                                     ``ckpt_cli.session_options(rewrite)`` returns
       rewrite @ its settings        the rewrite with its own settings
Printed: the loss curves, whether they are bit-identical, and the process peak of each run
(VmHWM above the state before training: activations, gradients and ORT's arena growth).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys

import ckpt_cli

HERE = os.path.dirname(os.path.abspath(__file__))
SETTINGS = ("execution_order", "graph_optimization_level", "enable_mem_pattern",
            "enable_mem_reuse", "enable_cpu_mem_arena")


def settings_of(model):
    """The attributes of ``ckpt_cli.session_options(model)`` as JSON-able data, to hand to the
    training interpreter (an ``onnxruntime.SessionOptions`` cannot cross venvs)."""
    so = ckpt_cli.session_options(model)
    out = {}
    for key in SETTINGS:
        value = getattr(so, key)
        out[key] = value.name if hasattr(value, "name") else value
    return out


def _run(python, *args):
    # MALLOC_MMAP_THRESHOLD_ must be set when the process starts: buffers above 64 KiB then
    # come from mmap and go back to the system when freed, so VmHWM sees each run's peak
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    r = subprocess.run([python, os.path.join(HERE, "artifacts.py"), *args], env=env,
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"artifacts.py {args[0]} failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def make_and_rewrite(python, out, ckpt=("ckpt",)):
    """Artifacts in ``out`` and the rewritten training model; returns (original, rewrite).
    ``ckpt`` is the command that runs ckpt, as a list."""
    shutil.rmtree(out, ignore_errors=True)
    _run(python, "make", out)
    original = os.path.join(out, "training_model.onnx")
    rewrite = os.path.join(out, "training_model.ckpt.onnx")
    subprocess.run([*ckpt, "rewrite", original, "-o", rewrite, "-q"], check=True)
    return original, rewrite


def runs(python, out, original, rewrite, steps=20):
    settings = json.dumps(settings_of(rewrite))
    plan = [
        ("original @ Module defaults", original, []),
        ("rewrite @ Module defaults", rewrite, []),
        ("original @ rewrite's", original, ["--settings", settings]),
        ("rewrite @ its settings", rewrite, ["--settings", settings]),
    ]
    return {label: _run(python, "train", out, model, "--steps", str(steps), *extra)
            for label, model, extra in plan}


def report(results):
    base = results["original @ Module defaults"]
    steps = len(base["losses"])
    head, tail = min(5, steps), min(3, max(0, steps - 5))
    print(f"loss, steps 1-{head}" + (f" ... {steps - tail + 1}-{steps}" if tail else ""))
    for label, r in results.items():
        losses = " ".join(f"{x:.6f}" for x in r["losses"][:head])
        if tail:
            losses += " ... " + " ".join(f"{x:.6f}" for x in r["losses"][-tail:])
        print(f"  {label:<27} {losses}")
    for a, b in [("rewrite @ Module defaults", "original @ Module defaults"),
                 ("rewrite @ its settings", "original @ rewrite's"),
                 ("rewrite @ its settings", "original @ Module defaults")]:
        la, lb = results[a]["losses"], results[b]["losses"]
        rel = max(abs(x - y) / abs(y) for x, y in zip(la, lb))
        verdict = "bit-identical" if la == lb else f"max relative difference {rel:.1e}"
        print(f"{a} vs {b}: {verdict}")
    print("process peak above the loaded state (VmHWM - VmRSS), median step time")
    for label, r in results.items():
        peak = r["process_peak_bytes"]
        print(f"  {label:<27} {peak / 2**20:7.2f} MiB  {peak / base['process_peak_bytes']:.2f}x  "
              f"{1e3 * statistics.median(r['step_s']):6.1f} ms")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", required=True,
                    help="interpreter with onnxruntime-training-cpu 1.19.2 and numpy<2")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--out", default=os.path.join("out", "recipe-ort-training"))
    beside = os.path.join(os.path.dirname(sys.executable), "ckpt")
    ap.add_argument("--ckpt", default=beside if os.path.exists(beside) else "ckpt",
                    help="the ckpt command (default: the one installed with this Python)")
    args = ap.parse_args(argv)
    original, rewrite = make_and_rewrite(args.python, args.out, [args.ckpt])
    report(runs(args.python, args.out, original, rewrite, args.steps))


if __name__ == "__main__":
    sys.exit(main())
