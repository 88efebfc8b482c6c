"""MessageStore's side of replication: the confirm offset, transfer reads,
replicated appends and durable truncation (docs/replication.md, "The store's side").

A mixin of :class:`basalt.store.message_store.MessageStore`; no network here.

* **Confirm offset** (controller mode): :meth:`ReplicaLog.set_confirm_offset`
  moves the dispatcher's bound (:attr:`ReputMessageService.confirm_offset`) and
  the checkpoint's ``confirmPhyOffset``; it only grows (but for
  :meth:`~ReplicaLog.truncate_to`) and never passes the CommitLog's end.
* **Transfer** (master): :meth:`ReplicaLog.read_for_transfer` returns whole
  records, or one end-of-file blank alone, from one CommitLog file.
* **Replicated append** (slave): :meth:`ReplicaLog.append_replicated` checks a
  frame (framing, PHYSICALOFFSET, every CRC) and writes it byte-identical at
  the CommitLog's end, so a slave's files are the master's. A master's put and
  a replicated append on one store are never mixed - whether a store takes
  sends or frames is the replication service's decision - and the offset check
  catches a mix: a put moves the end, so the next frame's offset no longer
  matches and is refused (:class:`ReplicaOffsetError`) rather than written.
* **Durable truncation** (RocketMQ #10666): :meth:`ReplicaLog.truncate_to`, the
  marker and the cut in :mod:`basalt.store.truncation`.

Concurrency: appends hold the CommitLog's put lock; the confirm offset its own lock.
"""

from __future__ import annotations

import asyncio
import struct
import threading
import zlib
from collections.abc import Callable
from typing import TYPE_CHECKING

from basalt.common import _records
from basalt.common.record import BLANK_MAGIC_CODE, MESSAGE_MAGIC_CODE, SIZE_AND_MAGIC
from basalt.store.checkpoint import StoreCheckpoint
from basalt.store.clock import Clock
from basalt.store.commitlog import END_FILE_MIN_BLANK_LENGTH, Appended, CommitLog, UnitRun
from basalt.store.config import MessageStoreConfig
from basalt.store.consume_queue_table import ConsumeQueueTable
from basalt.store.consumer_offset_file import decode_offsets
from basalt.store.consumer_offsets import ConsumerOffsetManager
from basalt.store.dispatcher import ReputMessageService
from basalt.store.epoch_file import EpochFile
from basalt.store.errors import CorruptRecordError, StoreClosedError, StoreError
from basalt.store.flush import GroupCommitService
from basalt.store.index_service import IndexService
from basalt.store.pop import PopStore
from basalt.store.pop_journal import decode_records
from basalt.store.queue_manifest import QueueManifest
from basalt.store.schedule import ScheduleMessageService, decode_delay_offsets
from basalt.store.timer.checkpoint import decode_progress
from basalt.store.truncation import check_cut_point, cut_commitlog, remove_marker, write_marker

REPLICA_STATE_MAGIC = 0x42525053  # "BRPS"
REPLICA_STATE_VERSION = 2
#: The replica state's head: magic, version, and the lengths of its parts.
_STATE_HEAD = struct.Struct(
    ">"
    "I"  # magic
    "I"  # version
    "I"  # consumer offsets length (consumerOffset.json's bytes)
    "I"  # pop state length (pop journal records: store.pop.PopStore.snapshot)
    "I"  # delay levels' progress length (delayOffset.json's bytes)
    "I"  # timers' progress length (store.timer.api.progress)
)
_STATE_CRC = struct.Struct(">I")

#: Window of the walk that reads queue offsets back from the CommitLog.
_WALK_WINDOW_BYTES = 4 * 1024 * 1024


class ReplicaOffsetError(StoreError, ValueError):
    """An offset a replication call cannot use: not the CommitLog's end (an
    append), below its first file, or not a record boundary."""

    def __init__(self, offset: int, reason: str) -> None:
        super().__init__(f"commitlog offset {offset}: {reason}")
        self.offset = offset
        self.reason = reason


