"""Models read and written a piece at a time are the bytes onnx reads and protobuf writes."""

import io
from pathlib import Path

import numpy as np
import onnx
import pytest
from google.protobuf.message import DecodeError
from onnx import TensorProto, helper, numpy_helper

from chain import chain_model
from ckpt_cli.io import serialize
from ckpt_cli.cli import main
from ckpt_cli.io.load import load_graph
from ckpt_cli.io.serialize import read_model, write_model
from click.testing import CliRunner

SAMPLES = sorted(Path(__file__).resolve().parent.parent.joinpath("sample_models").glob("*.onnx"))
BIG = serialize._PIECE_BYTES // 4 + 1  # float32 elements of a tensor over the piece size


def _every_field_model() -> onnx.ModelProto:
    """chain_model with every ModelProto and GraphProto field that is set in real files,
    initializers big and small interleaved, so both readers' pieces and chunks are used."""
    m = chain_model(layers=2, batch=4, width=8)
    g = m.graph
    rng = np.random.default_rng(0)
    for k, n in enumerate((BIG, 3, BIG + 5, 7, 1, BIG)):
        g.initializer.append(numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), f"w{k}"))
    g.initializer.append(helper.make_tensor("f", TensorProto.FLOAT, [3], [1.0, 2.0, 3.0]))  # float_data, not raw
    g.sparse_initializer.append(helper.make_sparse_tensor(
        helper.make_tensor("sv", TensorProto.FLOAT, [2], [1.0, 2.0]),
        helper.make_tensor("si", TensorProto.INT64, [2], [0, 3]), [4]))
    g.doc_string = "graph doc"
    g.value_info.append(helper.make_tensor_value_info("z0", TensorProto.FLOAT, [4, 8]))
    helper.set_metadata_props(m, {"k": "v", "ckpt": "x"})
    entry = g.metadata_props.add()
    entry.key, entry.value = "graph-key", "graph-value"
    m.doc_string, m.producer_name, m.producer_version, m.domain, m.model_version = "doc", "p", "1", "d", 3
    m.functions.append(helper.make_function("local", "F", ["a"], ["b"], [helper.make_node("Relu", ["a"], ["b"])],
                                            [helper.make_opsetid("", 17)]))
    info = m.training_info.add()
    info.algorithm.name = "algo"
    return m


def _models() -> list[tuple[str, onnx.ModelProto]]:
    return [(p.name, onnx.load(str(p))) for p in SAMPLES] + [("every field", _every_field_model())]


@pytest.mark.parametrize("name,model", _models(), ids=[n for n, _ in _models()])
def test_streamed_write_is_protobufs_serialization(name, model):
    out = io.BytesIO()
    write_model(model, out.write, stream_min_bytes=0)
    assert out.getvalue() == model.SerializeToString(deterministic=True)


def test_a_large_graph_is_written_a_piece_at_a_time():
    """A graph of STREAM_MIN_NODES nodes, without weights, is written in pieces (its
    serialization in one buffer is a copy of the graph beside the model, which set the
    peak of a 100k-node rewrite's save), and the pieces are protobuf's bytes."""
    m = chain_model(layers=2, batch=4, width=8)
    g = m.graph
    x = g.output[0].name
    for k in range(serialize.STREAM_MIN_NODES):
        g.node.append(helper.make_node("Identity", [x], [f"copy_{k}_{'x' * 40}"], name=f"identity_{k}_{'n' * 40}"))
    assert m.ByteSize() > 2 * serialize._PIECE_BYTES
    writes: list[int] = []
    out = io.BytesIO()

    def write(data: bytes) -> None:
        writes.append(len(data))
        out.write(data)

    write_model(m, write)
    assert out.getvalue() == m.SerializeToString(deterministic=True)
    assert max(writes) < serialize._PIECE_BYTES + 1024


@pytest.mark.parametrize("name,model", _models(), ids=[n for n, _ in _models()])
def test_streamed_read_is_onnx_load(tmp_path, name, model):
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    assert read_model(path, stream_min_bytes=0) == onnx.load(str(path), load_external_data=False)


def test_read_merges_repeated_and_out_of_order_fields(tmp_path):
    """A file is any concatenation of fields: the graph in two parts, fields after it."""
    model = _every_field_model()
    first, second = onnx.ModelProto(), onnx.ModelProto()
    first.ir_version = model.ir_version
    first.graph.node.extend(model.graph.node[:3])
    first.graph.initializer.extend(model.graph.initializer[:2])
    second.CopyFrom(model)
    del second.graph.node[:3]
    del second.graph.initializer[:2]
    path = tmp_path / "m.onnx"
    path.write_bytes(second.SerializeToString() + first.SerializeToString())
    expected = onnx.load(str(path), load_external_data=False)
    assert len(expected.graph.node) == len(model.graph.node)
    assert read_model(path, stream_min_bytes=0) == expected


