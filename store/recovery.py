"""Recovery on load: make the CommitLog, the ConsumeQueues and the checkpoint agree.

RocketMQ's ``recoverNormally`` / ``recoverAbnormally``:

* **normal** (no ``abort`` file: the last shutdown was clean) — scan the
  CommitLog from the third-last file;
* **abnormal** (``abort`` left by a crash) — scan from the last file whose
  first record is older than the checkpoint minimum (``min(physic, logics) −
  3 s``), from the first file if none is, and re-dispatch from there.

A record is valid when its magic code, sizes, CRC (with
``check_crc_on_recover``: the whole-record CRC32 property where the record
has one, else BODYCRC) and PHYSICALOFFSET (its own position) agree. Where
RocketMQ stops at the first invalid record and truncates everything after
it, Basalt steps over the damage to the next valid record
(:mod:`basalt.store.resync`): each damaged span is quarantined, replaced by a
tombstone and reported; the lost records' ConsumeQueue units become blank
units, so their queue offsets stay taken; the log ends at its last valid
record (with a tombstone there when records were lost at the end), and
whatever the ConsumeQueues lack is re-dispatched. No CommitLog file at all
while queues index records (or the queue manifest lists offsets) is damage
too, not a new store: every record is lost, but every queue keeps its max
offset (blank units) and the CommitLog starts again at offset 0 with a
tombstone. Only a root with no CommitLog and nothing indexed is a new store
(its empty queues are dropped).

Beyond RocketMQ, ConsumeQueues are derived data, rebuilt rather than trusted
(normal and abnormal recovery alike). A queue is *damaged* when a file of it
had to be repaired on load (short, or after a gap: :class:`MappedFileQueue`'s
repair mode), when bytes lay past its written end, when it has no file left,
when units pointed past the CommitLog's valid end, or when
:meth:`ConsumeQueue.validate` finds a unit that is not its own record (every
record carries its topic, QUEUEID and QUEUEOFFSET: the CommitLog is the
truth). A damaged queue is cut at its first bad unit and re-dispatched from
the CommitLog offset that follows its last good one: the reput offset goes
back to the smallest such offset over all damaged queues, and the units other
queues already hold are skipped (:meth:`ConsumeQueue.put_units` is idempotent
by physical offset and queue position), so every queue ends at the CommitLog's
truth and its next queue offset is never one already issued. A queue that
ends exactly at a file's end is re-dispatched from there too (its next file
may have been deleted; re-dispatch from a queue's own end rebuilds nothing
when it is whole). The queue manifest (:mod:`basalt.store.queue_manifest`,
each queue's max offset at the last clean stop or periodic write) shows what
the files alone cannot: a queue whose directory is gone (it would look like a
queue never written) is rebuilt by re-dispatching the whole CommitLog, and a
queue whose records the CommitLog no longer holds keeps its offsets up to the
listed max (:mod:`basalt.store.queue_repair`, where the queue side of
recovery lives).

Cost: validation checks every unit pointing into the CommitLog's last
:data:`~basalt.store.queue_repair.VALIDATE_FULL_BYTES` (64 MiB: where writes,
crashes and torn pages are; RocketMQ checks only the tail) and samples the
units further back (see :meth:`ConsumeQueue.validate`). A unit costs about
1 µs, so the full part is bounded by the number of records in 64 MiB
(~65,000 at ~1 KiB a record, ~0.07 s) whatever the store's size, on top of
the CommitLog scan; re-dispatch runs only from where damage was found. A
1 GiB window cost ~1 s a start and took abnormal recovery of a 1 GiB log
from 0.66 to 1.70 s (the target is 1.5 s/GiB), so the window is the tail, as
RocketMQ's.
"""

from __future__ import annotations

