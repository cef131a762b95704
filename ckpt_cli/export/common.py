"""What the export's API and its torch side share: results, errors, names."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..errors import EXIT_RUNTIME, CkptError, ModelError


class TorchMissing(CkptError):
    """torch (or the ONNX exporter's onnxscript) is not installed."""

    exit_code = EXIT_RUNTIME


class ExportFailed(ModelError):
    """torch could not trace or translate the model."""


@dataclass(frozen=True)
class InputSpec:
    """One example input: its shape, dtype, and for integers the values' upper bound."""

    shape: tuple[int, ...]
    dtype: str = "float32"
    high: int | None = None
    name: str | None = None


@dataclass
class ExportResult:
    path: Path
    init_path: Path  # the module's initial parameters and buffers, by graph input name
    inputs: dict[str, tuple[tuple[int, ...], str]]  # the user's inputs: name -> (shape, dtype)
    parameters: int  # trainable elements
    nodes: int
    max_error: float | None  # None: not compared with eager PyTorch
    outputs: list[str] = field(default_factory=list)
    random_ops: list[str] = field(default_factory=list)  # dropout & co: run on ORT, not compared


def one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


def init_path_of(path: Path) -> Path:
    """``model.onnx`` -> ``model.init.npz``."""
    return path.with_name((path.name[:-5] if path.name.endswith(".onnx") else path.name) + ".init.npz")
