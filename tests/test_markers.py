"""A recompute copy is known by the metadata the rewrite writes, never by its name:
``unique_name()`` names a copy ``<node>_recompute_2`` when ``<node>_recompute`` is taken, and
a user's node may be called ``..._recompute`` without being a copy."""

from __future__ import annotations

import json

import onnx
import pytest
from chain import chain_model

import ckpt_cli
from ckpt_cli.markers import SUFFIX, is_recompute_copy, recompute_source
from ckpt_cli.report.compare import load_input


def _renamed(model: onnx.ModelProto, node: str, name: str) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    next(n for n in out.graph.node if n.name == node).name = name
    return out


def _share(tmp_path, model: onnx.ModelProto, stem: str) -> tuple[float | None, float | None]:
    """compare's recompute share of the model itself and of its inspect report."""
    path, report = tmp_path / f"{stem}.onnx", tmp_path / f"{stem}.json"
    onnx.save(model, path)
    report.write_text(json.dumps(ckpt_cli.inspect_model(path).to_json()))
    return (load_input(path, "model").figures["recompute_share"],
            load_input(report, "report").figures["recompute_share"])


def test_a_copy_named_recompute_2_is_a_copy(tmp_path):
    # A backward node already has the name the copy of /layers.1/MatMul would get.
    taken = "/layers.1/MatMul" + SUFFIX
    model = _renamed(chain_model(layers=3, batch=8, width=16), "/layers.1/Cast_grad", taken)
    result = ckpt_cli.rewrite_model(model, auto="layers")
    nodes = {n.name: n for n in result.model.graph.node}
    copy = next(n for n in result.model.graph.node if recompute_source(n) == "/layers.1/MatMul")
    assert copy.name == taken + "_2"
    assert is_recompute_copy(copy) and not is_recompute_copy(nodes[taken])
    copies = [n for n in result.model.graph.node if is_recompute_copy(n)]
    assert len(copies) == result.result.recompute_nodes > 0

    inspected = ckpt_cli.inspect_model(result.model).to_json()
    assert inspected["recompute_nodes"] == len(copies)
    assert inspected["recompute_flops"] == result.result.recompute_flops > 0
    assert inspected["phases"][copy.name] == inspected["phases"][taken] == "backward"
    of_model, of_report = _share(tmp_path, result.model, "rewritten")
    rest = inspected["forward_flops"] + inspected["backward_flops"] - inspected["recompute_flops"]
    assert of_model == of_report == pytest.approx(result.result.recompute_flops / rest)


def test_a_user_node_named_recompute_is_not_a_copy(tmp_path):
    name = "/layers.0/MatMul" + SUFFIX
    model = _renamed(chain_model(layers=3, batch=8, width=16), "/layers.0/MatMul", name)
    inspected = ckpt_cli.inspect_model(model).to_json()
    assert not is_recompute_copy(next(n for n in model.graph.node if n.name == name))
    assert inspected["phases"][name] == "forward"
    assert inspected["recompute_nodes"] == inspected["recompute_flops"] == 0
    assert _share(tmp_path, model, "user") == (0.0, 0.0)
    # Rewritten, its own copy is a copy, named after it.
    result = ckpt_cli.rewrite_model(model, auto="layers")
    copy = next(n for n in result.model.graph.node if recompute_source(n) == name)
    assert copy.name == name + SUFFIX and is_recompute_copy(copy)
