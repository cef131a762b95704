"""One ``ckpt`` command run in this process, with where its time went, as JSON on stdout.

    python -m bench.stages plan MODEL --budget 65% --json

The command is ckpt's own CLI (``ckpt_cli.cli.main``), its output discarded; the library
stages it calls are timed by wrapping them where ``ckpt_cli.api`` calls them: load (read,
check, expand function ops), analysis, planning (the search and the chosen plan's written
rewrite) and the report. ``imports`` is ckpt's import (onnx, numpy and the rest with it);
the interpreter's own start-up comes before this script runs and is not counted.
"""

from __future__ import annotations

import time

START = time.perf_counter()

import contextlib  # noqa: E402
import io  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402

import ckpt_cli.api as api  # noqa: E402
from ckpt_cli.cli import main  # noqa: E402

IMPORTED = time.perf_counter()
# (stage, the api-level functions whose time it is)
STAGES = (("load", ("load_input",)), ("analysis", ("analyse_input",)),
          ("planning", ("make_plan", "rewrite_plan")), ("report", ("plan_report", "plan_rows")))


def timed(args: list[str]) -> dict:
    spent = {stage: 0.0 for stage, _ in STAGES}
    for stage, names in STAGES:
        for name in names:
            inner = getattr(api, name)

            def wrapper(*a, _inner=inner, _stage=stage, **k):
                t = time.perf_counter()
                try:
                    return _inner(*a, **k)
                finally:
                    spent[_stage] += time.perf_counter() - t

            setattr(api, name, wrapper)
    rc = 0
    t = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            main(args, standalone_mode=False)
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else 1
    end = time.perf_counter()
    return {"command": ["ckpt", *args], "rc": rc, "imports_s": IMPORTED - START, "stages_s": spent,
            "other_s": end - t - sum(spent.values()), "total_s": end - START}


if __name__ == "__main__":
    print(json.dumps(timed(sys.argv[1:])))