import logging
import struct
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from basalt.common import _records
from basalt.common.record import BLANK_MAGIC_CODE, MIN_RECORD_SIZE, RecordKind, check_record
from basalt.store.checkpoint import StoreCheckpoint
from basalt.store.commitlog import BLANK, CommitLog
from basalt.store.consume_queue import ConsumeQueue
from basalt.store.consume_queue_table import ConsumeQueueTable
from basalt.store.consumer_offsets import OffsetLoadResult
from basalt.store.dispatcher import ReputMessageService
from basalt.store.errors import CorruptRecordError
from basalt.store.mapped_file import MappedFile
from basalt.store.mapped_file_queue import TORN_WRITE_WINDOW_BYTES
from basalt.store.queue_manifest import ManifestLoad
from basalt.store.queue_repair import (
    KeptOffsets,
    QueueRebuild,
    check_against_manifest,
    keep_known_offsets,
    keep_lost_slots,
    rebuilt_queues,
    repair_consume_queues,
)
from basalt.store.replica_log import advance_queue_offsets
from basalt.store.resync import (
    DamagedSpan,
    data_length,
    quarantine,
    read_header,
    resync,
    tombstone,
)

log = logging.getLogger(__name__)

#: A damaged stretch running to its file's end gets a tombstone this long (then the
#: end-of-file blank), not one filling the whole stretch: the file stays sparse.
TAIL_TOMBSTONE_BYTES = 4096
_END_OF_TIME = 1 << 62
_GONE_PAST_THE_END = (
    "records the ConsumeQueues index are past the CommitLog's end (a file cut short or deleted)"
)
_INT = struct.Struct(">i")


@dataclass(frozen=True, slots=True)
class RecoveryReport:
    """What recovery found and did."""

    abnormal: bool
    commitlog_files: int
    files_scanned: int
    scan_start_offset: int
    #: The CommitLog's end after recovery: one past the last valid record.
    last_valid_offset: int
    #: Why the scan stopped: "end of data" or the first corruption found.
    stop_reason: str
    #: Dirty bytes cut from the CommitLog tail (up to the end of what was written).
    bytes_truncated: int
    consume_queue_entries_dropped: int
    consume_queue_entries_rebuilt: int
    consume_queues_destroyed: int
    duration_ms: float
    #: Where re-dispatch started: records from here on were (re)built.
    redispatch_from_offset: int = 0
    #: The damaged ConsumeQueues, rebuilt from the CommitLog.
    rebuilt_queues: tuple[QueueRebuild, ...] = ()
    #: The CommitLog stretches that held no readable record, set aside.
    damaged_spans: tuple[DamagedSpan, ...] = ()
    #: How consumerOffset.json loaded (its ``.bak`` used, entries salvaged or lost).
    consumer_offsets: OffsetLoadResult | None = None
    #: What the queue manifest was (:meth:`ManifestLoad.describe`); "" without one.
    queue_manifest: str = ""
    #: Queues the manifest lists whose directory was gone (rebuilt, in rebuilt_queues).
    queue_dirs_missing: int = 0
    #: Queues whose offsets the manifest vouched for but the CommitLog no longer
    #: holds: kept taken, so no offset is issued twice.
    kept_offsets: tuple[KeptOffsets, ...] = ()
    #: The CommitLog had no file while queues indexed records: it starts again at 0.
    commitlog_missing: bool = False

    def as_dict(self) -> dict[str, object]:
        return asdict(self)

    def summary(self) -> str:
        kind = "abnormal" if self.abnormal else "normal"
        missing = "commitlog MISSING, " if self.commitlog_missing else ""
        return (
            f"{kind} recovery: {missing}scanned {self.files_scanned}/{self.commitlog_files} "
            f"commitlog files from {self.scan_start_offset}, valid to {self.last_valid_offset} "
            f"({self.stop_reason}), truncated {self.bytes_truncated} bytes, consume queue "
            f"entries dropped {self.consume_queue_entries_dropped} rebuilt "
            f"{self.consume_queue_entries_rebuilt}, queues destroyed "
            f"{self.consume_queues_destroyed}, damaged queues rebuilt "
            f"{len(self.rebuilt_queues)} (directories missing {self.queue_dirs_missing}), "
            f"queues keeping offsets past the commitlog {len(self.kept_offsets)}, damaged "
            f"commitlog spans set aside {len(self.damaged_spans)}, {self.duration_ms:.1f} ms"
        )


