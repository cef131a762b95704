"""The refactoring safety net: the same ckpt command lines in two trees, outputs diffed.

    make identity                       # this tree against HEAD
    python -m bench.identity --ref main --keep out/identity

Each command line runs in a fresh interpreter with ``PYTHONPATH`` set to the tree under test,
once in a git worktree of ``--ref`` and once in this working tree. What is compared, per
command: the exit code, stdout and stderr (volatile figures masked: wall times, step times,
temporary paths), every file it wrote (reports as normalised JSON, models byte for byte).
Exit 0 when every command gives identical results, 1 when any differs (each difference is
listed), 2 on bad usage.

Measured peaks are compared too: on CPU with one intra-op thread they repeat exactly, so a
change in them is a change in the written graph or in how it is run.
"""
from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ("mlp", "cnn", "gpt")
ZOO = ("zoo/bert", "zoo/lenet", "zoo/mlp_dropout")
# Keys whose values are wall-clock or machine figures, not results (never a share or a FLOP count).
VOLATILE_KEYS = re.compile(r"^(step_time_s|step_time_ratio|time_s|python|ckpt_version|ort_version)$"
                           r"|seconds|elapsed|_ms$")
VOLATILE_TEXT = [
    # progress lines: printed or not by how long a stage took (ckpt_cli/cli/progress.py)
    (re.compile(r"^ckpt: (?:\d+ min )?\d+ s: .*\n?|^ckpt: done in .*\n?", re.M), ""),
    (re.compile(r"\d+(\.\d+)?\s?(ms|s|µs)\b"), "<time>"),
    (re.compile(r" +<time>"), " <time>"),  # a table pads a time to its column's widest
    (re.compile(r"\d+(\.\d+)?x (slower|faster)"), "<ratio>"),
    # the headline's ratio of two measured step times: the machine's load, as the times are
    (re.compile(r"step time (?:[+-]\S+%|n/a)"), "step time <ratio>"),
    (re.compile(r"(/tmp|/var/folders)/\S+"), "<tmp>"),
]


@dataclass(frozen=True)
class Case:
    name: str
    args: tuple[str, ...]
    outputs: tuple[str, ...] = ()


def _model_cases(model: str) -> list[Case]:
    tag = model.replace("/", "_")
    src = f"sample_models/{model}.onnx" if "/" not in model else f"sample_models/{model}/training_model.onnx"
    out = f"{{out}}/{tag}"
    return [
        Case(f"{tag}.inspect", ("inspect", src)),
        Case(f"{tag}.inspect.json", ("inspect", src, "--json")),
        Case(f"{tag}.plan", ("plan", src)),
        Case(f"{tag}.plan.json", ("plan", src, "--json", "-o", f"{out}.plan.json"), (f"{tag}.plan.json",)),
        Case(f"{tag}.rewrite", ("rewrite", src, "-o", f"{out}.default.onnx", "--json"), (f"{tag}.default.onnx",)),
        Case(f"{tag}.sqrt", ("rewrite", src, "-o", f"{out}.sqrt.onnx", "--auto", "sqrt", "--json"),
             (f"{tag}.sqrt.onnx",)),
        Case(f"{tag}.budget", ("rewrite", src, "-o", f"{out}.budget.onnx", "--budget", "75%", "--json"),
             (f"{tag}.budget.onnx",)),
        Case(f"{tag}.norecompute", ("rewrite", src, "-o", f"{out}.norec.onnx", "--no-recompute"),
             (f"{tag}.norec.onnx",)),
        Case(f"{tag}.nopin", ("rewrite", src, "-o", f"{out}.nopin.onnx", "--no-pin", "-q"), (f"{tag}.nopin.onnx",)),
        Case(f"{tag}.session", ("session", f"{out}.default.onnx")),
    ]


def cases() -> list[Case]:
    out: list[Case] = []
    for model in SAMPLES + ZOO:
        out += _model_cases(model)
    out += [
        Case("gpt.sweep", ("plan", "sample_models/gpt.onnx", "--sweep")),
        Case("gpt.scope", ("rewrite", "sample_models/gpt.onnx", "-o", "{out}/gpt.scope.onnx",
                           "--regions-by-scope", r"layers\.(\d+)", "--json"), ("gpt.scope.onnx",)),
        Case("gpt.ortopt", ("rewrite", "sample_models/gpt.onnx", "-o", "{out}/gpt.ortopt.onnx",
                            "--ort-optimize", "cpu", "-q"), ("gpt.ortopt.onnx",)),
        Case("gpt.check", ("check", "sample_models/gpt.onnx", "{out}/gpt.default.onnx", "--json", "--runs", "1")),
        Case("cnn.check", ("check", "sample_models/cnn.onnx", "{out}/cnn.default.onnx")),
        Case("gpt.compare", ("compare", "sample_models/gpt.onnx", "{out}/gpt.default.onnx")),
        Case("usage.unknown", ("rewrite", "sample_models/gpt.onnx", "--bogus", "--json")),
        Case("usage.missing", ("inspect", "--json")),
        Case("bad.budget", ("rewrite", "sample_models/mlp.onnx", "-o", "{out}/x.onnx", "--budget", "1%")),
    ]
    return out


