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
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from store import _records
from store.commitlog import CommitLog
from store.consume_queue_table import ConsumeQueueTable
from store.message import KEY_SEPARATOR, PROPERTY_KEYS, PROPERTY_UNIQ_KEY, property_value

log = logging.getLogger(__name__)

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
        #: Topic names by their UTF-8 bytes, shared with the C walk.
        self._topics: dict[bytes, str] = {}
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
        if mf.wrote_position <= rel:
            return 0
        # The record walk runs in C with the GIL released, straight on the mapping.
        pos, kind, reason, consumed, last_ts, runs, records = _records.dispatch(
            mf.buffer,
            rel,
            mf.wrote_position,
            mf.file_from_offset,
            self.batch_size_bytes,
            bool(self.listeners),
            self._topics,
        )
        if kind == _records.KIND_CORRUPT:
            self._stall(mf.file_from_offset + pos, reason)
        self._apply(runs)
        if records:
            props = mf.buffer
            requests = [
                DispatchRequest(t, q, phys, size, tags, ts, qoff, flag, props[ps:pe])
                for t, q, phys, size, tags, ts, qoff, flag, ps, pe in records
            ]
            for listener in self.listeners:
                listener.on_dispatch(requests)
        if consumed:
            self.last_store_timestamp_ms = last_ts
        if kind == _records.KIND_BLANK:
            self._advance(commitlog.roll_next_file(mf.file_from_offset))
            return consumed + 1
        self._advance(mf.file_from_offset + pos)
        return consumed

    def _apply(self, runs: list[tuple[str, int, int, int, bytes]]) -> None:
        find = self.consume_queues.find_or_create
        for topic, queue_id, first_offset, count, units in runs:
            self.entries_written += find(topic, queue_id).put_units(first_offset, count, units)

    def _advance(self, offset: int) -> None:
        with self._progress:
            self.reput_from_offset = offset
            self._progress.notify_all()

    def _stall(self, offset: int, reason: str) -> None:
        self.stalled_reason = f"commitlog offset {offset}: {reason}"
        log.error("dispatcher stopped: %s", self.stalled_reason)
        with self._progress:
            self._progress.notify_all()
