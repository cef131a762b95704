"""Run ONNX graphs on ONNX Runtime in fresh child processes and compare them.

Everything here returns plain data (the worker's result dicts, frozen records of them, and
numpy arrays for outputs); no reporting or CLI code.  The measuring itself happens in
``worker.py``, a standalone script run as ``[python, worker.py, spec.json]``: a fresh
process per measurement, so arenas, allocator state and VmHWM start clean, and
``--python`` can point at another interpreter with another onnxruntime build.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from ..analysis.memory import PAGE_BYTES
from ..errors import RunFailed, RuntimeCheckError, RuntimeUnavailable
from ..options import DEFAULT_TIMEOUT_S
from ..ort import child
from ..progress import stage
from . import worker as _worker
from .compare import DEFAULT_ATOL, DEFAULT_RTOL, compare_outputs, order_check
from .records import ComparisonSummary, OrderCheck, OtherDims, OutputComparison, Spread, output_comparisons
from ..ort.settings import settings_for, settings_snippet

if TYPE_CHECKING:
    from onnx import NodeProto


WORKER_PATH = os.path.abspath(_worker.__file__)

# Set before the child starts: glibc reads it at start-up.  Every buffer of a page or more
# then comes from its own mmap and goes back to the OS on free, so VmHWM sees the live
# buffers and nothing else (without it a second run under-reads).  At 64 KiB, buffers of
# 4-64 KiB came from the heap, whose freed holes stay resident: a selective-scan graph of
# thousands of 16 KiB per-step tensors measured 24% above its live bytes.  The Module runs
# keep 64 KiB: their buffers come from ORT's arena, and bench/zoo_train.py measures so.
# Harmless for the profiler method.
CHILD_ENV = {"MALLOC_MMAP_THRESHOLD_": str(PAGE_BYTES)}
MODULE_CHILD_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536"}

PathArg = str | os.PathLike[str]
# The worker's JSON answer (worker.py's docstring), as child.checked_answer passed it.
Answer = dict[str, Any]
Outputs = dict[str, np.ndarray]


def _child_env(malloc: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment with ``malloc``'s variables (default ``CHILD_ENV``)."""
    env = dict(os.environ)
    env.update(CHILD_ENV if malloc is None else malloc)
    return env


def _spawn(argv: list[str], timeout: float | None, what: str) -> child.Child:
    return child.run_child(argv, _child_env(), timeout, what)


def _answer_line(out: child.Child, what: str) -> object:
    lines = [line for line in out.stdout.splitlines() if line.strip()]
    if not lines:
        return None
    try:
        return child.parse_json_line(lines[-1])
    except (ValueError, RecursionError) as e:
        if out.returncode != 0:
            return None  # a crash that printed something: the crash is the news
        raise RunFailed("bad_answer", f"{what} answered no JSON result ({child.printable(str(e), 200)})",
                        out.stderr) from e


def _parse(out: child.Child, what: str, required: tuple[str, ...] = ()) -> Answer:
    result = _answer_line(out, what)
    if result is None:
        tail = child.printable(" | ".join(out.stderr.strip().splitlines()[-3:]), 300)
        raise RunFailed("crashed", f"{what} gave no result ({child.how_it_ended(out.returncode)})"
                        + (f": {tail}" if tail else ""), out.stderr)
    result = child.checked_answer(result, what, required)
    if not result["ok"]:
        kind = result.get("kind", "run_failed")
        cls = RuntimeUnavailable if kind == "provider_unavailable" else RunFailed
        raise cls(kind, child.printable(result.get("message", "worker failed")), out.stderr)
    return result


@dataclass(frozen=True)
class WorkerOptions:
    """How a measuring child process runs, besides the model and its session settings."""

    python: str | None = None  # the interpreter: another one may have another onnxruntime build
    timeout: float | None = DEFAULT_TIMEOUT_S
    seed: int = 0  # ORT's random seed in the child: random ops draw the same in every child
    intra_op_threads: int = 1
    memory_method: str = "auto"  # "auto", "profiler" or "process_peak"
    extra_outputs: tuple[str, ...] = ()  # extra result sections ("timeline")


