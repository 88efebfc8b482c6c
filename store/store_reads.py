"""MessageStore's reads: the pull path, offsets and times, look-ups by offset and key.

A mixin of :class:`basalt.store.message_store.MessageStore`, kept apart so that the
store's lifecycle and write path stay one readable module. Every method is
thread-safe and reads only what is written (below write positions).
"""

from __future__ import annotations

from collections.abc import Iterator

from basalt.common.message import MessageRecord
from basalt.store.commitlog import CommitLog
from basalt.store.consume_queue import ConsumeQueue
from basalt.store.consume_queue_table import ConsumeQueueTable
from basalt.store.dispatcher import ReputMessageService
from basalt.store.errors import CorruptRecordError, StoreClosedError
from basalt.store.get_message import (
    GetMessageResult,
    QueryMessageResult,
    TransferLimits,
    get_message,
)
from basalt.store.index_service import IndexService
from basalt.store.message_filter import MessageFilter
from basalt.store.resync import is_tombstone


class StoreReads:
    """The read half of MessageStore (see the module docstring)."""

    commitlog: CommitLog
    consume_queues: ConsumeQueueTable
    dispatcher: ReputMessageService
    index: IndexService | None
    _running: bool
    _transfer_limits: TransferLimits

    @property
    def min_physical_offset(self) -> int:
        return self.commitlog.min_offset

    @property
    def max_physical_offset(self) -> int:
        return self.commitlog.max_offset

    @property
    def dispatch_behind_bytes(self) -> int:
        return self.dispatcher.behind_bytes

    def wait_dispatched(self, timeout_s: float = 10.0) -> bool:
        """Block until everything appended so far is in the ConsumeQueues."""
        return self.dispatcher.wait_until_dispatched(None, timeout_s)

    def get_consume_queue(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        return self.consume_queues.get(topic, queue_id)

    def get_max_offset_in_queue(self, topic: str, queue_id: int) -> int:
        """One past the last dispatched queue offset; 0 for an unknown queue."""
        cq = self.consume_queues.get(topic, queue_id)
        return cq.max_offset_in_queue if cq is not None else 0

    def get_min_offset_in_queue(self, topic: str, queue_id: int) -> int:
        cq = self.consume_queues.get(topic, queue_id)
        return cq.min_offset_in_queue if cq is not None else 0

    def get_message(
        self,
        group: str,
        topic: str,
        queue_id: int,
        offset: int,
        max_msg_nums: int,
        message_filter: MessageFilter | None = None,
    ) -> GetMessageResult:
        """Up to ``max_msg_nums`` records of a queue from ``offset`` that match the
        filter, as stored (see :mod:`basalt.store.get_message` for statuses and caps).

        ``group`` names the consumer group for the caller's accounting; the read
        itself does not depend on it. Raises StoreClosedError when not running,
        ValueError for ``max_msg_nums`` < 1.
        """
        if not self._running:
            raise StoreClosedError("the store is not running")
        if max_msg_nums < 1:
            raise ValueError(f"max_msg_nums must be at least 1, got {max_msg_nums}")
        return get_message(
            self.commitlog,
            self.consume_queues.get(topic, queue_id),
            offset,
            max_msg_nums,
            message_filter,
            self._transfer_limits,
        )

    def get_offset_in_queue_by_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """The queue offset of the record stored at (or nearest to) ``timestamp_ms``;
        0 for an unknown queue. RocketMQ 4.x's edge rules: see
        :meth:`ConsumeQueue.get_offset_in_queue_by_time`."""
        cq = self.consume_queues.get(topic, queue_id)
        if cq is None:
            return 0
        return cq.get_offset_in_queue_by_time(
            timestamp_ms, self.commitlog.store_timestamp_at, self.commitlog.min_offset
        )

    def get_message_store_timestamp(self, topic: str, queue_id: int, queue_offset: int) -> int:
        """STORETIMESTAMP of a queue offset's record; -1 when unknown or gone."""
        cq = self.consume_queues.get(topic, queue_id)
        unit = cq.get_unit(queue_offset) if cq is not None else None
        return -1 if unit is None else self.commitlog.store_timestamp_at(unit[0])

    def get_store_time(self, physical_offset: int) -> int:
        """STORETIMESTAMP of the record at a physical offset; -1 below the CommitLog's
        min, at or past its max, or where no record starts."""
        if not self.commitlog.min_offset <= physical_offset < self.commitlog.max_offset:
            return -1
        return self.commitlog.store_timestamp_at(physical_offset)

    def query_message(
        self, topic: str, key: str, max_num: int, begin_timestamp_ms: int, end_timestamp_ms: int
    ) -> QueryMessageResult:
        """Records of ``topic`` whose KEYS hold ``key`` (or whose UNIQ_KEY is ``key``),
        stored within ``[begin, end]`` (the index keeps seconds), oldest first, at
        most ``max_num`` (capped at ``max_msgs_num_batch``).

        RocketMQ's queryMessage: up to three index lookups, each ending where the
        previous one's oldest hit was stored, until one finds a record. Unlike
        RocketMQ every hit is checked against the record (keys sharing a Java
        hash share index entries), and duplicates are dropped. Empty when the
        index is off.
        """
        if self.index is None:
            return QueryMessageResult(b"", 0, 0, 0)
        found: list[bytes] = []
        last_ts = last_phy = 0
        end = end_timestamp_ms
        seen: set[int] = set()
        for _ in range(3):
            offsets = self.index.query_offset(topic, key, max_num, begin_timestamp_ms, end)
            last_ts = offsets.index_last_update_timestamp
            last_phy = offsets.index_last_update_phyoffset
            if not offsets.phy_offsets:
                break
            for phy in sorted(set(offsets.phy_offsets) - seen):
                seen.add(phy)
                record = self._indexed_record(phy)
                if record is None:
                    continue  # expired since it was indexed, or a damaged entry
                end = min(end, record.store_timestamp_ms)
                if record.topic == topic and (key == record.uniq_key or key in record.keys):
                    raw = self.commitlog.read(phy, record.store_size)
                    if raw is not None:
                        found.append(raw)
            if found or end < begin_timestamp_ms:
                break
        return QueryMessageResult(b"".join(found), len(found), last_ts, last_phy)

    def _indexed_record(self, phy: int) -> MessageRecord | None:
        """The record an index entry names, or None: gone, or no record starts there.

        The index is derived data the start-up check vouches for only as far as
        its pointers go; an entry that still names a wrong offset must give no
        answer, not an exception (the caller then checks topic and key).
        """
        if not self.commitlog.min_offset <= phy < self.commitlog.max_offset:
            return None
        try:
            return self.commitlog.get_record(phy)
        except CorruptRecordError:
            return None

    def lookup_message_by_offset(self, physical_offset: int) -> MessageRecord | None:
        """The record at a physical offset; None below the min or at/after the max,
        and for a tombstone (recovery's marker where damaged records were)."""
        record = self.commitlog.get_record(physical_offset)
        if record is None or is_tombstone(record.topic, record.sys_flag):
            return None
        return record

    def get_message_by_queue_offset(
        self, topic: str, queue_id: int, queue_offset: int
    ) -> MessageRecord | None:
        """The record a ConsumeQueue unit points at; None if not dispatched or gone."""
        cq = self.consume_queues.get(topic, queue_id)
        unit = cq.get_unit(queue_offset) if cq is not None else None
        if unit is None:
            return None
        return self.commitlog.get_record(unit[0], unit[1])

    def iter_queue(
        self, topic: str, queue_id: int, from_offset: int = 0
    ) -> Iterator[tuple[int, MessageRecord]]:
        """Yield (queue offset, record) for a queue's dispatched records from ``from_offset``."""
        cq = self.consume_queues.get(topic, queue_id)
        if cq is None:
            return
        for queue_offset, phy, size, _ in cq.iter_units(from_offset):
            record = self.commitlog.get_record(phy, size)
            if record is not None:
                yield queue_offset, record
