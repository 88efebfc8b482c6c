"""The master's bookkeeping of its slaves' acks and of the in-sync set
(docs/replication.md, "The stream"): RocketMQ's AutoSwitchHAService
``syncStateSet`` / ``computeConfirmOffset`` / ``maybeShrinkSyncStateSet`` /
``maybeExpandInSyncStateSet``, without the network and without etcd.

Terms:

* a member's **acked offset**: the highest offset its stream acked (written,
  or fsynced when its store is SYNC_FLUSH); unknown until it connects.
* the **counted members**: the in-sync set, and while a change of it is
  pending (:meth:`SyncSetBook.begin_change`) the union of the old and the new
  set, so a send acknowledged during the change is on every member of
  whichever set the CAS leaves in place (RocketMQ #5663).
* the **confirm offset**: the lowest acked offset over the counted members,
  the master's own offset included; never goes back. A counted member that
  has not acked yet holds it where it is.
* **caught up**: a slave is caught up as of time t when its ack reached the
  master's max offset as it was at t (recorded with each frame sent, so a
  slave that keeps up with a steady stream is caught up though its ack never
  equals the moving max).

Concurrency: one event loop; no method blocks. :meth:`wait_acked` is the only
coroutine.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections import deque
from typing import Protocol


class Clock(Protocol):
    """Milliseconds on a clock that does not jump (durations, not dates)."""

    def now_ms(self) -> int: ...


class MonotonicClock:
    """``time.monotonic`` in milliseconds."""

    def now_ms(self) -> int:
        return time.monotonic_ns() // 1_000_000


class _Slave:
    """One slave's acks and catch-up times."""

    __slots__ = ("acked", "caught_up_ms", "sent")

    def __init__(self, now_ms: int) -> None:
        #: -1: not acked since the master started.
        self.acked = -1
        #: The last time the slave was caught up; the master's start for one
        #: never seen (so a member that never connects leaves the set in time).
        self.caught_up_ms = now_ms
        #: (master max offset, time) per frame sent and not yet acked up to.
        self.sent: deque[tuple[int, int]] = deque()


