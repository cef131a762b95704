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

from ..errors import RunFailed, RuntimeCheckError, RuntimeUnavailable
from . import worker as _worker
from .compare import DEFAULT_ATOL, DEFAULT_RTOL, compare_outputs, order_check
from .settings import settings_for, settings_snippet

WORKER_PATH = os.path.abspath(_worker.__file__)

# Set before the child starts: glibc reads it at start-up.  Big buffers then come
# from mmap and go back to the OS on free, which keeps VmHWM honest for the
# process_peak method (without it a second run under-reads).  Harmless for the profiler method.
CHILD_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536"}

# One measured child (warm-up plus runs) may take this long by default: a hung or
# thrashing ORT must end in an error, not hold CI.
DEFAULT_TIMEOUT_S = 600.0


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
        raise RunFailed("timeout", f"ONNX Runtime ran past the {timeout:g} s timeout (--timeout)", err) from None
    except OSError as e:
        raise RunFailed("load_failed", f"cannot start {argv[0]}: {e.strerror or e}") from None
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
        raise RunFailed("crashed", f"worker gave no result ({how}): {tail}", child.stderr)
    if not result.get("ok"):
        kind = result.get("kind", "run_failed")
        cls = RuntimeUnavailable if kind == "provider_unavailable" else RunFailed
        raise cls(kind, result.get("message", "worker failed"), child.stderr)
    return result


