"""What several benchmark sections share: paths, number formatting, running a command
under measurement (wall time, peak RSS) and the machine description."""

from __future__ import annotations

import datetime as _dt
import math
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "bench"
SAMPLES = ("mlp", "gpt", "cnn")
COMMAND_TIMEOUT_S = 600.0


# --------------------------------------------------------------------------- formatting


def sig(x: float | None, digits: int = 3) -> str:
    """``x`` with ``digits`` significant digits, never in exponent notation."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    if x == 0:
        return "0"
    mag = math.floor(math.log10(abs(x)))
    r = round(x, digits - 1 - mag)
    if r and math.floor(math.log10(abs(r))) > mag:  # 9.996 -> 10.0: one digit fewer after the point
        mag += 1
    return f"{r:.{max(0, digits - 1 - mag)}f}"


def secs(x: float | None) -> str:
    return "n/a" if x is None else f"{sig(x)} s"


def ms(x: float | None) -> str:
    return "n/a" if x is None else f"{sig(x * 1e3)} ms"


def ratio(x: float | None) -> str:
    return "n/a" if x is None else f"{sig(x)}×"


def nbytes(x: int | float | None) -> str:
    if x is None:
        return "n/a"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(x) >= scale:
            return f"{sig(x / scale)} {unit}"
    return f"{int(x)} B"


def pct(x: float | None) -> str:
    return "n/a" if x is None else f"{sig(100 * x, 2)} %"


def yes_no(x) -> str:
    return "n/a" if x is None else ("yes" if x else "**no**")


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def missing(section: dict | None, add, skipped: str = "Skipped.") -> bool:
    """Say so when a section was skipped or failed; True if there is nothing else to show."""
    if not section:
        add(skipped)
    elif "error" in section:
        add(f"Failed: `{section['error']}`")
    else:
        return False
    return True


# --------------------------------------------------------------------------- measuring


def ckpt_cmd() -> list[str]:
    exe = Path(sys.executable).with_name("ckpt")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "ckpt_cli.cli"]


def _gnu_time() -> str | None:
    """GNU time, if it works here: it forks the command from a small process, so the
    command's peak RSS is its own (a child forked or vforked straight from this
    benchmark inherits this process's high-water mark into ``ru_maxrss``)."""
    exe = shutil.which("time", path="/usr/bin:/bin:/usr/local/bin")
    if not exe:
        return None
    with tempfile.NamedTemporaryFile("r", suffix=".rss") as f:
        r = subprocess.run([exe, "-o", f.name, "-f", "%M", "true"], capture_output=True)
        try:
            ok = r.returncode == 0 and int(f.read().split()[-1]) > 0
        except (ValueError, IndexError):
            ok = False
    return exe if ok else None


GNU_TIME = _gnu_time()
RSS_METHOD = ("peak RSS of the command itself, from GNU time (`/usr/bin/time -f %M`)" if GNU_TIME else
              "peak RSS from `os.wait4` ru_maxrss (a floor of this benchmark process's own RSS at spawn "
              "time is included; GNU time was not found)")


def run_measured(cmd: list[str], stdout_path: Path | None = None, timeout: float = COMMAND_TIMEOUT_S) -> dict:
    """Run ``cmd`` once: wall time (spawn to reap) and peak RSS."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    rss_file = None
    full = list(cmd)
    if GNU_TIME:
        fd, rss_file = tempfile.mkstemp(suffix=".rss")
        os.close(fd)
        full = [GNU_TIME, "-o", rss_file, "-f", "%M", *cmd]
    with open(stdout_path or os.devnull, "wb") as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        p = subprocess.Popen(full, stdout=out, stderr=err, stdin=subprocess.DEVNULL, cwd=REPO, env=env,
                             start_new_session=True)
        reaped = threading.Event()
        killed = []

        def _kill():
            if not reaped.is_set():
                killed.append(True)
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

        timer = threading.Timer(timeout, _kill)
        timer.start()
        try:
            _, status, ru = os.wait4(p.pid, 0)
        finally:
            reaped.set()
            timer.cancel()
        wall = time.perf_counter() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        tail = err.read()[-3000:].decode(errors="replace")
    rss = None
    if rss_file:
        try:
            rss = int(Path(rss_file).read_text().split()[-1]) * 1024  # KiB
        except (OSError, ValueError, IndexError):
            rss = None
        Path(rss_file).unlink(missing_ok=True)
    else:
        rss = int(ru.ru_maxrss * (1 if sys.platform == "darwin" else 1024))  # bytes on macOS, KiB on Linux
    return {"wall_s": wall, "max_rss_bytes": rss, "rc": p.returncode,
            "timed_out": bool(killed), "stderr_tail": tail.strip()[-1500:] if p.returncode else ""}


def error_line(stderr: str) -> str:
    """The one-line `ckpt: error: ...` message of a failed command, without its prefix."""
    lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
    for ln in reversed(lines):
        if ln.startswith("ckpt: error: "):
            return ln[len("ckpt: error: "):]
    return lines[-1] if lines else ""


# --------------------------------------------------------------------------- environment


def _versions() -> dict:
    out = {"python": platform.python_version()}
    for mod in ("onnx", "onnxruntime", "numpy"):
        try:
            out[mod] = __import__(mod).__version__
        except Exception as e:  # noqa: BLE001
            out[mod] = f"unavailable ({e})"
    try:
        import ckpt_cli

        out["ckpt"] = ckpt_cli.__version__
    except Exception as e:  # noqa: BLE001
        out["ckpt"] = f"unavailable ({e})"
    try:
        import onnxruntime

        out["ort_providers"] = onnxruntime.get_available_providers()
    except Exception:  # noqa: BLE001
        pass
    return out


def _meminfo_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _git() -> dict:
    def git(*a):
        r = subprocess.run(["git", *a], cwd=REPO, capture_output=True, text=True)
        return r.stdout.strip() if r.returncode == 0 else None

    commit = git("rev-parse", "--short", "HEAD")
    # the bench's own results change no figure: an --update after a run is still a clean tree
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", ".",
                ":(exclude)bench/RESULTS.md", ":(exclude)bench/results.json")
    return {"commit": commit, "dirty": bool(dirty) if dirty is not None else None}


def machine_info() -> dict:
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    return {
        "machine": platform.machine(),  # = uname -m
        "system": f"{platform.system()} {platform.release()}",
        "cpu_model": _cpu_model(),
        "nproc": usable,
        "cpu_count": os.cpu_count(),
        "memory_bytes": _meminfo_bytes(),
        "date_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "versions": _versions(),
        "git": _git(),
    }
