"""``ckpt export``: a PyTorch model factory -> ONNX training graph (``ckpt_cli.export``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from ..errors import UsageError
from ..progress import listening
from .progress import progress

if TYPE_CHECKING:
    import torch

    from ..export.common import ExportResult, InputSpec

_LOSS_HELP = ("Turn the model's output into the loss: cross_entropy (class scores on the last axis: (N, classes) "
              "or (batch, seq, vocab), nothing else; adds an int64 'labels' input shaped like the output without that axis), mse (adds a float 'target' "
              "input shaped like the output), sum. Default none: forward returns the scalar loss itself.")
_INPUT_HELP = ("One example input per forward argument, in order (repeatable): [NAME=]D0,D1,...[:DTYPE[<HIGH]], "
               "e.g. 8,3,32,32 or input_ids=8,64:int64<50257 (integers drawn from [0, HIGH)). Floats are "
               "standard normal. The graph's shapes are these (static). Default NAME: the forward's parameter name.")


@click.command("export")
@click.argument("factory", metavar="FILE.py:NAME")
@click.option("-i", "--input-shape", "input_specs", multiple=True, metavar="SPEC", help=_INPUT_HELP)
@click.option("--loss", type=click.Choice(["none", "cross_entropy", "mse", "sum"]), default="none",
              show_default=True, help=_LOSS_HELP)
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="The training graph to write; its initial weights go to <output stem>.init.npz beside it.")
@click.option("--force", is_flag=True, help="Overwrite the output (and its .init.npz) if they exist.")
@click.option("--seed", type=int, default=0, show_default=True,
              help="torch.manual_seed before the factory runs; also seeds the example inputs.")
@click.option("--verify/--no-verify", default=True, show_default=True,
              help="Run the graph on ONNX Runtime and compare loss, gradients and updated buffers with eager "
                   "PyTorch (exit 1 above --tolerance).")
@click.option("--tolerance", type=click.FloatRange(min=0), default=1e-4, show_default=True,
              help="Largest |ort - torch| / max(1, max |torch|) over every output --verify accepts.")
@click.option("-q", "--quiet", is_flag=True, help="No progress and no summary; errors only.")
def export(factory: str, input_specs: tuple[str, ...], output: Path, quiet: bool, **given: Any) -> None:
    """Export a PyTorch model's training step as one ONNX graph for ckpt.

    FILE.py:NAME (or package.module:NAME) names a function that returns an nn.Module, or
    (nn.Module, example_inputs), or a module instance. Its forward and autograd's backward
    are traced into one graph of standard ONNX ops: inputs are every parameter and buffer
    (by module path, e.g. layer1.0.conv1.weight), your inputs and tangent_loss (feed 1.0);
    outputs are loss, <param>_grad and <buffer>_updated (BatchNorm statistics). Each node
    keeps its module path as a name scope, so ckpt finds the repeated layers.

    Needs torch 2.13 (CPU is enough): pip install 'onnx-ckpt[torch]'; exit 4 without it.

    \b
    Examples:
      ckpt export models.py:resnet -i 8,3,32,32 --loss cross_entropy -o resnet.onnx
      ckpt export gpt.py:make_gpt -i input_ids=8,64:int64<256 -i labels=8,64:int64<256 -o gpt.onnx
      ckpt export mypkg.models:build -o m.onnx     # build() returns (model, example_inputs)
      ckpt rewrite resnet.onnx --check             # then checkpoint it

    \b
    Limits: shapes are static; forward must not call torch.autograd.grad; dropout exports as
    ONNX random ops (masks differ from PyTorch's, so --verify only runs the graph); a layer
    whose backward op torch cannot translate exits 2 naming the op (docs/commands.md).
    """
    from ..export import check_outputs, export_training_graph, make_inputs, model_from_factory, parse_input_spec

    specs = [parse_input_spec(s) for s in input_specs]
    check_outputs(output, given["force"])  # before the seconds torch takes to import
    loss = None if given["loss"] == "none" else given["loss"]
    with progress("importing torch", quiet) as shown, listening(shown.stage):
        model, inputs = model_from_factory(factory, given["seed"])
        if specs:
            inputs = make_inputs(specs, given["seed"])
        if inputs is None:
            raise UsageError(f"{factory}: give --input-shape, one per forward argument, or have it return "
                             "(model, example_inputs)")
        result = export_training_graph(model, inputs, output, input_names=_names(model, specs, len(inputs)),
                                       loss=loss, verify=given["verify"], tolerance=given["tolerance"],
                                       force=given["force"])
    if not quiet:
        _summary(result)


def _names(model: torch.nn.Module, specs: list[InputSpec], count: int) -> list[str]:
    from ..export import forward_input_names

    default = forward_input_names(model, count)
    return [s.name or default[k] for k, s in enumerate(specs)] if specs else default


def _summary(result: ExportResult) -> None:
    size = result.path.stat().st_size / 2**20
    inputs = ", ".join(f"{n}[{','.join(map(str, shape))}] {dtype}" for n, (shape, dtype) in result.inputs.items())
    out = sys.stdout
    print(f"wrote {result.path} ({result.nodes} nodes, {size:.2f} MiB) and {result.init_path} "
          f"({result.parameters:,} parameters)", file=out)
    print(f"  inputs: {inputs}; feed tangent_loss = 1.0 and the parameters from {result.init_path.name}", file=out)
    if result.max_error is not None:
        print(f"  max difference from eager PyTorch: {result.max_error:.2g} (relative)", file=out)
    elif result.random_ops:
        print(f"  not compared with eager PyTorch: it draws random numbers ({', '.join(result.random_ops)}), "
              "its own, not PyTorch's; ONNX Runtime runs it", file=out)
    print(f"next: ckpt rewrite {result.path} --check", file=out)
