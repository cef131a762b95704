"""Run one ONNX graph on ONNX Runtime and measure it.  STANDALONE SCRIPT.

This file imports only the standard library, numpy and onnxruntime (the last two
lazily, inside the functions that need them), never ``onnx`` and never another
ckpt module: ``ckpt`` runs it as ``python worker.py SPEC.json`` in a fresh child
process, possibly under another interpreter with another onnxruntime build (for
example onnxruntime-training-cpu 1.19.2 with numpy<2).  The parent
(``ckpt_cli.verify.driver``) sends everything it needs in the spec, the session
settings included (built by ``ckpt_cli.ort.settings``).

SPEC.json::

    {"model": "m.onnx", "feeds": "feeds.npz",
     "provider": "cpu" | "cuda",
     "session": {...},           # ckpt_cli.ort.settings: order, level, reuse, ...
     "runs": 3,                  # measured runs; one extra warm-up run comes first
     "outputs": "out.npz" | null,  # outputs of the LAST measured run
     "profile_dir": "/tmp/x",    # where ORT writes its profile (file removed after)
     "intra_op_threads": 1,
     "memory_method": "auto" | "profiler" | "process_peak",   # optional, default auto
     "extra_outputs": ["timeline"],                        # optional, see below
     }

Result (one JSON object on stdout; everything else goes to stderr)::

    {"ok": true, "provider": "CPUExecutionProvider", "ort_version": "1.31.1",
     "settings": "ckpt", "method": "profiler" | "process_peak" | "none",
     "runs": [{"peak_bytes": int|null, "time_s": float}, ...],
     "peak_bytes": median, "time_s": median,
     "baseline_bytes": int|null, "peak_above_baseline_bytes": int|null,
     "peak_requested_bytes": int|null,
     "executed_order": [node names, last measured run],
     "executed_ops": [their op types, same length],
     "executed_providers": [the provider that ran each, same length],
     "session_settings": {...}, "warnings": [...]}
    {"ok": false, "kind": "provider_unavailable" | "load_failed" | "run_failed"
                          | "bad_feeds" | "bad_spec" | "crashed", "message": "one line"}

Exit code 0 on success, non-zero on failure (see ``EXIT_CODES``).

What the numbers mean (on ORT 1.31.1 CPU):

* method "profiler": ``enable_profiling`` with the CPU arena on.  Every profiler
  event with ``cat == "Node"`` and a name ``<node name>_kernel_time`` carries
  ``args.mem_bytes_in_use`` = arena bytes in use right after that node's kernel
  (its outputs allocated, its dying inputs not yet released) and
  ``args.mem_in_use_delta`` = change during the kernel.  ``peak_bytes`` of one run
  is the max of ``mem_bytes_in_use`` over the node events inside that run's
  ``model_run`` event.  It is *absolute* arena bytes in use: it includes the
  session-lifetime ``baseline_bytes`` (= first node's in-use minus its delta:
  pre-packed weights and initializers smaller than 128 bytes; big initializers
  are not in the arena), and arena chunks are rounded up to 256 bytes.
  ``peak_requested_bytes`` is the same max over ``mem_bytes_requested_in_use``
  (exact, unrounded).  Graph inputs (feeds) are never counted; graph outputs are.
* method "process_peak" (ORT builds whose profiler has no ``mem_*`` fields, such
  as 1.19.2): a second session with the CPU arena OFF (ORT's defaults: ON, see
  ``_measure_process_peak``); before each run give malloc's free heap pages
  back (``malloc_trim``), write 5 to /proc/self/clear_refs (resets VmHWM), read
  VmRSS, run, read VmHWM;
  ``peak_bytes`` = VmHWM - VmRSS(before) = bytes above the pre-run state, i.e.
  comparable to ``peak_above_baseline_bytes`` of the profiler method (page
  granular, includes small malloc noise).  Needs MALLOC_MMAP_THRESHOLD_ in the
  environment *at process start* (the parent sets one page: every buffer of a
  page or more is then mapped on its own); without it a warning is added and
  later runs under-read.
* CUDA (NOT verified on a GPU): memory is read
  from the same profiler fields on node events whose ``args.provider`` is
  ``CUDAExecutionProvider`` (ORT reports the stats of the allocator the kernel
  uses); if no CUDA node event has them, method is "none" and peak_bytes null.
  VmHWM says nothing about device memory, so there is no process_peak fallback
  on CUDA.
* What ORT's allocation planner does with the buffers: ``docs/memory-model.md``.
* ``time_s``: wall time of ``session.run`` (profiling on in both settings, so
  both carry the same small per-node profiling overhead).
* ``extra_outputs``: optional list of extra result sections: "timeline" adds
  ``timeline`` = [[node name, op type, bytes in use before, after, requested
  bytes in use after (or null)], ...] for the
  last measured run (profiler method only).
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from types import ModuleType
from typing import Any, TypedDict, cast

# onnxruntime ships no type information: its sessions and their options are Any here.
Session = Any
SessionOptions = Any

KERNEL_SUFFIX = "_kernel_time"

EXIT_CODES = {
    "provider_unavailable": 3,
    "load_failed": 4,
    "run_failed": 5,
    "bad_feeds": 6,
    "bad_spec": 7,
    "crashed": 8,
}

_PROVIDER_NAMES = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}

class WorkerError(Exception):
    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind
        self.message = message


class _SpecKeys(TypedDict):
    model: str
    feeds: str
    provider: str
    session: dict[str, Any]  # ckpt_cli.verify.settings' JSON document
    settings: str
    runs: int
    intra_op_threads: int
    memory_method: str
    extra_outputs: list[str]
    profile_dir: str


class Spec(_SpecKeys, total=False):
    """SPEC.json once ``_parse_spec`` has checked it and filled in the defaults."""

    outputs: str | None
    seed: int


class RunFigures(TypedDict):
    """One measured run in the answer."""

    peak_bytes: int | None
    time_s: float


class ProfiledRun(TypedDict):
    """One measured run as the profiler saw it (``_timeline``: dropped from the answer)."""

    peak_bytes: int | None
    time_s: float
    peak_requested_bytes: int | None
    baseline_bytes: int | None
    _timeline: list[list[Any]]


class Memory(TypedDict):
    """The memory method used and its figures (``_memory_figures``)."""

    method: str
    runs: list[RunFigures]
    baseline_bytes: int | None
    peak_requested_bytes: int | None


# (executed_order, executed_ops, executed_providers)
Executed = tuple[list[str], list[str], list[str]]


# --------------------------------------------------------------------------- settings
# The session settings arrive as plain data in the spec (``ckpt_cli.ort.settings``
# builds them), so this script needs no other ckpt module.


def _session_options(ort: ModuleType, settings: dict[str, Any], *, threads: int, profile_prefix: str | None,
                     arena: bool | None = None) -> SessionOptions:
    so = ort.SessionOptions()
    so.execution_order = getattr(ort.ExecutionOrder, settings["execution_order"])
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel,
                                          settings["graph_optimization_level"])
    so.enable_mem_pattern = bool(settings["enable_mem_pattern"])
    so.enable_mem_reuse = bool(settings.get("enable_mem_reuse", True))
    so.enable_cpu_mem_arena = bool(settings["enable_cpu_mem_arena"] if arena is None else arena)
    so.intra_op_num_threads = int(threads)
    for k, v in settings["config_entries"].items():
        so.add_session_config_entry(k, v)
    if profile_prefix is not None:
        so.enable_profiling = True
        so.profile_file_prefix = profile_prefix
    so.log_severity_level = 3  # errors only; warnings about e.g. unused initializers are noise
    return so


# --------------------------------------------------------------------------- helpers


def _one_line(text: object, limit: int = 600) -> str:
    s = " ".join(str(text).split())
    return s if len(s) <= limit else s[: limit - 3] + "..."


@contextlib.contextmanager
def _capture_fd2() -> Iterator[dict[str, str]]:
    """Capture what native code writes to fd 2 (ORT's logger); replay it after."""
    buf = {"text": ""}
    try:
        saved = os.dup(2)
    except OSError:
        yield buf
        return
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        sys.stderr.flush()
        os.dup2(tmp.fileno(), 2)
        try:
            yield buf
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            data = tmp.read().decode("utf-8", "replace")
            buf["text"] = data
            if data:
                sys.stderr.write(data)
                sys.stderr.flush()


def _cuda_failure_reason(log: str) -> str:
    """Pick the most telling line of ORT's log about why CUDA did not load."""
    import re

    clean = re.sub(r"\x1b\[[0-9;]*m", "", log)
    lines = [l.strip() for l in clean.splitlines() if l.strip()]
    for key in ("with error:", "no CUDA-capable device", "CUDA driver version",
                "CUDA failure", "cudaErrorNoDevice", "Failed to create CUDAExecutionProvider"):
        for l in lines:
            if key in l:
                i = l.find("with error:")
                if i >= 0:
                    return l[i:]
                return l.split("]", 1)[1].strip() if "]" in l else l
    for l in lines:
        if "cuda" in l.lower():
            return l
    return "no reason logged (no usable GPU, or CUDA/cuDNN libraries missing)"


_ORT_TO_NUMPY = {
    "tensor(float)": "float32", "tensor(double)": "float64", "tensor(float16)": "float16",
    "tensor(int8)": "int8", "tensor(int16)": "int16", "tensor(int32)": "int32",
    "tensor(int64)": "int64", "tensor(uint8)": "uint8", "tensor(uint16)": "uint16",
    "tensor(uint32)": "uint32", "tensor(uint64)": "uint64", "tensor(bool)": "bool",
}


def _load_feeds(np: ModuleType, path: str, session: Session) -> dict[str, Any]:
    try:
        with np.load(path, allow_pickle=False) as z:
            feeds = {k: z[k] for k in z.files}
    except Exception as e:  # numpy's reader raises many types on a bad file
        raise WorkerError("bad_feeds", f"cannot read feeds {path}: {_one_line(e)}") from e
    inputs = session.get_inputs()
    names = [i.name for i in inputs]
    extra = sorted(set(feeds) - set(names))
    if extra:
        raise WorkerError("bad_feeds", f"feed {extra[0]!r} is not an input of the model "
                                       f"(inputs: {', '.join(names[:8])})")
    for inp in inputs:
        if inp.name not in feeds and inp.type.startswith("optional("):
            continue  # ORT runs a left-out optional input as None (ckpt's memory-pattern switch)
        if inp.name not in feeds:
            raise WorkerError("bad_feeds", f"missing feed for input {inp.name!r} "
                                           f"({inp.type} {list(inp.shape)})")
        arr = feeds[inp.name]
        want = _ORT_TO_NUMPY.get(inp.type)
        if want is not None and str(arr.dtype) != want:
            raise WorkerError("bad_feeds", f"input {inp.name!r}: dtype {arr.dtype}, "
                                           f"model wants {inp.type}")
        shape = list(inp.shape)
        if len(shape) != arr.ndim or any(isinstance(d, int) and d != a
                                         for d, a in zip(shape, arr.shape)):
            raise WorkerError("bad_feeds", f"input {inp.name!r}: shape {list(arr.shape)}, "
                                           f"model wants {shape}")
    return feeds


def _read_profile(path: str) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        text = f.read()
    # ORT's profile is a JSON array of Chrome trace events.
    try:
        return cast(list[dict[str, Any]], json.loads(text))
    except json.JSONDecodeError:
        # A profile cut short (crash) lacks the closing bracket.
        return cast(list[dict[str, Any]], json.loads(text.rstrip().rstrip(",") + "]"))


def _split_runs(events: list[dict[str, Any]]) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """[(model_run event, [kernel node events inside it in execution order]), ...]"""
    runs = sorted((e for e in events if e.get("name") == "model_run"), key=lambda e: e["ts"])
    nodes = sorted((e for e in events if e.get("cat") == "Node"
                    and str(e.get("name", "")).endswith(KERNEL_SUFFIX)),
                   key=lambda e: e["ts"])
    out = []
    j = 0
    for r in runs:
        lo, hi = r["ts"], r["ts"] + r.get("dur", 0)
        inside: list[dict[str, Any]] = []
        while j < len(nodes) and nodes[j]["ts"] < lo:
            j += 1
        while j < len(nodes) and nodes[j]["ts"] <= hi:
            inside.append(nodes[j])
            j += 1
        out.append((r, inside))
    return out


def _mem_of_run(node_events: list[dict[str, Any]], provider_name: str
                ) -> tuple[int | None, int | None, int | None, list[list[Any]]]:
    """(peak, peak_requested, baseline, timeline) from one run's node events."""
    peak: int | None = None
    peak_req: int | None = None
    baseline: int | None = None
    timeline: list[list[Any]] = []
    for e in node_events:
        a = e.get("args", {})
        if a.get("provider", provider_name) != provider_name or "mem_bytes_in_use" not in a:
            continue
        in_use = int(a["mem_bytes_in_use"])
        delta = int(a.get("mem_in_use_delta", 0))
        if baseline is None:
            baseline = in_use - delta
        peak = in_use if peak is None else max(peak, in_use)
        if "mem_bytes_requested_in_use" in a:
            r = int(a["mem_bytes_requested_in_use"])
            peak_req = r if peak_req is None else max(peak_req, r)
        timeline.append([e["name"][: -len(KERNEL_SUFFIX)], a.get("op_name", ""),
                         in_use - delta, in_use, int(a["mem_bytes_requested_in_use"])
                         if "mem_bytes_requested_in_use" in a else None])
    return peak, peak_req, baseline, timeline


def _proc_status() -> dict[str, int]:
    d = {}
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(("VmHWM:", "VmRSS:")):
                k, v = line.split(":", 1)
                d[k] = int(v.split()[0]) * 1024
    return d


def _median(values: Sequence[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    if not vals:
        return None
    m = statistics.median(vals)
    return int(m) if all(isinstance(v, int) for v in vals) else m


def _median_bytes(values: Sequence[int | None]) -> int | None:
    m = _median(values)
    return None if m is None else int(m)


# --------------------------------------------------------------------------- main work


def _make_session(ort: ModuleType, model: str, so: SessionOptions, provider: str, settings: dict[str, Any]) -> Session:
    prov_name = _PROVIDER_NAMES[provider]
    providers: list[Any]
    if provider == "cuda":
        avail = ort.get_available_providers()
        if prov_name not in avail:
            raise WorkerError("provider_unavailable",
                              f"this onnxruntime build ({ort.__version__}) has no "
                              f"CUDAExecutionProvider (available: {', '.join(avail)}); "
                              "install onnxruntime-gpu")
        preload = getattr(ort, "preload_dlls", None)
        if preload is not None:  # finds CUDA/cuDNN from pip nvidia-* wheels if present
            with contextlib.suppress(Exception), _capture_fd2():
                preload()
        providers = [(prov_name, dict(settings["provider_options"])), "CPUExecutionProvider"]
    else:
        providers = ["CPUExecutionProvider"]
    err: Exception | None
    with _capture_fd2() as log:
        try:
            sess = ort.InferenceSession(model, so, providers=providers)
        except Exception as e:  # noqa: BLE001 - ORT's errors have no common type
            err = e
        else:
            err = None
    if err is not None:
        raise WorkerError("load_failed", f"cannot create session for {model}: {_one_line(err)}")
    got = sess.get_providers()[0]
    if got != prov_name:
        if so.enable_profiling:
            with contextlib.suppress(Exception):
                os.remove(sess.end_profiling())
        raise WorkerError("provider_unavailable",
                          f"{prov_name} did not load (session runs on {got}): "
                          + _one_line(_cuda_failure_reason(log["text"])))
    return sess


def _run_once(sess: Session, feeds: dict[str, Any]) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = sess.run(None, feeds)
    return out, time.perf_counter() - t0


def _measure_profiler(ort: ModuleType, np: ModuleType, spec: Spec, settings: dict[str, Any], feeds_path: str,
                      warnings: list[str]
                      ) -> tuple[list[ProfiledRun], list[float], Executed, bool, dict[str, Any]]:
    """Warm-up + N runs with profiling; returns partial result + last outputs."""
    provider = spec["provider"]
    prefix = os.path.join(spec["profile_dir"], f"ckpt_worker_{os.getpid()}")
    so = _session_options(ort, settings, threads=spec["intra_op_threads"], profile_prefix=prefix)
    sess = _make_session(ort, spec["model"], so, provider, settings)
    feeds = _load_feeds(np, feeds_path, sess)
    times: list[float] = []
    out: Any = None
    try:
        for i in range(spec["runs"] + 1):
            out = None  # outputs of the previous run live in the arena: drop them first
            gc.collect()
            out, dt = _run_once(sess, feeds)
            if i > 0:
                times.append(dt)
    except Exception as e:  # ORT's errors have no common type
        raise WorkerError("run_failed", _one_line(e)) from e
    names = [o.name for o in sess.get_outputs()]
    profile = sess.end_profiling()
    try:
        events = _read_profile(profile)
    finally:
        with contextlib.suppress(OSError):
            os.remove(profile)
    all_runs = _split_runs(events)
    runs = all_runs[1:]  # drop the warm-up
    prov_name = _PROVIDER_NAMES[provider]
    per_run: list[ProfiledRun] = []
    for (r, nodes), dt in zip(runs, times):
        peak, peak_req, base, timeline = _mem_of_run(nodes, prov_name)
        per_run.append({"peak_bytes": peak, "time_s": dt, "peak_requested_bytes": peak_req,
                        "baseline_bytes": base, "_timeline": timeline})
    # ORT's profiler stops recording after a fixed number of events (1e6 in recent
    # versions); then the last runs are cut short.  The order is static, so fall
    # back to the fullest run and say so.
    order_src = runs[-1][1] if runs else []
    fullest: list[dict[str, Any]] = max((r[1] for r in all_runs), key=len, default=[])
    if len(order_src) < len(fullest):
        warnings.append(f"profiler recorded {len(order_src)} of {len(fullest)} node events in "
                        "the last run (event limit?); executed_order taken from a fuller run, "
                        "memory numbers of cut runs are incomplete")
        order_src = fullest
    executed = [e["name"][: -len(KERNEL_SUFFIX)] for e in order_src]
    executed_ops = [e.get("args", {}).get("op_name", "") for e in order_src]
    executed_providers = [e.get("args", {}).get("provider", "") for e in order_src]
    has_mem = bool(per_run) and all(r["peak_bytes"] is not None for r in per_run)
    outputs = dict(zip(names, out))
    del sess
    return per_run, times, (executed, executed_ops, executed_providers), has_mem, outputs


def _measure_process_peak(ort: ModuleType, np: ModuleType, spec: Spec, settings: dict[str, Any], feeds_path: str,
                          warnings: list[str]) -> tuple[list[RunFigures], dict[str, Any]]:
    """VmHWM above the process's state before the run, per run (CPU only). ckpt's settings
    run with the arena off: every run starts from the loaded session. ORT's defaults keep
    it (``process_peak_with_arena``): the arena holds the chunks it took after a run, so
    each run's peak is taken above the state before the first run, what the process holds
    for the model's runs as a user's session does."""
    if not os.environ.get("MALLOC_MMAP_THRESHOLD_"):
        warnings.append("MALLOC_MMAP_THRESHOLD_ was not set at process start; "
                        "process_peak may under-read after the first run")
    with_arena = bool(settings.get("measurement_only", {}).get("process_peak_with_arena"))
    so = _session_options(ort, settings, threads=spec["intra_op_threads"], profile_prefix=None,
                          arena=None if with_arena else False)
    sess = _make_session(ort, spec["model"], so, spec["provider"], settings)
    feeds = _load_feeds(np, feeds_path, sess)
    per_run: list[RunFigures] = []
    start: int | None = None
    out: Any = None
    try:
        for i in range(spec["runs"] + 1):
            out = None
            gc.collect()
            _trim_heap()
            before = _reset_peak(warnings if i == 0 else [])
            start = before if start is None else start
            out, dt = _run_once(sess, feeds)
            if i > 0:
                base = start if with_arena else before
                per_run.append({"peak_bytes": _proc_status()["VmHWM"] - base if base is not None else None,
                                "time_s": dt})
    except WorkerError:
        raise
    except Exception as e:  # ORT's errors have no common type
        raise WorkerError("run_failed", _one_line(e)) from e
    names = [o.name for o in sess.get_outputs()]
    return per_run, dict(zip(names, out))


def _trim_heap() -> None:
    """Give malloc's free heap pages back (glibc ``malloc_trim``). A block above the mmap
    threshold still comes from the heap where a free chunk there fits it, and such pages,
    left resident by earlier runs, hide it from the peak: one process's runs of a GRU
    training graph read 6.8 down to 6.2 MB without this, 7.27 MB each with it."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def _reset_peak(warnings: list[str]) -> int | None:
    """Reset VmHWM to the current resident size (write 5 to clear_refs) and return that
    size; None (with a warning) where the kernel does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")
        return _proc_status()["VmRSS"]
    except OSError as e:
        warnings.append(f"cannot reset VmHWM ({_one_line(e)}); no memory numbers")
        return None


def _process_peak_in_child(spec: Spec) -> dict[str, Any]:
    import subprocess

    path = os.path.join(spec["profile_dir"], f"ckpt_worker_pp_{os.getpid()}.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(spec, f)
    try:
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--process-peak", path],
                              stdout=subprocess.PIPE, stderr=None, text=True, check=False)
    finally:
        with contextlib.suppress(OSError):
            os.remove(path)
    try:
        # The child's answer: {"ok", "runs", "warnings"} or {"ok": false, "kind", "message"}.
        res = cast(dict[str, Any], json.loads(proc.stdout.strip().splitlines()[-1]))
    except (IndexError, ValueError) as e:
        raise WorkerError("crashed", f"the process-peak child measuring {os.path.basename(spec['model'])} "
                                     f"({spec['settings']} settings, arena off) gave no result: "
                                     f"{_how_it_ended(proc.returncode)}") from e
    if not res.get("ok"):
        raise WorkerError(res.get("kind", "run_failed"), res.get("message", "?"))
    return res


def _how_it_ended(returncode: int) -> str:
    if returncode >= 0:
        return f"exit code {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = "a signal"
    return f"killed by {name} (signal {-returncode})"


def _process_peak_main(raw: dict[str, Any]) -> dict[str, Any]:
    spec = _parse_spec(raw)
    settings = spec["session"]
    import numpy as np
    import onnxruntime as ort

    _seed(ort, spec)
    warnings: list[str] = []
    runs, outputs = _measure_process_peak(ort, np, spec, settings, spec["feeds"], warnings)
    out_path = spec.get("outputs")
    if out_path:
        np.savez(out_path, **cast(
dict[str, Any], {k: np.asarray(v) for k, v in outputs.items()}))
    return {"ok": True, "runs": runs, "warnings": warnings}


def _parse_spec(spec: dict[str, Any]) -> Spec:
    try:
        s = dict(spec)
        for key in ("model", "feeds"):
            if not isinstance(s.get(key), str):
                raise ValueError(f"spec needs a string {key!r}")
        s["provider"] = s.get("provider", "cpu")
        if s["provider"] not in _PROVIDER_NAMES:
            raise ValueError(f"provider must be 'cpu' or 'cuda', not {s['provider']!r}")
        if not isinstance(s.get("session"), dict):
            raise ValueError("spec needs the session settings as an object 'session'")
        s["settings"] = s["session"].get("settings", "custom")
        s["runs"] = int(s.get("runs", 3))
        if s["runs"] < 1:
            raise ValueError("runs must be >= 1")
        s["intra_op_threads"] = int(s.get("intra_op_threads") or 1)
        s["memory_method"] = s.get("memory_method") or "auto"
        if s["memory_method"] not in ("auto", "profiler", "process_peak"):
            raise ValueError(f"bad memory_method {s['memory_method']!r}")
        s["extra_outputs"] = list(s.get("extra_outputs") or [])
        if not s.get("profile_dir"):
            s["profile_dir"] = tempfile.gettempdir()
        # Every key of Spec is now checked or filled in.
        return cast(Spec, s)
    except (TypeError, ValueError) as e:
        raise WorkerError("bad_spec", _one_line(e)) from e


def _seed(ort: ModuleType, spec: Spec) -> None:
    """Seed ORT's random generator before any session exists, so that random ops
    without a seed attribute (Dropout) draw the same masks in every process that
    runs the same nodes in the same order: two graphs can then be compared."""
    set_seed = getattr(ort, "set_seed", None)
    if set_seed is not None:
        set_seed(int(spec.get("seed", 0)))


def _import_runtime() -> tuple[ModuleType, ModuleType]:
    """numpy and onnxruntime, as the interpreter running this script has them."""
    try:
        import numpy as np
        import onnxruntime as ort
    except Exception as e:  # any import failure: reported as load_failed
        raise WorkerError("load_failed", f"cannot import numpy/onnxruntime under "
                                         f"{sys.executable}: {_one_line(e)}") from e
    return np, ort


def _memory_figures(ort_version: str, spec: Spec, per_run: list[ProfiledRun], times: list[float], has_mem: bool,
                    warnings: list[str]) -> Memory:
    """The memory method used and its figures: per-run peaks and times, baseline, peak requested."""
    method = spec["memory_method"]
    baseline = per_run[-1]["baseline_bytes"] if per_run and has_mem else None
    peak_req = _median_bytes([r["peak_requested_bytes"] for r in per_run]) if has_mem else None
    if method == "profiler" and not has_mem:
        warnings.append(f"profiler of onnxruntime {ort_version} reports no mem_* fields")
    if has_mem and method in ("auto", "profiler"):
        runs: list[RunFigures] = [{"peak_bytes": r["peak_bytes"], "time_s": r["time_s"]} for r in per_run]
        return {"method": "profiler", "runs": runs, "baseline_bytes": baseline, "peak_requested_bytes": peak_req}
    if spec["provider"] == "cpu" and method in ("auto", "process_peak"):
        # A fresh process: after an arena session has run in this process, ORT 1.19.2
        # arena-off runs read 0 (memory stays resident); a new process reads right.
        pp = _process_peak_in_child(spec)
        warnings += pp.get("warnings", [])
        # Time from the profiled runs, so both methods time the same kind of session.
        runs = [{"peak_bytes": p["peak_bytes"], "time_s": t} for p, t in zip(pp["runs"], times)]
        return {"method": "process_peak", "runs": runs, "baseline_bytes": None, "peak_requested_bytes": None}
    if spec["provider"] == "cuda":
        warnings.append("no mem_* fields on CUDA node events; device peak not measured")
    runs = [{"peak_bytes": None, "time_s": t} for t in times]
    return {"method": "none", "runs": runs, "baseline_bytes": baseline, "peak_requested_bytes": peak_req}


def _result(ort_version: str, spec: Spec, memory: Memory, executed: Executed, warnings: list[str]) -> dict[str, Any]:
    """The worker's answer (see the module docstring)."""
    used, runs, baseline = memory["method"], memory["runs"], memory["baseline_bytes"]
    peak = _median_bytes([r["peak_bytes"] for r in runs])
    executed_order, executed_ops, executed_providers = executed
    return {
        "ok": True,
        "provider": _PROVIDER_NAMES[spec["provider"]],
        "ort_version": ort_version,
        "settings": spec["settings"],
        "method": used,
        "runs": runs,
        "peak_bytes": peak,
        "time_s": _median([r["time_s"] for r in runs]),
        "baseline_bytes": baseline,
        "peak_above_baseline_bytes": (
            (peak - baseline) if (peak is not None and baseline is not None)
            else (peak if used == "process_peak" else None)),
        "peak_requested_bytes": memory["peak_requested_bytes"],
        "executed_order": executed_order,
        "executed_ops": executed_ops,
        "executed_providers": executed_providers,
        "session_settings": spec["session"],
        "warnings": warnings,
    }


def _save_outputs(np: ModuleType, spec: Spec, outputs: dict[str, Any]) -> None:
    if not spec.get("outputs"):
        return
    try:
        np.savez(spec["outputs"], **{k: np.asarray(v) for k, v in outputs.items()})
    except Exception as e:  # any write failure: reported as run_failed
        raise WorkerError("run_failed", f"cannot write outputs: {_one_line(e)}") from e


def run_spec(raw: dict[str, Any]) -> dict[str, Any]:
    spec = _parse_spec(raw)
    np, ort = _import_runtime()
    if not os.path.exists(spec["model"]):
        raise WorkerError("load_failed", f"model file not found: {spec['model']}")
    _seed(ort, spec)
    warnings: list[str] = []
    per_run, times, executed, has_mem, outputs = _measure_profiler(
        ort, np, spec, spec["session"], spec["feeds"], warnings)
    timeline = per_run[-1]["_timeline"] if per_run else []
    memory = _memory_figures(ort.__version__, spec, per_run, times, has_mem, warnings)
    result = _result(ort.__version__, spec, memory, executed, warnings)
    if "timeline" in spec["extra_outputs"]:
        result["timeline"] = timeline if memory["method"] == "profiler" else []
    if memory["method"] != "process_peak":  # the process-peak child wrote the outputs itself
        _save_outputs(np, spec, outputs)
    return result


def probe(provider: str, model: str) -> dict[str, Any]:
    """Can `provider` really run `model` here?  (used by check.resolve_provider)"""
    try:
        import onnxruntime as ort
    except Exception as e:  # noqa: BLE001 - any import failure: the provider cannot run
        return {"ok": False, "kind": "load_failed", "message": _one_line(e)}
    settings = {"execution_order": "PRIORITY_BASED", "graph_optimization_level": "ORT_DISABLE_ALL",
                "enable_mem_pattern": False, "enable_cpu_mem_arena": True, "config_entries": {},
                "provider_options": {}}
    so = _session_options(ort, settings, threads=1, profile_prefix=None)
    try:
        sess = _make_session(ort, model, so, provider, settings)
    except WorkerError as e:
        return {"ok": False, "kind": e.kind, "message": e.message}
    return {"ok": True, "provider": sess.get_providers()[0], "ort_version": ort.__version__}


def main(argv: list[str] | None = None) -> int:

    argv = list(sys.argv[1:] if argv is None else argv)
    # Native libraries and Python warnings must not pollute the JSON on stdout.
    real_stdout = os.fdopen(os.dup(1), "w")
    sys.stdout.flush()
    os.dup2(2, 1)
    try:
        if len(argv) == 3 and argv[0] == "--probe":
            result = probe(argv[1], argv[2])
        elif len(argv) == 2 and argv[0] == "--process-peak":
            try:
                with open(argv[1], encoding="utf-8") as f:
                    result = _process_peak_main(json.load(f))
            except WorkerError as e:
                result = {"ok": False, "kind": e.kind, "message": _one_line(e.message)}
        elif len(argv) == 1:
            try:
                with open(argv[0], encoding="utf-8") as f:
                    spec = json.load(f)
                result = run_spec(spec)
            except WorkerError as e:
                result = {"ok": False, "kind": e.kind, "message": _one_line(e.message)}
            except (OSError, json.JSONDecodeError) as e:
                result = {"ok": False, "kind": "bad_spec", "message": _one_line(e)}
            except MemoryError as e:
                result = {"ok": False, "kind": "run_failed", "message": f"out of memory: {e}"}
        else:
            result = {"ok": False, "kind": "bad_spec",
                      "message": "usage: worker.py SPEC.json | worker.py --probe PROVIDER MODEL"}
    except Exception as e:  # noqa: BLE001 - last resort: still answer in JSON
        result = {"ok": False, "kind": "run_failed",
                  "message": _one_line(f"{type(e).__name__}: {e}")}
    real_stdout.write(json.dumps(result) + "\n")
    real_stdout.flush()
    if result.get("ok"):
        return 0
    return EXIT_CODES.get(result.get("kind", ""), 1)


if __name__ == "__main__":
    sys.exit(main())
