"""The pinned rewrite (rewrite/pin.py) keeps its saving in sessions ckpt does not control:
guards invisible to the outputs, every copy held behind its trigger, and measured peaks on
ONNX Runtime under (a) a plain InferenceSession, (b) DEFAULT order + ORT_ENABLE_ALL and
(c) the settings the model records, against the original under ORT's defaults."""

from __future__ import annotations

import functools
import json

import numpy as np
import onnx
import pytest

from conftest import SAMPLES
from ckpt_cli.analysis import analyse
from ckpt_cli.graph import Graph
from ckpt_cli.io.load import load_graph
from ckpt_cli.planning import choose_plan
from ckpt_cli.ops import RESHAPE_FUSED_OPS
from ckpt_cli.markers import CSE_GUARD_ATTR, FRESH_META, GUARD_META, PIN_META, is_recompute_copy
from ckpt_cli.rewrite import rewrite
from ckpt_cli.io.written import to_model
from ckpt_cli.io.save import save_model

from sessions import make_feeds, measure
from synthetic import build_transformer

MODELS = ["gpt", "mlp", "cnn", "synthetic", "gpt12", "resnet18"]
# Sessions in which the pinned rewrite measures below the original under ORT's defaults
# (bench/SESSIONS.md has the figures). The mlp's default plan raises its peak and resnet18's
# is set by the order (ORT's DEFAULT order beats both; never-worse drops those plans in
# rewrite_plan, tests/test_no_gain.py); test_pin forces the plans to test the guards.
BELOW = {"gpt": ("plain", "default_all", "ckpt"), "cnn": ("default_all", "ckpt"), "mlp": (),
         "synthetic": ("plain", "default_all", "ckpt"), "gpt12": ("plain", "default_all", "ckpt"),
         "resnet18": ("ckpt",)}
# A plain InferenceSession on the GPT rewrites (measured 0.55x and ~0.4x; issue 14 asks 0.50x):
# the memory pattern's one block still lands in a power-of-two arena chunk.
PLAIN_RATIO = {"gpt": 0.6, "gpt12": 0.5}
GUARD_SLACK = 1024  # the guards' Size/Mul/Max outputs: a few tiny tensors live at once (arena blocks of 64 B)


def _source(name: str, tmp: str) -> str:
    if name != "synthetic":
        return str(SAMPLES / f"{name}.onnx")
    path = f"{tmp}/synthetic.onnx"
    onnx.save(build_transformer(2), path)
    return path


@functools.lru_cache(maxsize=None)
def _rewritten(name: str, tmp: str):
    source = _source(name, tmp)
    a = analyse(load_graph(source))
    plan = choose_plan(a)
    pinned, plain = rewrite(a, plan), rewrite(a, plan, pin=False)
    paths = {}
    for tag, result in (("pin", pinned), ("nopin", plain)):
        paths[tag] = f"{tmp}/{name}.{tag}.onnx"
        save_model(to_model(result), paths[tag])
    feeds = f"{tmp}/{name}.feeds.npz"
    make_feeds(source, feeds)
    return source, feeds, pinned, plain, paths


def _without_guards(g: Graph) -> list[tuple]:
    """(name, op, inputs) of the non-guard nodes, guard outputs read as the tensor they guard
    (fresh.py's views included)."""
    added = [n for n in g.nodes if n.meta(GUARD_META) or n.meta(FRESH_META)]
    alias = {n.outputs[0]: n.inputs[0] for n in added if n.op_type == "Reshape"}
    alias = {k: alias.get(v, v) for k, v in alias.items()}  # a fresh view of a guard output
    skip = {n.name for n in added}
    return [(n.name, n.op_type, tuple(alias.get(t, t) for t in n.inputs)) for n in g.nodes if n.name not in skip]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("pin"))


