"""``basalt store check``'s look at a root's small files, each by its loader's own rule.

:func:`check_side_files` reads, read-only and with ``pread`` (never a mapping),
what a start reads besides the CommitLog and the ConsumeQueues, and judges
each with the function the loader uses, so check and a start never disagree:

==========================  ===========================================  =====================
file                        rule (shared with the loader)                what a start does
==========================  ===========================================  =====================
``checkpoint``              :func:`basalt.store.checkpoint.size_problem`  resets it to zeros
``config/consumerOffset``   :func:`~basalt.store.consumer_offset_file`    the ``.bak``, or a
``.json``                   ``.read_copy``                                salvage of both
``config/consumeQueue``     :func:`basalt.store.queue_manifest`           ignores it; a queue
``Manifest.json``           ``.read_manifest``; a queue ending before     ending before it is
                            the max offset listed                         rebuilt
``pop/``, ``pop/journal``   :func:`basalt.store.pop_journal`              sets it aside /
                            ``.not_a_journal``, ``decode_records``        cuts the tail
``index/<name>``            :func:`basalt.store.index_file`               sets it (and the
                            ``.check_index_bytes``                        later ones) aside
``epochFileCheckpoint``     :func:`basalt.store.epoch_file`               refuses to start
                            ``.check_epoch_file``
``truncate``                :func:`basalt.store.truncation.read_marker`   finishes the cut
                            (present: a cut under way)                    (damaged: refuses)
``config/timercheck``,      :func:`basalt.store.timer.check`              rebuilds the timer
``timerlog/``,              ``.check_timer_files``                        from the timer
``timerwheel``                                                            topic's queue
==========================  ===========================================  =====================

A pop journal tail that does not decode is what a crash mid-append leaves:
information while ``abort`` is present, a problem when it is absent (a clean
stop fsyncs whole records), as with undispatched records. IndexFiles carry no
geometry: it is inferred from their size with RocketMQ's ratio of 4 entries a
slot (``maxIndexNum = 4 * maxHashSlotNum``, the default and every test's);
files of another size are noted, not judged.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Mapping
from pathlib import Path

from basalt.store.checkpoint import size_problem
from basalt.store.consumer_offset_file import read_copy
from basalt.store.consumer_offsets import consumer_offset_path
from basalt.store.epoch_file import EPOCH_FILE_NAME, check_epoch_file
from basalt.store.errors import CorruptFileError
from basalt.store.index_file import (
    ENTRY,
    HEADER,
    SLOT,
    IndexHeader,
    check_index_bytes,
    index_file_size,
    is_index_file_name,
    loaded_header,
)
from basalt.store.pop_journal import JOURNAL_NAME, decode_records, not_a_journal
from basalt.store.queue_manifest import ManifestStatus, manifest_path, read_manifest
from basalt.store.readonly import Findings
from basalt.store.timer.check import check_timer_files
from basalt.store.truncation import TRUNCATE_MARKER_NAME, read_marker

__all__ = ["check_side_files"]

#: RocketMQ's maxIndexNum / maxHashSlotNum, by which an IndexFile's size gives its geometry.
INDEX_ENTRIES_PER_SLOT = 4


def check_side_files(
    root: Path,
    findings: Findings,
    *,
    abort: bool,
    commitlog_max_offset: int,
    queue_ends: Mapping[tuple[str, int], int],
    index_geometry: tuple[int, int] | None = None,
) -> None:
    """Check the checkpoint, consumer offsets, queue manifest, pop journal and
    IndexFiles of ``root``, reporting to ``findings``. ``queue_ends``: each
    ConsumeQueue's written end (one past its last unit) as check found it;
    ``commitlog_max_offset`` where the CommitLog's data ends; ``index_geometry``
    the store's (max hash slots, max entries) when known, else inferred."""
    _check_checkpoint(root / "checkpoint", findings)
    _check_offsets(consumer_offset_path(root), findings)
    _check_manifest(manifest_path(root), queue_ends, findings)
    _check_pop(root / "pop", findings, abort=abort)
    _check_index(root / "index", commitlog_max_offset, findings, index_geometry)
    _check_replication_files(root, findings)
    check_timer_files(
        root, lambda code, message, path: findings.problem(code, message, path=path), findings.note
    )


def _check_replication_files(root: Path, findings: Findings) -> None:
    """The epoch file and a leftover truncate marker (store.epoch_file, store.truncation)."""
    epochs = root / EPOCH_FILE_NAME
    problem = check_epoch_file(epochs)
    if problem is not None:
        findings.problem(
            "epoch-file", f"{EPOCH_FILE_NAME}: {problem} (a start refuses it)", path=epochs
        )
    marker = root / TRUNCATE_MARKER_NAME
    try:
        cut = read_marker(marker)
    except CorruptFileError as e:
        findings.problem("truncate-marker", f"{e.reason} (a start refuses it)", path=marker)
        return
    if cut is not None:
        findings.problem(
            "truncate-marker",
            f"a truncation of the commitlog at {cut} did not finish (a start finishes it)",
            path=marker,
        )


