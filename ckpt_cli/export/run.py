"""The torch side of ``export_training_graph``: loss wrapper, trace, save, compare with eager."""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import numpy as np
import onnx
import torch
import torch.nn as nn
import torch.nn.functional as F

from ..errors import CheckFailed, RunFailed
from ..ops import RANDOM_OPS
from ..progress import stage
from ..io.safewrite import commit, exit_on_sigterm, must_create, os_errors, remove_stale_temps, temp_beside
from .common import ExportFailed, ExportResult, init_path_of, one_line
from .trace import TANGENT, export_joint

_PREFIX = "model."  # the loss wrapper's name for the user's module
Inputs = tuple[torch.Tensor, ...]  # a module's example inputs, in its forward's order


class _WithLoss(nn.Module):  # type: ignore[misc]  # torch is not installed for mypy: nn.Module is Any
    def __init__(self, model: nn.Module, loss: str) -> None:
        super().__init__()
        self.model, self.loss = model, loss

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        *inputs, target = args
        out = self.model(*inputs)
        if self.loss == "cross_entropy":
            return F.cross_entropy(out.reshape(-1, out.shape[-1]), target.reshape(-1))
        return F.mse_loss(out, target)


class _Summed(nn.Module):  # type: ignore[misc]  # torch is not installed for mypy: nn.Module is Any
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        return self.model(*args).sum()


@contextlib.contextmanager
def _state_kept(model: nn.Module) -> Iterator[None]:
    """Parameters' gradients and buffers (BatchNorm statistics) as they were, after eager runs."""
    buffers = {k: v.detach().clone() for k, v in model.named_buffers()}
    grads = {k: p.grad for k, p in model.named_parameters()}
    try:
        yield
    finally:
        with torch.no_grad():
            for k, v in model.named_buffers():
                v.copy_(buffers[k])
        for k, p in model.named_parameters():
            p.grad = grads[k]


def _probe_output(model: nn.Module, inputs: Inputs) -> object:
    with _state_kept(model), torch.no_grad():
        try:
            return model(*inputs)
        except Exception as e:
            raise ExportFailed(f"the model's forward on the example inputs raised {one_line(e)}") from e


def _with_loss(model: nn.Module, inputs: Inputs, names: list[str],
               loss: str | None) -> tuple[nn.Module, Inputs, list[str], str]:
    """(module to trace, its inputs, their names, prefix of its parameter names)."""
    if loss is None:
        return model, inputs, names, ""
    out = _probe_output(model, inputs)
    if not isinstance(out, torch.Tensor) or not out.is_floating_point():
        raise ExportFailed(f"--loss {loss}: the model must return one floating-point tensor, not "
                           f"{type(out).__name__ if not isinstance(out, torch.Tensor) else out.dtype}")
    if loss == "sum":
        return _Summed(model), inputs, names, _PREFIX
    gen = torch.Generator().manual_seed(1)
    if loss == "cross_entropy":
        if out.dim() not in (2, 3):  # (N, C, H, W) would be read as classes on W
            raise ExportFailed(f"--loss cross_entropy: the model returned {list(out.shape)}; it takes class scores "
                               "(N, classes) or (batch, seq, classes): return the loss from forward instead")
        target = torch.randint(0, out.shape[-1], out.shape[:-1], generator=gen)
        extra = "labels"
    else:
        target = torch.randn(out.shape, generator=gen, dtype=torch.float32).to(out.dtype)
        extra = "target"
    if extra in names:
        raise ExportFailed(f"--loss {loss} adds an input named {extra!r}, which the model already has")
    return _WithLoss(model, loss), (*inputs, target), [*names, extra], _PREFIX


