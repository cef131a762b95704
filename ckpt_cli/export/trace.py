"""PyTorch module -> one ONNX graph of its forward and backward pass.

Imported only once torch is known to be installed: ``ckpt_cli.export`` checks first.

  1. ``aot_export_joint_with_descriptors`` traces forward and autograd's backward into one FX
     graph of core ATen ops. Forward hooks record each op's module path, which AOTAutograd
     copies onto the backward ops it makes; ckpt later finds the repeated layers from it.
  2. ``torch.export`` of a wrapper that runs that FX graph, then
     ``torch.onnx.export(dynamo=True)``.
  3. Inputs and outputs are renamed after AOTAutograd's descriptors, the exporter's folded
     constant-filled initializers become ConstantOfShape nodes again (small files), IR 10.
"""

from __future__ import annotations

import contextlib
import logging
import math
import warnings
from collections.abc import Callable, Iterator, Sequence
from types import NotImplementedType
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np
import onnx
import torch
import torch.fx.traceback as fx_traceback
import torch.nn as nn

if TYPE_CHECKING:
    import onnx_ir

aten = torch.ops.aten
TANGENT = "tangent_loss"


# A backward op's gradients of its inputs (None where its output_mask does not ask for one)
Grads: TypeAlias = "tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]"


# Backward ops with neither a decomposition nor an ONNX translation in torch 2.13
def _convolution_backward(grad_output: torch.Tensor, input: torch.Tensor, weight: torch.Tensor,
                          *args: Any) -> Grads | NotImplementedType:
    """aten.convolution_backward -> Conv / ConvTranspose / ReduceSum (1-D to 3-D, any groups)."""
    _, stride, padding, dilation, transposed, _, groups, output_mask = args  # aten's signature
    nd = input.dim() - 2
    if nd not in (1, 2, 3):
        return NotImplemented  # type: ignore[no-any-return]  # typeshed: NotImplemented subclasses Any
    if transposed:  # its input's gradient is the plain convolution; its weight's, with x and dY swapped
        grad_input = grad_weight = grad_bias = None
        if output_mask[0]:
            grad_input = aten.convolution.default(
                grad_output, weight, None, stride, padding, dilation, False, [0] * nd, groups)
        if output_mask[1]:
            grad_weight = _convolution_weight_grad(input, grad_output, weight, stride, padding, dilation, groups)
        if output_mask[2]:
            grad_bias = grad_output.sum(dim=[0, *range(2, 2 + nd)])
        return grad_input, grad_weight, grad_bias
    grad_input = grad_weight = grad_bias = None
    if output_mask[0]:
        # output_padding recovers the exact input size when stride > 1
        out_pad = [
            input.shape[2 + i]
            - ((grad_output.shape[2 + i] - 1) * stride[i] - 2 * padding[i]
               + dilation[i] * (weight.shape[2 + i] - 1) + 1)
            for i in range(nd)
        ]
        grad_input = aten.convolution.default(
            grad_output, weight, None, stride, padding, dilation, True, out_pad, groups)
    if output_mask[1]:
        grad_weight = _convolution_weight_grad(grad_output, input, weight, stride, padding, dilation, groups)
    if output_mask[2]:
        grad_bias = grad_output.sum(dim=[0, *range(2, 2 + nd)])
    return grad_input, grad_weight, grad_bias


