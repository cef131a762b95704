"""Children are untrusted: a ``--python`` interpreter that prints without end, hangs, answers
garbage, writes a malformed .npz or dies by a signal makes ``ckpt check`` exit 5 with one
line saying what happened, within ``--timeout``, with ckpt's memory bounded and no process
of the child's left running."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

from ckpt_cli.cli import main
from ckpt_cli.errors import RunFailed
from ckpt_cli.ort import child
from ckpt_cli.verify import driver
from ckpt_cli.verify.feeds import make_feeds, save_feeds

REAL = sys.executable


def fake_python(folder: Path, body: str, probe: str = 'exec "$REAL" "$@"') -> Path:
    """An interpreter that runs ``body`` (sh) for a measuring run and ``probe`` for the
    provider probe; $REAL is the real interpreter, "$@" the worker's arguments."""
    path = folder / "python"
    path.write_text(f'#!/bin/sh\nREAL="{REAL}"\nif [ "$2" = "--probe" ]; then\n{probe}\nfi\n{body}\n')
    path.chmod(0o755)
    return path


def check(chain_path: Path, python: Path, *extra: str):
    args = ["check", str(chain_path), str(chain_path), "--provider", "cpu", "--runs", "1", "--python", str(python),
            *extra]
    started = time.monotonic()
    r = CliRunner().invoke(main, args)
    return r.exit_code, r.output, time.monotonic() - started


def one_error_line(output: str) -> str:
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("ckpt: error: "), output
    assert "Traceback" not in output
    return lines[0]


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z")


def test_endless_output_is_cut_at_the_answer_bound(chain_path, tmp_path):
    """Was: every byte kept (30 MiB printed took ckpt from 80 to 600 MiB; endless output
    grew it by GBs until the timeout)."""
    fake = fake_python(tmp_path, "exec yes 0123456789012345678901234567890123456789")
    err = tmp_path / "stderr.txt"
    with open(err, "wb") as sink:
        proc = subprocess.Popen([REAL, "-m", "ckpt_cli.cli", "check", str(chain_path), str(chain_path), "--provider",
                                 "cpu", "--runs", "1", "--python", str(fake), "--timeout", "60"],
                                stdout=subprocess.DEVNULL, stderr=sink, env={**os.environ, "NO_COLOR": "1"})
        # this command's own peak: RUSAGE_CHILDREN would hold every child the test process reaped
        _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    peak_mib = usage.ru_maxrss / 1024
    stderr = err.read_text()
    assert proc.returncode == 5, stderr
    line = one_error_line(stderr)
    assert "printed more than 32 MiB" in line and "chain.onnx" in line, line
    # bounded reading holds 250-500 MiB (ckpt, ORT and a 32 MiB answer); unbounded grows by GBs
    assert peak_mib < 1024, f"ckpt's peak RSS {peak_mib:.0f} MiB while reading a child's endless output"


