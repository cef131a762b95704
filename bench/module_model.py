"""ckpt's model of the untuned Module session against its measured peak (issue 42).

    python -m bench.module_model ZOO_DIR [NAME ...] [--python PY] [--batch 64] [--model FILE ...] [--predict]

For each zoo artifact folder ``ZOO_DIR/NAME`` (``sample_models/artifact_zoo.py --out-dir``)
and each training model in it (default: ``training_model.onnx`` and, where present,
``rw.onnx`` and ``rwpy.onnx``, ckpt's rewrites): the process peak above the loaded state
that ``bench/zoo_train.py`` measures for ``Module(model, checkpoint, eval)`` untuned, 10
steps at ``--batch`` (read from ``MODEL.meas.json`` beside the model when it is there and
was measured at that batch, else measured now, in ``--python``), and ckpt's prediction
(``ckpt_cli/verify/module_model.py``): the block of the training build's static memory
pattern, the arena's touched bytes and the largest kernel heap scratch, after the 10 steps
measured; and once the arena's placements settle (``settled``, from the run ``after`` on; -:
still moving at the replay's bound). Prints one table; the error is (predicted - measured) /
measured. ``--predict``: the predictions alone, as JSON
(``ckpt check --python`` makes the same prediction beside its Module runs).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import onnx

from ckpt_cli.verify.module_model import predict_module_session

ROOT = Path(__file__).resolve().parent.parent
TRAIN_SCRIPT = ROOT / "bench" / "zoo_train.py"
DEFAULT_PYTHON = str(ROOT.parent / "main" / ".venv-ort-training-full" / "bin" / "python")
MODELS = ("training_model.onnx", "rw.onnx", "rwpy.onnx")
MiB = 2**20
STEPS = 10  # what zoo_train measures, and the prediction is read at


def zoo_dims(folder: Path, model: Path, batch: int, seq: int | None = None) -> dict[str, int]:
    """The graph inputs' symbolic dimensions bound as zoo_train feeds them: zoo.json's shapes
    (``batch``, ``batch*N``, ``seq``, ``tokens``) at ``batch`` and ``seq`` (default: zoo.json's)."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        from zoo_train import dims as feed_dims
    finally:
        sys.path.pop(0)
    zoo = json.loads((folder / "zoo.json").read_text())
    fed = {t["name"]: feed_dims(t["shape"], batch, seq or zoo.get("seq")) for t in (*zoo["inputs"], zoo["label"])}
    bound: dict[str, int] = {}
    for v in onnx.load(str(model), load_external_data=False).graph.input:
        for d, n in zip(v.type.tensor_type.shape.dim, fed.get(v.name, ())):
            if d.HasField("dim_param"):
                bound[d.dim_param] = n
    return bound


def measured(folder: Path, model: Path, batch: int, python: str, seq: int | None = None) -> int:
    cached = model.with_suffix(".meas.json")
    if cached.exists():
        got = json.loads(cached.read_text())
        if got.get("batch") == batch and got.get("steps") == STEPS and (seq is None or got.get("seq") == seq):
            return int(got["peak_bytes"])
    done = subprocess.run([python, str(TRAIN_SCRIPT), str(folder), str(model), "--batch", str(batch),
                           *(("--seq", str(seq)) if seq else ())],
                          capture_output=True, text=True, check=True, env=dict(os.environ))
    got = json.loads(done.stdout.strip().splitlines()[-1])
    cached.write_text(json.dumps(got))
    return int(got["peak_bytes"])


def _one_step(model: Path) -> str:
    """The peak after one step, where ``MODEL.s1.json`` (zoo_train ``--steps 1``) has it."""
    path = model.with_suffix(".s1.json")
    if not path.exists():
        return "-"
    return f"{json.loads(path.read_text())['peak_bytes'] / MiB:.2f}"


def predictions(zoo_dir: Path, names: list[str], files: list[str], batch: int, seq: int | None,
                python: str) -> dict:
    """``{name/file: predicted peak bytes or None}`` for the files that exist."""
    out: dict[str, int | None] = {}
    for name in names:
        for file in files:
            model = zoo_dir / name / file
            if model.exists():
                pred = predict_module_session(model, zoo_dims(zoo_dir / name, model, batch, seq), python)
                out[f"{name}/{file}"] = None if pred is None else pred.after(STEPS)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("zoo_dir", type=Path)
    ap.add_argument("names", nargs="*")
    ap.add_argument("--python", default=DEFAULT_PYTHON, help="an interpreter with onnxruntime-training")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seq", type=int, default=None, help="default: zoo.json's seq")
    ap.add_argument("--model", action="append", default=None, help="training model file names to compare")
    ap.add_argument("--predict", action="store_true",
                    help="only predict: one JSON object, file name -> predicted bytes (null: no prediction)")
    args = ap.parse_args(argv)
    if args.predict:
        print(json.dumps(predictions(args.zoo_dir, args.names, args.model or MODELS, args.batch, args.seq, args.python)))
        return 0
    names = args.names or sorted(p.name for p in args.zoo_dir.iterdir() if (p / "zoo.json").exists())
    print(f"{'model':16} {'file':20} {'measured':>10} {'predicted':>10} {'error':>8} {'block':>9} "
          f"{'1 step':>7} {'pred 1':>7} {'settled':>8} {'after':>6}  (MiB)")
    errors = []
    for name in names:
        folder = args.zoo_dir / name
        for file in args.model or MODELS:
            model = folder / file
            if not model.exists():
                continue
            meas = measured(folder, model, args.batch, args.python, args.seq)
            pred = predict_module_session(model, zoo_dims(folder, model, args.batch, args.seq), args.python)
            if pred is None:
                print(f"{name:16} {file:20} {meas / MiB:10.2f} {'-':>10} {'-':>8} {'-':>9}")
                continue
            at_steps = pred.after(STEPS)
            err = (at_steps - meas) / meas
            errors.append(abs(err))
            one = _one_step(model)
            after = str(len(pred.step_peaks)) if pred.settled else "-"
            print(f"{name:16} {file:20} {meas / MiB:10.2f} {at_steps / MiB:10.2f} {100 * err:+7.1f}% "
                  f"{pred.block_bytes / MiB:9.2f} {one:>7} {pred.first_run_bytes / MiB:7.2f} "
                  f"{pred.peak_bytes / MiB:8.2f} {after:>6}", flush=True)
    if errors:
        print(f"largest |error| {100 * max(errors):.1f}% over {len(errors)} predictions")
    return 0


if __name__ == "__main__":
    sys.exit(main())
