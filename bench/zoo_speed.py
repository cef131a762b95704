"""How long ``ckpt rewrite`` takes on the artifact zoo, here and at another revision
(``bench/ZOO_SPEED.md``).

    python -m bench.zoo_speed /tmp/zoo_full                 # this tree
    python -m bench.zoo_speed /tmp/zoo_full --ref 9f7fcae   # and a git worktree of 9f7fcae

DIR holds the zoo as ``bench.artifacts --out-dir DIR`` leaves it (DIR/NAME/training_model.onnx).
Each model is rewritten once per tree, with no option but ``-o``, in a fresh interpreter whose
``PYTHONPATH`` is the tree: wall seconds per model, the total, and with ``--ref`` the ratio
of this tree's time to the revision's (median, lowest, highest), as a markdown table.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def rewrite_seconds(tree: Path, model: Path, out: Path) -> float:
    env = dict(os.environ, PYTHONPATH=str(tree))
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "ckpt_cli.cli", "rewrite", str(model), "-o", str(out), "--force"],
                          cwd=tree, env=env, capture_output=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{model}: ckpt rewrite exited {done.returncode}: {done.stderr.decode()[-400:]}")
    return seconds


def table(times: dict[str, dict[str, float]], trees: list[str]) -> list[str]:
    lines = ["| model | " + " | ".join(f"{t} (s)" for t in trees) + (" | ratio |" if len(trees) == 2 else " |"),
             "|---|" + "---|" * (len(trees) + (len(trees) == 2))]
    for name in sorted(times, key=lambda n: -times[n][trees[-1]]):
        row = [f"{times[name][t]:.2f}" for t in trees]
        if len(trees) == 2:
            row.append(f"{times[name][trees[1]] / times[name][trees[0]]:.2f}")
        lines.append(f"| {name} | " + " | ".join(row) + " |")
    totals = [sum(times[n][t] for n in times) for t in trees]
    lines.append("| total | " + " | ".join(f"{s:.1f}" for s in totals) + (
        f" | {totals[1] / totals[0]:.2f} |" if len(trees) == 2 else " |"))
    if len(trees) == 2:
        ratios = [times[n][trees[1]] / times[n][trees[0]] for n in times]
        lines.append(f"\nratio {trees[1]} / {trees[0]}: median {statistics.median(ratios):.2f}, "
                     f"lowest {min(ratios):.2f}, highest {max(ratios):.2f} over {len(ratios)} models")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.zoo_speed", description=__doc__.split("\n")[0])
    ap.add_argument("zoo", type=Path, help="the zoo folder (bench.artifacts --out-dir)")
    ap.add_argument("--ref", help="a git revision to time too, in a worktree")
    args = ap.parse_args(argv)
    models = sorted(p for p in args.zoo.glob("*/training_model.onnx"))
    if not models:
        ap.error(f"no */training_model.onnx under {args.zoo}")
    scratch = Path(tempfile.mkdtemp(prefix="ckpt-zoo-speed-"))
    trees: dict[str, Path] = {}
    try:
        if args.ref:
            trees[args.ref] = scratch / "ref"
            subprocess.run(["git", "worktree", "add", "--detach", "-q", str(trees[args.ref]), args.ref], cwd=ROOT,
                           check=True)
        trees["this tree"] = ROOT
        times = {m.parent.name: {name: rewrite_seconds(tree, m, scratch / "out.onnx") for name, tree in trees.items()}
                 for m in models}
    finally:
        if args.ref:
            subprocess.run(["git", "worktree", "remove", "--force", str(scratch / "ref")], cwd=ROOT,
                           capture_output=True)
        shutil.rmtree(scratch, ignore_errors=True)
    print("\n".join(table(times, list(trees))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
