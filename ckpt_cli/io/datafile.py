"""The external data file of a written model, at the speed of a file copy.

Its bytes (the source's external tensors, then any tensors spilled out of a too-large
model, each at a 64-byte boundary) are copied once, by the kernel where it can. The
content hash that names the file runs in a second thread beside the copy, reading the
written bytes back from the page cache, and is kept as a record on the file (an extended
attribute: digest, size, mtime): a later write of the same bytes over this output proves
them in place by reading only the source, and writes nothing. Where extended attributes
are missing (not Linux, some filesystems), an existing file is hashed instead."""

from __future__ import annotations

import hashlib
import os
import queue
import stat
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import onnx

from ..errors import UsageError
from .external import Extent, locate

CHUNK = 16 << 20
_ALIGN = 64
_RECORD = "user.ckpt.blake2b"
# Windows of an earlier data file compared with the new bytes as they stream: weights that
# differ show it in the first window, and a file that differs is then written at once
# instead of after a whole pass of hashing.
_WINDOWS = 16
_WINDOW_BYTES = 4096
_kernel_copy = hasattr(os, "copy_file_range")


@dataclass(frozen=True)
class Piece:
    """One tensor's bytes in the data file: from a source file, or (``source`` None) its own raw_data."""

    tensor: onnx.TensorProto
    offset: int
    length: int
    source: Extent | None


def layout(external: list[onnx.TensorProto], spilled: list[onnx.TensorProto],
           source_dir: Path) -> tuple[list[Piece], int]:
    """Where each tensor goes, and the file's size. External tensors are checked again: the
    source may have changed since it was loaded."""
    pieces, pos = [], 0
    for t in external:
        extent = locate(t, source_dir, source_dir)
        pos += -pos % _ALIGN
        pieces.append(Piece(t, pos, extent.length, extent))
        pos += extent.length
    for t in spilled:
        pos += -pos % _ALIGN
        length = len(t.raw_data)
        pieces.append(Piece(t, pos, length, None))
        pos += length
    return pieces, pos


def point_at(pieces: list[Piece], location: str) -> None:
    """Make each tensor read its bytes from ``location`` (spilled tensors drop their raw_data)."""
    for p in pieces:
        if p.source is None:
            p.tensor.ClearField("raw_data")
        del p.tensor.external_data[:]
        for k, v in (("location", location), ("offset", str(p.offset)), ("length", str(p.length))):
            entry = p.tensor.external_data.add()
            entry.key, entry.value = k, v
        p.tensor.data_location = onnx.TensorProto.EXTERNAL


def read_range(file: Path, offset: int, length: int) -> Iterator[bytes]:
    """``length`` bytes of ``file`` from ``offset``, a chunk at a time; fewer where the file ends.
    Every read of weights goes through here (the tests count them)."""
    with open(file, "rb") as f:
        f.seek(offset)
        while length > 0:
            chunk = f.read(min(length, CHUNK))
            if not chunk:
                return
            yield chunk
            length -= len(chunk)


def _stream(pieces: list[Piece]) -> Iterator[bytes]:
    pos = 0
    for p in pieces:
        if p.offset > pos:
            yield bytes(p.offset - pos)
        if p.source is None:
            yield p.tensor.raw_data
        else:
            got = 0
            for chunk in read_range(p.source.file, p.source.offset, p.length):
                got += len(chunk)
                yield chunk
            if got != p.length:
                raise UsageError(f"{p.source.file}: external data of '{p.tensor.name}' is truncated")
        pos = p.offset + p.length


