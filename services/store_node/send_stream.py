"""``StoreNode.SendStream``, served: many sends in flight on one stream.

Each item of a request is one send, taken in arrival order and answered as it
completes (answers carry the item's ``opaque``). Everything answered while a
write is under way goes out in the next write: grpc.aio allows one write at a
time, and each costs the same fixed work whatever it carries.

A send whose topic this node already serves is started right where it is read
(:meth:`SendHandler.start_send`): checked, encoded and queued for the store's
next append without a task, and answered from the append's own callback. On
an idle node the loop turns between a request and its answer are most of a
lone send's time, and a task per send would add one to start it and one to
resume it. A send that must await (its topic is created first) runs as a task.

A request of one send, read while the loop has nothing else to do, is written
by the store before :meth:`SendHandler.start_send` returns (``alone``: no
next-turn drain to group it with others, as there are none), and its answer is
then ready as the reader finishes taking the request. On a loop whose ready
queue cannot be read (uvloop), "nothing else to do" is "no other stream is
sending to this node" (``sole``). For a request of one wire message the reader
writes the answer itself rather than waking the writer task, one loop turn
sooner; the next request is read once that write is done. The SDK sends a
lone message as a batch of one record, whose answer the writer task writes:
the reader then posts its next read at once, while the write is under way
(measured on uvloop: the reader's own write, which posts the read only once
gRPC reports the write done, was slower for one message at a time). Other
answers (a batch's, whose producer keeps several in flight and whose next
request is read while the writer task writes; those that come later: a SYNC
flush, the in-sync replicas' acks, a busy loop's grouped append, a send run as
a task) are the writer task's; one write at a time either way.

At most ``max_in_flight`` sends are in flight on a stream: past that the
stream is not read, and HTTP/2 flow control holds the producer back.
A graceful stop ends the stream once the sends it read are answered
(:mod:`basalt.services.store_node.served_streams`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable
from typing import Any, Protocol

import grpc
from opentelemetry import trace

from basalt.services.errors import Refusal, as_refusal, invalid, refused
from basalt.services.store_node.metrics import send_stream_span
from basalt.services.store_node.served_streams import EndableReads, ServedStream, ServedStreams
from basalt.v1 import common_pb2 as pb
from basalt.v1 import store_node_pb2 as sn

log = logging.getLogger(__name__)

#: What one item of a SendStream request asks for.
SendRequest = sn.SendMessageRequest | sn.SendBatchRequest
#: A send's answer: its result, or why it was refused.
SendOutcome = pb.SendResult | Refusal


class SendHandler(Protocol):
    """The store-node's side of a send."""

    #: The node's streams (how many SendStreams it serves now).
    streams: ServedStreams

    def start_send(
        self,
        request: SendRequest,
        on_done: Callable[[SendOutcome], None],
        *,
        alone: bool = False,
        sole: bool = False,
    ) -> bool:
        """Start a send without awaiting; False (nothing done) when it must await.
        ``alone``: the caller starts no other send in this loop turn; ``sole``:
        no other stream sends to the node now."""
        ...

    async def send(self, request: SendRequest) -> pb.SendResult:
        """A send, awaited."""
        ...

    async def end_transaction(self, request: sn.EndTransactionRequest) -> pb.SendResult:
        """An EndTransaction carried on the stream (its response's result)."""
        ...


#: What a request of an untraced stream is taken under: nothing.
_UNTRACED = contextlib.nullcontext()


class _ClientGone(Exception):
    """An answer could not be written: the call ended (the client went away)."""


async def serve_send_stream(
    handler: SendHandler,
    context: grpc.aio.ServicerContext[Any, Any],
    reads: EndableReads,
    max_in_flight: int,
) -> None:
    """Serve one SendStream until its reads end (the client half-closes it, or a
    graceful stop) and every send read is answered."""
    await _SendStream(handler, context, reads, max_in_flight).run()


