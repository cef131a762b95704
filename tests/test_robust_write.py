"""Writing never loses data (issue 11, items 2-4, 14-16 and the report-path check):
the input's external data, special files, symlinks, concurrent and interrupted writes."""

import hashlib
import os
import signal
import stat
import sys
import threading
import time
from pathlib import Path

import onnx
import pytest
from click.testing import CliRunner

from ckpt_cli.io import safewrite, save
from ckpt_cli.cli import main
from ckpt_cli.errors import CkptError, OutputError, UsageError
from synthetic import save_transformer

sys.path.insert(0, str(Path(__file__).parent))


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _snapshot(folder: Path) -> dict[str, str]:
    return {p.name: _digest(p) for p in folder.iterdir() if p.is_file() and not p.is_symlink()}


def ckpt(*args) -> tuple[int, str]:
    r = CliRunner().invoke(main, [str(a) for a in args])
    assert "Traceback" not in r.output, r.output
    return r.exit_code, r.output


@pytest.fixture
def ext_model(tmp_path) -> Path:
    """A model whose weights live in ``base.onnx.data`` but which is called ``a.onnx``."""
    save_transformer(str(tmp_path / "base.onnx"), layers=1, embed_weights=True, external_data=True)
    m = onnx.load(tmp_path / "base.onnx", load_external_data=False)
    onnx.save(m, tmp_path / "a.onnx")
    (tmp_path / "base.onnx").unlink()
    return tmp_path / "a.onnx"


def test_input_data_file_is_protected(ext_model):
    folder = ext_model.parent
    before = _snapshot(folder)
    code, out = ckpt("rewrite", ext_model, "-o", folder / "base.onnx.data", "--force", "-q")
    assert code == 2 and "external data" in out
    assert _snapshot(folder) == before
    # a model written as base.onnx does not touch base.onnx.data: the input still loads
    code, out = ckpt("rewrite", ext_model, "-o", folder / "base.onnx", "-q")
    assert code == 0, out
    assert _digest(folder / "base.onnx.data") == before["base.onnx.data"]
    assert ckpt("inspect", ext_model, "-q")[0] == 0
    onnx.checker.check_model(str(folder / "base.onnx"))


def test_unrelated_data_file_is_not_replaced(ext_model):
    folder = ext_model.parent
    (folder / "out.onnx.data").write_bytes(b"someone else's weights")
    code, out = ckpt("rewrite", ext_model, "-o", folder / "out.onnx", "-q")
    assert code == 0, out
    assert (folder / "out.onnx.data").read_bytes() == b"someone else's weights"
    model = onnx.load(folder / "out.onnx")  # loads with its own data
    assert all(e.value != "out.onnx.data" for t in model.graph.initializer for e in t.external_data)


def test_data_named_by_content_and_previous_data_removed(ext_model, tmp_path):
    folder = ext_model.parent
    out = folder / "out.onnx"
    assert ckpt("rewrite", ext_model, "-o", out, "-q")[0] == 0
    first = {p.name for p in folder.glob("out.onnx.*.data")}
    assert len(first) == 1
    # a different model written over it: new data file, the old one removed afterwards
    other = tmp_path / "other"
    other.mkdir()
    save_transformer(str(other / "b.onnx"), layers=1, embed_weights=True, external_data=True, seed=7)
    assert ckpt("rewrite", other / "b.onnx", "-o", out, "--force", "-q")[0] == 0
    second = {p.name for p in folder.glob("out.onnx.*.data")}
    assert len(second) == 1 and second != first
    onnx.checker.check_model(str(out))
    assert (folder / "base.onnx.data").exists()  # the input's data is never removed


def test_same_command_same_bytes(ext_model):
    folder = ext_model.parent
    assert ckpt("rewrite", ext_model, "-o", folder / "x.onnx", "-q")[0] == 0
    assert ckpt("rewrite", ext_model, "-o", folder / "y.onnx", "-q")[0] == 0
    xd, yd = next(folder.glob("x.onnx.*.data")), next(folder.glob("y.onnx.*.data"))
    assert xd.name.split(".")[2] == yd.name.split(".")[2] and _digest(xd) == _digest(yd)


def _private_char_device(folder: Path) -> Path:
    """A null device of the test's own (root can make one): were the refusal to regress, the
    rewrite would replace this node, never the system's /dev/null."""
    node = folder / "null"
    try:
        os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except PermissionError:
        return Path("/dev/null")  # not root: then it cannot be replaced either
    return node