class _Hasher:
    """blake2b fed from a second thread: hashing (under 1 GB/s) runs beside the copy instead
    of after each chunk. Fed bytes, or spans of the file being written (``readback``) to read
    back from the page cache. hashlib releases the GIL on large buffers."""

    def __init__(self, readback: int | None = None) -> None:
        self._digest = hashlib.blake2b(digest_size=16)
        self._readback = readback
        self._failed: BaseException | None = None
        self._queue: queue.Queue[bytes | tuple[int, int] | None] = queue.Queue(maxsize=2)  # bounds the lag
        self._thread = threading.Thread(target=self._run, name="ckpt-hash", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            if self._failed is not None:
                continue  # drain: the writer learns of the failure at the end
            try:
                if isinstance(item, tuple):
                    self._hash_span(*item)
                else:
                    self._digest.update(item)
            except BaseException as e:  # noqa: BLE001 - handed to the writer's thread
                self._failed = e

    def _hash_span(self, offset: int, length: int) -> None:
        assert self._readback is not None  # spans are queued only with a file to read back
        while length > 0:
            chunk = read_back(self._readback, offset, min(length, CHUNK))
            if not chunk:
                raise OSError(f"written data ended {length} bytes early")
            self._digest.update(chunk)
            offset, length = offset + len(chunk), length - len(chunk)

    def update(self, item: bytes | tuple[int, int]) -> None:
        """Hash ``item``: bytes, or an (offset, length) span already written to the file."""
        self._queue.put(item)

    def hexdigest(self) -> str:
        self.close()
        if self._failed is not None:
            raise self._failed
        return self._digest.hexdigest()

    def close(self) -> None:
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()

    def __enter__(self) -> _Hasher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_back(fd: int, offset: int, length: int) -> bytes:
    """Bytes of the file being written, to hash them (the tests count these reads)."""
    return os.pread(fd, length, offset)


def write(pieces: list[Piece], fd: int) -> str:
    """Write the data file to ``fd`` (an empty file open for reading and writing, unbuffered);
    its digest (hex), of the bytes as written. Source extents are copied by the kernel
    (copy_file_range: no copy through Python, a reflink where the filesystem shares blocks)
    and read back from the page cache for the hash; where the kernel cannot, read and written."""
    pos = 0
    with _Hasher(readback=fd) as h:
        for p in pieces:
            if p.offset > pos:
                _write_all(fd, bytes(p.offset - pos), h)
            if p.source is None:
                _write_all(fd, p.tensor.raw_data, h)
            elif copy_range(p.source.file, p.source.offset, p.length, fd, h) != p.length:
                raise UsageError(f"{p.source.file}: external data of '{p.tensor.name}' is truncated")
            pos = p.offset + p.length
        return h.hexdigest()


def _write_all(fd: int, data: bytes, h: _Hasher) -> None:
    h.update(data)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def copy_range(file: Path, offset: int, length: int, fd: int, h: _Hasher) -> int:
    """Append ``length`` bytes of ``file`` from ``offset`` to ``fd``, each span handed to the
    hasher once written; the bytes copied (fewer where the file ends)."""
    done = 0
    with open(file, "rb", buffering=0) as src:
        while done < length and _kernel_copy:
            start = os.lseek(fd, 0, os.SEEK_CUR)
            try:
                n = os.copy_file_range(src.fileno(), fd, min(length - done, CHUNK), offset + done)
            except OSError:  # not between these files (another filesystem, an old kernel)
                break
            if n == 0:  # the end of the file, or a filesystem that copies nothing: read to tell
                break
            h.update((start, n))
            done += n
        for chunk in read_range(file, offset + done, length - done):
            _write_all(fd, chunk, h)
            done += len(chunk)
    return done


def file_digest(path: Path) -> str:
    with _Hasher() as h:
        for chunk in read_range(path, 0, os.stat(path).st_size):
            h.update(chunk)
        return h.hexdigest()


def record(path: Path, digest: str, st: os.stat_result | None = None) -> None:
    """Keep ``digest`` on the finished file, with the size and mtime it describes (``st``:
    as stat gave them before the bytes were hashed; a change since voids the record). Best
    effort: no record, no harm."""
    try:
        st = st or os.stat(path)
        os.setxattr(path, _RECORD, f"{digest} {st.st_size} {st.st_mtime_ns}".encode())
    except (OSError, AttributeError):  # no xattrs here (filesystem, platform)
        pass


def recorded_digest(path: Path) -> str | None:
    """The digest recorded on ``path``, if the file is still the one it describes."""
    found = _record_of(path)
    return found[0] if found else None


def _record_of(path: Path) -> tuple[str, int] | None:
    """The recorded digest and size of ``path``, if its size and mtime are still the recorded ones."""
    try:
        st = os.lstat(path)
        digest, size, mtime = os.getxattr(path, _RECORD, follow_symlinks=False).decode().split()
    except (OSError, AttributeError, ValueError, UnicodeDecodeError):
        return None
    if not stat.S_ISREG(st.st_mode) or (str(st.st_size), str(st.st_mtime_ns)) != (size, mtime) or len(digest) != 32:
        return None
    return digest, st.st_size


def digest_of(path: Path, keep: bool = False) -> str:
    """``path``'s content digest: the record where it holds, else by reading the file, and
    with ``keep`` recording it (a data file of an older ckpt, read once, not again)."""
    found = recorded_digest(path)
    if found is None:
        st = os.stat(path)
        found = file_digest(path)
        if keep:
            record(path, found, st)
    return found


def _windows(path: Path, size: int) -> dict[int, bytes]:
    starts = sorted({size * k // _WINDOWS for k in range(_WINDOWS)})
    return {s: b"".join(read_range(path, s, min(_WINDOW_BYTES, size - s))) for s in starts}


def _agrees(windows: dict[int, bytes], pos: int, chunk: bytes) -> bool:
    end = pos + len(chunk)
    for start, data in windows.items():
        lo, hi = max(start, pos), min(start + len(data), end)
        if lo < hi and chunk[lo - pos:hi - pos] != data[lo - start:hi - start]:
            return False
    return True


def matching_file(pieces: list[Piece], size: int, candidates: set[Path]) -> tuple[Path, str] | None:
    """The candidate whose recorded digest is that of the bytes ``pieces`` make, and the
    digest: read from the source once, hashed, nothing written. The candidates are read at a
    few windows only, and the pass stops at the first window that differs. None when no
    candidate has a record for a file of ``size`` bytes or none matches."""
    records = {c: r[0] for c in sorted(candidates) if (r := _record_of(c)) and r[1] == size}
    if not records:
        return None
    windows = {c: _windows(c, size) for c in records}
    pos = 0
    with _Hasher() as h:
        for chunk in _stream(pieces):
            windows = {c: w for c, w in windows.items() if _agrees(w, pos, chunk)}
            if not windows:
                return None
            h.update(chunk)
            pos += len(chunk)
        digest = h.hexdigest()
    # the record checked again: a file changed during the pass has lost it
    return next(((c, digest) for c in windows if records[c] == digest == recorded_digest(c)), None)
