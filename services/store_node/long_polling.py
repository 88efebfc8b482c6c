"""Long polling: RocketMQ's PullRequestHoldService, on asyncio.

A pull that finds nothing new may ask to be held for ``suspend_timeout_ms``.
It is parked as a future under its (topic, queue id) - no thread, no polling
loop - and woken when the store reports that the queue grew past the pull's
offset (``MessageStore.add_arrival_listener``), or when its time is up. The
caller then runs the pull again and answers with whatever it finds. A call
reading several queues (GetMessages) is one future parked under each of
them: the first arrival on any wakes it.

Arrivals are reported on whichever thread dispatched (a writer's or the
dispatcher's). :meth:`PullRequestHoldService.notify_arrival` is that
listener: it looks the queue up in a dict (safe from any thread under the
GIL) and crosses to the event loop only when a pull is actually waiting on
that queue, so a store with no held pulls pays one dict lookup per append.

Reads that evaluate a filter against the CommitLog (SQL92: Python code per
record, up to ~0.4 s for a 32-queue GetMessages with a filter at the limits)
run in a worker thread, so the loop keeps answering other calls - a health
Check above all - meanwhile; every other read runs on the loop, where it costs
a few microseconds and a thread hop would cost ~100 (benchmarks/filter_latency.py).

Concurrency: everything but ``notify_arrival`` and the slow reads' ``pull``
runs on the service's event loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(slots=True, kw_only=True)
class HeldRead(Generic[T]):
    """One queue's read in a held call: where it reads and how to judge it."""

    topic: str
    queue_id: int
    #: Where the read starts; moved forward past what a filtered read skipped.
    offset: int
    #: Where the caller asked to read from (``offset`` before any move).
    first_offset: int = field(init=False)
    #: The read itself, from an offset.
    pull: Callable[[int], T]
    #: Whether a result is worth answering at once.
    found: Callable[[T], bool]
    #: Where the next read starts after a result that was not.
    next_offset: Callable[[T], int]
    #: The queue's max offset now.
    max_offset: Callable[[], int]
    #: The pull may take long (it evaluates a filter against the CommitLog): it
    #: runs in a worker thread, not on the loop. ``pull`` must then be safe on
    #: any thread (the store's get_message is).
    slow: bool = False

    def __post_init__(self) -> None:
        self.first_offset = self.offset

    def grew(self) -> bool:
        return self.max_offset() > self.offset


@dataclass(slots=True)
class _Waiter:
    """One held pull: woken once its queue's max offset passes ``offset``."""

    offset: int
    future: asyncio.Future[None] = field(repr=False)


