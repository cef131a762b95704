"""Mutation testing of ckpt's rules: break one rule at a time, the tests named for it must fail.

``tests/mutants.toml`` lists the mutants: each changes one exact snippet of one file
(``original``, which must occur exactly once there, into ``replacement``) and names the
pytest node ids that must catch it. The runner copies the working tree (tracked and
untracked files git does not ignore) to a temporary folder (one per ``--jobs``), checks
that every named test passes there unmutated, then applies each mutant in a copy alone
(the working tree is never written; the file is restored after each), runs its tests
(``-p no:xdist -x``, no bytecode written, so a mutated module is always compiled afresh)
and records it:

- ``caught``: a named test failed (or timed out);
- ``SURVIVED``: every named test passed with the rule broken;
- ``ERROR``: the snippet is missing or not unique (the list has rotted), or pytest found no
  such test.

It exits 1 on any survivor or error.

    python -m tests.mutate                        # make mutate (2 jobs)
    python -m tests.mutate --only budget_held     # mutants whose name contains this
    python -m tests.mutate --list
"""

from __future__ import annotations

import argparse
import json
import queue
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import tomllib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MUTANTS = ROOT / "tests" / "mutants.toml"
TIMEOUT_S = 300  # one mutant's tests; a mutant that hangs them (a loop never left) is caught


@dataclass(frozen=True)
class Mutant:
    name: str
    rule: str  # the rule the mutant breaks, as its code names it
    file: str
    original: str
    replacement: str
    tests: tuple[str, ...]


def load_mutants(path: Path = MUTANTS) -> list[Mutant]:
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    return [Mutant(m["name"], m["rule"], m["file"], m["original"], m["replacement"], tuple(m["tests"]))
            for m in data["mutant"]]


def snippet_problem(m: Mutant, root: Path = ROOT) -> str | None:
    """Why ``m`` cannot be applied to the tree at ``root``, or None."""
    path = root / m.file
    if not path.is_file():
        return f"{m.file}: no such file"
    n = path.read_text(encoding="utf-8").count(m.original)
    if n != 1:
        return f"{m.file}: the original snippet occurs {n} times (must be once)"
    if m.original == m.replacement:
        return "the replacement is the original"
    return None


def _copy_tree(dest: Path) -> None:
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, check=True).stdout.decode().split("\0")
    for rel in filter(None, files):
        src = ROOT / rel
        if src.is_file():  # a file deleted in the working tree but still in the index is left out
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)


def _pytest(tree: Path, tests: list[str], timeout: float) -> tuple[int | None, str]:
    """pytest's exit code over ``tests`` in ``tree`` (None: timed out), and its output's tail."""
    (tree / ".tmp").mkdir(exist_ok=True)  # the tests' temporary files, inside the copy
    env = dict(os.environ, PYTHONPATH=str(tree), PYTHONDONTWRITEBYTECODE="1", CI="", TMPDIR=str(tree / ".tmp"))
    # hypothesis' plugin alone takes two thirds of a one-test run's start; tests using it run without it
    cmd = [sys.executable, "-m", "pytest", "-p", "no:xdist", "-p", "no:cacheprovider", "-p", "no:hypothesispytest",
           "-x", "-q", *tests]
    try:
        r = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, ""
    return r.returncode, (r.stdout + r.stderr)[-2000:]


def _devices_intact() -> bool:
    """/dev/null is still a device: a mutant that breaks a write's refusal of special files
    must not have replaced one of the machine's (its tests write into their own folders)."""
    return not Path("/dev/null").exists() or stat.S_ISCHR(os.stat("/dev/null").st_mode)


