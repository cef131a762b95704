"""The ONNX Runtime session a ckpt-written model needs, read from the model itself.

Every rewrite records what it was planned for in the model's ``metadata_props``
(``ckpt.enable_mem_reuse`` today). ``recorded_settings(path)`` reads that back as plain
data; ``ckpt_cli.session_options(path)`` (``session.py``) turns it into an
``onnxruntime.SessionOptions``, so a training loop never copies settings by hand.
"""

from __future__ import annotations

import os
from typing import Any

import onnx

from ..errors import ModelError
from ..markers import SessionPlan
from ..ort.settings import ckpt_session_settings, ort_default_session_settings
from .serialize import read_model


def recorded_settings(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The session settings recorded in a ckpt-written model (plain data, no ORT import).
    A model ckpt did not write gets the settings ckpt's check runs originals with."""
    if not isinstance(path, (str, os.PathLike)):  # a ModelProto's text would fill the message
        raise TypeError(f"expected the path of a model file, got {type(path).__name__}")
    try:
        model = read_model(path, embedded_weights=False)  # its metadata: the weights are not read
    except Exception as e:  # any decode failure: not a model
        raise ModelError(f"{path}: not a readable ONNX model ({type(e).__name__})") from e
    plan = SessionPlan.read(model, path)
    # With ckpt's input that turns the memory pattern off, ORT runs without it whatever is set.
    pattern = ({"enable_mem_pattern": False, "mem_pattern_off_input": plan.mem_pattern_off_input}
               if plan.mem_pattern_off_input is not None else {})
    if plan.session == "ort_default":  # ckpt changed nothing that needs settings
        return dict(ort_default_session_settings("cpu"), enable_mem_reuse=True, **pattern)
    optimized = plan.ort_optimize
    # A graph ORT optimized offline holds its fusions already: ORT_DISABLE_ALL runs it as
    # written, on the provider it was optimized for (fused kernels are provider-specific).
    settings = ckpt_session_settings(optimized["provider"] if optimized else "cpu")
    settings["enable_mem_reuse"] = plan.mem_reuse
    settings["enable_cpu_mem_arena"] = plan.mem_arena
    if optimized:
        settings["ort_optimize"] = optimized
    return {**settings, **pattern}


def ort_optimized(model: onnx.ModelProto, path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """What ``--ort-optimize`` recorded in ``model`` (provider, level, onnxruntime), or None."""
    return SessionPlan.read(model, path).ort_optimize