def run_model(model_path, feeds_path, *, provider: str, settings: str = "ckpt", runs: int = 3,
              python: str | None = None, outputs_path=None, memory_method: str = "auto",
              extra_outputs=None, timeout: float | None = DEFAULT_TIMEOUT_S,
              intra_op_threads: int = 1, enable_mem_reuse: bool = True, session: dict | None = None,
              seed: int = 0) -> dict:
    """Measure one model in a fresh child process; returns the worker's result dict.

    provider: "cpu" or "cuda" (resolve "auto" with ``resolve_provider`` first).
    settings: a name for ``settings.settings_for`` ("ckpt", "ort_default", ...), or
    ``session``: the settings dict itself.  runs: measured runs (plus one warm-up).
    outputs_path: where the child writes the outputs of its last run (.npz), or None.
    seed: ORT's random seed in the child (random ops draw the same in every child).
    Raises RuntimeUnavailable / RunFailed.
    """
    if provider not in ("cpu", "cuda"):
        raise ValueError(f"provider must be 'cpu' or 'cuda' here, not {provider!r}")
    with tempfile.TemporaryDirectory(prefix="ckpt_run_") as tmp:
        spec = {
            "model": os.path.abspath(os.fspath(model_path)),
            "feeds": os.path.abspath(os.fspath(feeds_path)),
            "provider": provider,
            "session": session if session is not None else settings_for(settings, provider, enable_mem_reuse),
            "runs": int(runs),
            "outputs": os.path.abspath(os.fspath(outputs_path)) if outputs_path else None,
            "profile_dir": tmp,
            "intra_op_threads": int(intra_op_threads),
            "memory_method": memory_method,
            "extra_outputs": list(extra_outputs or []),
            "seed": int(seed),
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


def _load_npz(path) -> dict:
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def file_node_order(model_path) -> list:
    """Node names of the main graph in file order (no tensor data is read)."""
    return [n.name for n in _file_nodes(model_path)]


def kernelless_nodes(model_path) -> set[str]:
    """Nodes of the file ORT runs no kernel for: Constant nodes become initializers."""
    return {n.name for n in _file_nodes(model_path) if n.op_type == "Constant" and n.domain in ("", "ai.onnx")}


def _file_nodes(model_path):
    import onnx

    return onnx.load(os.fspath(model_path), load_external_data=False).graph.node


# --------------------------------------------------------------------------- pair


def _summary(r: dict) -> dict:
    return {k: r.get(k) for k in ("peak_bytes", "time_s", "baseline_bytes", "peak_requested_bytes",
                                  "peak_above_baseline_bytes", "method", "runs",
                                  "provider", "ort_version", "warnings")}


def _run_to_run_spread(original, feeds_path, prov: str, o_vals: dict, r_vals: dict, tmp: str, *, python,
                       timeout, seed: int, reuse: bool, level: str | None) -> dict:
    """Run the original once more, in a fresh process with the other buffer-reuse setting
    (other addresses, same arithmetic). Per output that differs in either comparison: the
    original's own spread, the rewrite's difference, and whether that is within the
    default tolerance. The check judges them (``verify.stage``)."""
    again = os.path.join(tmp, "original_again.npz")
    session = dict(settings_for("ckpt", prov, not reuse))
    if level is not None:
        session["graph_optimization_level"] = level
    run_model(original, feeds_path, provider=prov, runs=1, python=python, outputs_path=again,
              timeout=timeout, seed=seed, session=session)
    noise = compare_outputs(o_vals, _load_npz(again), rtol=DEFAULT_RTOL, atol=DEFAULT_ATOL)["outputs"]
    diff = compare_outputs(o_vals, r_vals, rtol=DEFAULT_RTOL, atol=DEFAULT_ATOL)["outputs"]
    return {name: {"original_spread": noise.get(name, {}).get("max_abs_diff") or 0.0,
                   "rewrite_diff": d["max_abs_diff"] or 0.0, "within_tolerance": d["within_tolerance"],
                   "bit_identical": d["bit_identical"]}
            for name, d in diff.items()
            if not d["bit_identical"] or not noise.get(name, {}).get("bit_identical", True)}


def check_pair(original, rewritten, feeds_path, *, provider: str = "auto", runs: int = 3,
               python: str | None = None, rtol: float = DEFAULT_RTOL,
               atol: float = DEFAULT_ATOL, timeout: float | None = DEFAULT_TIMEOUT_S,
               with_ort_default: bool = True, enable_mem_reuse: bool = True, seed: int = 0,
               expected_order: list[str] | None = None, reference_level: str | None = None) -> dict:
    """Run original and rewritten graphs under the "ckpt" settings, and both under ORT's
    defaults (an untouched session: what a user gets without ckpt, and what a user who
    loads the rewrite without ckpt's settings gets); compare outputs and check the
    rewritten graph's executed order against ``expected_order`` (node names; default:
    its file order).

    Returns {"provider", "outputs_equal" (all bit-identical), "outputs_within_tolerance",
    "max_abs_diff", "outputs" (per output), "comparison" (compare_outputs result),
    "original", "rewritten", "original_ort_default", "rewritten_ort_default" (None if
    skipped), "ort_default_vs_ckpt" (output comparison summary), "order_matches",
    "order", "session_settings", "settings_snippet"}.

    ``reference_level`` (a rewritten file ORT optimized offline at that level): the outputs
    are compared with the original run at that level, whose fusions round as the file's
    do; "unoptimized_vs_rewritten" then summarises the comparison with the original as is.
    """
    prov = resolve_provider(provider, python)

    def measure(model, settings: str, out: str | None) -> dict:
        return run_model(model, feeds_path, provider=prov, settings=settings, runs=runs, python=python,
                         outputs_path=out, timeout=timeout, enable_mem_reuse=enable_mem_reuse, seed=seed)

    with tempfile.TemporaryDirectory(prefix="ckpt_check_") as tmp:
        o_out = os.path.join(tmp, "original.npz")
        r_out = os.path.join(tmp, "rewritten.npz")
        orig = measure(original, "ckpt", o_out)
        rew = measure(rewritten, "ckpt", r_out)
        o_vals, r_vals = _load_npz(o_out), _load_npz(r_out)
        unoptimized_cmp = None
        if reference_level is not None:
            ref_out = os.path.join(tmp, "reference.npz")
            run_model(original, feeds_path, provider=prov, runs=1, python=python, outputs_path=ref_out,
                      timeout=timeout, seed=seed, session=dict(settings_for("ckpt", prov, enable_mem_reuse),
                                                               graph_optimization_level=reference_level))
            uc = compare_outputs(o_vals, r_vals, rtol=rtol, atol=atol)
            unoptimized_cmp = {k: uc[k] for k in ("all_bit_identical", "all_within_tolerance", "max_abs_diff",
                                                  "n_failed")}
            o_vals = _load_npz(ref_out)
        default = rew_default = default_cmp = None
        if with_ort_default:
            d_out = os.path.join(tmp, "default.npz")
            default = measure(original, "ort_default", d_out)
            try:
                rew_default = measure(rewritten, "ort_default", None)
            except RunFailed as e:  # a finding about the rewrite, not a reason to stop the check
                rew_default = {"failed": f"{e.kind}: {e.message}"}
            dc = compare_outputs(o_vals, _load_npz(d_out), rtol=rtol, atol=atol)
            default_cmp = {k: dc[k] for k in ("all_bit_identical", "all_within_tolerance",
                                              "max_abs_diff", "n_failed")}
        cmp = compare_outputs(o_vals, r_vals, rtol=rtol, atol=atol)
        spread = None
        if not cmp["all_bit_identical"] and rtol == 0 and atol == 0:
            spread = _run_to_run_spread(original, feeds_path, prov, o_vals, r_vals, tmp, python=python,
                                        timeout=timeout, seed=seed, reuse=enable_mem_reuse, level=reference_level)
    order = order_check(expected_order or file_node_order(rewritten), rew["executed_order"],
                        rew.get("executed_ops"), rew.get("executed_providers"), kernelless_nodes(rewritten))
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
        "rewritten_ort_default": (_summary(rew_default) if rew_default is not None and "failed" not in rew_default
                                  else None),
        "rewritten_ort_default_error": rew_default.get("failed") if rew_default is not None else None,
        "rewritten_ort_default_order": (rew_default.get("executed_order") if rew_default is not None
                                        and "failed" not in rew_default else None),
        "ort_default_vs_ckpt": default_cmp,
        "reference_level": reference_level,
        "unoptimized_vs_rewritten": unoptimized_cmp,
        "run_to_run": spread,
        "order_matches": order["matches"],
        "order": order,
        "session_settings": settings_for("ckpt", prov, enable_mem_reuse),
        "settings_snippet": settings_snippet(prov, enable_mem_reuse),
    }
