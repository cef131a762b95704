"""The ONNX Runtime session a ckpt-written model needs, read from the model itself.

Every rewrite records what it was planned for in the model's ``metadata_props``
(``ckpt.enable_mem_reuse`` today). ``session_options(path)`` turns that into an
``onnxruntime.SessionOptions``, so a training loop never copies settings by hand.
"""

from __future__ import annotations

import json
from pathlib import Path

import onnx

from ..errors import ModelError
from ..markers import MEM_PATTERN_META, MEM_REUSE_META, ORT_OPTIMIZE_META, SESSION_META
from ..io.serialize import read_model
from ..verify.settings import ckpt_session_settings, ort_default_session_settings


def recorded_settings(path: str | Path) -> dict:
    """The session settings recorded in a ckpt-written model (plain data, no ORT import).
    A model ckpt did not write gets the settings ckpt's check runs originals with."""
    try:
        model = read_model(path, embedded_weights=False)  # its metadata: the weights are not read
    except Exception as e:  # noqa: BLE001 - any decode failure: not a model
        raise ModelError(f"{path}: not a readable ONNX model ({type(e).__name__})") from None
    meta = {p.key: p.value for p in model.metadata_props}
    # With ckpt's input that turns the memory pattern off, ORT runs without it whatever is set.
    pattern = ({"enable_mem_pattern": False, "mem_pattern_off_input": meta[MEM_PATTERN_META]}
               if MEM_PATTERN_META in meta else {})
    if meta.get(SESSION_META) == "ort_default":  # ckpt changed nothing that needs settings
        return dict(ort_default_session_settings("cpu"), enable_mem_reuse=True, **pattern)
    optimized = _ort_optimized(meta, path)
    # A graph ORT optimized offline holds its fusions already: ORT_DISABLE_ALL runs it as
    # written, on the provider it was optimized for (fused kernels are provider-specific).
    settings = ckpt_session_settings(optimized["provider"] if optimized else "cpu")
    settings["enable_mem_reuse"] = meta.get(MEM_REUSE_META, "1") != "0"
    if optimized:
        settings["ort_optimize"] = optimized
    return {**settings, **pattern}


_LEVELS = ("ORT_ENABLE_BASIC", "ORT_ENABLE_EXTENDED", "ORT_ENABLE_ALL")


def ort_optimized(model: onnx.ModelProto, path) -> dict | None:
    """What ``--ort-optimize`` recorded in ``model`` (provider, level, onnxruntime), or None."""
    return _ort_optimized({p.key: p.value for p in model.metadata_props}, path)


def _ort_optimized(meta: dict[str, str], path) -> dict | None:
    if ORT_OPTIMIZE_META not in meta:
        return None
    try:
        value = json.loads(meta[ORT_OPTIMIZE_META])
        if value["provider"] in ("cpu", "cuda") and value["level"] in _LEVELS:
            return value
    except (ValueError, TypeError, KeyError):
        pass
    raise ModelError(f"{path}: metadata {ORT_OPTIMIZE_META} is not what ckpt writes ({meta[ORT_OPTIMIZE_META][:80]!r})")


def session_options(path: str | Path):
    """An ``onnxruntime.SessionOptions`` for the model at ``path``, as ckpt planned it:
    file order executed (PRIORITY_BASED), graph kept as written, and the buffer-reuse
    setting the rewrite chose."""
    import onnxruntime as ort

    s = recorded_settings(path)
    so = ort.SessionOptions()
    so.execution_order = getattr(ort.ExecutionOrder, s["execution_order"])
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, s["graph_optimization_level"])
    so.enable_mem_pattern = bool(s["enable_mem_pattern"])
    so.enable_mem_reuse = bool(s["enable_mem_reuse"])
    so.enable_cpu_mem_arena = bool(s["enable_cpu_mem_arena"])
    for k, v in s["config_entries"].items():
        so.add_session_config_entry(k, v)
    return so
