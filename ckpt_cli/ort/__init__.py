"""What is specific to ONNX Runtime: the ops it registers beyond onnx's own schemas."""

from __future__ import annotations

import sys
from types import ModuleType

import onnx

from ..background import can_fork
from ..errors import RuntimeUnavailable

# ORT 1.31 refuses IR versions above 13; onnx 1.23 writes IR 14 by default.
_PREFERRED_IR = 10
_MAX_ORT_IR = 13

_INSTALL = ("onnxruntime is not installed in this Python ({why}); ckpt needs it: "
            "pip install onnxruntime-gpu (CUDA and CPU) or onnxruntime (CPU only)")


def ort_module() -> ModuleType:
    """``onnxruntime``, or RuntimeUnavailable saying what to install."""
    try:
        import onnxruntime
    except ImportError as e:
        raise RuntimeUnavailable("provider_unavailable", _INSTALL.format(why=e)) from e
    module: ModuleType = onnxruntime  # untyped to mypy (no stubs): a module all the same
    return module


def asked_in_a_child() -> bool:
    """Whether ORT's work (a session to load or resolve a graph) goes to a forked child
    (``background.Background``): where one can run and this process has not imported ORT.
    A process that has holds ORT's environment and maybe its threads, whose locks a forked
    child could find held; and it pays nothing more to ask here."""
    return can_fork() and "onnxruntime" not in sys.modules


def output_ir_version(model: onnx.ModelProto) -> int:
    """The IR version ckpt writes ``model`` at: one ORT loads, as low as its opsets allow."""
    try:
        needed = onnx.helper.find_min_ir_version_for(list(model.opset_import), ignore_unknown=True)
    except Exception:  # noqa: BLE001 - opsets onnx cannot place (newer than it knows): the preferred IR
        needed = _PREFERRED_IR
    return min(model.ir_version, max(_PREFERRED_IR, needed), _MAX_ORT_IR)
