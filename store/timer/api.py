"""What the service layer asks of the timer: recall, status, and the progress a
master hands its slaves (MessageStore.recall_timer, timer_status,
timer_progress, adopt_timer_progress; docs/timers.md)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from basalt.common.message import (
    PROPERTY_REAL_TOPIC,
    PROPERTY_TIMER_DEL_UNIQKEY,
    PROPERTY_TIMER_OUT_MS,
    TIMER_TOPIC,
)
from basalt.store.errors import CorruptRecordError, StoreError
from basalt.store.index_service import IndexService
from basalt.store.put_result import PutStatus
from basalt.store.timer.checkpoint import decode_progress, encode_progress
from basalt.store.timer.files import TimerEntry, topic_hash
from basalt.store.timer.park import delete_key, delete_marker, tick_of
from basalt.store.timer.service import BUCKET_TICKS, TimerMessageService

log = logging.getLogger(__name__)

#: Entries a status call reads at most looking for next due times.
MAX_STATUS_ENTRIES = 100_000


class RecallFailed(StoreError):
    """The store could not write a recall's delete marker (it is not writable)."""


@dataclass(frozen=True, slots=True)
class TimerTopicStatus:
    """A topic's pending timers: how many, and the earliest delivery times (Unix
    ms, ascending)."""

    topic: str
    pending: int
    next_due_ms: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class TimerStatus:
    """The timer of one store (MessageStore.timer_status).

    ``pending``: timer messages filed and not yet delivered (a recalled one
    counts until its slot is scanned); ``scan_ms``: how far the scan has come -
    everything due before it was delivered; ``enqueue_offset`` / ``queue_max_offset``:
    the timer topic's queue read so far / written (the difference is parked
    messages not yet filed); ``enabled``: whether this store delivers (a
    controller-mode slave does not)."""

    pending: int
    topics: tuple[TimerTopicStatus, ...]
    scan_ms: int
    enqueue_offset: int
    queue_max_offset: int
    enabled: bool
    timer_log_bytes: int
    delivered: int
    cancelled: int


def recall(
    timer: TimerMessageService,
    index: IndexService | None,
    topic: str,
    deliver_ms: int,
    uniq_key: str,
) -> bool:
    """Cancel the timer message ``uniq_key`` of ``topic`` due at ``deliver_ms``
    (RocketMQ 5.3's recall: a delete marker filed in the same slot). False when
    there is nothing to cancel: its time was scanned past (delivered), or, with
    the message index on, no such message is parked here. Raises
    :class:`RecallFailed` when the marker cannot be written."""
    tick = tick_of(deliver_ms, timer.precision_ms)
    with timer.lock:
        if _scanned(timer, tick, deliver_ms):
            return False
    if index is not None and not _parked(timer, index, topic, deliver_ms, uniq_key):
        return False
    with timer.lock:  # the scan cannot pass the tick between the check and the marker
        if _scanned(timer, tick, deliver_ms):
            return False
        marker = delete_marker(topic, uniq_key, deliver_ms, timer.now_ms())
        result = timer.store.put_internal([marker])
        if result.status not in (PutStatus.PUT_OK, PutStatus.FLUSH_DISK_TIMEOUT):
            raise RecallFailed(f"the recall's marker was refused: {result.detail}")
        timer.recalled[delete_key(topic, uniq_key)] = tick
    return True


def _scanned(timer: TimerMessageService, tick: int, deliver_ms: int) -> bool:
    """Whether the scan has passed a message of ``tick`` due at ``deliver_ms``: its
    slot is done, or open (the scan is in its tick) and its time has come - it
    is delivered, or will be at the scan's next look, whatever a marker says."""
    scan_tick = timer.state.scan_tick
    return tick < scan_tick or (tick == scan_tick and deliver_ms <= timer.now_ms())


def _parked(
    timer: TimerMessageService, index: IndexService, topic: str, deliver_ms: int, uniq_key: str
) -> bool:
    """Whether the index knows the parked message (UNIQ_KEY in the timer topic)."""
    commitlog = timer.store.commitlog
    written = commitlog.max_offset
    for attempt in range(2):
        if attempt:
            # A send answered a moment ago may not be indexed yet: wait for the
            # index to pass what was written when the recall came.
            deadline = time.monotonic() + 2.0
            while index.reput_offset < written and time.monotonic() < deadline:
                time.sleep(0.005)
        found = index.query_offset(TIMER_TOPIC, uniq_key, 32, 0, timer.now_ms() + 60_000)
        for phy in found.phy_offsets:
            if not commitlog.min_offset <= phy < commitlog.max_offset:
                continue
            try:
                record = commitlog.get_record(phy)
            except CorruptRecordError:
                continue
            props = record.properties if record is not None else {}
            if (
                record is not None
                and record.topic == TIMER_TOPIC
                and record.uniq_key == uniq_key
                and props.get(PROPERTY_REAL_TOPIC) == topic
                and props.get(PROPERTY_TIMER_OUT_MS) == str(deliver_ms)
                and PROPERTY_TIMER_DEL_UNIQKEY not in props
            ):
                return True
    return False


