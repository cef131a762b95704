"""ckpt: a gradient-checkpointing compiler for ONNX training graphs.

The library is a one-way pipeline of small stages, each a function over a
:class:`~ckpt_cli.graph.Graph`::

    load -> analyse -> plan -> rewrite -> check -> report

The ``ckpt`` command line is a thin layer over these functions.
"""

__version__ = "0.1.0"


def session_options(path):
    """The ``onnxruntime.SessionOptions`` a ckpt-written model needs (see :mod:`ckpt_cli.session`)."""
    from .session import session_options as make

    return make(path)


__all__ = ["session_options", "__version__"]