def run_mutant(tree: Path, m: Mutant) -> tuple[str, str]:
    """Apply ``m`` in ``tree``, run its tests, restore the file: (outcome, detail)."""
    problem = snippet_problem(m, tree)
    if problem:
        return "ERROR", problem
    path = tree / m.file
    text = path.read_text(encoding="utf-8")
    try:
        path.write_text(text.replace(m.original, m.replacement), encoding="utf-8")
        rc, tail = _pytest(tree, list(m.tests), TIMEOUT_S)
    finally:
        path.write_text(text, encoding="utf-8")
    if not _devices_intact():
        raise SystemExit(f"mutate: {m.name} replaced /dev/null with a file: its tests must write only in tmp_path")
    if rc is None:
        return "caught", f"timed out after {TIMEOUT_S} s"
    if rc in (1, 2):  # tests failed, or the mutated module broke their collection
        return "caught", ""
    if rc == 0:
        return "SURVIVED", "every named test passed"
    return "ERROR", f"pytest exit {rc}: {tail.strip().splitlines()[-1] if tail.strip() else ''}"


def _timed(trees: "queue.Queue[Path]", m: Mutant) -> tuple[str, dict]:
    """Run ``m`` in a tree no other mutant is using, and say how it went."""
    tree = trees.get()
    try:
        t0 = time.monotonic()
        outcome, detail = run_mutant(tree, m)
    finally:
        trees.put(tree)
    seconds = time.monotonic() - t0
    print(f"{outcome:8} {m.name} ({seconds:.1f} s){': ' + detail if detail else ''}", flush=True)
    return m.name, {"outcome": outcome, "detail": detail, "seconds": round(seconds, 1)}


def baseline(tree: Path, mutants: list[Mutant]) -> str | None:
    """Every named test passes on the unmutated tree, or why not."""
    tests = sorted({t for m in mutants for t in m.tests})
    rc, tail = _pytest(tree, tests, TIMEOUT_S * 4)
    return None if rc == 0 else f"the named tests do not pass unmutated (pytest exit {rc}):\n{tail}"


def _args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m tests.mutate", description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", metavar="NAME", help="only the mutants whose name contains NAME")
    ap.add_argument("--list", action="store_true", help="list the mutants and their tests, run nothing")
    ap.add_argument("--json", metavar="FILE", help="also write the outcomes as JSON to FILE")
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1),
                    help="mutants run at once, each in a copy of the tree of its own (default: 2, or 1 on one core)")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    mutants = [m for m in load_mutants() if not args.only or args.only in m.name]
    if args.list:
        for m in mutants:
            print(f"{m.name}  [{m.rule}]  {m.file}  -> {', '.join(m.tests)}")
        return 0
    if not mutants:
        print(f"no mutant's name contains {args.only!r}", file=sys.stderr)
        return 2
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="ckpt_mutate_") as tmp:
        trees: queue.Queue[Path] = queue.Queue()
        for k in range(max(1, args.jobs)):
            (Path(tmp) / str(k)).mkdir()
            _copy_tree(Path(tmp) / str(k))
            trees.put(Path(tmp) / str(k))
        failed = baseline(Path(tmp) / "0", mutants)
        if failed:
            print(failed, file=sys.stderr)
            return 1
        with ThreadPoolExecutor(max(1, args.jobs)) as pool:
            outcomes = dict(pool.map(lambda m: _timed(trees, m), mutants))
    return _summary(outcomes, time.monotonic() - start, args.json)


def _summary(outcomes: dict[str, dict], seconds: float, json_path: str | None) -> int:
    counts = {k: sum(1 for o in outcomes.values() if o["outcome"] == k) for k in ("caught", "SURVIVED", "ERROR")}
    print(f"{len(outcomes)} mutants: {counts['caught']} caught, {counts['SURVIVED']} survived, "
          f"{counts['ERROR']} errors in {seconds:.0f} s")
    if json_path:
        Path(json_path).write_text(json.dumps({"counts": counts, "seconds": round(seconds), "mutants": outcomes},
                                              indent=1) + "\n", encoding="utf-8")
    return 0 if counts["SURVIVED"] == counts["ERROR"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
