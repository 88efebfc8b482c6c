"""TimerMessageService: RocketMQ 5's TimerMessageStore for one store (docs/timers.md).

One thread does both halves, so no message can be filed in a slot the scan
has already passed:

* **enqueue** reads the timer topic's ConsumeQueue (queue 0) from
  ``enqueue_offset``. Each record's TIMER_OUT_MS gives its tick ``T``
  (:func:`~basalt.store.timer.park.tick_of`). ``T`` at or past the scan
  position ``S`` is filed: a TimerLog entry linked into slot ``T`` of the
  wheel - or, when ``T`` is a roll window or more ahead, into the slot a roll
  window ahead with the ROLL flag. ``T`` before ``S`` (it came late) is
  delivered at once. A recall's delete marker is filed the same way.
* **scan** takes each tick whose time has come (tick * precision <= now),
  walks its slot's list, and re-puts every message to its real topic/queue
  (:func:`basalt.store.schedule.unpark`: body, tags, keys, UNIQ_KEY, born
  fields kept), skipping the ones a delete marker of the slot (or a recall
  made meanwhile) names; ROLL entries are written to the timer topic again to
  be enqueued anew. Buckets of :data:`BUCKET_TICKS` ticks count what is filed,
  so empty stretches are skipped without reading the wheel.

Invariant (what recovery and a rebuild rely on): a timer-topic unit below
``enqueue_offset`` whose tick is below ``S`` has been delivered.

Checkpoint (``config/timercheck``, every ``timer_flush_interval_ms`` and at
shutdown, on this thread, never on a put): fsync the TimerLog, write the
checkpoint (holding the slots changed since the last), then write and fsync
those slots into the wheel. After a kill -9 the store restarts from the last
checkpoint: the TimerLog is cut back to its end, its slots are replayed,
enqueue and scan resume from its offsets, so what was delivered since is
delivered again (at least once) and nothing filed since is lost (it is
enqueued again from the ConsumeQueue). A TimerLog or wheel that does not
match the checkpoint is rebuilt from the ConsumeQueue (:meth:`_rebuild`).

Controller mode: only a master scans and delivers (``enabled``). A slave
keeps enqueueing - its wheel is ready when it is promoted - up to the queue
offset its master reported (:meth:`adopt_progress`), and adopts the master's
scan position.
"""

from __future__ import annotations

import errno
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Protocol

from basalt.common.message import (
    PROPERTY_REAL_TOPIC,
    PROPERTY_TIMER_DEL_UNIQKEY,
    PROPERTY_TIMER_ROLL_TIMES,
    TIMER_TOPIC,
    Message,
    MessageRecord,
)
from basalt.store.commitlog import CommitLog
from basalt.store.config import MessageStoreConfig
from basalt.store.consume_queue import BLANK_UNIT_SIZE, UNIT
from basalt.store.consume_queue_table import ConsumeQueueTable
from basalt.store.errors import CorruptRecordError
from basalt.store.files import write_atomically
from basalt.store.put_result import PutMessageResult, PutStatus
from basalt.store.schedule import unpark
from basalt.store.service_thread import ServiceThread
from basalt.store.timer.checkpoint import TimerState, decode_state, encode_state
from basalt.store.timer.files import (
    MAGIC_DEFAULT,
    MAGIC_DELETE,
    MAGIC_ROLL,
    TimerEntry,
    TimerLog,
    TimerWheel,
    encode_entry,
    topic_hash,
)
from basalt.store.timer.park import DELIVERY_DROPS, delete_key, out_ms, rolled, tick_of
from basalt.store.timer.slot import DueSlot

log = logging.getLogger(__name__)