def status(timer: TimerMessageService, topic: str | None, max_next_due: int) -> TimerStatus:
    """See :class:`TimerStatus`; ``topic`` None: every topic with pending timers.
    Up to ``max_next_due`` delivery times per topic (0: none), found by walking
    the wheel from the scan position (at most :data:`MAX_STATUS_ENTRIES` entries)."""
    with timer.lock:
        st = timer.state
        counts = {t: c for t, c in st.counts.items() if c > 0}
        if topic is not None:
            counts = {topic: counts.get(topic, 0)}
        due: dict[str, list[int]] = {t: [] for t in counts}
        if max_next_due > 0 and any(counts.values()):
            by_hash = {topic_hash(t): t for t in counts}
            seen = 0
            end = st.scan_tick + timer.ring_slots
            for tick, entry in pending_entries(timer, st.scan_tick, end):
                name = by_hash.get(entry.topic_hash)
                if entry.is_delete or name is None:
                    continue
                due[name].append(entry.deliver_ms)
                seen += 1
                # A slot's time bounds what later slots can hold, rolled ones aside.
                horizon = tick * timer.precision_ms
                if seen >= MAX_STATUS_ENTRIES or all(
                    sum(1 for d in due[t] if d <= horizon) >= max_next_due for t in due
                ):
                    break
        cq = timer.store.consume_queues.get(TIMER_TOPIC, 0)
        topics = tuple(
            TimerTopicStatus(t, counts[t], tuple(sorted(due[t])[:max_next_due]))
            for t in sorted(counts)
        )
        return TimerStatus(
            pending=sum(st.counts.values()),
            topics=topics,
            scan_ms=st.scan_tick * timer.precision_ms,
            enqueue_offset=st.enqueue_offset,
            queue_max_offset=cq.max_offset_in_queue if cq is not None else 0,
            enabled=timer.enabled,
            timer_log_bytes=timer.log.disk_bytes() if timer.log.file_starts else 0,
            delivered=timer.delivered,
            cancelled=timer.cancelled,
        )


def pending_entries(
    timer: TimerMessageService, first_tick: int, last_tick: int
) -> list[tuple[int, TimerEntry]]:
    """(tick, entry) of every entry filed in slots [first_tick, last_tick) and not
    delivered yet, in tick order, skipping empty buckets. Caller holds ``lock``."""
    out: list[tuple[int, TimerEntry]] = []
    open_slot = timer.open_slot
    for bucket in sorted(b for b, c in timer.state.buckets.items() if c > 0):
        lo = max(bucket * BUCKET_TICKS, first_tick)
        hi = min((bucket + 1) * BUCKET_TICKS, last_tick)
        if lo >= hi:
            continue
        for tick, _, last, _ in timer.wheel.occupied(lo, hi - lo):
            entries = timer.log.chain(last)
            if open_slot is not None and open_slot.tick == tick:
                # The open slot: what it delivered already is not pending.
                held, seen = open_slot.held_positions(), open_slot.last
                entries = [e for e in entries if e.is_delete or e.pos in held or e.pos > seen]
            out += [(tick, e) for e in entries]
    return out


def progress(timer: TimerMessageService) -> bytes:
    """The scan position and enqueue offset, for a slave (:func:`adopt`)."""
    with timer.lock:
        st = timer.state
        return encode_progress(st.scan_tick * timer.precision_ms, st.enqueue_offset)


def adopt(timer: TimerMessageService, data: bytes) -> None:
    """A slave takes its master's progress: its enqueue stops at the master's
    offset (what lies below it and before the master's scan was delivered by
    the master), and once its own enqueue is not past that offset its scan
    position moves up to the master's (the entries it passes are dropped from
    the pending counts). Raises ValueError for bytes that are not progress."""
    scan_ms, offset = decode_progress(data)
    with timer.lock:
        st = timer.state
        st.master_cap = max(st.master_cap, offset)
        st.skip_below = max(st.skip_below, offset)
        scan = scan_ms // timer.precision_ms
        if st.enqueue_offset > offset or scan <= st.scan_tick:
            return
        for _, entry in pending_entries(timer, st.scan_tick, scan):
            if not entry.is_delete:
                timer._uncount_hash(entry.topic_hash)
        timer.open_slot = None  # passed over, not done here: not counted done
        timer._advance(scan)


__all__ = [
    "RecallFailed",
    "TimerStatus",
    "TimerTopicStatus",
    "adopt",
    "pending_entries",
    "progress",
    "recall",
    "status",
]
