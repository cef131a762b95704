"""The check's verdict, rule by rule.

Each rule reads the measured figures and returns what it finds, as ``Finding``s: a
failure (a premise of the saving that does not hold, in one line) or a note, each with a
code. ``judge`` records them rule by rule, in order; the verdict passes when no rule
failed. Every rule has a test that fails when it is removed or its condition broken:
``tests/mutants.toml`` names it (a new rule comes with its mutant there, and ``make
mutate`` shows that its test catches it).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from ..units import human_bytes
from .figures import CheckFigures, Finding, Measurement, failure, note
from .records import MODULE_SIDES, Mismatch, ModuleRun, RunToRun

PROCESS_PEAK_NOISE_BYTES = 256 * 1024
# What a plan the Module sessions measured may add to the original's peak and still be
# chosen (verify/module_choice.py); the verdict allows a process peak's noise on top.
MODULE_NOISE_BYTES = 64 * 1024
MODULE_NOISE_SHARE = 0.01
# How closely ckpt's model of the untuned Module session must have predicted the measured
# steps for its long-run figures to fail a check: the zoo's largest error, rounded up.
LONG_RUN_TRUSTED_ERROR = 0.04
# ORT's CPU provider names the Casts it wraps around ops that have no float16 kernel so.
ORT_PRECISION_CAST = "InsertedPrecisionFreeCast_"


def noise(m: Measurement, reference: int) -> int:
    """Bytes below which a rise is measurement noise. The profiler's arena figures are
    exact; the process-peak fallback (ORT builds without profiler memory fields) reads
    page-granular RSS with allocator noise of a few pages."""
    if m.method != "process_peak":
        return 0
    return max(PROCESS_PEAK_NOISE_BYTES, int(0.02 * reference))


def outputs_match(f: CheckFigures, tolerant: bool) -> list[Finding]:
    """Bit-identical outputs (or within --rtol/--atol), or differences the original's own
    run-to-run spread explains."""
    out = f.outputs
    if out.within_tolerance if tolerant else out.equal:
        return []
    changed = [f"{name}: {e.problem}" for name, e in out.per_output.items() if e.problem]
    if changed:  # another shape, type or position: no run-to-run spread explains that
        return [failure("outputs_match_changed",
                        f"outputs differ ({'; '.join(changed[:3])}{'; ...' if len(changed) > 3 else ''})")]
    rr = out.run_to_run
    if not tolerant and rr is not None and rr.accepted:
        return [note("outputs_match_within_spread", _spread_note(f, rr))]
    first = (rr.unexplained[0] if rr is not None and rr.unexplained else
             next((k for k, e in out.per_output.items()
                   if not (e.within_tolerance if tolerant else e.bit_identical)), None))
    return [failure("outputs_match", f"outputs differ (first: {first}, max |diff| {out.max_abs_diff})")]


def runs_at_other_dims(f: CheckFigures, tolerant: bool) -> list[Finding]:
    """At other values of the symbolic dimensions the rewrite runs where the original runs,
    with its outputs (a written shape that named one dimension for another fails there)."""
    other = f.other_dims
    if other is None:
        return []
    at = ", ".join(f"{d}={v}" for d, v in other.dims.items())
    if other.original_failed is not None:
        return [note("runs_at_other_dims_original_failed",
                     f"the original does not run at {at} ({other.original_failed}): not compared there")]
    if other.rewritten_failed is not None:
        return [failure("runs_at_other_dims_rewritten_failed", f"at {at} the rewritten model does not run where "
                        f"the original does ({other.rewritten_failed})")]
    out = other.outputs
    if out is not None and not (out.all_within_tolerance if tolerant else out.all_bit_identical):
        return [failure("runs_at_other_dims", f"at {at} the outputs differ from the original's "
                        f"(max |diff| {out.max_abs_diff})")]
    return []


def _spread_note(f: CheckFigures, rr: RunToRun) -> str:
    kernels = rr.varying_kernels
    worst = max(e.rewrite_diff for e in rr.outputs.values())
    return (f"{len(rr.outputs)} outputs are not bit-identical; each is computed by a kernel whose "
            f"result varies between two runs of the original itself on {f.provider} "
            f"({', '.join(f'{k} by up to {v:.2g}' for k, v in kernels.items())}), and the "
            f"rewrite's differences (max |diff| {worst:.2g}) are within that spread")


def fused_reference(f: CheckFigures, tolerant: bool) -> list[Finding]:
    """With --ort-optimize the original is compared at ORT's level; say how it compares as it is."""
    plain, level = f.outputs.unoptimized_vs_rewritten, f.outputs.reference_level
    if level is None or plain is None:
        return []
    return [note("fused_reference", f"outputs compared with the original run at {level}, as the rewritten file "
                 "holds ORT's fusions made at that level; against the original under ckpt's settings "
                 + ("every output is bit-identical too" if plain.all_bit_identical else
                    f"{plain.n_failed} outputs differ (max |diff| {plain.max_abs_diff}): fused "
                    "kernels round differently from the ops they replace"))]