@dataclass(frozen=True, slots=True)
class Damage:
    """A damaged stretch the scan stepped over, before it is set aside."""

    file: MappedFile
    #: Position in ``file`` where a record should have been.
    pos: int
    length: int
    reason: str
    #: Whether the stretch runs to the file's end (it becomes an end-of-file blank).
    to_file_end: bool
    #: The store time of the last valid record before it: the time its tombstone
    #: gets, so store times stay in order along the log.
    store_timestamp_ms: int = 0


@dataclass(frozen=True, slots=True)
class ScanResult:
    valid_end: int
    files_scanned: int
    stop_reason: str
    last_store_timestamp_ms: int
    #: True when the scan ended on empty space rather than on a corrupt record.
    clean_end: bool
    #: Offset of the first record stored after the scan's ``newer_than_ms``; -1 if none.
    first_newer_offset: int
    #: What the scan stepped over to reach ``valid_end``, in CommitLog order.
    damage: tuple[Damage, ...] = ()


def scan_commitlog(
    files: list[MappedFile],
    start_index: int,
    *,
    check_crc: bool,
    newer_than_ms: int = -1,
    search_to: int = 0,
    end_index: int | None = None,
    prescan: CommitLogPrescan | None = None,
) -> ScanResult:
    """Walk records from ``files[start_index]`` to the end of the data, stepping
    over damage (:func:`basalt.store.resync.resync`).

    The walk is :func:`basalt.common._records.scan`: check_record's rules in C, with
    the GIL released, because recovery reads every byte of up to three (or,
    after a crash, more) 1 GiB files. Where it stops short of a file's end
    (a bad record, or zeros with no end-of-file blank), the rest of the file
    is searched for the next valid record; in the last file only up to
    :data:`TORN_WRITE_WINDOW_BYTES` past ``search_to`` (the ConsumeQueues'
    end: records were there) or past the stop, since the rest of a live
    file is space never written. The data ends where the last file's search
    finds nothing. With ``end_index``, the walk stops before that file (a stretch
    of whole files, re-read for damage before re-dispatch goes through it).
    ``prescan``, started over the same files with the same settings, supplies
    each file's first walk.
    """
    stop_index = len(files) if end_index is None else end_index
    last_ts = 0
    first_newer = -1
    damage: list[Damage] = []
    for index in range(start_index, stop_index):
        mf = files[index]
        base, size = mf.file_from_offset, mf.file_size
        last_file = index == len(files) - 1
        # Only as far as the first data extent reaches: the rest of a sparse file is
        # a hole, and a read fault on a hole is a SIGBUS on a full tmpfs. Data
        # past a hole is found by resync, which reads data extents only.
        if prescan is not None and prescan.start_index <= index:
            result = prescan.walk(index)
        else:
            result = _walk(mf, check_crc, newer_than_ms)
        while True:
            pos, kind, reason, file_ts, file_first_newer, _ = result
            last_ts = file_ts or last_ts
            if first_newer < 0 and file_first_newer >= 0:
                first_newer = base + file_first_newer
            if kind == _records.KIND_BLANK:
                (blank_size,) = _INT.unpack_from(mf.buffer, pos)
                if blank_size == size - pos:
                    break  # the file's end: on to the next
                kind = _records.KIND_CORRUPT
                reason = f"end-of-file blank of {blank_size} bytes but {size - pos} remain"
            elif kind == _records.KIND_END and pos >= size:
                break  # the file is exactly full
            elif kind == _records.KIND_END:
                reason = "zeros where a record should be"
            limit = size
            if last_file:
                limit = min(size, max(search_to - base, pos) + TORN_WRITE_WINDOW_BYTES)
            found = resync(mf, pos, limit, check_crc=check_crc, newer_than_ms=newer_than_ms)
            if found is None:
                if last_file:
                    clean = kind == _records.KIND_END
                    stop = "end of data" if clean else f"{reason} at offset {base + pos}"
                    return ScanResult(
                        base + pos, index - start_index + 1, stop, last_ts, clean, first_newer,
                        tuple(damage),
                    )  # fmt: skip
                damage.append(Damage(mf, pos, size - pos, reason, True, last_ts))
                break
            at, result = found
            damage.append(Damage(mf, pos, at - pos, reason, False, last_ts))
    end = files[stop_index - 1].file_end_offset
    return ScanResult(
        end, stop_index - start_index, "end of data", last_ts, True, first_newer, tuple(damage)
    )


