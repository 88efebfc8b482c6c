"""Delay levels: RocketMQ 4's ScheduleMessageService and SCHEDULE_TOPIC_XXXX.

A put whose message asks for delay level ``n`` (the DELAY property, or
``Message.delay_time_level``) is *parked* (:func:`park`): stored in
:data:`~basalt.common.message.SCHEDULE_TOPIC` queue ``n - 1`` with its real
topic and queue in the REAL_TOPIC / REAL_QID properties (DELAY kept), as
RocketMQ's ``CommitLog.asyncPutMessage`` does. A level past the last is the
last (RocketMQ clamps; the DELAY property is rewritten to it); a level of 0 or
less is no delay. Prepared and rolled-back transactional messages are never
parked (RocketMQ's rule: only their commit is).

The due time is the ConsumeQueue unit's tagsCode: STORETIMESTAMP + the level's
delay (:func:`consume_queue_tags_code`, computed in C by ``_records.stamp``,
``dispatch`` and ``tags_code_at`` when they are given the store's
``delay_levels_ms``). Because the unit holds it, the service below reads one
20-byte unit per level to know whether anything is due, never a record.

:class:`ScheduleMessageService` (one thread per store) walks each level's
queue from its saved offset and, for every unit due (tagsCode <= now),
*delivers* it (:func:`unpark`): the record is put again to REAL_TOPIC /
REAL_QID with DELAY, REAL_TOPIC and REAL_QID removed and everything else kept
(body, flag, sysflag, born time and host, reconsume times, and the
properties: TAGS, KEYS and UNIQ_KEY, so the consumer sees the producer's
message id). Then the level's offset moves past it. Progress is
``config/delayOffset.json`` (RocketMQ's file: ``{"offsetTable": {level:
offset}}``), written every ``flush_delay_offset_interval_ms`` if changed and
at shutdown.

Crash safety: at least once. The offset moves only after the re-put is
appended, and the file lags the offsets in memory, so after a kill -9 the
messages delivered since the last write are delivered again (duplicates, never
a loss). Messages whose records expired before they were due are skipped.

Precision: the thread sleeps until the earliest due unit it saw, at most
:data:`CHECK_INTERVAL_S` (new arrivals, a wall clock that jumps, a test's
ManualClock), so a message is delivered within ~100 ms of its due time
while nothing is polled faster than that.

Replication (controller mode): only a master delivers. The store-node turns
the service on and off with the group's role (:meth:`MessageStore.set_schedule_enabled`);
a slave's ``delayOffset.json`` is not replicated yet (docs/scheduled.md).
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Protocol

from basalt.common.delivery import delay_level
from basalt.common.message import (
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TAGS,
    SCHEDULE_TOPIC,
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    TRANSACTION_TYPE_MASK,
    Message,
    MessageRecord,
    property_value,
)
from basalt.store.commitlog import CommitLog
from basalt.store.config import CQ_STORE_UNIT_SIZE
from basalt.store.consume_queue import BLANK_UNIT_SIZE, UNIT
from basalt.store.consume_queue_table import ConsumeQueueTable
from basalt.store.errors import StoreError
from basalt.store.files import write_atomically
from basalt.store.hashing import tags_code
from basalt.store.parking import copy_of, real_destination
from basalt.store.put_result import PutMessageResult, PutStatus
from basalt.store.service_thread import ServiceThread

log = logging.getLogger(__name__)

#: The longest the service sleeps between two looks at the levels' queues.
CHECK_INTERVAL_S = 0.1
#: Units read per look at a level (one read of the ConsumeQueue).
_UNITS_PER_READ = 64
#: Puts refused for good (retrying cannot help): the message is skipped, logged.
_UNDELIVERABLE = frozenset({PutStatus.MESSAGE_ILLEGAL, PutStatus.PROPERTIES_SIZE_EXCEEDED})
_DELAY_NAME = PROPERTY_DELAY_TIME_LEVEL.encode()
_PARKING = frozenset({PROPERTY_DELAY_TIME_LEVEL, PROPERTY_REAL_TOPIC, PROPERTY_REAL_QUEUE_ID})


def delay_offset_path(root: Path) -> Path:
    return root / "config" / "delayOffset.json"


# -- the level and the tagsCode: the C rule's reference ---------------------------------


def due_time_ms(level: int, store_timestamp_ms: int, delays_ms: Sequence[int]) -> int:
    """RocketMQ's computeDeliverTimestamp: when a message stored at
    ``store_timestamp_ms`` with ``level`` (>= 1; past the last level = the last) is due."""
    return store_timestamp_ms + delays_ms[min(level, len(delays_ms)) - 1]


def consume_queue_tags_code(
    topic: str, properties: bytes, store_timestamp_ms: int, delays_ms: Sequence[int] | None
) -> int:
    """The ConsumeQueue tagsCode of a record: its due time for a parked record of
    SCHEDULE_TOPIC_XXXX (with ``delays_ms``), else the TAGS hash.

    The Python reference of ``_records.stamp`` / ``dispatch`` / ``tags_code_at``
    given ``delays``; a parity test holds them together."""
    if delays_ms and topic == SCHEDULE_TOPIC:
        level = delay_level(property_value(properties, _DELAY_NAME))
        if level > 0:
            return due_time_ms(level, store_timestamp_ms, delays_ms)
    raw = property_value(properties, PROPERTY_TAGS.encode())
    return tags_code(raw.decode("utf-8", "replace") if raw is not None else None)


# -- parking and delivering -------------------------------------------------------------


class BadDelayLevel(StoreError, ValueError):
    """A DELAY property that is not an integer: the send is refused."""


def requested_level(message: Message) -> int:
    """The delay level ``message`` asks for (0: none). Raises :class:`BadDelayLevel`
    for a DELAY property that is not an integer (RocketMQ's parseInt fails too)."""
    if message.delay_time_level:
        return message.delay_time_level
    raw = message.properties.get(PROPERTY_DELAY_TIME_LEVEL) if message.properties else None
    if raw is None:
        return 0
    try:
        return int(raw)
    except ValueError:
        raise BadDelayLevel(f"DELAY {raw[:20]!r} is not a delay level") from None


def park(message: Message, delays_ms: Sequence[int]) -> Message:
    """``message`` as stored: parked in SCHEDULE_TOPIC_XXXX when it asks for a delay
    (see the module's doc), else itself. Raises :class:`BadDelayLevel`."""
    level = requested_level(message)
    if level <= 0:
        return message
    kind = message.sys_flag & TRANSACTION_TYPE_MASK
    if kind in (TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE):
        return message
    level = min(level, len(delays_ms))
    props = message.all_properties()
    props[PROPERTY_DELAY_TIME_LEVEL] = str(level)
    props[PROPERTY_REAL_TOPIC] = message.topic
    props[PROPERTY_REAL_QUEUE_ID] = str(message.queue_id)
    return replace(
        message,
        topic=SCHEDULE_TOPIC,
        queue_id=level - 1,
        tags=None,
        keys=(),
        properties=props,
        delay_time_level=0,
    )


def unpark(record: MessageRecord, drop: frozenset[str] = _PARKING) -> Message:
    """The message a parked record delivers: to REAL_TOPIC / REAL_QID, without the
    parking properties (``drop``: the delay levels' by default; the timers pass
    theirs), everything else as the producer sent it. Raises ValueError when the
    record has no (valid) REAL_TOPIC / REAL_QID."""
    topic, queue_id = real_destination(record)
    return copy_of(record, topic, queue_id, drop=drop)


# -- delayOffset.json -------------------------------------------------------------------

#: RocketMQ writes the table with fastjson, whose integer keys are bare: {1:5}.
_BARE_KEY = re.compile(r"([{,]\s*)(-?\d+)(\s*:)")


def encode_delay_offsets(offsets: dict[int, int]) -> bytes:
    """``{"offsetTable": {"1": 5, ...}}``: RocketMQ's layout, keys quoted (strict JSON)."""
    table = {str(level): offsets[level] for level in sorted(offsets)}
    return json.dumps({"offsetTable": table}, indent=4).encode()


def decode_delay_offsets(data: bytes) -> dict[int, int]:
    """The offsets of a delayOffset.json (RocketMQ's, bare keys and all). Raises
    ValueError when it is not one."""
    doc = json.loads(_BARE_KEY.sub(r'\1"\2"\3', data.decode("utf-8")))
    table = doc.get("offsetTable") if isinstance(doc, dict) else None
    if not isinstance(table, dict):
        raise ValueError("no offsetTable object")
    offsets = {}
    for key, value in table.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"offset of level {key!r} is not a non-negative integer")
        offsets[int(key)] = value
    return offsets


