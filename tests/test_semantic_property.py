"""Semantics of ``ckpt rewrite`` on random training graphs at every opset from 7 to 18
(issue 34: nothing invalid with exit 0).

Each graph (tests/randgraph.py, float32, float64 and float16; a few fixed seeds per opset
and dtype) is rewritten three ways through the command line: the default plan,
``--auto sqrt`` and one ``--region`` pattern. Every written model must

* pass ``onnx.checker`` with ``full_check=True``;
* load in ONNX Runtime (CPU);
* give outputs bit-identical to the original's, both run with ckpt's session settings
  (one thread, ORT_DISABLE_ALL, PRIORITY_BASED).

ONNX Runtime's CPU provider has no bfloat16 kernels for these ops, so a bfloat16 graph runs
nowhere here: its rewrites must still exit 0 with a model the checker accepts and that
ORT refuses only as it refuses the input (no kernel), never as an invalid graph.

float16 on the CPU provider: ORT runs most float16 ops in float32 behind Casts it inserts,
and drops the Cast pairs between two such ops, so an intermediate that two float32 ops
pass between them is never rounded to float16. A rewrite that puts a float16 op (ckpt's
identity views and pin guards are Reshapes) between a recompute copy and its reader rounds
it where the original did not. The README documents the bound (``ckpt rewrite`` says it in
its first lines): within 1.5 float16 eps of the output's largest value. ``_f16_equal`` holds
float16 outputs to it; every other dtype must be bit-identical.

Each case runs as a fresh ``ckpt`` process would (the fixture resets what
ckpt_cli.ort.expand remembers for the whole process: which function ops ORT ran as they are).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

from ckpt_session import run_outputs as _run
from ckpt_session import session as _session
from randgraph import OPSETS, build_random_training_graph, random_feeds

from ckpt_cli.cli import main

WAYS = {
    "default": [],
    "sqrt": ["--auto", "sqrt"],
    "region": ["--region", "re:fwd_[0-3]_.*"],
}
SEEDS_PER_CASE = 3
DTYPES = ("float32", "float64", "float16")
BF16_OPSETS = tuple(o for o in OPSETS if o >= 13)

# README, "float16 and bfloat16 graphs on CPU": the largest difference a rewrite makes in a
# float16 output, in float16 eps of the output's largest value.
F16_NORMWISE_EPS = 1.5


def _seeds(opset: int) -> range:
    """Different graphs at each opset: 3 seeds each, 0-35 in all."""
    return range(SEEDS_PER_CASE * (opset - OPSETS[0]), SEEDS_PER_CASE * (opset - OPSETS[0] + 1))


def _graph(seed: int, dtype: str, opset: int) -> onnx.ModelProto:
    return build_random_training_graph(seed, 4 + seed % 14, dtype, opset=opset)


def _describe(name: str, a: np.ndarray, b: np.ndarray) -> str:
    """How far apart: the largest difference, in ULP of the element where it is (spacing of
    ``a``'s dtype there) and normwise (eps of ``a``'s dtype times max |a|)."""
    x, y = a.astype(np.float64), b.astype(np.float64)
    diff = np.abs(x - y)
    if not np.isfinite(diff).all():
        return f"output {name!r} differs ({int(np.sum(x != y))} elements, non-finite)"
    k = np.unravel_index(np.argmax(diff), diff.shape)
    ulp = float(diff[k]) / float(np.spacing(np.abs(a[k])))
    top = float(np.abs(x).max()) * float(np.finfo(a.dtype).eps) if a.dtype.kind == "f" else 0.0
    normwise = f", {float(diff[k]) / top:.2f} eps normwise" if top else ""
    return (f"output {name!r} differs in {int(np.sum(diff > 0))}/{diff.size} elements "
            f"(max abs diff {float(diff[k]):g}, {ulp:g} ULP there{normwise})")


def _exact_equal(a: np.ndarray, b: np.ndarray, name: str) -> None:
    if a.tobytes() != b.tobytes():
        raise AssertionError(_describe(name, a, b))


def _f16_equal(a: np.ndarray, b: np.ndarray, name: str = "") -> None:
    """The float16 rule: bit-identical, or within F16_NORMWISE_EPS of max |a| (finite)."""
    if a.tobytes() == b.tobytes():
        return
    x, y = a.astype(np.float64), b.astype(np.float64)
    diff = np.abs(x - y)
    top = float(np.abs(x).max()) * float(np.finfo(np.float16).eps)
    if not np.isfinite(diff).all() or float(diff.max()) > F16_NORMWISE_EPS * top:
        raise AssertionError(_describe(name, a, b) + f" (over {F16_NORMWISE_EPS} eps normwise)")


def _assert_same_outputs(expected: dict, got: dict) -> None:
    assert set(expected) == set(got)
    differ = []
    for name, a in expected.items():
        b = got[name]
        assert a.dtype == b.dtype and a.shape == b.shape, name
        try:
            (_f16_equal if a.dtype == np.float16 else _exact_equal)(a, b, name)
        except AssertionError as e:
            differ.append(str(e))
    if differ:
        raise AssertionError("; ".join(differ))


@pytest.fixture(autouse=True)
def _fresh_ckpt_process(monkeypatch):
    """What a new ``ckpt`` process starts with (see the module docstring)."""
    import ckpt_cli.ort.expand

    monkeypatch.setattr(ckpt_cli.ort.expand, "_RUN_AS_IS", set(), raising=False)


def _rewrite(src, out, way: str) -> None:
    result = CliRunner().invoke(main, ["rewrite", str(src), "-o", str(out), "--force", "-q", *WAYS[way]])
    assert result.exit_code == 0, f"ckpt rewrite {way}: exit {result.exit_code}: {result.output[-500:]}"
    assert "Traceback" not in result.output


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("opset", OPSETS, ids=[f"opset{o}" for o in OPSETS])
def test_rewrites_are_valid_and_bit_identical(opset, dtype, tmp_path):
    differ: dict[tuple, str] = {}
    for seed in _seeds(opset):
        model = _graph(seed, dtype, opset)
        src = tmp_path / f"seed{seed}.onnx"
        onnx.save(model, src)
        feeds = random_feeds(model, seed)
        expected = _run(model, feeds)
        for way in WAYS:
            out = tmp_path / f"seed{seed}.{way}.onnx"
            _rewrite(src, out, way)
            onnx.checker.check_model(str(out), full_check=True)
            written = onnx.load(out)
            assert [o.version for o in written.opset_import if o.domain in ("", "ai.onnx")] == [opset]
            try:
                _assert_same_outputs(expected, _run(out, feeds))
            except AssertionError as e:  # every seed and way runs; the report names them all
                differ[(opset, seed, way)] = str(e)
    assert not differ, "\n".join(f"seed {s}, {w}: {why}" for (_, s, w), why in differ.items())


@pytest.mark.parametrize("opset", BF16_OPSETS, ids=[f"opset{o}" for o in BF16_OPSETS])
def test_bfloat16_rewrites_are_valid(opset, tmp_path):
    """No CPU kernels for bfloat16: ORT must refuse the written model for that reason only."""
    for seed in _seeds(opset)[:2]:
        model = _graph(seed, "bfloat16", opset)
        src = tmp_path / f"seed{seed}.onnx"
        onnx.save(model, src)
        with pytest.raises(Exception, match="NOT_IMPLEMENTED"):
            _session(model)
        for way in WAYS:
            out = tmp_path / f"seed{seed}.{way}.onnx"
            _rewrite(src, out, way)
            onnx.checker.check_model(str(out), full_check=True)
            with pytest.raises(Exception, match="NOT_IMPLEMENTED"):
                _session(out)


def test_every_opset_and_dtype_makes_a_valid_runnable_graph():
    """The generator's own contract, at every opset (bfloat16 from 13; runnable: not on CPU)."""
    for opset in OPSETS:
        for dtype in (*DTYPES, "bfloat16"):
            if dtype == "bfloat16" and opset < 13:
                with pytest.raises(ValueError, match="bfloat16"):
                    _graph(0, dtype, opset)
                continue
            model = _graph(opset, dtype, opset)
            onnx.checker.check_model(model, full_check=True)
            if dtype != "bfloat16":
                out = _run(model, random_feeds(model, opset))
                assert {o.dtype for o in out.values()} == {np.dtype(dtype)}


def test_the_float16_rule_holds_the_documented_bound():
    x = np.array([1.0, 0.25], np.float16)
    _f16_equal(x, x.copy())
    _f16_equal(x, np.nextafter(x, np.float16(2)))  # 1 ULP of the largest value: 1 eps normwise
    with pytest.raises(AssertionError, match="over 1.5 eps normwise"):
        _f16_equal(x, x + np.float16(2 * np.finfo(np.float16).eps))
    with pytest.raises(AssertionError, match="differs"):
        _exact_equal(x.astype(np.float32), np.nextafter(x, np.float16(2)).astype(np.float32), "f32")
