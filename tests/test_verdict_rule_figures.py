"""Each rule of the check's verdict, applied by ``judge`` to figures a measurement gives.

Where a rule's premise cannot be broken on a CPU run of ORT's inference build (a second
device, ORT's training build, a session that fails to load), its test builds the figures
a measurement gives and judges them with every rule: dropping the rule from ``RULES``, or
inverting its condition, fails the test (``make mutate`` checks it). Tests name what a
rule found by its code; a few also hold the wording a user reads.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from ckpt_cli.units import human_bytes as hb
from ckpt_cli.verify.rules import PROCESS_PEAK_NOISE_BYTES, judge, noise
from ckpt_cli.verify.figures import (CheckFigures, MeasuredRuns, Measurement, OutputFigures, PlainPrediction,
                                     PredictionFigures)
from ckpt_cli.verify.records import ComparisonSummary, Mismatch, OrderCheck, OutputComparison

MB = 1_000_000


def _measured(peak: int, method: str = "profiler") -> Measurement:
    return Measurement(peak, peak, peak, 0.01, method, [])


def _figures(original: int = 10 * MB, rewritten: int = 6 * MB, method: str = "profiler", **runs) -> CheckFigures:
    """A passing check: equal outputs, the order followed, a lower peak predicted exactly."""
    measured = MeasuredRuns(_measured(original, method), _measured(rewritten, method),
                            runs.pop("original_ort_default", None), runs.pop("rewritten_ort_default", None),
                            runs.pop("rewritten_ort_default_error", None))
    sides = {"original": original, "rewritten": rewritten}
    return CheckFigures(
        provider="cpu", ort_version="1.31.1", enable_mem_reuse=True,
        outputs=OutputFigures(True, True, None, 0.0, {"w_grad": OutputComparison(True, True)},
                              **runs),
        measured=measured, order=OrderCheck(True),
        prediction=PredictionFigures(sides, {k: 0.0 for k in sides}, sides, {k: 0.0 for k in sides}, 0.1))


def _judged(f: CheckFigures) -> CheckFigures:
    return judge(f, tolerant=False)


def test_the_base_figures_pass_every_rule_without_a_note():
    f = _judged(_figures())
    assert f.passed and f.findings == () and f.codes == [] and f.memory_lower


def test_runs_in_default_session_fails_a_rewrite_ort_defaults_cannot_run():
    f = _judged(_figures(rewritten_ort_default_error="load_failed: Node (guard) has input size 3 not in range"))
    assert f.codes == ["runs_in_default_session"] and not f.passed
    assert "(load_failed: Node (guard) has input size 3 not in range)" in f.failures[0]  # why, as ORT said


def test_default_session_saving_note_says_when_ort_defaults_save_nothing():
    f = _judged(_figures(original_ort_default=_measured(8 * MB), rewritten_ort_default=_measured(9 * MB)))
    assert f.passed and f.codes == ["default_session_saving_note"]
    assert "(8.6 MiB vs 7.6 MiB)" in f.notes[0]  # the two peaks, rewrite first
    even = _judged(_figures(original_ort_default=_measured(8 * MB), rewritten_ort_default=_measured(8 * MB)))
    assert even.codes == ["default_session_saving_note"]  # the same peak saves nothing either
    saved = _judged(_figures(original_ort_default=_measured(8 * MB), rewritten_ort_default=_measured(7 * MB)))
    assert saved.codes == []  # a saving under the defaults too: nothing to say


def test_fused_reference_notes_how_the_unoptimized_original_compares():
    differ = ComparisonSummary(False, n_failed=2, max_abs_diff=3e-07)
    f = _judged(_figures(reference_level="ORT_ENABLE_EXTENDED", unoptimized_vs_rewritten=differ))
    assert f.passed and f.codes == ["fused_reference"]
    assert f.notes[0].startswith("outputs compared with the original run at ORT_ENABLE_EXTENDED")
    assert f.notes[0].endswith("2 outputs differ (max |diff| 3e-07): fused kernels round differently "
                               "from the ops they replace")
    same = _judged(_figures(reference_level="ORT_ENABLE_EXTENDED",
                            unoptimized_vs_rewritten=ComparisonSummary(True)))
    assert same.notes[0].endswith("every output is bit-identical too")


def test_device_notes_say_the_order_is_compared_per_device_and_copies_left_out():
    f = _judged(replace(_figures(), order=OrderCheck(
        True, nodes_per_provider={"CUDAExecutionProvider": 40, "CPUExecutionProvider": 3}, n_provider_copies=2)))
    assert f.passed and f.codes == ["device_notes_per_device", "device_notes_copies"]
    assert "(40 on CUDAExecutionProvider, 3 on CPUExecutionProvider)" in f.notes[0]
    one = replace(_figures(), order=OrderCheck(True, nodes_per_provider={"CPUExecutionProvider": 43}))
    assert _judged(one).codes == []  # one device: nothing to say


def test_process_peak_notes_say_what_the_measurement_resolves():
    f = _judged(_figures(100_000, 60_000, method="process_peak"))
    assert f.passed and f.codes == ["process_peak_notes", "process_peak_notes_small_peaks"]
    assert "below 256 KiB" in f.notes[1]
    assert _judged(_figures(method="process_peak")).codes == ["process_peak_notes"]  # large peaks: resolved


def test_process_peak_noise_allowance_lets_a_rise_of_a_few_pages_pass_and_no_more():
    """RSS is page-granular with allocator noise: a process peak may read up to 256 KiB (or
    2% of the original's peak) above the original's and still not be a rise; the profiler's
    arena figures are exact, so there the same rise fails."""
    small = PROCESS_PEAK_NOISE_BYTES - 4096
    assert _judged(_figures(10 * MB, 10 * MB + small, method="process_peak")).passed
    raised = _judged(_figures(10 * MB, 10 * MB + small))
    assert raised.codes == ["peak_not_raised"] and raised.failures[0].endswith(f"by {hb(small)}")
    assert _judged(_figures(100 * MB, 101 * MB, method="process_peak")).passed  # 1%: within 2% of 100 MB
    assert not _judged(_figures(100 * MB, 103 * MB, method="process_peak")).passed  # 3%: a rise
    assert noise(_measured(0, "process_peak"), 100 * MB) == 2 * MB
    assert noise(_measured(0, "process_peak"), MB) == PROCESS_PEAK_NOISE_BYTES == 256 * 1024



def test_outputs_match_fails_the_first_differing_output_and_accepts_a_tolerance():
    f = replace(_figures(), outputs=OutputFigures(False, True, {"rtol": None, "atol": 1e-6}, 2e-7,
                                                  {"a_grad": OutputComparison(True, True),
                                                   "w_grad": OutputComparison(False, True)}))
    judged = judge(f, tolerant=False)
    assert judged.codes == ["outputs_match"]
    assert judged.failures == ["outputs differ (first: w_grad, max |diff| 2e-07)"]
    assert f.codes == []  # judged anew, the figures are left as they were
    assert judge(f, tolerant=True).codes == []  # within --atol


def test_every_tensor_sized_fails_a_prediction_with_tensors_counted_as_0_bytes():
    f = _figures()
    f.prediction.unsized["rewritten"] = [f"t{k}" for k in range(7)]
    f = _judged(f)
    assert f.codes == ["every_tensor_sized"]
    assert f.failures[0].endswith("counts 7 tensors of unknown size as 0 B (t0, t1, t2, t3, t4, ...)")


def test_peak_not_raised_fails_a_rewrite_above_the_original():
    f = _judged(_figures(10 * MB, 10 * MB + 1))
    # two peaks a byte apart print alike in MiB: the rise says how far above it is
    assert f.codes == ["peak_not_raised"]
    assert f.failures == ["the rewritten peak (9.5 MiB) is above the original's (9.5 MiB) by 1 B"]
    assert f.memory_lower is False
    assert _judged(_figures(10 * MB, 10 * MB)).passed  # equal is not above


def _ordered(f: CheckFigures, **order) -> CheckFigures:
    """``f`` with these fields of its executed order's check."""
    return replace(f, order=replace(f.order, **order))


def _added(f: CheckFigures, names: list[str], ops: dict[str, int] | None = None) -> CheckFigures:
    return _ordered(f, n_not_in_file=len(names), not_in_file=tuple(names), not_in_file_ops=ops or {})


def test_ran_only_file_nodes_tolerates_added_nodes_only_within_the_prediction_error():
    added = ["fused/Gelu", "Add_7"], {"Gelu": 1, "Add": 1}
    said = ("ONNX Runtime ran 2 nodes that are not in the file (Gelu x1, Add x1; e.g. fused/Gelu, Add_7): "
            "it expanded or fused ops")
    within = _judged(_added(_figures(), *added))
    assert within.passed and within.codes == ["ran_only_file_nodes_tolerated"]
    assert within.notes == [f"{said}; the rewritten peak is within the prediction error (+0.0%), so they are "
                            "tolerated"]
    off = _added(_figures(), *added)
    off.prediction.tensor_bytes["rewritten"] = int(6 * MB * 1.2)
    off.prediction.tensor_error["rewritten"] = 0.2
    off = _judged(off)
    assert off.codes == ["ran_only_file_nodes_beyond_error", "prediction_holds"]
    assert "+20.0% off the prediction (more than --max-prediction-error 10%)" in off.failures[0]
    unjudged = _judged(_added(_figures(method="rss"), *added))  # no peak to judge them by
    assert unjudged.codes == ["ran_only_file_nodes", "prediction_holds_unjudged"]
    casts = _judged(_added(_figures(method="rss"), ["InsertedPrecisionFreeCast_x"]))
    assert "wrapped the ops that have no float16 kernel in Casts" in casts.failures[0]


def test_ran_every_file_node_fails_a_node_ort_never_ran():
    f = _judged(_ordered(_figures(), n_not_executed=1, not_executed=("/dropped/Add",)))
    assert f.codes == ["ran_every_file_node"] and "(e.g. /dropped/Add)" in f.failures[0]


def test_order_followed_fails_another_order_and_says_where():
    f = _ordered(_figures(), matches=False, first_mismatch=Mismatch(4, "a", "b", "CPU"))
    assert _judged(f).codes == ["order_followed"]
    assert _judged(f).failures == ["ONNX Runtime did not execute the simulated order on CPU (position 4: ckpt "
                                   "expected a, ORT ran b)"]


def test_prediction_holds_fails_a_prediction_off_by_more_than_the_allowed_error():
    f = _figures()
    f.prediction.tensor_bytes["rewritten"] = int(6 * MB * 1.2)
    f.prediction.tensor_error["rewritten"] = 0.2
    f = _judged(f)
    assert f.codes == ["prediction_holds"] and "+20.0% off" in f.failures[0]
    within = _figures()
    within.prediction.tensor_bytes["rewritten"] = int(6 * MB * 1.1)
    within.prediction.tensor_error["rewritten"] = 0.1  # at the limit: holds
    assert _judged(within).passed
    unjudged = _figures(method="rss")
    assert _judged(unjudged).codes == ["prediction_holds_unjudged"]


def test_plain_session_note_says_whether_orts_fusions_explain_a_plain_prediction_off():
    def noted(plain: PlainPrediction) -> list[str]:
        f = _figures(rewritten_ort_default=_measured(5 * MB), original_ort_default=_measured(9 * MB))
        return _judged(replace(f, prediction=replace(f.prediction, plain=plain))).notes

    assert noted(PlainPrediction(5 * MB, 0.1)) == []  # within the error: nothing to say
    head = ("under ORT's default settings the rewrite measures 4.8 MiB; ckpt predicted 5.7 MiB (+20.0%) "
            "on the file's graph, where ORT runs its ORT_ENABLE_ALL fusions")
    assert noted(PlainPrediction(6 * MB, 0.2)) == [
        head + " (ORT's fused graph could not be modelled: a size unknown, or another order)"]
    assert noted(PlainPrediction(6 * MB, 0.2, 5 * MB, 0.0)) == [
        head + "; on ORT's fused graph, in the order ORT runs it, ckpt's model gives 4.8 MiB (+0.0%): the "
        "fusions, not the memory model, explain it"]
    assert noted(PlainPrediction(6 * MB, 0.2, 6 * MB, 0.2))[0].endswith(
        "ckpt's model is +20.0% off too: its memory model does not hold for this session")


def test_findings_hold_the_failures_and_notes_in_rule_order_and_go_to_the_json():
    f = _judged(_ordered(_figures(), matches=False, first_mismatch=Mismatch(1, "a", "b"), n_not_executed=1,
                         not_executed=("x",), n_provider_copies=2))
    assert f.codes == ["ran_every_file_node", "device_notes_copies", "order_followed"]
    assert f.failures == [x.text for x in f.findings if x.severity == "failure"]
    assert f.notes == [x.text for x in f.findings if x.severity == "note"]
    body = f.to_json()
    assert body["findings"] == [{"code": x.code, "severity": x.severity, "text": x.text} for x in f.findings]
    assert (body["failures"], body["notes"]) == (f.failures, f.notes)


def test_every_finding_of_a_rule_has_a_code_of_its_own_named_after_the_rule():
    """Codes are what tests and reports key on: snake_case, the rule's name first, and one
    place in ``rules.py`` that makes each."""
    import ast
    import re

    from ckpt_cli.verify import rules

    tree = ast.parse(Path(rules.__file__).read_text(encoding="utf-8"))
    made = [(fn.name, call.args[0].value) for fn in tree.body if isinstance(fn, ast.FunctionDef)
            for call in ast.walk(fn) if isinstance(call, ast.Call) and isinstance(call.func, ast.Name)
            and call.func.id in ("failure", "note")]
    assert {r.__name__ for r in rules.RULES} <= {rule for rule, _ in made}
    assert [(r, c) for r, c in made if not (re.fullmatch(r"[a-z][a-z0-9_]*", c) and c.startswith(r))] == []
    codes = [c for _, c in made]
    assert len(codes) == len(set(codes))
