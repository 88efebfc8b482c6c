"""Group commit for the front's store-node calls.

The official RocketMQ 5 clients send one message per ``SendMessage`` and ack
one message per ``AckMessage``; passing each through as its own store-node
RPC made the front cost several times basalt.v1's server CPU per message
(benchmarks/rocketmq_v2.py: gRPC's per-call work on both ends dominated).
A :class:`Coalescer` joins what concurrent requests hand in for one key (a
store-node's sends, a group's acks on one store-node) into one call: the first
request for an idle key calls at once (no added latency when there is no
concurrency); the requests that arrive while that call is in flight wait and
go together as the next call. Each caller gets its own slice of the answer,
in its order; a failed call fails every caller in it with the same error
(the store-node or its stream failed, not a message).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

K = TypeVar("K", bound=Hashable)
I = TypeVar("I")  # noqa: E741 - an item handed in
R = TypeVar("R")  # one item's result

#: Most items in one joined call: a store-node batch stays bounded whatever
#: the concurrency (the rest go in the next call).
MAX_JOINED = 256


@dataclass(slots=True)
class _Waiting(Generic[I, R]):
    items: list[I]
    context: Any
    done: asyncio.Future[list[R]] = field(default_factory=asyncio.Future)


class Coalescer(Generic[K, I, R]):
    """Joins concurrent :meth:`submit`\\ s of one key into calls of ``call``
    (module docstring). ``call(key, items, context)`` must answer one result
    per item, in order; ``context`` is the first joined caller's (its
    deadline bounds the call). One event loop."""

    def __init__(self, call: Callable[[K, list[I], Any], Awaitable[list[R]]]) -> None:
        self._call = call
        self._waiting: dict[K, list[_Waiting[I, R]]] = {}
        #: Keys with a call in flight (their drain task runs).
        self._busy: set[K] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    async def submit(self, key: K, items: list[I], context: Any) -> list[R]:
        """``items``' results, from a call joined with whatever else waits
        for ``key``; raises what that call raised."""
        waiting = _Waiting[I, R](items, context)
        self._waiting.setdefault(key, []).append(waiting)
        if key not in self._busy:
            self._busy.add(key)
            task = asyncio.create_task(self._drain(key))
            self._tasks.add(task)  # held: the loop keeps only weak references
            task.add_done_callback(self._tasks.discard)
        return await waiting.done

    async def _drain(self, key: K) -> None:
        try:
            while queue := self._waiting.get(key):
                joined: list[_Waiting[I, R]] = []
                count = 0
                while queue and (not joined or count + len(queue[0].items) <= MAX_JOINED):
                    joined.append(queue.pop(0))
                    count += len(joined[-1].items)
                if not queue:
                    del self._waiting[key]
                await self._run(key, joined)
        finally:
            self._busy.discard(key)

    async def _run(self, key: K, joined: list[_Waiting[I, R]]) -> None:
        items = [item for w in joined for item in w.items]
        try:
            results = await self._call(key, items, joined[0].context)
        except asyncio.CancelledError:
            for w in joined:  # the loop is stopping: nobody waits for ever
                w.done.cancel()
            for w in self._waiting.pop(key, []):
                w.done.cancel()
            raise
        except Exception as e:
            for w in joined:
                if not w.done.done():
                    w.done.set_exception(e)
            return
        start = 0
        for w in joined:
            if not w.done.done():  # a caller that gave up (cancelled) gets nothing
                w.done.set_result(results[start : start + len(w.items)])
            start += len(w.items)
