"""The dispatcher: RocketMQ's ReputMessageService.

Follows the CommitLog from ``reput_from_offset`` and, for every committed or
non-transactional record, appends a ConsumeQueue unit and tells the registered
listeners (IndexFile builder, long-poll arrival notification, …). A record is
visible to readers only once its unit exists, so the dispatcher is what makes
a send consumable.

Concurrency: one dispatcher thread; :meth:`ReputMessageService.dispatch_available`
may be called directly only while that thread is not running (recovery).
"""

from __future__ import annotations

import logging
import struct
import threading
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from store.commitlog import CommitLog
from store.consume_queue import CqEntry
from store.consume_queue_table import ConsumeQueueTable
from store.hashing import java_string_hash
from store.message import (
    BORNHOST_V6_FLAG,
    KEY_SEPARATOR,
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_KEY,
    STOREHOSTADDRESS_V6_FLAG,
    is_dispatchable,
    property_value,
)
from store.record import (
    BLANK_MAGIC_CODE,
    MESSAGE_MAGIC_CODE,
    MIN_RECORD_SIZE,
    PREFIX,
    SIZE_AND_MAGIC,
    V4_HEAD,
    V6_HOST_FLAGS,
)

log = logging.getLogger(__name__)

_LONG = struct.Struct(">q")
_INT = struct.Struct(">i")
_SHORT = struct.Struct(">h")
_TAGS = PROPERTY_TAGS.encode()
#: Pause between dispatch rounds: the visibility latency a send may see.
DISPATCH_PAUSE_S = 0.001


@dataclass(frozen=True, slots=True)
class DispatchRequest:
    """One dispatched record, as listeners see it (RocketMQ's DispatchRequest)."""

    topic: str
    queue_id: int
    commit_log_offset: int
    msg_size: int
    tags_code: int
    store_timestamp_ms: int
    consume_queue_offset: int
    sys_flag: int
    #: Raw ``name\\x01value\\x02…`` bytes: listeners decode only what they need.
    properties: bytes

    @property
    def keys(self) -> list[str]:
        raw = property_value(self.properties, PROPERTY_KEYS.encode())
        return [k for k in raw.decode("utf-8").split(KEY_SEPARATOR) if k] if raw else []

    @property
    def uniq_key(self) -> str | None:
        raw = property_value(self.properties, PROPERTY_UNIQ_KEY.encode())
        return raw.decode("utf-8") if raw else None


class DispatchListener(Protocol):
    """Something built from the CommitLog alongside the ConsumeQueues."""

    def on_dispatch(self, requests: Sequence[DispatchRequest]) -> None:
        """Called on the dispatcher thread with records in CommitLog order."""


