"""Random ops ORT seeds by their node index: the report names a written order that moves one."""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper

from ckpt_cli.graph import Graph
from ckpt_cli.rewrite.seeded import index_seeded, moved_seeds


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


def test_the_rewrite_of_a_sampling_autoencoder_says_its_noise_moved():
    """The zoo's sampling_ae draws its VAE sample with RandomNormalLike (no seed): a budget
    rewrite runs backward shape nodes first, which moves the noise's ORT index."""
    import ckpt_cli
    from conftest import SAMPLES

    result = ckpt_cli.rewrite_model(SAMPLES / "zoo" / "sampling_ae" / "training_model.onnx", budget="80%").result
    moved = [n for n in result.notes if n.startswith("ORT seeds RandomNormalLike '/RandomNormalLike'")]
    assert len(moved) == 1 and "moves from 11 to " in moved[0], result.notes


def test_a_graph_written_unchanged_has_no_such_note():
    """The default rewrite of sampling_ae is the unchanged graph (the Module judgement, or
    without it no plan lower): nothing moved, nothing said."""
    import ckpt_cli
    from conftest import SAMPLES

    result = ckpt_cli.rewrite_model(SAMPLES / "zoo" / "sampling_ae" / "training_model.onnx").result
    assert not [n for n in result.notes if n.startswith("ORT seeds")], result.notes
