"""``StoreNode.GetMessagesStream``, served: a consumer's fetches on one stream.

Each item of a request is one GetMessages, named by its ``opaque``, checked,
read and held exactly as the unary call (:meth:`FetchHandler.start_fetch`),
and answered when it completes. A unary call costs gRPC several times a
stream message's work (its own HTTP/2 stream, headers and trailers, a call
object each side): a consumer reading one message at a time paid that per
message. ``benchmarks/grpc_floor.py`` measures both on the machine.

A fetch that finds records (or asks for no hold) is read and answered by the
stream's reader itself, without a task: one in flight, the read and the write
of its answer are the whole round trip. A fetch that must wait (nothing new,
or a read whose filter runs in a worker thread) becomes a task, so the fetches
behind it are served meanwhile; answers therefore need not come in request
order. An item with ``cancel`` ends the hold of the fetch of that opaque (the
reads run one last time and it is answered): a consumer that must read a
queue again at once (a seek, a drained buffer) does not wait out a long poll.

grpc.aio allows one write at a time: the first answer ready writes, and
answers that come meanwhile are written by it next, one message each (an
answer carries records; joining them would copy them once more).

At most ``max_in_flight`` fetches are in flight on a stream (held ones
included): past that the stream is not read, and HTTP/2 flow control holds
the consumer back. When the consumer half-closes the stream, the fetches
still held are cut short and answered, then the call ends; a graceful stop
does the same (:mod:`basalt.services.store_node.served_streams`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Protocol

import grpc
from opentelemetry import trace

from basalt.common.protowire import LENGTH_DELIMITED, VARINT, tag, varint
from basalt.services.errors import Refusal, as_refusal, invalid, refused
from basalt.services.store_node.long_polling import HeldRead
from basalt.services.store_node.metrics import StoreNodeMetrics, end_get_span, get_messages_span
from basalt.services.store_node.served_streams import EndableReads, ServedStream
from basalt.store.get_message import GetMessageResult
from basalt.v1 import common_pb2 as pb
from basalt.v1 import store_node_pb2 as sn

log = logging.getLogger(__name__)

_RESPONSE = sn.GetMessagesStreamResponse.DESCRIPTOR
_OPAQUE = tag(_RESPONSE, "opaque", VARINT)
_ANSWER = tag(_RESPONSE, "answer", LENGTH_DELIMITED)


class Fetch:
    """One GetMessages, checked: its reads with their commits' outcomes, the
    answers of its refused entries (None for a read, in the request's order),
    how long it may be held, and once answered its serialized PullBatchResponse
    with the messages it carries."""

    __slots__ = ("answer", "first", "reads", "refusals", "timeout_s")

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.reads: list[tuple[HeldRead[GetMessageResult], pb.CommitResult | None]] = []
        self.refusals: list[pb.PullResponse | None] = []
        #: The reads' results of the run made when the fetch started, if any.
        self.first: list[GetMessageResult] | None = None
        self.answer: tuple[bytes, int] | None = None


class FetchHandler(Protocol):
    """The store-node's side of a fetch."""

    def start_fetch(self, request: sn.GetMessagesRequest) -> Fetch:
        """Check and run a fetch now, answered unless it must wait; raises what
        the unary call fails with."""
        ...

    async def hold_fetch(self, fetch: Fetch, until: asyncio.Future[Any] | None = None) -> None:
        """Hold an unanswered fetch (until ``until`` is done at the latest), then answer it."""
        ...

    #: Where each fetch's duration is recorded (``on_get_call``).
    metrics: StoreNodeMetrics


class _ClientGone(Exception):
    """An answer could not be written: the call ended (the client went away)."""


async def serve_fetch_stream(
    handler: FetchHandler,
    context: grpc.aio.ServicerContext[Any, Any],
    reads: EndableReads,
    max_in_flight: int,
) -> None:
    """Serve one GetMessagesStream until its reads end (the client half-closes
    it, or a graceful stop) and every fetch read is answered."""
    await _FetchStream(handler, context, reads, max_in_flight).run()


def answer_wire(opaque: int, answer: bytes) -> bytes:
    """The serialized GetMessagesStreamResponse of ``opaque`` whose ``answer`` is
    the serialized PullBatchResponse ``answer`` (records copied once, here)."""
    return b"".join((_OPAQUE, varint(opaque), _ANSWER, varint(len(answer)), answer))


def _refused_wire(opaque: int, refusal: Refusal) -> bytes:
    return sn.GetMessagesStreamResponse(opaque=opaque, refused=refused(refusal)).SerializeToString()


class _FetchStream(ServedStream[FetchHandler]):
    def __init__(
        self,
        handler: FetchHandler,
        context: grpc.aio.ServicerContext[Any, Any],
        reads: EndableReads,
        max_in_flight: int,
    ) -> None:
        super().__init__(handler, context, reads, max_in_flight)
        #: The held fetches' ``until`` futures, by opaque (a cancel item sets one).
        self.held: dict[int, asyncio.Future[None]] = {}
        #: Answers not written yet, serialized.
        self.ready: list[bytes] = []
        #: Whether a write is under way (it writes what is ready, in turn).
        self.writing = False
        self.traced = False

    async def run(self) -> None:
        # A failed write ends the reading, and the other way round; the group
        # owns the held fetches' tasks.
        try:
            async with asyncio.TaskGroup() as tasks:
                self.tasks = tasks
                try:
                    await self._read_fetches()
                finally:
                    for until in self.held.values():  # half-closed (or gone): cut short
                        if not until.done():
                            until.set_result(None)
        except* _ClientGone:
            pass  # nobody is left to answer; reads store nothing but carried commits

    async def _read_fetches(self) -> None:
        # A fetch's own span only under a recorded stream span (as SendStream).
        self.traced = trace.get_current_span().is_recording()
        while True:
            request = await self.next_request()
            if request is grpc.aio.EOF:
                return
            items = request.items
            for k, item in enumerate(items):
                if k:  # the window counts items; next_request took the first
                    await self.window.acquire()
                await self._take(item)

    async def _take(self, item: sn.GetMessagesStreamItem) -> None:
        opaque = item.opaque
        form = item.WhichOneof("request")
        if form == "cancel":
            cancelled = self.held.get(opaque)
            if cancelled is not None and not cancelled.done():
                cancelled.set_result(None)
            self.window.release()  # answered by the fetch it cancels, if any
            return
        if form != "fetch":
            refusal = invalid("a GetMessagesStream item carries neither fetch nor cancel")
            await self._emit(_refused_wire(opaque, refusal))
            return
        if self.traced:
            # Its span covers the whole fetch, held or not: a task of its own.
            self.tasks.create_task(self._traced(opaque, item.fetch))
            return
        started = time.perf_counter()
        try:
            fetch = self.handler.start_fetch(item.fetch)
            if fetch.answer is None:
                until = self._park(opaque)
                self.tasks.create_task(self._held(opaque, fetch, until, started))
                return
            data = answer_wire(opaque, fetch.answer[0])
        except Exception as e:
            data = _refused_wire(opaque, as_refusal(e, "GetMessagesStream"))
        self.handler.metrics.on_get_call(started)
        await self._emit(data)

    def _park(self, opaque: int) -> asyncio.Future[None]:
        """The ``until`` of a fetch about to be held, where a cancel item finds
        it (registered before the next request is read)."""
        until: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.held[opaque] = until
        return until

    async def _hold(self, opaque: int, fetch: Fetch, until: asyncio.Future[None]) -> None:
        """Hold ``fetch`` until it is answered (``until`` may cut it short)."""
        try:
            await self.handler.hold_fetch(fetch, until)
        finally:
            if self.held.get(opaque) is until:
                del self.held[opaque]

    async def _held(
        self, opaque: int, fetch: Fetch, until: asyncio.Future[None], started: float
    ) -> None:
        try:
            await self._hold(opaque, fetch, until)
            assert fetch.answer is not None
            data = answer_wire(opaque, fetch.answer[0])
        except Exception as e:
            data = _refused_wire(opaque, as_refusal(e, "GetMessagesStream"))
        self.handler.metrics.on_get_call(started)
        await self._emit(data)

    async def _traced(self, opaque: int, request: sn.GetMessagesRequest) -> None:
        started = time.perf_counter()
        with get_messages_span("GetMessages") as span:
            try:
                fetch = self.handler.start_fetch(request)
                if fetch.answer is None:
                    await self._hold(opaque, fetch, self._park(opaque))
                assert fetch.answer is not None
                end_get_span(span, len(fetch.reads), fetch.answer[1])
                data = answer_wire(opaque, fetch.answer[0])
            except Exception as e:
                data = _refused_wire(opaque, as_refusal(e, "GetMessagesStream"))
        self.handler.metrics.on_get_call(started)
        await self._emit(data)

    async def _emit(self, data: bytes) -> None:
        """Write ``data`` now, or have the write under way write it next; every
        answer written gives its fetch's place in the window back."""
        self.ready.append(data)
        if self.writing:
            return
        self.writing = True
        try:
            while self.ready:
                answers, self.ready = self.ready, []
                for answer in answers:
                    await self.context.write(answer)
                    self.window.release()
        except Exception as e:
            # A write on a server stream fails only once the call is over (the
            # client cancelled it or went away).
            log.debug("GetMessagesStream ended with answers unwritten: %r", e)
            raise _ClientGone from e
        finally:
            self.writing = False
