"""ckpt on Hugging Face transformers' model code (random init, small configs): joint graphs
nobody here built, exported and rewritten as a user would.

    python -m bench.hf_models --python PY                       # every model, table to stdout
    python -m bench.hf_models --python PY --write bench/HF_MODELS.md [--only gpt2,t5]

PY: an interpreter with torch 2.13, onnxscript, transformers and ckpt_cli (``.venv-torch``,
which tests/test_export.py builds, after ``pip install transformers``). Per model
(``bench/hf_factories.py``): ``ckpt export`` under PY (compared with eager PyTorch), ``ckpt
rewrite --check --json`` here with no other option, then ORT's CPU arena peak of the
original and of the rewrite (``tests/fixtures/sessions.py``'s ``measure``: a fresh child,
one warm-up run, the profiled run's most bytes in use, one thread) in a plain
``InferenceSession(path)`` (ORT's defaults) and under ckpt's settings: the original under
PRIORITY_BASED without fusions, the rewrite under the settings it records (ORT's defaults
for a graph written unchanged, which ckpt does where its plan would hold more than the
original in a plain session).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.fixtures.sessions import make_feeds, measure

ROOT = Path(__file__).resolve().parent.parent
FACTORIES = ROOT / "bench" / "hf_factories.py"
MODELS = ("gpt2", "llama", "mistral", "bert", "distilbert", "t5", "vit", "convnext")
MiB = 2**20


def _ckpt(python: str, *args: object, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run([python, "-m", "ckpt_cli.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=dict(os.environ, NO_COLOR="1", PYTHONPATH=str(ROOT)))


def _exported(name: str, python: str, folder: Path) -> tuple[Path | None, str]:
    """The joint graph of ``name`` and its export's figure (max difference from eager PyTorch)."""
    out = folder / f"{name}.onnx"
    done = _ckpt(python, "export", f"{FACTORIES}:{name}", "-o", out, "--force")
    if done.returncode != 0:
        return None, f"exit {done.returncode}: {done.stderr.strip().splitlines()[-1][:160]}"
    diff = re.search(r"max difference from eager PyTorch: (\S+)", done.stdout)
    return out, diff[1] if diff else "not compared"


def _peaks(original: Path, rewrite: Path, feeds: Path) -> dict[str, tuple[int, int]]:
    return {session: (measure(original, session, feeds)["peak_bytes"], measure(rewrite, session, feeds)["peak_bytes"])
            for session in ("ckpt", "plain")}


def _cell(pair: tuple[int, int]) -> str:
    before, after = pair
    return f"{before / MiB:.2f} → {after / MiB:.2f} ({after / before:.2f}x)"


def row(name: str, python: str, folder: Path) -> str:
    src, exported = _exported(name, python, folder)
    if src is None:
        return f"| {name} | export failed ({exported}) | | | | | |"
    out = folder / f"{name}.ckpt.onnx"
    done = _ckpt(sys.executable, "rewrite", src, "-o", out, "--check", "--json", "--force")
    report = json.loads(done.stdout) if done.stdout.strip() else {}
    if done.returncode != 0 or "error" in report:
        return f"| {name} | {exported} | rewrite exit {done.returncode}: {done.stderr.strip()[-160:]} | | | | |"
    check = report["check"]
    verdict = ("PASS" if check["passed"] else "FAIL") + (", bit-identical" if check["outputs_equal"] else "")
    plan = (f"{report['strategy']}, {report['recompute_share_of_step']:.1%} of a step"
            if report["no_gain_reason"] is None else f"written unchanged: {report['no_gain_reason'][:120]}…")
    feeds = folder / f"{name}.npz"
    make_feeds(src, feeds)
    peaks = _peaks(src, out, feeds)
    nodes = json.loads(_ckpt(sys.executable, "inspect", src, "--json").stdout)["nodes"]
    return (f"| {name} | {nodes} | {exported} | {plan} | {verdict} | {_cell(peaks['ckpt'])} | "
            f"{_cell(peaks['plain'])} |")


HEAD = ("| model | nodes | export: max difference from eager PyTorch | default plan | `ckpt check` | "
        "ckpt's settings, MiB: original → rewrite as recorded | plain `InferenceSession(path)`, MiB: original → rewrite |\n"
        "|---|---|---|---|---|---|---|")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.hf_models", description=__doc__.split("\n")[0])
    ap.add_argument("--python", required=True, help="an interpreter with torch 2.13, onnxscript and transformers")
    ap.add_argument("--only", default=",".join(MODELS), help="comma-separated model names")
    ap.add_argument("--write", type=Path, help="write the table there (markdown) as well")
    a = ap.parse_args(argv)
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="ckpt_hf_") as tmp:
        rows = [row(name, a.python, Path(tmp)) for name in a.only.split(",")]
    version = _ckpt(a.python, "--version").stdout.strip()
    text = "\n".join([HEAD, *rows])
    print(text)
    if a.write:
        made = (f"Made by `python -m bench.hf_models --python PY --write {a.write}` on "
                f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} in {time.time() - started:.0f} s ({version}).")
        a.write.write_text(f"# ckpt on Hugging Face transformers' model code\n\n{made}\n\n{__doc__.split(chr(10), 2)[2]}\n{text}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
