"""Session (b) of issue 14 on any provider: a rewrite's peak under ORT's DEFAULT order and
ORT_ENABLE_ALL (memory pattern off, buffer reuse on, default provider options), measured
by ckpt's worker as `ckpt check` measures its sessions. `ckpt check` covers (a), plain
ORT defaults, and (c), the recorded settings; bench/gpu_check.sh runs this beside it.

    python bench/gpu_sessions.py ORIGINAL REWRITTEN PROVIDER OUT.json
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import onnx

from ckpt_cli.verify.driver import run_model
from ckpt_cli.verify.feeds import make_feeds, save_feeds
from ckpt_cli.ort.settings import ort_default_session_settings


def default_all(provider: str) -> dict:
    return dict(ort_default_session_settings(provider), settings="default_all", enable_mem_pattern=False)


def main(original: str, rewritten: str, provider: str, out: str) -> None:
    with tempfile.TemporaryDirectory(prefix="ckpt_gpu_sessions_") as tmp:
        feeds = Path(tmp) / "feeds.npz"
        save_feeds(feeds, make_feeds(onnx.load(original, load_external_data=False), 0))
        row = {}
        for side, model in (("original", original), ("rewritten", rewritten)):
            r = run_model(model, feeds, provider=provider, settings=default_all(provider), runs=3)
            row[side] = {"peak_bytes": r["peak_bytes"], "time_s": r["time_s"], "method": r["method"]}
    Path(out).write_text(json.dumps(row))


if __name__ == "__main__":
    main(*sys.argv[1:5])
