"""Recovery on load: make the CommitLog, the ConsumeQueues and the checkpoint agree.

RocketMQ's ``recoverNormally`` / ``recoverAbnormally``:

* **normal** (no ``abort`` file: the last shutdown was clean) — scan the
  CommitLog from the third-last file;
* **abnormal** (``abort`` left by a crash) — scan from the last file whose
  first record is older than the checkpoint minimum (``min(physic, logics) −
  3 s``), from the first file if none is, and re-dispatch from there.

Either scan stops at the first record with a bad magic code, a bad CRC (with
``check_crc_on_recover``), an inconsistent size or a physical offset that is
not its own position. Everything past that point is truncated from the
CommitLog, ConsumeQueue units pointing past it are dropped, and whatever the
ConsumeQueues lack is re-dispatched. No CommitLog at all ⇒ no ConsumeQueues.

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
when it is whole). A deleted queue *directory* is not detected: finding it
would take a walk of the whole CommitLog.

Cost: validation checks every unit pointing into the CommitLog's last
:data:`VALIDATE_FULL_BYTES` (64 MiB: where writes, crashes and torn pages are;
RocketMQ checks only the tail) and samples the units further back (see
:meth:`ConsumeQueue.validate`). A unit costs about 1 µs, so the full part is
bounded by the number of records in 64 MiB (~65,000 at ~1 KiB a record,
~0.07 s) whatever the store's size, on top of the CommitLog scan; re-dispatch
runs only from where damage was found. A 1 GiB window cost ~1 s a start and
took abnormal recovery of a 1 GiB log from 0.66 to 1.70 s (the target is
1.5 s/GiB), so the window is the tail, as RocketMQ's.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass

from basalt.common import _records
from basalt.common.record import RecordKind, check_record
from basalt.store.checkpoint import StoreCheckpoint
from basalt.store.commitlog import CommitLog
from basalt.store.consume_queue import ConsumeQueue
from basalt.store.consume_queue_table import ConsumeQueueTable
from basalt.store.dispatcher import ReputMessageService
from basalt.store.errors import CorruptRecordError
from basalt.store.mapped_file import MappedFile
from basalt.store.mapped_file_queue import TORN_WRITE_WINDOW_BYTES

log = logging.getLogger(__name__)

#: ConsumeQueue units pointing into this much of the CommitLog's end are all
#: validated at start; units further back are sampled (see ConsumeQueue.validate).
VALIDATE_FULL_BYTES = 64 << 20


@dataclass(frozen=True, slots=True)
class QueueRebuild:
    """One damaged ConsumeQueue, and how recovery rebuilt it from the CommitLog."""

    topic: str
    queue_id: int
    #: What was wrong, in the order found.
    reasons: tuple[str, ...]
    #: Units dropped: damaged, after the damage, or pointing past the CommitLog's end.
    units_dropped: int
    #: Queue offsets below this were kept as they were.
    kept_to: int
    #: One past the last queue offset after re-dispatch: what the CommitLog holds.
    max_offset: int
    #: The CommitLog offset this queue needed re-dispatching from.
    redispatch_from: int


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

    def as_dict(self) -> dict[str, object]:
        return asdict(self)

    def summary(self) -> str:
        kind = "abnormal" if self.abnormal else "normal"
        return (
            f"{kind} recovery: scanned {self.files_scanned}/{self.commitlog_files} commitlog "
            f"files from {self.scan_start_offset}, valid to {self.last_valid_offset} "
            f"({self.stop_reason}), truncated {self.bytes_truncated} bytes, consume queue "
            f"entries dropped {self.consume_queue_entries_dropped} rebuilt "
            f"{self.consume_queue_entries_rebuilt}, queues destroyed "
            f"{self.consume_queues_destroyed}, damaged queues rebuilt "
            f"{len(self.rebuilt_queues)}, {self.duration_ms:.1f} ms"
        )


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


def scan_commitlog(
    files: list[MappedFile], start_index: int, *, check_crc: bool, newer_than_ms: int = -1
) -> ScanResult:
    """Walk records from ``files[start_index]`` to the first invalid one.

    The walk is :func:`basalt.common._records.scan`: check_record's rules in C, with
    the GIL released, because recovery reads every byte of up to three (or,
    after a crash, more) 1 GiB files.
    """
    offset = files[start_index].file_from_offset
    last_ts = 0
    first_newer = -1
    scanned = 0
    for mf in files[start_index:]:
        scanned += 1
        base = mf.file_from_offset
        pos, kind, reason, file_ts, file_first_newer, _ = _records.scan(
            mf.buffer, 0, mf.file_size, base, check_crc, newer_than_ms
        )
        last_ts = file_ts or last_ts
        if first_newer < 0 and file_first_newer >= 0:
            first_newer = base + file_first_newer
        if kind == _records.KIND_BLANK:
            offset = mf.file_end_offset
            continue
        end = base + pos
        clean = kind == _records.KIND_END
        stop = "end of data" if clean else f"{reason} at offset {end}"
        return ScanResult(end, scanned, stop, last_ts, clean, first_newer)
    return ScanResult(offset, scanned, "end of data", last_ts, True, first_newer)


def _abnormal_start_index(files: list[MappedFile], checkpoint: StoreCheckpoint) -> int:
    """The last file whose first record is no newer than the checkpoint minimum."""
    min_ts = checkpoint.min_timestamp_ms()
    for index in range(len(files) - 1, -1, -1):
        info = check_record(files[index].buffer, 0, files[index].file_size, check_crc=False)
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
) -> RecoveryReport:
    """Bring a freshly loaded store to a consistent state; see the module docstring.

    On return the CommitLog ends at its last valid record, every ConsumeQueue
    indexes exactly the dispatchable records below that end, and the
    CommitLog's table of next queue offsets is rebuilt from them.
    """
    started = time.perf_counter()
    damage: dict[ConsumeQueue, list[str]] = {}
    for cq in consume_queues:
        reasons = damage[cq] = list(cq.files.repaired)
        cleared = cq.recover()
        if cleared:
            reasons.append(f"{cleared} non-zero bytes past the written end")
        if not cq.files.files:
            reasons.append("no file")
    files = commitlog.files.files
    written_before = dispatcher.entries_written
    if not files:
        destroyed = consume_queues.destroy()
        commitlog.files.set_written_to(0)
        dispatcher.reput_from_offset = 0
        report = RecoveryReport(
            abnormal, 0, 0, 0, 0, "no commitlog", 0, 0, 0, destroyed,
            (time.perf_counter() - started) * 1000,
        )  # fmt: skip
        log.info("%s", report.summary())
        return report

    start_index = _abnormal_start_index(files, checkpoint) if abnormal else max(0, len(files) - 3)
    scan_start = files[start_index].file_from_offset
    min_ts = checkpoint.min_timestamp_ms()
    scan = scan_commitlog(files, start_index, check_crc=check_crc, newer_than_ms=min_ts)
    # Stopped on empty space: only a torn append can lie beyond. Stopped on a corrupt
    # record: valid-looking records may follow it, so every byte past it is cleared.
    truncated = commitlog.files.truncate_dirty_files(
        scan.valid_end,
        dirty_end=scan.valid_end + TORN_WRITE_WINDOW_BYTES if scan.clean_end else None,
    )
    last = commitlog.files.last_file
    if last is not None:
        last.store_timestamp_ms = scan.last_store_timestamp_ms
    dropped_by: dict[ConsumeQueue, int] = {}
    for cq in consume_queues:
        cut = dropped_by[cq] = cq.truncate_dirty(scan.valid_end)
        if cut:
            damage[cq].append(f"{cut} units past the CommitLog's end")

    destroyed = 0
    if scan.valid_end <= commitlog.min_offset:
        destroyed = consume_queues.destroy()  # the CommitLog holds no record at all

    rebuild = _repair_consume_queues(consume_queues, commitlog, damage, dropped_by)
    dropped = sum(dropped_by.values())
    cq_end = consume_queues.max_physic_offset()
    reput_from = max(cq_end, commitlog.min_offset)
    if abnormal:
        # Records stored after the checkpoint's minimum may be missing from any queue:
        # re-dispatch from the first of them (units already present are skipped).
        newer = scan.first_newer_offset if scan.first_newer_offset >= 0 else scan.valid_end
        reput_from = min(reput_from, newer)
    reput_from = min([reput_from, *(phy for _, phy in rebuild.values())])
    redispatch_from = dispatcher.reput_from_offset = min(reput_from, scan.valid_end)
    while dispatcher.dispatch_available():
        pass
    if dispatcher.stalled_reason is not None:
        raise CorruptRecordError(dispatcher.reput_from_offset, dispatcher.stalled_reason)

    table = commitlog.topic_queue_table
    table.clear()
    for cq in consume_queues:
        cq.correct_min_offset(commitlog.min_offset)
        table[cq.topic, cq.queue_id] = cq.max_offset_in_queue
    rebuilt = _rebuilt_queues(rebuild, damage, dropped_by)

    report = RecoveryReport(
        abnormal=abnormal,
        commitlog_files=len(files),
        files_scanned=scan.files_scanned,
        scan_start_offset=scan_start,
        last_valid_offset=scan.valid_end,
        stop_reason=scan.stop_reason,
        bytes_truncated=truncated,
        consume_queue_entries_dropped=dropped,
        consume_queue_entries_rebuilt=dispatcher.entries_written - written_before,
        consume_queues_destroyed=destroyed,
        duration_ms=(time.perf_counter() - started) * 1000,
        redispatch_from_offset=redispatch_from,
        rebuilt_queues=rebuilt,
    )
    log.info("%s", report.summary())
    return report


def _repair_consume_queues(
    consume_queues: ConsumeQueueTable,
    commitlog: CommitLog,
    damage: dict[ConsumeQueue, list[str]],
    dropped_by: dict[ConsumeQueue, int],
) -> dict[ConsumeQueue, tuple[int, int]]:
    """Validate every queue against the recovered CommitLog and cut each damaged
    one at its first bad unit; returns, per queue to rebuild, (queue offsets
    kept, CommitLog offset to re-dispatch from). Adds to ``damage`` and
    ``dropped_by``."""
    full_from = commitlog.files.max_offset - VALIDATE_FULL_BYTES
    rebuild: dict[ConsumeQueue, tuple[int, int]] = {}
    for cq in consume_queues:
        reasons = damage.setdefault(cq, [])
        bad = cq.validate(commitlog.files, full_from)
        if bad is not None:
            offset, why = bad
            reasons.append(f"queue offset {offset}: {why}")
            dropped_by[cq] = dropped_by.get(cq, 0) + cq.truncate_to(offset)
        end_file = cq.files.last_file
        at_file_end = end_file is not None and end_file.is_full
        if reasons or at_file_end:
            # A queue ending exactly at a file's end may have lost its next file:
            # re-dispatching from its own end rebuilds nothing if it did not.
            phy = cq.max_physic_offset
            rebuild[cq] = (cq.max_offset_in_queue, phy if phy >= 0 else commitlog.min_offset)
    return rebuild


def _rebuilt_queues(
    rebuild: dict[ConsumeQueue, tuple[int, int]],
    damage: dict[ConsumeQueue, list[str]],
    dropped_by: dict[ConsumeQueue, int],
) -> tuple[QueueRebuild, ...]:
    """The report's entries for the queues that were damaged or got units back, logged."""
    out: list[QueueRebuild] = []
    for cq, (kept_to, phy) in rebuild.items():
        reasons = damage.get(cq, [])
        dropped = dropped_by.get(cq, 0)
        max_offset = cq.max_offset_in_queue
        if not reasons and not dropped and max_offset == kept_to:
            continue  # ended at a file's end, and nothing was missing after it
        if not reasons:
            reasons = ["ended at a file's end: a later file was missing"]
        entry = QueueRebuild(
            cq.topic, cq.queue_id, tuple(reasons), dropped, kept_to, max_offset, phy
        )
        log.warning(
            "consumequeue %s/%d rebuilt from the commitlog: %s; kept offsets below %d, "
            "dropped %d units, re-dispatched from commitlog offset %d, now ends at %d",
            cq.topic, cq.queue_id, "; ".join(reasons), kept_to, dropped, phy, max_offset,
        )  # fmt: skip
        out.append(entry)
    return tuple(out)