def _walk(mf: MappedFile, check_crc: bool, newer_than_ms: int) -> _records.ScanTuple:
    """One CommitLog file's C walk from its start, as far as its first data extent
    reaches: the rest of a sparse file is a hole, and a read fault on a hole is
    a SIGBUS on a full tmpfs. Data past a hole is found by resync, which reads
    data extents only."""
    return _records.scan(
        mf.buffer, 0, mf.readable_end(0), mf.file_from_offset, check_crc, newer_than_ms
    )


def scan_start_index(
    files: list[MappedFile], checkpoint: StoreCheckpoint, *, abnormal: bool
) -> int:
    """The first CommitLog file recovery scans: the third-last after a clean stop,
    after a crash the last one no newer than the checkpoint minimum."""
    return _abnormal_start_index(files, checkpoint) if abnormal else max(0, len(files) - 3)


class CommitLogPrescan:
    """The C walk of every CommitLog file recovery will scan, on a thread of its
    own, started before the ConsumeQueues load.

    The walk reads every byte of up to three (after a crash, more) 1 GiB
    files with the GIL released, while loading tens of thousands of queues is
    system calls and Python on the store's thread: on two cores the two
    overlap, and a start costs the longer of them rather than their sum.
    Only reads; :meth:`wait` must return before the files are unmapped.
    """

    def __init__(
        self,
        files: list[MappedFile],
        checkpoint: StoreCheckpoint,
        *,
        abnormal: bool,
        check_crc: bool,
    ) -> None:
        self.files = list(files)
        self.start_index = scan_start_index(files, checkpoint, abnormal=abnormal)
        self.check_crc = check_crc
        self.newer_than_ms = checkpoint.min_timestamp_ms()
        self._walks: list[_records.ScanTuple] = []
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="commitlog-prescan", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for mf in self.files[self.start_index :]:
                self._walks.append(_walk(mf, self.check_crc, self.newer_than_ms))
        except BaseException as e:  # re-raised on the store's thread by walk()
            self._error = e

    def wait(self) -> None:
        self._thread.join()

    def walk(self, index: int) -> _records.ScanTuple:
        """File ``index``'s walk (waiting for it); raises what the walk raised."""
        self.wait()
        if self._error is not None:
            raise self._error
        return self._walks[index - self.start_index]


def _abnormal_start_index(files: list[MappedFile], checkpoint: StoreCheckpoint) -> int:
    """The last file whose first record is no newer than the checkpoint minimum."""
    min_ts = checkpoint.min_timestamp_ms()
    for index in range(len(files) - 1, -1, -1):
        mf = files[index]
        info = check_record(mf.buffer, 0, mf.readable_end(0), check_crc=False)
        if (
            info.kind is RecordKind.MESSAGE
            and info.store_timestamp_ms != 0
            and info.store_timestamp_ms <= min_ts
        ):
            return index
    return 0