def every_tensor_sized(f: CheckFigures, tolerant: bool) -> list[Finding]:
    """A prediction that counts a tensor as 0 B cannot be judged."""
    return [failure("every_tensor_sized", f"the {side} prediction counts {len(names)} tensors of unknown size as 0 B "
                    f"({', '.join(names[:5])}{', ...' if len(names) > 5 else ''})")
            for side, names in f.prediction.unsized.items()]


def peak_not_raised(f: CheckFigures, tolerant: bool) -> list[Finding]:
    """The rewritten peak is not above the original's (beyond measurement noise)."""
    o, r = f.measured.original.peak_bytes, f.measured.rewritten.peak_bytes
    if o is not None and r is not None and r > o + noise(f.measured.rewritten, o):
        return [failure("peak_not_raised", f"the rewritten peak {_above(r, o)}")]
    return []


def _above(peak: int, reference: int) -> str:
    """'(<peak>) is above the original's (<reference>) by <rise>': the rise is printed too,
    as two peaks a few bytes apart print alike in MiB."""
    return f"({human_bytes(peak)}) is above the original's ({human_bytes(reference)}) by {human_bytes(peak - reference)}"


def user_session_not_raised(f: CheckFigures, tolerant: bool) -> list[Finding]:
    """Where the rewrite is run under ORT's defaults (a file written for them, an ORT training
    artifact in the Module API's session), its peak there is not above the original's there
    (beyond measurement noise): that session, arena and memory pattern on, is the user's.

    For an artifact the plain session at ORT's defaults stands in for the Module API's
    untuned one. Where the Module API trained both files, its figures judge the artifact
    (``module_session_not_raised``) and a rise in the stand-in is a note: the two sessions
    plan memory differently, and the zoo has artifacts that rise in one and fall in the other."""
    od, rd = f.measured.original_ort_default, f.measured.rewritten_ort_default
    if f.user_session != "ort_default" or od is None or rd is None or od.peak_bytes is None or rd.peak_bytes is None:
        return []
    if rd.peak_bytes <= od.peak_bytes + noise(rd, od.peak_bytes):
        return []
    if _module_untuned_measured(f):
        return [note("user_session_not_raised_stand_in", "in a plain InferenceSession under ORT's default "
                     f"settings the rewritten peak {_above(rd.peak_bytes, od.peak_bytes)}; this artifact trains "
                     "in the Module API's session, measured below, which judges it")]
    return [failure("user_session_not_raised", "under ORT's default settings, the session this model is run "
                    f"in, the rewritten peak {_above(rd.peak_bytes, od.peak_bytes)}")]


def _module_untuned_measured(f: CheckFigures) -> bool:
    """The Module API trained both files in its untuned session."""
    m = f.module_sessions
    return m is not None and all(k in m.runs for k in ("original_untuned", "rewritten_untuned"))


def module_noise(reference: int) -> int:
    """Bytes below which a Module session's process peak rise is measurement noise."""
    return max(MODULE_NOISE_BYTES, int(MODULE_NOISE_SHARE * reference))


def module_rise_is_noise(original: ModuleRun, rewritten: ModuleRun) -> bool:
    """The rewrite's untuned peak is not above the original's beyond the noise: that of a
    process peak (the same floor as the plain check's), or the spread either file's own
    peaks showed when trained again, whichever is wider. Its peaks are not one value plus
    a page: zoo kan's file measured 4.83-5.05 MiB in two clusters, several runs in a row
    in one, with ASLR off and malloc held to one arena."""
    allowed = max(module_noise(original.peak_bytes), PROCESS_PEAK_NOISE_BYTES, original.spread, rewritten.spread)
    return rewritten.peak_bytes <= original.peak_bytes + allowed


