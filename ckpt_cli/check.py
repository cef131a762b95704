"""The check stage: run original and rewritten graphs on ONNX Runtime and compare.

This is the library entry point behind ``ckpt check`` and ``ckpt rewrite --check``;
the measuring itself happens in child processes (``runtime/worker.py``).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from .analysis import Analysis
from .errors import CkptError, EXIT_FAILED, ModelError, RuntimeUnavailable, UsageError
from .runtime import check as rt
from .runtime.feeds import FeedError, load_feeds, make_feeds, save_feeds


PROCESS_PEAK_NOISE_BYTES = 256 * 1024


class RunFailed(CkptError):
    exit_code = EXIT_FAILED


def prepare_feeds(model, out_path: Path, seed: int, dims: dict[str, int], feeds_file: Path | None) -> None:
    try:
        feeds = load_feeds(feeds_file, model) if feeds_file is not None else make_feeds(model, seed, dims)
    except FeedError as e:
        raise UsageError(str(e)) from None
    save_feeds(out_path, feeds)


def _noise(measured: dict, reference: int) -> int:
    """Bytes below which a rise is measurement noise. The profiler's arena figures are
    exact; the process-peak fallback (ORT builds without profiler memory fields) reads
    page-granular RSS with allocator noise of a few pages."""
    if measured.get("method") != "process_peak":
        return 0
    return max(PROCESS_PEAK_NOISE_BYTES, int(0.02 * reference))


def _relative_error(predicted: int, measured: int | None) -> float | None:
    return None if not measured else (predicted - measured) / measured


def _side(summary: dict | None, requested: int | None) -> dict | None:
    if summary is None:
        return None
    return {
        "peak_bytes": summary["peak_bytes"],
        "peak_above_baseline_bytes": summary["peak_above_baseline_bytes"],
        "peak_requested_bytes": requested,
        "time_s": summary["time_s"],
        "method": summary["method"],
        "runs": summary["runs"],
    }


def run_check(original: Analysis, rewritten: Analysis, *, provider: str = "auto", runs: int = 3, seed: int = 0,
              dims: dict[str, int] | None = None, feeds_file: Path | None = None, python: str | None = None,
              rtol: float | None = None, atol: float | None = None) -> dict:
    """Measure both graphs and return the check's figures (the ``ckpt check --json`` body).

    Outputs must be bit-identical unless ``rtol``/``atol`` are given. Memory is compared
    on the arena's bytes in use (``peak_bytes``). Both graphs run with the buffer-reuse
    setting the rewritten model asks for; the predictions (tensor bytes requested, and
    the arena's bytes in use) are made for that setting.
    """
    tolerant = rtol is not None or atol is not None
    with tempfile.TemporaryDirectory(prefix="ckpt_feeds_") as tmp:
        feeds_path = Path(tmp) / "feeds.npz"
        prepare_feeds(original.graph.model, feeds_path, seed, dims or {}, feeds_file)
        try:
            result = rt.check_pair(original.graph.path, rewritten.graph.path, feeds_path, provider=provider,
                                   runs=runs, python=python, rtol=rtol or 0.0, atol=atol or 0.0,
                                   enable_mem_reuse=rewritten.reuse_buffers)
        except rt.RuntimeUnavailable as e:
            raise RuntimeUnavailable(f"ONNX Runtime provider '{provider}' is unavailable: {e.message}") from None
        except rt.RuntimeFailed as e:
            if e.kind == "load_failed" and "not a registered function/op" in e.message:
                raise RuntimeUnavailable(f"this onnxruntime cannot load the model ({e.message}); run the check "
                                         "with --python pointing at an environment with the ORT build that "
                                         "has these ops (e.g. onnxruntime-training)") from None
            if e.kind == "bad_feeds":
                raise UsageError(e.message) from None
            if e.kind == "load_failed":
                raise ModelError(f"ONNX Runtime cannot load the model: {e.message}") from None
            raise RunFailed(f"ONNX Runtime failed ({e.kind}): {e.message}") from None

    # Both graphs ran with the session settings the rewritten one asks for.
    mode = rewritten.reuse_buffers
    sides = {"original": original, "rewritten": rewritten}
    predicted = {k: x.profile(mode).activation_peak_bytes for k, x in sides.items()}
    in_use = {k: x.arena_in_use(mode) for k, x in sides.items()}
    measured_tensor_bytes = {}
    for side in ("original", "rewritten"):
        s = result[side]
        req = s.get("peak_requested_bytes")
        base = s.get("baseline_bytes") or 0
        measured_tensor_bytes[side] = (req - base) if req is not None else s.get("peak_above_baseline_bytes")
    outputs_ok = result["outputs_within_tolerance"] if tolerant else result["outputs_equal"]
    o_peak, r_peak = result["original"]["peak_bytes"], result["rewritten"]["peak_bytes"]
    memory_ok = o_peak is None or r_peak is None or r_peak <= o_peak + _noise(result["rewritten"], o_peak)
    return {
        "provider": result["provider"],
        "ort_version": result["rewritten"].get("ort_version"),
        "outputs_equal": result["outputs_equal"],
        "outputs_within_tolerance": result["outputs_within_tolerance"],
        "tolerance": {"rtol": rtol, "atol": atol} if tolerant else None,
        "max_abs_diff": result["max_abs_diff"],
        "outputs": result["outputs"],
        "original": _side(result["original"], measured_tensor_bytes["original"]),
        "rewritten": _side(result["rewritten"], measured_tensor_bytes["rewritten"]),
        "original_ort_default": _side(result["original_ort_default"], None),
        "order_matches": result["order_matches"],
        "order": result["order"],
        "predicted": predicted,
        "prediction_error": {k: _relative_error(predicted[k], measured_tensor_bytes[k]) for k in predicted},
        "predicted_in_use": in_use,
        "prediction_error_in_use": {k: _relative_error(in_use[k], result[k]["peak_bytes"]) for k in in_use},
        "memory_lower": memory_ok,
        "enable_mem_reuse": rewritten.reuse_buffers,
        "passed": bool(outputs_ok and memory_ok),
    }