def recover(
    commitlog: CommitLog,
    consume_queues: ConsumeQueueTable,
    checkpoint: StoreCheckpoint,
    dispatcher: ReputMessageService,
    *,
    abnormal: bool,
    check_crc: bool,
    prescan: CommitLogPrescan | None = None,
    manifest: ManifestLoad | None = None,
    cut_at: int | None = None,
) -> RecoveryReport:
    """Bring a freshly loaded store to a consistent state; see the module docstring.

    ``prescan``, when given, was started over the loaded CommitLog files with
    the same ``abnormal``, ``check_crc`` and checkpoint. ``cut_at``: the CommitLog
    was just cut there (a durable truncation finished at start): units at or
    past it are dropped, their queue offsets free again, not kept as blanks. ``manifest`` is what
    :meth:`QueueManifest.load` found: the queues it lists are checked for a
    missing directory or a short end, and keep their listed max offsets.

    On return the CommitLog ends at its last valid record, every ConsumeQueue
    indexes exactly the dispatchable records below that end (and blank units
    for the offsets of records that are gone), and the CommitLog's table of
    next queue offsets is rebuilt from them. Raises CorruptRecordError when
    re-dispatch meets a record it cannot parse.
    """
    started = time.perf_counter()
    known = manifest.maxima if manifest is not None else {}
    damage: dict[ConsumeQueue, list[str]] = {}
    for cq in consume_queues:
        reasons = damage[cq] = list(cq.files.repaired)
        cleared = cq.recover()
        if cut_at is not None:
            cq.truncate_dirty(cut_at)
        if cleared:
            reasons.append(f"{cleared} non-zero bytes past the written end")
        if not cq.files.files:
            reasons.append("no file")
    dirs_missing = check_against_manifest(consume_queues, known, damage)
    files = commitlog.files.files
    written_before = dispatcher.entries_written
    commitlog_missing = not files and (
        bool(known) or any(cq.max_offset_in_queue > 0 for cq in consume_queues)
    )
    if not files and not commitlog_missing:
        # A new store (or one that never indexed a record): nothing to keep.
        destroyed = consume_queues.destroy()
        commitlog.files.set_written_to(0)
        dispatcher.reput_from_offset = 0
        report = RecoveryReport(
            abnormal, 0, 0, 0, 0, "no commitlog", 0, 0, 0, destroyed,
            (time.perf_counter() - started) * 1000,
        )  # fmt: skip
        log.info("%s", report.summary())
        return report
    if commitlog_missing:
        # Not a new store: every record is gone, but the offsets the queues gave out
        # stay taken. The log starts again at 0 (its first file, empty), and the
        # scan below finds every unit pointing past its end.
        log.error(
            "no commitlog file in %s, but the consume queues index records: every record is "
            "lost; the queues keep their offsets and the commitlog starts again at 0",
            commitlog.files.directory,
        )
        commitlog.files.get_last_mapped_file(0)
        commitlog.files.set_written_to(0)
        files = commitlog.files.files

    start_index = scan_start_index(files, checkpoint, abnormal=abnormal)
    scan_start = files[start_index].file_from_offset
    min_ts = checkpoint.min_timestamp_ms()
    for repair in commitlog.files.repaired:
        log.error("commitlog file repaired on load: %s", repair)
    indexed_end = consume_queues.max_physic_offset()
    scan = scan_commitlog(
        files,
        start_index,
        check_crc=check_crc,
        newer_than_ms=min_ts,
        search_to=indexed_end,
        prescan=prescan if prescan is not None and prescan.files == files else None,
    )
    spans = _set_aside(commitlog, scan)
    # Stopped on empty space: only a torn append can lie beyond. Stopped on a corrupt
    # record: valid-looking records may follow it, so every byte past it is cleared.
    truncated = commitlog.files.truncate_dirty_files(
        scan.valid_end,
        dirty_end=scan.valid_end + TORN_WRITE_WINDOW_BYTES if scan.clean_end else None,
    )
    last = commitlog.files.last_file
    if last is not None:
        last.store_timestamp_ms = scan.last_store_timestamp_ms
    # The queue slots of lost records stay taken: their units become blank units.
    dropped_by: dict[ConsumeQueue, int] = {}
    tail_units = 0  # units of records lost at the end of the log
    gone = [(span.offset, span.end) for span in spans]
    gone.append((scan.valid_end, _END_OF_TIME))
    for cq in consume_queues:
        dropped_by[cq] = 0
        for start, end in gone:
            blanked = cq.blank_units(start, end)
            dropped_by[cq] += blanked
            tail_units += blanked if start >= scan.valid_end else 0
    valid_end = scan.valid_end
    if indexed_end > valid_end and not any(span.offset >= valid_end for span in spans):
        lost = DamagedSpan(valid_end, indexed_end - valid_end, _GONE_PAST_THE_END)
        log.error("damaged commitlog data: %s", lost.describe())
        spans.append(lost)
    if tail_units or not scan.clean_end:
        # Records were lost at the end of the log: a tombstone there tells every later
        # reader (store check) that the queue offsets jump across it.
        valid_end = _append_tombstone(commitlog, valid_end, scan.last_store_timestamp_ms)
    end_marked = valid_end != scan.valid_end

    rebuild = repair_consume_queues(consume_queues, commitlog, damage, dropped_by)
    cq_end = consume_queues.max_physic_offset()
    reput_from = max(cq_end, commitlog.min_offset)
    if abnormal:
        # Records stored after the checkpoint's minimum may be missing from any queue:
        # re-dispatch from the first of them (units already present are skipped).
        newer = scan.first_newer_offset if scan.first_newer_offset >= 0 else valid_end
        reput_from = min(reput_from, newer)
    reput_from = min([reput_from, *(phy for _, phy in rebuild.values())])
    redispatch_from = dispatcher.reput_from_offset = min(reput_from, valid_end)
    if redispatch_from < scan_start:
        # Re-dispatch goes back before the scan (a damaged queue): read that stretch
        # for damage first, so the dispatcher only meets records that are valid.
        early = scan_commitlog(
            files,
            files.index(commitlog.files.find_by_offset(redispatch_from) or files[0]),
            check_crc=check_crc,
            end_index=start_index,
        )
        found = _set_aside(commitlog, early, tail=False)
        for cq in consume_queues:
            for span in found:
                dropped_by[cq] += cq.blank_units(span.offset, span.end)
        spans = found + spans
    dropped = sum(dropped_by.values())
    _dispatch_all(dispatcher)

    keep_lost_slots(consume_queues, spans)
    rebuilt = rebuilt_queues(rebuild, damage, dropped_by)
    kept = keep_known_offsets(rebuild, known) if known else ()
    if kept and not end_marked:
        # The kept offsets jump past the queues' last records in the log: a tombstone
        # at its end says so to every later reader, as for records lost at the end.
        valid_end = _append_tombstone(commitlog, valid_end, scan.last_store_timestamp_ms)
        _dispatch_all(dispatcher)  # steps over it
    table = commitlog.topic_queue_table
    table.clear()
    for cq in consume_queues:
        table[cq.topic, cq.queue_id] = cq.max_offset_in_queue
    if dispatcher.reput_from_offset < commitlog.max_offset:
        # Controller mode: records above the confirm offset stay undispatched, but
        # their queue offsets are taken - no later append may issue one again
        # (RocketMQ #7689). The CommitLog, not the queues, says which.
        advance_queue_offsets(commitlog, dispatcher.reput_from_offset, commitlog.max_offset)

    report = RecoveryReport(
        abnormal=abnormal,
        commitlog_files=len(files),
        files_scanned=scan.files_scanned,
        scan_start_offset=scan_start,
        last_valid_offset=valid_end,
        stop_reason=scan.stop_reason,
        bytes_truncated=truncated,
        consume_queue_entries_dropped=dropped,
        consume_queue_entries_rebuilt=dispatcher.entries_written - written_before,
        consume_queues_destroyed=0,  # only for a new store (above)
        duration_ms=(time.perf_counter() - started) * 1000,
        redispatch_from_offset=redispatch_from,
        rebuilt_queues=rebuilt,
        damaged_spans=tuple(spans),
        queue_manifest=manifest.describe() if manifest is not None else "",
        queue_dirs_missing=dirs_missing,
        kept_offsets=kept,
        commitlog_missing=commitlog_missing,
    )
    damaged = spans or kept or commitlog_missing
    log.log(logging.ERROR if damaged else logging.INFO, "%s", report.summary())
    return report