def test_special_files_are_never_replaced(ext_model):
    device = _private_char_device(ext_model.parent)
    code, out = ckpt("rewrite", ext_model, "-o", device, "--force", "-q")
    assert code == 2 and "regular file" in out
    assert device.is_char_device()
    fifo = ext_model.parent / "pipe"
    os.mkfifo(fifo)
    code, out = ckpt("plan", ext_model, "-o", fifo, "--force", "-q")
    assert code == 2 and "regular file" in out
    with pytest.raises(UsageError, match="regular file"):
        save.write_text_atomic(fifo, "{}")
    assert fifo.is_fifo()


def test_symlink_output_writes_the_target(ext_model):
    folder = ext_model.parent
    (folder / "real.json").write_text("old")
    (folder / "link.json").symlink_to("real.json")
    save.write_text_atomic(folder / "link.json", "new")
    assert (folder / "link.json").is_symlink() and (folder / "real.json").read_text() == "new"
    (folder / "dangling.json").symlink_to("nowhere/x.json")
    with pytest.raises(UsageError, match="symbolic link"):
        save.write_text_atomic(folder / "dangling.json", "x")


def test_second_writer_of_a_new_path_fails(ext_model):
    folder = ext_model.parent
    out = folder / "race.onnx"
    save.check_output_path(out, ext_model, force=False)  # both runs check while the path is free
    out.write_bytes(b"the first run's output")  # ... the first run commits
    model = onnx.load(ext_model, load_external_data=False)
    with pytest.raises(UsageError, match="--force"):
        save.save_model(model, out, source_dir=folder)
    assert out.read_bytes() == b"the first run's output"
    assert not list(folder.glob(".race.onnx*")) and not list(folder.glob("race.onnx.*.data"))


def test_stale_temps_removed_only_if_ours_and_old(tmp_path):
    out = tmp_path / "m.onnx"
    dead = tmp_path / ".m.onnx.999999999.abcdefgh.tmp"  # no such pid
    old_style = tmp_path / ".m.onnx.data.abcd_fgh.tmp"
    foreign = tmp_path / ".m.onnx.notours.tmp"
    for p in (dead, old_style, foreign):
        p.write_bytes(b"x" * 100)
        os.utime(p, (time.time() - 3600, time.time() - 3600))
    live = tmp_path / f".m.onnx.{os.getppid()}.zzzzzzzz.tmp"  # another run, still writing
    live.write_bytes(b"x")
    os.utime(live, (time.time() - 3600, time.time() - 3600))
    fresh = tmp_path / ".m.onnx.zzzzzzzz.tmp"  # no pid, not older than this process
    fresh.write_bytes(b"x")
    os.utime(fresh, (time.time() + 3600, time.time() + 3600))
    save.write_text_atomic(out, "{}")
    assert not dead.exists() and not old_style.exists()
    assert foreign.exists() and live.exists() and fresh.exists()


def test_sigterm_during_write_leaves_no_temp(tmp_path, monkeypatch):
    out = tmp_path / "big.json"

    def slow_write(self, text):  # the signal arrives while the temporary file is being written
        Path.write_bytes(self, b"partial")
        os.kill(os.getpid(), signal.SIGTERM)
        return 0

    monkeypatch.setattr(Path, "write_text", slow_write)
    with pytest.raises(SystemExit) as e:
        save.write_text_atomic(out, "{}")
    assert e.value.code == 128 + signal.SIGTERM
    assert list(tmp_path.iterdir()) == []
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_right_after_the_model_rename_keeps_its_data(ext_model, monkeypatch, sig):
    """CI found it (SIGINT, 1 run in many): a signal between the model's rename and the flag
    saying so made the cleanup delete the data of the model just put in place."""
    folder = ext_model.parent
    out = folder / "out.onnx"
    assert ckpt("rewrite", ext_model, "-o", out, "-q")[0] == 0
    other = folder / "other"
    other.mkdir()
    save_transformer(str(other / "b.onnx"), layers=1, embed_weights=True, external_data=True, seed=7)
    real_commit = save.commit

    def commit_then_signal(tmp, path, exclusive):
        real_commit(tmp, path, exclusive)
        os.kill(os.getpid(), sig)  # arrives the instant the new model is in place
        time.sleep(0.2)  # time for another thread to take it (a race CI lost)

    monkeypatch.setattr(save, "commit", commit_then_signal)
    model = onnx.load(other / "b.onnx", load_external_data=False)
    # Another thread that takes signals (as BLAS threads do): the kernel may hand it the
    # signal, and Python still raises in the main thread. A signal mask missed that.
    done = threading.Event()
    other_thread = threading.Thread(target=done.wait, daemon=True)
    other_thread.start()
    try:
        with pytest.raises((KeyboardInterrupt, SystemExit)):
            save.save_model(model, out, source_dir=other, force=True)
    finally:
        done.set()
        other_thread.join()
    onnx.checker.check_model(str(out))
    loaded = onnx.load(out)  # the new model, with the data it names, whole
    names = {t.name for t in loaded.graph.initializer}
    assert names == {t.name for t in onnx.load(other / "b.onnx").graph.initializer}
    assert not [p for p in folder.iterdir() if p.name.endswith(".tmp")]