class PullRequestHoldService:
    """Parks pulls until their queue grows or their suspend time runs out."""

    def __init__(self, loop: asyncio.AbstractEventLoop, executor: Executor | None = None) -> None:
        """``executor`` runs the slow reads (:attr:`HeldRead.slow`); None is the
        loop's default executor. Its size bounds how many slow calls read at
        once; the rest queue for a thread without holding the loop."""
        self.loop = loop
        self.executor = executor
        #: (topic, queue id) -> pulls waiting on it. Read from any thread
        #: (notify_arrival), changed only on the loop.
        self._held: dict[tuple[str, int], list[_Waiter]] = {}
        #: Pulls woken by an arrival (rather than their timeout), for the runtime info.
        self.woken_by_arrival = 0
        #: Set by wake_all (a graceful stop): nothing is held any more.
        self._stopping = False

    def wake_all(self) -> None:
        """A graceful stop: answer every held pull now, with what it has, and hold
        no new one (their clients get an empty answer, not a cancelled call)."""
        self._stopping = True
        for waiters in self._held.values():
            for w in waiters:
                if not w.future.done():
                    w.future.set_result(None)

    @property
    def held(self) -> int:
        """Calls parked right now (one parked on several queues counts once)."""
        return len({id(w.future) for waiters in self._held.values() for w in waiters})

    def notify_arrival(self, topic: str, queue_id: int, max_offset: int) -> None:
        """The store's arrival listener: any thread, quick when nothing is held."""
        if (topic, queue_id) in self._held:
            self.loop.call_soon_threadsafe(self._wake, topic, queue_id, max_offset)

    def _wake(self, topic: str, queue_id: int, max_offset: int) -> None:
        waiters = self._held.get((topic, queue_id))
        if not waiters:
            return
        still = []
        for w in waiters:
            if max_offset > w.offset:
                if not w.future.done():
                    w.future.set_result(None)
                    self.woken_by_arrival += 1
            else:
                still.append(w)
        if still:
            self._held[topic, queue_id] = still
        else:
            del self._held[topic, queue_id]

    async def wait_for_arrival(
        self,
        reads: Sequence[HeldRead[Any]],
        timeout_s: float,
        until: asyncio.Future[Any] | None = None,
    ) -> bool:
        """Wait until any read's queue grows past its offset, ``timeout_s``
        elapses or ``until`` is done; True when one grew (or ``until`` ended it).

        The queues are looked at again *after* the waiters are parked: an
        arrival reported on a writer's thread just before that found no waiter
        and sent no wake-up, and must not leave the pull waiting out its timeout.
        """
        if timeout_s <= 0 or self._stopping or (until is not None and until.done()):
            return any(r.grew() for r in reads)
        # One future for the whole call, parked under each of its queues: the
        # first arrival on any of them wakes it.
        future = self.loop.create_future()
        parked = [((r.topic, r.queue_id), _Waiter(r.offset, future)) for r in reads]
        for key, waiter in parked:
            self._held.setdefault(key, []).append(waiter)
        cut = None if until is None else _resolve_on_done(until, future)
        try:
            if any(r.grew() for r in reads):
                return True
            async with asyncio.timeout(timeout_s):
                await asyncio.shield(future)
            return True
        except TimeoutError:
            return False
        finally:
            if cut is not None:
                assert until is not None
                until.remove_done_callback(cut)
            for key, waiter in parked:
                waiters = self._held.get(key)
                if waiters is not None and waiter in waiters:
                    waiters.remove(waiter)
                    if not waiters:
                        del self._held[key]

    def pull_now(self, reads: Sequence[HeldRead[T]]) -> list[T] | None:
        """Every read run now, on the loop (no coroutine); None when one is slow
        (it must run in a worker thread: leave it to :meth:`hold`)."""
        if any(r.slow for r in reads):
            return None
        return [r.pull(r.offset) for r in reads]

    def settled(self, reads: Sequence[HeldRead[T]], results: list[T], timeout_s: float) -> bool:
        """Whether ``results`` of ``reads`` are the answer, with no hold: one found
        something, no hold was asked, or the service stops."""
        return (
            timeout_s <= 0
            or self._stopping
            or any(r.found(result) for r, result in zip(reads, results, strict=True))
        )

    async def hold(
        self,
        reads: Sequence[HeldRead[T]],
        timeout_s: float,
        *,
        until: asyncio.Future[Any] | None = None,
        first: list[T] | None = None,
    ) -> list[T]:
        """Run every read; while none finds anything and time remains, park until
        one of their queues grows and run them all again. Returns the last
        results, in ``reads``' order. ``until``, once done, ends the hold (the
        reads run one last time); ``first``: the results of a run just made
        (:meth:`pull_now`'s), so the reads do not run twice.

        The reads run on the loop, so each must be quick (the store's
        get_message is, unfiltered or filtered by tag: it reads the page
        cache in C), unless one is :attr:`HeldRead.slow`: then the whole
        batch runs in a worker thread (one hop for the call, not one per
        queue), and the loop serves other calls until it is done. A read's ``found`` says
        whether its result is worth answering at once; a filtered read that
        matched nothing moves on to its ``next_offset`` (its scan moved past
        what it skipped) and keeps waiting, as RocketMQ re-checks the filter on
        each arrival. At the deadline the reads run one last time, as
        RocketMQ's does.
        """
        deadline = self.loop.time() + timeout_s
        results = first if first is not None else await self._pull_all(reads)
        while not any(r.found(result) for r, result in zip(reads, results, strict=True)):
            remaining = deadline - self.loop.time()
            if remaining <= 0:
                break
            for r, result in zip(reads, results, strict=True):
                r.offset = max(r.offset, r.next_offset(result))
            grew = await self.wait_for_arrival(reads, remaining, until)
            results = await self._pull_all(reads)
            if not grew or self._stopping or (until is not None and until.done()):
                break
        return results

    async def _pull_all(self, reads: Sequence[HeldRead[T]]) -> list[T]:
        """Every read's pull from its offset, on the loop or, when one is slow,
        all in a worker thread (the offsets taken here, on the loop)."""
        if not any(r.slow for r in reads):
            return [r.pull(r.offset) for r in reads]
        pulls = [(r.pull, r.offset) for r in reads]
        return await self.loop.run_in_executor(self.executor, _run_pulls, pulls)

    async def drain(self) -> None:
        """A stop, after the server stopped: wait for slow reads still running in
        worker threads (a call cancelled at the end of the grace period leaves
        its thread reading), so the store is never shut down under one. Shuts
        down the executor given to the constructor; takes no new slow read."""
        if self.executor is not None:
            await asyncio.to_thread(self.executor.shutdown, True)


def _resolve_on_done(
    until: asyncio.Future[Any], future: asyncio.Future[None]
) -> Callable[[asyncio.Future[Any]], None]:
    """Add (and return) a done callback to ``until`` that resolves ``future``."""

    def cut(_: asyncio.Future[Any]) -> None:
        if not future.done():
            future.set_result(None)

    until.add_done_callback(cut)
    return cut


def _run_pulls(pulls: Sequence[tuple[Callable[[int], T], int]]) -> list[T]:
    return [pull(offset) for pull, offset in pulls]