def module_session_not_raised(f: CheckFigures, tolerant: bool) -> list[Finding]:
    """An ORT training artifact trained by the Module API in its untuned session, the one
    its users run: the rewrite's process peak there is not above the original's."""
    m = f.module_sessions
    if m is None:
        return []
    if m.skipped is not None:
        return [note("module_session_not_raised_skipped", f"the Module API's training sessions were not run: "
                     f"{m.skipped}")]
    o, r = m.runs.get("original_untuned"), m.runs.get("rewritten_untuned")
    if o is not None and r is not None and not module_rise_is_noise(o, r):
        runs = f" (each side's lowest of {len(r.peak_runs)} runs)" if r.peak_runs else ""
        return [failure("module_session_not_raised", "trained by the Module API in its untuned session, the "
                        f"rewrite's process peak {_above(r.peak_bytes, o.peak_bytes)}{runs}")]
    return []


def module_session_long_run(f: CheckFigures, tolerant: bool) -> list[Finding]:
    """Past the steps the check runs: where ckpt's model of the untuned Module session puts
    the rewrite above the original once the arena's placements settle (they can take tens
    of steps to), that is a failure where the model predicted both measured peaks within
    ``LONG_RUN_TRUSTED_ERROR``, and a note otherwise."""
    m = f.module_sessions
    if m is None or m.skipped is not None:
        return []
    o, r = m.predicted.get("original"), m.predicted.get("rewritten")
    if o is None or r is None or r.long_run <= o.long_run + module_noise(o.long_run):
        return []
    errors = [m.prediction_error(side) for side in MODULE_SIDES]
    trusted = all(e is not None and abs(e) <= LONG_RUN_TRUSTED_ERROR for e in errors)
    when = ", ".join(f"{side} after {p.settles_after} steps" if p.settles_after else f"{side} still moving"
                     for side, p in (("original", o), ("rewrite", r)))
    said = (f"ckpt's model of the untuned Module session, once the arena's placements settle ({when}), "
            f"puts the rewrite's process peak ({human_bytes(r.long_run)}) above the original's "
            f"({human_bytes(o.long_run)}) by {human_bytes(r.long_run - o.long_run)}")
    if trusted:
        return [failure("module_session_long_run", f"{said}; it predicted both over the {m.steps} steps "
                        f"measured within {LONG_RUN_TRUSTED_ERROR:.0%}")]
    return [note("module_session_long_run_unconfirmed", f"{said}; it predicted the {m.steps} steps measured "
                 "less closely, so this is not a failure")]


def module_losses_identical(f: CheckFigures, tolerant: bool) -> list[Finding]:
    """The rewrite trains in the Module API, untuned and under its settings, with the
    original's losses bit for bit (a loss rounded otherwise is another training run)."""
    m = f.module_sessions
    if m is None or m.skipped is not None:
        return []
    found = []
    for session, where in (("untuned", "untuned"), ("settings", "under the recorded settings")):
        error = m.errors.get(f"rewritten_{session}")
        o, r = m.runs.get(f"original_{session}"), m.runs.get(f"rewritten_{session}")
        if error and o is not None:
            found.append(failure("module_losses_identical_error",
                                 f"the Module API does not train the rewrite {where} ({error})"))
        elif o is not None and r is not None and o.losses_hex != r.losses_hex:
            step = next(i for i, (a, b) in enumerate(zip(o.losses_hex, r.losses_hex)) if a != b)
            found.append(failure("module_losses_identical", f"trained by the Module API {where}, the losses "
                                 f"differ from the original's (step {step + 1}: {r.losses_hex[step]} vs "
                                 f"{o.losses_hex[step]})"))
    return found


def ran_only_file_nodes(f: CheckFigures, tolerant: bool) -> list[Finding]:
    """ORT ran the file's nodes; nodes it added (an expansion, a fusion, float16 Casts) are
    tolerated only where the rewritten peak stays within the prediction error."""
    order = f.order
    if not order.n_not_in_file:
        return []
    casts = [n for n in order.not_in_file if n.startswith(ORT_PRECISION_CAST)]
    cause = ("it expanded or fused ops" if len(casts) < len(order.not_in_file) else
             "its CPU provider wrapped the ops that have no float16 kernel in Casts and runs them in float32")
    ops = ", ".join(f"{op} x{k}" for op, k in order.not_in_file_ops.items())
    said = (f"ONNX Runtime ran {order.n_not_in_file} nodes that are not in the file "
            f"({ops + '; ' if ops else ''}e.g. {', '.join(order.not_in_file[:3])}): {cause}")
    err = _rewritten_error(f)
    if err is None:
        return [failure("ran_only_file_nodes", f"{said}, so the written schedule is not what ran")]
    if abs(err) > f.prediction.max_error:
        return [failure("ran_only_file_nodes_beyond_error", f"{said}, and the rewritten peak is {err:+.1%} off the "
                        f"prediction (more than --max-prediction-error {f.prediction.max_error:.0%}): the written "
                        "schedule is not what ran")]
    return [note("ran_only_file_nodes_tolerated", f"{said}; the rewritten peak is within the prediction error "
                 f"({err:+.1%}), so they are tolerated")]