def test_check_report_path(ext_model, tmp_path):
    folder = ext_model.parent
    (folder / "link.onnx").symlink_to("a.onnx")
    os.link(ext_model, folder / "hard.onnx")
    for bad in (ext_model, folder / "link.onnx", folder / "hard.onnx", folder / "." / "a.onnx"):
        with pytest.raises(UsageError, match="must not overwrite"):
            save.check_report_path(bad, [ext_model, folder / "base.onnx.data"])
    with pytest.raises(UsageError):
        save.check_report_path(folder / "base.onnx.data", [ext_model, folder / "base.onnx.data"])
    save.check_report_path(folder / "report.json", [ext_model, None])


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_unwritable_folder_is_a_clean_error(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        with pytest.raises(OutputError, match="cannot write"):
            save.write_text_atomic(folder / "r.json", "{}")
    finally:
        folder.chmod(0o700)


def test_os_errors_become_ckpt_errors(tmp_path, monkeypatch):
    import errno

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(safewrite.tempfile, "mkstemp", full)
    with pytest.raises(OutputError, match="no space left"):
        save.write_text_atomic(tmp_path / "r.json", "{}")
    with pytest.raises(CkptError):
        save.write_text_atomic("/proc/x.json", "{}")


def test_dims_out_of_range_are_refused(tmp_path):
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from chain import chain_model

    m = chain_model(layers=2, batch=8, width=16)
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    onnx.save(m, tmp_path / "sym.onnx")
    code, out = ckpt("inspect", tmp_path / "sym.onnx", "--dim", "batch=" + "9" * 30)
    assert code == 2 and "out of range" in out
    code, out = ckpt("plan", tmp_path / "sym.onnx", "--dim", "batch=4", "--budget", "inf%")
    assert code == 2 and "--budget" in out


def test_rewrite_through_a_symlink(ext_model, tmp_path):
    """A link is followed for a self-contained model; with external data (which loaders look
    for beside the link) it is refused."""
    from chain import chain_model

    real_dir = tmp_path / "real"
    real_dir.mkdir()
    (real_dir / "out.onnx").write_bytes(b"old")
    link = ext_model.parent / "out.onnx"
    link.symlink_to(real_dir / "out.onnx")
    code, out = ckpt("rewrite", ext_model, "-o", link, "--force", "-q")
    assert code == 2 and "real path" in out
    assert (real_dir / "out.onnx").read_bytes() == b"old"
    plain = tmp_path / "plain.onnx"
    onnx.save(chain_model(layers=2, batch=8, width=16), plain)
    code, out = ckpt("rewrite", plain, "-o", link, "--force", "-q")
    assert code == 0, out
    assert link.is_symlink() and os.readlink(link) == str(real_dir / "out.onnx")
    onnx.checker.check_model(str(link))


def test_signals_deferred_delivers_after_the_block_as_before():
    """Inside the block a signal is only noted; after it, the handler it would have met
    runs (KeyboardInterrupt for SIGINT, nothing when ignored), and handlers are restored."""
    steps = []
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        with safewrite.signals_deferred():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            steps.append("rest of the block")
    assert steps == ["rest of the block"]
    assert signal.getsignal(signal.SIGINT) is before
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        with safewrite.signals_deferred():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_writers_into_one_folder_take_turns(tmp_path, chain_path):
    """Each writer reads which data files the model it replaces points at and removes them
    after its commit: two at once could remove the data the other just committed (seen with
    two --force rewrites to one path). While the folder is locked a rewrite waits to save."""
    import fcntl
    import subprocess

    out = tmp_path / "out" / "m.ckpt.onnx"
    out.parent.mkdir()
    fd = os.open(out.parent, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        child = subprocess.Popen([sys.executable, "-m", "ckpt_cli.cli", "rewrite", str(chain_path), "-o", str(out),
                                  "--force", "-q"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        time.sleep(8)  # a small rewrite saves within about 2 s here
        assert child.poll() is None and not out.exists()
    finally:
        os.close(fd)
    assert child.wait(timeout=120) == 0, child.stderr.read()
    assert out.exists()


def test_save_model_refuses_a_symlink_for_a_model_with_external_data(ext_model, tmp_path):
    """The write itself refuses a link for a model with external data (the CLI's output
    check refuses it earlier; a caller of save_model has no such check): the target stays,
    and a self-contained model is written through the same link to its target."""
    from chain import chain_model

    real = tmp_path / "real.onnx"
    real.write_bytes(b"old")
    link = ext_model.parent / "link.onnx"
    link.symlink_to(real)
    model = onnx.load(ext_model, load_external_data=False)
    with pytest.raises(UsageError, match=f"a symbolic link; a model with external data must be written to its real "
                                         f"path \\({real}\\)"):
        save.save_model(model, link, source_dir=ext_model.parent, force=True)
    assert real.read_bytes() == b"old" and link.is_symlink()
    assert save.save_model(chain_model(layers=2, batch=8, width=16), link, force=True) == [real]
    onnx.checker.check_model(str(link))


def test_output_check_refuses_the_input_an_existing_file_and_a_link_for_external_data(ext_model, tmp_path):
    """Before any work: never the input (even with force), an existing file only with force,
    and a symbolic link only for a model without external data."""
    with pytest.raises(UsageError, match="refusing to overwrite the input model"):
        safewrite.check_output_path(ext_model, ext_model, force=True)
    taken = tmp_path / "taken.onnx"
    taken.write_bytes(b"old")
    with pytest.raises(UsageError, match="exists; pass --force to overwrite it"):
        safewrite.check_output_path(taken, ext_model, force=False)
    safewrite.check_output_path(taken, ext_model, force=True)
    link = ext_model.parent / "link.onnx"
    link.symlink_to(taken)
    with pytest.raises(UsageError, match="a symbolic link; a model with external data must be written to its real path"):
        safewrite.check_output_path(link, ext_model, force=True)
    assert taken.read_bytes() == b"old"


def test_write_target_refuses_a_fifo_and_leaves_it_in_place(tmp_path):
    """A special file is never replaced (here a FIFO in a temporary folder: a broken check
    under ``make mutate`` must not get to replace a device of the machine)."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(UsageError, match="not a regular file"):
        safewrite.write_target(fifo)
    with pytest.raises(UsageError, match="regular file"):
        save.write_text_atomic(fifo, "{}")
    assert fifo.is_fifo()


def test_held_folder_lock_is_waited_for_with_a_bound(tmp_path, chain_path, monkeypatch):
    """Was: ``flock . ckpt rewrite ...`` waited forever."""
    import fcntl

    monkeypatch.setattr(save, "LOCK_WAIT_S", 1.0)
    fd = os.open(tmp_path, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        code, out = ckpt("rewrite", chain_path, "-o", tmp_path / "out.onnx", "-q")
    finally:
        os.close(fd)
    assert code == 2 and "held its write lock for 1 s" in out, out


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_writable_unreadable_folder_is_written(tmp_path, chain_path):
    folder = tmp_path / "drop"
    folder.mkdir(mode=0o733)
    folder.chmod(0o733)
    try:
        code, out = ckpt("rewrite", chain_path, "-o", folder / "out.onnx", "-q")
        assert code == 0, out
    finally:
        folder.chmod(0o755)
    assert (folder / "out.onnx").is_file()


def test_data_left_by_a_kill_after_the_commit_is_removed_next_time(ext_model, monkeypatch):
    """Was: a kill between the model's rename and the old data's removal left a data file
    that no later write removed."""
    folder = ext_model.parent
    out = folder / "out.onnx"
    assert ckpt("rewrite", ext_model, "-o", out, "-q")[0] == 0
    old_data = set(folder.glob("out.onnx.*.data"))
    other = folder / "other"
    other.mkdir()
    save_transformer(str(other / "b.onnx"), layers=1, embed_weights=True, external_data=True, seed=7)
    script = ("import os, sys, onnx; from pathlib import Path; from ckpt_cli.io import save\n"
              "save._remove_previous_data = lambda *a: os.kill(os.getpid(), 9)\n"
              "m = onnx.load(sys.argv[1], load_external_data=False)\n"
              "save.save_model(m, Path(sys.argv[2]), source_dir=Path(sys.argv[1]).parent, force=True)\n")
    import subprocess
    assert subprocess.run([sys.executable, "-c", script, str(other / "b.onnx"), str(out)]).returncode == -9
    assert old_data <= set(folder.glob("out.onnx.*.data"))  # left behind
    assert len(set(folder.glob("out.onnx.*.data"))) == 2
    model = onnx.load(other / "b.onnx", load_external_data=False)
    save.save_model(model, out, source_dir=other, force=True)
    read = {next(e.value for e in t.external_data if e.key == "location")
            for t in onnx.load(out, load_external_data=False).graph.initializer if t.external_data}
    assert {p.name for p in folder.glob("out.onnx.*.data")} == read
    assert not list(folder.glob(".*.remove"))