#: Ticks per bucket of the pending counts (about 100 s at 100 ms).
BUCKET_TICKS = 1024
#: The wheel's spare slots past twice the roll window (RocketMQ's TIMER_BLANK_SLOTS).
BLANK_MS = 60_000
#: ConsumeQueue units one enqueue round takes (then due slots are scanned).
UNITS_PER_ROUND = 4096
#: Deliveries a tick at most: within a tick the scan wakes at each message's
#: time but no sooner than precision / this after its previous delivery (20 ms
#: at the default): each delivery costs a put and its consumers' fetches
#: (docs/timers.md, "Precision and range").
DELIVERY_STEPS = 5
#: Messages re-put per put (one append, one fsync under SYNC flush).
DELIVER_BATCH = 64
#: More changed slots than this and a checkpoint is taken early (bounds memory).
MAX_DIRTY_SLOTS = 50_000
#: Puts refused for good: the message is skipped (logged), as the delay levels do.
_UNDELIVERABLE = frozenset({PutStatus.MESSAGE_ILLEGAL, PutStatus.PROPERTIES_SIZE_EXCEEDED})
_RETRY_S = 1.0


class _Store(Protocol):
    commitlog: CommitLog
    consume_queues: ConsumeQueueTable

    def put_internal(self, messages: Sequence[Message]) -> PutMessageResult: ...