def test_timeout_kills_the_wrapped_worker(chain_path, tmp_path):
    """Was: the wrapper was killed and its worker left spinning at 100% CPU."""
    pid_file = tmp_path / "worker.pid"
    fake = fake_python(tmp_path, f'"$REAL" -c "while True: pass" &\necho $! > {pid_file}\nwait')
    code, out, took = check(chain_path, fake, "--timeout", "2")
    line = one_error_line(out)
    assert code == 5 and "ran past the 2 s timeout" in line and "chain.onnx" in line, line
    assert took < 30
    worker = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while not _gone(worker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(worker), "the wrapped worker outlived the timeout"


def test_provider_probe_honours_the_timeout(chain_path, tmp_path):
    """Was: the provider probe waited a fixed 300 s whatever --timeout said."""
    fake = fake_python(tmp_path, 'exec "$REAL" "$@"', probe="exec sleep 1000")
    r = CliRunner().invoke(main, ["check", str(chain_path), str(chain_path), "--runs", "1", "--python", str(fake),
                                  "--timeout", "2"])
    line = one_error_line(r.output)
    assert r.exit_code == 5 and "probe ran past the 2 s timeout" in line, line


@pytest.mark.parametrize("answer,says", [
    ('{"ok": true, "peak_bytes": ' + "7" * 5000 + "}", "a number of 5000 digits"),
    ('{"ok": true, "provider": "CPUExecutionProvider", "method": "none", "runs": [], "executed_order": 5}',
     "malformed result (executed_order)"),
    ('{"ok": true}', "malformed result (provider, method, runs, executed_order)"),
    ("[" * 100000, "no JSON result"),
    ('{"ok": false, "kind": "run_failed", "message": "bad\\u001b]8;;x\\u0007 news"}', "bad ]8;;x news"),
    ('{"ok": true, "time_s": NaN}', "no JSON result (NaN is not a number)"),
])
def test_malformed_answers_are_exit_5(chain_path, tmp_path, answer, says):
    """Was: a 5000-digit number made exit 70."""
    (tmp_path / "answer").write_text(answer + "\n")
    code, out, _ = check(chain_path, fake_python(tmp_path, f'cat "{tmp_path / "answer"}"'))
    line = one_error_line(out)
    assert code == 5 and says in line, line
    assert "\x1b" not in out and "\x07" not in out


def test_malformed_outputs_npz_is_exit_5(chain_path, tmp_path):
    """Was: exit 2 naming the temporary .npz. The worker runs; then its outputs are spoilt."""
    spoil = ('"$REAL" "$@"\nrc=$?\n"$REAL" -c "import json,sys; p=json.load(open(sys.argv[1]))[\'outputs\']; '
             'p and open(p, \'r+b\').write(b\'garbage\')" "$2"\nexit $rc')
    code, out, _ = check(chain_path, fake_python(tmp_path, spoil))
    line = one_error_line(out)
    assert code == 5 and "wrote outputs that are not a readable .npz" in line and "ckpt_check_" not in line, line


@pytest.mark.parametrize("sig", [signal.SIGSEGV, signal.SIGKILL])
def test_child_killed_by_a_signal_is_named(chain_path, tmp_path, sig):
    code, out, _ = check(chain_path, fake_python(tmp_path, f"echo partial\nkill -{sig.name[3:]} $$"))
    line = one_error_line(out)
    assert code == 5 and f"killed by {sig.name} (signal {int(sig)})" in line and "chain.onnx" in line, line


def test_crashed_process_peak_child_is_named(chain_path, tmp_path):
    """The worker's own process-peak child dies by SIGSEGV: the worker names it, its model
    and its settings (was: "process_peak child died (exit code -11)")."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text("import os, signal, sys\n"
                                           "if '--process-peak' in sys.argv:\n"
                                           "    os.kill(os.getpid(), signal.SIGSEGV)\n")
    fake = fake_python(tmp_path, f'PYTHONPATH="{hook}" exec "$REAL" "$@"')
    feeds = tmp_path / "feeds.npz"
    save_feeds(feeds, make_feeds(onnx.load(str(chain_path)), 0))
    with pytest.raises(RunFailed) as e:
        driver.run_model(chain_path, feeds, provider="cpu", runs=1,
                         worker=driver.WorkerOptions(python=str(fake), memory_method="process_peak"))
    assert e.value.kind == "crashed"
    assert e.value.message == ("the process-peak child measuring chain.onnx (ckpt settings, arena off) gave no "
                               "result: killed by SIGSEGV (signal 11)")


def test_npz_header_claiming_more_than_it_holds_is_refused(tmp_path):
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False, "shape": (9,)})
    path = tmp_path / "o.npz"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("y.npy", header.getvalue() + bytes(16))
    with pytest.raises(RunFailed, match="claims 36 bytes and holds 16"):
        child.load_outputs(str(path), "the worker")


def test_ort_optimize_honours_the_timeout_and_kills_its_group(chain_path, tmp_path, monkeypatch):
    """Was: ORT's offline optimization child ran under a fixed 1800 s timeout, whatever
    --timeout said, and a process it started outlived it."""
    from ckpt_cli import optimize

    pid_file = tmp_path / "spinner.pid"
    hang = (f"import subprocess, sys, time\np = subprocess.Popen([sys.executable, '-c', 'while True: pass'])\n"
            f"open({str(pid_file)!r}, 'w').write(str(p.pid))\ntime.sleep(120)\n")
    monkeypatch.setattr(optimize, "_CHILD", hang)
    started = time.monotonic()
    # --auto min-peak: the default's plain-session judgement would run ORT's optimizer first
    r = CliRunner().invoke(main, ["rewrite", str(chain_path), "-o", str(tmp_path / "out.onnx"), "--ort-optimize",
                                  "cpu", "--timeout", "2", "--auto", "min-peak"])
    line = one_error_line(r.output)
    assert r.exit_code == 5 and "optimization ran past the 2 s timeout (--timeout)" in line, line
    assert time.monotonic() - started < 60
    assert not (tmp_path / "out.onnx").exists()
    spinner = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while not _gone(spinner) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(spinner), "a process of ORT's optimization child outlived the timeout"


@pytest.mark.parametrize("script,says", [
    ("print('{\"ok\": true, \"onnxruntime\": ' + '7' * 5000 + '}')", "gave no result (exit code 0)"),
    ("import os; os.kill(os.getpid(), 11)", "gave no result (killed by SIGSEGV (signal 11))"),
])
def test_ort_optimize_child_without_an_answer_is_exit_5(chain_path, tmp_path, monkeypatch, script, says):
    from ckpt_cli import optimize

    monkeypatch.setattr(optimize, "_CHILD", script)
    r = CliRunner().invoke(main, ["rewrite", str(chain_path), "-o", str(tmp_path / "out.onnx"), "--ort-optimize",
                                  "cpu"])
    line = one_error_line(r.output)
    assert r.exit_code == 5 and says in line, line