class ReplicaDataError(StoreError, ValueError):
    """A replicated frame that is not whole, valid records (or one end-of-file blank)
    for where it would be written; nothing of it is written."""

    def __init__(self, offset: int, reason: str) -> None:
        super().__init__(f"replicated frame at {offset}: {reason}")
        self.offset = offset
        self.reason = reason


def walk_unit_runs(
    commitlog: CommitLog,
    start: int,
    end: int,
    on_runs: Callable[[list[UnitRun]], None],
    *,
    window_bytes: int = _WALK_WINDOW_BYTES,
) -> int:
    """Walk the CommitLog's records in ``[start, end)`` (the dispatcher's C walk:
    structure and PHYSICALOFFSET, no CRC) and give ``on_runs`` their ConsumeQueue
    runs, in order; returns where the walk stopped (``end``, or the end of data).
    Raises CorruptRecordError at a record that does not parse."""
    window = bytearray(max(min(window_bytes, end - start), 8))
    topics: dict[bytes, str] = {}
    at = start
    while at < end:
        mf = commitlog.files.find_by_offset(at)
        if mf is None:
            break
        rel = at - mf.file_from_offset
        avail = min(mf.wrote_position, end - mf.file_from_offset) - rel
        if avail <= 0:
            break
        pos, kind, reason, _, _, runs, _, need = _records.dispatch(
            mf.fd, rel, avail, at, window, False, topics, commitlog.delays
        )
        if runs:
            on_runs(runs)
        if kind == _records.KIND_CORRUPT:
            raise CorruptRecordError(at + pos, reason)
        if kind == _records.KIND_BLANK:
            at = commitlog.roll_next_file(mf.file_from_offset)
            continue
        if kind == _records.KIND_MORE and pos == 0 and need > len(window):
            window = bytearray(need)
            continue
        if pos == 0:
            break
        at += pos
    return at


def advance_queue_offsets(commitlog: CommitLog, start: int, end: int) -> None:
    """Raise the CommitLog's next queue offsets to one past the last QUEUEOFFSET of
    each queue's records in ``[start, end)`` (records not dispatched: RocketMQ
    #7689, a restart above the confirm offset)."""
    table = commitlog.topic_queue_table

    def take(runs: list[UnitRun]) -> None:
        for topic, queue_id, first, count, _ in runs:
            key = (topic, queue_id)
            table[key] = max(table.get(key, 0), first + count)

    walk_unit_runs(commitlog, start, end, take)


