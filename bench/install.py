"""What ``pip install`` of ckpt's wheel resolves on each platform, and what it costs.

    python -m bench.install                # resolve for Linux x86_64, macOS arm64, Windows AMD64
    python -m bench.install --venv         # also: a fresh venv's size and `ckpt --help` start time

Resolution needs PyPI: ``pip install --dry-run --report`` with ``--platform ...
--only-binary=:all: --python-version 3.11``, which resolves from the index's metadata as
``pip download`` would, without fetching every wheel. pip evaluates environment markers
on the machine it runs on, whatever ``--platform`` says, so the wheel's own requirements
are chosen here by the target's markers and handed to pip (their dependencies' markers
are still read as this machine's). Exit 1 when a platform does not resolve.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from statistics import median

REPO = Path(__file__).resolve().parent.parent
# platform tags pip may pick wheels of, and the marker environment of such a machine
PLATFORMS = {
    "linux-x86_64": (["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"],
                     {"sys_platform": "linux", "platform_machine": "x86_64", "platform_system": "Linux", "os_name": "posix"}),
    "macos-arm64": (["macosx_14_0_arm64", "macosx_13_0_arm64", "macosx_12_0_arm64", "macosx_11_0_arm64"],
                    {"sys_platform": "darwin", "platform_machine": "arm64", "platform_system": "Darwin", "os_name": "posix"}),
    "windows-amd64": (["win_amd64"],
                      {"sys_platform": "win32", "platform_machine": "AMD64", "platform_system": "Windows", "os_name": "nt"}),
}


def build_wheel(out: Path, source: Path = REPO) -> Path:
    """The wheel of ``source``, built from a copy of the files git sees there: setuptools
    leaves build/ and an egg-info folder in the tree it builds, and a build/ left there
    would put stale modules in the next wheel (as bench/wheel_check.sh does)."""
    tree = out.parent / "source"
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=source,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for rel in filter(None, listed):
        if (source / rel).is_file():  # a deleted file git still lists is skipped
            (tree / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source / rel, tree / rel)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(tree)], check=True)
    return next(out.glob("onnx_ckpt-*.whl"))


def requirements(wheel: Path, environment: dict) -> list[str]:
    """The wheel's Requires-Dist (no extras) that hold on a machine of ``environment``."""
    from packaging.requirements import Requirement

    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        lines = z.read(meta).decode().splitlines()
    env = {"python_version": "3.11", "python_full_version": "3.11.0", "implementation_name": "cpython",
           "platform_python_implementation": "CPython", "extra": "", **environment}
    chosen = []
    for line in lines:
        if line.startswith("Requires-Dist: "):
            req = Requirement(line.removeprefix("Requires-Dist: "))
            if req.marker is None or req.marker.evaluate(env):
                req.marker = None
                chosen.append(str(req))
    return chosen


def resolve(wheel: Path, platforms: list[str], environment: dict, work: Path) -> dict:
    """The distributions pip picks for ``wheel`` on those platform tags, or its error."""
    report = work / "report.json"
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--dry-run", "--ignore-installed", "--only-binary=:all:",
           "--python-version", "3.11", "--implementation", "cp", "--target", str(work / "target"),
           "--report", str(report), *[a for p in platforms for a in ("--platform", p)],
           *requirements(wheel, environment)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        return {"ok": False, "error": done.stderr.strip().splitlines()[-1:]}
    picked = json.loads(report.read_text())["install"]
    return {"ok": True, "packages": sorted(f"{p['metadata']['name']}=={p['metadata']['version']}" for p in picked)}


def fresh_venv(wheel: Path, work: Path) -> dict:
    """A new venv with the wheel installed: its size, `pip check`, and `ckpt --help`'s start time."""
    venv = work / "venv"
    # the venv alone: a PYTHONPATH naming a source tree (its egg-info) would make pip skip the wheel
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, env=env)
    subprocess.run([venv / "bin" / "python", "-m", "pip", "install", "-q", str(wheel)], check=True, env=env)
    check = subprocess.run([venv / "bin" / "python", "-m", "pip", "check"], capture_output=True, text=True, env=env)
    size = subprocess.run(["du", "-sk", str(venv)], capture_output=True, text=True, check=True)
    subprocess.run([venv / "bin" / "ckpt", "--help"], capture_output=True, check=True, env=env)  # warm the page cache
    times = []
    for _ in range(5):
        start = time.perf_counter()
        subprocess.run([venv / "bin" / "ckpt", "--help"], capture_output=True, check=True, env=env)
        times.append(time.perf_counter() - start)
    return {"venv_mib": round(int(size.stdout.split()[0]) / 1024, 1), "pip_check": check.stdout.strip(),
            "pip_check_ok": check.returncode == 0, "ckpt_help_s": round(median(times), 3)}


def measure(venv: bool = True, source: Path = REPO) -> dict:
    """Resolution on every platform and, with ``venv``, a fresh venv's figures (``make bench``)."""
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        wheel = build_wheel(work / "wheel", source)
        out: dict = {"resolution": {}}
        for name, (tags, environment) in PLATFORMS.items():
            (work / name).mkdir()
            out["resolution"][name] = resolve(wheel, tags, environment, work / name)
        if venv:
            out["venv"] = fresh_venv(wheel, work)
    return out


def render(res: dict | None, add) -> None:
    """Section 8 of bench/RESULTS.md."""
    add("## 8. Install")
    add("")
    if not res or "error" in res:
        add(f"Not measured{': ' + res['error'] if res else ''}.")
        add("")
        return
    add("`python -m bench.install --venv`: the wheel's dependencies as pip resolves them per platform (PyPI), "
        "and a fresh venv with `pip install` of the wheel.")
    add("")
    for name, found in res["resolution"].items():
        ort = [p for p in found.get("packages", []) if p.startswith("onnxruntime")]
        add(f"- {name}: " + (f"resolves ({', '.join(ort)}, {len(found['packages'])} packages)" if found["ok"]
                             else f"FAILS: {' '.join(found['error'])}"))
    if "venv" in res:
        v = res["venv"]
        add(f"- fresh venv: {v['venv_mib']} MiB; pip check: {v['pip_check']}; `ckpt --help` {v['ckpt_help_s']} s "
            "(median of 5)")
    add("")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--venv", action="store_true", help="also measure a fresh venv with the wheel installed")
    ap.add_argument("--json", help="write the figures to this file")
    ap.add_argument("--source", type=Path, default=REPO, help="the source tree to build (default: this one)")
    a = ap.parse_args(argv)
    out = measure(a.venv, a.source)
    for name, found in out["resolution"].items():
        print(f"{name}: " + (" ".join(found["packages"]) if found["ok"] else f"FAILED {found['error']}"))
    if a.venv:
        print(f"fresh venv: {out['venv']['venv_mib']} MiB, pip check: {out['venv']['pip_check']}, "
              f"ckpt --help {out['venv']['ckpt_help_s']} s")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0 if all(r["ok"] for r in out["resolution"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
