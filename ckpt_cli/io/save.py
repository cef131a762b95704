"""Writing graphs and reports: atomically, with external data streamed, ORT-loadable IR.

Nothing is ever written over the input or its external data, and no interruption leaves
a partial file or a model paired with another model's data:
- everything goes to a hidden temporary file in the target folder first; temporary files
  of killed runs are removed by the next write there, and SIGTERM during a write removes
  them at once (SIGKILL cannot be caught);
- external data goes to ``<output>.<hash8>.data``, named by its content, so the new data
  never replaces the data the previous output reads; the model is renamed into place last,
  then the previous output's data file (ckpt's naming only) is removed. Where the previous
  output's data already holds the same bytes (its recorded digest, ``datafile.py``), it is
  kept and no data is written;
- a new output is created exclusively (a hard link, which fails if the name exists), so of
  two runs writing the same new path without ``--force`` the second fails;
- symbolic links are followed (the target is replaced, the link kept) and only regular files
  are written: a device, FIFO or socket as an output is refused.
"""

from __future__ import annotations

import fcntl
import os
import re
import sys
import time
from contextlib import contextmanager
from itertools import chain
from pathlib import Path
from typing import Iterator

import onnx

from ..errors import OutputError, UsageError
from ..markers import SOURCE_PRODUCER_META
from ..ort import output_ir_version
from . import datafile
from .external import external_tensors, function_tensors, is_external, locate, other_tensors
from ..graph import Graph, Node, embedded_bytes, expected_bytes, gc_paused
from .safewrite import (check_output_path, check_report_path, commit, exit_on_sigterm, must_create, os_errors,
                        remove_stale_temps, signals_deferred, temp_beside, write_target,
                        write_text_atomic)
from .serialize import read_model, write_model
from ..version import __version__

__all__ = ["build_model", "save_model", "output_ir_version", "check_output_path", "check_report_path",
           "remove_stale_temps", "write_target", "write_text_atomic"]

_EMBED_LIMIT = 1_800_000_000  # beyond this, large tensors go to external data
_EXTERNAL_MIN_BYTES = 1024


@gc_paused
def build_model(graph: Graph, nodes: list[onnx.NodeProto], metadata: dict[str, str] | None = None
                ) -> onnx.ModelProto:
    """A new ModelProto with ``nodes`` in this order; unused initializers and value_info dropped."""
    src = graph.model
    if len(nodes) == len(graph.nodes) and all(p is n.proto for p, n in zip(nodes, graph.nodes)):
        indexed = graph.nodes  # the graph's own nodes: their names are known without reading protos
    else:
        indexed = [Node.from_proto(k, p) for k, p in enumerate(nodes)]
    # reads, not inputs: an initializer only a subgraph reads is used too
    used = set(chain.from_iterable(n.reads for n in indexed)) | set(graph.outputs)
    produced = set(chain.from_iterable(n.outputs for n in indexed))
    m = onnx.ModelProto(ir_version=output_ir_version(src), producer_name="ckpt", producer_version=__version__,
                        domain=src.domain, model_version=src.model_version, doc_string=src.doc_string)
    # Filled in place: ModelProto(graph=g) serializes and parses g, weights and all.
    g = m.graph
    g.name, g.doc_string = src.graph.name, src.graph.doc_string
    g.node.extend(nodes)
    g.input.extend(v for v in src.graph.input if v.name in used or v.name not in graph.initializers)
    g.output.extend(src.graph.output)
    g.initializer.extend(t for t in src.graph.initializer if t.name in used)
    g.sparse_initializer.extend(src.graph.sparse_initializer)
    g.value_info.extend(v for v in src.graph.value_info if v.name in produced)
    m.opset_import.extend(src.opset_import)
    metadata = dict(metadata or {})
    if src.producer_name and src.producer_name != "ckpt":  # a rewrite of a rewrite keeps the first one's
        metadata[SOURCE_PRODUCER_META] = f"{src.producer_name} {src.producer_version}".strip()
    m.metadata_props.extend(p for p in src.metadata_props if p.key not in metadata)
    for key, value in sorted(metadata.items()):
        entry = m.metadata_props.add()
        entry.key, entry.value = key, value
    m.functions.extend(src.functions)
    return m


