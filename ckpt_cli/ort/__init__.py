"""What is specific to ONNX Runtime: the ops it registers beyond onnx's own schemas."""

from __future__ import annotations

from ..errors import RuntimeUnavailable

_INSTALL = ("onnxruntime is not installed in this Python ({why}); ckpt needs it: "
            "pip install onnxruntime-gpu (CUDA and CPU) or onnxruntime (CPU only)")


def ort_module():
    """``onnxruntime``, or RuntimeUnavailable saying what to install."""
    try:
        import onnxruntime
    except ImportError as e:
        raise RuntimeUnavailable("provider_unavailable", _INSTALL.format(why=e)) from None
    return onnxruntime