def run_model(model_path: PathArg, feeds_path: PathArg, *, provider: str, settings: str | dict[str, Any] = "ckpt",
              runs: int = 3, outputs_path: PathArg | None = None, enable_mem_reuse: bool = True,
              worker: WorkerOptions = WorkerOptions()) -> Answer:
    """Measure one model in a fresh child process; returns the worker's result dict.

    provider: "cpu" or "cuda" (resolve "auto" with ``resolve_provider`` first).
    settings: a name for ``settings.settings_for`` ("ckpt", "ort_default", ...), or the
    settings dict itself.  runs: measured runs (plus one warm-up).
    outputs_path: where the child writes the outputs of its last run (.npz), or None.
    Raises RuntimeUnavailable / RunFailed.
    """
    if provider not in ("cpu", "cuda"):
        raise ValueError(f"provider must be 'cpu' or 'cuda' here, not {provider!r}")
    session = settings if isinstance(settings, dict) else settings_for(settings, provider, enable_mem_reuse)
    with tempfile.TemporaryDirectory(prefix="ckpt_run_") as tmp:
        spec = {
            "model": os.path.abspath(os.fspath(model_path)),
            "feeds": os.path.abspath(os.fspath(feeds_path)),
            "provider": provider,
            "session": session,
            "runs": int(runs),
            "outputs": os.path.abspath(os.fspath(outputs_path)) if outputs_path else None,
            "profile_dir": tmp,
            "intra_op_threads": int(worker.intra_op_threads),
            "memory_method": worker.memory_method,
            "extra_outputs": list(worker.extra_outputs),
            "seed": int(worker.seed),
        }
        spec_path = os.path.join(tmp, "spec.json")
        with open(spec_path, "w", encoding="utf-8") as f:
            json.dump(spec, f)
        what = _running(model_path, session)
        stage(f"ORT check: {os.path.basename(os.fspath(model_path))}, {session.get('settings', 'custom')} settings, "
              f"{runs} run{'s' if runs != 1 else ''} + warm-up")
        out = _spawn([worker.python or sys.executable, WORKER_PATH, spec_path], worker.timeout, what)
    result = _parse(out, what, child.MEASURED_FIELDS)
    result["python"] = worker.python or sys.executable
    return result


def _running(model_path: PathArg, session: dict[str, Any]) -> str:
    """The worker run, as errors name it."""
    return f"the worker running {os.path.basename(os.fspath(model_path))} ({session.get('settings', 'custom')} settings)"


# --------------------------------------------------------------------------- providers


def _tiny_model_path(directory: str) -> str:
    import onnx
    from onnx import TensorProto, helper

    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="relu")], "probe",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=7)
    path = os.path.join(directory, "probe.onnx")
    onnx.save(m, path)
    return path


def probe_provider(provider: str, python: str | None = None,
                   timeout: float | None = DEFAULT_TIMEOUT_S) -> tuple[bool, str]:
    """(usable, reason): can `provider` really create a session under `python`?

    onnxruntime-gpu lists CUDAExecutionProvider even with no GPU or no CUDA
    libraries; the only robust test is to create a session in a child process and
    look at ``get_providers()[0]`` (the wrapper silently falls back to CPU). A probe that
    runs past ``timeout`` raises RunFailed: a hung interpreter is not a missing provider.
    """
    return _probe(provider, python, timeout)


@functools.lru_cache(maxsize=8)
def _probe(provider: str, python: str | None, timeout: float | None) -> tuple[bool, str]:
    what = f"the {provider} provider probe"
    stage(f"ORT check: probing the {provider.upper()} provider")
    with tempfile.TemporaryDirectory(prefix="ckpt_probe_") as tmp:
        out = _spawn([python or sys.executable, WORKER_PATH, "--probe", provider, _tiny_model_path(tmp)],
                     timeout, what)
    try:
        _parse(out, what)
    except RuntimeCheckError as e:
        return False, e.message
    return True, ""


