"""The external data file is written in one pass, hashed beside the copy, and not written
again over an identical earlier output: reads counted through ``datafile.read_range`` (every
read of weights) and, on Linux, the process's read bytes."""

import hashlib
import os
import threading
from collections import Counter
from pathlib import Path

import onnx
import pytest
from click.testing import CliRunner

from synthetic import save_transformer
from ckpt_cli.cli import main
from ckpt_cli.errors import UsageError
from ckpt_cli.io import datafile, save


def ckpt(*args) -> tuple[int, str]:
    r = CliRunner().invoke(main, [str(a) for a in args])
    assert "Traceback" not in r.output, r.output
    return r.exit_code, r.output


@pytest.fixture
def model(tmp_path) -> Path:
    """About 1 MiB of weights in ``src/m.onnx.data``."""
    (tmp_path / "src").mkdir()
    save_transformer(str(tmp_path / "src" / "m.onnx"), layers=2, d_model=96, heads=4, embed_weights=True,
                     external_data=True)
    return tmp_path / "src" / "m.onnx"


@pytest.fixture
def reads(monkeypatch) -> Counter:
    """Bytes read of each file by the data path: through ``read_range``, copied by the kernel
    (copy_file_range), and read back from the file being written for its hash ("written")."""
    counted: Counter = Counter()
    real_read, real_back = datafile.read_range, datafile.read_back

    def counting(file, offset, length):
        for chunk in real_read(file, offset, length):
            counted[Path(file).name] += len(chunk)
            yield chunk

    def back(fd, offset, length):
        data = real_back(fd, offset, length)
        counted["written"] += len(data)
        return data

    monkeypatch.setattr(datafile, "read_range", counting)
    monkeypatch.setattr(datafile, "read_back", back)
    if hasattr(os, "copy_file_range"):
        real_copy = os.copy_file_range

        def copying(src, dst, count, *args):
            n = real_copy(src, dst, count, *args)
            counted[Path(os.readlink(f"/proc/self/fd/{src}")).name] += n
            return n

        monkeypatch.setattr(os, "copy_file_range", copying)
    return counted


def _has_xattrs(folder: Path) -> bool:
    probe = folder / "probe"
    probe.write_bytes(b"")
    try:
        os.setxattr(probe, "user.ckpt.probe", b"1")
        return True
    except (OSError, AttributeError):
        return False
    finally:
        probe.unlink()


def _data_file(out: Path) -> Path:
    (data,) = out.parent.glob(f"{out.name}.*.data")
    return data


def _extents(src: Path) -> list[tuple[int, int]]:
    """(offset, length) of the tensors that stay external (1 KiB and more), in model order."""
    m = onnx.load(src, load_external_data=False)
    out = []
    for t in m.graph.initializer:
        fields = {e.key: e.value for e in t.external_data}
        if t.data_location == onnx.TensorProto.EXTERNAL and int(fields["length"]) >= 1024:
            out.append((int(fields.get("offset", 0)), int(fields["length"])))
    return out


def _weights(src: Path) -> int:
    return sum(length for _, length in _extents(src))


def _serial_layout(src: Path) -> bytes:
    """The data file as ckpt has always laid it out: the external tensors in model order, each
    at a 64-byte boundary, zeros between."""
    data = (src.parent / (src.name + ".data")).read_bytes()
    out = bytearray()
    for start, length in _extents(src):
        out += bytes(-len(out) % 64)
        out += data[start:start + length]
    return bytes(out)


def _save(src: Path, out: Path, force: bool = True) -> list[Path]:
    m = onnx.load(src, load_external_data=False)
    return save.save_model(m, out, source_dir=src.parent, force=force)


