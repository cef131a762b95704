"""A short, seeded run of the fuzzer (``make fuzz`` runs 10,000 cases): no mutated model may
make ckpt crash, hang, print a traceback, touch its input, or exit 0 with an invalid output."""

from fuzz import run_fuzz


def test_short_fuzz_finds_no_defect():
    summary = run_fuzz(cases=200, seed=0, ort_every=5)
    assert not summary.defects, summary.defects[:5]
    assert summary.counts["correct"] >= 20 and summary.counts["clean_error"] >= 100, summary.counts
