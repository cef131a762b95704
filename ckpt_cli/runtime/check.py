"""Run ONNX graphs on ONNX Runtime in fresh child processes and compare them.

Everything here returns plain data (dicts of str/int/float/bool/list/None, and numpy
arrays for outputs); no reporting or CLI code.  The measuring itself happens in
``worker.py``, a standalone script run as ``[python, worker.py, spec.json]``: a fresh
process per measurement, so arenas, allocator state and VmHWM start clean, and
``--python`` can point at another interpreter with another onnxruntime build.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass

import numpy as np

from . import worker as _worker
from .worker import ckpt_session_settings, ort_default_session_settings, settings_snippet

WORKER_PATH = os.path.abspath(_worker.__file__)

# Set before the child starts: glibc reads it at start-up.  Big buffers then come
# from mmap and go back to the OS on free, which keeps VmHWM honest for the
# process_peak method (ORT_FACTS §4).  Harmless for the profiler method.
CHILD_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536"}

DEFAULT_RTOL = 1e-5
DEFAULT_ATOL = 1e-6

__all__ = [
    "RuntimeCheckError", "RuntimeUnavailable", "RuntimeFailed",
    "run_model", "compare_outputs", "resolve_provider", "probe_provider",
    "check_pair", "order_check", "file_node_order",
    "ckpt_session_settings", "ort_default_session_settings", "settings_snippet",
]


class RuntimeCheckError(RuntimeError):
    """The worker did not produce a measurement.  ``kind`` says why."""

    def __init__(self, kind: str, message: str, stderr: str = ""):
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.stderr = stderr


class RuntimeUnavailable(RuntimeCheckError):
    """The requested execution provider cannot run here (kind provider_unavailable)."""


class RuntimeFailed(RuntimeCheckError):
    """Loading or running failed (kinds load_failed, run_failed, bad_feeds, bad_spec,
    crashed, timeout)."""


@dataclass
class _Child:
    returncode: int
    stdout: str
    stderr: str


def _child_env() -> dict:
    env = dict(os.environ)
    env.update(CHILD_ENV)
    return env


def _spawn(argv: list, timeout: float | None) -> _Child:
    try:
        p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env=_child_env(), timeout=timeout, check=False)
    except subprocess.TimeoutExpired as e:
        err = e.stderr.decode("utf-8", "replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        raise RuntimeFailed("timeout", f"worker ran past {timeout} s", err) from None
    except OSError as e:
        raise RuntimeFailed("load_failed", f"cannot start {argv[0]}: {e}") from None
    return _Child(p.returncode, p.stdout, p.stderr)


def _parse(child: _Child) -> dict:
    lines = [l for l in child.stdout.splitlines() if l.strip()]
    result = None
    if lines:
        try:
            result = json.loads(lines[-1])
        except json.JSONDecodeError:
            result = None
    if not isinstance(result, dict):
        tail = " | ".join(child.stderr.strip().splitlines()[-3:])
        how = (f"killed by signal {-child.returncode}" if child.returncode < 0
               else f"exit code {child.returncode}")
        if child.returncode in (-9, 137):
            how += " (out of memory?)"
        raise RuntimeFailed("crashed", f"worker gave no result ({how}): {tail}", child.stderr)
    if not result.get("ok"):
        kind = result.get("kind", "run_failed")
        cls = RuntimeUnavailable if kind == "provider_unavailable" else RuntimeFailed
        raise cls(kind, result.get("message", "worker failed"), child.stderr)
    return result


def run_model(model_path, feeds_path, *, provider: str, settings: str, runs: int,
              python: str | None = None, outputs_path=None, memory_method: str = "auto",
              extra_outputs=None, timeout: float | None = None,
              intra_op_threads: int = 1, enable_mem_reuse: bool = True) -> dict:
    """Measure one model in a fresh child process; returns the worker's result dict.

    provider: "cpu" or "cuda" (resolve "auto" with ``resolve_provider`` first).
    settings: "ckpt" or "ort_default".  runs: measured runs (plus one warm-up).
    outputs_path: where the child writes the outputs of its last run (.npz), or None.
    Raises RuntimeUnavailable / RuntimeFailed.
    """
    if provider not in ("cpu", "cuda"):
        raise ValueError(f"provider must be 'cpu' or 'cuda' here, not {provider!r}")
    with tempfile.TemporaryDirectory(prefix="ckpt_run_") as tmp:
        spec = {
            "model": os.path.abspath(os.fspath(model_path)),
            "feeds": os.path.abspath(os.fspath(feeds_path)),
            "provider": provider,
            "settings": settings,
            "runs": int(runs),
            "outputs": os.path.abspath(os.fspath(outputs_path)) if outputs_path else None,
            "profile_dir": tmp,
            "intra_op_threads": int(intra_op_threads),
            "memory_method": memory_method,
            "extra_outputs": list(extra_outputs or []),
            "enable_mem_reuse": bool(enable_mem_reuse),
        }
        spec_path = os.path.join(tmp, "spec.json")
        with open(spec_path, "w", encoding="utf-8") as f:
            json.dump(spec, f)
        child = _spawn([python or sys.executable, WORKER_PATH, spec_path], timeout)
    result = _parse(child)
    result["python"] = python or sys.executable
    return result


# --------------------------------------------------------------------------- providers


def _tiny_model_path(directory: str) -> str:
    import onnx
    from onnx import TensorProto, helper

    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="relu")], "probe",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=7)
    path = os.path.join(directory, "probe.onnx")
    onnx.save(m, path)
    return path


@functools.lru_cache(maxsize=8)
def probe_provider(provider: str, python: str | None = None) -> tuple:
    """(usable, reason): can `provider` really create a session under `python`?

    onnxruntime-gpu lists CUDAExecutionProvider even with no GPU or no CUDA
    libraries; the only robust test is to create a session in a child process and
    look at ``get_providers()[0]`` (the wrapper silently falls back to CPU).
    """
    with tempfile.TemporaryDirectory(prefix="ckpt_probe_") as tmp:
        child = _spawn([python or sys.executable, WORKER_PATH, "--probe", provider,
                        _tiny_model_path(tmp)], timeout=300)
    try:
        _parse(child)
    except RuntimeCheckError as e:
        return False, e.message
    return True, ""


def resolve_provider(requested: str = "auto", python: str | None = None) -> str:
    """"cpu" -> "cpu"; "cuda" -> "cuda" (run_model raises RuntimeUnavailable if it
    cannot); "auto" -> "cuda" when a CUDA session really runs on CUDA, else "cpu"."""
    if requested in ("cpu", "cuda"):
        return requested
    if requested != "auto":
        raise ValueError(f"provider must be 'auto', 'cuda' or 'cpu', not {requested!r}")
    ok, _ = probe_provider("cuda", python)
    return "cuda" if ok else "cpu"


# --------------------------------------------------------------------------- outputs


def _diffs(a: np.ndarray, b: np.ndarray):
    """Elementwise (|a-b|, relative diff, |b|) in float64 for same-shape arrays."""
    if a.dtype == np.bool_ or b.dtype == np.bool_:
        a, b = a.astype(np.int8), b.astype(np.int8)
    af, bf = a.astype(np.float64), b.astype(np.float64)
    nan_a, nan_b = np.isnan(af), np.isnan(bf)
    both_nan = nan_a & nan_b
    with np.errstate(invalid="ignore", over="ignore"):
        d = np.abs(af - bf)
        same_inf = np.isinf(af) & np.isinf(bf) & (af == bf)
        d = np.where(both_nan | same_inf, 0.0, d)
        d = np.where(nan_a ^ nan_b, np.inf, d)
        scale = np.maximum(np.abs(af), np.abs(bf))
        rel = np.where(d == 0, 0.0, d / np.where(scale == 0, 1.0, scale))
    return d, rel, np.where(nan_b, 0.0, np.abs(bf))


def compare_outputs(a: dict, b: dict, *, rtol: float = DEFAULT_RTOL,
                    atol: float = DEFAULT_ATOL) -> dict:
    """Compare two {name: array} dicts (a = reference, b = candidate).

    Per output: bit_identical (same dtype, shape and bytes; NaNs with equal bits
    count as identical), max_abs_diff, max_rel_diff (|a-b| / max(|a|,|b|)),
    within_tolerance (|a-b| <= atol + rtol*|b| elementwise, NaN == NaN).
    Outputs present on one side only are listed in missing / extra and count as
    failures.
    """
    per = {}
    for name in a:
        if name not in b:
            continue
        x, y = np.asarray(a[name]), np.asarray(b[name])
        entry = {"dtype": str(x.dtype), "shape": list(x.shape),
                 "bit_identical": False, "max_abs_diff": None, "max_rel_diff": None,
                 "within_tolerance": False}
        if x.shape != y.shape:
            entry["problem"] = f"shape {list(x.shape)} vs {list(y.shape)}"
        elif x.dtype != y.dtype and not (np.issubdtype(x.dtype, np.number)
                                         and np.issubdtype(y.dtype, np.number)):
            entry["problem"] = f"dtype {x.dtype} vs {y.dtype}"
        else:
            entry["bit_identical"] = (x.dtype == y.dtype and
                                      np.ascontiguousarray(x).tobytes()
                                      == np.ascontiguousarray(y).tobytes())
            if x.dtype != y.dtype:
                entry["problem"] = f"dtype {x.dtype} vs {y.dtype}"
            if x.size == 0:
                entry.update(max_abs_diff=0.0, max_rel_diff=0.0, within_tolerance=True)
            else:
                d, rel, mag = _diffs(x, y)
                entry["max_abs_diff"] = float(np.max(d))
                entry["max_rel_diff"] = float(np.max(rel))
                entry["within_tolerance"] = bool(np.all(d <= atol + rtol * mag))
        per[name] = entry
    missing = [n for n in a if n not in b]
    extra = [n for n in b if n not in a]
    abs_diffs = [e["max_abs_diff"] for e in per.values() if e["max_abs_diff"] is not None]
    n_bit = sum(e["bit_identical"] for e in per.values())
    n_tol = sum(e["within_tolerance"] for e in per.values())
    total = len(per) + len(missing) + len(extra)
    return {
        "outputs": per,
        "n_outputs": total,
        "n_bit_identical": n_bit,
        "n_within_tolerance": n_tol,
        "n_failed": total - n_tol,
        "missing": missing,
        "extra": extra,
        "all_bit_identical": n_bit == total,
        "all_within_tolerance": n_tol == total,
        "max_abs_diff": max(abs_diffs) if abs_diffs else (None if total else 0.0),
        "rtol": rtol,
        "atol": atol,
    }


def _load_npz(path) -> dict:
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


# --------------------------------------------------------------------------- order


def file_node_order(model_path) -> list:
    """Node names of the main graph in file order (no tensor data is read)."""
    import onnx

    m = onnx.load(os.fspath(model_path), load_external_data=False)
    return [n.name for n in m.graph.node]


def order_check(file_order: list, executed: list) -> dict:
    """Does the executed order follow the file order?

    Compared on the nodes present in both: ORT runs no kernel for Constant nodes
    (they become initializers), and unnamed nodes get generated names in the
    profile, so both are left out of the comparison and listed instead.
    """
    executed_set = set(executed)
    file_set = set(file_order)
    a = [n for n in file_order if n in executed_set]
    b = [n for n in executed if n in file_set]
    mismatch = None
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            mismatch = {"position": i, "file": x, "executed": y}
            break
    if mismatch is None and len(a) != len(b):  # duplicate names
        mismatch = {"position": min(len(a), len(b)), "file": None, "executed": None}
    not_executed = [n for n in file_order if n not in executed_set]
    return {
        "matches": mismatch is None,
        "compared": min(len(a), len(b)),
        "first_mismatch": mismatch,
        "not_executed": not_executed[:50],
        "n_not_executed": len(not_executed),
        "not_in_file": [n for n in executed if n not in file_set][:50],
        "n_not_in_file": sum(1 for n in executed if n not in file_set),
    }


# --------------------------------------------------------------------------- pair


def _summary(r: dict) -> dict:
    return {k: r.get(k) for k in ("peak_bytes", "time_s", "baseline_bytes", "peak_requested_bytes",
                                  "peak_above_baseline_bytes", "method", "runs",
                                  "provider", "ort_version", "warnings")}


def check_pair(original, rewritten, feeds_path, *, provider: str = "auto", runs: int = 3,
               python: str | None = None, rtol: float = DEFAULT_RTOL,
               atol: float = DEFAULT_ATOL, timeout: float | None = None,
               with_ort_default: bool = True, enable_mem_reuse: bool = True) -> dict:
    """Run original and rewritten graphs under the "ckpt" settings (and the original
    under ORT's defaults), compare outputs and check the rewritten graph's executed
    order against its file order.

    Returns {"provider", "outputs_equal" (all bit-identical), "outputs_within_tolerance",
    "max_abs_diff", "outputs" (per output), "comparison" (compare_outputs result),
    "original", "rewritten", "original_ort_default" (None if skipped),
    "ort_default_vs_ckpt" (output comparison summary), "order_matches", "order",
    "session_settings", "settings_snippet"}.
    """
    prov = resolve_provider(provider, python)
    with tempfile.TemporaryDirectory(prefix="ckpt_check_") as tmp:
        o_out = os.path.join(tmp, "original.npz")
        r_out = os.path.join(tmp, "rewritten.npz")
        orig = run_model(original, feeds_path, provider=prov, settings="ckpt", runs=runs,
                         python=python, outputs_path=o_out, timeout=timeout, enable_mem_reuse=enable_mem_reuse)
        rew = run_model(rewritten, feeds_path, provider=prov, settings="ckpt", runs=runs,
                        python=python, outputs_path=r_out, timeout=timeout, enable_mem_reuse=enable_mem_reuse)
        o_vals, r_vals = _load_npz(o_out), _load_npz(r_out)
        default = None
        default_cmp = None
        if with_ort_default:
            d_out = os.path.join(tmp, "default.npz")
            default = run_model(original, feeds_path, provider=prov, settings="ort_default",
                                runs=runs, python=python, outputs_path=d_out, timeout=timeout)
            dc = compare_outputs(o_vals, _load_npz(d_out), rtol=rtol, atol=atol)
            default_cmp = {k: dc[k] for k in ("all_bit_identical", "all_within_tolerance",
                                              "max_abs_diff", "n_failed")}
    cmp = compare_outputs(o_vals, r_vals, rtol=rtol, atol=atol)
    order = order_check(file_node_order(rewritten), rew["executed_order"])
    return {
        "provider": prov,
        "outputs_equal": cmp["all_bit_identical"],
        "outputs_within_tolerance": cmp["all_within_tolerance"],
        "max_abs_diff": cmp["max_abs_diff"],
        "outputs": cmp["outputs"],
        "comparison": {k: v for k, v in cmp.items() if k != "outputs"},
        "original": _summary(orig),
        "rewritten": _summary(rew),
        "original_ort_default": _summary(default) if default is not None else None,
        "ort_default_vs_ckpt": default_cmp,
        "order_matches": order["matches"],
        "order": order,
        "session_settings": dict(ckpt_session_settings(prov), enable_mem_reuse=enable_mem_reuse),
        "settings_snippet": settings_snippet(prov, enable_mem_reuse),
    }