class ReputMessageService:
    """Builds ConsumeQueues (and feeds listeners) from the CommitLog."""

    def __init__(
        self,
        commitlog: CommitLog,
        consume_queues: ConsumeQueueTable,
        *,
        batch_size_bytes: int,
    ) -> None:
        self.commitlog = commitlog
        self.consume_queues = consume_queues
        self.batch_size_bytes = batch_size_bytes
        self.reput_from_offset = 0
        #: Store time of the last record dispatched: the checkpoint's logics time.
        self.last_store_timestamp_ms = 0
        self.listeners: list[DispatchListener] = []
        self.stalled_reason: str | None = None
        #: ConsumeQueue units written so far (recovery reports the rebuilt count).
        self.entries_written = 0
        self._tags_codes: dict[bytes, int] = {}
        self._wakeup = threading.Event()
        self._progress = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None

    # -- the loop ---------------------------------------------------------------------

    @property
    def behind_bytes(self) -> int:
        return max(0, self.commitlog.max_offset - self.reput_from_offset)

    def wakeup(self) -> None:
        # Called after every append: skip the Event's lock when a wake-up is pending.
        if not self._wakeup.is_set():
            self._wakeup.set()

    def start(self) -> None:
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="reput-message-service", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopping:
            self._wakeup.wait(0.1)
            self._wakeup.clear()
            try:
                while self.dispatch_available() and not self._stopping:
                    pass
                # Like RocketMQ's 1 ms reput pause: under a stream of small sends, one
                # round per millisecond dispatches many records at once instead of
                # taking the GIL from the senders once per record.
                time.sleep(DISPATCH_PAUSE_S)
            except Exception:
                log.exception("dispatcher failed at offset %d", self.reput_from_offset)
                self.stalled_reason = f"dispatcher failed at offset {self.reput_from_offset}"
                self._stopping = True

    def shutdown(self, *, drain: bool = True) -> None:
        """Stop the thread; with ``drain`` dispatch everything appended first."""
        self._stopping = True
        self._wakeup.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if drain and self.stalled_reason is None:
            while self.dispatch_available():
                pass

    def wait_until_dispatched(self, offset: int | None = None, timeout_s: float = 10.0) -> bool:
        """Block until everything below ``offset`` (default: the current end) is dispatched."""
        target = self.commitlog.max_offset if offset is None else offset
        with self._progress:
            return (
                self._progress.wait_for(
                    lambda: self.reput_from_offset >= target or self.stalled_reason is not None,
                    timeout_s,
                )
                and self.stalled_reason is None
            )

    # -- one step ---------------------------------------------------------------------

    def dispatch_available(self) -> int:
        """Dispatch one batch of what the CommitLog holds past ``reput_from_offset``.

        Returns the number of records consumed (dispatched or skipped), 0 when
        caught up. A record that does not parse stops dispatching and sets
        ``stalled_reason``: the CommitLog is corrupt and a restart's recovery
        must decide.
        """
        commitlog = self.commitlog
        if self.reput_from_offset < commitlog.min_offset:
            self.reput_from_offset = commitlog.min_offset
        start = self.reput_from_offset
        if start >= commitlog.max_offset or self.stalled_reason is not None:
            return 0
        mf = commitlog.files.find_by_offset(start)
        if mf is None:
            return 0
        rel = start - mf.file_from_offset
        available = mf.wrote_position - rel
        if available <= 0:
            return 0
        buf = mf.read(rel, min(available, self.batch_size_bytes))
        entries: dict[tuple[str, int], list[CqEntry]] = defaultdict(list)
        requests: list[DispatchRequest] = []
        want_requests = bool(self.listeners)
        tags_codes = self._tags_codes
        #: Per queue, the end of what its ConsumeQueue already indexes.
        indexed_up_to: dict[tuple[str, int], int] = {}
        last_ts = self.last_store_timestamp_ms
        next_offset: int | None = None
        pos = consumed = 0
        while pos + SIZE_AND_MAGIC.size <= len(buf):
            if pos + V4_HEAD.size <= len(buf):
                # IPv4 hosts (the common case): every field the dispatcher needs at once.
                size, magic, _, queue_id, queue_offset, phys, sys_flag, store_ts, body_len = (
                    V4_HEAD.unpack_from(buf, pos)
                )
                v4 = not sys_flag & V6_HOST_FLAGS
            else:
                size, magic = SIZE_AND_MAGIC.unpack_from(buf, pos)
                v4 = False
            if magic == BLANK_MAGIC_CODE:
                next_offset = commitlog.roll_next_file(mf.file_from_offset)
                consumed += 1
                break
            if magic != MESSAGE_MAGIC_CODE or size < MIN_RECORD_SIZE:
                self._stall(start + pos, f"bad magic 0x{magic:08X} or size {size}")
                break
            if pos + size > len(buf):
                if pos > 0:
                    break  # the rest comes with the next batch
                if size > available:
                    self._stall(start, f"record of {size} bytes runs past the written end")
                    break
                buf = mf.read(rel, size)  # one record larger than a batch
                continue
            if v4:
                p = pos + V4_HEAD.size + body_len
            else:
                _, _, _, queue_id, _, queue_offset, phys, sys_flag, _ = PREFIX.unpack_from(buf, pos)
                p = pos + PREFIX.size + (20 if sys_flag & BORNHOST_V6_FLAG else 8)
                (store_ts,) = _LONG.unpack_from(buf, p)
                p += 8 + (20 if sys_flag & STOREHOSTADDRESS_V6_FLAG else 8) + 12
                (body_len,) = _INT.unpack_from(buf, p)
                p += 4 + body_len
            if phys != start + pos:
                self._stall(start + pos, f"record claims physical offset {phys}")
                break
            last_ts = store_ts
            topic_len = buf[p]
            topic = buf[p + 1 : p + 1 + topic_len].decode("utf-8")
            p += 1 + topic_len
            key = (topic, queue_id)
            floor = indexed_up_to.get(key)
            if floor is None:
                cq = self.consume_queues.get(topic, queue_id)
                floor = indexed_up_to[key] = cq.max_physic_offset if cq is not None else -1
            if phys + size <= floor:
                # Already in its queue (re-dispatch after recovery): skip without parsing.
                pos += size
                consumed += 1
                continue
            if is_dispatchable(sys_flag):
                props_start = p + 2
                props_end = props_start + ((buf[p] << 8) | buf[p + 1])
                tags_code = 0
                if props_end > props_start:
                    raw_tags = property_value(buf, _TAGS, props_start, props_end)
                    if raw_tags:
                        tags_code = tags_codes.get(raw_tags) or self._tags_code(raw_tags)
                entries[key].append((queue_offset, phys, size, tags_code))
                if want_requests:
                    requests.append(
                        DispatchRequest(
                            topic,
                            queue_id,
                            phys,
                            size,
                            tags_code,
                            store_ts,
                            queue_offset,
                            sys_flag,
                            buf[props_start:props_end],
                        )
                    )
            pos += size
            consumed += 1
        self._apply(entries, requests)
        self.last_store_timestamp_ms = last_ts
        self._advance(start + pos if next_offset is None else next_offset)
        return consumed

    def _tags_code(self, raw_tags: bytes) -> int:
        code = java_string_hash(raw_tags.decode("utf-8", errors="replace"))
        if len(self._tags_codes) < 100_000:
            self._tags_codes[raw_tags] = code
        return code

    def _apply(
        self, entries: dict[tuple[str, int], list[CqEntry]], requests: list[DispatchRequest]
    ) -> None:
        find = self.consume_queues.find_or_create
        for (topic, queue_id), units in entries.items():
            self.entries_written += find(topic, queue_id).put_entries(units)
        if requests:
            for listener in self.listeners:
                listener.on_dispatch(requests)

    def _advance(self, offset: int) -> None:
        with self._progress:
            self.reput_from_offset = offset
            self._progress.notify_all()

    def _stall(self, offset: int, reason: str) -> None:
        self.stalled_reason = f"commitlog offset {offset}: {reason}"
        log.error("dispatcher stopped: %s", self.stalled_reason)
        with self._progress:
            self._progress.notify_all()
