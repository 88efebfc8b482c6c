"""Pop-and-ack consumer state: RocketMQ 5's POP, kept by the store that owns the queues.

A pop consumer (RocketMQ 5's SimpleConsumer and PushConsumer) does not track
offsets: it asks for messages, each comes back invisible to the group for a
while, and the consumer acks it by a receipt handle. Per (group, topic, queue)
this module keeps

* a **cursor**: the next queue offset never delivered to the group;
* an **in-flight table**: queue offset -> (visible-at ms, attempts, nonce), one
  entry per delivered message not acked yet.

:meth:`PopStore.pop` first redelivers in-flight messages whose visible-at has
passed (attempt + 1, a new nonce, the record read again from the
ConsumeQueue: no copy to a retry topic), then new ones from the cursor. An ack
or a change of invisible time names the delivery by its nonce: a handle of an
earlier delivery of the same message is stale. The group's committed offset is
the lowest offset not acked (the cursor when nothing is in flight); it is fed
to :class:`basalt.store.consumer_offsets.ConsumerOffsetManager`, so consumer
progress, lag and reset by time treat pop groups as pull groups.

Journal
-------

``<root>/pop/journal``: the changes, appended in order and replayed at start
(the record format is :mod:`basalt.store.pop_journal`'s). Replay stops at the
first record that is short or fails its CRC - the torn tail of a crash - and
truncates the file there. When the journal passes ``compact_bytes`` it is
rewritten as the live state (a CURSOR per queue, an INFLIGHT per entry) in
``journal.compact``, fsynced and renamed over the journal.

Crash semantics
---------------

Records are written with ``os.write`` before the call returns, so a killed
process loses none (they are in the page cache); fsync follows the store's
flush setting: every write under SYNC_FLUSH, else at the first write after
``fsync_interval_ms``. :meth:`PopStore.batch` runs several operations (the
pops and acks of concurrent calls) with their records written once at its
end, before it returns: one write and, where one is due, one fsync for all
of them. A machine crash loses at most the unsynced tail, and losing any
tail only moves state *back*: a lost ACK redelivers its message, a lost
INFLIGHT or CURSOR redelivers from the older cursor. Nothing is lost and the
cursor never passes an un-acked offset, because an offset leaves the cursor
only into the in-flight table, in the same record. RESET is always fsynced.

Concurrency: every public method takes one (re-entrant) lock; calls may come
from any thread. A :meth:`PopStore.batch` holds it throughout.
"""

from __future__ import annotations

import enum
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, TypeVar

from basalt.common.record import PREFIX, split_records
from basalt.store.consumer_offsets import ConsumerOffsetManager
from basalt.store.errors import StoreError
from basalt.store.files import fsync_dir, set_aside
from basalt.store.get_message import GetMessageResult, GetStatus
from basalt.store.message_filter import MessageFilter
from basalt.store.pop_journal import (
    JOURNAL_NAME,
    Kind,
    decode_records,
    encode_record,
    not_a_journal,
)

log = logging.getLogger(__name__)

#: Compact once the journal passes this size (and holds mostly dead records).
DEFAULT_COMPACT_BYTES = 8 << 20


class AckStatus(enum.Enum):
    """Outcome of :meth:`PopStore.ack` and :meth:`PopStore.change_invisible`."""

    OK = "OK"
    #: Not in flight (never delivered, acked already, reset) or another
    #: delivery's nonce: RocketMQ 5's INVALID_RECEIPT_HANDLE.
    STALE = "STALE"


class PopReads(Protocol):
    """What :class:`PopStore` reads of the store (MessageStore provides it)."""

    def get_message(
        self,
        group: str,
        topic: str,
        queue_id: int,
        offset: int,
        max_msg_nums: int,
        message_filter: MessageFilter | None = None,
    ) -> GetMessageResult: ...

    def get_min_offset_in_queue(self, topic: str, queue_id: int) -> int: ...

    def get_max_offset_in_queue(self, topic: str, queue_id: int) -> int: ...


@dataclass(frozen=True, slots=True)
class PoppedMessage:
    """One delivery: the record as stored and what its receipt handle needs."""

    queue_id: int
    queue_offset: int
    commit_log_offset: int
    #: 1 on the first delivery, +1 on each redelivery.
    attempt: int
    nonce: int
    #: When the message becomes visible again unless acked, Unix ms.
    visible_at_ms: int
    record: bytes


