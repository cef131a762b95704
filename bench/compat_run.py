"""The sessions of bench/compat_check.sh, run by the venv under test (no ckpt import).

    python compat_run.py same NAME...   # NAME.ckpt.onnx beside NAME.onnx: every output bit for bit
    python compat_run.py load NAME...   # NAME.ckpt.onnx loads at basic, extended and all

Exit 1 with one line per failure.
"""

from __future__ import annotations

import sys

import numpy as np
import onnxruntime as ort

LEVELS = ("ORT_ENABLE_BASIC", "ORT_ENABLE_EXTENDED", "ORT_ENABLE_ALL")


def session(path: str, level: str = "ORT_ENABLE_ALL") -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    options.intra_op_num_threads = 1  # a reducing ScatterND races on repeated indices with more
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def feeds(s: ort.InferenceSession) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    out = {}
    for i in s.get_inputs():
        shape = [d if isinstance(d, int) else 2 for d in i.shape]
        out[i.name] = rng.integers(0, 4, shape).astype(np.int64) if "int" in i.type \
            else rng.standard_normal(shape).astype(np.float32)
    return out


def same(name: str) -> list[str]:
    original, rewritten = session(f"{name}.onnx"), session(f"{name}.ckpt.onnx")
    names = [o.name for o in original.get_outputs()]
    given = feeds(original)
    a, b = original.run(names, given), rewritten.run(names, given)
    return [f"{name}: output {n} differs" for n, x, y in zip(names, a, b) if x.tobytes() != y.tobytes()]


def load(name: str) -> list[str]:
    failed = []
    for level in LEVELS:
        try:
            session(f"{name}.ckpt.onnx", level)
        except Exception as e:  # noqa: BLE001 - the failure is the finding
            failed.append(f"{name}: does not load at {level} on onnxruntime {ort.__version__}: {str(e)[-200:]}")
    return failed


def main() -> int:
    check = {"same": same, "load": load}[sys.argv[1]]
    failures = [f for name in sys.argv[2:] for f in check(name)]
    for f in failures:
        print(f"compat-check: {f}")
    print(f"compat-check: {sys.argv[1]} on onnxruntime {ort.__version__}: "
          f"{len(sys.argv) - 2 - len({f.split(':')[0] for f in failures})} of {len(sys.argv) - 2} pass")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