def _rewritten_error(f: CheckFigures) -> float | None:
    """The rewritten peak's prediction error where the measurement judges it (0 within its noise)."""
    m = f.measured.rewritten
    err = f.prediction.tensor_error.get("rewritten")
    if m.method not in ("profiler", "process_peak") or err is None:
        return None
    off = abs(f.prediction.tensor_bytes["rewritten"] - (m.peak_requested_bytes or 0))
    return 0.0 if off <= noise(m, m.peak_requested_bytes or 0) else err


def ran_every_file_node(f: CheckFigures, tolerant: bool) -> list[Finding]:
    """Every node of the file ran: a node ORT dropped makes the schedule judged not the one run."""
    order = f.order
    if order.n_not_executed:
        return [failure("ran_every_file_node", f"ONNX Runtime never ran {order.n_not_executed} nodes of the file "
                        f"(e.g. {', '.join(order.not_executed[:3])}): the schedule judged is not what ran")]
    return []


def device_notes(f: CheckFigures, tolerant: bool) -> list[Finding]:
    """How the order was compared across devices."""
    order, found = f.order, []
    if len(order.nodes_per_provider) > 1:
        per = ", ".join(f"{n} on {p}" for p, n in order.nodes_per_provider.items())
        found.append(note("device_notes_per_device", f"the order is compared per device ({per}): ORT runs a "
                          "stream per device and interleaves them where one waits for the other"))
    if order.n_provider_copies:
        found.append(note("device_notes_copies", f"ONNX Runtime added {order.n_provider_copies} device copies "
                          "(MemcpyToHost/FromHost) next to CPU-placed shape nodes; they are left out of the order "
                          "comparison"))
    return found


def order_followed(f: CheckFigures, tolerant: bool) -> list[Finding]:
    """ORT executed the order ckpt simulated."""
    if f.order.matches:
        return []
    m = f.order.first_mismatch or Mismatch(None, None, None)
    where = f" on {m.provider}" if m.provider else ""
    return [failure("order_followed", f"ONNX Runtime did not execute the simulated order{where} (position "
                    f"{m.position}: ckpt expected {m.file}, ORT ran {m.executed})")]


def prediction_holds(f: CheckFigures, tolerant: bool) -> list[Finding]:
    """The predicted live tensor bytes are within --max-prediction-error of the measured.

    Judged on the live tensor bytes (ORT's bytes requested, or with the arena off the
    process's page-granular peak): the liveness simulation of the written schedule, which is
    what a broken order or an unseen node throws off. The arena figure adds ORT's rounding
    and fragmentation and is reported only."""
    method, p = f.measured.rewritten.method, f.prediction
    if method not in ("profiler", "process_peak"):
        return [note("prediction_holds_unjudged",
                     f"memory measured as {method}: the peak is not compared with the prediction")]
    found = []
    for side, err in p.tensor_error.items():
        measured = getattr(f.measured, side)
        slack = noise(measured, measured.peak_requested_bytes or 0)
        off = abs(p.tensor_bytes[side] - (measured.peak_requested_bytes or 0))
        if err is not None and abs(err) > p.max_error and off > slack:
            found.append(failure("prediction_holds", f"the {side} peak prediction (tensor bytes) is {err:+.1%} off "
                                 f"the measured peak (more than --max-prediction-error {p.max_error:.0%})"))
    return found


def process_peak_notes(f: CheckFigures, tolerant: bool) -> list[Finding]:
    """What a process-peak measurement can and cannot resolve."""
    if f.measured.rewritten.method != "process_peak":
        return []
    found = [note("process_peak_notes", "memory measured as process_peak (this ORT build's profiler has no memory "
                  "fields): the process's peak above its state before the run, ORT's arena off, page-granular")]
    if max(f.prediction.tensor_bytes.values()) < PROCESS_PEAK_NOISE_BYTES:
        found.append(note("process_peak_notes_small_peaks", f"both peaks are predicted below "
                          f"{PROCESS_PEAK_NOISE_BYTES // 1024} KiB, under what process_peak resolves: the memory "
                          "saving is not verified by this check"))
    return found


def runs_in_default_session(f: CheckFigures, tolerant: bool) -> list[Finding]:
    """The rewritten file also runs in a session with ORT's default settings."""
    error = f.measured.rewritten_ort_default_error
    if error:
        return [failure("runs_in_default_session",
                        f"the rewritten model does not run in a session with ORT's default settings ({error})")]
    return []


