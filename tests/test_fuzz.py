"""A short, seeded run of the fuzzer (``make fuzz`` runs 10,000 cases): no mutated or generated
model may make ckpt crash, hang, print a traceback, touch its input, or exit 0 with an invalid
output or one whose outputs on ONNX Runtime differ from the input's."""

from fuzz import run_fuzz


def test_short_fuzz_finds_no_defect():
    summary = run_fuzz(cases=200, seed=0)
    assert not summary.defects, summary.defects[:5]
    assert summary.counts["correct"] >= 20 and summary.counts["clean_error"] >= 100, summary.counts
    assert summary.ort_compared >= 10, "written models must run on ONNX Runtime, compared with their inputs"