def _read(path: Path) -> bytes:
    """The whole file by ``pread`` (a hole reads as zeros: no fault, no allocation)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        chunks = []
        pos = 0
        while pos < size:
            chunk = os.pread(fd, min(size - pos, 1 << 24), pos)
            if not chunk:
                break  # truncated while read: what was read is judged
            chunks.append(chunk)
            pos += len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _check_checkpoint(path: Path, findings: Findings) -> None:
    if not os.path.lexists(path):
        findings.note("checkpoint: none (a start creates it)")
        return
    if not path.is_file():
        findings.problem("checkpoint", f"checkpoint {path} is not a file", path=path)
        return
    problem = size_problem(path.stat().st_size)
    if problem is not None:
        findings.problem(
            "checkpoint",
            f"checkpoint: {problem} (a start resets it to zero timestamps: recovery after "
            f"a crash then scans from the first CommitLog file)",
            path=path,
        )


def _check_offsets(path: Path, findings: Findings) -> None:
    bak = path.with_name(path.name + ".bak")
    main = read_copy(path)
    if main.tables is not None or (main.data is None and main.problem is None and not bak.exists()):
        return  # decodes, or missing with no backup: an empty table, as a start loads it
    why = main.problem or "missing, but its .bak exists"
    backup = read_copy(bak)
    then = (
        "a start loads its .bak"
        if backup.tables is not None
        else f"its .bak is unusable too ({backup.problem or 'missing'}): a start salvages "
        f"what entries it can read of both"
    )
    findings.problem("consumer-offsets", f"{path.name}: {why}; {then}", path=path)


def _check_manifest(
    path: Path, queue_ends: Mapping[tuple[str, int], int], findings: Findings
) -> None:
    found = read_manifest(path)
    if found.status is ManifestStatus.MISSING:
        findings.note("queue manifest: none (lost queue folders cannot be detected)")
        return
    if found.status is ManifestStatus.DAMAGED:
        findings.problem(
            "queue-manifest",
            f"{path.name}: {found.problem} (a start ignores it and writes a new one)",
            path=path,
        )
        return
    for (topic, queue_id), listed in sorted(found.maxima.items()):
        end = queue_ends.get((topic, queue_id))
        if end is None or end < listed:
            has = "has no ConsumeQueue" if end is None else f"ends at queue offset {end}"
            findings.problem(
                "cq-lost",
                f"consumequeue {topic}/{queue_id} {has} but the queue manifest lists max "
                f"offset {listed} (a start rebuilds it from the CommitLog and keeps its offsets)",
                path=path,
                offset=end,
            )


def _check_pop(folder: Path, findings: Findings, *, abort: bool) -> None:
    misfits = not_a_journal(folder)
    for path, _, what in misfits:
        findings.problem(
            "pop-journal",
            f"pop journal {path} is not a {what} (a start sets it aside: the pop state starts "
            f"empty and messages in flight are delivered again)",
            path=path,
        )
    journal = folder / JOURNAL_NAME
    if misfits or not journal.is_file():
        return
    data = _read(journal)
    end = records = 0
    for past, _ in decode_records(data):
        end = past
        records += 1
    if end == len(data):
        return
    message = (
        f"pop journal: {len(data) - end} bytes after its last whole record (at {end}, after "
        f"{records} records) do not decode (a start cuts them)"
    )
    if abort:
        findings.note(message + ": a write the crash tore, or one under way")
    else:
        findings.problem("pop-journal", message, path=journal, offset=end)


def _index_geometry(size: int) -> tuple[int, int] | None:
    """(hash slots, entries) of an IndexFile of ``size`` bytes, with 4 entries a slot."""
    per_slot = SLOT.size + INDEX_ENTRIES_PER_SLOT * ENTRY.size
    slots, rest = divmod(size - HEADER.size, per_slot)
    return (slots, slots * INDEX_ENTRIES_PER_SLOT) if slots > 0 and not rest else None


def _check_index(
    directory: Path,
    commitlog_max_offset: int,
    findings: Findings,
    geometry: tuple[int, int] | None,
) -> None:
    if not directory.is_dir():
        return
    paths = sorted(p for p in directory.iterdir() if is_index_file_name(p.name) and p.is_file())
    if not paths:
        return
    sizes = {p: p.stat().st_size for p in paths}
    if geometry is not None:
        file_size = index_file_size(*geometry)
    else:
        file_size = Counter(sizes.values()).most_common(1)[0][0]
        geometry = _index_geometry(file_size)
    if geometry is None:
        findings.note(
            f"index: files of {file_size} bytes, not of {INDEX_ENTRIES_PER_SLOT} entries a "
            f"hash slot: not checked"
        )
        return
    slots, entries = geometry
    prev: tuple[str, IndexHeader] | None = None
    for path in paths:
        # As a start does: a file failing its check, and every file after it, is set aside.
        then = "a start sets it and the files after it aside and indexes again"
        if sizes[path] != file_size:
            why = f"size {sizes[path]} but index files are {file_size} bytes"
        else:
            data = _read(path)
            if len(data) != file_size:
                why = f"it ended at byte {len(data)} while read"
            else:
                why = check_index_bytes(data, slots, entries, commitlog_max_offset, prev) or ""
                prev = (path.name, loaded_header(data))
        if why:
            findings.problem("index", f"index file {path.name}: {why} ({then})", path=path)
            return
