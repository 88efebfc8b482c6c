"""``StoreNode.GetMessagesStream`` over a real server, and the SDK's side of it
(:class:`basalt.client.fetch_stream.FetchStream`).

Same harness as test_store_node_batched.py (:func:`tests.support.nodes.node`):
a real grpc.aio server on port 0 over a real store. Each fetch on the stream is
answered as the unary GetMessages answers it, by opaque, when it completes: a
held one after those behind it, at an arrival, at a cancel item or when the
stream is half-closed.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc

from basalt.client.errors import ClientError
from basalt.client.fetch_stream import FETCH_STREAM, AwaitedFetches, FetchOutcome, FetchStream
from basalt.client.producer import _Stream as SendStream
from basalt.client.producer import send_stream_message
from basalt.client.tasks import TaskOwner
from basalt.common.record import decode_record, split_records
from basalt.services.meta import TopicConfig
from basalt.services.store_node.server import start_store_node
from basalt.services.store_node.service import StoreNodeConfig
from basalt.services.store_node.topics import LocalTopics
from basalt.v1 import common_pb2 as pb
from basalt.v1 import store_node_pb2 as sn
from basalt.v1 import store_node_pb2_grpc as sn_grpc
from tests.support.aio import run
from tests.support.nodes import NODE_TOPIC as TOPIC
from tests.support.nodes import node
from tests.support.polling import eventually
from tests.support.rpc import wire
from tests.support.stores import node_store_config

INVALID = grpc.StatusCode.INVALID_ARGUMENT.value[0]
#: Longer than any test waits: a fetch answered before it was not answered by its timeout.
HOLD_MS = 120_000


def read(queue_id: int, offset: int = 0, **kw: Any) -> sn.GetMessageRequest:
    return sn.GetMessageRequest(
        group="G", topic=TOPIC, queue_id=queue_id, offset=offset, max_msg_nums=32, **kw
    )


def fetch(opaque: int, *reads: sn.GetMessageRequest, hold_ms: int = 0) -> sn.GetMessagesStreamItem:
    return sn.GetMessagesStreamItem(
        opaque=opaque, fetch=sn.GetMessagesRequest(reads=reads, suspend_timeout_ms=hold_ms)
    )


def bodies(result: pb.PullResponse) -> list[bytes]:
    return [decode_record(r).body for r in split_records(result.records.data)]


async def answers(
    call: grpc.aio.StreamStreamCall[Any, sn.GetMessagesStreamResponse],
) -> AsyncIterator[sn.GetMessagesStreamResponse]:
    """The stream's answers as they come, each within a generous bound (a hang fails)."""
    it = call.__aiter__()
    while True:
        try:
            async with asyncio.timeout(30):
                yield await it.__anext__()
        except StopAsyncIteration:
            return


