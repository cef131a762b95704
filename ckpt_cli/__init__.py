"""ckpt: a gradient-checkpointing compiler for ONNX training graphs.

The library is a one-way pipeline of small stages, each a function over a
:class:`~ckpt_cli.graph.Graph`::

    load -> analysis -> planning -> rewrite -> save -> verify -> report

``ckpt_cli.api`` runs it in one call per command, on a path or an ``onnx.ModelProto``
(``inspect_model``, ``plan_model``, ``rewrite_model``, ``check_models``, re-exported
here), each taking its options as one frozen value (``ckpt_cli.options``: AnalysisOptions,
PlanOptions, RewriteOptions, CheckOptions) or as keywords; ``session_options(path)`` gives the ``onnxruntime.SessionOptions`` a written
model needs; ``export_training_graph(model, example_inputs, path)`` writes a PyTorch module's
training graph (needs torch: ``pip install 'onnx-ckpt[torch]'``). The ``ckpt`` command line is a thin layer over these functions.
"""

from typing import Any

from .version import __version__

_API = ("inspect_model", "plan_model", "sweep_model", "rewrite_model", "check_models", "CheckOptions",
        "AnalysisOptions", "PlanOptions", "RewriteOptions")

__all__ = [*_API, "session_options", "export_training_graph", "__version__"]


def __getattr__(name: str) -> Any:
    # Imported on first use: `ckpt --help` should not pay for the whole pipeline.
    if name in _API:
        from . import api

        return getattr(api, name)
    if name == "session_options":
        from .session import session_options

        return session_options
    if name == "export_training_graph":  # torch is imported only when it runs
        from .export import export_training_graph

        return export_training_graph
    raise AttributeError(f"module 'ckpt_cli' has no attribute {name!r}")