class SyncSetBook:
    """Acks, catch-up times, the in-sync set and its pending change, the
    confirm offset, and the sends waiting on acks, for one master term."""

    def __init__(self, master_id: int, sync_state_set: frozenset[int], clock: Clock) -> None:
        if master_id not in sync_state_set:
            raise ValueError(
                f"the in-sync set {sorted(sync_state_set)} must hold the master {master_id}"
            )
        self.master_id = master_id
        self._clock = clock
        self._set = sync_state_set
        self._pending: frozenset[int] | None = None
        self._slaves: dict[int, _Slave] = {}
        self._confirm = -1
        self._waiters: list[tuple[int, int, asyncio.Future[bool]]] = []
        self._order = itertools.count()
        self._started_ms = clock.now_ms()

    # -- the set ------------------------------------------------------------------------

    @property
    def sync_state_set(self) -> frozenset[int]:
        """The in-sync set as last committed (the pending change not included)."""
        return self._set

    @property
    def pending(self) -> frozenset[int] | None:
        """The set a change in flight would commit; None when none is."""
        return self._pending

    def counted(self) -> frozenset[int]:
        """Every member whose ack counts: the set, with the pending one while a
        change is in flight."""
        return self._set if self._pending is None else self._set | self._pending

    def begin_change(self, new_set: frozenset[int]) -> None:
        """A change to ``new_set`` is in flight: count both sets until it ends.
        Raises RuntimeError when one is already in flight (one at a time)."""
        if self._pending is not None:
            raise RuntimeError("a change of the in-sync set is already in flight")
        if self.master_id not in new_set:
            raise ValueError(f"the in-sync set {sorted(new_set)} must hold the master")
        self._pending = new_set

    def end_change(self, committed: bool) -> None:
        """The change in flight ended: ``committed`` (the CAS won) makes the new
        set the set; else the old one stays. Settles the waiters either way."""
        if self._pending is not None and committed:
            self._set = self._pending
        self._pending = None
        self._settle()

    # -- acks ---------------------------------------------------------------------------

    def _slave(self, broker_id: int) -> _Slave:
        slave = self._slaves.get(broker_id)
        if slave is None:
            slave = self._slaves[broker_id] = _Slave(self._started_ms)
        return slave

    def sent(self, broker_id: int, master_max_offset: int) -> None:
        """A frame went to ``broker_id`` while the master's max offset was
        ``master_max_offset``: an ack reaching it means caught up as of now."""
        self._slave(broker_id).sent.append((master_max_offset, self._clock.now_ms()))

    def acked(self, broker_id: int, offset: int, master_max_offset: int) -> None:
        """``broker_id`` acked ``offset`` while the master's max offset is
        ``master_max_offset``. Raises ValueError for an ack going back."""
        slave = self._slave(broker_id)
        if offset < slave.acked:
            raise ValueError(f"broker {broker_id} acked {offset} after {slave.acked}")
        slave.acked = offset
        if offset >= master_max_offset:
            slave.caught_up_ms = self._clock.now_ms()
            slave.sent.clear()
        else:
            while slave.sent and slave.sent[0][0] <= offset:
                slave.caught_up_ms = max(slave.caught_up_ms, slave.sent.popleft()[1])
        self._settle()

    def reconnected(self, broker_id: int) -> None:
        """``broker_id`` opened a new stream: its ack starts again at its
        consistent point (which may be below its last ack, after a truncation);
        frames sent on the old stream are forgotten."""
        slave = self._slave(broker_id)
        slave.acked = -1
        slave.sent.clear()

    def offsets(self) -> dict[int, int]:
        """Each slave seen this term -> its acked offset (-1: none yet)."""
        return {broker_id: slave.acked for broker_id, slave in self._slaves.items()}

    def lagging(
        self, now_ms: int, limit_ms: int, master_max_offset: int | None = None
    ) -> frozenset[int]:
        """Members of the set (not the master) not caught up for over ``limit_ms``.
        A slave whose ack has reached ``master_max_offset`` (the master's max
        offset now) is caught up now: in an idle group no frame is sent and no
        ack comes, and without this every slave would leave the set (and rejoin
        it, and leave it again) once the group had been idle for ``limit_ms``."""
        out: set[int] = set()
        for broker_id in self._set - {self.master_id}:
            slave = self._slave(broker_id)
            if master_max_offset is not None and slave.acked >= master_max_offset:
                slave.caught_up_ms = now_ms
                slave.sent.clear()
            elif now_ms - slave.caught_up_ms > limit_ms:
                out.add(broker_id)
        return frozenset(out)

    def ready_to_join(self) -> frozenset[int]:
        """Slaves outside the set whose ack has reached the confirm offset."""
        return frozenset(
            broker_id
            for broker_id, slave in self._slaves.items()
            if broker_id not in self._set and slave.acked >= 0 and slave.acked >= self._confirm
        )

    # -- the confirm offset -------------------------------------------------------------

    @property
    def confirm_offset(self) -> int:
        """The last confirm offset :meth:`compute_confirm` found; -1 before."""
        return self._confirm

    def _min_counted_slave_ack(self) -> int | None:
        """The lowest ack over the counted slaves (-1 for one not acked yet);
        None when the master is the only counted member."""
        acks = [self._slave(b).acked for b in self.counted() if b != self.master_id]
        return min(acks) if acks else None

    def compute_confirm(self, master_offset: int) -> int:
        """The confirm offset with the master at ``master_offset`` (its max
        offset, or its flushed offset under SYNC_FLUSH); never below the last."""
        lowest = self._min_counted_slave_ack()
        candidate = master_offset if lowest is None else min(master_offset, lowest)
        self._confirm = max(self._confirm, candidate)
        return self._confirm

    def start_confirm(self, confirm_offset: int) -> None:
        """Start from the store's persisted confirm offset (a new term)."""
        self._confirm = max(self._confirm, confirm_offset)

    # -- sends waiting on acks ----------------------------------------------------------

    def all_acked(self, end_offset: int) -> bool:
        """True when every counted slave has acked ``end_offset``."""
        lowest = self._min_counted_slave_ack()
        return lowest is None or lowest >= end_offset

    async def wait_acked(self, end_offset: int, timeout_s: float) -> bool:
        """Wait until every counted slave acked ``end_offset`` (the counted set is
        read again at each ack and each change); False after ``timeout_s``, or
        when :meth:`release_all` gives up on every wait."""
        if self.all_acked(end_offset):
            return True
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (end_offset, next(self._order), future))
        try:
            async with asyncio.timeout(timeout_s):
                return await asyncio.shield(future)
        except TimeoutError:
            return False
        finally:
            if not future.done():
                future.cancel()  # dropped from the heap at the next settle

    def _settle(self) -> None:
        lowest = self._min_counted_slave_ack()
        while self._waiters and (
            self._waiters[0][2].done() or lowest is None or self._waiters[0][0] <= lowest
        ):
            _, _, future = heapq.heappop(self._waiters)
            if not future.done():
                future.set_result(True)

    def release_all(self) -> None:
        """Give up on every waiting send (the master is closing): each answers False."""
        for _, _, future in self._waiters:
            if not future.done():
                future.set_result(False)
        self._waiters.clear()
