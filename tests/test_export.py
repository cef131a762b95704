"""``ckpt export``: a PyTorch model nobody here wrote -> a training graph that ckpt rewrites
with bit-identical outputs; and, without torch, one line saying what to install (exit 4).

The main environment has no torch. The tests that need it run ``ckpt export`` in a venv built
once into ``.venv-torch`` in the repository root (gitignored by ``.venv-*/``) with
``pip install -e '.[torch]'``, as a user installs the extra (about 75 s with the local package
mirror, then reused); ``CKPT_TORCH_PYTHON`` may point at an interpreter with torch 2.13 and
onnxscript instead. If the build fails (no package index) those tests are skipped, with pip's
reason (and under CI=true the suite fails: see conftest.py).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import onnx
import pytest
from click.testing import CliRunner
from conftest import ROOT
from fixtures.venvs import VenvSpec, built_python

from ckpt_cli.cli import main

MODELS = ROOT / "tests" / "fixtures" / "export_models.py"
TORCH_VERSION = "2.13.0"
_PROBE = f"import torch, onnxscript, ckpt_cli; assert torch.__version__.split('+')[0] == {TORCH_VERSION!r}"


TORCH_VENV = VenvSpec(ROOT / ".venv-torch", ("-e", f"{ROOT}[torch]"), _PROBE, "CKPT_TORCH_PYTHON",
                      f"torch {TORCH_VERSION}, onnxscript and ckpt_cli",
                      shutil.which("python3.11") or sys.executable,  # torch's local wheel is for 3.11
                      probe_env={"PYTHONPATH": str(ROOT)})


@pytest.fixture(scope="session")
def torch_python() -> str:
    """An interpreter with torch 2.13 and onnxscript: ckpt installed with its [torch] extra."""
    return built_python(TORCH_VENV)


def _run(python: str, *args, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([python, "-m", "ckpt_cli.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=dict(os.environ, NO_COLOR="1", PYTHONPATH=str(ROOT)))


def _invoke(*args) -> tuple[int, str, str]:
    r = CliRunner().invoke(main, list(map(str, args)))
    return r.exit_code, r.stdout, r.stderr


# ------------------------------------------------------------------ without torch
def test_without_torch_one_line_says_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError, installed or not
    code, out, err = _invoke("export", f"{MODELS}:resnet", "-i", "2,3,8,8", "-o", tmp_path / "m.onnx")
    assert code == 4, (code, out, err)
    assert err.count("\n") == 1 and err.startswith("ckpt: error: torch is not installed"), err
    assert "pip install 'onnx-ckpt[torch]'" in err
    assert not (tmp_path / "m.onnx").exists()


def test_the_extra_named_in_the_error_exists():
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["name"] == "onnx-ckpt"
    assert any(d.startswith("torch==") for d in project["optional-dependencies"]["torch"])
    assert any(d.startswith("onnxscript") for d in project["optional-dependencies"]["torch"])


@pytest.mark.parametrize("spec, says", [
    ("8,3,x", "expected [NAME=]D0,D1"),
    ("8,64:int64", "needs its values' bound"),
    ("8,64:float32<5", "integer dtypes only"),
    ("8:complex64", "unknown dtype"),
])
def test_a_bad_input_shape_is_a_usage_error_before_torch(monkeypatch, tmp_path, spec, says):
    monkeypatch.setitem(sys.modules, "torch", None)
    code, _, err = _invoke("export", f"{MODELS}:resnet", "-i", spec, "-o", tmp_path / "m.onnx")
    assert code == 2 and says in err and err.count("\n") == 1, (code, err)


def test_factory_references(tmp_path):
    from ckpt_cli.errors import CkptError
    from ckpt_cli.export import load_factory

    (tmp_path / "mine.py").write_text("from helper import VALUE\nmake = lambda: VALUE\n")
    (tmp_path / "helper.py").write_text("VALUE = 3\n")  # a sibling import of the user's file
    (tmp_path / "broken.py").write_text("raise ValueError('bad\\nsecond line')\n")
    assert load_factory(f"{tmp_path / 'mine.py'}:make")() == 3
    assert load_factory("json:dumps") is json.dumps  # package.module:NAME
    assert load_factory("os.path:join.__name__") == "join"  # a dotted NAME
    for ref, says in (("models.py", "expected FILE.py:NAME"), (f"{tmp_path / 'mine.py'}:nothing", "has no 'nothing'"),
                      ("no/such.py:f", "no such file"), ("no_such_module_here:f", "no such module"),
                      (f"{tmp_path / 'broken.py'}:f", "importing it raised ValueError: bad$")):
        with pytest.raises(CkptError, match=says) as e:
            load_factory(ref)
        assert e.value.exit_code == 2


def test_input_specs():
    from ckpt_cli.export import InputSpec, parse_input_spec

    assert parse_input_spec("8,3,32,32") == InputSpec((8, 3, 32, 32))
    assert parse_input_spec("ids=8,64:int64<256") == InputSpec((8, 64), "int64", 256, "ids")
    assert parse_input_spec("mask=8,64:bool") == InputSpec((8, 64), "bool", None, "mask")
    assert parse_input_spec("scale=:float64") == InputSpec((), "float64", None, "scale")


def test_help_teaches_without_torch(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    code, out, _ = _invoke("export", "--help")
    assert code == 0
    for words in ("FILE.py:NAME", "--input-shape", "cross_entropy", "tangent_loss", "onnx-ckpt[torch]",
                  "ckpt rewrite resnet.onnx --check", "int64<256"):
        assert words in out, words


@pytest.mark.slow
def test_importing_ckpt_never_imports_torch(torch_python):
    """Where torch is installed: `ckpt --help`, `import ckpt_cli` and the API's name leave it out."""
    probe = ("import sys, ckpt_cli, ckpt_cli.cli, ckpt_cli.export; ckpt_cli.export_training_graph; "
             "from click.testing import CliRunner; CliRunner().invoke(ckpt_cli.cli.main, ['export', '--help']); "
             "assert 'torch' not in sys.modules, 'torch imported'; import torch")
    r = subprocess.run([torch_python, "-c", probe], capture_output=True, text=True, cwd=ROOT,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert r.returncode == 0, r.stderr


# ------------------------------------------------------------------ with torch
@pytest.mark.slow
def test_a_resnet_nobody_here_wrote_exports_and_rewrites_bit_identically(torch_python, tmp_path):
    out = tmp_path / "resnet.onnx"
    r = _run(torch_python, "export", f"{MODELS}:resnet", "-i", "images=4,3,16,16", "--loss", "cross_entropy",
             "-o", out)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-2000:])
    assert "max difference from eager PyTorch" in r.stdout and f"ckpt rewrite {out} --check" in r.stdout
    assert not [line for line in r.stderr.splitlines() if not line.startswith("ckpt: ")], r.stderr  # no chatter
    model = onnx.load(out)
    inputs = [i.name for i in model.graph.input]
    outputs = [o.name for o in model.graph.output]
    assert {"images", "labels", "tangent_loss", "stages.2.conv2.weight", "stages.2.short.bias"} <= set(inputs)
    assert outputs[0] == "loss" and "stem.weight_grad" in outputs and "stages.0.bn1.running_mean_updated" in outputs
    scopes = {p.value for n in model.graph.node for p in n.metadata_props if p.key == "namespace"}
    assert any("stages.3" in s for s in scopes), "module paths lost: ckpt cannot find the layers"
    assert (tmp_path / "resnet.init.npz").exists()

    check = subprocess.run([sys.executable, "-m", "ckpt_cli.cli", "rewrite", out, "--check", "--json"],
                           capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert check.returncode == 0, (check.stdout[-2000:], check.stderr[-2000:])
    report = json.loads(check.stdout)
    assert sum(reg["recompute_nodes"] for reg in report["regions"]) > 0, "nothing recomputed: a vacuous check"
    assert report["check"]["passed"] and report["check"]["outputs_equal"]
    assert all(o["bit_identical"] for o in report["check"]["outputs"].values())


def test_tied_weights_and_a_scalar_assigned_to_a_slice_export(torch_python, tmp_path):
    """As Hugging Face builds GPT-2, BERT and T5: the output layer's weight is the embedding's
    (AOTAutograd lifts each of its names apart: one graph input and one gradient, the sum, named
    as named_parameters() names it), and the decoder's inputs are the targets shifted right
    with a scalar assigned to a slice (torch.onnx writes that copy without broadcasting it)."""
    out = tmp_path / "tied.onnx"
    r = _run(torch_python, "export", f"{MODELS}:tied_seq2seq", "-o", out)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "max difference from eager PyTorch" in r.stdout, r.stdout  # the summed gradient compared too
    model = onnx.load(out)
    onnx.checker.check_model(model, full_check=True)
    inputs = [i.name for i in model.graph.input]
    outputs = [o.name for o in model.graph.output]
    assert inputs.count("embed.weight") == 1 and "lm_head.weight" not in inputs, inputs
    assert outputs.count("embed.weight_grad") == 1 and "lm_head.weight_grad" not in outputs, outputs
    code, out_text, err = _invoke("inspect", out, "--json")
    assert code == 0, err
    assert json.loads(out_text)["gradient_outputs"] == len([o for o in outputs if o.endswith("_grad")])


@pytest.mark.slow
def test_a_convnext_whose_knee_a_plain_session_holds_for_more_is_written_unchanged(torch_python, tmp_path,
                                                                                  monkeypatch):
    """A ConvNeXt-style joint graph: its knee saves under ckpt's settings, but in a plain
    InferenceSession (ORT's defaults) the rewrite's memory-pattern block takes a larger arena
    region than the original's, as ckpt predicts from ORT's fused graph. The default is then
    written unchanged with the reason; ORT measures the knee's rewrite above the original there."""
    from sessions import make_feeds, measure
    from ckpt_cli.verify import plain_choice

    src = tmp_path / "convnext.onnx"
    r = _run(torch_python, "export", f"{MODELS}:convnext_like", "-o", src, "-q")
    assert r.returncode == 0, r.stderr[-2000:]
    code, out, err = _invoke("rewrite", src, "-o", tmp_path / "default.onnx", "--json")
    assert code == 0, err
    report = json.loads(out)
    plain = report["planning"]["plain_session"]
    assert plain["chosen"] is None and report["recompute_nodes"] == 0, plain
    assert "above it there" in report["no_gain_reason"], report["no_gain_reason"]
    monkeypatch.setattr(plain_choice, "_not_above", lambda predicted, base, chosen: chosen)  # the knee as before
    code, out, err = _invoke("rewrite", src, "-o", tmp_path / "knee.onnx", "--json")
    assert code == 0 and json.loads(out)["recompute_nodes"] > 0, err
    feeds = tmp_path / "feeds.npz"
    make_feeds(src, feeds)
    original, knee = (measure(p, "plain", feeds)["peak_bytes"] for p in (src, tmp_path / "knee.onnx"))
    assert knee == plain["judged"][0]["plain_peak_bytes"] and knee > original * 1.01, (knee, original)
    assert measure(tmp_path / "default.onnx", "plain", feeds)["peak_bytes"] == original


@pytest.mark.slow
def test_a_factory_that_brings_its_inputs(torch_python, tmp_path):
    """gated_mlp returns (model, inputs) and its forward returns the loss; names from forward.
    Its attention (a fused CPU kernel) exports as the ops it is made of; its dropout draws
    ONNX's random numbers, so the export runs it on ORT without comparing values."""
    out = tmp_path / "mlp.onnx"
    r = _run(torch_python, "export", f"{MODELS}:gated_mlp", "-o", out)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "not compared with eager PyTorch: it draws random numbers (Dropout)" in r.stdout, r.stdout
    model = onnx.load(out)
    inputs = {i.name: i for i in model.graph.input}
    assert {"tokens", "targets", "emb.weight", "layers.2.weight", "norm.weight", "attn.in_proj_weight"} <= set(inputs)
    assert {"Dropout", "Softmax"} <= {n.op_type for n in model.graph.node}
    assert [d.dim_value for d in inputs["tokens"].type.tensor_type.shape.dim] == [4, 12]
    again = _run(torch_python, "export", f"{MODELS}:gated_mlp", "-o", out, "-q")
    assert again.returncode == 2 and "exists; pass --force" in again.stderr, again.stderr


@pytest.mark.slow
def test_a_model_that_returns_logits_needs_loss(torch_python, tmp_path):
    r = _run(torch_python, "export", f"{MODELS}:resnet", "-i", "2,3,8,8", "-o", tmp_path / "m.onnx", "-q")
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and "not a scalar loss" in r.stderr and "--loss" in r.stderr, r.stderr
    missing = _run(torch_python, "export", f"{MODELS}:nothing", "-o", tmp_path / "m.onnx")
    assert missing.returncode == 2 and "has no 'nothing'" in missing.stderr, missing.stderr
