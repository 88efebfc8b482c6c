"""The store-node's long-lived client streams (SendStream, GetMessagesStream),
and their end at a graceful stop.

Producers and consumers keep one stream open to a store-node for as long as
they run, and never half-close it; a graceful stop (``server.stop(grace)``)
would wait its whole grace period for them, the node refusing their sends
meanwhile anyway. :meth:`ServedStreams.end` instead has each stream stop
reading (:class:`EndableReads`): what it read is answered, then its call ends
OK, and the clients go to the node the route names next.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

import grpc

#: The servicer side a stream hands its requests to.
H = TypeVar("H")


class EndableReads:
    """A server stream's request reads that :meth:`end` can stop: after it,
    :meth:`read` answers ``grpc.aio.EOF`` as for a half-closed stream (a read
    waiting then is cut short). Read from one task at a time."""

    def __init__(self, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        self._context = context
        self._ended = False
        #: The task waiting in a read, if any (end() cancels that wait).
        self._waiting: asyncio.Task[Any] | None = None

    async def read(self) -> Any:
        """The stream's next request, or ``grpc.aio.EOF``."""
        if self._ended:
            return grpc.aio.EOF
        self._waiting = asyncio.current_task()
        try:
            return await self._context.read()
        except asyncio.CancelledError:
            task = asyncio.current_task()
            # end()'s cancel and no other (the call's own): no more requests.
            if self.ended() and task is not None and task.uncancel() == 0:
                return grpc.aio.EOF
            raise
        finally:
            self._waiting = None

    def ended(self) -> bool:
        """Whether :meth:`end` was called (a call: type checkers keep an
        attribute read before an await narrowed past it)."""
        return self._ended

    def end(self) -> None:
        self._ended = True
        if self._waiting is not None:
            self._waiting.cancel()


class ServedStream(Generic[H]):
    """What every served stream holds: its handler, its call, its reads, and
    the window of requests in flight (past ``max_in_flight`` it is not read,
    and HTTP/2 flow control holds the client back)."""

    def __init__(
        self,
        handler: H,
        context: grpc.aio.ServicerContext[Any, Any],
        reads: EndableReads,
        max_in_flight: int,
    ) -> None:
        self.handler = handler
        self.context = context
        self.reads = reads
        self.window = asyncio.Semaphore(max_in_flight)

    async def next_request(self) -> Any:
        """The stream's next request (its ``items``), its first item's place in
        the window taken (a request of none gives it back; each further item
        takes its own), or ``grpc.aio.EOF``."""
        await self.window.acquire()
        request = await self.reads.read()
        if request is not grpc.aio.EOF and not request.items:
            self.window.release()
        return request


#: What serves one kind of stream: ``run(handler, context, reads, max_in_flight)``.
Run = Callable[[H, grpc.aio.ServicerContext[Any, Any], EndableReads, int], Awaitable[None]]


class ServedStreams:
    """The streams a store-node serves now, by kind (the function that serves
    them); :meth:`end` ends them all."""

    def __init__(self) -> None:
        self._open: set[EndableReads] = set()
        #: How many streams each run function serves now.
        self._serving: Counter[Callable[..., Awaitable[None]]] = Counter()
        self._ending = False

    def serving(self, run: Callable[..., Awaitable[None]]) -> int:
        """How many streams ``run`` (one kind of stream) serves now."""
        return self._serving[run]

    async def serve(
        self,
        run: Run[H],
        handler: H,
        context: grpc.aio.ServicerContext[Any, Any],
        max_in_flight: int,
    ) -> None:
        """Serve one stream: ``run(handler, context, reads, max_in_flight)`` until
        it returns (its reads end at a client's half-close or at :meth:`end`). A
        stopping node ends a new stream at once."""
        reads = EndableReads(context)
        if self._ending:
            reads.end()
        self._open.add(reads)
        self._serving[run] += 1
        try:
            await run(handler, context, reads, max_in_flight)
        finally:
            self._open.discard(reads)
            self._serving[run] -= 1

    def end(self) -> None:
        """A graceful stop: every stream served stops reading (what it read is
        answered, then its call ends), and so does any opened from now on."""
        self._ending = True
        for reads in self._open:
            reads.end()