def save_model(model: onnx.ModelProto, path: str | Path, source_dir: Path | None = None,
               force: bool | None = None) -> list[Path]:
    """Write ``model`` atomically. Tensors stored externally in the source (relative to
    ``source_dir``) are streamed into ``<path>.<hash8>.data`` beside the output. ``force``
    False creates ``path`` exclusively; None takes what check_output_path was told.
    Returns the files written, the model first. A symbolic link as ``path`` has its target
    replaced, unless the model has external data: loaders look for it beside the path they
    were given, so no place serves both the link and its target."""
    if Path(path).is_symlink() and external_tensors(model):
        raise UsageError(f"{path}: a symbolic link; a model with external data must be written to its real "
                         f"path ({os.path.realpath(path)})")
    path = write_target(path)
    source_dir = Path(source_dir or ".")
    exclusive = must_create(path) if force is None else not force
    with os_errors(path), _folder_locked(path.parent):
        remove_stale_temps(path)
        _finish_removals(path)
        previous = _data_files_read_by(path)
        with exit_on_sigterm():
            journal = _note_removals(path, previous)
            try:
                return _write_pair(model, path, source_dir, exclusive, previous)
            finally:  # only a SIGKILL leaves the note
                journal.unlink(missing_ok=True)


def _journal_pattern(name: str) -> re.Pattern[str]:
    return re.compile(rf"^\.{re.escape(name)}\.\d+\.remove$")


def _note_removals(path: Path, previous: set[Path]) -> Path:
    """Name the data files this write removes after its commit: a write killed in between
    leaves the note, and the next write to ``path`` finishes the removal."""
    journal = path.with_name(f".{path.name}.{os.getpid()}.remove")
    journal.write_text("".join(f"{p.name}\n" for p in sorted(previous)))
    return journal


def _finish_removals(path: Path) -> None:
    """Data files an interrupted write meant to remove that the model at ``path`` no longer
    reads (under the folder lock, any note left is of a write that ended)."""
    from .load import loaded_data_files

    pattern, data = _journal_pattern(path.name), data_file_pattern(path.name)
    for journal in path.parent.glob(f".{path.name}.*.remove"):
        if not pattern.match(journal.name):
            continue
        keep = _data_files_read_by(path) | loaded_data_files()
        for name in journal.read_text().split():
            target = path.parent / name
            if data.match(name) and target.resolve() not in keep and target not in keep:
                target.unlink(missing_ok=True)
        journal.unlink(missing_ok=True)


