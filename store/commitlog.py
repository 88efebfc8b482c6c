"""The CommitLog: every message of every topic, appended to one run of files.

Record layout: see :mod:`basalt.common.record`. This module owns the single writer:
the put lock, the table of next queue offsets per (topic, queue id), rolling
to a new file behind an end-of-file blank, and reads by physical offset.

A file whose free tail cannot hold the next record plus an 8-byte blank ends
with that blank; the record goes to the next file::

    blank:  [int TOTALSIZE: the free bytes][int MAGICCODE 0xCBD43194]

Concurrency: :meth:`CommitLog.append` holds the put lock, so any thread may
call it; reads are lock-free below the write position.
"""

from __future__ import annotations

import struct
import threading
from collections import deque
from collections.abc import Callable
from typing import NamedTuple

from basalt.common import _records, record
from basalt.common.message import MessageRecord, encode_host
from basalt.common.record import (
    BLANK_MAGIC_CODE,
    MESSAGE_MAGIC_CODE,
    MIN_RECORD_SIZE,
    SIZE_AND_MAGIC,
    decode_record,
    store_timestamp_at,
)
from basalt.store.batch import EncodedBatch
from basalt.store.clock import Clock
from basalt.store.config import MessageStoreConfig
from basalt.store.errors import CorruptRecordError, StoreClosedError
from basalt.store.mapped_file_queue import MappedFileQueue

_INT = struct.Struct(">i")
#: The end-of-file blank: TOTALSIZE (the bytes it fills) + BLANK_MAGIC_CODE.
BLANK = SIZE_AND_MAGIC
#: A file keeps room for the end-of-file blank: TOTALSIZE(4) + MAGICCODE(4).
END_FILE_MIN_BLANK_LENGTH = BLANK.size


#: (topic, queue id, first queue offset, unit count, packed ConsumeQueue units)
UnitRun = tuple[str, int, int, int, bytes]


class Appended(NamedTuple):
    """One append as the writer hands it to the dispatcher (in CommitLog order)."""

    #: Physical offset of the first record (past any end-of-file blank before it).
    start: int
    end: int
    store_timestamp_ms: int
    records: int
    runs: list[UnitRun]


#: Appends the dispatcher has not taken yet; past this many the oldest are dropped
#: and the dispatcher reads those records back from the CommitLog instead.
HANDOFF_MAX_APPENDS = 4096


class AppendResult(NamedTuple):
    """Where a batch landed: one entry per message, in order."""

    physical_offsets: tuple[int, ...]
    queue_offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    store_timestamp_ms: int
    #: One past the last byte written: the offset a SYNC send waits to see flushed.
    end_offset: int