def test_fetches_are_answered_by_opaque_a_held_one_after_those_behind_it(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with node(tmp_path, auto_create=False) as (_, stub, _):
            for i in range(3):
                await stub.SendMessage(
                    sn.SendMessageRequest(message=wire(TOPIC, b"q0-%d" % i), queue_id=0)
                )
            call = stub.GetMessagesStream()
            got = answers(call)
            # Queue 1 is empty: fetch 1 is held; fetch 2 behind it is served at once.
            await call.write(
                sn.GetMessagesStreamRequest(items=[fetch(1, read(1), hold_ms=HOLD_MS)])
            )
            await call.write(
                sn.GetMessagesStreamRequest(
                    items=[
                        fetch(2, read(0, commit_offset=2), read(2)),
                        # Refused whole, as the unary call would fail: the same queue twice,
                        # a negative hold, neither fetch nor cancel.
                        fetch(3, read(0), read(0)),
                        fetch(4, read(0), hold_ms=-1),
                        sn.GetMessagesStreamItem(opaque=5),
                        # An entry refused inside a served fetch, as GetMessages answers it.
                        fetch(6, read(9)),
                    ]
                )
            )
            early = {}
            for _ in range(5):
                answer = await anext(got)
                early[answer.opaque] = answer
            assert sorted(early) == [2, 3, 4, 5, 6]
            assert [bodies(r) for r in early[2].answer.results] == [
                [b"q0-0", b"q0-1", b"q0-2"],
                [],
            ]
            assert early[2].answer.results[0].commit.code == pb.RESPONSE_CODE_SUCCESS
            for opaque in (3, 4, 5):
                assert early[opaque].WhichOneof("outcome") == "refused"
                assert early[opaque].refused.grpc_code == INVALID
                assert early[opaque].refused.code == pb.RESPONSE_CODE_INVALID_PARAMETER
            assert "neither fetch nor cancel" in early[5].refused.message
            (entry,) = early[6].answer.results
            assert entry.refused.code == pb.RESPONSE_CODE_INVALID_PARAMETER
            assert "queue id 9 is out of range" in entry.refused.message
            # The carried commit is stored.
            offset = await stub.QueryConsumerOffset(
                sn.QueryConsumerOffsetRequest(group="G", topic=TOPIC, queue_id=0)
            )
            assert offset.offset == 2

            # An arrival on queue 1 wakes the held fetch.
            await stub.SendMessage(sn.SendMessageRequest(message=wire(TOPIC, b"late"), queue_id=1))
            held = await anext(got)
            assert held.opaque == 1 and [bodies(r) for r in held.answer.results] == [[b"late"]]
            await call.done_writing()
            assert [a async for a in got] == []
            assert await call.code() == grpc.StatusCode.OK

    run(scenario)


def test_a_cancel_or_a_half_close_ends_a_hold_with_a_fresh_read(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with node(tmp_path, auto_create=False) as (_, stub, _):
            call = stub.GetMessagesStream()
            got = answers(call)
            await call.write(
                sn.GetMessagesStreamRequest(
                    items=[fetch(1, read(1), hold_ms=HOLD_MS), fetch(2, read(2), hold_ms=HOLD_MS)]
                )
            )
            # A cancel of an unknown opaque is nothing; of fetch 1, ends its hold.
            await call.write(
                sn.GetMessagesStreamRequest(
                    items=[
                        sn.GetMessagesStreamItem(opaque=77, cancel=True),
                        sn.GetMessagesStreamItem(opaque=1, cancel=True),
                    ]
                )
            )
            first = await anext(got)
            assert first.opaque == 1
            (entry,) = first.answer.results
            assert entry.status == pb.PULL_STATUS_NO_NEW_MSG and not entry.records.data
            # Half-closed: fetch 2's hold ends too, then the call.
            await call.done_writing()
            rest = [a async for a in got]
            assert [a.opaque for a in rest] == [2]
            assert await call.code() == grpc.StatusCode.OK

    run(scenario)


def test_the_sdk_stream_answers_each_fetch_once_and_breaks_on_a_silent_peer(
    tmp_path: Path,
) -> None:
    """FetchStream against a real store-node: every fetch answered once, a
    cancelled one never. Against a server that takes fetches and never answers
    (a store-node that stopped answering without closing its connection): the
    fetch's deadline breaks the stream, the fetch is answered with the error;
    the same against a peer that took the connection and never answers at all."""

    async def scenario() -> None:
        outcomes: list[tuple[int, FetchOutcome]] = []
        came = asyncio.Event()

        def on_answer(opaque: int, outcome: FetchOutcome) -> None:
            outcomes.append((opaque, outcome))
            came.set()

        tasks = TaskOwner()
        async with node(tmp_path, auto_create=False) as (running, stub, _):
            await stub.SendMessage(sn.SendMessageRequest(message=wire(TOPIC, b"x"), queue_id=0))
            async with grpc.aio.insecure_channel(running.address) as channel:
                stream = FetchStream(channel, running.address, tasks, on_answer, 10.0)
                held, served = stream.next_opaque(), stream.next_opaque()
                await stream.fetch(
                    [
                        (held, sn.GetMessagesRequest(reads=[read(1)], suspend_timeout_ms=HOLD_MS)),
                        (served, sn.GetMessagesRequest(reads=[read(0)])),
                    ]
                )
                async with asyncio.timeout(30):
                    await came.wait()
                ((opaque, answer),) = outcomes
                assert opaque == served and isinstance(answer, pb.PullBatchResponse)
                assert bodies(answer.results[0]) == [b"x"]
                await stream.fetch([], cancels=[held])
                # A fetch after the cancel: answered; the cancelled one never.
                after = stream.next_opaque()
                came.clear()
                await stream.fetch([(after, sn.GetMessagesRequest(reads=[read(0, offset=1)]))])
                async with asyncio.timeout(30):
                    await came.wait()
                assert [o for o, _ in outcomes] == [served, after]
                stream.close()
                assert stream.broken

        # A peer that reads fetches and never answers.
        async def silent(requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
            async for _ in requests:
                pass
            if False:
                yield b""

        server = grpc.aio.server()
        service, method = FETCH_STREAM.strip("/").split("/")
        server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    service, {method: grpc.stream_stream_rpc_method_handler(silent)}
                ),
            )
        )
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()

        async def broken_by_silence(address: str) -> None:
            """A fetch to ``address`` is answered with the deadline's error."""
            outcomes.clear()
            came.clear()
            async with grpc.aio.insecure_channel(address) as channel:
                stream = FetchStream(channel, address, tasks, on_answer, 0.2)
                opaque = stream.next_opaque()
                async with asyncio.timeout(30):
                    await stream.fetch([(opaque, sn.GetMessagesRequest(reads=[read(0)]))])
                    await came.wait()
                ((which, error),) = outcomes
                assert which == opaque and isinstance(error, ClientError)
                assert error.code == pb.RESPONSE_CODE_SERVICE_NOT_AVAILABLE
                assert "not answered by its deadline" in str(error)
                assert stream.broken

        try:
            await broken_by_silence(f"127.0.0.1:{port}")
        finally:
            await server.stop(None)
        # A peer that takes the connection and never speaks HTTP/2: the call never
        # starts, and the first write, pending on that, ends with the break.
        tcp = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        try:
            await broken_by_silence(f"127.0.0.1:{tcp.sockets[0].getsockname()[1]}")
        finally:
            tcp.close()
            await tasks.close()

    run(scenario)