def _dispatch_all(dispatcher: ReputMessageService) -> None:
    """Dispatch to the CommitLog's end; raises CorruptRecordError where it stalls."""
    while dispatcher.dispatch_available():
        pass
    if dispatcher.stalled_reason is not None:
        raise CorruptRecordError(dispatcher.reput_from_offset, dispatcher.stalled_reason)


def _set_aside(commitlog: CommitLog, scan: ScanResult, *, tail: bool = True) -> list[DamagedSpan]:
    """Quarantine every damaged stretch, then overwrite it: a tombstone record in the
    middle of a file, an end-of-file blank at a file's end; the damaged tail past
    the last record is quarantined here and cleared by the caller. Each span is
    logged at ERROR."""
    spans: list[DamagedSpan] = []
    directory = commitlog.config.quarantine_dir
    host = commitlog.store_host
    last = commitlog.files.last_file
    past_end: list[Damage] = []
    if tail and last is not None and scan.valid_end >= last.file_from_offset:
        pos = scan.valid_end - last.file_from_offset
        limit = last.file_size if not scan.clean_end else pos + TORN_WRITE_WINDOW_BYTES
        length = data_length(last, pos, min(limit, last.file_size))
        if length:
            reason = "bytes past the last record" if scan.clean_end else scan.stop_reason
            past_end.append(Damage(last, pos, length, reason, True, scan.last_store_timestamp_ms))
    for d in (*scan.damage, *past_end):
        offset = d.file.file_from_offset + d.pos
        header = read_header(d.file, d.pos, d.pos + d.length)
        kept = d.length if not d.to_file_end else data_length(d.file, d.pos, d.pos + d.length)
        path = ""
        if kept:
            data = d.file.read(d.pos, kept)
            path = str(quarantine(directory, offset, d.length, data))
        topic, queue_id, queue_offset = header if header is not None else (None, None, None)
        span = DamagedSpan(offset, d.length, d.reason, topic, queue_id, queue_offset, path)
        log.error("damaged commitlog data set aside: %s", span.describe())
        spans.append(span)
        if d in past_end:
            continue  # cleared with the rest of the tail
        note = Path(path).name if path else ""
        if d.to_file_end:
            # A short tombstone (readers learn records were lost here), then the
            # end-of-file blank: the rest of the file stays sparse.
            d.file.zero_tail(d.pos)
            size = min(d.length - BLANK.size, TAIL_TOMBSTONE_BYTES)
            blank_at = d.pos
            if size >= MIN_RECORD_SIZE:
                ts = d.store_timestamp_ms
                record = tombstone(offset, size, store_host=host, store_timestamp_ms=ts, note=note)
                d.file.write_at(d.pos, record)
                blank_at += size
            d.file.write_at(blank_at, BLANK.pack(d.file.file_size - blank_at, BLANK_MAGIC_CODE))
        else:
            ts = d.store_timestamp_ms
            record = tombstone(offset, d.length, store_host=host, store_timestamp_ms=ts, note=note)
            d.file.write_at(d.pos, record)
    return spans


def _append_tombstone(commitlog: CommitLog, at: int, store_timestamp_ms: int) -> int:
    """Write a short tombstone at ``at``, the end of the recovered log, if the last
    file has room for it and its end-of-file blank; returns the new end."""
    last = commitlog.files.last_file
    if last is None or at < last.file_from_offset:
        return at
    room = last.file_size - (at - last.file_from_offset) - BLANK.size
    size = min(room, TAIL_TOMBSTONE_BYTES)
    if size < MIN_RECORD_SIZE:
        return at
    record = tombstone(
        at, size, store_host=commitlog.store_host, store_timestamp_ms=store_timestamp_ms, note=""
    )
    last.append(record)
    commitlog.files.set_written_to(at + size)
    return at + size