def resolve_provider(requested: str = "auto", python: str | None = None,
                     timeout: float | None = DEFAULT_TIMEOUT_S) -> str:
    """"cpu" -> "cpu"; "cuda" -> "cuda" (run_model raises RuntimeUnavailable if it
    cannot); "auto" -> "cuda" when a CUDA session really runs on CUDA, else "cpu"."""
    if requested in ("cpu", "cuda"):
        return requested
    if requested != "auto":
        raise ValueError(f"provider must be 'auto', 'cuda' or 'cpu', not {requested!r}")
    ok, _ = probe_provider("cuda", python, timeout)
    return "cuda" if ok else "cpu"


def _load_npz(path: str, what: str = "the worker") -> Outputs:
    return child.load_outputs(path, what)


def file_node_order(model_path: PathArg) -> list[str]:
    """Node names of the main graph in file order (no tensor data is read)."""
    return [n.name for n in _file_nodes(model_path)]


def kernelless_nodes(model_path: PathArg) -> set[str]:
    """Nodes of the file ORT runs no kernel for: Constant nodes become initializers."""
    return {n.name for n in _file_nodes(model_path) if n.op_type == "Constant" and n.domain in ("", "ai.onnx")}


def _file_nodes(model_path: PathArg) -> list[NodeProto]:
    import onnx

    return list(onnx.load(os.fspath(model_path), load_external_data=False).graph.node)


# --------------------------------------------------------------------------- pair


@dataclass(frozen=True)
class RunSummary:
    """One model's run in one session, as the worker measured it (medians over the runs)."""

    peak_bytes: int | None
    time_s: float | None
    baseline_bytes: int | None
    peak_requested_bytes: int | None
    peak_above_baseline_bytes: int | None
    method: str | None
    runs: list[dict[str, Any]] | None  # the worker's per-run figures: peak_bytes, time_s
    provider: str | None
    ort_version: str | None
    warnings: list[str] | None

    @classmethod
    def of(cls, result: Answer) -> "RunSummary":
        return cls(**{f.name: result.get(f.name) for f in fields(cls)})


@dataclass(frozen=True)
class SideRuns:
    """One model of the pair: its run under ckpt's settings and under ORT's defaults."""

    ckpt: RunSummary
    ort_default: RunSummary | None = None  # None: not run, or it failed (ort_default_error)
    ort_default_error: str | None = None  # "kind: message" of a failed run under ORT's defaults
    ort_default_order: list[str] | None = None  # the nodes ORT ran under its defaults, in order


@dataclass(frozen=True)
class PairRun:
    """``check_pair``'s outcome: both models measured, outputs and executed order compared."""

    provider: str  # the provider both ran on ("cpu" or "cuda")
    comparison: ComparisonSummary  # the rewrite's outputs against the original's
    outputs: dict[str, OutputComparison]  # the same, output by output
    original: SideRuns
    rewritten: SideRuns
    ort_default_vs_ckpt: ComparisonSummary | None  # the original under ORT's defaults against the outputs compared
    reference_level: str | None  # the original ran at this ORT optimization level for the comparison
    unoptimized_vs_rewritten: ComparisonSummary | None  # then: the comparison with the original as it is
    run_to_run: dict[str, Spread] | None  # outputs that differ: the original's own spread (``_run_to_run_spread``)
    order: OrderCheck  # the rewritten model's executed order against its file's
    session_settings: dict[str, Any]  # ckpt's settings both ran with
    settings_snippet: str  # the same settings as Python a user can paste

    @property
    def outputs_equal(self) -> bool:
        return self.comparison.all_bit_identical

    @property
    def outputs_within_tolerance(self) -> bool:
        return self.comparison.all_within_tolerance

    @property
    def max_abs_diff(self) -> float | None:
        return self.comparison.max_abs_diff

    @property
    def order_matches(self) -> bool:
        return self.order.matches


@dataclass(frozen=True)
class PairOptions:
    """How ``check_pair`` runs the two models and compares their outputs."""

    provider: str = "auto"
    runs: int = 3
    rtol: float = DEFAULT_RTOL
    atol: float = DEFAULT_ATOL
    with_ort_default: bool = True  # also run both under ORT's default settings
    enable_mem_reuse: bool = True
    expected_order: tuple[str, ...] | None = None  # node names; None: the rewritten file's order
    # the rewritten file holds ORT's fusions made offline at this level: the original runs at it too
    reference_level: str | None = None
    worker: WorkerOptions = WorkerOptions()