def garbage_after(scenario: Callable[[], Awaitable[None]]) -> set[str]:
    """The type names of what ``scenario`` left to the cycle collector."""
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        run(scenario)
        gc.collect()
        return {type(o).__name__ for o in gc.garbage}
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


def test_a_closed_stream_leaves_no_reference_cycle(tmp_path: Path) -> None:
    """Closed, the stream and its gRPC call are freed by reference counting: a
    cycle (a reader task ended cancelled keeps its traceback's frames) would
    outlive the event loop until a garbage collection, with gRPC's completion
    queue still bound to the closed loop ("Event loop is closed" in the next)."""

    async def scenario() -> None:
        tasks = TaskOwner()
        async with (
            node(tmp_path, auto_create=False) as (running, _, _),
            grpc.aio.insecure_channel(running.address) as channel,
        ):
            stream = FetchStream(channel, running.address, tasks, lambda o, a: None, 10.0)
            held = stream.next_opaque()
            request = sn.GetMessagesRequest(reads=[read(1)], suspend_timeout_ms=HOLD_MS)
            await stream.fetch([(held, request)])
            stream.close()
            await tasks.close()
            del stream

    assert not garbage_after(scenario) & {"FetchStream", "StreamStreamCall", "_AioCall"}


def test_a_closed_send_stream_leaves_no_reference_cycle(tmp_path: Path) -> None:
    """As the fetch stream's, for the producer's SendStream: its reader and its
    writer, which lives as long as the stream, end without a cycle."""

    async def scenario() -> None:
        tasks = TaskOwner()
        async with (
            node(tmp_path, auto_create=False) as (running, _, _),
            grpc.aio.insecure_channel(running.address) as channel,
        ):
            stream = SendStream(channel, running.address, tasks)
            request = sn.SendMessageRequest(message=wire(TOPIC, b"x"), queue_id=0)
            answer = await stream.send(1, send_stream_message(1, request))
            assert answer.result.queue_offsets == [0]
            stream.close()
            await tasks.close()
            del stream

    assert not garbage_after(scenario) & {"_Stream", "StreamStreamCall", "_AioCall"}


