"""What the ``basalt pipeline`` jobs run inside a Spark task: one CommitLog file, read-only.

Every function here takes a :class:`FileSpec` (a plain, picklable description
of one CommitLog file) and works on that file alone, so a job is one task per
file. The reading is the store's own: :func:`basalt.store.readonly.check_at`
validates each record (magic, TOTALSIZE, CRC, PHYSICALOFFSET) and
:func:`basalt.pipeline._rows.raw_batches` turns runs of them into Arrow
batches; nothing here writes to the store root (files are mapped ``read_only``).

A record whose CRC does not match is *bad*: it is counted and its offset
reported, and the walk goes on past it (its TOTALSIZE is sound: the record
checks without the CRC). A record whose framing is broken ends the walk of
its file, counted as one bad record; the rest of the file is unreadable, as
it is to the store's recovery.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from basalt.common import _records
from basalt.common.message import (
    PROPERTY_TAGS,
    decode_properties,
    is_dispatchable,
)
from basalt.common.record import RecordInfo, RecordKind
from basalt.pipeline._rows import ARROW_SCHEMA, SCHEMA_DDL, raw_batches, rows_where
from basalt.store.config import CQ_STORE_UNIT_SIZE
from basalt.store.consume_queue import ConsumeQueue
from basalt.store.hashing import tags_code
from basalt.store.mapped_file import MappedFile
from basalt.store.readonly import check_at, open_consume_queue, open_data_files, store_layout

__all__ = [
    "ARROW_SCHEMA",
    "SCHEMA_DDL",
    "FileScan",
    "FileSpec",
    "commitlog_files",
    "export_batches",
    "queue_runs",
    "verify_file",
]

_UNIT = struct.Struct(">qiq")


class _Ignore:
    """A :class:`basalt.store.readonly.Findings` that keeps nothing (the driver
    lists the files; a misfit is simply not handed to a task)."""

    def problem(
        self, code: str, message: str, *, path: Path | None = None, offset: int | None = None
    ) -> None:
        pass

    def note(self, message: str) -> None:
        pass


@dataclass(frozen=True, slots=True)
class FileSpec:
    """One CommitLog file of a store root: its path, first physical offset and size."""

    root: str
    path: str
    start: int
    size: int


def commitlog_files(root: Path) -> list[FileSpec]:
    """The CommitLog files of ``root`` that fit the layout, in offset order.

    Raises :class:`basalt.store.readonly.StoreRootError` for a missing path or
    one that is not a store root. Files the read-only loader leaves out
    (wrong size, gap) are not listed: ``basalt store check`` names them.
    """
    layout = store_layout(root)
    files = open_data_files(layout.commitlog_dir, "commitlog", _Ignore())
    try:
        return [
            FileSpec(str(root), str(mf.path), mf.file_from_offset, mf.file_size)
            for mf in files.files
        ]
    finally:
        files.close()


@dataclass(slots=True)
class FileScan:
    """What a walk of one file found: records, bad records and where the first was."""

    records: int = 0
    bad_records: int = 0
    first_bad_offset: int | None = None
    first_bad_reason: str | None = None
    #: Where the walk stopped: one past the last readable byte.
    end_offset: int = 0
    extra: dict[str, int] = field(default_factory=dict)

    def bad(self, offset: int, reason: str) -> None:
        self.bad_records += 1
        if self.first_bad_offset is None:
            self.first_bad_offset, self.first_bad_reason = offset, reason


def _walk(mf: MappedFile, scan: FileScan) -> Iterator[tuple[int, RecordInfo]]:
    """(position, info) of every sound record of ``mf``; bad ones go to ``scan``."""
    pos = 0
    while True:
        info = check_at(mf, pos)
        if info.kind is RecordKind.CORRUPT:
            scan.bad(mf.file_from_offset + pos, info.reason)
            framing = check_at(mf, pos, check_crc=False)
            if framing.kind is not RecordKind.MESSAGE:
                break  # framing broken: nothing after it can be found
            pos += framing.size  # only the CRC failed: the next record is past it
            continue
        if info.kind is not RecordKind.MESSAGE:
            break  # the end-of-file blank, or zeroes: the end of the data
        scan.records += 1
        yield pos, info
        pos += info.size
    scan.end_offset = mf.file_from_offset + pos


def _runs(mf: MappedFile, scan: FileScan) -> Iterator[tuple[int, int]]:
    """``(start, end)`` positions of each run of sound records of ``mf``.

    The checks of :func:`_walk` (check_record's rules, CRC included) made by
    the engine's C scan (:func:`basalt.common._records.scan`, as recovery
    walks a file) a run at a time; the export turns each run into Arrow
    batches, one C call per batch.
    """
    pos = end = 0
    while True:
        limit = mf.readable_end(pos)  # a hole in a sparse file reads as the end
        end, kind, reason, _, _, count = _records.scan(
            mf.buffer, pos, limit, mf.file_from_offset, True, -1
        )
        if end > pos:
            scan.records += count
            yield pos, end
        if kind != _records.KIND_CORRUPT:
            break  # the end-of-file blank, or zeroes: the end of the data
        scan.bad(mf.file_from_offset + end, reason)
        framing = check_at(mf, end, check_crc=False)
        if framing.kind is not RecordKind.MESSAGE:
            break  # framing broken: nothing after it can be found
        pos = end + framing.size  # only the CRC failed: the next record is past it
    scan.end_offset = mf.file_from_offset + end


def _open(spec: FileSpec) -> MappedFile:
    mf = MappedFile(Path(spec.path), spec.size, read_only=True)
    mf.wrote_position = mf.flushed_position = spec.size
    return mf


def export_batches(
    spec: FileSpec,
    scan: FileScan,
    *,
    broker: str,
    topic: str | None = None,
    from_ms: int | None = None,
    to_ms: int | None = None,
    batch_rows: int = 8192,
) -> Iterator[pa.RecordBatch]:
    """The records of one file as Arrow batches of :data:`ARROW_SCHEMA`.

    Keeps records of ``topic`` (all when None) whose store time is in
    ``[from_ms, to_ms)``; counts into ``scan`` (every record, kept or not).
    """
    mf = _open(spec)
    try:
        for start, end in _runs(mf, scan):
            # _runs' scan checked every CRC: no second pass.
            batches = raw_batches(
                broker, mf.buffer, start, end, max_rows=batch_rows, check_crc=False
            )
            for batch in batches:
                kept = rows_where(batch, _export_mask(batch, topic, from_ms, to_ms))
                if kept.num_rows:
                    yield kept
    finally:
        mf.close()


def _export_mask(
    batch: pa.RecordBatch, topic: str | None, from_ms: int | None, to_ms: int | None
) -> pa.BooleanArray | None:
    """Which rows of ``batch`` the export keeps (None: every row)."""
    tests = []
    if topic is not None:
        tests.append(pc.equal(batch.column("topic"), topic))
    if from_ms is not None:
        tests.append(pc.greater_equal(batch.column("store_timestamp"), from_ms))
    if to_ms is not None:
        tests.append(pc.less(batch.column("store_timestamp"), to_ms))
    if not tests:
        return None
    mask = tests[0]
    for more in tests[1:]:
        mask = pc.and_(mask, more)
    return mask


def verify_file(spec: FileSpec) -> FileScan:
    """CRC-check one file and compare each dispatchable record with its ConsumeQueue unit.

    ``extra`` counts ``cq_units_checked``, ``cq_mismatches`` (a unit that
    does not point at this record with its size and tagsCode; the first one's
    CommitLog offset is ``first_cq_mismatch``, else -1) and ``undispatched``
    (records past their queue's written end, or with no queue at all; a
    problem only when the root has no ``abort`` file, as in ``basalt store
    check``). Units below a queue's first file are not checked (expired).
    """
    scan = FileScan(
        extra={
            "cq_units_checked": 0,
            "cq_mismatches": 0,
            "first_cq_mismatch": -1,
            "undispatched": 0,
        }
    )
    layout = store_layout(Path(spec.root))
    queues: dict[tuple[str, int], ConsumeQueue | None] = {}
    mf = _open(spec)
    try:
        for pos, info in _walk(mf, scan):
            if not is_dispatchable(info.sys_flag):
                continue
            key = (info.topic, info.queue_id)
            if key not in queues:
                queues[key] = open_consume_queue(layout, info.topic, info.queue_id, _Ignore())
            cq = queues[key]
            if cq is None or info.queue_offset >= cq.max_offset_in_queue:
                scan.extra["undispatched"] += 1
                continue
            if info.queue_offset < cq.min_offset_in_queue:
                continue
            unit = cq.get_unit(info.queue_offset)
            scan.extra["cq_units_checked"] += 1
            want = (
                mf.file_from_offset + pos,
                info.size,
                tags_code(decode_properties(info.properties).get(PROPERTY_TAGS)),
            )
            if unit is None or tuple(unit) != want:
                scan.extra["cq_mismatches"] += 1
                if scan.extra["first_cq_mismatch"] < 0:
                    scan.extra["first_cq_mismatch"] = want[0]
    finally:
        mf.close()
        for cq in queues.values():
            if cq is not None:
                cq.close()
    return scan


def queue_runs(spec: FileSpec) -> Iterator[tuple[tuple[str, int], tuple[int, bytes]]]:
    """The ConsumeQueue units the dispatcher writes for one file's records.

    Yields ``((topic, queue_id), (first_queue_offset, packed_units))`` for
    every run of consecutive queue offsets of a queue; non-dispatchable
    records (prepared, rolled back, tombstones) get no unit, as in the
    dispatcher. A bad record gets none either (the dispatcher never sees it).
    """
    runs: dict[tuple[str, int], list[tuple[int, bytearray]]] = {}
    mf = _open(spec)
    try:
        for pos, info in _walk(mf, FileScan()):
            if not is_dispatchable(info.sys_flag):
                continue
            unit = _UNIT.pack(
                mf.file_from_offset + pos,
                info.size,
                tags_code(decode_properties(info.properties).get(PROPERTY_TAGS)),
            )
            queue = runs.setdefault((info.topic, info.queue_id), [])
            last = queue[-1] if queue else None
            if (
                last is not None
                and last[0] + len(last[1]) // CQ_STORE_UNIT_SIZE == info.queue_offset
            ):
                last[1].extend(unit)
            else:
                queue.append((info.queue_offset, bytearray(unit)))
    finally:
        mf.close()
    for key, queue in runs.items():
        for first, units in queue:
            yield key, (first, bytes(units))