@pytest.mark.parametrize("kernel_copy", [True, False])
def test_data_file_is_the_serial_layout_named_by_its_hash(model, tmp_path, reads, monkeypatch, kernel_copy):
    monkeypatch.setattr(datafile, "_kernel_copy", kernel_copy and datafile._kernel_copy)
    out = tmp_path / "out.onnx"
    _save(model, out)
    data = _data_file(out)
    content = data.read_bytes()
    assert content == _serial_layout(model)
    digest = hashlib.blake2b(content, digest_size=16).hexdigest()
    assert data.name == f"out.onnx.{digest[:8]}.data"
    if _has_xattrs(tmp_path):
        assert datafile.recorded_digest(data) == digest
    # the source is read once; the hash reads back at most what the kernel copied
    assert set(reads) <= {"m.onnx.data", "written"} and reads["m.onnx.data"] == _weights(model)
    assert reads["written"] <= _weights(model) and (kernel_copy or not reads["written"])
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_spilled_weights_are_laid_out_after_the_external_ones(model, tmp_path, monkeypatch):
    monkeypatch.setattr(save, "_EMBED_LIMIT", 0)
    m = onnx.load(model, load_external_data=False)
    spilled = [t.raw_data for t in m.graph.initializer if len(t.raw_data) >= 1024]
    assert spilled  # the causal mask
    out = tmp_path / "out.onnx"
    save.save_model(m, out, source_dir=model.parent, force=True)
    expected = bytearray(_serial_layout(model))
    for raw in spilled:
        expected += bytes(-len(expected) % 64) + raw
    assert _data_file(out).read_bytes() == expected
    onnx.checker.check_model(str(out))


def test_force_over_an_identical_output_reads_the_weights_once_and_writes_no_data(model, tmp_path, reads,
                                                                                  monkeypatch):
    if not _has_xattrs(tmp_path):
        pytest.skip("no user extended attributes on this filesystem")
    out = tmp_path / "out.onnx"
    assert ckpt("rewrite", model, "-o", out, "-q")[0] == 0
    data = _data_file(out)
    before = data.stat()
    weights = _weights(model)
    reads.clear()
    writes = []
    monkeypatch.setattr(datafile, "write", lambda *a: writes.append(a))
    io_before = _read_bytes()
    assert ckpt("rewrite", model, "-o", out, "--force", "-q")[0] == 0
    io_after = _read_bytes()
    assert reads["m.onnx.data"] == weights
    assert reads[data.name] <= 16 * 4096  # a few windows, to stop early when the weights differ
    assert not writes
    after = _data_file(out).stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    if io_before is not None:  # every read of the process, not only read_range's
        assert io_after - io_before < weights + 2 * out.stat().st_size + (1 << 20)
    onnx.checker.check_model(str(out))


def _read_bytes() -> int | None:
    try:
        text = Path("/proc/self/io").read_text()
    except OSError:
        return None
    return int(next(line.split()[1] for line in text.splitlines() if line.startswith("rchar:")))


def test_other_weights_of_the_same_size_stop_the_check_at_the_first_window(model, tmp_path, reads):
    out = tmp_path / "out.onnx"
    _save(model, out)
    old = _data_file(out)
    (tmp_path / "other").mkdir()
    other = tmp_path / "other" / "m.onnx"
    save_transformer(str(other), layers=2, d_model=96, heads=4, embed_weights=True, external_data=True, seed=5)
    weights = _weights(other)
    reads.clear()
    _save(other, out)
    new = _data_file(out)
    assert new != old and not old.exists()
    assert new.read_bytes() == _serial_layout(other)
    assert reads["m.onnx.data"] < 2 * weights  # the check read one tensor, not the weights


def test_a_changed_data_file_is_not_trusted(model, tmp_path):
    out = tmp_path / "out.onnx"
    _save(model, out)
    data = _data_file(out)
    content = bytearray(data.read_bytes())
    content[100] ^= 0xFF
    with open(data, "r+b") as f:  # in place, same size: the record's mtime no longer matches
        f.write(content)
    assert datafile.recorded_digest(data) is None
    code, text = ckpt("rewrite", model, "-o", out, "--force", "-q")
    assert code == 2 and "exists with other content" in text
    assert data.read_bytes() == bytes(content)


def test_without_extended_attributes_the_existing_file_is_compared(model, tmp_path, reads, monkeypatch):
    def no_xattrs(*a, **k):
        raise OSError(95, "Operation not supported")

    monkeypatch.setattr(os, "setxattr", no_xattrs)
    monkeypatch.setattr(os, "getxattr", no_xattrs)
    out = tmp_path / "out.onnx"
    _save(model, out)
    data = _data_file(out)
    before = data.stat()
    reads.clear()
    _save(model, out)
    weights = _weights(model)
    # the existing file is hashed to compare; the new copy only as it is written
    assert reads["m.onnx.data"] == weights and reads[data.name] == weights and reads["written"] <= weights
    after = _data_file(out).stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize("kernel_copy", [True, False])
