"""PyTorch module -> ONNX training graph (``ckpt export``, ``ckpt_cli.export_training_graph``).

Needs torch (``pip install 'onnx-ckpt[torch]'``); this module imports it only when a function
that needs it runs, so ckpt itself never does. ``trace.py`` holds the torch side.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from ..errors import CheckFailed, ModelError, OptionError, UsageError
from .common import ExportFailed, ExportResult, InputSpec, TorchMissing, init_path_of, one_line

if TYPE_CHECKING:
    import torch

INSTALL = "pip install 'onnx-ckpt[torch]'"
LOSSES = ("cross_entropy", "mse", "sum")
DTYPES = ("float32", "float16", "float64", "int64", "int32", "bool")
DEFAULT_TOLERANCE = 1e-4


_SPEC = re.compile(r"^(?:(?P<name>[A-Za-z_][\w.]*)=)?(?P<shape>\d+(?:,\d+)*|)(?::(?P<dtype>[a-z0-9]+)(?:<(?P<high>\d+))?)?$")


def parse_input_spec(text: str) -> InputSpec:
    """``[NAME=]D0,D1,...[:DTYPE[<HIGH]]``: ``8,3,32,32``, ``ids=8,64:int64<256``, ``scale=:float64``
    (a scalar). Integer inputs draw from [0, HIGH), which they must give."""
    m = _SPEC.match(text.replace(" ", ""))
    if m is None:
        raise OptionError(f"--input-shape {text!r}: expected [NAME=]D0,D1,...[:DTYPE[<HIGH]], e.g. 8,3,32,32 "
                          "or input_ids=8,64:int64<50257")
    dtype, high = m["dtype"] or "float32", m["high"]
    if dtype not in DTYPES:
        raise OptionError(f"--input-shape {text!r}: unknown dtype {dtype!r} (one of {', '.join(DTYPES)})")
    if dtype.startswith("int") and high is None:
        raise OptionError(f"--input-shape {text!r}: an integer input needs its values' bound, e.g. "
                          f"{m['shape']}:{dtype}<1000 for values in [0, 1000)")
    if high is not None and not dtype.startswith("int"):
        raise OptionError(f"--input-shape {text!r}: <HIGH applies to integer dtypes only")
    if high is not None and int(high) < 1:
        raise OptionError(f"--input-shape {text!r}: HIGH must be at least 1")
    shape = tuple(int(d) for d in m["shape"].split(",")) if m["shape"] else ()
    return InputSpec(shape, dtype, int(high) if high is not None else None, m["name"])


def require_torch() -> None:
    """TorchMissing (exit 4) unless torch and the exporter's onnxscript import."""
    for module in ("torch", "onnxscript"):
        try:
            importlib.import_module(module)
        except ImportError as e:
            raise TorchMissing(f"{module} is not installed in this Python ({e}); ckpt export needs it: "
                               f"{INSTALL}") from e


def load_factory(ref: str) -> object:
    """The object ``FILE.py:NAME`` or ``package.module:NAME`` names (NAME may be dotted)."""
    source, sep, attr = ref.rpartition(":")
    if not sep or not source or not attr:
        raise UsageError(f"{ref!r}: expected FILE.py:NAME or package.module:NAME, e.g. models.py:make_model")
    module = _import_file(source) if source.endswith(".py") or os.sep in source else _import_module(source)
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError as e:
            raise UsageError(f"{ref}: {source} has no {attr!r}") from e
    return obj


