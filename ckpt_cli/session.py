"""``session_options(path)``: the ONNX Runtime SessionOptions a ckpt-written model needs,
from the settings it records (``io/session.py``). Part of the public API
(``ckpt_cli.session_options``); light to import: it reads the file's metadata only.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from .io.session import recorded_settings

if TYPE_CHECKING:
    import onnxruntime


def session_options(path: str | Path) -> onnxruntime.SessionOptions:
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
