"""Train with an ONNX training graph on ONNX Runtime, the original and ckpt's rewrite side by side.

    python train.py small_gpt.onnx small_gpt.ckpt.onnx [--steps 50] [--optimizer adam|sgd]

The graph (from ``export.py``) computes the loss and every parameter's gradient in one
``session.run``; this loop feeds the parameters, applies the gradients with Adam or SGD in
numpy, and feeds the new parameters next step. Nothing but numpy and onnxruntime runs here.

The one thing a rewritten graph needs is its session: ckpt wrote the graph in the order it
must run and recorded the settings in the file, and ``ckpt_cli.session_options(path)``
returns them as an ``onnxruntime.SessionOptions``. The same graph in a session with ORT's
defaults still trains (and gives the same losses), but ORT then reorders it and the saving
is gone (measured: the original's peak).

Five runs, all from the same initial parameters and the same batches:
  original @ ORT defaults   what you would run without ckpt
  original @ ckpt's order   ``session_options(original)``: file order, no graph rewrites
  original @ rewrite's      ``session_options(rewrite)``: the same session as the last row,
                            so the two loss curves must be bit-identical
  rewrite @ ORT defaults    the rewrite in a session nobody tuned: same losses (to rounding),
                            the saving gone
  rewrite @ its settings    ``session_options(rewrite)``: what the recipe is for

What is measured, per step: the loss; the peak memory of that ``session.run``, read from ORT's
profiler (the maximum of ``mem_bytes_in_use`` over the node events inside the run: arena bytes
in use, i.e. activations, gradients and other outputs; the fed parameters are not counted);
and the wall time of ``session.run`` (profiling on in every run, so all carry its small
overhead). Every session has one intra-op thread: the embedding gradient is a ScatterND-add
that ONNX Runtime 1.31 CPU computes nondeterministically with more (updates to repeated
indices get lost).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np
import onnxruntime as ort

import ckpt_cli

# The training text: bytes are the tokens (the model's vocabulary is 256).
TEXT = (
    "Training a neural network keeps every activation of the forward pass until the backward "
    "pass has used it. For deep models these stashed activations, not the weights, fill the "
    "memory. Gradient checkpointing keeps only a few of them and computes the others again "
    "when the backward pass needs them: a little more arithmetic for a lot less memory. "
    "A training graph in ONNX holds the forward and the backward pass in one file, so the "
    "trade can be made once, in the graph, for every runtime that executes it. The rewritten "
    "graph computes the same numbers in the same order, so the loss curve does not change; "
    "only the peak memory does, as long as the runtime executes the nodes in the order the "
    "graph was written. "
).encode("ascii")


# ------------------------------------------------------------------ the graph's interface
def interface(session):
    """(parameters, data inputs, buffers) of a training graph, from its input/output names:
    a parameter is an input ``p`` with an output ``p_grad``; a buffer ``b`` has ``b_updated``."""
    inputs = [i.name for i in session.get_inputs()]
    outputs = {o.name for o in session.get_outputs()}
    params = [n for n in inputs if f"{n}_grad" in outputs]
    buffers = [n for n in inputs if f"{n}_updated" in outputs]
    data = [n for n in inputs if n not in params and n not in buffers]
    return params, data, buffers


def batches(session, steps, seed=0):
    """``steps`` batches of (input_ids, labels): random windows of TEXT, labels shifted by one."""
    shape = next(i.shape for i in session.get_inputs() if i.name == "input_ids")
    batch, seq = shape
    corpus = np.frombuffer(TEXT, dtype=np.uint8).astype(np.int64)
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        starts = rng.integers(0, len(corpus) - seq - 1, size=batch)
        window = np.stack([corpus[s:s + seq + 1] for s in starts])
        out.append({"input_ids": window[:, :-1].copy(), "labels": window[:, 1:].copy()})
    return out


# ------------------------------------------------------------------ optimizers (numpy)
class SGD:
    def __init__(self, lr=0.1, momentum=0.9):
        self.lr, self.momentum, self.velocity = lr, momentum, {}

    def step(self, params, grads):
        for name, g in grads.items():
            v = self.velocity.get(name)
            v = g if v is None else self.momentum * v + g
            self.velocity[name] = v
            params[name] = params[name] - np.float32(self.lr) * v


class Adam:
    def __init__(self, lr=3e-3, betas=(0.9, 0.999), eps=1e-8):
        self.lr, self.b1, self.b2, self.eps = lr, *betas, eps
        self.m, self.v, self.t = {}, {}, 0

    def step(self, params, grads):
        self.t += 1
        c1, c2 = 1 - self.b1 ** self.t, 1 - self.b2 ** self.t
        for name, g in grads.items():
            m = self.b1 * self.m.get(name, 0) + (1 - self.b1) * g
            v = self.b2 * self.v.get(name, 0) + (1 - self.b2) * g * g
            self.m[name], self.v[name] = m, v
            update = self.lr * (m / c1) / (np.sqrt(v / c2) + self.eps)
            params[name] = (params[name] - update).astype(np.float32)


OPTIMIZERS = {"adam": Adam, "sgd": SGD}


# ------------------------------------------------------------------ sessions
def ort_defaults():
    """What you get without asking: DEFAULT order, all graph optimizations, memory pattern."""
    return ort.SessionOptions()


def make_session(model, options, profile_dir):
    options.intra_op_num_threads = 1  # ScatterND-add determinism (see the module docstring)
    options.enable_profiling = True   # per-node arena bytes in use: the memory measurement
    options.profile_file_prefix = os.path.join(profile_dir, os.path.basename(model))
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def peaks_per_run(profile_path):
    """Peak ``mem_bytes_in_use`` of each ``session.run``, from ORT's profile: node events
    (``cat == "Node"``) carry the arena bytes in use after the node, in execution order, and
    fall inside their run's ``model_run`` event. (ORT's ``mem_in_use_peak`` is a lifetime
    maximum, not per run.)"""
    with open(profile_path, encoding="utf-8") as f:
        events = json.load(f)
    runs = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("name") == "model_run")
    nodes = [(e["ts"], int(e["args"]["mem_bytes_in_use"])) for e in events
             if e.get("cat") == "Node" and "mem_bytes_in_use" in e.get("args", {})]
    return [max((m for ts, m in nodes if lo <= ts <= hi), default=0) for lo, hi in runs]


# ------------------------------------------------------------------ the loop
def train(model, options, init, steps=50, optimizer="adam", seed=0):
    """Train ``steps`` steps; returns {"losses", "peak_bytes", "step_s"} (one entry per step)."""
    with tempfile.TemporaryDirectory() as profile_dir:
        session = make_session(model, options, profile_dir)
        params_names, _, buffer_names = interface(session)
        params = {n: init[n].copy() for n in params_names}
        buffers = {n: init[n].copy() for n in buffer_names}
        opt = OPTIMIZERS[optimizer]()
        outputs = [o.name for o in session.get_outputs()]
        losses, times = [], []
        for batch in batches(session, steps, seed):
            feeds = {**params, **buffers, **batch, "tangent_loss": np.ones((), np.float32)}
            start = time.perf_counter()
            result = dict(zip(outputs, session.run(None, feeds)))
            times.append(time.perf_counter() - start)
            losses.append(float(result["loss"]))
            opt.step(params, {n: result[f"{n}_grad"] for n in params_names})
            buffers = {n: result[f"{n}_updated"].copy() for n in buffer_names}
            # ORT's outputs live in its memory arena; holding them would add them to the next
            # step's peak.
            del result
        peaks = peaks_per_run(session.end_profiling())
    return {"losses": losses, "peak_bytes": peaks, "step_s": times}


def runs(original, rewrite, steps=50, optimizer="adam"):
    """The five runs of the module docstring, as {label: result of train()}."""
    init = dict(np.load(os.path.splitext(original)[0] + ".init.npz"))
    plan = [
        ("original @ ORT defaults", original, ort_defaults),
        ("original @ ckpt's order", original, lambda: ckpt_cli.session_options(original)),
        ("original @ rewrite's", original, lambda: ckpt_cli.session_options(rewrite)),
        ("rewrite @ ORT defaults", rewrite, ort_defaults),
        ("rewrite @ its settings", rewrite, lambda: ckpt_cli.session_options(rewrite)),
    ]
    return {label: train(model, options(), init, steps, optimizer)
            for label, model, options in plan}


def mib(n):
    return f"{n / 2**20:.2f} MiB"


def report(results):
    base = results["original @ ORT defaults"]
    same = results["original @ rewrite's"]
    new = results["rewrite @ its settings"]
    steps = len(new["losses"])
    head, tail = min(5, steps), min(3, max(0, steps - 5))
    print(f"loss, steps 1-{head}" + (f" ... {steps - tail + 1}-{steps}" if tail else ""))
    for label, r in results.items():
        losses = " ".join(f"{x:.6f}" for x in r["losses"][:head])
        if tail:
            losses += " ... " + " ".join(f"{x:.6f}" for x in r["losses"][-tail:])
        print(f"  {label:<24} {losses}")
    identical = new["losses"] == same["losses"]
    def rel(r):
        return max(abs(a - b) / abs(b) for a, b in zip(r["losses"], base["losses"]))
    print(f"rewrite vs original in the same session: "
          f"{'bit-identical' if identical else 'DIFFERENT'} over {steps} steps")
    print(f"vs original @ ORT defaults, max relative difference: rewrite @ its settings "
          f"{rel(new):.1e}, rewrite @ ORT defaults {rel(results['rewrite @ ORT defaults']):.1e}")
    print("peak memory of a step (ORT profiler, max mem_bytes_in_use), median step time")
    for label, r in results.items():
        peak = max(r["peak_bytes"])
        print(f"  {label:<24} {mib(peak):>10}  {peak / max(base['peak_bytes']):.2f}x  "
              f"{1e3 * statistics.median(r['step_s']):6.1f} ms")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("original")
    ap.add_argument("rewrite")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--optimizer", choices=sorted(OPTIMIZERS), default="adam")
    ap.add_argument("--json", help="also write every run's per-step figures to this file")
    args = ap.parse_args(argv)
    results = runs(args.original, args.rewrite, args.steps, args.optimizer)
    report(results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