@pytest.mark.parametrize("name", MODELS)
def test_pin_only_adds_guards_and_holds_every_copy(name, workdir):
    _, _, pinned, plain, _ = _rewritten(name, workdir)
    g = pinned.graph
    assert pinned.guard_nodes == sum(1 for n in g.nodes if n.meta(GUARD_META)) > 0
    # --no-pin is today's graph: no guards, copies marked for CSE; pin changes nothing else.
    assert plain.pinned is None and not any(n.meta(GUARD_META) for n in plain.graph.nodes)
    copies = [n for n in plain.graph.nodes if is_recompute_copy(n)]
    copy_outputs = {t for n in copies for t in n.outputs}
    roots = [n for n in copies if not copy_outputs.intersection(n.inputs)]  # CSE could merge only these
    assert roots and all(any(a.name == CSE_GUARD_ATTR for a in n.proto.attribute) for n in roots)
    assert sorted(_without_guards(g)) == sorted(_without_guards(plain.graph))
    # Every copy depends on a Size guard of a tensor written before its block.
    held: set[int] = set()
    for n in g.nodes:
        if n.meta(GUARD_META) and n.op_type == "Size":
            held.add(n.index)
        if any(p in held for p in g.preds[n.index]):
            held.add(n.index)
    # (a view copy that reads no other copy is left unguarded: its readers are held instead)
    assert all(n.index in held for n in g.nodes if is_recompute_copy(n) and n.op_type not in RESHAPE_FUSED_OPS)
    assert any(n.index in held for n in g.nodes if is_recompute_copy(n) and n.op_type in RESHAPE_FUSED_OPS) \
        or not any(n.op_type in RESHAPE_FUSED_OPS for n in copies)
    # Written order = the executed (PRIORITY_BASED) order; the simulation knows the guards.
    assert list(pinned.after.priority.order) == list(range(len(g.nodes)))
    assert all(pinned.after.tensors[t].nbytes is not None for n in g.nodes if n.meta(GUARD_META) for t in n.outputs)
    model = to_model(pinned)
    assert {p.key: p.value for p in model.metadata_props}[PIN_META] == str(pinned.guard_nodes)
    onnx.checker.check_model(model, full_check=True)


@pytest.mark.parametrize("name", MODELS)
def test_no_reshape_with_a_computed_shape_feeds_a_reshape(name, workdir):
    """ONNX Runtime 1.25 to 1.30 refuse to load such a graph (ReshapeFusion loses the computed
    shape's edge); the guards and the fresh-tensor views are such Reshapes."""
    _, _, pinned, _, _ = _rewritten(name, workdir)
    g = pinned.graph
    constant = set(g.initializers) | {t for n in g.nodes if n.op_type == "Constant" for t in n.outputs}
    computed = {n.outputs[0] for n in g.nodes if n.op_type == "Reshape" and n.inputs[1] not in constant}
    assert computed, "no guards or views to check"
    # (a fresh view of a guard's output is one too: with no shape ORT knows at its end, the
    # pair is not merged and loads)
    feeding = [(n.name, t) for n in g.nodes if n.op_type in RESHAPE_FUSED_OPS and n.outputs[0] not in computed
               for t in n.inputs if t in computed]
    assert feeding == [], feeding[:5]


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_pinned_rewrite_on_ort(name, workdir):
    source, feeds, pinned, _, paths = _rewritten(name, workdir)
    outputs = {}

    def run(model, session, tag):
        out = f"{workdir}/{name}.{tag}.{session}.npz"
        r = measure(model, session, feeds, outputs=out)
        outputs[(tag, session)] = dict(np.load(out))
        return r

    original = run(source, "plain", "orig")["peak_bytes"]
    run(source, "ckpt", "orig")
    peaks = {s: run(paths["pin"], s, "pin")["peak_bytes"] for s in ("plain", "default_all")}
    ckpt = run(paths["pin"], "ckpt", "pin")
    peaks["ckpt"] = ckpt["peak_bytes"]
    run(paths["nopin"], "plain", "nopin")
    # Guards are invisible to the outputs: bit-identical to the unpinned graph under ORT's
    # defaults, and to the original where ORT runs the graph as written.
    a, b = outputs[("pin", "plain")], outputs[("nopin", "plain")]
    assert all(np.array_equal(a[k], b[k]) for k in a)
    a, b = outputs[("pin", "ckpt")], outputs[("orig", "ckpt")]
    assert all(np.array_equal(a[k], b[k]) for k in a)
    # Under the recorded settings ORT runs the file order, guards included (Constant nodes
    # become initializers: ORT runs no kernel for them).
    assert ckpt["executed"] == [n.name for n in pinned.graph.nodes if n.op_type != "Constant"]
    assert all(peaks[s] < original for s in BELOW[name]), (peaks, original)
    if name == "cnn":
        # Under ORT's defaults the memory pattern takes one power-of-two arena chunk: both
        # graphs get the same 8 MiB chunk, plus the guards' few bytes.
        assert peaks["plain"] <= original + GUARD_SLACK
    if name.startswith("gpt"):  # issue 14's goal for (c); (a) with fresh tensors (rewrite/fresh.py)
        assert peaks["ckpt"] <= 0.4 * original
        assert peaks["plain"] <= PLAIN_RATIO[name] * original, (peaks, original)


