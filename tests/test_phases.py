"""Forward/backward classification against PyTorch's own tags (the sidecars)."""

import json

import pytest

from conftest import SAMPLES
from ckpt_cli.analysis.phases import BACKWARD, FORWARD, classify
from ckpt_cli.io.load import load_graph

MODELS = ["mlp", "gpt", "cnn", "gpt12", "resnet18"]


def _compare(name):
    graph = load_graph(SAMPLES / f"{name}.onnx")
    truth = json.loads((SAMPLES / f"{name}.phases.json").read_text())["phases"]
    phases = classify(graph)
    ours = {n.name: phases.phase(n.index) for n in graph.nodes}
    assert set(truth) == set(ours), "the sidecar must cover every node"
    return graph, phases, truth, [n for n in ours if ours[n] != truth[n]]


@pytest.mark.parametrize("name", MODELS)
def test_agrees_with_pytorch_on_99_percent(name):
    graph, phases, truth, wrong = _compare(name)
    agreement = 1 - len(wrong) / len(graph.nodes)
    assert agreement >= 0.99, (agreement, wrong[:10])


@pytest.mark.parametrize("name", MODELS)
def test_disagreements_are_explained(name):
    """Every disagreement is a node PyTorch tags forward that no forward output needs and
    that no exported forward op shares: a forward op whose result only the backward reads.
    Our rule puts those in the backward, which is where their memory matters."""
    graph, phases, truth, wrong = _compare(name)
    by_name = {n.name: n for n in graph.nodes}
    for node_name in wrong:
        node = by_name[node_name]
        assert truth[node_name] == FORWARD and phases.phase(node.index) == BACKWARD
        readers = [c for t in node.outputs for c in graph.consumers.get(t, ())]
        assert all(not phases.is_forward[c] for c in readers)


def test_loss_and_gradients_detected():
    phases = classify(load_graph(SAMPLES / "gpt.onnx"))
    assert phases.loss == "loss"
    assert all(g.endswith("_grad") for g in phases.grad_outputs)
    assert len(phases.grad_outputs) == 53


def test_ort_artifact_phases_match_its_markers():
    """ORT artifacts mark backward nodes with the doc string 'Backward pass'."""
    graph = load_graph(SAMPLES / "ort_artifact" / "training_model.onnx")
    phases = classify(graph)
    for node in graph.nodes:
        if node.proto.doc_string == "Backward pass":
            assert phases.phase(node.index) == BACKWARD, node.name
