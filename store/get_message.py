"""The pull path's read: RocketMQ 4.9's ``DefaultMessageStore.getMessage``.

Given a queue offset, the ConsumeQueue says where each record is; the
matched records are copied out of the CommitLog as they are stored, back to
back, never decoded or re-encoded (the client decodes the same layout, see
:mod:`basalt.common.record`). What the loop does, in RocketMQ's order:

1. Offset checks against the queue's min and max (RocketMQ's
   DefaultMessageStore.getMessage): an empty queue
   is NO_MESSAGE_IN_QUEUE, below the min OFFSET_TOO_SMALL, exactly the max
   OFFSET_OVERFLOW_ONE, past it OFFSET_OVERFLOW_BADLY, each with the
   corrected ``next_begin_offset`` (``nextOffsetCorrection``: a master always
   corrects). An offset whose ConsumeQueue file is gone is OFFSET_FOUND_NULL,
   continuing at the next file.
2. Units from the offset to the end of its ConsumeQueue file, at most
   ``max(16000, max_msg_nums * 20)`` bytes of them, are scanned. Per unit:
   stop if the batch is full (``max_msg_nums`` messages, or the transfer caps
   in bytes and count, which are smaller for records far behind the
   CommitLog's end: "in disk"); skip it if its tagsCode fails the filter's
   ConsumeQueue check; skip the rest of a CommitLog file that is gone
   (MESSAGE_WAS_REMOVING); skip it if the record's properties fail the
   filter's CommitLog check; else take it.
3. ``next_begin_offset`` is the offset past the last unit scanned, so a
   filtered pull that matched nothing still moves the consumer forward.

The per-unit loop runs in C (:func:`basalt.common._records.gather`): it stops for
Python only where a decision needs Python - a record in another CommitLog
file, or a candidate whose properties a filter must check.

Concurrency: any thread, concurrently with the writer and the dispatcher;
only units below a queue's write position and bytes below a file's write
position are read.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

from basalt.common import _records
from basalt.common.message import MessageRecord
from basalt.common.record import Buffer, decode_record, record_properties, split_records
from basalt.store.commitlog import CommitLog
from basalt.store.config import CQ_STORE_UNIT_SIZE, MessageStoreConfig
from basalt.store.consume_queue import BLANK_UNIT_SIZE, UNIT, ConsumeQueue
from basalt.store.mapped_file import MappedFile
from basalt.store.message_filter import MessageFilter

#: RocketMQ scans at least this many ConsumeQueue bytes per call (800 units).
MIN_SCAN_BYTES = 16000


class GetStatus(enum.Enum):
    """RocketMQ's GetMessageStatus."""

    FOUND = "FOUND"
    NO_MATCHED_MESSAGE = "NO_MATCHED_MESSAGE"
    MESSAGE_WAS_REMOVING = "MESSAGE_WAS_REMOVING"
    OFFSET_FOUND_NULL = "OFFSET_FOUND_NULL"
    OFFSET_OVERFLOW_BADLY = "OFFSET_OVERFLOW_BADLY"
    OFFSET_OVERFLOW_ONE = "OFFSET_OVERFLOW_ONE"
    OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"
    NO_MATCHED_LOGIC_QUEUE = "NO_MATCHED_LOGIC_QUEUE"
    NO_MESSAGE_IN_QUEUE = "NO_MESSAGE_IN_QUEUE"


class _RawRecords:
    """Records exactly as stored, back to back: what a pull or query returns."""

    __slots__ = ()
    records: bytes

    @property
    def buffer_total_size(self) -> int:
        return len(self.records)

    def iter_records(self) -> Iterator[memoryview]:
        """Each stored record as a view into :attr:`records`."""
        return split_records(self.records)

    def decode(self) -> list[MessageRecord]:
        """The records decoded (tests and tools; the broker never needs this)."""
        return [decode_record(r) for r in split_records(self.records)]


class _GetMessageFields(NamedTuple):
    status: GetStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    records: bytes = b""
    message_count: int = 0


class GetMessageResult(_GetMessageFields, _RawRecords):
    """What one ``get_message`` call found (RocketMQ's GetMessageResult).

    ``records`` holds the matched records exactly as stored, back to back.
    A NamedTuple: one is built per pull, and a frozen dataclass costs more.
    """

    __slots__ = ()


class _QueryMessageFields(NamedTuple):
    records: bytes
    message_count: int
    index_last_update_timestamp_ms: int
    index_last_update_phy_offset: int


class QueryMessageResult(_QueryMessageFields, _RawRecords):
    """What ``query_message`` found (RocketMQ's QueryMessageResult)."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class TransferLimits:
    """RocketMQ's per-pull transfer caps, from the store config."""

    max_bytes_in_memory: int
    max_count_in_memory: int
    max_bytes_in_disk: int
    max_count_in_disk: int
    #: A record more than this many bytes behind the CommitLog's end counts as "in disk".
    memory_window_bytes: int

    @classmethod
    def of(cls, config: MessageStoreConfig) -> TransferLimits:
        try:
            physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError):
            physical = 1 << 34
        return cls(
            config.max_transfer_bytes_on_message_in_memory,
            config.max_transfer_count_on_message_in_memory,
            config.max_transfer_bytes_on_message_in_disk,
            config.max_transfer_count_on_message_in_disk,
            physical * config.access_message_in_memory_max_ratio // 100,
        )