def test_unknown_fields_are_kept_where_protobuf_puts_them():
    model = chain_model(layers=1, batch=2, width=2)
    parsed = onnx.ModelProto()
    parsed.ParseFromString(model.SerializeToString() + b"\xf8\x07\x05")  # field 127, varint 5
    out = io.BytesIO()
    write_model(parsed, out.write, stream_min_bytes=0)
    assert out.getvalue() == parsed.SerializeToString(deterministic=True)


@pytest.mark.parametrize("cut", [1, 2, 3, 10, 100, 1000])
def test_cut_short_file_is_a_decode_error(tmp_path, cut):
    raw = _every_field_model().SerializeToString()
    path = tmp_path / "cut.onnx"
    path.write_bytes(raw[:-cut])
    with pytest.raises(DecodeError):
        onnx.load(str(path), load_external_data=False)
    with pytest.raises(DecodeError):
        read_model(path, stream_min_bytes=0)


@pytest.mark.parametrize("data", [b"this is not a model\n" * 20, b"\x0f" * 64, b"\x08" + b"\xff" * 11])
def test_not_protobuf_is_one_line_exit_2(tmp_path, monkeypatch, data):
    monkeypatch.setattr(serialize, "STREAM_MIN_BYTES", 0)
    path = tmp_path / "bad.onnx"
    path.write_bytes(data)
    result = CliRunner().invoke(main, ["inspect", str(path)])
    assert result.exit_code == 2, result.output
    assert result.output.startswith("ckpt: error:") and "not a readable ONNX model" in result.output


def test_streamed_load_and_save_round_trip(tmp_path, monkeypatch):
    """``ckpt rewrite`` with both streamed: the file onnx writes for the same model."""
    monkeypatch.setattr(serialize, "STREAM_MIN_BYTES", 0)
    model = chain_model(layers=3, batch=64, width=256)
    model.graph.initializer.extend(numpy_helper.from_array(np.full((BIG,), k, np.float32), f"extra{k}")
                                   for k in range(2))
    src = tmp_path / "m.onnx"
    onnx.save(model, src)
    assert load_graph(src).model == onnx.load(str(src))
    result = CliRunner().invoke(main, ["rewrite", str(src), "-o", str(tmp_path / "out.onnx")])
    assert result.exit_code == 0, result.output
    written = (tmp_path / "out.onnx").read_bytes()
    assert written == onnx.load(str(tmp_path / "out.onnx")).SerializeToString(deterministic=True)
    monkeypatch.setattr(serialize, "STREAM_MIN_BYTES", 1 << 62)
    result = CliRunner().invoke(main, ["rewrite", str(src), "-o", str(tmp_path / "whole.onnx")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "whole.onnx").read_bytes() == written


def test_read_without_weights_leaves_out_only_big_embedded_initializers(tmp_path):
    model = _every_field_model()
    external = helper.make_tensor("ext", TensorProto.FLOAT, [4], [0.0] * 4)
    external.ClearField("float_data")
    external.data_location = TensorProto.EXTERNAL
    for key, value in (("location", "m.data"), ("offset", "0"), ("length", "16")):
        entry = external.external_data.add()
        entry.key, entry.value = key, value
    model.graph.initializer.append(external)
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    light = read_model(path, stream_min_bytes=0, embedded_weights=False)
    big = {t.name for t in model.graph.initializer if t.ByteSize() >= serialize._PIECE_BYTES}
    assert big == {"w0", "w2", "w5"}
    expected = onnx.ModelProto()
    expected.CopyFrom(model)
    del expected.graph.initializer[:]
    expected.graph.initializer.extend(t for t in model.graph.initializer if t.name not in big)
    assert light == expected
    from ckpt_cli.io.external import external_tensors
    assert [t.name for t in external_tensors(light)] == ["ext"]


def test_unknown_group_fields_read_as_onnx_reads_them(tmp_path):
    """Protobuf skips unknown fields of any wire type, groups too; the scanner leaves them to onnx.load."""
    raw = _every_field_model().SerializeToString() + b"\xa3\x06\x08\x01\xa4\x06"  # group 100 holding varint 1
    path = tmp_path / "m.onnx"
    path.write_bytes(raw)
    assert read_model(path, stream_min_bytes=0) == onnx.load(str(path), load_external_data=False)