@dataclass(frozen=True)
class _Pair:
    """What every child run of one ``check_pair`` shares."""

    original: PathArg
    rewritten: PathArg
    feeds_path: PathArg
    provider: str  # resolved: "cpu" or "cuda"
    options: PairOptions
    tmp: str  # where the children write their outputs

    def npz(self, name: str) -> str:
        return os.path.join(self.tmp, f"{name}.npz")

    def outputs(self, name: str, model: PathArg) -> Outputs:
        """The outputs the child running ``model`` wrote to ``npz(name)``."""
        return _load_npz(self.npz(name), f"the worker running {os.path.basename(os.fspath(model))}")

    def measure(self, model: PathArg, settings: str | dict[str, Any], outputs_path: str | None,
                runs: int | None = None) -> Answer:
        o = self.options
        return run_model(model, self.feeds_path, provider=self.provider, settings=settings,
                         runs=o.runs if runs is None else runs, outputs_path=outputs_path,
                         enable_mem_reuse=o.enable_mem_reuse, worker=o.worker)

    def ckpt_settings(self, reuse: bool, level: str | None) -> dict[str, Any]:
        session = dict(settings_for("ckpt", self.provider, reuse))
        if level is not None:
            session["graph_optimization_level"] = level
        return session


def _comparison_summary(cmp: dict[str, Any]) -> ComparisonSummary:
    return ComparisonSummary.of(cmp)


def _compare(pair: _Pair, expected: Outputs, actual: Outputs) -> dict[str, Any]:
    return compare_outputs(expected, actual, rtol=pair.options.rtol, atol=pair.options.atol)


def _run_to_run_spread(pair: _Pair, o_vals: Outputs, r_vals: Outputs) -> dict[str, Spread]:
    """Run the original once more, in a fresh process with the other buffer-reuse setting
    (other addresses, same arithmetic). Per output that differs in either comparison: the
    original's own spread, the rewrite's difference, and whether that is within the
    default tolerance. The check judges them (``verify.stage``)."""
    again = pair.npz("original_again")
    settings = pair.ckpt_settings(not pair.options.enable_mem_reuse, pair.options.reference_level)
    pair.measure(pair.original, settings, again, runs=1)
    noise = compare_outputs(o_vals, pair.outputs("original_again", pair.original), rtol=DEFAULT_RTOL, atol=DEFAULT_ATOL)["outputs"]
    diff = compare_outputs(o_vals, r_vals, rtol=DEFAULT_RTOL, atol=DEFAULT_ATOL)["outputs"]
    return {name: Spread(noise.get(name, {}).get("max_abs_diff") or 0.0, d["max_abs_diff"] or 0.0,
                         d["within_tolerance"], d["bit_identical"])
            for name, d in diff.items()
            if not d["bit_identical"] or not noise.get(name, {}).get("bit_identical", True)}


def _reference_outputs(pair: _Pair) -> Outputs:
    """The original's outputs at the reference level, whose fusions round as the file's do."""
    out = pair.npz("reference")
    settings = pair.ckpt_settings(pair.options.enable_mem_reuse, pair.options.reference_level)
    pair.measure(pair.original, settings, out, runs=1)
    return pair.outputs("reference", pair.original)


def _side(ckpt: Answer, ort_default: Answer | None) -> SideRuns:
    """``ort_default`` is the worker's result, or {"failed": "kind: message"}."""
    if ort_default is None:
        return SideRuns(RunSummary.of(ckpt))
    if "failed" in ort_default:
        return SideRuns(RunSummary.of(ckpt), ort_default_error=ort_default["failed"])
    return SideRuns(RunSummary.of(ckpt), RunSummary.of(ort_default), None, ort_default.get("executed_order"))


def _ort_default_runs(pair: _Pair, o_vals: Outputs) -> tuple[Answer, Answer, ComparisonSummary]:
    """Both models under ORT's defaults, and the original's outputs there against ``o_vals``."""
    out = pair.npz("default")
    try:
        original = pair.measure(pair.original, "ort_default", out)
    except RunFailed as e:  # it ran under ckpt's settings: ORT's default optimizations refuse it
        raise RunFailed(e.kind, f"{e.message} (under ORT's default settings)") from e
    try:
        rewritten = pair.measure(pair.rewritten, "ort_default", None)
    except RunFailed as e:  # a finding about the rewrite, not a reason to stop the check
        rewritten = {"failed": f"{e.kind}: {e.message}"}
    return original, rewritten, _comparison_summary(_compare(pair, o_vals, pair.outputs("default", pair.original)))