def test_cli_reports_the_guards_and_no_pin_writes_none(tmp_path):
    from click.testing import CliRunner

    from ckpt_cli.cli import main

    reports = {}
    for flag in ("--pin", "--no-pin"):
        out = tmp_path / f"gpt{flag}.onnx"
        done = CliRunner().invoke(main, ["rewrite", str(SAMPLES / "gpt.onnx"), "-o", str(out), flag, "--json"])
        assert done.exit_code == 0, done.output
        model = onnx.load(str(out))
        guards = sum(1 for n in model.graph.node if any(p.key == GUARD_META for p in n.metadata_props))
        reports[flag] = (json.loads(done.stdout), guards, {p.key: p.value for p in model.metadata_props})
    report, guards, meta = reports["--pin"]
    assert report["pin"]["guard_nodes"] == guards == int(meta[PIN_META]) > 0
    report, guards, meta = reports["--no-pin"]
    assert report["pin"] is None and guards == 0 and PIN_META not in meta


def test_triggers_of_equals_a_scan_per_position():
    """triggers_of answers every position with one backward scan per gap: the same as the
    plain scan from each position (a rewrite of the gpt sample, random positions and skips)."""
    import random

    from ckpt_cli.ops import SHAPE_ONLY_OPS
    from ckpt_cli.planning.regions import default_regions
    from ckpt_cli.rewrite.guards import read_by_fusion
    from ckpt_cli.rewrite.pin import triggers_of

    g = load_graph(SAMPLES / "gpt.onnx")
    a = analyse(g)
    result = rewrite(a, default_regions(a), pin=False)
    graph = result.graph
    forward = {n.name for n in g.nodes if a.phases.is_forward[n.index]}
    outputs = set(graph.outputs)

    def scan(position, skip):
        for k in range(position - 1, -1, -1):
            node = graph.nodes[k]
            if k in skip or node.op_type in SHAPE_ONLY_OPS or node.op_type == "Constant":
                continue
            out = next((t for t in node.outputs if t and (node.name not in forward or t in outputs)), None)
            if out is not None and not read_by_fusion(graph, out):  # a Size there would stop a fusion
                return out
        return None

    rng = random.Random(0)
    n = len(graph.nodes)
    for _ in range(20):
        skip = set(rng.sample(range(n), rng.randrange(n // 2)))
        positions = [rng.randrange(n + 1) for _ in range(rng.randrange(1, 30))]
        assert triggers_of(graph, positions, forward, skip) == [scan(p, skip) for p in positions]


def test_default_order_runs_a_block_after_the_older_inputs_of_its_readers():
    """ORT's DEFAULT order walks a node's highest-index producer first, so a block written
    right before its reader would run before the reader's older backward inputs (the ORT
    zoo's frozen_backbone: a ConvGrad's dY). With ``waits`` the gate waits for them: in the
    DEFAULT order every copy runs after each such input, unless a Size there would stop a
    fusion."""
    from ckpt_cli.analysis import schedules
    from ckpt_cli.rewrite import pinned
    from ckpt_cli.rewrite.guards import read_by_fusion
    from ckpt_cli.rewrite.select import make_plan

    g = load_graph(SAMPLES / "zoo" / "frozen_backbone" / "training_model.onnx")
    a = analyse(g, dims={"batch": 64})
    written = pinned(a, rewrite(a, make_plan(a).plan, False), waits=True)
    assert written.pinned is not None and written.pinned.waits > 0
    graph = written.graph
    forward = {n.name for n in g.nodes if a.phases.is_forward[n.index]}
    position = {i: k for k, i in enumerate(schedules.ort_default(graph))}
    copies = {n.index for n in graph.nodes if is_recompute_copy(n) or n.name.endswith("_recompute")}
    checked = 0
    for c in copies:
        for reader in {r for t in graph.nodes[c].outputs for r in graph.consumers.get(t, ())} - copies:
            for x in graph.nodes[reader].inputs:
                p = graph.producer.get(x)
                if (p is None or p > c or p in copies or graph.nodes[p].name in forward
                        or graph.nodes[p].meta(GUARD_META) or graph.nodes[p].meta(FRESH_META)
                        or read_by_fusion(graph, x)):
                    continue
                checked += 1
                assert position[p] < position[c], (graph.nodes[c].name, x)
    assert checked



@functools.lru_cache(maxsize=1)
def _unet_plan():
    """The zoo unet, its analysis and its default plan (two tests pin it)."""
    from ckpt_cli.rewrite.select import make_plan

    g = load_graph(SAMPLES / "zoo" / "unet" / "training_model.onnx")
    a = analyse(g, dims={"batch": 64})
    return g, a, make_plan(a).plan


def _unet_copies_in_default_order(waits: bool):
    """The zoo unet's default plan pinned with ``waits`` or without, and in ORT's DEFAULT
    order of it no recompute copy before the node it copies: (input graph, its analysis,
    the pinned graph, DEFAULT position by node index, the copies)."""
    from ckpt_cli.analysis import schedules
    from ckpt_cli.markers import recompute_source
    from ckpt_cli.rewrite import pinned

    g, a, plan = _unet_plan()
    graph = pinned(a, rewrite(a, plan, False), waits=waits).graph
    position = {i: k for k, i in enumerate(schedules.ort_default(graph))}
    by_name = {n.name: n.index for n in graph.nodes}
    copies = [n for n in graph.nodes if recompute_source(n) is not None]
    assert len(copies) > 20
    for c in copies:
        assert position[by_name[recompute_source(c)]] < position[c.index], c.name
    return g, a, graph, position, copies


def test_default_order_runs_each_run_of_a_blocks_copies_after_the_forward_and_its_own_trigger():
    """The zoo unet's descended plan recomputes its whole forward in one region, whose
    copies are written in three runs through the backward. With ``waits`` each run is a
    block of its own, behind a trigger the forward computes (not ``Sub(2, 1)`` of the
    loss's ``Pow`` gradient, which ORT's DEFAULT order runs first): in that order no copy
    runs before the node it copies, each runs after the older backward inputs of its
    readers, and the simulated peak stays below the original's there (75.7 MiB with one
    guard for the three runs, 83.7 with that trigger, 53.2 now; the original 77.7)."""
    from ckpt_cli.analysis import default_order
    from ckpt_cli.markers import recompute_source

    g, a, graph, position, copies = _unet_copies_in_default_order(waits=True)
    forward = {t for n in g.nodes if a.phases.is_forward[n.index] for t in n.outputs}
    for c in copies:
        for reader in {r for t in c.outputs for r in graph.consumers.get(t, ())}:
            for x in graph.nodes[reader].inputs:
                p = graph.producer.get(x)
                if (p is None or p > c.index or x in forward or recompute_source(graph.nodes[p]) is not None
                        or graph.nodes[p].meta(GUARD_META) is not None):
                    continue
                assert position[p] < position[c.index], (c.name, x)
    original = default_order(analyse(g, dims={"batch": 64}, reuse_buffers=False)).peak_bytes
    rewritten = default_order(analyse(graph, dims={"batch": 64}, reuse_buffers=False)).peak_bytes
    assert rewritten < 0.75 * original, (rewritten, original)


@pytest.mark.parametrize("model", ["llama", "lstm"])
def test_a_split_pin_hides_no_shape_ckpt_sizes_copies_by(model):
    """Split into runs, a block's copies can read shapes that another block computes (zoo
    llama's Reshape copies, lstm's ConstantOfShape copy): int64 tensors stay off the guards
    of a split pin. A guard's shape is a runtime value, so ORT knows nothing past a guarded
    shape before the run, and ckpt's inference of the written file once lost what followed
    (181 tensors of llama's rewrite, and ``ckpt check`` failed)."""
    from ckpt_cli.api import analyse_input, load_input
    from ckpt_cli.rewrite.pin import pin
    from ckpt_cli.rewrite.select import make_plan

    a = analyse_input(load_input(SAMPLES / "zoo" / model / "training_model.onnx"))
    result = rewrite(a, make_plan(a).plan, False)
    forward = {n.name for n in a.graph.nodes if a.phases.is_forward[n.index]}
    split = pin(result.graph, result.after.tensors, forward, True, split=True)
    assert split.guard_nodes > 0
    guarded = [n.inputs[0] for n in split.graph.nodes if n.op_type == "Reshape" and n.meta(GUARD_META) is not None]
    assert guarded and all((info := result.after.tensors.get(t)) is None or info.dtype != onnx.TensorProto.INT64
                           for t in guarded)
    assert analyse(split.graph, dims=dict(a.dims)).unsized == {}


def test_a_split_pin_is_taken_only_where_it_simulates_clearly_lower():
    """The zoo gpt's default simulates 8 bytes lower in ORT's DEFAULT order with its blocks
    split into runs, and the Module session measured it 44.3 MiB untuned against 40.1
    unsplit: below ``SPLIT_GAIN`` the pin keeps its blocks whole."""
    from ckpt_cli.api import analyse_input, load_input
    from ckpt_cli.rewrite import pinned
    from ckpt_cli.rewrite.pin import pin
    from ckpt_cli.rewrite.select import make_plan

    a = analyse_input(load_input(SAMPLES / "zoo" / "gpt" / "training_model.onnx"))
    result = rewrite(a, make_plan(a).plan, False)
    forward = {n.name for n in a.graph.nodes if a.phases.is_forward[n.index]}
    whole = pin(result.graph, result.after.tensors, forward, True)
    split = pin(result.graph, result.after.tensors, forward, True, split=True)
    assert split.blocks > whole.blocks
    written = pinned(a, result, waits=True)
    assert written.pinned is not None and written.pinned.blocks == whole.blocks


def test_a_plain_pin_never_triggers_on_a_node_that_reads_nothing_the_forward_computes():
    """Without ``waits`` too (a plain InferenceSession runs ORT's DEFAULT order), a block's
    trigger is a node the forward computes: on the zoo unet's plan, the plain pin's trigger
    was ``Sub(2, 1)`` of the loss's ``Pow`` gradient, and in that order 19 of its 30 copies
    ran before the nodes they copy (simulated without reuse: 83.7 MiB, 75.7 now)."""
    _unet_copies_in_default_order(waits=False)


def test_the_written_graph_takes_the_pin_the_default_order_check_made(monkeypatch):
    """Where the DEFAULT-order check judges the waiting order against the other and the
    other wins (a 70-layer synthetic transformer's default plan, 10k nodes), the written
    graph takes the pin the check made of it: no third pin, and the same graph a fresh
    pin of it writes."""
    from dataclasses import replace

    import ckpt_cli.rewrite as rewrite_stage
    from ckpt_cli.rewrite import pinned, schedule
    from ckpt_cli.rewrite.pin import pin as real_pin
    from ckpt_cli.rewrite.select import make_plan

    a = analyse(Graph.from_model(build_transformer(70)))
    plan = make_plan(a).plan
    calls = []

    def counted(*args, **kwargs):
        calls.append(1)
        return real_pin(*args, **kwargs)

    monkeypatch.setattr(schedule, "pin", counted)
    monkeypatch.setattr(rewrite_stage, "pin_schedule", counted)
    result = rewrite(a, plan, False)
    assert len(calls) == 2 and result.plain_pin is not None and result.plain_pin[0] is result.graph
    written = pinned(a, result)
    assert len(calls) == 2
    fresh = pinned(a, replace(result, plain_pin=None))
    assert len(calls) == 3
    assert [n.proto for n in written.graph.nodes] == [n.proto for n in fresh.graph.nodes]
    assert written.pinned.guard_nodes == fresh.pinned.guard_nodes > 0