def test_truncated_source_fails_cleanly_and_stops_the_hash_thread(model, tmp_path, monkeypatch, kernel_copy):
    monkeypatch.setattr(datafile, "_kernel_copy", kernel_copy and datafile._kernel_copy)
    m = onnx.load(model, load_external_data=False)
    out = tmp_path / "out.onnx"
    source = model.with_name("m.onnx.data")
    end = max(offset + length for offset, length in _extents(model))
    real = datafile.layout

    def layout_then_truncate(*args):  # the file shrinks after its extents were checked
        laid = real(*args)
        os.truncate(source, end - 8)
        return laid

    monkeypatch.setattr(datafile, "layout", layout_then_truncate)
    with pytest.raises(UsageError, match="truncated"):
        save.save_model(m, out, source_dir=model.parent, force=True)
    assert not list(tmp_path.glob("out.onnx*"))
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert not [t for t in threading.enumerate() if t.name == "ckpt-hash"]


def test_a_linked_data_file_is_not_trusted(model, tmp_path):
    out = tmp_path / "out.onnx"
    _save(model, out)
    data = _data_file(out)
    copy = tmp_path / "elsewhere.data"
    os.replace(data, copy)  # keeps its record
    data.symlink_to(copy)
    code, text = ckpt("rewrite", model, "-o", out, "--force", "-q")
    assert code == 2 and "not a regular file" in text
    assert data.is_symlink() and copy.exists()


def test_a_failed_read_back_fails_the_write_cleanly(model, tmp_path, monkeypatch):
    if not datafile._kernel_copy:
        pytest.skip("no copy_file_range here: nothing is read back")

    def failing(fd, offset, length):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(datafile, "read_back", failing)
    code, text = ckpt("rewrite", model, "-o", tmp_path / "out.onnx", "-q")
    assert code != 0 and "Input/output error" in text
    assert not list(tmp_path.glob("out.onnx*"))
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_data_of_an_older_ckpt_is_read_once_then_recorded(model, tmp_path, reads):
    if not _has_xattrs(tmp_path):
        pytest.skip("no user extended attributes on this filesystem")
    out = tmp_path / "out.onnx"
    _save(model, out)
    data = _data_file(out)
    os.removexattr(data, "user.ckpt.blake2b")  # as an older ckpt wrote it
    weights = _weights(model)
    reads.clear()
    _save(model, out)
    assert reads[data.name] == weights and datafile.recorded_digest(data) is not None
    reads.clear()
    _save(model, out)
    assert reads["m.onnx.data"] == weights and reads[data.name] <= 16 * 4096 and not reads["written"]


def test_the_input_data_gets_no_record(model, tmp_path):
    if not _has_xattrs(tmp_path):
        pytest.skip("no user extended attributes on this filesystem")
    out = tmp_path / "out.onnx"
    _save(model, out)
    data = _data_file(out)
    os.removexattr(data, "user.ckpt.blake2b")
    # a copy of the output as the input: its data is the file the new output is named after
    (tmp_path / "in.onnx").write_bytes(out.read_bytes())
    before = data.stat()
    assert ckpt("rewrite", tmp_path / "in.onnx", "-o", out, "--force", "-q")[0] == 0
    assert datafile.recorded_digest(data) is None and data.stat().st_ctime_ns == before.st_ctime_ns
    assert _data_file(out) == data


def test_force_reads_the_previous_output_only_where_a_data_file_of_it_exists(model, tmp_path, monkeypatch):
    """The model at the output is parsed to find the data files it reads (to reuse or remove
    them): with no file of ckpt's naming beside it, there is nothing to find."""
    parsed: list[Path] = []
    real = save.read_model

    def counting(path, *args, **kwargs):
        parsed.append(Path(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(save, "read_model", counting)
    plain = tmp_path / "plain"
    plain.mkdir()
    save_transformer(str(plain / "p.onnx"), layers=1)
    for _ in range(2):
        save.save_model(onnx.load(plain / "p.onnx"), plain / "out.onnx", force=True)
    assert parsed == [] and not list(plain.glob("out.onnx.*.data"))
    out = tmp_path / "out.onnx"
    for _ in range(2):
        _save(model, out)
    assert parsed == [out]  # the second write: the first output's data is there
