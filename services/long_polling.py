"""Long polling: RocketMQ's PullRequestHoldService, on asyncio.

A pull that finds nothing new may ask to be held for ``suspend_timeout_ms``.
It is parked as a future under its (topic, queue id) - no thread, no polling
loop - and woken when the store reports that the queue grew past the pull's
offset (``MessageStore.add_arrival_listener``), or when its time is up. The
caller then runs the pull again and answers with whatever it finds.

Arrivals are reported on whichever thread dispatched (a writer's or the
dispatcher's). :meth:`PullRequestHoldService.notify_arrival` is that
listener: it looks the queue up in a dict (safe from any thread under the
GIL) and crosses to the event loop only when a pull is actually waiting on
that queue, so a store with no held pulls pays one dict lookup per append.

Concurrency: everything but ``notify_arrival`` runs on the service's event loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(slots=True)
class _Waiter:
    """One held pull: woken once its queue's max offset passes ``offset``."""

    offset: int
    future: asyncio.Future[None] = field(repr=False)


class PullRequestHoldService:
    """Parks pulls until their queue grows or their suspend time runs out."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
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
        """Pulls parked right now."""
        return sum(len(w) for w in self._held.values())

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
        topic: str,
        queue_id: int,
        offset: int,
        timeout_s: float,
        queue_max_offset: Callable[[], int],
    ) -> bool:
        """Wait until the queue's max offset passes ``offset`` or ``timeout_s``
        elapses; True when it grew.

        The queue is looked at again *after* the waiter is parked: an arrival
        reported on a writer's thread just before that found no waiter and
        sent no wake-up, and must not leave the pull waiting out its timeout.
        """
        if timeout_s <= 0 or self._stopping:
            return queue_max_offset() > offset
        key = (topic, queue_id)
        waiter = _Waiter(offset, self.loop.create_future())
        self._held.setdefault(key, []).append(waiter)
        try:
            if queue_max_offset() > offset:
                return True
            await asyncio.wait_for(asyncio.shield(waiter.future), timeout_s)
            return True
        except TimeoutError:
            return False
        finally:
            waiters = self._held.get(key)
            if waiters is not None and waiter in waiters:
                waiters.remove(waiter)
                if not waiters:
                    del self._held[key]

    async def hold(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        timeout_s: float,
        pull: Callable[[int], T],
        *,
        found: Callable[[T], bool],
        next_offset: Callable[[T], int],
        queue_max_offset: Callable[[], int],
    ) -> T:
        """Run ``pull(offset)``; while it finds nothing and time remains, park until
        the queue grows and pull again. Returns the last pull's result.

        ``pull`` runs on the loop, so it must be quick (the store's get_message
        is: it reads the page cache). ``found`` says whether a result is worth
        answering at once; a filtered pull that matched nothing moves on to
        ``next_offset`` (its scan moved past what it skipped) and keeps
        waiting, as RocketMQ re-checks the filter on each arrival. At the
        deadline the pull runs one last time, as RocketMQ's does.
        """
        deadline = self.loop.time() + timeout_s
        result = pull(offset)
        while not found(result):
            remaining = deadline - self.loop.time()
            if remaining <= 0:
                break
            offset = max(offset, next_offset(result))
            grew = await self.wait_for_arrival(topic, queue_id, offset, remaining, queue_max_offset)
            result = pull(offset)
            if not grew or self._stopping:
                break
        return result