def _convolution_weight_grad(grad_output: torch.Tensor, input: torch.Tensor, weight: torch.Tensor, stride: list[int],
                             padding: list[int], dilation: list[int], groups: int) -> torch.Tensor:
    """dW[o, i] = sum_n x[n, i] (*) dY[n, o]: a convolution with the batch axis as channels
    (in groups: channel i of group k meets only the outputs of group k)."""
    nd = input.dim() - 2
    if groups == 1:
        x = input.transpose(0, 1)
    else:  # (N, C) -> (C / groups, groups * N): each group's batch, side by side
        n, c = input.shape[:2]
        x = input.reshape(n, groups, c // groups, *input.shape[2:]).permute(
            2, 1, 0, *range(3, 3 + nd)).reshape(c // groups, groups * n, *input.shape[2:])
    gw = aten.convolution.default(
        x, grad_output.transpose(0, 1), None, dilation, padding, stride, False, [0] * nd, groups)
    return gw.transpose(0, 1)[(slice(None), slice(None), *(slice(0, k) for k in weight.shape[2:]))]


def _max_pool_with_indices_backward(grad_output: torch.Tensor, self: torch.Tensor, kernel_size: list[int],
                                    stride: list[int], padding: list[int], dilation: list[int], ceil_mode: bool,
                                    indices: torch.Tensor) -> torch.Tensor:
    """Scatter-add the output gradient to the argmax positions (indices are per-plane)."""
    n, c = self.shape[:2]
    g = grad_output.reshape(n, c, -1)
    idx = indices.reshape(n, c, -1)
    zeros = torch.zeros(n, c, math.prod(self.shape[2:]), dtype=grad_output.dtype, device=grad_output.device)
    return zeros.scatter_add(2, idx, g).reshape(self.shape)


def _avg_pool2d_backward(grad_output: torch.Tensor, self: torch.Tensor, kernel_size: list[int], stride: list[int],
                         padding: list[int], ceil_mode: bool, count_include_pad: bool,
                         divisor_override: int | None) -> torch.Tensor | NotImplementedType:
    """A transposed depthwise convolution with a constant kernel, where every window has the
    same divisor (no ceil_mode; no padding, or padding counted)."""
    kh, kw = kernel_size if len(kernel_size) == 2 else (kernel_size[0],) * 2
    sh, sw = (stride if len(stride) == 2 else (stride[0],) * 2) if stride else (kh, kw)
    ph, pw = padding if len(padding) == 2 else (padding[0],) * 2
    if ceil_mode or self.dim() != 4 or ((ph or pw) and not count_include_pad and divisor_override is None):
        return NotImplemented
    c = self.shape[1]
    kernel = torch.full((c, 1, kh, kw), 1.0 / (divisor_override or kh * kw), dtype=grad_output.dtype,
                        device=grad_output.device)
    out_pad = [self.shape[2 + i] - ((grad_output.shape[2 + i] - 1) * s - 2 * p + k)
               for i, (s, p, k) in enumerate(((sh, ph, kh), (sw, pw, kw)))]
    return aten.convolution.default(grad_output, kernel, None, [sh, sw], [ph, pw], [1, 1], True, out_pad, c)


def _adaptive_avg_pool2d_backward(grad_output: torch.Tensor,
                                  self: torch.Tensor) -> torch.Tensor | NotImplementedType:
    """Where the output size divides the input's: an average pool with kernel = stride."""
    (h, w), (oh, ow) = self.shape[-2:], grad_output.shape[-2:]
    if self.dim() != 4 or h % oh or w % ow:
        return NotImplemented
    return _avg_pool2d_backward(grad_output, self, [h // oh, w // ow], [h // oh, w // ow], [0, 0], False, True, None)


def decompositions() -> dict[torch._ops.OpOverload, Callable[..., object]]:
    """Core ATen decompositions; PyTorch's own decomposition of training-mode BatchNorm (the
    exporter would translate it as an inference-mode BatchNormalization); and the two
    convolutional backward ops above."""
    from torch._decomp import core_aten_decompositions, decomposition_table

    table = dict(core_aten_decompositions())
    bn = aten._native_batch_norm_legit_functional.default
    table[bn] = decomposition_table[bn]
    table[aten.convolution_backward.default] = _convolution_backward
    table[aten.max_pool2d_with_indices_backward.default] = _max_pool_with_indices_backward
    table[aten.max_pool3d_with_indices_backward.default] = _max_pool_with_indices_backward
    table[aten.avg_pool2d_backward.default] = _avg_pool2d_backward
    table[aten._adaptive_avg_pool2d_backward.default] = _adaptive_avg_pool2d_backward
    return table


class _RunJoint(nn.Module):  # type: ignore[misc]  # torch is not installed for mypy: nn.Module is Any
    """Runs the joint FX graph node by node, so torch.export keeps each node's metadata."""

    def __init__(self, gm: torch.fx.GraphModule, keep: list[int]) -> None:
        super().__init__()
        self.gm, self.keep = gm, keep

    def forward(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = torch.fx.Interpreter(self.gm).run(*args)
        out = torch.utils._pytree.tree_leaves(out, is_leaf=lambda x: x is None)
        return tuple(out[i] for i in self.keep)


def _trace_joint(traced: nn.Module, named: nn.Module, example_inputs: Sequence[torch.Tensor]) -> torch.fx.GraphModule:
    """AOTAutograd's joint graph of ``traced``, every op annotated with the path in ``named``
    of the module that ran it."""
    from torch._functorch.aot_autograd import aot_export_joint_with_descriptors

    open_scopes: list[contextlib.AbstractContextManager[object]] = []

    def enter(path: str) -> Callable[[nn.Module, tuple[object, ...]], None]:
        def hook(module: nn.Module, args: tuple[object, ...]) -> None:
            scope = fx_traceback.annotate({"module": path})
            scope.__enter__()
            open_scopes.append(scope)
        return hook

    def leave(module: nn.Module, args: tuple[object, ...], out: object) -> None:
        open_scopes.pop().__exit__(None, None, None)

    hooks: list[torch.utils.hooks.RemovableHandle] = []
    for path, sub in named.named_modules():
        if path:
            hooks += [sub.register_forward_pre_hook(enter(path)), sub.register_forward_hook(leave)]
    try:
        # attention and LSTM as the ops they are made of: their fused CPU kernels' backward
        # ops have no ONNX translation
        with fx_traceback.preserve_node_meta(), contextlib.ExitStack() as stack, \
                torch.nn.attention.sdpa_kernel([torch.nn.attention.SDPBackend.MATH]), _no_mkldnn():
            joint = aot_export_joint_with_descriptors(
                stack, traced, tuple(example_inputs), decompositions=decompositions())
    finally:
        for h in hooks:
            h.remove()
        while open_scopes:  # a forward that raised leaves its scopes open
            open_scopes.pop().__exit__(None, None, None)
    return joint.graph_module


@contextlib.contextmanager
def _no_mkldnn() -> Iterator[None]:
    with warnings.catch_warnings():  # setting the flags warns of TF32, which CPU float32 never uses
        warnings.simplefilter("ignore", UserWarning)
        flags = torch.backends.mkldnn.flags(enabled=False)
        flags.__enter__()
    try:
        yield
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            flags.__exit__(None, None, None)


def _module_stack(model: nn.Module, path: str) -> dict[str, tuple[str, str]]:
    """``nn_module_stack`` as torch.export writes it; the exporter turns it into name scopes."""
    stack = {"L__self__": ("", f"{type(model).__module__}.{type(model).__qualname__}")}
    parts = path.split(".") if path else []
    for i in range(1, len(parts) + 1):
        sub_path = ".".join(parts[:i])
        sub = model.get_submodule(sub_path)
        if isinstance(sub, (nn.ModuleList, nn.ModuleDict)) and i < len(parts):
            continue
        stack["L__self___" + sub_path.replace(".", "_")] = (
            sub_path, f"{type(sub).__module__}.{type(sub).__qualname__}")
    return stack


def _state_by_name(traced: nn.Module) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Every parameter and buffer under each name that reaches it, and the name each of those
    names is known by. A tied weight (a language model's output layer sharing the embedding's
    matrix) has several names, and AOTAutograd may describe it by any of them; the graph names
    it as ``named_parameters()`` does (its first name), so that gradients map back to the
    parameters an optimizer is given."""
    state: dict[str, torch.Tensor] = {}
    known_as: dict[str, str] = {}
    for named in (traced.named_parameters, traced.named_buffers):
        first = {id(t): name for name, t in named()}
        for name, t in named(remove_duplicate=False):
            state[name] = t
            known_as[name] = first[id(t)]
    return state, known_as


def _names(gm: torch.fx.GraphModule, traced: nn.Module, prefix: str, example_inputs: Sequence[torch.Tensor],
           input_names: Sequence[str]) -> tuple[list[str], list[torch.Tensor], list[int], list[str]]:
    """Graph input names/values and kept output indices/names, from AOTAutograd's descriptors
    (parameter and buffer names without ``prefix``, the loss wrapper's)."""
    from torch._functorch._aot_autograd import descriptors as D

    state, known_as = _state_by_name(traced)
    in_names: list[str] = []
    in_values: list[torch.Tensor] = []
    for node in gm.graph.find_nodes(op="placeholder"):
        desc = node.meta["desc"]
        if isinstance(desc, (D.ParamAOTInput, D.BufferAOTInput)):
            in_names.append(known_as[desc.target].removeprefix(prefix))
            in_values.append(state[desc.target].detach().clone())
        elif isinstance(desc, D.PlainAOTInput):
            in_names.append(input_names[desc.idx])
            in_values.append(example_inputs[desc.idx])
        elif isinstance(desc, D.TangentAOTInput):
            in_names.append(TANGENT)
            in_values.append(torch.ones((), dtype=torch.float32))
        else:
            raise NotImplementedError(f"graph input {desc!r}")
    keep: list[int] = []
    out_names: list[str] = []
    out_node = gm.graph.find_nodes(op="output")[0]
    for i, (arg, desc) in enumerate(zip(out_node.args[0], out_node.meta["desc"])):
        if arg is None:  # gradient of an integer input
            continue
        if isinstance(desc, D.PlainAOTOutput):
            name = "loss"
        elif isinstance(desc, D.GradAOTOutput):
            name = f"{known_as[desc.grad_of.target].removeprefix(prefix)}_grad"
        elif isinstance(desc, D.InputMutationAOTOutput):
            name = f"{known_as[desc.mutated_input.target].removeprefix(prefix)}_updated"
        else:
            raise NotImplementedError(f"graph output {desc!r}")
        keep.append(i)
        out_names.append(name)
    return in_names, in_values, keep, out_names


def _unfold_zeros(graph: onnx_ir.Graph, min_elements: int = 1024) -> None:
    """The exporter folds ``zeros``/``full`` into initializers (loss seeds, embedding-gradient
    buffers): put back a ConstantOfShape node, so the file does not carry them."""
    import onnx_ir as ir

    nodes = list(graph)
    for name in list(graph.initializers):
        value = graph.initializers[name]
        if value.is_graph_input() or value.is_graph_output() or value.const_value is None:
            continue
        arr = value.const_value.numpy()
        if arr.size < min_elements or not (arr == arr.flat[0]).all():
            continue
        first_user = min((u for u, _ in value.uses()), key=nodes.index)
        shape = ir.Value(name=f"{name}_shape", const_value=ir.tensor(np.array(arr.shape, np.int64)))
        graph.register_initializer(shape)
        node = ir.Node("", "ConstantOfShape", [shape], name=f"node_{name}", num_outputs=1,
                       attributes=[ir.AttrTensor("value", ir.tensor(arr.flat[:1].copy()))])
        graph.insert_before(first_user, node)
        graph.initializers.pop(name)
        value.replace_all_uses_with(node.outputs[0])
        node.outputs[0].name, node.outputs[0].shape, node.outputs[0].dtype = name, ir.Shape(arr.shape), value.dtype


def _to_onnx(gm: torch.fx.GraphModule, named: nn.Module, in_values: list[torch.Tensor],
             keep: list[int]) -> onnx_ir.Model:
    """The joint graph as an onnx_ir model, each node in the name scope of its module."""
    with fx_traceback.preserve_node_meta():
        ep = torch.export.export(_RunJoint(gm, keep), tuple(in_values), strict=False)
    for node in ep.graph.nodes:  # module paths -> ONNX name scopes
        if node.op == "call_function":
            path = (node.meta.get("custom") or {}).get("module", "")
            node.meta["nn_module_stack"] = _module_stack(named, path)
    with warnings.catch_warnings(), _quiet("torch.onnx"):
        warnings.simplefilter("ignore")  # the exporter's own chatter; errors still raise
        return torch.onnx.export(ep, dynamo=True, optimize=True, verbose=False).model


@contextlib.contextmanager
def _quiet(name: str) -> Iterator[None]:
    """The logger's warnings (\"torchvision is not installed. Skipping ...\") off for the block."""
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _finish(model: onnx_ir.Model, in_names: list[str], out_names: list[str]) -> onnx.ModelProto:
    """Names after the descriptors; loss first, then gradients, then updated buffers; IR 10."""
    import onnx_ir as ir

    graph = model.graph
    for value, name in zip(graph.inputs, in_names):
        value.name = name
    _tied_inputs_merged(graph)
    outputs, out_names = _tied_gradients_summed(graph, list(graph.outputs), out_names)
    graph.outputs.clear()
    for i in sorted(range(len(outputs)), key=lambda i: (
            out_names[i] != "loss", not out_names[i].endswith("_grad"), i)):
        graph.outputs.append(outputs[i])
    _unfold_zeros(graph)
    for node in graph:  # the stack trace only points at _RunJoint: drop it
        node.metadata_props.pop("pkg.torch.onnx.stack_trace", None)
    proto: onnx.ModelProto = ir.serde.serialize_model(model)
    proto.ir_version = 10  # ONNX Runtime 1.31 loads IR <= 13; ckpt writes <= 10
    return proto


def _broadcast_copies(gm: torch.fx.GraphModule) -> None:
    """Give each ``aten.copy(self, src)`` whose ``src`` broadcasts (a scalar assigned to a
    slice: T5's shift of the decoder's inputs) ``src`` expanded to ``self``'s shape.
    torch.onnx writes the copy as ``CastLike(src, self)``, which keeps ``src``'s shape: the
    graph it wrote then failed ORT's shape inference."""
    for node in list(gm.graph.find_nodes(op="call_function", target=torch.ops.aten.copy.default)):
        dst, src = node.args[0], node.args[1]
        if not isinstance(src, torch.fx.Node) or "val" not in src.meta or "val" not in dst.meta:
            continue
        shape = list(dst.meta["val"].shape)
        if list(src.meta["val"].shape) == shape:
            continue
        with gm.graph.inserting_before(node):
            expanded = gm.graph.call_function(torch.ops.aten.expand.default, (src, shape))
        expanded.meta = {**src.meta, "val": src.meta["val"].expand(shape)}
        node.args = (dst, expanded, *node.args[2:])
    gm.recompile()


def _tied_inputs_merged(graph: onnx_ir.Graph) -> None:
    """One graph input per tied weight: AOTAutograd lifts each name of it apart, and the
    graph names them alike (``_state_by_name``); the later inputs' readers read the first."""
    import onnx_ir as ir

    first: dict[str | None, onnx_ir.Value] = {}
    for value in list(graph.inputs):
        if value.name not in first:
            first[value.name] = value
            continue
        ir.convenience.replace_all_uses_with(value, first[value.name])
        graph.inputs.remove(value)


def _tied_gradients_summed(graph: onnx_ir.Graph, outputs: list[onnx_ir.Value], names: list[str]
                           ) -> tuple[list[onnx_ir.Value], list[str]]:
    """The outputs named ``names``, where a tied weight's gradients (one per name AOTAutograd
    lifted) become their sum: the gradient of the one weight, as eager PyTorch gives it."""
    import onnx_ir as ir

    groups: dict[str, list[int]] = {}
    for i, name in enumerate(names):
        groups.setdefault(name, []).append(i)
    kept_values: list[onnx_ir.Value] = []
    kept_names: list[str] = []
    for name, at in groups.items():
        total = outputs[at[0]]
        for k, i in enumerate(at):
            outputs[i].name = f"{name}_part{k}" if len(at) > 1 else name
            if k:
                node = ir.Node("", "Add", [total, outputs[i]], num_outputs=1, name=f"{name}_sum{k}")
                graph.append(node)
                node.outputs[0].type, node.outputs[0].shape = total.type, total.shape
                total = node.outputs[0]
        total.name = name
        kept_values.append(total)
        kept_names.append(name)
    return kept_values, kept_names


def export_joint(traced: nn.Module, named: nn.Module, prefix: str, example_inputs: Sequence[torch.Tensor],
                 input_names: Sequence[str]) -> tuple[onnx.ModelProto, dict[str, torch.Tensor]]:
    """(ONNX ModelProto, {graph input name: tensor}) of ``traced``'s training step."""
    traced.train()
    gm = _trace_joint(traced, named, example_inputs)
    _broadcast_copies(gm)
    in_names, in_values, keep, out_names = _names(gm, traced, prefix, example_inputs, input_names)
    proto = _finish(_to_onnx(gm, named, in_values, keep), in_names, out_names)
    return proto, dict(zip(in_names, in_values))