def ring_slots(config: MessageStoreConfig) -> int:
    """The wheel's slots: twice the roll window (capped at the max delay) plus spare."""
    p = config.timer_precision_ms
    roll = min(config.timer_roll_window_sec, config.timer_max_delay_sec) * 1000
    return 2 * -(-roll // p) + -(-BLANK_MS // p)


class TimerMessageService(ServiceThread):
    """See the module's doc. Thread-safe: every step holds ``lock``."""

    name = "timer-message-service"

    def __init__(
        self, store: _Store, config: MessageStoreConfig, *, now_ms: Callable[[], int]
    ) -> None:
        super().__init__()
        self.store = store
        self.config = config
        self.now_ms = now_ms
        self.precision_ms = config.timer_precision_ms
        #: The least the scan waits between two deliveries within a tick.
        self.step_ms = max(1, self.precision_ms // DELIVERY_STEPS)
        self.max_delay_ms = config.timer_max_delay_sec * 1000
        roll_ms = min(config.timer_roll_window_sec, config.timer_max_delay_sec) * 1000
        self.roll_ticks = -(-roll_ms // self.precision_ms)
        self.ring_slots = ring_slots(config)
        self.checkpoint_path: Path = config.timer_checkpoint_path
        self.log = TimerLog(config.timer_dir, config.mapped_file_size_timer_log)
        self.wheel = TimerWheel(config.timer_wheel_path, self.ring_slots)
        self.state = TimerState(self.precision_ms, self.ring_slots)
        self.lock = threading.RLock()
        #: Whether due messages are delivered (a controller-mode slave's is off).
        self.enabled = True
        #: Recalls made since their marker may not be filed yet: delete key -> tick.
        self.recalled: dict[str, int] = {}
        #: Why the last start rebuilt the TimerLog and wheel (None: it did not).
        self.rebuilt: str | None = None
        self.delivered = 0
        self.rolled = 0
        self.cancelled = 0
        self.skipped = 0
        #: The slot the scan is in, its entries held until each one's time
        #: (store.timer.slot); None between ticks.
        self.open_slot: DueSlot | None = None
        self._loaded = False
        self._persisted: tuple[int, ...] = ()

    # -- recovery ---------------------------------------------------------------------

    def load(self) -> None:
        """Open the files and restore the last checkpoint (see the module's doc).
        Raises OSError when a file cannot be read or written."""
        self.checkpoint_path.parent.mkdir(parents=True, exist_ok=True)
        now_tick = tick_of(self.now_ms(), self.precision_ms)
        saved: TimerState | None = None
        problem: str | None = None
        try:
            saved = decode_state(self.checkpoint_path.read_bytes())
        except FileNotFoundError:
            pass
        except ValueError as e:
            problem = f"{self.checkpoint_path} does not parse ({e})"
        self.log.load()
        wheel_ok = self.wheel.open()
        self._loaded = True
        if saved is None:
            if problem is None and not self.log.file_starts:
                self.state = TimerState(self.precision_ms, self.ring_slots, scan_tick=now_tick)
                self.state.enqueue_offset = self._queue_bounds()[0]
                self._persisted = self._signature()  # nothing to write until a timer comes
                return
            # Without a checkpoint nothing says what was delivered: all again.
            self._rebuild(problem or "TimerLog files without a checkpoint", now_tick, 0)
            return
        skip = max(saved.skip_below, saved.enqueue_offset)
        if saved.precision_ms != self.precision_ms or saved.ring_slots != self.ring_slots:
            scan = tick_of(saved.scan_tick * saved.precision_ms, self.precision_ms)
            self._rebuild("timer_precision_ms or the roll window changed", scan, skip)
            return
        problem = None if wheel_ok else f"{self.wheel.path} is not {self.wheel.size_bytes} bytes"
        if saved.log_file_size not in (0, self.log.file_size):
            problem = f"mapped_file_size_timer_log changed from {saved.log_file_size}"
        problem = problem or self.log.covers(saved.log_end)
        if problem is None:
            bad = self.log.damaged_before(saved.log_end, 64)
            if bad is not None:
                problem = f"TimerLog entry at {bad} is damaged"
        if problem is not None:
            self._rebuild(problem, saved.scan_tick, skip)
            return
        self.wheel.write_dirty(saved.slots)  # the checkpoint's slots, maybe not written yet
        self.log.truncate(saved.log_end)  # entries filed after it are filed again
        saved.slots = []
        self.state = saved
        if saved.open_done:  # its slot was open: what it handled is not again
            self.open_slot = DueSlot(saved.scan_tick, skip=saved.open_done)
            saved.open_done = []
        self._persisted = self._signature()
        low, high = self._queue_bounds()
        self.state.enqueue_offset = min(max(saved.enqueue_offset, low), high)

    def _rebuild(self, reason: str, scan_tick: int, skip_below: int) -> None:
        """Start the TimerLog and wheel again, enqueueing the timer topic's whole
        ConsumeQueue: what is below ``skip_below`` and before ``scan_tick`` was
        delivered (the invariant), the rest is filed or delivered again."""
        log.error("timer: %s; rebuilding the TimerLog and wheel from the timer topic", reason)
        self.rebuilt = reason
        self.log.reset()
        self.wheel.close()
        self.wheel.path.unlink(missing_ok=True)
        self.wheel.open()
        self.wheel.dirty.clear()
        self.state = TimerState(
            self.precision_ms,
            self.ring_slots,
            enqueue_offset=self._queue_bounds()[0],
            scan_tick=scan_tick,
            skip_below=skip_below,
        )
        self.checkpoint(force=True)  # a crash during the rebuild starts it again

    def _queue_bounds(self) -> tuple[int, int]:
        cq = self.store.consume_queues.get(TIMER_TOPIC, 0)
        return (0, 0) if cq is None else (cq.min_offset_in_queue, cq.max_offset_in_queue)

    # -- checkpoint -------------------------------------------------------------------

    def _signature(self) -> tuple[int, ...]:
        """What a checkpoint must follow. Not the scan position alone: with nothing
        filed or delivered, an idle store's moving scan needs no write (a start
        from an older position finds the same empty slots)."""
        st = self.state
        return (
            st.enqueue_offset,
            self.log.end,
            st.skip_below,
            st.master_cap,
            len(self.wheel.dirty),
            sum(st.buckets.values()),
            sum(st.counts.values()),
            self.delivered + self.rolled + self.cancelled + self.skipped,
        )

    def checkpoint(self, *, force: bool = False) -> None:
        """fsync the TimerLog, write ``config/timercheck``, write the changed slots
        into the wheel; then delete TimerLog files scanned past. Nothing is
        written when nothing changed since the last one (unless ``force``).
        Raises OSError."""
        with self.lock:
            signature = self._signature()
            if signature == self._persisted and not force:
                return
            self.log.sync()
            slots = [(t, *slot) for t, slot in sorted(self.wheel.dirty.items())]
            st = self.state
            saved = replace(
                st,
                log_end=self.log.end,
                log_file_size=self.log.file_size,
                counts={t: c for t, c in st.counts.items() if c > 0},
                buckets={b: c for b, c in st.buckets.items() if c > 0},
                files=dict(st.files),
                slots=slots,
                open_done=list(self.open_slot.handled)
                if self.open_slot is not None and self.open_slot.tick == st.scan_tick
                else [],
            )
            write_atomically(self.checkpoint_path, encode_state(saved))
            self.wheel.write_dirty(slots)
            self.wheel.dirty.clear()
            writing = self.log.file_start(self.log.end)
            for start, last_tick in list(st.files.items()):
                if last_tick < st.scan_tick and start != writing:
                    self.log.delete_file(start)
                    del st.files[start]
            self._persisted = signature

    # -- the thread -------------------------------------------------------------------

    def run(self) -> None:
        last = time.monotonic()
        interval = self.config.timer_flush_interval_ms / 1000
        while not self._stopping:
            with self.lock:
                busy = self.enqueue_round() >= UNITS_PER_ROUND
            wait = self.scan_due()
            if time.monotonic() - last >= interval or len(self.wheel.dirty) > MAX_DIRTY_SLOTS:
                try:
                    self.checkpoint()
                except OSError as e:
                    if e.errno != errno.ENOSPC:
                        raise  # an fsync error: nothing after it can be vouched for
                    # A full disk: kept in memory, tried again; a crash meanwhile
                    # delivers again what was delivered since the last one.
                    log.warning("timer checkpoint not written: %s", e)
                last = time.monotonic()
            if busy:
                wait = 0
            if wait > 0:
                self._wakeup.wait(min(wait, self.precision_ms / 1000))
            self._wakeup.clear()

    def stop_thread(self) -> None:
        """Stop the thread only: :meth:`run_once` then drives the timer by hand (a
        test's ManualClock, a tool)."""
        super().shutdown()

    def run_once(self) -> None:
        """Enqueue everything parked so far, then deliver what is due."""
        with self.lock:
            while self.enqueue_round() >= UNITS_PER_ROUND:
                pass
        self.scan_due()

    def shutdown(self) -> None:
        """Stop the thread, take a last checkpoint and close the files. Raises
        OSError when the checkpoint fails (then the next start replays more)."""
        super().shutdown()
        if not self._loaded:
            return
        try:
            self.checkpoint()
        finally:
            self.close()

    def close(self) -> None:
        with self.lock:
            self.log.close()
            self.wheel.close()
            self._loaded = False

    def _halted(self) -> bool:
        return self._stopping and self._thread is not None

    # -- enqueue ----------------------------------------------------------------------

    def enqueue_round(self, max_units: int = UNITS_PER_ROUND) -> int:
        """File (or deliver) up to ``max_units`` units of the timer topic; returns
        how many the enqueue offset moved. Caller holds ``lock``."""
        cq = self.store.consume_queues.get(TIMER_TOPIC, 0)
        if cq is None:
            return 0
        st = self.state
        start = q = min(max(st.enqueue_offset, cq.min_offset_in_queue), cq.max_offset_in_queue)
        limit = st.master_cap if not self.enabled and st.master_cap >= 0 else None
        data = cq.read_units(q, max_units)
        now_tick = tick_of(self.now_ms(), self.precision_ms)
        late: list[tuple[int, MessageRecord]] = []
        stalled = False
        for phy, size, _ in UNIT.iter_unpack(data):
            if limit is not None and q >= limit:
                break
            record = None if size == BLANK_UNIT_SIZE else self._record(phy, size)
            due = out_ms(record)
            if record is None or due is None:
                q += 1
                continue
            tick = tick_of(due, self.precision_ms)
            marker = PROPERTY_TIMER_DEL_UNIQKEY in record.properties
            if tick < st.scan_tick:
                # Its time has passed the scan: delivered now, unless already handled.
                if marker or q < st.skip_below:
                    q += 1
                    continue
                if not self.enabled:
                    break  # a slave waits for its master's progress or its promotion
                late.append((q, record))
                q += 1
                continue
            if late:
                q, stalled = self._deliver_late(late, q)
                late = []
                if stalled:
                    break
            base = max(st.scan_tick, now_tick)
            slot, magic = tick, MAGIC_DELETE if marker else MAGIC_DEFAULT
            if tick - base >= self.roll_ticks:
                slot, magic = base + self.roll_ticks, magic | MAGIC_ROLL
            if slot >= st.scan_tick + self.ring_slots:
                break  # the scan is a whole ring behind: it catches up first
            topic = record.properties.get(PROPERTY_REAL_TOPIC, "")
            # A rolled message was counted when first filed.
            new = not marker and PROPERTY_TIMER_ROLL_TIMES not in record.properties
            self._file(slot, magic, due, phy, size, topic, counted=new)
            q += 1
        if late and not stalled:
            q, _ = self._deliver_late(late, q)
        self.log.write()
        st.enqueue_offset = q
        return q - start

    def _deliver_late(self, late: list[tuple[int, MessageRecord]], q: int) -> tuple[int, bool]:
        """Deliver records that came after the scan passed their tick; returns the
        enqueue offset to continue from and whether a put failed (retry later)."""
        messages = []
        for offset, record in late:
            key = delete_key(record.properties.get(PROPERTY_REAL_TOPIC, ""), record.uniq_key or "")
            if key in self.recalled:
                self.cancelled += 1
                continue
            try:
                messages.append((offset, unpark(record, DELIVERY_DROPS)))
            except ValueError as e:
                log.error("timer: a parked message cannot be delivered: %s", e)
                self.skipped += 1
        done = self._put([m for _, m in messages])
        if done < len(messages):
            return messages[done][0], True
        return q, False

    def _file(
        self, slot: int, magic: int, due: int, phy: int, size: int, topic: str, *, counted: bool
    ) -> None:
        st = self.state
        current = self.wheel.get(slot)
        prev = current[1] if current is not None else -1
        pos = self.log.append(encode_entry(prev, slot, due, phy, size, magic, topic_hash(topic)))
        first = current[0] if current is not None else pos
        self.wheel.put(slot, first, pos, (current[2] if current is not None else 0) + 1)
        if counted:
            st.counts[topic] = st.counts.get(topic, 0) + 1
        bucket = slot // BUCKET_TICKS
        st.buckets[bucket] = st.buckets.get(bucket, 0) + 1
        fstart = self.log.file_start(pos)
        st.files[fstart] = max(st.files.get(fstart, 0), slot)

    def _record(self, phy: int, size: int) -> MessageRecord | None:
        try:
            return self.store.commitlog.get_record(phy, size)
        except CorruptRecordError as e:
            log.error("timer: record at %d is damaged: %s", phy, e)
            return None

    # -- scan -------------------------------------------------------------------------

    def scan_due(self) -> float:
        """Deliver what is due: open each tick as its first millisecond comes,
        deliver each of its messages at its own time, leave it once its time is
        all past. Returns seconds until the next thing comes due."""
        p = self.precision_ms
        while not self._halted():
            with self.lock:
                if not self.enabled:
                    return p / 1000
                st = self.state
                now = self.now_ms()
                # Ticks below ``passed`` are all past: every message filed in
                # them is due, and none can be filed there any more once the
                # scan leaves them (the enqueue delivers such a late one at
                # once). The tick ``now`` falls in has started.
                passed = now // p + 1
                tick = st.scan_tick
                if tick > tick_of(now, p):
                    return ((tick - 1) * p + 1 - now) / 1000  # its first ms
                bucket = tick // BUCKET_TICKS
                if st.buckets.get(bucket, 0) <= 0:
                    later = [b for b, c in st.buckets.items() if b > bucket and c > 0]
                    target = min(min(later) * BUCKET_TICKS if later else passed, passed)
                    if target <= tick:
                        return (tick * p - now) / 1000  # the open tick's end
                    self._advance(target)
                    continue
                slot = self.wheel.get(tick)
                held: int | None = None
                if slot is not None:
                    delivered, held = self._scan_slot(tick, slot[1], now, whole=tick < passed)
                    if not delivered:
                        return _RETRY_S
                if tick < passed:
                    self._advance(tick + 1)
                    continue
                # The tick now falls in: wait for its end, or its next message
                # but at least a step (what comes due meanwhile goes together).
                if held is None:
                    return (tick * p - now) / 1000
                return max(held - now, self.step_ms) / 1000
        return 0.0

    def _advance(self, tick: int) -> None:
        """Move the scan to ``tick``: every slot below it is done."""
        st = self.state
        if self.open_slot is not None:
            if self.open_slot.tick < tick:
                bucket = self.open_slot.tick // BUCKET_TICKS
                st.buckets[bucket] = st.buckets.get(bucket, 0) - self._filed(self.open_slot.tick)
            self.open_slot = None
        st.scan_tick = tick
        for b in [b for b in st.buckets if (b + 1) * BUCKET_TICKS <= tick]:
            del st.buckets[b]
        if self.recalled:
            self.recalled = {k: t for k, t in self.recalled.items() if t >= tick}

    def _filed(self, tick: int) -> int:
        slot = self.wheel.get(tick)
        return slot[2] if slot is not None else 0

    def _scan_slot(self, tick: int, last: int, now: int, *, whole: bool) -> tuple[bool, int | None]:
        """Deliver what is due of slot ``tick`` (all of it when ``whole``: its time
        is past). Returns (False when a put failed - the rest waits for the next
        try - , the time the next entry held comes due or None)."""
        current = self.open_slot
        if current is None or current.tick != tick:
            current = self.open_slot = DueSlot(tick)
        current.refresh(self.log, last, self._record)
        due = len(current.held) if whole else current.due_count(now)
        done = current.handle(due, self._prepare, self._flush_batch, DELIVER_BATCH)
        return done, current.next_due_ms()

    def _prepare(self, e: TimerEntry, deletes: set[str]) -> tuple[Message, str] | None:
        """What handling entry ``e`` puts (its delivery, or its roll) and its
        topic; None when it is skipped (cancelled, its record gone, refused)."""
        record = self._record(e.phy, e.size)
        if record is None:  # its CommitLog file expired (or is damaged)
            self._uncount_hash(e.topic_hash)
            self.skipped += 1
            return None
        topic = record.properties.get(PROPERTY_REAL_TOPIC, "")
        key = delete_key(topic, record.uniq_key or "")
        marker = PROPERTY_TIMER_DEL_UNIQKEY in record.properties  # a rolled one
        if not marker and record.uniq_key and (key in deletes or key in self.recalled):
            self._uncount(topic)
            self.cancelled += 1
            return None
        message = rolled(record) if e.is_roll else self._delivery(record)
        if message is None:
            self._uncount(topic)
            return None
        return message, topic

    def _flush_batch(self, batch: list[tuple[Message, str]]) -> int:
        """Put a slot's batch; returns how many are done (fewer than all: the
        store refused for now)."""
        put = self._put([m for m, _ in batch])
        for message, topic in batch[:put]:
            if message.topic == TIMER_TOPIC:
                self.rolled += 1  # still pending: it is filed again
            else:
                self._uncount(topic)
        return put

    def _delivery(self, record: MessageRecord) -> Message | None:
        try:
            return unpark(record, DELIVERY_DROPS)
        except ValueError as e:
            log.error("timer: a parked message cannot be delivered: %s", e)
            self.skipped += 1
            return None

    def _put(self, messages: list[Message]) -> int:
        """Put ``messages``; returns how many are done (put, or skipped as refused
        for good). Fewer than all: the store refused for now (retry later)."""
        if not messages:
            return 0
        result = self.store.put_internal(messages)
        if result.status in (PutStatus.PUT_OK, PutStatus.FLUSH_DISK_TIMEOUT):
            self.delivered += sum(1 for m in messages if m.topic != TIMER_TOPIC)
            return len(messages)
        if result.status not in _UNDELIVERABLE:
            log.warning("timer: delivering: %s; retrying", result.detail)
            return 0
        for i, message in enumerate(messages):  # one bad message: the others go alone
            one = self.store.put_internal([message])
            if one.status in _UNDELIVERABLE:
                log.error("timer: message for %s refused: %s", message.topic, one.detail)
                self.skipped += 1
            elif one.status not in (PutStatus.PUT_OK, PutStatus.FLUSH_DISK_TIMEOUT):
                return i
            elif message.topic != TIMER_TOPIC:
                self.delivered += 1
        return len(messages)

    def _uncount(self, topic: str) -> None:
        counts = self.state.counts
        left = counts.get(topic, 0) - 1
        if left > 0:
            counts[topic] = left
        else:
            counts.pop(topic, None)

    def _uncount_hash(self, t_hash: int) -> None:
        for topic in self.state.counts:
            if topic_hash(topic) == t_hash:
                self._uncount(topic)
                return


__all__ = ["BUCKET_TICKS", "TimerMessageService", "ring_slots"]
