"""The ONNX Runtime session settings ckpt measures and recommends, as plain data.

The worker (a standalone script) receives one of these dicts in its spec, and
``settings_snippet`` prints the same settings as Python a user can paste.
"""

from __future__ import annotations

from typing import Any

PROVIDER_NAMES = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}
_PROVIDER_NAMES = PROVIDER_NAMES

# CUDA provider options used for the "ckpt" settings.  kSameAsRequested makes the
# arena grow by exactly what is requested (no power-of-two over-reservation),
# HEURISTIC avoids cuDNN's exhaustive search that allocates big workspaces.
CKPT_CUDA_PROVIDER_OPTIONS = {
    "arena_extend_strategy": "kSameAsRequested",
    "cudnn_conv_algo_search": "HEURISTIC",
}

def ckpt_session_settings(provider: str = "cpu") -> dict[str, Any]:
    """The session settings a ckpt-rewritten graph needs, as plain data.

    ``ORT_DISABLE_ALL`` rather than BASIC minus CSE: BASIC still runs fusions that make new
    nodes, and PRIORITY_BASED runs those late, off the written order.
    """
    if provider not in _PROVIDER_NAMES:
        raise ValueError(f"unknown provider {provider!r} (expected 'cpu' or 'cuda')")
    return {
        "settings": "ckpt",
        "provider": _PROVIDER_NAMES[provider],
        "provider_options": dict(CKPT_CUDA_PROVIDER_OPTIONS) if provider == "cuda" else {},
        "execution_order": "PRIORITY_BASED",
        "graph_optimization_level": "ORT_DISABLE_ALL",
        "enable_mem_pattern": False,
        "enable_cpu_mem_arena": True,
        "config_entries": {},
        # Only for measuring; not part of what a user must set.
        "measurement_only": {"intra_op_num_threads": 1, "enable_profiling": True},
    }


def ort_default_session_settings(provider: str = "cpu") -> dict[str, Any]:
    """ORT's defaults as a user gets them, plus what measuring needs.

    Compromise (documented): profiling is switched on (the memory numbers come
    from it, and it adds the same small per-node overhead as in "ckpt" runs) and
    intra_op_num_threads is 1 (determinism: ScatterND with ``reduction="add"`` loses
    updates when indices repeat and more than one thread runs); everything else is
    ORT's default: DEFAULT execution order, ORT_ENABLE_ALL, memory pattern ON
    (its pre-allocated block shows up from the second run on, which is what a
    user pays), CPU arena on, default CUDA provider options. Builds whose profiler
    reports no memory measure the process's peak, with the arena kept on as here
    (``process_peak_with_arena``): what the user's session holds, the arena's chunks
    included (ckpt's settings are measured that way with the arena off).
    """
    if provider not in _PROVIDER_NAMES:
        raise ValueError(f"unknown provider {provider!r} (expected 'cpu' or 'cuda')")
    return {
        "settings": "ort_default",
        "provider": _PROVIDER_NAMES[provider],
        "provider_options": {},
        "execution_order": "DEFAULT",
        "graph_optimization_level": "ORT_ENABLE_ALL",
        "enable_mem_pattern": True,
        "enable_cpu_mem_arena": True,
        "config_entries": {},
        "measurement_only": {"intra_op_num_threads": 1, "enable_profiling": True, "process_peak_with_arena": True},
    }


def settings_snippet(provider: str = "cpu", enable_mem_reuse: bool = True, model_path: str | None = None,
                     session: str = "ckpt", pattern_off_input: str | None = None, mem_arena: bool = True) -> str:
    """A copy-pasteable Python snippet that builds the session ``model_path`` is for: ckpt's
    settings, or (``session="ort_default"``, a graph ckpt left unchanged) ORT's defaults.
    ``pattern_off_input``: the input the file turns ORT's memory pattern off with;
    ``mem_arena``: the CPU arena the file records (off where ckpt measured that lower)."""
    s = ckpt_session_settings(provider)
    if session == "ort_default":
        said = (["# ckpt found no plan that lowers the peak by recompute; it only added the",
                 f"# optional input {pattern_off_input!r} (never fed), which turns ORT's memory",
                 "# pattern off: run it with ORT's default settings."] if pattern_off_input else
                ["# ckpt found no plan that lowers the peak and wrote the graph unchanged:",
                 "# run it as the original, with ORT's default settings."])
        return "\n".join([
            "import onnxruntime as ort",
            "",
            *said,
            "providers = " + (f"[({s['provider']!r}, {{}}), 'CPUExecutionProvider']" if provider == "cuda"
                              else "['CPUExecutionProvider']"),
            f'session = ort.InferenceSession({(model_path or "model.ckpt.onnx")!r}, providers=providers)',
        ]) + "\n"
    lines = [
        "import onnxruntime as ort",
        "",
        "so = ort.SessionOptions()",
        "# Run nodes in the order they are written in the file (ckpt wrote the",
        "# recompute copies exactly where they must run).",
        f"so.execution_order = ort.ExecutionOrder.{s['execution_order']}",
        "# Graph optimizations would merge recompute copies back (CSE) or add fused",
        "# nodes that PRIORITY_BASED runs last; keep the graph as written.",
        f"so.graph_optimization_level = ort.GraphOptimizationLevel.{s['graph_optimization_level']}",
        f"so.enable_mem_pattern = {s['enable_mem_pattern']}",
        *([f"# (the file turns it off by itself too: optional input {pattern_off_input!r}, never fed)"]
          if pattern_off_input else []),
        *(["# ckpt predicts less memory for this graph when freed buffers are released",
           "# instead of parked for a later tensor of the same shape.",
           "so.enable_mem_reuse = False"] if not enable_mem_reuse else []),
        *(["# ckpt measured this graph lower under these settings without ORT's CPU arena."]
          if not mem_arena else []),
        f"so.enable_cpu_mem_arena = {s['enable_cpu_mem_arena'] and mem_arena}",
    ]
    for k, v in s["config_entries"].items():
        lines.append(f"so.add_session_config_entry({k!r}, {v!r})")
    lines.append("# so.intra_op_num_threads = 1  # only for bit-identical comparisons")
    if provider == "cuda":
        lines.append(
            f"providers = [({s['provider']!r}, {s['provider_options']!r}), 'CPUExecutionProvider']"
        )
    else:
        lines.append("providers = ['CPUExecutionProvider']")
    lines += [
        f'session = ort.InferenceSession({(model_path or "model.ckpt.onnx")!r}, so, providers=providers)',
        f"assert session.get_providers()[0] == {s['provider']!r}",
    ]
    return "\n".join(lines) + "\n"


def settings_for(name: str, provider: str, enable_mem_reuse: bool = True) -> dict[str, Any]:
    """Named settings: "ckpt" (what a rewritten model is planned for, with its buffer-reuse
    choice), "ort_default" (an untouched session: only providers set), and
    "ckpt_default_order" (ckpt's settings under ORT's DEFAULT order)."""
    if name == "ckpt":
        return dict(ckpt_session_settings(provider), enable_mem_reuse=enable_mem_reuse)
    if name == "ort_default":
        return ort_default_session_settings(provider)
    if name == "ckpt_default_order":
        return dict(ckpt_session_settings(provider), settings=name, execution_order="DEFAULT",
                    enable_mem_reuse=enable_mem_reuse)
    raise ValueError(f"unknown settings {name!r} (expected 'ckpt', 'ort_default' or 'ckpt_default_order')")
