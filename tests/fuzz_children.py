"""Fuzzing ``ckpt check --python`` with misbehaving interpreters: each case draws one
misbehaviour (prints without end, prints garbage or huge numbers, hangs, kills itself with a
signal, spoils the outputs .npz) at a random stage (provider probe or measuring run) and
classifies the outcome: ``clean_error`` is exit 5 in one ``ckpt: error:`` line, within the
timeout, with no process of the child left; anything else is a ``defect``.

    python -m tests.fuzz_children --cases 40 --seed 0
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import onnx
from click.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parent / "fixtures"))

TIMEOUT_S = 2


def _misbehaviours(rng: random.Random, folder: Path) -> list[str]:
    digits = "9" * rng.randint(21, 6000)
    garbage = bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 4000))).hex()
    spoil = ('"$REAL" "$@"\n"$REAL" -c "import json,sys,os; p=json.load(open(sys.argv[1]))[\'outputs\']; '
             'p and os.path.exists(p) and open(p, \'r+b\').write(os.urandom(64))" "$2"')
    return [
        "exec yes garbage-line",
        f'echo \'{{"ok": true, "peak_bytes": {digits}}}\'',
        f"echo {garbage}",
        '"$REAL" -c "while True: pass" &\nwait',
        "exec sleep 1000",
        f"kill -{rng.choice(['SEGV', 'KILL', 'ABRT', 'BUS', 'TERM'])} $$",
        spoil,
        'echo \'{"ok": true, "time_s": Infinity}\'',
    ]


def _fake(folder: Path, rng: random.Random) -> tuple[Path, str]:
    bad = rng.choice(_misbehaviours(rng, folder))
    at_probe = rng.random() < 0.3
    real = 'exec "$REAL" "$@"'
    probe, body = (bad, real) if at_probe else (real, bad)
    path = folder / "python"
    path.write_text(f'#!/bin/sh\nREAL="{sys.executable}"\necho $$ >> "{folder}/pids"\n'
                    f'if [ "$2" = "--probe" ]; then\n{probe}\nfi\n{body}\n')
    path.chmod(0o755)
    return path, ("probe: " if at_probe else "run: ") + bad[:60]


def _left_running(folder: Path) -> list[int]:
    pids = [int(p) for p in (folder / "pids").read_text().split()] if (folder / "pids").exists() else []
    alive = []
    for pid in pids:
        stat = Path(f"/proc/{pid}/stat")
        if stat.exists() and not stat.read_text().split(") ", 1)[1].startswith("Z"):
            alive.append(pid)
    return alive


def run_case(rng: random.Random, folder: Path, model: Path) -> tuple[str, str]:
    from ckpt_cli.cli import main

    fake, what = _fake(folder, rng)
    provider = ["--provider", rng.choice(["cpu", "auto"])]
    started = time.monotonic()
    r = CliRunner().invoke(main, ["check", str(model), str(model), "--runs", "1", "--python", str(fake),
                                  "--timeout", str(TIMEOUT_S), *provider])
    took = time.monotonic() - started
    lines = [line for line in r.output.splitlines() if line.strip()]
    if r.exit_code == 0 and what.startswith("probe") and "cpu" in provider:
        return "probe_not_run", what  # --provider cpu needs no probe
    if r.exit_code == 0 and what.startswith("probe") and "sleep" not in what and "while" not in what:
        return "clean_fallback", what  # a probe that fails means no CUDA: the run on CPU is real
    if r.exit_code != 5 or len(lines) != 1 or not lines[0].startswith("ckpt: error:") or "Traceback" in r.output:
        return "defect", f"{what}: exit {r.exit_code}: {r.output[-300:]!r}"
    if took > 3 * TIMEOUT_S + 20:
        return "defect", f"{what}: took {took:.0f} s"
    time.sleep(0.2)
    if _left_running(folder):
        return "defect", f"{what}: processes left running"
    return "clean_error", what


def run_fuzz(cases: int, seed: int = 0) -> dict:
    from chain import chain_model

    rng = random.Random(seed)
    counts, defects = Counter(), []
    with tempfile.TemporaryDirectory(prefix="ckpt_fuzz_children_") as tmp:
        model = Path(tmp) / "chain.onnx"
        onnx.save(chain_model(), model)
        for case in range(cases):
            folder = Path(tmp) / f"case{case}"
            folder.mkdir()
            kind, detail = run_case(random.Random(rng.getrandbits(64)), folder, model)
            counts[kind] += 1
            if kind == "defect":
                defects.append({"case": case, "detail": detail})
    return {"cases": cases, "seed": seed, "counts": dict(counts), "defects": defects}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.fuzz_children", description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    summary = run_fuzz(a.cases, a.seed)
    print(json.dumps(summary, indent=2))
    return 1 if summary["defects"] else 0


if __name__ == "__main__":
    sys.exit(main())