def get_message(
    commitlog: CommitLog,
    cq: ConsumeQueue | None,
    offset: int,
    max_msg_nums: int,
    message_filter: MessageFilter | None,
    limits: TransferLimits,
) -> GetMessageResult:
    """Read up to ``max_msg_nums`` matching records of one queue from ``offset``.

    ``cq`` is None for a queue the store has never seen. See the module
    docstring for the statuses and the order of the checks.
    """
    if cq is None:
        return GetMessageResult(GetStatus.NO_MATCHED_LOGIC_QUEUE, 0, 0, 0)
    min_offset = cq.min_offset_in_queue
    max_offset = cq.max_offset_in_queue
    if max_offset == 0:
        return GetMessageResult(GetStatus.NO_MESSAGE_IN_QUEUE, 0, min_offset, max_offset)
    if offset < min_offset:
        return GetMessageResult(GetStatus.OFFSET_TOO_SMALL, min_offset, min_offset, max_offset)
    if offset == max_offset:
        return GetMessageResult(GetStatus.OFFSET_OVERFLOW_ONE, offset, min_offset, max_offset)
    if offset > max_offset:
        corrected = min_offset if min_offset == 0 else max_offset
        return GetMessageResult(GetStatus.OFFSET_OVERFLOW_BADLY, corrected, min_offset, max_offset)
    scan_units = max(MIN_SCAN_BYTES, max_msg_nums * CQ_STORE_UNIT_SIZE) // CQ_STORE_UNIT_SIZE
    # The units are read in one pread from the ConsumeQueue file, held against
    # expiry, from ``offset`` to at most the file's end (RocketMQ's getIndexBuffer).
    cq_file = cq.files.find_by_offset(offset * CQ_STORE_UNIT_SIZE)
    if cq_file is None or not cq_file.hold():
        units_per_file = cq.mapped_file_size // CQ_STORE_UNIT_SIZE
        next_file = offset + units_per_file - offset % units_per_file
        return GetMessageResult(GetStatus.OFFSET_FOUND_NULL, next_file, min_offset, max_offset)
    try:
        first = (offset * CQ_STORE_UNIT_SIZE - cq_file.file_from_offset) // CQ_STORE_UNIT_SIZE
        n = min(first + scan_units, cq_file.wrote_position // CQ_STORE_UNIT_SIZE)
        units = cq_file.read(first * CQ_STORE_UNIT_SIZE, max(n - first, 0) * CQ_STORE_UNIT_SIZE)
        status, i, out, count = _scan(
            commitlog, units, 0, len(units) // CQ_STORE_UNIT_SIZE, max_msg_nums, message_filter,
            limits,
        )  # fmt: skip
    finally:
        cq_file.release()
    return GetMessageResult(status, offset + i, min_offset, max_offset, out, count)


def _scan(
    commitlog: CommitLog,
    units: Buffer,
    i: int,
    n: int,
    max_msg_nums: int,
    message_filter: MessageFilter | None,
    limits: TransferLimits,
) -> tuple[GetStatus, int, bytes, int]:
    """The loop over units ``i`` to ``n`` of ``units``: (status, unit reached,
    records, message count)."""
    codes = message_filter.tags_codes if message_filter is not None else None
    confirm = message_filter is not None and message_filter.needs_commit_log_check
    in_memory_from = commitlog.max_offset - limits.memory_window_bytes
    out: list[bytes] = []
    status = GetStatus.NO_MATCHED_MESSAGE
    count = total = 0
    skip_below = -1  # records below here are gone: RocketMQ's nextPhyFileStartOffset
    mf: MappedFile | None = None  # the CommitLog file being read, held (see hold())
    log: Buffer = b""
    base = end = 0
    gather = _records.gather
    find = commitlog.files.find_by_offset
    try:
        while i < n:
            phy, size, _ = UNIT.unpack_from(units, i * CQ_STORE_UNIT_SIZE)
            if phy < skip_below or size <= 0 or size == BLANK_UNIT_SIZE:
                i += 1  # gone, or a filler unit (a padded hole): no record to read
                continue
            if not base <= phy < base + end:
                # The record is in another CommitLog file than the one held, if any.
                if mf is not None:
                    mf.release()
                    mf, log, base, end = None, b"", 0, 0
                found = find(phy)
                if (
                    found is not None
                    and phy - found.file_from_offset + size <= found.wrote_position
                    and found.hold()
                ):
                    mf, log, base, end = (
                        found,
                        found.buffer,
                        found.file_from_offset,
                        found.wrote_position,
                    )
                else:
                    # The record is gone (its file expired): skip the rest of that file.
                    if total == 0:
                        status = GetStatus.MESSAGE_WAS_REMOVING
                    skip_below = commitlog.roll_next_file(phy)
                    i += 1
                    continue
            i, count, total, stop = gather(
                units,
                i,
                n,
                log,
                base,
                end,
                count,
                total,
                max_msg_nums,
                in_memory_from,
                limits.max_bytes_in_memory,
                limits.max_count_in_memory,
                limits.max_bytes_in_disk,
                limits.max_count_in_disk,
                codes,
                confirm,
                out,
            )
            if stop == _records.GATHER_DONE or stop == _records.GATHER_FULL:
                break
            if stop == _records.GATHER_CONFIRM:
                # The filter must see this record's properties.
                assert message_filter is not None
                phy, size, _ = UNIT.unpack_from(units, i * CQ_STORE_UNIT_SIZE)
                rel = phy - base
                if message_filter.is_matched_by_commit_log(record_properties(log, rel)):
                    out.append(bytes(log[rel : rel + size]))
                    count += 1
                    total += size
                elif total == 0:
                    status = GetStatus.NO_MATCHED_MESSAGE
                i += 1
            # GATHER_ELSEWHERE: unit i's record is outside the held file; the next
            # round switches files (filler units never get here: both loops skip them).
    finally:
        if mf is not None:
            mf.release()
    if count:
        status = GetStatus.FOUND
    return status, i, out[0] if len(out) == 1 else b"".join(out), count