class _Store(Protocol):
    """What the service needs of its MessageStore."""

    commitlog: CommitLog
    consume_queues: ConsumeQueueTable

    def put_internal(self, messages: Sequence[Message]) -> PutMessageResult: ...


class ScheduleMessageService(ServiceThread):
    """Delivers due parked messages (see the module's doc). Thread-safe: the
    offsets are read by admin calls under ``_lock``."""

    name = "schedule-message-service"

    def __init__(
        self,
        store: _Store,
        delays_ms: Sequence[int],
        path: Path,
        *,
        now_ms: Callable[[], int],
        persist_interval_ms: int,
    ) -> None:
        super().__init__()
        self.store = store
        self.delays_ms = tuple(delays_ms)
        self.path = path
        self.now_ms = now_ms
        self.persist_interval_s = persist_interval_ms / 1000
        #: Level -> the next queue offset to deliver.
        self.offsets: dict[int, int] = {}
        #: Whether deliveries run (a controller-mode slave's is off).
        self.enabled = True
        #: Messages delivered since start; skipped as undeliverable or expired.
        self.delivered = 0
        self.skipped = 0
        self._lock = threading.Lock()
        self._persisted: dict[int, int] = {}

    def load(self) -> None:
        """Read delayOffset.json (absent: every level from 0). A file that does not
        parse is logged and ignored: delivering from 0 again duplicates, never loses."""
        try:
            offsets = decode_delay_offsets(self.path.read_bytes())
        except FileNotFoundError:
            offsets = {}
        except (ValueError, UnicodeDecodeError) as e:
            log.error("%s does not parse (%s): every level starts at 0", self.path, e)
            offsets = {}
        self.offsets = {lv: off for lv, off in offsets.items() if 1 <= lv <= len(self.delays_ms)}
        self._persisted = dict(self.offsets)

    def persist(self) -> None:
        """Write delayOffset.json if the offsets moved since the last write."""
        with self._lock:
            offsets = dict(self.offsets)
        if offsets == self._persisted:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(self.path, encode_delay_offsets(offsets))
        self._persisted = offsets

    def pending(self) -> list[tuple[int, int, int, int | None]]:
        """Per level: (level, delivered-to offset, max offset, next due time or None)."""
        rows: list[tuple[int, int, int, int | None]] = []
        for level in range(1, len(self.delays_ms) + 1):
            cq = self.store.consume_queues.get(SCHEDULE_TOPIC, level - 1)
            with self._lock:
                offset = self.offsets.get(level, 0)
            if cq is None:
                rows.append((level, offset, 0, None))
                continue
            offset = max(offset, cq.min_offset_in_queue)
            data = cq.read_units(offset, 1)
            due = UNIT.unpack(data)[2] if len(data) == CQ_STORE_UNIT_SIZE else None
            rows.append((level, offset, cq.max_offset_in_queue, due))
        return rows

    def run(self) -> None:
        last_persist = time.monotonic()
        while not self._stopping:
            next_due = self.deliver_due() if self.enabled else None
            if time.monotonic() - last_persist >= self.persist_interval_s:
                self.persist()
                last_persist = time.monotonic()
            wait = CHECK_INTERVAL_S
            if next_due is not None:
                wait = min(wait, max(next_due - self.now_ms(), 0) / 1000)
            if wait > 0:
                self._wakeup.wait(wait)
            self._wakeup.clear()

    def shutdown(self) -> None:
        """Stop the thread (its round ends early), then write delayOffset.json.
        Raises OSError when that write fails."""
        super().shutdown()
        self.persist()

    def deliver_due(self) -> int | None:
        """Deliver every due unit of every level; returns the earliest due time
        still waiting (None: nothing parked past the offsets)."""
        earliest: int | None = None
        for level in range(1, len(self.delays_ms) + 1):
            if self._halted():
                return earliest
            due = self._deliver_level(level)
            if due is not None and (earliest is None or due < earliest):
                earliest = due
        return earliest

    def _deliver_level(self, level: int) -> int | None:
        cq = self.store.consume_queues.get(SCHEDULE_TOPIC, level - 1)
        if cq is None:
            return None
        with self._lock:
            offset = self.offsets.get(level, 0)
        # RocketMQ's correctDelayOffset: expired units are gone; a lost tail restarts.
        offset = min(max(offset, cq.min_offset_in_queue), cq.max_offset_in_queue)
        while not self._halted():
            data = cq.read_units(offset, _UNITS_PER_READ)
            if not data:
                self._set_offset(level, offset)
                return None
            now = self.now_ms()
            phy: int
            size: int
            due: int
            for phy, size, due in UNIT.iter_unpack(data):
                if size != BLANK_UNIT_SIZE:
                    if due > now:
                        self._set_offset(level, offset)
                        return due
                    if not self._deliver(phy, size):
                        self._set_offset(level, offset)
                        return now + 1000  # the store refused: try again in a second
                offset += 1
                self._set_offset(level, offset)
        return None

    def _deliver(self, phy: int, size: int) -> bool:
        """Re-put one parked record; False when the store refused it for now."""
        record = self.store.commitlog.get_record(phy, size)
        if record is None:  # expired before it was due
            self.skipped += 1
            return True
        try:
            message = unpark(record)
        except ValueError as e:
            log.error("a parked message cannot be delivered: %s", e)
            self.skipped += 1
            return True
        result = self.store.put_internal([message])
        if result.status in _UNDELIVERABLE:
            log.error("parked message at %d refused by %s: %s", phy, message.topic, result.detail)
            self.skipped += 1
            return True
        if result.status not in (PutStatus.PUT_OK, PutStatus.FLUSH_DISK_TIMEOUT):
            log.warning("delivering the parked message at %d: %s", phy, result.detail)
            return False
        self.delivered += 1
        return True

    def _halted(self) -> bool:
        """Whether a round must stop early: disabled, or the thread is being shut
        down (a stopped service can still be driven by hand: a test's, a tool's)."""
        return not self.enabled or (self._stopping and self._thread is not None)

    def _set_offset(self, level: int, offset: int) -> None:
        with self._lock:
            self.offsets[level] = offset

    def progress(self) -> bytes:
        """The levels' offsets as delayOffset.json's bytes (for a slave: the
        master's progress, so a failover does not deliver everything again)."""
        with self._lock:
            return encode_delay_offsets(dict(self.offsets))

    def adopt(self, data: bytes) -> None:
        """Take a master's :meth:`progress` and persist it (RocketMQ's slave
        syncs delayOffset.json from its master). Ignored while this service
        delivers: a master's own progress is the truth. Raises ValueError when
        ``data`` does not parse (nothing changed)."""
        offsets = decode_delay_offsets(data)
        if self.enabled:
            return
        with self._lock:
            self.offsets = {lv: o for lv, o in offsets.items() if 1 <= lv <= len(self.delays_ms)}
        self.persist()


__all__ = [
    "BadDelayLevel",
    "ScheduleMessageService",
    "consume_queue_tags_code",
    "decode_delay_offsets",
    "delay_offset_path",
    "due_time_ms",
    "encode_delay_offsets",
    "park",
    "requested_level",
    "unpark",
]
