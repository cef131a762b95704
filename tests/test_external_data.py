"""Models whose weights live in external data: analysed without reading the weights,
rewritten with the data written beside the output, and checked on ONNX Runtime."""

import json

import numpy as np
import onnx
from click.testing import CliRunner

from chain import chain_model
from ckpt_cli.cli import main


def external_chain(tmp_path):
    model = chain_model(layers=3, batch=64, width=128)
    rng = np.random.default_rng(0)
    keep = [v for v in model.graph.input if not v.name.startswith("layers.")]
    for v in [v for v in model.graph.input if v.name.startswith("layers.")]:
        model.graph.initializer.append(onnx.numpy_helper.from_array(
            (rng.standard_normal((128, 128)) * 0.1).astype(np.float32), v.name))
    del model.graph.input[:]
    model.graph.input.extend(keep)
    path = tmp_path / "src" / "ext.onnx"
    path.parent.mkdir()
    onnx.save(model, path, save_as_external_data=True, location="ext.weights", size_threshold=0)
    return path


def test_external_data_rewrite_and_check(tmp_path):
    src = external_chain(tmp_path)
    data_before = (src.parent / "ext.weights").read_bytes()
    out = tmp_path / "out" / "ext.ckpt.onnx"
    out.parent.mkdir()
    result = CliRunner().invoke(main, ["rewrite", str(src), "-o", str(out), "--check", "--runs", "1",
                                       "--provider", "cpu", "--json"])
    assert result.exit_code == 0, result.output
    r = json.loads(result.output)
    assert r["check"]["outputs_equal"] and r["check"]["order_matches"]
    assert len(list(out.parent.glob("ext.ckpt.onnx.*.data"))) == 1, "external data goes beside the output"
    stored = onnx.load(out, load_external_data=False).graph.initializer
    external = {x.name for x in onnx.load(src, load_external_data=False).graph.initializer
                if x.data_location == onnx.TensorProto.EXTERNAL}
    assert len(external) >= 3
    assert external <= {t.name for t in stored if t.data_location == onnx.TensorProto.EXTERNAL}, \
        "every external weight stays external (none read in and embedded)"
    assert (src.parent / "ext.weights").read_bytes() == data_before
    written = onnx.load(out)  # loads the external data too
    for t in written.graph.initializer:
        original = onnx.numpy_helper.to_array(
            next(x for x in onnx.load(src).graph.initializer if x.name == t.name), base_dir=str(src.parent))
        assert np.array_equal(onnx.numpy_helper.to_array(t), original)
