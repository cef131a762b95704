"""A rewrite a later tool undid: inspect, check and session say so in one line; session
refuses a model ckpt did not write."""

from __future__ import annotations

import json

import onnx
import pytest
from click.testing import CliRunner

import ckpt_cli
from conftest import SAMPLES
from ckpt_cli.cli import main
from ckpt_cli.markers import GUARD_META, RECOMPUTE_META

UNDONE = "undid the rewrite; run ckpt last"


def simplify_as_a_slimmer_would(model: onnx.ModelProto) -> onnx.ModelProto:
    """What onnxslim's common-subexpression elimination does to a rewrite: each recompute
    copy merged back into the node it copies, each guard (a pass-through of its first input)
    folded away, inputs nothing reads removed, and node metadata dropped."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    by_name = {n.name: n for n in out.graph.node}
    rename: dict[str, str] = {}
    kept = []
    for node in out.graph.node:
        meta = {p.key: p.value for p in node.metadata_props}
        if RECOMPUTE_META in meta:
            rename.update(zip(node.output, by_name[meta[RECOMPUTE_META]].output))
        elif GUARD_META in meta and node.op_type == "Reshape":
            rename[node.output[0]] = node.input[0]
        else:
            kept.append(node)
    for node in kept:
        for k, name in enumerate(node.input):
            while name in rename:
                name = rename[name]
            node.input[k] = name
        del node.metadata_props[:]
    del out.graph.node[:]
    out.graph.node.extend(kept)
    read = {t for n in kept for t in n.input}
    unread = [i for i in out.graph.input if i.name not in read and i.name not in {t.name for t in out.graph.initializer}]
    for i in unread:
        out.graph.input.remove(i)
    return out


@pytest.fixture(scope="module")
def undone(tmp_path_factory):
    folder = tmp_path_factory.mktemp("undone")
    written = folder / "gpt.ckpt.onnx"
    ckpt_cli.rewrite_model(SAMPLES / "gpt.onnx", written)
    slimmed = simplify_as_a_slimmer_would(onnx.load(written))
    onnx.checker.check_model(slimmed)
    onnx.save(slimmed, folder / "gpt.slim.onnx")
    return written, folder / "gpt.slim.onnx"


def test_inspect_says_the_rewrite_was_undone_in_one_line(undone):
    written, slimmed = undone
    r = CliRunner().invoke(main, ["inspect", str(slimmed), "--json"])
    assert r.exit_code == 0, r.output
    lines = [line for line in r.stderr.splitlines() if UNDONE in line]
    assert len(lines) == 1 and "recompute copies" in lines[0] and "guard nodes" in lines[0]
    clean = CliRunner().invoke(main, ["inspect", str(written), "--json"])
    assert clean.exit_code == 0 and UNDONE not in clean.stderr


def test_session_warns_of_an_undone_rewrite_and_refuses_an_original(undone):
    written, slimmed = undone
    r = CliRunner().invoke(main, ["session", str(slimmed)])
    assert r.exit_code == 0 and UNDONE in r.stderr and "SessionOptions" in r.stdout
    original = CliRunner().invoke(main, ["session", str(SAMPLES / "gpt.onnx")])
    assert original.exit_code == 2 and original.stdout == ""
    assert original.stderr.strip().endswith("ckpt session prints the settings of `ckpt rewrite` outputs")
    assert "not a model ckpt wrote" in original.stderr and len(original.stderr.strip().splitlines()) == 1


def test_session_report_carries_the_undone_line_and_quiet_prints_nothing(undone, tmp_path):
    written, slimmed = undone
    r = CliRunner().invoke(main, ["session", str(slimmed), "--json"])
    assert r.exit_code == 0 and UNDONE in json.loads(r.stdout)["undone_rewrite"]
    clean = CliRunner().invoke(main, ["session", str(written), "-q", "--report", str(tmp_path / "s.json")])
    assert clean.exit_code == 0 and clean.stdout == ""
    report = json.loads((tmp_path / "s.json").read_text())
    assert report["undone_rewrite"] is None and report["settings"]["execution_order"] == "PRIORITY_BASED"
    assert report["session_settings"] == CliRunner().invoke(main, ["session", str(written)]).stdout


@pytest.mark.slow
def test_check_says_the_rewrite_was_undone(undone):
    written, slimmed = undone
    r = CliRunner().invoke(main, ["check", str(SAMPLES / "gpt.onnx"), str(slimmed), "--runs", "1", "--json"])
    assert UNDONE in r.stderr, r.output