def test_awaited_fetches_share_one_stream_and_a_cancelled_one_ends_its_hold(
    tmp_path: Path,
) -> None:
    """AwaitedFetches (a PushConsumer's pull loops): concurrent callers' fetches
    on one stream to the store-node, each answered to its own caller; a caller
    cancelled (its queue dropped) has its fetch's hold ended on the store-node;
    close cancels the fetches still awaited."""

    async def scenario() -> None:
        tasks = TaskOwner()
        async with (
            node(tmp_path, auto_create=False) as (running, stub, _),
            grpc.aio.insecure_channel(running.address) as channel,
        ):
            hold = running.servicer.hold
            fetches = AwaitedFetches(lambda address: channel, tasks, 10.0)

            def long_poll(queue_id: int) -> asyncio.Future[pb.PullBatchResponse]:
                request = sn.GetMessagesRequest(reads=[read(queue_id)], suspend_timeout_ms=HOLD_MS)
                return asyncio.ensure_future(fetches.fetch(running.address, request))

            polls = [long_poll(q) for q in (1, 2, 3)]
            await eventually(lambda: hold.held == 3, what="three fetches held")
            polls[0].cancel()
            await eventually(lambda: hold.held == 2, what="the cancelled fetch's hold ended")
            await stub.SendMessage(sn.SendMessageRequest(message=wire(TOPIC, b"m"), queue_id=2))
            async with asyncio.timeout(30):
                answer = await polls[1]
            assert bodies(answer.results[0]) == [b"m"]
            assert not polls[2].done()
            fetches.close()
            await asyncio.gather(*polls, return_exceptions=True)
            assert polls[0].cancelled() and polls[2].cancelled()
            await tasks.close()

    run(scenario)


def test_a_graceful_stop_ends_the_consumers_and_producers_streams(tmp_path: Path) -> None:
    """A stopping store-node answers a GetMessagesStream's held fetch and ends the
    call (OK) at once, and so a SendStream's, rather than wait out its grace
    period for clients that never half-close their streams."""

    async def scenario() -> None:
        topics = LocalTopics()
        topics.put(
            TopicConfig(
                topic_name=TOPIC, read_queue_nums=4, write_queue_nums=4, brokers=("broker-a",)
            )
        )
        running = await start_store_node(
            StoreNodeConfig(broker_name="broker-a"), node_store_config(tmp_path / "store"), topics
        )
        async with grpc.aio.insecure_channel(running.address) as channel:
            stub = sn_grpc.StoreNodeStub(channel)
            sends = stub.SendStream()
            item = sn.SendStreamItem(
                opaque=9, message=sn.SendMessageRequest(message=wire(TOPIC, b"s"), queue_id=0)
            )
            await sends.write(sn.SendStreamRequest(items=[item]))
            async with asyncio.timeout(30):
                (sent,) = (await sends.read()).answers
            assert sent.opaque == 9 and sent.HasField("result")
            fetches = stub.GetMessagesStream()
            await fetches.write(
                sn.GetMessagesStreamRequest(items=[fetch(1, read(1), hold_ms=HOLD_MS)])
            )
            await eventually(lambda: running.servicer.hold.held == 1, what="the fetch held")
            # A grace far longer than the test's patience: a stop that waited it out fails.
            stopping = asyncio.ensure_future(running.stop(grace_s=600))
            got = [a async for a in answers(fetches)]
            assert [a.opaque for a in got] == [1] and not got[0].answer.results[0].records.data
            assert await fetches.code() == grpc.StatusCode.OK
            async with asyncio.timeout(30):
                assert await sends.read() is grpc.aio.EOF
            assert await sends.code() == grpc.StatusCode.OK
            async with asyncio.timeout(60):
                assert await stopping

    run(scenario)
