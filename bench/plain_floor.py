"""Where the default rewrite stops in a plain ``InferenceSession(path)``, and why (issue 42).

    python -m bench.plain_floor [MODEL ...]     # default: sample_models/gpt.onnx

For each model's default rewrite (as ``ckpt rewrite`` writes it): the plain session's peak,
measured (``tests/fixtures/sessions.py``, the measurement bench/SESSIONS.md uses) and
predicted (ckpt's model of ORT's fused graph, ``verify/plain_model.py``); the memory
pattern's block and the arena regions; the graph outputs' bytes (allocated outside the
block); then the floor of the block: the activations' live peak and the block ORT's
``MemPatternPlanner`` would make of them, as written and with buffer reuse off for every
tensor (the most fresh tensors could do), in ORT's fused DEFAULT order and in the file's own
order (ckpt's schedule, no fusions). Finally the block if tensors whose shape ORT does not
know before the run (fresh tensors' run-time views) were left out of the pattern, the
hypothesis the measurement refutes: ORT's inference build records the pattern by tracing
the first run's allocations, whatever their shape (``GeneratePatternGroupCache``, which plans
from static shapes, is compiled only with ENABLE_TRAINING).

Needs ORT (CPU); the original is measured too, for the ratio. About 30 s per model.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from tests.fixtures.sessions import make_feeds, measure

ROOT = Path(__file__).resolve().parent.parent
MiB = 2**20


def _mib(n: int) -> str:
    return f"{n / MiB:.2f} MiB"


def block_floor(graph, tensors, order: list[int], reuse: bool, left_out: frozenset = frozenset()) -> tuple[int, int]:
    """(the largest sum of live activation bytes at one step, the pattern's block) for
    ``order``: graph outputs are outside both, as are the buffers holding a tensor of
    ``left_out``."""
    from ckpt_cli.analysis.lifetimes import lifetimes
    from ckpt_cli.analysis.pattern import aligned, output_buffers, pattern_size
    from ckpt_cli.analysis.planner import plan_buffers

    buffers = plan_buffers(graph, order, tensors, lifetimes(graph, order), reuse)
    names = graph.ids.names
    outside = [o or any(names[t] in left_out for _, t in h)
               for o, h in zip(output_buffers(graph, buffers), buffers.holders)]
    steps = len(order)
    change = [0] * (steps + 2)
    for size, born, dies, out in zip(buffers.size, buffers.born, buffers.dies, outside):
        if not out and size > 0:
            change[max(born, 0)] += aligned(size)
            change[min(dies, steps) + 1] -= aligned(size)
    live, peak = 0, 0
    for c in change:
        live += c
        peak = max(peak, live)
    return peak, pattern_size(buffers, steps, outside)


def _floors(graph, tensors, label: str) -> list[str]:
    order = list(range(len(graph.nodes)))
    lines = []
    for reuse in (True, False):
        live, block = block_floor(graph, tensors, order, reuse)
        lines.append(f"  {label}, buffer reuse {'on (as written)' if reuse else 'off for every tensor'}: "
                     f"activations live at most {_mib(live)}, block {_mib(block)}")
    return lines


def report(model: Path, tmp: Path) -> list[str]:
    from ckpt_cli.analysis.pattern import aligned, output_buffers, predict_pattern
    from ckpt_cli.analysis.planner import plan_buffers
    from ckpt_cli.analysis.lifetimes import lifetimes
    from ckpt_cli.analysis.shapes import infer_tensors
    from ckpt_cli.api import rewrite_model
    from ckpt_cli.io.load import load_graph
    from ckpt_cli.verify.plain_model import fused_graph

    out = tmp / f"{model.stem}.ckpt.onnx"
    result = rewrite_model(model, out, force=True).result
    feeds = tmp / f"{model.stem}.npz"
    make_feeds(model, feeds)
    original = measure(model, "plain", feeds)["peak_bytes"]
    measured = measure(out, "plain", feeds)["peak_bytes"]
    fused = fused_graph(out, result.after.tensors)
    if fused is None:
        return [f"{model.name}: ORT's fused graph of the rewrite could not be had"]
    graph, tensors = fused
    written = load_graph(out)
    order = list(range(len(graph.nodes)))
    predicted = predict_pattern(graph, order, tensors)
    buffers = plan_buffers(graph, order, tensors, lifetimes(graph, order), True)
    outputs = sum(aligned(s) for s, o in zip(buffers.size, output_buffers(graph, buffers)) if o)
    run_time = frozenset(t for t, info in tensors.items() if not info.static_shape)
    _, without = block_floor(graph, tensors, order, True, run_time)
    return [f"{model.name}: plain session, original {_mib(original)}; default rewrite measured {_mib(measured)} "
            f"({measured / original:.3f}x), predicted {_mib(predicted.peak_in_use_bytes)}",
            f"  pattern block {_mib(predicted.block_bytes)}, arena regions "
            f"{', '.join(_mib(r) for r in predicted.regions)}; graph outputs {_mib(outputs)} (outside the block)",
            *_floors(graph, tensors, "ORT's fused graph, DEFAULT order"),
            *_floors(written, infer_tensors(written), "the file's own order, no fusions"),
            f"  were the {len(run_time)} run-time-shape tensors left out of the pattern: block {_mib(without)}"]


def main(argv: list[str]) -> int:
    models = [Path(a) for a in argv] or [ROOT / "sample_models" / "gpt.onnx"]
    missing = [str(m) for m in models if not m.is_file()]
    if missing:
        print(f"bench.plain_floor: no such model: {', '.join(missing)}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="ckpt_plain_floor_") as tmp:
        for model in models:
            print("\n".join(report(model, Path(tmp))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