def _check_loss(traced: nn.Module, inputs: Inputs) -> None:
    out = _probe_output(traced, inputs)
    if not isinstance(out, torch.Tensor) or out.dim() != 0 or not out.is_floating_point():
        shape = list(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ExportFailed(f"the model returned {shape}, not a scalar loss: return the loss from forward, "
                           "or pass --loss cross_entropy|mse|sum")


def _export_error(e: Exception) -> str:
    """The cause in torch's long report: the op without a translation, or the summary's line."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(e))
    op = re.search(r"No ONNX function found for <OpOverload\(op='([\w.]+)', overload='(\w+)'", text)
    if op:
        return f"its ONNX exporter cannot translate {op[1]}.{op[2]} (no ONNX function, no decomposition)"
    summary = re.search(r"## Exception summary\s+<class '[\w.]*?(\w+)'>: ([^\n]+)", text)
    if summary:
        return f"{summary[1]}: {summary[2]}"
    first = text.strip().splitlines()
    return f"{type(e).__name__}: {first[0]}" if first else type(e).__name__


def _save_npz(path: Path, state: dict[str, np.ndarray]) -> None:
    with os_errors(path), exit_on_sigterm():
        remove_stale_temps(path)
        tmp = temp_beside(path)
        try:
            with open(tmp, "wb") as f:  # a file object: np.savez appends .npz to a name
                np.savez(f, **cast(dict[str, Any], state))  # numpy's stub: a key might be allow_pickle
            commit(tmp, path, must_create(path))
        finally:
            tmp.unlink(missing_ok=True)


def export(model: nn.Module, inputs: Inputs, path: Path, names: list[str], loss: str | None,
           verify: bool, tolerance: float) -> ExportResult:
    from ..io.save import save_model

    traced, inputs, names, prefix = _with_loss(model, inputs, names, loss)
    _check_loss(traced, inputs)
    stage("tracing forward and backward, exporting to ONNX")
    try:
        proto, feeds = export_joint(traced, model, prefix, inputs, names)
    except (KeyboardInterrupt, MemoryError, CheckFailed):
        raise
    except Exception as e:
        raise ExportFailed(f"torch could not export the model: {_export_error(e)}") from e
    try:  # ORT runs graphs onnx's checker refuses (a graph output without a type): ckpt's load would not
        onnx.checker.check_model(proto)
    except onnx.checker.ValidationError as e:
        raise ExportFailed(f"the exported graph is not valid ONNX: {one_line(e)}") from e
    save_model(proto, path)
    init_path = init_path_of(path)
    state = {n: v.numpy() for n, v in feeds.items() if n not in names and n != TANGENT}
    _save_npz(init_path, state)
    result = ExportResult(
        path=path, init_path=init_path,
        inputs={n: (tuple(v.shape), str(v.dtype).removeprefix("torch.")) for n, v in feeds.items() if n in names},
        parameters=sum(p.numel() for p in model.parameters() if p.requires_grad),
        nodes=len(proto.graph.node), max_error=None, outputs=[o.name for o in proto.graph.output])
    result.random_ops = sorted({n.op_type for n in proto.graph.node if n.op_type in RANDOM_OPS})
    if verify and result.random_ops:  # its masks are not PyTorch's: only whether ORT runs it
        stage("running it on ONNX Runtime")
        _run_on_ort(path, feeds)
    elif verify:
        stage("comparing with eager PyTorch on ONNX Runtime")
        result.max_error = _compare_with_torch(traced, prefix, inputs, path, feeds)
        if not result.max_error <= tolerance:
            raise CheckFailed(f"{path}: its loss or gradients differ from eager PyTorch by {result.max_error:.3g} "
                              f"(relative), above the tolerance {tolerance:g}; the files are written")
    return result


def _run_on_ort(path: Path, feeds: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    from ..ort import ort_module

    ort = ort_module()
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1  # ScatterND-add (embedding gradients) is racy with more
    try:
        sess = ort.InferenceSession(os.fspath(path), so, providers=["CPUExecutionProvider"])
        outputs = sess.run(None, {n: v.numpy() for n, v in feeds.items()})
    except Exception as e:  # the files stay: --no-verify writes the same
        raise RunFailed("run_failed", f"{path}: ONNX Runtime cannot run the exported graph: {one_line(e)}") from e
    return dict(zip([o.name for o in sess.get_outputs()], outputs))


def _compare_with_torch(traced: nn.Module, prefix: str, inputs: Inputs, path: Path,
                        feeds: dict[str, torch.Tensor]) -> float:
    """Largest ``|ort - torch| / max(1, max |torch|)`` over the loss, gradients and updated buffers."""
    got = _run_on_ort(path, feeds)
    with _state_kept(traced):
        for p in traced.parameters():
            p.grad = None
        eager = traced(*inputs)
        eager.backward()
        ref = {"loss": eager.detach(),
               **{f"{n.removeprefix(prefix)}_grad": p.grad for n, p in traced.named_parameters() if p.grad is not None},
               **{f"{n.removeprefix(prefix)}_updated": b.detach().clone() for n, b in traced.named_buffers()}}
    errors = [_error(got[k], ref[k].numpy()) for k in got if k in ref]
    return max(errors, default=0.0)


def _error(got: np.ndarray, ref: np.ndarray) -> float:
    got, ref = got.astype(np.float64), ref.astype(np.float64)
    return float(np.abs(got - ref).max(initial=0.0) / max(1.0, float(np.abs(ref).max(initial=0.0))))