class _SendStream(ServedStream[SendHandler]):
    def __init__(
        self,
        handler: SendHandler,
        context: grpc.aio.ServicerContext[Any, Any],
        reads: EndableReads,
        max_in_flight: int,
    ) -> None:
        super().__init__(handler, context, reads, max_in_flight)
        #: Answers not written yet.
        self.ready: list[sn.SendStreamAnswer] = []
        #: Sends read whose answer is not written yet.
        self.in_flight = 0
        self.reading = True
        #: Whether a write is under way (the reader's or the writer task's).
        self.writing = False
        #: Whether the reader is taking a request's sends: it sees to their answers
        #: itself afterwards, so answers meanwhile do not wake the writer.
        self.taking = False
        #: Set when the writer waits for an answer (or for the end of the stream).
        self.wake: asyncio.Future[None] | None = None

    async def run(self) -> None:
        # A failed write cancels the reading, and the other way round; the group
        # also owns the sends that run as tasks.
        try:
            async with asyncio.TaskGroup() as tasks:
                self.tasks = tasks
                tasks.create_task(self._write_answers())
                try:
                    await self._read_sends()
                finally:
                    self.reading = False
                    self._wake_writer()
        except* _ClientGone:
            pass  # nobody is left to answer; every send read was stored or refused

    async def _read_sends(self) -> None:
        # The stream's span is the call's, for its whole life: a request's own span
        # (send_stream_span) is made under a recorded one only, and an unrecorded
        # stream skips even the check, a generator's enter and exit per request.
        traced = trace.get_current_span().is_recording()
        while True:
            request = await self.next_request()
            if request is grpc.aio.EOF:
                return
            items = request.items
            with send_stream_span(items) if traced else _UNTRACED:
                alone = len(items) == 1
                sole = alone and self.handler.streams.serving(serve_send_stream) == 1
                lone_message = alone and items[0].HasField("message")
                for k, item in enumerate(items):
                    if k:  # the window counts sends; next_request took the first
                        self.taking = False  # the writer may be needed while this waits
                        if self.ready:
                            self._wake_writer()
                        await self.window.acquire()
                    self.taking = True
                    self._take(item, alone, sole)
                self.taking = False
            if self.ready and lone_message and self._writer_idle():
                # Answered while taken (written at once, or refused): write it from
                # here, the writer task's wake-up and turn saved.
                await self._write_ready()
            if self.ready:
                self._wake_writer()  # answers that came during a write

    def _take(self, item: sn.SendStreamItem, alone: bool, sole: bool) -> None:
        self.in_flight += 1
        on_done = functools.partial(self._answer, item.opaque)
        form = item.WhichOneof("request")
        try:
            if form == "message":
                request: SendRequest = item.message
            elif form == "batch":
                request = item.batch
            elif form == "end_transaction":
                self.tasks.create_task(self._end_awaiting(item.end_transaction, on_done))
                return
            else:
                raise invalid(
                    "a SendStream request carries neither message nor batch (nor end_transaction)"
                )
            if self.handler.start_send(request, on_done, alone=alone, sole=sole):
                return
        except Exception as e:
            on_done(as_refusal(e, "SendStream"))
            return
        self.tasks.create_task(self._send_awaiting(request, on_done))

    async def _send_awaiting(
        self, request: SendRequest, on_done: Callable[[SendOutcome], None]
    ) -> None:
        try:
            outcome: SendOutcome = await self.handler.send(request)
        except Exception as e:
            outcome = as_refusal(e, "SendStream")
        on_done(outcome)

    async def _end_awaiting(
        self, request: sn.EndTransactionRequest, on_done: Callable[[SendOutcome], None]
    ) -> None:
        try:
            outcome: SendOutcome = await self.handler.end_transaction(request)
        except Exception as e:
            outcome = as_refusal(e, "SendStream")
        on_done(outcome)

    def _answer(self, opaque: int, outcome: SendOutcome) -> None:
        if isinstance(outcome, Refusal):
            answer = sn.SendStreamAnswer(opaque=opaque, refused=refused(outcome))
        else:
            answer = sn.SendStreamAnswer(opaque=opaque, result=outcome)
        self.ready.append(answer)
        if not self.taking:
            self._wake_writer()

    def _writer_idle(self) -> bool:
        """Whether the writer task waits, not woken (so no write is under way)."""
        return self.wake is not None and not self.wake.done() and not self.writing

    def _wake_writer(self) -> None:
        if self.wake is not None and not self.wake.done():
            self.wake.set_result(None)

    async def _write_answers(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self.ready or self.writing:
                # (While the reader writes, it wakes this task again for what is left.)
                if not self.reading and self.in_flight == 0:
                    return
                self.wake = loop.create_future()
                await self.wake
                continue
            await self._write_ready()

    async def _write_ready(self) -> None:
        """Write every answer ready, in one write; no other write may be under way."""
        answers, self.ready = self.ready, []
        self.writing = True
        try:
            await self.context.write(sn.SendStreamResponse(answers=answers))
        except Exception as e:
            # A write on a server stream fails only once the call is over (the
            # client cancelled it or went away): often before gRPC has told
            # this handler so.
            log.debug("SendStream ended with %d answers unwritten: %r", len(answers), e)
            raise _ClientGone from e
        finally:
            self.writing = False
        self.in_flight -= len(answers)
        for _ in answers:
            self.window.release()