@dataclass(frozen=True, slots=True)
class ChangeResult:
    """Outcome of :meth:`PopStore.change_invisible`: a new nonce when OK."""

    status: AckStatus
    nonce: int = 0
    visible_at_ms: int = 0


@dataclass(frozen=True, slots=True)
class PopLoadReport:
    """What :meth:`PopStore.load` replayed."""

    records: int
    #: Bytes of a torn or damaged tail cut off the journal.
    truncated_bytes: int
    queues: int
    in_flight: int
    #: Where a journal folder or journal that was not one went (``<root>/quarantine/``):
    #: the pop state started empty.
    set_aside: tuple[str, ...] = ()


@dataclass(slots=True)
class _Entry:
    visible_at_ms: int
    attempts: int
    nonce: int


@dataclass(slots=True)
class _Queue:
    cursor: int
    in_flight: dict[int, _Entry] = field(default_factory=dict)

    def committed(self) -> int:
        return min(self.in_flight, default=self.cursor)


_Key = tuple[str, str, int]
T = TypeVar("T")
#: One ack of :meth:`PopStore.ack_many`: (queue id, queue offset, nonce).
AckEntry = tuple[int, int, int]


class PopStore:
    """The pop tables of one store root, journaled in ``directory``.

    ``fsync_interval_ms`` 0 fsyncs every write (SYNC_FLUSH); otherwise a write
    fsyncs when the last fsync is older than that. Call :meth:`load` once
    before use and :meth:`close` at the end.
    """

    def __init__(
        self,
        directory: Path,
        reads: PopReads,
        offsets: ConsumerOffsetManager,
        *,
        fsync_interval_ms: int = 0,
        compact_bytes: int = DEFAULT_COMPACT_BYTES,
        quarantine_dir: Path | None = None,
    ) -> None:
        """``quarantine_dir`` receives a journal folder or journal that is not one
        (default: ``quarantine`` beside ``directory``)."""
        self.directory = directory
        self.quarantine_dir = quarantine_dir or directory.parent / "quarantine"
        self.path = directory / JOURNAL_NAME
        self._reads = reads
        self._offsets = offsets
        self._fsync_interval_ms = fsync_interval_ms
        self.compact_bytes = compact_bytes
        self._lock = threading.RLock()
        self._queues: dict[_Key, _Queue] = {}
        #: Records held back by a running :meth:`batch` (None: none runs).
        self._pending: list[bytes] | None = None
        self._fd = -1
        self._size = 0
        self._last_fsync_ns = 0
        #: Journal compactions since load (tests, runtime info).
        self.compactions = 0

    # -- lifecycle ----------------------------------------------------------------

    def load(self) -> PopLoadReport:
        """Replay the journal (creating it when missing), cutting a torn tail.

        A journal folder that is not a folder (a file, a dangling link), or a
        journal that is not a file (a folder), is set aside to the quarantine
        folder and logged at ERROR; the pop state then starts empty, as after a
        lost journal: every queue starts again at its group's committed offset,
        so messages that were in flight are delivered again, none is skipped.
        Raises OSError when the journal cannot be read or written otherwise.
        """
        moved = self._set_aside_what_is_not_a_journal()
        self.directory.mkdir(parents=True, exist_ok=True)
        data = self.path.read_bytes() if self.path.exists() else b""
        end = count = 0
        for past, rec in decode_records(data):
            self._apply(*rec)
            end, count = past, count + 1
        truncated = len(data) - end
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        if truncated:
            log.warning("pop journal %s: cut %d damaged bytes at %d", self.path, truncated, end)
            os.ftruncate(self._fd, end)
            os.fsync(self._fd)
        fsync_dir(self.directory)
        self._size = end
        # The offsets file is saved every few seconds, the journal at once: after a
        # crash the journal's committed offsets are the newer ones.
        for (group, topic, queue_id), q in self._queues.items():
            self._publish(group, topic, queue_id, q)
        in_flight = sum(len(q.in_flight) for q in self._queues.values())
        return PopLoadReport(count, truncated, len(self._queues), in_flight, moved)

    def _set_aside_what_is_not_a_journal(self) -> tuple[str, ...]:
        """Move a journal folder that is no folder, or a journal that is no regular
        file, to the quarantine (logged at ERROR); returns where each went."""
        moved: list[str] = []
        for path, name, what in not_a_journal(self.directory):
            target = set_aside(path, self.quarantine_dir, name)
            log.error(
                "pop journal %s is not a %s: set aside as %s; the pop state starts empty "
                "(each queue from its group's committed offset: messages in flight are "
                "delivered again)",
                path, what, target,
            )  # fmt: skip
            moved.append(str(target))
        return tuple(moved)

    def close(self) -> None:
        """fsync and close the journal."""
        with self._lock:
            if self._fd >= 0:
                os.fsync(self._fd)
                os.close(self._fd)
                self._fd = -1

    # -- the operations ------------------------------------------------------------

    def batch(self, work: Callable[[], T]) -> T:
        """Run ``work`` - calls of this store's operations - holding the lock,
        with the journal records they make written once, when it ends (also
        when it raises): one ``os.write`` and at most one fsync for all of
        them, before this returns. A :meth:`reset` inside writes at once, the
        records before it first. Returns what ``work`` returns."""
        with self._lock:
            if self._pending is not None:  # nested: the outer batch writes
                return work()
            self._pending = []
            try:
                return work()
            finally:
                records, self._pending = self._pending, None
                if records:
                    self._append(records)

    def pop(
        self,
        group: str,
        topic: str,
        queue_id: int,
        max_messages: int,
        invisible_ms: int,
        now_ms: int,
        *,
        fifo: bool = False,
        message_filter: MessageFilter | None = None,
    ) -> list[PoppedMessage]:
        """Deliver up to ``max_messages`` of one queue to ``group``, invisible for
        ``invisible_ms``: due in-flight ones first (oldest offset first), then
        new ones from the cursor that match ``message_filter`` (the others are
        skipped for good, as if acked). With ``fifo`` nothing new is delivered
        while any of the queue's messages is in flight. Raises ValueError for
        ``max_messages`` < 1 or ``invisible_ms`` < 1."""
        if max_messages < 1 or invisible_ms < 1:
            raise ValueError(f"max_messages {max_messages}, invisible_ms {invisible_ms}: >= 1")
        with self._lock:
            key = (group, topic, queue_id)
            q = self._queue(key)
            out: list[bytes] = []
            visible_at = now_ms + invisible_ms
            popped: list[PoppedMessage] = []
            self._clamp(key, q, out)
            for offset in sorted(o for o, e in q.in_flight.items() if e.visible_at_ms <= now_ms):
                if len(popped) == max_messages:
                    break
                record = self._read_one(group, topic, queue_id, offset)
                if record is None:  # expired meanwhile: nothing left to deliver
                    del q.in_flight[offset]
                    out.append(encode_record(Kind.ACK, group, topic, queue_id, offset))
                    continue
                entry = q.in_flight[offset]
                entry.attempts += 1
                entry.nonce, entry.visible_at_ms = _nonce(), visible_at
                popped.append(self._deliver(key, offset, entry, record, out))
            if not (fifo and q.in_flight):
                self._pop_new(
                    key, q, max_messages - len(popped), visible_at, message_filter, popped, out
                )
            self._write(out, key, q)
            return popped

    def ack(
        self, group: str, topic: str, queue_id: int, queue_offset: int, nonce: int
    ) -> AckStatus:
        """Remove a delivery from flight: OK, or STALE when ``nonce`` is not the
        message's current delivery (or it is not in flight)."""
        return self.ack_many(group, topic, [(queue_id, queue_offset, nonce)])[0]

    def ack_many(self, group: str, topic: str, entries: Sequence[AckEntry]) -> list[AckStatus]:
        """:meth:`ack` of each entry, in order, journaled as one write (each
        queue's committed offset published once)."""
        with self._lock:
            out: list[AckStatus] = []
            records: list[bytes] = []
            touched: dict[_Key, _Queue] = {}
            for queue_id, queue_offset, nonce in entries:
                key = (group, topic, queue_id)
                q = self._queues.get(key)
                entry = q.in_flight.get(queue_offset) if q is not None else None
                if q is None or entry is None or entry.nonce != nonce:
                    out.append(AckStatus.STALE)
                    continue
                del q.in_flight[queue_offset]
                records.append(encode_record(Kind.ACK, group, topic, queue_id, queue_offset))
                touched[key] = q
                out.append(AckStatus.OK)
            if records:
                self._append(records)
                for key, q in touched.items():
                    self._publish(*key, q)
            return out

    def change_invisible(
        self,
        group: str,
        topic: str,
        queue_id: int,
        queue_offset: int,
        nonce: int,
        invisible_ms: int,
        now_ms: int,
    ) -> ChangeResult:
        """Make a delivery visible again ``invisible_ms`` from ``now_ms`` (0: at
        once); the old nonce becomes stale and the result carries the new one.
        Raises ValueError for a negative ``invisible_ms``."""
        if invisible_ms < 0:
            raise ValueError(f"invisible_ms {invisible_ms} is negative")
        with self._lock:
            key = (group, topic, queue_id)
            q = self._queues.get(key)
            entry = q.in_flight.get(queue_offset) if q is not None else None
            if q is None or entry is None or entry.nonce != nonce:
                return ChangeResult(AckStatus.STALE)
            entry.nonce, entry.visible_at_ms = _nonce(), now_ms + invisible_ms
            self._write([self._inflight_record(key, queue_offset, entry)], key, q)
            return ChangeResult(AckStatus.OK, entry.nonce, entry.visible_at_ms)

    def reset(self, group: str, topic: str, commit: Callable[[], T]) -> T:
        """Drop the (group, topic)'s tables and run ``commit`` (which stores the
        reset offsets) under the same lock, so no pop publishes an older
        committed offset in between; returns what ``commit`` returns. The next
        pop of each queue starts from the group's committed offset. fsynced."""
        with self._lock:
            self._apply(Kind.RESET, group, topic, -1, 0, 0, 0, 0)
            self._append([encode_record(Kind.RESET, group, topic, -1)], force_fsync=True)
            return commit()

    # -- queries ------------------------------------------------------------------

    def cursor(self, group: str, topic: str, queue_id: int) -> int | None:
        """The queue's cursor; None before the group's first pop of it."""
        with self._lock:
            q = self._queues.get((group, topic, queue_id))
            return None if q is None else q.cursor

    def in_flight(self, group: str, topic: str, queue_id: int) -> dict[int, tuple[int, int, int]]:
        """The queue's in-flight table: offset -> (visible-at ms, attempts, nonce)."""
        with self._lock:
            q = self._queues.get((group, topic, queue_id))
            entries = q.in_flight.items() if q is not None else ()
            return {o: (e.visible_at_ms, e.attempts, e.nonce) for o, e in entries}

    def deliverable(
        self, group: str, topic: str, queue_id: int, now_ms: int, *, fifo: bool = False
    ) -> bool:
        """Whether a pop now could deliver something, filters aside: an in-flight
        message is due, or (unless ``fifo`` and one is in flight) the cursor is
        below the queue's max offset. Changes nothing on disk."""
        with self._lock:
            q = self._queues.get((group, topic, queue_id))
            if q is None:
                q = self._queue((group, topic, queue_id))  # no journal record: memory only
            if any(e.visible_at_ms <= now_ms for e in q.in_flight.values()):
                return True
            if fifo and q.in_flight:
                return False
            return q.cursor < self._reads.get_max_offset_in_queue(topic, queue_id)

    def next_visible_ms(self, group: str, topic: str, queue_id: int) -> int | None:
        """The earliest visible-at of the queue's in-flight messages (when a held
        pop should look again); None when nothing is in flight."""
        with self._lock:
            q = self._queues.get((group, topic, queue_id))
            return min((e.visible_at_ms for e in q.in_flight.values()), default=None) if q else None

    @property
    def journal_bytes(self) -> int:
        return self._size

    def write_may_block(self) -> bool:
        """Whether the next journal write would fsync (SYNC_FLUSH, or the
        interval since the last fsync passed) or compact the journal: work a
        caller on an event loop hands to a thread. Otherwise a write is one
        ``os.write`` into the page cache. A hint, read without the lock."""
        if self._fsync_interval_ms == 0 or self._size > self.compact_bytes:
            return True
        due_ns = self._last_fsync_ns + self._fsync_interval_ms * 1_000_000
        return time.monotonic_ns() >= due_ns

    # -- internals (under the lock) ----------------------------------------------

    def _queue(self, key: _Key) -> _Queue:
        q = self._queues.get(key)
        if q is None:
            group, topic, queue_id = key
            committed = self._offsets.query_offset(group, topic, queue_id)
            start = (
                committed
                if committed >= 0
                else self._reads.get_min_offset_in_queue(topic, queue_id)
            )
            q = self._queues[key] = _Queue(start)
        return q

    def _clamp(self, key: _Key, q: _Queue, out: list[bytes]) -> None:
        """Keep the tables within the queue's offsets. Below the min offset,
        CommitLog expiry took the messages: forget them. At or past the max,
        the store lost messages it had (a machine crash under ASYNC_FLUSH cut
        the CommitLog's tail) and new ones will take those offsets: the cursor
        moves back so they are delivered, not skipped."""
        group, topic, queue_id = key
        low = self._reads.get_min_offset_in_queue(topic, queue_id)
        high = self._reads.get_max_offset_in_queue(topic, queue_id)
        for offset in [o for o in q.in_flight if not low <= o < high]:
            del q.in_flight[offset]
            out.append(encode_record(Kind.ACK, group, topic, queue_id, offset))
        cursor = min(max(q.cursor, low), high)
        if cursor != q.cursor:
            if cursor < q.cursor:
                log.warning(
                    "pop %s: queue %s-%d ends at %d, before the cursor %d: moved back",
                    group, topic, queue_id, high, q.cursor,
                )  # fmt: skip
            q.cursor = cursor
            out.append(encode_record(Kind.CURSOR, group, topic, queue_id, cursor))

    def _read_one(self, group: str, topic: str, queue_id: int, offset: int) -> bytes | None:
        result = self._reads.get_message(group, topic, queue_id, offset, 1)
        if result.status is not GetStatus.FOUND:
            return None
        record = bytes(next(split_records(result.records)))
        return record if PREFIX.unpack_from(record)[5] == offset else None

    def _pop_new(
        self,
        key: _Key,
        q: _Queue,
        room: int,
        visible_at: int,
        message_filter: MessageFilter | None,
        popped: list[PoppedMessage],
        out: list[bytes],
    ) -> None:
        group, topic, queue_id = key
        # A few rounds: a read can stop short at a gone file or a filtered scan's end.
        for _ in range(4):
            if room <= 0:
                return
            result = self._reads.get_message(group, topic, queue_id, q.cursor, room, message_filter)
            for view in split_records(result.records):
                record = bytes(view)
                offset = PREFIX.unpack_from(record)[5]
                entry = _Entry(visible_at, 1, _nonce())
                q.in_flight[offset] = entry
                popped.append(self._deliver(key, offset, entry, record, out))
                room -= 1
            if result.next_begin_offset == q.cursor:
                return
            moved_past = result.next_begin_offset
            if moved_past < q.cursor:
                return  # a read's correction backwards: _clamp alone moves the cursor back
            q.cursor = moved_past
            out.append(encode_record(Kind.CURSOR, group, topic, queue_id, moved_past))
            if result.status is GetStatus.FOUND:
                return

    def _deliver(
        self, key: _Key, offset: int, entry: _Entry, record: bytes, out: list[bytes]
    ) -> PoppedMessage:
        out.append(self._inflight_record(key, offset, entry))
        physical = PREFIX.unpack_from(record)[6]
        return PoppedMessage(
            key[2], offset, physical, entry.attempts, entry.nonce, entry.visible_at_ms, record
        )

    @staticmethod
    def _inflight_record(key: _Key, offset: int, entry: _Entry) -> bytes:
        group, topic, queue_id = key
        return encode_record(
            Kind.INFLIGHT, group, topic, queue_id, offset, entry.visible_at_ms, entry.attempts,
            entry.nonce,
        )  # fmt: skip

    def _apply(
        self,
        kind: Kind,
        group: str,
        topic: str,
        queue_id: int,
        offset: int,
        visible_at_ms: int,
        attempts: int,
        nonce: int,
    ) -> None:
        """One record's change to the tables (replay; RESET also live)."""
        if kind is Kind.RESET:
            for key in [k for k in self._queues if k[0] == group and k[1] == topic]:
                del self._queues[key]
            return
        q = self._queues.setdefault((group, topic, queue_id), _Queue(0))
        if kind is Kind.INFLIGHT:
            q.in_flight[offset] = _Entry(visible_at_ms, attempts, nonce)
            q.cursor = max(q.cursor, offset + 1)
        elif kind is Kind.ACK:
            q.in_flight.pop(offset, None)
        else:
            q.cursor = offset

    def _write(self, records: list[bytes], key: _Key, q: _Queue) -> None:
        """Journal ``records`` and publish the queue's committed offset."""
        if not records:
            return
        self._append(records)
        self._publish(*key, q)

    def _publish(self, group: str, topic: str, queue_id: int, q: _Queue) -> None:
        """Store the queue's committed offset in the consumer offsets."""
        committed = q.committed()
        if self._offsets.query_offset(group, topic, queue_id) != committed:
            self._offsets.commit_offset(group, topic, queue_id, committed)

    def _append(self, records: list[bytes], *, force_fsync: bool = False) -> None:
        """Write ``records`` (and fsync when due or forced); inside a
        :meth:`batch`, hold them for its end unless forced."""
        if self._pending is not None:
            self._pending.extend(records)
            if not force_fsync:
                return
            records, self._pending = self._pending, []
        if self._fd < 0:
            raise StoreError("the pop journal is not open")
        data = b"".join(records)
        os.write(self._fd, data)
        self._size += len(data)
        now = time.monotonic_ns()
        if force_fsync or now - self._last_fsync_ns >= self._fsync_interval_ms * 1_000_000:
            os.fsync(self._fd)
            self._last_fsync_ns = now
        if self._size > self.compact_bytes:
            self._compact()

    def _live(self) -> bytes:
        """The live state as journal records: each queue's cursor, then every
        delivery in flight (acked ones are simply absent). Under ``_lock``."""
        live = [
            encode_record(Kind.CURSOR, g, t, qid, q.cursor)
            for (g, t, qid), q in self._queues.items()
        ] + [
            self._inflight_record(key, offset, entry)
            for key, q in self._queues.items()
            for offset, entry in sorted(q.in_flight.items())
        ]
        return b"".join(live)

    def _compact(self) -> None:
        """Rewrite the journal as the live state, when that halves it at least."""
        data = self._live()
        if len(data) * 2 > self._size:
            self.compact_bytes = max(self.compact_bytes, len(data) * 4)  # mostly live: grow
            return
        self._replace_journal(data)
        self.compactions += 1

    def _replace_journal(self, data: bytes) -> None:
        """Make ``data`` the journal: temporary file, fsync, rename, directory fsync."""
        tmp = self.directory / (JOURNAL_NAME + ".compact")
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        fsync_dir(self.directory)
        if self._fd >= 0:
            os.close(self._fd)
        self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND)
        self._size = len(data)

    # -- replication ---------------------------------------------------------------

    def snapshot(self) -> bytes:
        """The whole pop state (cursors, deliveries in flight with their invisible
        times, attempts and nonces) in the journal's own record format, as a
        compaction writes it: what a slave installs to answer pops and acks as
        this store would after a failover."""
        with self._lock:
            return self._live()

    def install_snapshot(self, data: bytes) -> None:
        """Replace the pop state with a :meth:`snapshot`'s and make it the journal
        (durable before it returns). Raises ValueError when ``data`` is not whole,
        valid records (nothing changed), OSError when the write fails."""
        records = list(decode_records(data))
        end = records[-1][0] if records else 0
        if end != len(data):
            raise ValueError(f"pop state: bytes {end}..{len(data)} are not a journal record")
        with self._lock:
            self._queues = {}
            for _, rec in records:
                self._apply(*rec)
            self._replace_journal(data)
            for (group, topic, queue_id), q in self._queues.items():
                self._publish(group, topic, queue_id, q)


def _nonce() -> int:
    """A delivery's nonce: random, so no earlier delivery (even before a restart) shares it."""
    return secrets.randbits(62) + 1
