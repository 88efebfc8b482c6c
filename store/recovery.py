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
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass

from basalt.common import _records
from basalt.common.record import RecordKind, check_record
from basalt.store.checkpoint import StoreCheckpoint
from basalt.store.commitlog import CommitLog
from basalt.store.consume_queue_table import ConsumeQueueTable
from basalt.store.dispatcher import ReputMessageService
from basalt.store.errors import CorruptRecordError
from basalt.store.mapped_file import MappedFile
from basalt.store.mapped_file_queue import TORN_WRITE_WINDOW_BYTES

log = logging.getLogger(__name__)


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
            f"{self.consume_queues_destroyed}, {self.duration_ms:.1f} ms"
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
    for cq in consume_queues:
        cq.recover()
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
    dropped = sum(cq.truncate_dirty(scan.valid_end) for cq in consume_queues)

    destroyed = 0
    if scan.valid_end <= commitlog.min_offset:
        destroyed = consume_queues.destroy()  # the CommitLog holds no record at all

    cq_end = consume_queues.max_physic_offset()
    reput_from = max(cq_end, commitlog.min_offset)
    if abnormal:
        # Records stored after the checkpoint's minimum may be missing from any queue:
        # re-dispatch from the first of them (units already present are skipped).
        newer = scan.first_newer_offset if scan.first_newer_offset >= 0 else scan.valid_end
        reput_from = min(reput_from, newer)
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
    )
    log.info("%s", report.summary())
    return report