def plain_session_note(f: CheckFigures, tolerant: bool) -> list[Finding]:
    """Where the plain-session prediction is off, whether ORT's fusions explain it."""
    plain, limit = f.prediction.plain, f.prediction.max_error
    err, fused = plain.error, plain.fused_error
    if err is None or abs(err) <= limit:
        return []
    measured = f.measured.rewritten_ort_default
    assert measured is not None  # the plain error is against this measurement
    said = (f"under ORT's default settings the rewrite measures {human_bytes(measured.peak_bytes)}; "
            f"ckpt predicted {human_bytes(plain.predicted)} ({err:+.1%}) on the file's graph, where ORT runs its "
            "ORT_ENABLE_ALL fusions")
    if fused is None:
        said += " (ORT's fused graph could not be modelled: a size unknown, or another order)"
    elif abs(fused) <= limit:
        said += (f"; on ORT's fused graph, in the order ORT runs it, ckpt's model gives "
                 f"{human_bytes(plain.fused)} ({fused:+.1%}): the fusions, not the memory model, explain it")
    else:
        said += (f"; on ORT's fused graph, in the order ORT runs it, ckpt's model is {fused:+.1%} off too: "
                 "its memory model does not hold for this session")
    return [note("plain_session_note", said)]


def default_session_saving_note(f: CheckFigures, tolerant: bool) -> list[Finding]:
    """Whether the saving survives ORT's default session settings."""
    od, rd = f.measured.original_ort_default, f.measured.rewritten_ort_default
    if f.user_session != "ckpt" or od is None or rd is None or od.peak_bytes is None or rd.peak_bytes is None:
        return []  # a file run under ORT's defaults is judged there (user_session_not_raised)
    if rd.peak_bytes >= od.peak_bytes:
        return [note("default_session_saving_note", "under ORT's default session settings the rewrite saves nothing "
                     f"({human_bytes(rd.peak_bytes)} vs {human_bytes(od.peak_bytes)}): run it with ckpt's settings "
                     "(ckpt_cli.session_options(path), or `ckpt session MODEL`)")]
    return []


def budget_held(f: CheckFigures, budget: int, outside_bytes: int) -> list[Finding]:
    """With ``--budget``: what ORT held at the rewrite's measured peak (its arena in use
    plus the ``outside_bytes`` of inputs kept outside the arena) is within the budget."""
    m = f.measured.rewritten
    if m.peak_bytes is None:
        return [note("budget_held_unverified",
                     f"--budget {human_bytes(budget)} not verified: this ORT build reports no arena peak")]
    held = m.peak_bytes + outside_bytes
    if held > budget + noise(m, budget):
        return [failure("budget_held", f"the rewrite's measured peak ({human_bytes(held)}: arena in use "
                        f"{human_bytes(m.peak_bytes)} plus {human_bytes(outside_bytes)} of inputs) is above "
                        f"--budget {human_bytes(budget)} by {human_bytes(held - budget)}")]
    return []


Rule = Callable[[CheckFigures, bool], list[Finding]]

RULES: tuple[Rule, ...] = (
    outputs_match,
    runs_at_other_dims,
    fused_reference,
    every_tensor_sized,
    peak_not_raised,
    user_session_not_raised,
    module_session_not_raised,
    module_session_long_run,
    module_losses_identical,
    ran_only_file_nodes,
    ran_every_file_node,
    device_notes,
    order_followed,
    prediction_holds,
    process_peak_notes,
    runs_in_default_session,
    plain_session_note,
    default_session_saving_note,
)


# A failure of these says the rewrite's peak is not lower: ``memory_lower`` is false.
PEAK_RAISED = frozenset({"peak_not_raised", "user_session_not_raised", "module_session_not_raised",
                         "module_session_long_run"})


def judge(f: CheckFigures, tolerant: bool, rules: tuple[Rule, ...] = RULES) -> CheckFigures:
    """``f`` with what every rule finds after its findings, rule by rule in order, and
    ``memory_lower`` false where one says the peak is not lower; ``f`` is left as it is."""
    found = tuple(x for rule in rules for x in rule(f, tolerant))
    raised = any(x.code in PEAK_RAISED for x in found)
    return replace(f, findings=f.findings + found, memory_lower=f.memory_lower and not raised)


def held_within(budget: int, outside_bytes: int) -> Rule:
    """``budget_held`` as a rule of the verdict, for a rewrite made to a ``--budget``."""
    return lambda f, tolerant: budget_held(f, budget, outside_bytes)
