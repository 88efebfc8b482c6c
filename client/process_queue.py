"""A PushConsumer's state of one owned queue (RocketMQ's ProcessQueue).

Concurrency: used on the consumer's event loop only; the listener calls'
completion callbacks run there too (:mod:`basalt.client.push_consumer`).
"""

from __future__ import annotations

import asyncio

from basalt.client.consumer_base import MessageQueue
from basalt.client.tasks import TaskOwner
from basalt.common.message import MessageRecord


class ProcessQueue:
    """One owned queue: where its pulls are, what was pulled and not yet consumed
    (by offset, in offset order), the listener calls in flight, and the tasks
    working on it. Dropped once; a queue owned again gets a new one."""

    def __init__(self, queue: MessageQueue, offset: int, reset_epoch: int, committed: int) -> None:
        self.queue = queue
        #: Where the next pull starts.
        self.next_offset = offset
        self.reset_epoch = reset_epoch
        #: The offset last stored for the group (-1: none).
        self.committed = committed
        #: Pulled, not yet consumed; insertion order is offset order.
        self.pending: dict[int, MessageRecord] = {}
        self.dropped = False
        #: Set while there is room below the pull threshold.
        self.room = asyncio.Event()
        self.room.set()
        #: Set while there are messages no listener call has taken (orderly).
        self.ready = asyncio.Event()
        #: Orderly: the failed listener calls of each pending offset so far.
        self.failures: dict[int, int] = {}
        self.calls: set[asyncio.Future[object]] = set()
        #: One commit of the queue at a time (see PushConsumer._commit).
        self.commit_lock = asyncio.Lock()
        #: Its pull loop and consume tasks, ended (cancelled and awaited) by the drop.
        self.tasks = TaskOwner()

    def gone(self) -> bool:
        """Whether it was dropped: :attr:`dropped`, read anew after an await
        (where a type checker would keep the value a loop's test narrowed)."""
        return self.dropped

    def commit_offset(self) -> int:
        """The lowest offset not yet consumed; with none pending, the next to pull."""
        return next(iter(self.pending), self.next_offset)

    def add(self, records: list[MessageRecord], threshold: int) -> None:
        for record in records:
            self.pending[record.queue_offset] = record
        if len(self.pending) >= threshold:
            self.room.clear()
        self.ready.set()

    def consumed(self, records: list[MessageRecord], threshold: int) -> None:
        for record in records:
            self.pending.pop(record.queue_offset, None)
        if len(self.pending) < threshold:
            self.room.set()