def _import_file(source: str) -> ModuleType:
    path = Path(source)
    if not path.is_file():
        raise UsageError(f"{source}: no such file")
    name = "_ckpt_export_" + re.sub(r"\W", "_", path.stem)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:  # a name Python has no loader for (not .py)
        raise UsageError(f"{source}: not a Python source file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look their module up here
    sys.path.insert(0, str(path.resolve().parent))  # the file's own sibling imports
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        sys.modules.pop(name, None)
        raise ModelError(f"{source}: importing it raised {one_line(e)}") from e
    return module


def _import_module(source: str) -> ModuleType:
    sys.path.insert(0, os.getcwd())  # as `python -m` would
    try:
        return importlib.import_module(source)
    except ModuleNotFoundError as e:
        if e.name and source.startswith(e.name):
            raise UsageError(f"{source}: no such module (give a FILE.py path, or run from its folder)") from e
        raise ModelError(f"{source}: importing it raised {one_line(e)}") from e
    except Exception as e:
        raise ModelError(f"{source}: importing it raised {one_line(e)}") from e


def model_from_factory(ref: str, seed: int = 0) -> tuple[torch.nn.Module, tuple[object, ...] | None]:
    """(module, example inputs or None): the factory's result. A factory returns an
    ``nn.Module``, or ``(module, example_inputs)``; an ``nn.Module`` instance is taken as is."""
    require_torch()
    import torch

    torch.manual_seed(seed)  # a module made at import time is seeded too
    obj = load_factory(ref)
    if not isinstance(obj, torch.nn.Module):
        if not callable(obj):
            raise UsageError(f"{ref}: is a {type(obj).__name__}, not a module or a function that makes one")
        try:
            obj = obj()
        except Exception as e:
            raise ModelError(f"{ref}() raised {one_line(e)}") from e
    inputs = None
    if isinstance(obj, tuple) and len(obj) == 2 and isinstance(obj[0], torch.nn.Module):
        obj, inputs = obj
        inputs = tuple(inputs) if isinstance(inputs, (list, tuple)) else (inputs,)
    if not isinstance(obj, torch.nn.Module):
        raise UsageError(f"{ref}: returned a {type(obj).__name__}; it must return an nn.Module "
                         "or (nn.Module, example_inputs)")
    return obj, inputs


def make_inputs(specs: Sequence[InputSpec], seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Random example inputs of these shapes (normal floats, uniform integers, fair booleans)."""
    require_torch()
    import torch

    gen = torch.Generator().manual_seed(seed)
    out = []
    for s in specs:
        dtype = getattr(torch, s.dtype)
        if s.dtype == "bool":
            out.append(torch.randint(0, 2, s.shape, generator=gen).bool())
        elif s.high is not None:
            out.append(torch.randint(0, s.high, s.shape, generator=gen, dtype=dtype))
        else:
            out.append(torch.randn(s.shape, generator=gen, dtype=torch.float32).to(dtype))
    return tuple(out)


def forward_input_names(model: torch.nn.Module, count: int) -> list[str]:
    """The forward's parameter names (``input_ids``, ``x``), else ``input_<k>``."""
    try:
        params = [p for p in inspect.signature(model.forward).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    names = [p.name for p in params[:count]]
    return names + [f"input_{k}" for k in range(len(names), count)]


def check_outputs(path: Path, force: bool) -> None:
    """UsageError (exit 2) if the graph or its .init.npz exists without ``force``, or cannot be written."""
    from ..io.safewrite import check_output_path

    check_output_path(path, None, force)
    check_output_path(init_path_of(path), None, force)


def export_training_graph(model: torch.nn.Module, example_inputs: Sequence[object], path: str | Path, *,
                          input_names: Sequence[str] | None = None, loss: str | None = None,
                          verify: bool = True, tolerance: float = DEFAULT_TOLERANCE,
                          force: bool = True) -> ExportResult:
    """Write the training graph (forward and backward in one ONNX graph) of the PyTorch module
    ``model`` to ``path``, and its initial parameters and buffers to ``<path stem>.init.npz``.

    ``model(*example_inputs)`` returns the scalar loss; or, with ``loss`` ("cross_entropy",
    "mse", "sum"), its output is turned into one: cross_entropy takes class scores on the
    last axis and adds an int64 ``labels`` input (the output's shape without that axis), mse
    adds a float ``target`` input of the output's shape, sum adds none. Shapes are those of
    ``example_inputs`` (static). Graph inputs: every parameter and buffer by module path, the
    inputs (``input_names``, default the forward's parameter names), ``tangent_loss`` (feed
    1.0); outputs: ``loss``, ``<param>_grad``, ``<buffer>_updated``. With ``verify`` the graph
    runs on ONNX Runtime and each output is compared with eager PyTorch: ``max_error`` is the
    largest ``|ort - torch| / max(1, max |torch|)``, and above ``tolerance`` CheckFailed is
    raised (exit 1; the files stay written). Raises TorchMissing (exit 4) without torch,
    ExportFailed (exit 2) when torch cannot trace or translate the model.
    """
    require_torch()
    path = Path(path)
    check_outputs(path, force)
    if loss is not None and loss not in LOSSES:
        raise OptionError(f"loss {loss!r}: one of {', '.join(LOSSES)}, or None when the model returns its loss")
    import torch

    if not isinstance(model, torch.nn.Module):
        raise OptionError(f"model: a {type(model).__name__}, not a torch.nn.Module")
    example_inputs = tuple(example_inputs)
    if not all(isinstance(x, torch.Tensor) for x in example_inputs):
        raise OptionError("example_inputs: tensors only, one per forward argument")
    names = list(input_names) if input_names is not None else forward_input_names(model, len(example_inputs))
    if len(names) != len(example_inputs) or len(set(names)) != len(names):
        raise OptionError(f"input names {names}: need {len(example_inputs)} distinct names, one per input")
    from . import run

    return run.export(model, example_inputs, path, names, loss, verify, tolerance)


__all__ = ["export_training_graph", "ExportResult", "InputSpec", "TorchMissing", "ExportFailed", "CheckFailed",
           "parse_input_spec", "model_from_factory", "make_inputs", "LOSSES", "DTYPES", "INSTALL"]
