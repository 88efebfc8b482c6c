"""The dispatcher: RocketMQ's ReputMessageService.

Follows the CommitLog from ``reput_from_offset`` and, for every committed or
non-transactional record, appends a ConsumeQueue unit and tells the registered
listeners (per record, with its properties). A record is visible to readers
only once its unit exists, so the dispatcher is what makes a send consumable.
*Followers* (the IndexFile) are built after each round, on this thread, in
bulk and behind the ConsumeQueues: they never hold a send back.

Concurrency: one dispatcher thread, plus the writers: after an append, a
writer that finds the dispatcher idle and caught up applies its own hand-off
(:meth:`ReputMessageService.on_append`) instead of waking the thread. Every
dispatch step holds ``_dispatch_lock``, so steps never interleave and the
ConsumeQueues still see one writer at a time.

Confirm offset: with :attr:`ReputMessageService.confirm_offset` set (a store in
controller mode, see docs/replication.md), nothing at or past it is dispatched
- no ConsumeQueue unit, listener call, arrival or index entry - so a consumer
never reads a record a failover could take back. None (the default) bounds
dispatch by the CommitLog's end only, and costs the hot path nothing but one
``is None`` test per append.

Failure: an error while dispatching (EMFILE opening a ConsumeQueue file, an
I/O error) or a record that does not parse stops dispatching for good - on
either path - and is recorded in ``failures`` (the store's
:class:`~basalt.store.failures.FailureChannel`) as service
``reput-message-service``: sends are then refused, since nothing sent after
it could ever be consumed.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from basalt.common import _records
from basalt.common.message import KEY_SEPARATOR, PROPERTY_KEYS, PROPERTY_UNIQ_KEY, property_value
from basalt.common.record import RecordKind, check_record
from basalt.store.commitlog import Appended, CommitLog, UnitRun
from basalt.store.consume_queue_table import ConsumeQueueTable
from basalt.store.errors import CorruptRecordError, StoreError
from basalt.store.failures import FailureChannel

log = logging.getLogger(__name__)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class _NeedsFile(StoreError):
    """A writer's inline dispatch reached a run that would create a ConsumeQueue
    file, which it leaves for later (see ``on_append``). It never leaves the
    dispatcher."""


#: Pause between dispatch rounds: the visibility latency a send may see.
DISPATCH_PAUSE_S = 0.001
#: How far the followers (the IndexFile) may lag behind the ConsumeQueues.
FOLLOW_PAUSE_S = 0.01


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


class CommitLogFollower(Protocol):
    """Something built from the CommitLog behind the dispatcher, in bulk (the IndexFile)."""

    def build_from_commitlog(self, commitlog: CommitLog, end_offset: int) -> int:
        """Catch up to ``end_offset`` (everything below it is dispatched)."""


class ReputMessageService:
    """Builds ConsumeQueues (and feeds listeners) from the CommitLog."""

    name = "reput-message-service"

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
        #: Dispatch stops here (controller mode); None: at the CommitLog's end. Set
        #: through the store's set_confirm_offset, which then calls wakeup().
        self.confirm_offset: int | None = None
        #: Store time of the last record dispatched: the checkpoint's logics time.
        self.last_store_timestamp_ms = 0
        self.listeners: list[DispatchListener] = []
        #: Followed after every round, on this thread: never in the writer's way.
        self.followers: list[CommitLogFollower] = []
        #: Told ``(topic, queue_id, max offset)`` whenever a queue grew (RocketMQ's
        #: MessageArrivingListener: long polling). Called on the dispatching
        #: thread - the dispatcher's, or a writer's - so it must be quick and
        #: thread-safe.
        self.arrival_listeners: list[Callable[[str, int, int], None]] = []
        self.stalled_reason: str | None = None
        #: Where a failure that stops dispatching is recorded (set by the store).
        self.failures: FailureChannel | None = None
        #: ConsumeQueue units written so far (recovery reports the rebuilt count).
        self.entries_written = 0
        #: Records dispatched from the writer's hand-off rather than read back.
        self.records_from_handoff = 0
        #: Topic names by their UTF-8 bytes, shared with the C walk.
        self._topics: dict[bytes, str] = {}
        #: Whether the last round reached the written end of the CommitLog.
        self._caught_up = False
        #: Reused read buffer: one batch of CommitLog bytes (grown for a larger record).
        self._window = bytearray(batch_size_bytes)
        self._wakeup = threading.Event()
        #: Held by every dispatch step: the thread's and a writer's (see on_append).
        self._dispatch_lock = threading.Lock()
        #: Writers may dispatch their own hand-off: only while the thread runs, so a
        #: stopped dispatcher (shutdown, tests) really stops dispatching.
        self._inline = False
        self._progress = threading.Condition()
        #: Threads in wait_until_dispatched (guarded by _progress): _advance skips
        #: the condition's lock when there are none, which is every append.
        self._waiters = 0
        self._stopping = False
        self._thread: threading.Thread | None = None

    # -- the loop ---------------------------------------------------------------------

    def dispatch_end(self) -> int:
        """Where dispatch stops: the CommitLog's end, or the confirm offset below it."""
        end = self.commitlog.max_offset
        bound = self.confirm_offset
        return end if bound is None or bound > end else bound

    @property
    def behind_bytes(self) -> int:
        """Bytes left to dispatch up to :meth:`dispatch_end` (records above the confirm
        offset are not behind: they wait for it)."""
        return max(0, self.dispatch_end() - self.reput_from_offset)

    def wakeup(self) -> None:
        # Called after every append: skip the Event's lock when a wake-up is pending.
        if not self._wakeup.is_set():
            self._wakeup.set()

    def on_append(self) -> None:
        """Called by a writer after each append, outside the put lock.

        In the steady state - the dispatcher caught up, no listener needing
        each record's properties - the writer's own hand-off continues exactly
        at ``reput_from_offset``, and the writer applies it here: a few
        microseconds of ConsumeQueue copies. Waking the thread instead would
        cost more than the work itself, because the two threads would trade
        the GIL around every ``pwrite`` (measured: appends 30-40 % slower).
        Anything else (a roll, a backlog, an overflowed hand-off, a writer
        already dispatching) wakes the thread.
        """
        bound = self.confirm_offset
        if bound is not None and self.reput_from_offset >= bound:
            # Caught up to the confirm offset (controller mode): the append waits for
            # it, and moving it calls this again - the master's own confirm, right
            # after a send of a group of one. Nothing to apply or wake for: not even
            # the lock (a stale read only takes the path below).
            return
        loop = _running_loop()
        try:
            if self._apply_inline(may_create=loop is None):
                return
        except _NeedsFile:
            # A writer on an event loop (a send being answered): the run that makes a
            # ConsumeQueue file (a mkdir and an open, which wait on the filesystem's
            # journal while a flusher fsyncs: ~0.1 ms measured) is applied on the loop
            # after the callbacks already queued, so the sends this append settles
            # are answered first. A read that arrives after an answer is a later
            # event: it finds the units applied.
            loop.call_soon(loop.call_soon, self._apply_deferred)  # type: ignore[union-attr]
            return
        if self.confirm_offset is not None and self.behind_bytes == 0:
            # Caught up to the confirm offset (controller mode): what was appended
            # waits for it, and moving it calls this again. Waking the thread for
            # nothing would trade the GIL with it on every send.
            return
        self.wakeup()

    def _apply_deferred(self) -> None:
        if not self._apply_inline(may_create=True):
            self.wakeup()

    def _apply_inline(self, *, may_create: bool) -> bool:
        """Apply the writer's hand-off on the writer's thread if the dispatcher is
        idle and the hand-off continues at ``reput_from_offset``; True when that
        left the dispatcher caught up (nothing for the thread to do). Raises
        :class:`_NeedsFile` (the rest left in the hand-off) at a run that would
        create a file, unless ``may_create``."""
        if not (
            self._inline and not self.listeners and self._dispatch_lock.acquire(blocking=False)
        ):
            return False
        try:
            handoff = self.commitlog.handoff
            start = self.reput_from_offset
            while handoff and handoff[0].end <= start:
                handoff.popleft()
            if not (
                handoff
                and handoff[0].start == start
                and self.stalled_reason is None
                and self._inline
            ):
                return False
            try:
                self._take_handoff(handoff, inline=not may_create)
            except _NeedsFile:
                raise  # not a failure: the caller applies the rest later
            except Exception as e:
                # The writer's append itself succeeded: the failure is the
                # dispatcher's, and stops it as it would on its thread.
                self._fail(e)
                return True
            # Followers catch up on the thread's own schedule.
            return self._caught_up
        finally:
            self._dispatch_lock.release()

    @property
    def running(self) -> bool:
        """Whether the dispatcher's thread runs."""
        return self._thread is not None

    def start(self) -> None:
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()
        self._inline = True

    def _run(self) -> None:
        while not self._stopping:
            # Followers (the index) are brought up to date every FOLLOW_PAUSE_S even
            # when no writer wakes the thread: writers dispatching their own appends
            # do not, so that the thread takes the GIL from them rarely.
            self._wakeup.wait(FOLLOW_PAUSE_S if self.followers else 0.1)
            self._wakeup.clear()
            try:
                # Rounds back to back only while behind by more than a window; once
                # caught up, RocketMQ's 1 ms reput pause: under a stream of sends one
                # round per millisecond dispatches many records at once instead of
                # chasing the writer a few records at a time and taking the GIL from
                # it on every round.
                while self.dispatch_available() and not self._caught_up and not self._stopping:
                    pass
                self.follow()
                time.sleep(DISPATCH_PAUSE_S)
            except Exception as e:
                self._fail(e)

    def shutdown(self, *, drain: bool = True) -> None:
        """Stop the thread; with ``drain`` dispatch everything appended first."""
        self._inline = False
        self._stopping = True
        self._wakeup.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if drain and self.stalled_reason is None:
            while self.dispatch_available():
                pass
            self.follow()

    def follow(self) -> None:
        """Let every follower catch up with what is dispatched (this thread, or
        while it is not running)."""
        for follower in self.followers:
            try:
                follower.build_from_commitlog(self.commitlog, self.reput_from_offset)
            except Exception:
                # A follower (the index) must never stop the ConsumeQueues: it
                # is left behind, and logged, and tried again next round.
                log.exception("%s could not catch up", type(follower).__name__)

    def wait_until_dispatched(self, offset: int | None = None, timeout_s: float = 10.0) -> bool:
        """Block until everything below ``offset`` (default: the current end) is dispatched."""
        target = self.dispatch_end() if offset is None else offset
        with self._progress:
            self._waiters += 1
            try:
                reached = self._progress.wait_for(
                    lambda: self.reput_from_offset >= target or self.stalled_reason is not None,
                    timeout_s,
                )
            finally:
                self._waiters -= 1
        return reached and self.stalled_reason is None

    # -- one step ---------------------------------------------------------------------

    def dispatch_available(self) -> int:
        """Dispatch one batch of what the CommitLog holds past ``reput_from_offset``.

        Returns the number of records consumed (dispatched or skipped), 0 when
        caught up. A record that does not parse stops dispatching and sets
        ``stalled_reason``: the CommitLog is corrupt and a restart's recovery
        must decide.

        The units of records appended since the last round usually come from
        the writer's hand-off (:attr:`CommitLog.handoff`: what it stamped), so
        nothing is read back; the CommitLog itself is walked whenever the
        hand-off does not continue exactly at ``reput_from_offset`` (recovery,
        a file roll, a hand-off that overflowed) and whenever listeners need
        each record's properties.
        """
        with self._dispatch_lock:
            return self._dispatch_step()

    def _dispatch_step(self) -> int:
        commitlog = self.commitlog
        if self.reput_from_offset < commitlog.min_offset:
            self.reput_from_offset = commitlog.min_offset
        start = self.reput_from_offset
        end = self.dispatch_end()
        if start >= end or self.stalled_reason is not None:
            return 0
        handoff = commitlog.handoff
        while handoff and handoff[0].end <= start:
            handoff.popleft()  # already dispatched by a walk of the CommitLog
        if handoff and handoff[0].start == start and handoff[0].end <= end and not self.listeners:
            return self._take_handoff(handoff)
        mf = commitlog.files.find_by_offset(start)
        if mf is None:
            return 0
        rel = start - mf.file_from_offset
        avail = min(mf.wrote_position, end - mf.file_from_offset) - rel
        if avail <= 0:
            return 0
        # One C call reads the window (pread, not the mapping: a page fault per
        # fresh page costs more than the copy) and walks it, with the GIL released.
        window = self._window
        pos, kind, reason, consumed, last_ts, runs, records, need = _records.dispatch(
            mf.fd,
            rel,
            avail,
            start,
            window,
            bool(self.listeners),
            self._topics,
            commitlog.delays,
        )
        if kind == _records.KIND_CORRUPT and end < mf.file_from_offset + mf.wrote_position:
            # The confirm offset may cut a record (it is whatever the master sent):
            # a whole record past it is no damage, only not dispatchable yet.
            at = rel + pos
            info = check_record(mf.buffer, at, mf.wrote_position, check_crc=False)
            if info.kind is RecordKind.MESSAGE and mf.file_from_offset + at + info.size > end:
                kind = _records.KIND_END
        if kind == _records.KIND_CORRUPT:
            self._stall(start + pos, reason)
        elif need > len(window):
            self._window = bytearray(need)  # a record larger than the window: grow it
        self._apply(runs)
        if records:
            requests = [
                DispatchRequest(t, q, phys, size, tags, ts, qoff, flag, bytes(window[ps:pe]))
                for t, q, phys, size, tags, ts, qoff, flag, ps, pe in records
            ]
            for listener in self.listeners:
                listener.on_dispatch(requests)
        if consumed:
            self.last_store_timestamp_ms = last_ts
        if kind == _records.KIND_BLANK:
            self._advance(commitlog.roll_next_file(mf.file_from_offset))
            return consumed + 1
        self._advance(start + pos)
        self._caught_up = kind == _records.KIND_END
        return consumed if consumed or kind != _records.KIND_MORE else 1

    def _take_handoff(self, handoff: deque[Appended], *, inline: bool = False) -> int:
        """Apply the writer's consecutive hand-offs from ``reput_from_offset`` on.

        ``inline`` (a writer applying its own append): raises :class:`_NeedsFile`
        at the first run that would create a ConsumeQueue file, with that entry
        back at the hand-off's head and what came before it applied."""
        end = self.reput_from_offset
        records = 0
        last_ts = self.last_store_timestamp_ms
        bound = self.confirm_offset
        try:
            while handoff:
                # Pop, then check: the writer may drop the oldest entry (a full
                # hand-off) between a look at handoff[0] and a popleft. Whatever is
                # not contiguous is left to a walk of the CommitLog.
                appended = handoff.popleft()
                if appended.start != end or (bound is not None and appended.end > bound):
                    # Past the confirm offset: kept until it moves (or walked then).
                    handoff.appendleft(appended)
                    break
                try:
                    self._apply(appended.runs, inline=inline)
                except _NeedsFile:
                    # Its runs before the one that stopped are written: applied
                    # again by the thread, they are skipped (put_units is idempotent).
                    handoff.appendleft(appended)
                    raise
                end = appended.end
                records += appended.records
                last_ts = appended.store_timestamp_ms
        finally:
            self.last_store_timestamp_ms = last_ts
            self.records_from_handoff += records
            self._advance(end)
            self._caught_up = end >= self.dispatch_end()
        return records

    def _apply(self, runs: list[UnitRun], *, inline: bool = False) -> None:
        find = self.consume_queues.find_or_create
        for topic, queue_id, first_offset, count, units in runs:
            cq = find(topic, queue_id)
            # A new queue's (or a full file's) first unit creates a file: a mkdir
            # and an open, which wait on the filesystem's journal while a flusher
            # fsyncs (~0.1-0.3 ms each measured). Left to the thread, so that a
            # first put into a new queue is answered without waiting for them.
            if inline and not cq.fits_in_last_file(first_offset, count):
                raise _NeedsFile
            self.entries_written += cq.put_units(first_offset, count, units)
            for arrived in self.arrival_listeners:
                arrived(topic, queue_id, first_offset + count)

    def _advance(self, offset: int) -> None:
        self.reput_from_offset = offset
        # Read after the write above: a waiter counts itself in before it tests
        # reput_from_offset (under the lock), so none can miss this offset.
        if self._waiters:
            with self._progress:
                self._progress.notify_all()

    def _stall(self, offset: int, reason: str) -> None:
        error = CorruptRecordError(offset, reason)
        self.stalled_reason = str(error)
        if self.failures is not None:
            self.failures.record(self.name, error)
        else:
            log.error("dispatcher stopped: %s", self.stalled_reason)
        with self._progress:
            self._progress.notify_all()

    def _fail(self, error: Exception) -> None:
        """Stop dispatching for good after ``error`` (either path): record it, and
        wake whoever waits for dispatch progress that will not come."""
        self._inline = False
        self._stopping = True
        self.stalled_reason = (
            f"dispatcher failed at offset {self.reput_from_offset}: {type(error).__name__}: {error}"
        )
        if self.failures is not None:
            self.failures.record(self.name, error)
        else:
            log.error("%s", self.stalled_reason, exc_info=error)
        with self._progress:
            self._progress.notify_all()