class CommitLog:
    """The message log of one store root."""

    def __init__(self, config: MessageStoreConfig, *, read_only: bool = False) -> None:
        self.config = config
        self.files = MappedFileQueue(
            config.commitlog_dir,
            config.mapped_file_size_commit_log,
            read_only=read_only,
            # A short file is padded and a missing one recreated empty: recovery
            # reads on past what they lost (store.resync).
            repair_unit=1,
            fill_gaps=True,
        )
        self.store_host = encode_host(config.store_host)
        #: Each delay level's delay: SCHEDULE_TOPIC_XXXX's tagsCode is a due time.
        self.delays = config.delay_levels_ms
        #: Told each fsync's duration in seconds, on the flushing thread (the flush
        #: service's or the group commit's): must be quick and must not raise.
        self.flush_listeners: list[Callable[[float], None]] = []
        #: Next queue offset per (topic, queue id); guarded by ``put_lock``.
        self.topic_queue_table: dict[tuple[str, int], int] = {}
        self.put_lock = threading.Lock()
        self._on_append: list[Callable[[], None]] = []
        #: What every append stamped, for the dispatcher (see Appended); written
        #: under the put lock so its order is the CommitLog's.
        self.handoff: deque[Appended] = deque(maxlen=HANDOFF_MAX_APPENDS)
        self.closed_for_writes = False
        self._last_store_timestamp_ms = 0

    def close_for_writes(self) -> None:
        """Refuse every later append; waits for an append in progress to finish."""
        with self.put_lock:
            self.closed_for_writes = True

    def on_append(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (cheaply, on the writer's thread) after every append."""
        self._on_append.append(callback)

    @property
    def mapped_file_size(self) -> int:
        return self.files.mapped_file_size

    @property
    def min_offset(self) -> int:
        return self.files.min_offset

    @property
    def max_offset(self) -> int:
        return self.files.max_offset

    def roll_next_file(self, offset: int) -> int:
        """The start of the file after the one holding ``offset``."""
        size = self.mapped_file_size
        return offset + size - offset % size

    def append(self, batch: EncodedBatch, clock: Clock) -> AppendResult:
        """Validate, stamp and append a batch back to back, assigning offsets.

        The batch must fit an empty file with room for the end-of-file blank
        (the caller checks: MessageStore refuses bigger ones). A batch that does not fit the
        current file's tail closes the file with a blank and goes whole to the
        next file (RocketMQ's END_OF_FILE). The store timestamp is read from
        ``clock`` under the lock, so it never goes backwards along the log.
        Raises ValueError naming the first malformed record (nothing is
        written), StoreClosedError after :meth:`close_for_writes`, OSError if
        the write or a new file fails (nothing is counted).
        """
        data = batch.data
        with self.put_lock:
            if self.closed_for_writes:
                raise StoreClosedError("the store is shut down")
            # Never backwards along the log, even if the wall clock steps back:
            # recovery's start file and re-dispatch point rely on that order.
            store_timestamp_ms = max(clock.now_ms(), self._last_store_timestamp_ms)
            mf = self.files.get_last_mapped_file(0)
            used = mf.wrote_position
            roll = used + len(data) + END_FILE_MIN_BLANK_LENGTH > mf.file_size
            base = mf.file_end_offset if roll else mf.file_from_offset + used
            table = self.topic_queue_table
            # Queue offsets are merged into the table only once the bytes are
            # written, so a refused or failed batch consumes none.
            pending: dict[tuple[str, int], int] = {}
            physical: tuple[int, ...] = ()
            queue: tuple[int, ...] = ()
            sizes: tuple[int, ...] = ()
            unit_runs: list[UnitRun] = []
            for run in batch.runs:
                key = (run.topic, run.queue_id)
                first = pending.get(key)
                if first is None:
                    first = table.get(key, 0)
                pending[key], run_phys, run_queue, run_sizes, units = _records.stamp(
                    data,
                    run.start,
                    run.end,
                    base + run.start,
                    first,
                    store_timestamp_ms,
                    self.store_host,
                    run.topic.encode(),
                    run.queue_id,
                    self.config.max_message_size,
                    batch.from_producer,
                    self.delays,
                )
                physical += run_phys
                queue += run_queue
                sizes += run_sizes
                if units:
                    unit_runs.append((run.topic, run.queue_id, first, len(units) // 20, units))
            if roll:
                mf.append(BLANK.pack(mf.file_size - used, BLANK_MAGIC_CODE))
                mf.wrote_position = mf.file_size
                mf.store_timestamp_ms = store_timestamp_ms
                mf = self.files.get_last_mapped_file(0)
            mf.append(data)
            mf.store_timestamp_ms = store_timestamp_ms
            self._last_store_timestamp_ms = store_timestamp_ms
            table.update(pending)
            end = mf.file_from_offset + mf.wrote_position
            self.handoff.append(Appended(base, end, store_timestamp_ms, len(sizes), unit_runs))
        for callback in self._on_append:
            callback()
        return AppendResult(physical, queue, sizes, store_timestamp_ms, end)

    def note_store_timestamp(self, store_timestamp_ms: int) -> None:
        """A replicated append's last store time (under the put lock): later appends
        never stamp an earlier one."""
        self._last_store_timestamp_ms = max(self._last_store_timestamp_ms, store_timestamp_ms)

    def notify_appended(self) -> None:
        """Run the on-append callbacks (outside the put lock), as after append()."""
        for callback in self._on_append:
            callback()

    # -- reads ------------------------------------------------------------------------

    def read(self, physical_offset: int, size: int) -> bytes | None:
        """``size`` bytes at ``physical_offset``, or None if not (or no longer) stored."""
        mf = self.files.find_by_offset(physical_offset)
        if mf is None:
            return None
        pos = physical_offset - mf.file_from_offset
        if size <= 0 or pos + size > mf.wrote_position:
            return None
        return mf.read(pos, size)

    def store_timestamp_at(self, physical_offset: int) -> int:
        """STORETIMESTAMP of the record at ``physical_offset``; -1 if none is stored there."""
        mf = self.files.find_by_offset(physical_offset)
        if mf is None:
            return -1
        pos = physical_offset - mf.file_from_offset
        if pos + MIN_RECORD_SIZE > mf.wrote_position:
            return -1
        try:
            size, magic = SIZE_AND_MAGIC.unpack_from(mf.buffer, pos)
            if magic != MESSAGE_MAGIC_CODE or size < MIN_RECORD_SIZE:
                return -1  # no record starts here
            return store_timestamp_at(mf.buffer, pos)
        except ValueError:  # unmapped by an expiry meanwhile
            return -1

    def record_size_at(self, physical_offset: int) -> int | None:
        head = self.read(physical_offset, 4)
        return None if head is None else _INT.unpack(head)[0]

    def get_record(self, physical_offset: int, size: int | None = None) -> MessageRecord | None:
        """Decode the record at ``physical_offset``; None if nothing is stored there.

        Raises CorruptRecordError when bytes are there but are not a record.
        """
        if size is None:
            size = self.record_size_at(physical_offset)
            if size is None:
                return None
        data = self.read(physical_offset, size)
        if data is None:
            return None
        try:
            return decode_record(data)
        except record.CorruptRecordError as e:  # where it is in the log, not in ``data``
            raise CorruptRecordError(physical_offset + e.offset, e.reason) from None

    def close(self) -> None:
        self.files.close()