class ReplicaLog:
    """The replication half of MessageStore (see the module docstring)."""

    config: MessageStoreConfig
    commitlog: CommitLog
    consume_queues: ConsumeQueueTable
    dispatcher: ReputMessageService
    index: IndexService | None
    _checkpoint: StoreCheckpoint | None
    _group_commit: GroupCommitService | None
    _epochs: EpochFile | None
    _confirm_lock: threading.Lock
    queue_manifest: QueueManifest
    clock: Clock
    consumer_offsets: ConsumerOffsetManager
    pop: PopStore
    schedule: ScheduleMessageService

    if TYPE_CHECKING:  # MessageStore's

        def timer_progress(self) -> bytes: ...

        def adopt_timer_progress(self, data: bytes) -> None: ...

    @property
    def epochs(self) -> EpochFile:
        """The epoch file, loaded at start (StoreClosedError before)."""
        if self._epochs is None:
            raise StoreClosedError("the store has not been started")
        return self._epochs

    @property
    def max_offset(self) -> int:
        """One past the CommitLog's last written byte."""
        return self.commitlog.max_offset

    @property
    def flushed_offset(self) -> int:
        """Everything below this CommitLog offset is fsynced."""
        return self.commitlog.files.flushed_where

    @property
    def confirm_offset(self) -> int:
        """Where dispatch stops: with ``enable_controller_mode`` the confirm offset
        (what every in-sync member has), otherwise the CommitLog's max offset."""
        bound = self.dispatcher.confirm_offset
        return self.commitlog.max_offset if bound is None else bound

    def set_confirm_offset(self, offset: int) -> None:
        """Move the confirm offset up to ``offset`` (clamped to the max offset; a
        lower one is ignored) and wake the dispatcher. It is persisted with the
        next checkpoint flush. A no-op without ``enable_controller_mode``.
        An offset inside a record dispatches up to the record before it."""
        if not self.config.enable_controller_mode:
            return
        with self._confirm_lock:
            current = self.dispatcher.confirm_offset or 0
            new = min(offset, self.commitlog.max_offset)
            if new <= current:
                return
            self.dispatcher.confirm_offset = new
            if self._checkpoint is not None:
                self._checkpoint.confirm_phy_offset = new
        # As after an append: the caller applies the newly confirmed hand-off
        # itself when the dispatcher is idle (a group of one confirms each send
        # on the loop that answers it), else the thread is woken.
        self.dispatcher.on_append()

    def _force_confirm_offset(self, offset: int) -> None:
        """Set the confirm offset to ``offset`` even if lower (truncation, start)."""
        if not self.config.enable_controller_mode:
            return
        with self._confirm_lock:
            self.dispatcher.confirm_offset = offset
            if self._checkpoint is not None:
                self._checkpoint.confirm_phy_offset = offset

    async def flush_to_async(self, offset: int) -> int:
        """Wait, off the event loop, until the CommitLog is fsynced up to ``offset``
        (clamped to the max offset); returns the flushed offset. Under SYNC_FLUSH
        this joins the group commit, otherwise it fsyncs on a worker thread."""
        target = min(offset, self.commitlog.max_offset)
        if self.flushed_offset >= target:
            return self.flushed_offset
        if self._group_commit is not None:
            await self._group_commit.request_async(target)
        else:
            await asyncio.to_thread(self.commitlog.files.flush)
        return self.flushed_offset

    # -- master: reads for transfer -------------------------------------------------

    def read_for_transfer(self, from_offset: int, max_bytes: int, end_offset: int) -> bytes:
        """The bytes to send a slave from ``from_offset``: whole records from the
        one CommitLog file holding it, at most ``max_bytes`` (but always the first
        record whole), never past ``end_offset`` (-1: no bound) nor the max
        offset; or that file's end-of-file blank alone (its 8-byte head: the
        rest of the file is zeros). Empty when nothing is there yet.

        Raises ReplicaOffsetError for an offset below the first file or that is
        no record's start (the record's PHYSICALOFFSET says so).
        """
        cl = self.commitlog
        end = cl.max_offset if end_offset < 0 else min(end_offset, cl.max_offset)
        if from_offset < cl.min_offset:
            raise ReplicaOffsetError(
                from_offset, f"below the commitlog's first offset {cl.min_offset}"
            )
        if from_offset >= end:
            return b""
        mf = cl.files.find_by_offset(from_offset)
        if mf is None or not mf.hold():
            raise ReplicaOffsetError(from_offset, "no commitlog file holds it (expired)")
        try:
            rel = from_offset - mf.file_from_offset
            stop = min(mf.wrote_position, end - mf.file_from_offset)
            buf = mf.buffer
            size, magic = SIZE_AND_MAGIC.unpack_from(buf, rel)
            if magic == BLANK_MAGIC_CODE and size == mf.file_size - rel:
                # A frame of its own: it moves the slave to the next file.
                return bytes(buf[rel : rel + SIZE_AND_MAGIC.size]) if stop >= mf.file_size else b""
            if magic != MESSAGE_MAGIC_CODE:
                raise ReplicaOffsetError(from_offset, "no record starts here")
            limit = min(stop, rel + max(max_bytes, size))
            pos, _, reason, _, _, _ = _records.scan(buf, rel, limit, mf.file_from_offset, False, -1)
            if pos == rel:
                if rel + size > stop:
                    return b""  # its end is past the bound: not yet
                raise ReplicaOffsetError(from_offset, f"no record starts here: {reason}")
            return bytes(buf[rel:pos])
        finally:
            mf.release()

    # -- slave: replicated appends ------------------------------------------------

    def append_replicated(self, offset: int, data: bytes) -> int:
        """Write a master's frame byte-identical at ``offset`` and return the new max
        offset.

        ``offset`` must be the CommitLog's max offset (an empty CommitLog takes a
        file boundary: its first file starts there), else ReplicaOffsetError.
        ``data`` must be whole records, each with valid framing, its own offset
        in PHYSICALOFFSET and a matching CRC, leaving room for the end-of-file
        blank as the master's appends do - or one end-of-file blank filling
        the rest of the current file - else ReplicaDataError and nothing is
        written. Requires the master's ``mapped_file_size_commit_log``. The
        next queue offsets follow the records' QUEUEOFFSETs, and the records
        go to the dispatcher (which still stops at the confirm offset).
        Raises StoreClosedError once the store is shut down, OSError if the
        write fails.
        """
        cl = self.commitlog
        if not data:
            raise ReplicaDataError(offset, "empty frame")
        with cl.put_lock:
            if cl.closed_for_writes:
                raise StoreClosedError("the store is shut down")
            if not cl.files.files:
                if offset % cl.mapped_file_size:
                    raise ReplicaOffsetError(offset, "an empty commitlog starts at a file boundary")
                mf = cl.files.get_last_mapped_file(offset)
            else:
                if offset != cl.max_offset:
                    raise ReplicaOffsetError(
                        offset, f"not the commitlog's max offset {cl.max_offset}"
                    )
                mf = cl.files.get_last_mapped_file(0)
            rel = offset - mf.file_from_offset
            size, magic = SIZE_AND_MAGIC.unpack_from(data, 0) if len(data) >= 8 else (0, 0)
            if magic == BLANK_MAGIC_CODE:
                if len(data) != SIZE_AND_MAGIC.size or size != mf.file_size - rel:
                    raise ReplicaDataError(
                        offset,
                        f"end-of-file blank of {size} bytes ({len(data)} sent) but "
                        f"{mf.file_size - rel} remain in the file",
                    )
                mf.append(data)
                mf.wrote_position = mf.file_size
                cl.files.get_last_mapped_file(0)  # the next file, as a master's roll makes it
                runs: list[UnitRun] = []
                records = 0
                last_ts = mf.store_timestamp_ms
            else:
                if rel + len(data) + END_FILE_MIN_BLANK_LENGTH > mf.file_size:
                    raise ReplicaDataError(
                        offset,
                        f"{len(data)} bytes do not fit the file's {mf.file_size - rel} "
                        "free bytes with its end-of-file blank (a different "
                        "mapped_file_size_commit_log than the master's?)",
                    )
                pos, kind, reason, last_ts, _, records = _records.scan(
                    data, 0, len(data), offset, True, -1
                )
                if pos != len(data) or kind != _records.KIND_END:
                    why = reason or "not a message record"
                    raise ReplicaDataError(offset, f"record at {offset + pos}: {why}")
                mf.append(data)
                mf.store_timestamp_ms = last_ts
                cl.note_store_timestamp(last_ts)
                runs = []
                walk_unit_runs(cl, offset, offset + len(data), runs.extend, window_bytes=len(data))
                table = cl.topic_queue_table
                for topic, queue_id, first, count, _ in runs:
                    table[topic, queue_id] = first + count
                cl.handoff.append(Appended(offset, offset + len(data), last_ts, records, runs))
            new_max = cl.max_offset
        cl.notify_appended()
        return new_max

    # -- slave: durable truncation ------------------------------------------------

    def truncate_to(self, offset: int) -> None:
        """Cut the log at ``offset`` durably (RocketMQ #10666; see
        :mod:`basalt.store.truncation`): nothing at or past it comes back, even
        after a crash at any point, and the next queue offsets continue from the
        records below it. The confirm offset and the flushed offset are clamped
        to it, and epoch entries starting at or past it dropped.

        ``offset`` must be a record boundary in ``[min offset, max offset]``
        (else ReplicaOffsetError, nothing changed). Stops and restarts the
        dispatcher around the cut; appends wait on the put lock meanwhile.
        Raises StoreClosedError once the store is shut down, OSError from a
        write (the marker then stays, and the next start finishes the cut).
        """
        cl = self.commitlog
        dispatcher = self.dispatcher
        running = dispatcher.running
        dispatcher.shutdown(drain=False)
        try:
            with cl.put_lock:
                if cl.closed_for_writes:
                    raise StoreClosedError("the store is shut down")
                why = check_cut_point(cl, offset)
                if why is not None:
                    raise ReplicaOffsetError(offset, why)
                marker = self.config.truncate_marker_path
                write_marker(marker, offset)
                cl.files.flush()  # what stays is durable before anything is cut
                cut_commitlog(cl, offset)
                cl.handoff.clear()
                self._after_cut(offset)
                remove_marker(marker)
        finally:
            if running:
                dispatcher.start()

    def _after_cut(self, offset: int) -> None:
        """Everything but the CommitLog itself, after a cut at ``offset`` (a live
        truncation, or a start redoing one after :meth:`recover`)."""
        cl = self.commitlog
        dispatcher = self.dispatcher
        for cq in self.consume_queues:
            cq.truncate_dirty(offset)
        if self.index is not None:
            self.index.truncate_from(offset)
        dispatcher.reput_from_offset = min(dispatcher.reput_from_offset, offset)
        table = cl.topic_queue_table
        table.clear()
        for cq in self.consume_queues:
            table[cq.topic, cq.queue_id] = cq.max_offset_in_queue
        advance_queue_offsets(cl, dispatcher.reput_from_offset, offset)
        if dispatcher.confirm_offset is not None:
            self._force_confirm_offset(min(dispatcher.confirm_offset, offset))
        self.consume_queues.flush()
        # The manifest may list offsets past the cut: a later start would keep them.
        self.queue_manifest.write_if_due(
            self.consume_queues.max_offsets(), self.clock.now_ms(), final=True
        )
        if self._checkpoint is not None:
            self._checkpoint.flush()
        self.epochs.truncate_from(offset)

    # -- consumer offsets and pop state ------------------------------------------

    def replica_state(self) -> bytes:
        """The consumer offsets, the pop state and the progress of the delay
        levels and of the timers, for a slave to install::

        [magic "BRPS" 4][version 2: 4]
        [offsets length 4][pop length 4][delay length 4][timer length 4]
        [consumerOffset.json's bytes][pop journal records][delayOffset.json's bytes]
        [timer progress][crc32 4 of all before]
        """
        parts = (
            self.consumer_offsets.snapshot(),
            self.pop.snapshot(),
            self.schedule.progress(),
            self.timer_progress(),
        )
        head = _STATE_HEAD.pack(
            REPLICA_STATE_MAGIC, REPLICA_STATE_VERSION, *(len(part) for part in parts)
        )
        body = head + b"".join(parts)
        return body + _STATE_CRC.pack(zlib.crc32(body))

    def install_replica_state(self, data: bytes) -> None:
        """Replace this store's consumer offsets and pop state with a
        :meth:`replica_state`'s, persisted before it returns. Raises
        ReplicaDataError when ``data`` is not one (nothing changed)."""
        size = len(data) - _STATE_CRC.size
        if size < _STATE_HEAD.size:
            raise ReplicaDataError(-1, f"replica state of {len(data)} bytes")
        magic, version, *lengths = _STATE_HEAD.unpack_from(data, 0)
        if magic != REPLICA_STATE_MAGIC or version != REPLICA_STATE_VERSION:
            raise ReplicaDataError(-1, f"not a replica state (magic {magic:#x}, version {version})")
        if _STATE_HEAD.size + sum(lengths) != size:
            raise ReplicaDataError(-1, "replica state lengths do not add up")
        (crc,) = _STATE_CRC.unpack_from(data, size)
        if crc != zlib.crc32(data[:size]):
            raise ReplicaDataError(-1, "replica state CRC mismatch")
        parts, start = [], _STATE_HEAD.size
        for length in lengths:
            parts.append(data[start : start + length])
            start += length
        offsets, pop, delays, timers = parts
        try:
            # All checked before any is installed: a bad part changes nothing.
            decode_offsets(offsets)
            ends = [end for end, _ in decode_records(pop)]
            if (ends[-1] if ends else 0) != len(pop):
                raise ValueError("the pop state is not whole journal records")
            decode_delay_offsets(delays)
            decode_progress(timers)
            self.consumer_offsets.install(offsets)
            self.pop.install_snapshot(pop)
            self.schedule.adopt(delays)
            self.adopt_timer_progress(timers)
        except ValueError as e:
            raise ReplicaDataError(-1, f"replica state: {e}") from None