@contextmanager
def _folder_locked(folder: Path) -> Iterator[None]:
    """Writers of models into one folder, one at a time: each reads which data files the
    model it replaces points at and removes them after its commit, so two at once could
    remove the data the other's committed model reads. A lock on the folder itself leaves
    no file behind (where the filesystem has no locks, writers run unlocked)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except PermissionError:  # a writable folder we may not list (mode 0733): writes work, unlocked
        yield
        return
    try:
        _lock(fd, folder)
        yield
    finally:
        os.close(fd)  # closing releases the lock


# How long a writer waits for another to leave the output folder before giving up.
LOCK_WAIT_S = 120.0


def _lock(fd: int, folder: Path) -> None:
    deadline, said = time.monotonic() + LOCK_WAIT_S, False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError as e:
            if time.monotonic() >= deadline:
                raise OutputError(f"{folder}: another process has held its write lock for {LOCK_WAIT_S:g} s; "
                                  "writing there later or elsewhere") from e
            if not said:
                print(f"ckpt: waiting for another writer in {folder}", file=sys.stderr)
                said = True
            time.sleep(0.1)
        except OSError:  # no locks on this filesystem
            return


def _write_pair(model: onnx.ModelProto, path: Path, source_dir: Path, exclusive: bool,
                previous: set[Path]) -> list[Path]:
    """Write data, then model; remove ``previous`` data once the model is in place. Each
    rename and the flag recording it happen under held signals: a SIGINT landing between
    the model's rename and its flag would make the cleanup delete the data the model just
    put in place reads."""
    initializers = list(model.graph.initializer)
    external = []
    # Small initializers are embedded, as onnx.save's size_threshold does: ORT's optimizer
    # folds some (an If's condition) resolving their file against the cwd, and fails.
    for t in filter(is_external, initializers):
        need = expected_bytes(t)
        if need is None or need >= _EXTERNAL_MIN_BYTES:
            external.append(t)
        else:
            _embed(t, source_dir)
    for t in filter(is_external, chain(other_tensors(model.graph), function_tensors(model))):
        _embed(t, source_dir)  # attributes (Constant values), local functions' too: ORT reads them from the cwd
    spilled = []
    if sum(map(embedded_bytes, initializers)) > _EMBED_LIMIT:
        spilled = [t for t in initializers if embedded_bytes(t) >= _EXTERNAL_MIN_BYTES]
    written: list[Path] = []
    created = committed = False
    data_path: Path | None = None
    tmp_data: Path | None = None
    tmp_model: Path | None = None
    try:
        if external or spilled:
            pieces, size = datafile.layout(external, spilled, source_dir)
            same = datafile.matching_file(pieces, size, previous)
            if same is not None and same[0] == _data_name(path, same[1]):
                data_path = same[0]  # the previous output's data holds these bytes: nothing to write
            else:
                tmp_data = temp_beside(path.with_name(path.name + ".data"))
                with open(tmp_data, "r+b", buffering=0) as f:
                    digest = datafile.write(pieces, f.fileno())
                    os.fsync(f.fileno())
                datafile.record(tmp_data, digest)
                data_path = _data_name(path, digest)
                with signals_deferred():
                    created = _place_data(tmp_data, data_path, digest,
                                          {p.source.file for p in pieces if p.source is not None})
            datafile.point_at(pieces, data_path.name)
            written.append(data_path)
        tmp_model = temp_beside(path)
        with open(tmp_model, "wb") as f:
            write_model(model, f.write)
            f.flush()
            os.fsync(f.fileno())
        with signals_deferred():
            commit(tmp_model, path, exclusive)  # last: the model names data that is already in place
            committed = True
            written.insert(0, path)
            _remove_previous_data(previous, written)
    except BaseException:
        if created and not committed and data_path is not None:
            data_path.unlink(missing_ok=True)  # data of a model never committed
        raise
    finally:
        if tmp_model is not None:
            tmp_model.unlink(missing_ok=True)
        if tmp_data is not None:
            tmp_data.unlink(missing_ok=True)
    return written


def _data_name(path: Path, digest: str) -> Path:
    return path.with_name(f"{path.name}.{digest[:8]}.data")


def _place_data(tmp: Path, data_path: Path, digest: str, sources: set[Path]) -> bool:
    """Move finished data (content ``digest``) to its content-named place; False when a file
    of that name already holds the same bytes (the name is their hash). A stranger's file
    there is refused. ``sources``: the files the data was copied from."""
    if data_path.is_symlink() or (data_path.exists() and not data_path.is_file()):
        raise UsageError(f"{data_path}: exists and is not a regular file; remove it")
    if data_path.exists():
        from .load import loaded_data_files

        # the input's data is never modified, not even by a record on it
        keep = data_path.resolve() not in loaded_data_files() | sources
        if datafile.digest_of(data_path, keep=keep) == digest:
            return False
        raise UsageError(f"{data_path}: exists with other content; remove it or choose another -o")
    os.replace(tmp, data_path)
    return True


def data_file_pattern(name: str) -> re.Pattern[str]:
    """The names of the data files ckpt writes for the model ``name`` (``<name>.<hash8>.data``)."""
    return re.compile(rf"^{re.escape(name)}\.[0-9a-f]{{8}}\.data$")


def _data_files_read_by(path: Path) -> set[Path]:
    """Data files in ckpt's naming that the model now at ``path`` (the previous output) reads."""
    if not path.is_file():
        return set()
    pattern = data_file_pattern(path.name)
    # A data file that is not there is neither reused nor removed: with none of ckpt's
    # naming beside it, the previous output (a whole model to parse) is not read.
    if not any(pattern.match(name) for name in os.listdir(path.parent)):
        return set()
    try:
        model = read_model(path, embedded_weights=False)
    except Exception:  # noqa: BLE001 - not a model: it reads no data
        return set()
    files = set()
    for t in external_tensors(model):
        location = next((e.value for e in t.external_data if e.key == "location"), "")
        if pattern.match(location):
            files.add(path.parent / location)
    return files


def _remove_previous_data(previous: set[Path], written: list[Path]) -> None:
    """Remove the previous output's data once the new model is in place; never a file that
    the new output or a model loaded by this process (the input) reads."""
    from .load import loaded_data_files

    protected = {p.resolve() for p in written} | loaded_data_files()
    for data in previous:
        if data.resolve() not in protected:
            data.unlink(missing_ok=True)


def _embed(t: onnx.TensorProto, source_dir: Path) -> None:
    extent = locate(t, source_dir, source_dir)
    with open(extent.file, "rb") as f:
        f.seek(extent.offset)
        data = f.read(extent.length)
    if len(data) != extent.length:
        raise UsageError(f"{extent.file}: external data of '{t.name}' is truncated")
    del t.external_data[:]
    t.data_location = onnx.TensorProto.DEFAULT
    t.raw_data = data
