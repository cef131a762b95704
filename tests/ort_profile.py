"""ORT's memory at every node, read from its profiler (tests only).

The session uses ckpt's measurement settings (PRIORITY_BASED, ORT_DISABLE_ALL, memory
pattern off, CPU arena on, one thread). The graph runs twice and the second run is read,
as ckpt's worker does: a warm-up run, then the measured one. Each profiler node event
carries ``args.mem_bytes_in_use`` (arena bytes in use after the node) and
``args.mem_bytes_requested_in_use`` (the exact bytes requested), see ORT_FACTS.md §4.

Bytes in use depend on where the arena's regions land: the arena model places each new
region below the old ones, as mmap does in a fresh process with
``MALLOC_MMAP_THRESHOLD_=65536`` (ckpt's worker). ``node_memory_in_child`` measures a batch
that way; in a long-lived process (a test session) freed mappings leave holes and the
order of equal free chunks can differ. ``node_memory`` measures in this process, with
``mallopt`` fixing the threshold (glibc otherwise raises it after the first session frees
a region, and later regions come from the heap, in the other direction).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass

import numpy as np
import onnx
import onnxruntime as ort

KERNEL_SUFFIX = "_kernel_time"
_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter


def _fixed_mmap_threshold() -> None:
    try:
        ctypes.CDLL(ctypes.util.find_library("c")).mallopt(_M_MMAP_THRESHOLD, 65536)
    except (OSError, AttributeError, TypeError):  # not glibc
        pass


_fixed_mmap_threshold()


@dataclass(frozen=True)
class NodeMemory:
    names: tuple[str, ...]  # executed order
    in_use: tuple[int, ...]  # mem_bytes_in_use after each node
    requested: tuple[int, ...]  # mem_bytes_requested_in_use after each node
    baseline: int  # session-lifetime arena bytes before the first node (small initializers)


def session_options(reuse: bool, profile_prefix: str, order: str = "PRIORITY_BASED") -> ort.SessionOptions:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.execution_order = getattr(ort.ExecutionOrder, order)
    so.enable_mem_pattern = False
    so.enable_mem_reuse = reuse
    so.enable_cpu_mem_arena = True
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    so.enable_profiling = True
    so.profile_file_prefix = profile_prefix
    return so


def node_memory(model: onnx.ModelProto | bytes, feeds: dict, *, reuse: bool = True,
                order: str = "PRIORITY_BASED", runs: int = 2) -> NodeMemory:
    """Run ``model`` ``runs`` times in one session and read the last run's node events."""
    data = model if isinstance(model, bytes) else model.SerializeToString()
    with tempfile.TemporaryDirectory(prefix="ckpt_prof_") as tmp:
        so = session_options(reuse, os.path.join(tmp, "p"), order)
        sess = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
        for _ in range(runs):
            sess.run(None, feeds)
        with open(sess.end_profiling(), encoding="utf-8") as f:
            events = json.load(f)
    run = max((e for e in events if e.get("name") == "model_run"), key=lambda e: e["ts"])
    lo, hi = run["ts"], run["ts"] + run["dur"]
    nodes = sorted((e for e in events if e.get("cat") == "Node" and e["name"].endswith(KERNEL_SUFFIX)
                    and lo <= e["ts"] <= hi), key=lambda e: e["ts"])
    args = [e["args"] for e in nodes]
    in_use = tuple(int(a["mem_bytes_in_use"]) for a in args)
    baseline = in_use[0] - int(args[0].get("mem_in_use_delta", 0)) if args else 0
    return NodeMemory(tuple(e["name"][: -len(KERNEL_SUFFIX)] for e in nodes), in_use,
                      tuple(int(a["mem_bytes_requested_in_use"]) for a in args), baseline)


def node_memory_in_child(jobs: list[tuple[onnx.ModelProto, dict, bool]]) -> list[NodeMemory]:
    """``node_memory`` of each (model, feeds, reuse), in order, in one fresh process."""
    with tempfile.TemporaryDirectory(prefix="ckpt_prof_jobs_") as tmp:
        for k, (model, feeds, _) in enumerate(jobs):
            with open(os.path.join(tmp, f"{k}.onnx"), "wb") as f:
                f.write(model.SerializeToString())
            np.savez(os.path.join(tmp, f"{k}.npz"), **feeds)
        spec = [{"model": os.path.join(tmp, f"{k}.onnx"), "feeds": os.path.join(tmp, f"{k}.npz"), "reuse": reuse}
                for k, (_, _, reuse) in enumerate(jobs)]
        with open(os.path.join(tmp, "jobs.json"), "w", encoding="utf-8") as f:
            json.dump(spec, f)
        out = os.path.join(tmp, "out.json")
        subprocess.run([sys.executable, __file__, os.path.join(tmp, "jobs.json"), out], check=True,
                       env=dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536"))
        with open(out, encoding="utf-8") as f:
            return [NodeMemory(**{k: tuple(v) if isinstance(v, list) else v for k, v in r.items()})
                    for r in json.load(f)]


def _main(jobs_path: str, out_path: str) -> None:
    with open(jobs_path, encoding="utf-8") as f:
        jobs = json.load(f)
    results = []
    for job in jobs:
        with np.load(job["feeds"]) as z:
            feeds = {k: z[k] for k in z.files}
        with open(job["model"], "rb") as f:
            results.append(asdict(node_memory(f.read(), feeds, reuse=job["reuse"])))
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(results, f)


if __name__ == "__main__":
    _main(*sys.argv[1:3])
