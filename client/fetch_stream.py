"""A consumer's fetches to one store-node, on one ``StoreNode.GetMessagesStream``.

A unary GetMessages costs gRPC several times the work of a message on an open
stream (its own HTTP/2 stream, headers, trailers and call objects on both
ends), and a consumer reading one message at a time made one per message.
:class:`FetchStream` keeps one stream per store-node instead: each fetch is an
item with an opaque of the stream's, answered as the unary call would answer
it (held the same way; a held fetch is answered after those behind it), and a
fetch no longer wanted while held is cancelled by an item of its own (the
store-node ends the hold and answers it; the answer is dropped here).

Deadlines: a fetch not answered within its hold plus
:data:`~basalt.client.consumer_base.PULL_DEADLINE_MARGIN_S` breaks the stream,
as the unary call's deadline failed that call (a store-node that stopped
answering without closing its connection).

Breaking: the reader ending (the store-node died, ended or aborted the call),
a failed write, an overdue fetch or :meth:`FetchStream.close` breaks the
stream for good: every fetch in flight is answered with the
:class:`~basalt.client.errors.ClientError` the unary call would have failed
with, and :attr:`FetchStream.broken` tells the consumer to open a fresh one.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Callable, Sequence

import grpc

from basalt.client.channels import finish_requests
from basalt.client.errors import ClientError, describe_failure
from basalt.client.tasks import TaskOwner
from basalt.common import dial
from basalt.v1 import common_pb2 as pb
from basalt.v1 import store_node_pb2 as sn

#: GetMessagesStream's method path.
FETCH_STREAM = dial.rpc_path(
    sn.DESCRIPTOR.services_by_name["StoreNode"].methods_by_name["GetMessagesStream"]
)

#: What a fetch comes back with: its answer, or why it failed.
FetchOutcome = pb.PullBatchResponse | ClientError


class FetchStream:
    """One GetMessagesStream to the store-node at ``address``; ``on_answer(opaque,
    outcome)`` is called once per fetch not cancelled (on the loop)."""

    def __init__(
        self,
        channel: grpc.aio.Channel,
        address: str,
        tasks: TaskOwner,
        on_answer: Callable[[int, FetchOutcome], None],
        margin_s: float,
    ) -> None:
        self.address = address
        self._on_answer = on_answer
        self._margin_s = margin_s
        self._opaques = itertools.count(1)
        self.call: grpc.aio.StreamStreamCall[
            sn.GetMessagesStreamRequest, sn.GetMessagesStreamResponse
        ] = dial.open_stream(
            channel,
            FETCH_STREAM,
            sn.GetMessagesStreamRequest.SerializeToString,
            sn.GetMessagesStreamResponse.FromString,
        )
        #: Fetches in flight: their deadline timers, by opaque.
        self._waiting: dict[int, asyncio.TimerHandle] = {}
        self.failure: ClientError | None = None
        #: Writes go one at a time (grpc.aio allows one): concurrent callers take turns.
        self._writes = asyncio.Lock()
        #: The first write, while under way (a break cancels it).
        self._write: asyncio.Future[None] | None = None
        #: A write went through: the call has started.
        self._started = False
        self._reader = tasks.spawn(self._read(), name=f"GetMessagesStream reader {address}")

    @property
    def broken(self) -> bool:
        return self.failure is not None or self._reader.done()

    def next_opaque(self) -> int:
        """A fresh opaque for a fetch (register it before :meth:`fetch` writes:
        its answer may be read as soon as the write is done)."""
        return next(self._opaques)

    async def fetch(
        self,
        requests: Sequence[tuple[int, sn.GetMessagesRequest]],
        cancels: Sequence[int] = (),
    ) -> None:
        """Write the fetches ``requests`` (opaque, request), after the cancels of
        the fetches of ``cancels`` (whose answers are then dropped), in one
        message. A failed write breaks the stream (each fetch is then answered
        with the error)."""
        loop = asyncio.get_running_loop()
        items = [sn.GetMessagesStreamItem(opaque=o, cancel=True) for o in cancels]
        for o in cancels:
            timer = self._waiting.pop(o, None)
            if timer is not None:
                timer.cancel()
        for opaque, request in requests:
            items.append(sn.GetMessagesStreamItem(opaque=opaque, fetch=request))
            deadline_s = request.suspend_timeout_ms / 1000 + self._margin_s
            self._waiting[opaque] = loop.call_later(deadline_s, self._overdue, opaque)
        message = sn.GetMessagesStreamRequest(items=items)
        try:
            async with self._writes:
                if self.broken:  # (perhaps while this waited its turn)
                    self._fail(self.failure or self._error("the stream ended"))
                elif self._started:
                    await self.call.write(message)
                else:
                    # The first write waits for the call to start, and a call
                    # cancelled before it started leaves that wait pending for good
                    # (a peer that took the connection and went silent): a future
                    # of its own, which a break cancels. Later writes end when the
                    # call is cancelled.
                    write = self._write = asyncio.ensure_future(self.call.write(message))
                    await write
                    self._started = True
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                self._fail(self._error("closed"))
                raise
            # Not this task's cancellation: the call was cancelled under the
            # write (grpc.aio raises CancelledError for a locally cancelled call).
            self._fail(self.failure or self._error("a write was cut short"))
        except Exception as e:  # InvalidStateError (call finished), AioRpcError
            self._fail(self._error(f"a write failed: {describe_failure(e)}"))
        finally:
            self._write = None

    async def _read(self) -> None:
        failure = self._error("the store-node ended the stream")
        try:
            async for response in self.call:
                timer = self._waiting.pop(response.opaque, None)
                if timer is None:
                    continue  # cancelled: the consumer no longer waits for it
                timer.cancel()
                if response.HasField("refused"):
                    refusal = response.refused
                    outcome: FetchOutcome = ClientError.from_code(
                        refusal.code, f"{self.address}: {refusal.message}"
                    )
                else:
                    outcome = response.answer
                self._on_answer(response.opaque, outcome)
        except asyncio.CancelledError:
            # Not re-raised: see the producer's stream reader (the same cycle).
            failure = self._error("closed")
        except grpc.aio.AioRpcError as e:
            failure = ClientError.from_rpc_error(e, address=self.address)
        except Exception as e:  # whatever ended the reader, nothing will be answered
            failure = self._error(describe_failure(e))
        finally:
            self._fail(failure)
            with contextlib.suppress(asyncio.CancelledError):  # as above
                await finish_requests(self.call)

    def _overdue(self, opaque: int) -> None:
        if opaque in self._waiting:
            self._fail(
                ClientError.from_code(
                    pb.RESPONSE_CODE_SERVICE_NOT_AVAILABLE,
                    f"{self.address}: a GetMessages on the stream was not answered by its deadline",
                )
            )

    def _error(self, why: str) -> ClientError:
        return ClientError.from_code(
            pb.RESPONSE_CODE_SERVICE_NOT_AVAILABLE,
            f"GetMessagesStream to {self.address} broke: {why}",
        )

    def _fail(self, failure: ClientError) -> None:
        """Break the stream (once more: answer what waits): every fetch in
        flight is answered with ``failure``, and the call is cancelled."""
        if self.failure is None:
            self.failure = failure
            self.call.cancel()
            if self._write is not None:
                self._write.cancel()
        waiting, self._waiting = self._waiting, {}
        for opaque, timer in waiting.items():
            timer.cancel()
            self._on_answer(opaque, self.failure)

    def close(self) -> None:
        """Break the stream quietly: fetches in flight are dropped, not answered."""
        for timer in self._waiting.values():
            timer.cancel()
        self._waiting.clear()
        self._fail(self._error("closed"))
        self._reader.cancel()


class AwaitedFetches:
    """Fetches each awaited by its own task (a PushConsumer's pull loop per
    queue), on one :class:`FetchStream` per store-node address: :meth:`fetch`
    returns a fetch's answer or raises its :class:`ClientError`. A fetch whose
    caller is cancelled (its queue dropped) is cancelled on the stream, so the
    store-node ends its hold. A broken stream is replaced by the next fetch."""

    def __init__(
        self, channel: Callable[[str], grpc.aio.Channel], tasks: TaskOwner, margin_s: float
    ) -> None:
        """``channel(address)``: the channel to a store-node; ``tasks`` owns the
        streams' readers and the writes of cancels; ``margin_s`` as FetchStream's."""
        self._channel = channel
        self._tasks = tasks
        self._margin_s = margin_s
        #: By address: the stream and its fetches' futures by opaque.
        self._streams: dict[str, tuple[FetchStream, dict[int, asyncio.Future[FetchOutcome]]]] = {}

    async def fetch(self, address: str, request: sn.GetMessagesRequest) -> pb.PullBatchResponse:
        """``request``'s answer from the store-node at ``address``; raises the
        ClientError it failed with (its stream broke, or it was refused)."""
        stream, waiting = self._stream(address)
        opaque = stream.next_opaque()
        future: asyncio.Future[FetchOutcome] = asyncio.get_running_loop().create_future()
        waiting[opaque] = future
        try:
            await stream.fetch([(opaque, request)])
            outcome = await future
        except asyncio.CancelledError:
            if waiting.pop(opaque, None) is not None and not stream.broken:
                self._tasks.spawn(stream.fetch((), cancels=(opaque,)), untraced=True)
            raise
        if isinstance(outcome, ClientError):
            # A new error each time: one exception raised in many tasks (a broken
            # stream fails every fetch with one) would chain their tracebacks.
            raise ClientError.from_code(outcome.code, outcome.message)
        return outcome

    def _stream(self, address: str) -> tuple[FetchStream, dict[int, asyncio.Future[FetchOutcome]]]:
        kept = self._streams.get(address)
        if kept is not None and not kept[0].broken:
            return kept
        waiting: dict[int, asyncio.Future[FetchOutcome]] = {}

        def on_answer(opaque: int, outcome: FetchOutcome) -> None:
            future = waiting.pop(opaque, None)
            if future is not None and not future.done():
                future.set_result(outcome)

        stream = FetchStream(
            self._channel(address), address, self._tasks, on_answer, self._margin_s
        )
        self._streams[address] = (stream, waiting)
        return stream, waiting

    def close(self) -> None:
        """Close every stream; fetches still awaited are cancelled."""
        for stream, waiting in self._streams.values():
            stream.close()
            for future in waiting.values():
                future.cancel()
        self._streams.clear()