def _executed_order(pair: _Pair, rewritten: Answer) -> OrderCheck:
    expected = list(pair.options.expected_order or ()) or file_node_order(pair.rewritten)
    return order_check(expected, rewritten["executed_order"], rewritten.get("executed_ops"),
                       rewritten.get("executed_providers"), kernelless_nodes(pair.rewritten))


def check_pair(original: PathArg, rewritten: PathArg, feeds_path: PathArg,
               options: PairOptions = PairOptions()) -> PairRun:
    """Run original and rewritten graphs under the "ckpt" settings, and both under ORT's
    defaults (an untouched session: what a user gets without ckpt, and what a user who
    loads the rewrite without ckpt's settings gets); compare outputs and check the
    rewritten graph's executed order against ``options.expected_order`` (node names;
    default: its file order).

    With ``options.reference_level`` (a rewritten file ORT optimized offline at that level)
    the outputs are compared with the original run at that level, whose fusions round as the
    file's do; ``unoptimized_vs_rewritten`` then summarises the comparison with the original as is.
    """
    o = options
    provider = resolve_provider(o.provider, o.worker.python, o.worker.timeout)
    with tempfile.TemporaryDirectory(prefix="ckpt_check_") as tmp:
        pair = _Pair(original, rewritten, feeds_path, provider, o, tmp)
        orig = pair.measure(original, "ckpt", pair.npz("original"))
        rew = pair.measure(rewritten, "ckpt", pair.npz("rewritten"))
        o_vals, r_vals = pair.outputs("original", original), pair.outputs("rewritten", rewritten)
        unoptimized = None
        if o.reference_level is not None:
            unoptimized = _comparison_summary(_compare(pair, o_vals, r_vals))
            o_vals = _reference_outputs(pair)
        default = rew_default = default_cmp = None
        if o.with_ort_default:
            default, rew_default, default_cmp = _ort_default_runs(pair, o_vals)
        cmp = _compare(pair, o_vals, r_vals)
        spread = None
        if not cmp["all_bit_identical"] and o.rtol == 0 and o.atol == 0:
            spread = _run_to_run_spread(pair, o_vals, r_vals)
    return PairRun(provider, _comparison_summary(cmp), output_comparisons(cmp["outputs"]), _side(orig, default), _side(rew, rew_default), default_cmp, o.reference_level,
                   unoptimized, spread, _executed_order(pair, rew), settings_for("ckpt", provider, o.enable_mem_reuse),
                   settings_snippet(provider, o.enable_mem_reuse))


def outputs_at(original: PathArg, rewritten: PathArg, feeds_path: PathArg, dims: Mapping[str, int],

               options: PairOptions = PairOptions()) -> OtherDims:
    """Both models once under ckpt's settings on other feeds (another value ``dims`` of each
    symbolic dimension): the comparison of their outputs, or why one of them did not run. No
    memory is measured."""
    o = replace(options, worker=replace(options.worker, memory_method="profiler"))
    provider = resolve_provider(o.provider, o.worker.python)
    with tempfile.TemporaryDirectory(prefix="ckpt_dims_") as tmp:
        pair = _Pair(original, rewritten, feeds_path, provider, o, tmp)
        try:
            pair.measure(original, pair.ckpt_settings(o.enable_mem_reuse, o.reference_level), pair.npz("o"), runs=1)
        except RunFailed as e:
            return OtherDims(dict(dims), original_failed=f"{e.kind}: {e.message}")
        try:
            pair.measure(rewritten, "ckpt", pair.npz("r"), runs=1)
        except RunFailed as e:
            return OtherDims(dict(dims), rewritten_failed=f"{e.kind}: {e.message}")
        return OtherDims(dict(dims), _comparison_summary(_compare(pair, _load_npz(pair.npz("o")),
                                                                  _load_npz(pair.npz("r")))))