def _run_case(case: Case, tree: Path, out: Path) -> dict:
    args = [a.replace("{out}", str(out)) for a in case.args]
    env = dict(os.environ, PYTHONPATH=str(tree), NO_COLOR="1", COLUMNS="120", OMP_NUM_THREADS="1")
    code = "import sys; from ckpt_cli.cli import main; sys.argv[0] = 'ckpt'; sys.exit(main())"
    proc = subprocess.run([sys.executable, "-c", code, *args], cwd=tree, env=env, capture_output=True,
                          text=True, errors="replace", timeout=900)
    return {"rc": proc.returncode, "stdout": _mask(proc.stdout, out), "stderr": _mask(proc.stderr, out),
            "files": {name: _file_digest(out / name) for name in case.outputs}}


def _mask(text: str, out: Path) -> str:
    text = text.replace(str(out), "<out>")
    stripped = text.strip()
    if stripped.startswith("{"):
        try:
            return json.dumps(_drop_volatile(json.loads(stripped)), indent=1, sort_keys=True)
        except ValueError:
            pass
    for pattern, repl in VOLATILE_TEXT:
        text = pattern.sub(repl, text)
    return text


def _drop_volatile(value):
    if isinstance(value, dict):
        return {k: _drop_volatile(v) for k, v in value.items() if not VOLATILE_KEYS.search(k)}
    if isinstance(value, list):
        return [_drop_volatile(v) for v in value]
    return value


def _file_digest(path: Path) -> str:
    import hashlib

    if not path.exists():
        return "missing"
    if path.suffix == ".json":
        return json.dumps(_drop_volatile(json.loads(path.read_text())), sort_keys=True)
    return hashlib.sha256(path.read_bytes()).hexdigest()


def run_tree(tree: Path, out: Path, selected: list[Case]) -> dict[str, dict]:
    out.mkdir(parents=True, exist_ok=True)
    results = {}
    for case in selected:
        results[case.name] = _run_case(case, tree, out)
        print(f"identity: {tree.name}: {case.name}: exit {results[case.name]['rc']}", file=sys.stderr)
    return results


def diff_results(ref: dict[str, dict], work: dict[str, dict]) -> list[str]:
    lines = []
    for name in ref:
        for key in ("rc", "stdout", "stderr", "files"):
            a, b = ref[name][key], work[name][key]
            if a == b:
                continue
            if isinstance(a, str):
                delta = difflib.unified_diff(a.splitlines(), b.splitlines(), "ref", "work", lineterm="", n=1)
                lines.append(f"{name}: {key} differs:\n" + "\n".join(list(delta)[:40]))
            else:
                lines.append(f"{name}: {key} differs: {a!r} -> {b!r}")
    return lines


def _worktree(ref: str, where: Path) -> Path:
    tree = where / "ref"
    subprocess.run(["git", "worktree", "add", "--detach", "-q", str(tree), ref], cwd=ROOT, check=True)
    return tree


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.identity", description=__doc__.split("\n")[0])
    ap.add_argument("--ref", default="HEAD", help="git revision to compare against (default: HEAD)")
    ap.add_argument("--only", default="", help="comma-separated case names (default: all)")
    ap.add_argument("--keep", type=Path, help="keep both trees' outputs and the results here")
    args = ap.parse_args(argv)
    selected = [c for c in cases() if not args.only or c.name in args.only.split(",")]
    if not selected:
        ap.error(f"no case named {args.only!r}")
    scratch = Path(tempfile.mkdtemp(prefix="ckpt-identity-"))
    try:
        ref_tree = _worktree(args.ref, scratch)
        # output folders of one length: reports wrap paths at the same column in both
        ref = run_tree(ref_tree, scratch / "out1", selected)
        work = run_tree(ROOT, scratch / "out2", selected)
        diffs = diff_results(ref, work)
        if args.keep:
            args.keep.mkdir(parents=True, exist_ok=True)
            (args.keep / "identity.json").write_text(json.dumps({"ref": ref, "work": work}, indent=1))
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(scratch / "ref")], cwd=ROOT,
                       capture_output=True)
        shutil.rmtree(scratch, ignore_errors=True)
    for line in diffs:
        print(line)
    print(f"identity: {len(selected) - len({d.split(':')[0] for d in diffs})} of {len(selected)} "
          f"command lines identical to {args.ref}")
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
