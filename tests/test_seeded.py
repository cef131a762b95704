"""Random ops ORT seeds by their node index: the report names a written order that moves one."""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper

from ckpt_cli.graph import Graph
from ckpt_cli.rewrite.seeded import index_seeded, moved_seeds, seed_order


def _graph(nodes: list[onnx.NodeProto]) -> Graph:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y]), opset_imports=[helper.make_opsetid("", 17)])
    return Graph.from_model(model)


def _c(name: str = "c") -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], name=name, value=helper.make_tensor(name, TensorProto.FLOAT, [], [1.0]))


def _nodes(**random_attrs) -> list[onnx.NodeProto]:
    return [_c(), helper.make_node("Identity", ["x"], ["a"], name="id"),
            helper.make_node("RandomNormalLike", ["a"], ["r"], name="noise", **random_attrs),
            helper.make_node("Add", ["r", "c"], ["y"], name="add")]


def test_ort_numbers_every_node_but_constants():
    assert index_seeded(_graph(_nodes())) == {"noise": 1}
    assert index_seeded(_graph([_c("c0"), *_nodes()])) == {"noise": 1}
    assert index_seeded(_graph(_nodes(seed=3.0))) == {}  # a seed attribute: its draws are its own


def test_a_written_order_that_moves_one_is_named():
    original = _graph(_nodes())
    assert moved_seeds(original, _graph([_c("c0"), *_nodes()])) == ()
    early = helper.make_node("Shape", ["x"], ["s"], name="early")
    (line,) = moved_seeds(original, _graph([early, *_nodes()]))
    assert line.startswith("ORT seeds RandomNormalLike 'noise' by its node index, which the written order "
                           "moves from 1 to 2: ")
    seeded = _graph(_nodes(seed=3.0))
    assert moved_seeds(seeded, _graph([early, *_nodes(seed=3.0)])) == ()


def test_a_budget_rewrite_of_the_sampling_autoencoder_keeps_its_noise_index():
    """The zoo's sampling_ae draws its VAE sample with RandomNormalLike (no seed): a budget
    rewrite runs backward shape nodes first, which would move the noise's ORT index from 11
    to 18; seven nodes that neither feed nor read it are written after it instead."""
    import ckpt_cli
    from conftest import SAMPLES

    result = ckpt_cli.rewrite_model(SAMPLES / "zoo" / "sampling_ae" / "training_model.onnx", budget="80%").result
    assert result.recompute_nodes > 0
    assert index_seeded(result.graph) == {"/RandomNormalLike": 11}
    assert not [n for n in result.notes if n.startswith("ORT seeds")], result.notes


def test_seed_order_writes_free_nodes_past_the_noise():
    original = _graph(_nodes())
    early = helper.make_node("Shape", ["x"], ["s"], name="early")
    written = _graph([early, *_nodes()])
    order = seed_order(written, index_seeded(original))
    assert order is not None
    assert [written.nodes[i].name for i in order] == ["c", "id", "noise", "early", "add"]
    assert index_seeded(written.reordered(order)) == {"noise": 1}
    assert seed_order(original, index_seeded(original)) is None  # nothing to move


def test_seed_order_moves_no_node_the_noise_depends_on():
    """Only the noise's own inputs are written ahead of it, and only what reads it after it:
    nothing may cross it."""
    reads = helper.make_node("Identity", ["x"], ["b"], name="b")
    written = _graph([reads, helper.make_node("Identity", ["b"], ["a"], name="id"),
                      helper.make_node("RandomNormalLike", ["a"], ["r"], name="noise"),
                      helper.make_node("Neg", ["r"], ["y"], name="add")])
    assert index_seeded(written) == {"noise": 2}
    assert seed_order(written, {"noise": 1}) is None  # both nodes ahead feed it
    assert seed_order(written, {"noise": 3}) is None  # the node after reads it


def test_the_kept_index_draws_the_original_numbers(tmp_path):
    """ORT seeds the kernel with its global seed plus the node index: the order seed_order
    writes draws what the original draws, the unkept one other numbers."""
    import numpy as np
    import onnxruntime as ort

    def draws(nodes: list[onnx.NodeProto]) -> np.ndarray:
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [64])
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [64])
        model = helper.make_model(helper.make_graph(nodes, "g", [x], [y]), opset_imports=[helper.make_opsetid("", 17)],
                                  ir_version=8)
        ort.set_seed(7)
        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        return session.run(None, {"x": np.zeros(64, np.float32)})[0]

    original = _graph(_nodes())
    early = helper.make_node("Neg", ["x"], ["s"], name="early")
    written = _graph([early, *_nodes()])
    order = seed_order(written, index_seeded(original))
    assert order is not None
    kept = [written.nodes[i].proto for i in order]
    assert np.array_equal(draws(kept), draws(_nodes()))
    assert not np.array_equal(draws([early, *_nodes()]), draws(_nodes()))


def test_a_graph_written_unchanged_has_no_such_note():
    """The default rewrite of sampling_ae is the unchanged graph (the Module judgement, or
    without it no plan lower): nothing moved, nothing said."""
    import ckpt_cli
    from conftest import SAMPLES

    result = ckpt_cli.rewrite_model(SAMPLES / "zoo" / "sampling_ae" / "training_model.onnx").result
    assert not [n for n in result.notes if n.startswith("ORT seeds")], result.notes


def test_a_written_graph_that_moves_the_noise_says_so():
    """Where no order keeps the index (``seeds_kept`` found none), the written graph's notes
    name the move."""
    from dataclasses import replace

    from conftest import SAMPLES

    from ckpt_cli.analysis import analyse
    from ckpt_cli.io.load import load_graph
    from ckpt_cli.rewrite import unchanged
    from ckpt_cli.rewrite.select import judged_rewrite

    a = analyse(load_graph(SAMPLES / "zoo" / "sampling_ae" / "training_model.onnx"),
                {"batch": 4, "Convpred_dim_2": 32, "Convpred_dim_3": 32})
    shapes_first = sorted(range(len(a.graph.nodes)), key=lambda i: (a.graph.nodes[i].op_type != "Shape", i))
    moved = replace(unchanged(a), graph=a.graph.reordered(shapes_first))
    notes = judged_rewrite(a, None, moved).notes
    assert [n for n in notes if n.startswith("ORT seeds RandomNormalLike '/RandomNormalLike'")], notes
