"""The store-node's batched RPCs, SendStream and GetMessages, over a real server.

Same harness as test_store_node.py (:func:`tests.support.nodes.node`): a real
grpc.aio server on port 0 over a real store. Each refused entry is answered in
its own ``refused`` with the status and code its unary call would fail with,
while the rest of the stream or the call is served.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from pathlib import Path

import grpc
import pytest

from basalt.common.record import decode_record, split_records
from basalt.services.store_node.send_stream import serve_send_stream
from basalt.store import FlushDiskType
from basalt.store.config import MessageStoreConfig
from basalt.v1 import common_pb2 as pb
from basalt.v1 import store_node_pb2 as sn
from tests.support.aio import run
from tests.support.nodes import NODE_TOPIC as TOPIC
from tests.support.nodes import node
from tests.support.polling import eventually
from tests.support.rpc import refused, wire
from tests.support.stores import node_store_config

INVALID = grpc.StatusCode.INVALID_ARGUMENT.value[0]


def get(queue_id: int, offset: int = 0, **kw: object) -> sn.GetMessageRequest:
    return sn.GetMessageRequest(
        group="G", topic=TOPIC, queue_id=queue_id, offset=offset, max_msg_nums=32, **kw
    )


def test_send_stream_answers_every_request_by_opaque_refusals_included(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with node(tmp_path, auto_create=False) as (_, stub, _):
            call = stub.SendStream()
            good = [
                sn.SendStreamItem(
                    opaque=100 + i,
                    message=sn.SendMessageRequest(message=wire(TOPIC, b"m%d" % i), queue_id=1),
                )
                for i in range(20)
            ]
            batch = sn.SendStreamItem(
                opaque=7,
                batch=sn.SendBatchRequest(
                    topic=TOPIC,
                    queue_id=1,
                    messages=pb.MessageList(messages=[wire("", b"b0"), wire("", b"b1")]),
                ),
            )
            bad = [
                # queue out of range, unknown topic, empty batch, neither form
                sn.SendStreamItem(
                    opaque=1, message=sn.SendMessageRequest(message=wire(TOPIC, b"x"), queue_id=9)
                ),
                sn.SendStreamItem(
                    opaque=2, message=sn.SendMessageRequest(message=wire("Nope", b"x"))
                ),
                sn.SendStreamItem(opaque=3, batch=sn.SendBatchRequest(topic=TOPIC)),
                sn.SendStreamItem(opaque=4),
            ]
            # All written before any answer is read: many in flight at once,
            # one send per message and several in one.
            for item in good[:10]:
                await call.write(sn.SendStreamRequest(items=[item]))
            await call.write(sn.SendStreamRequest(items=[*bad, batch]))
            await call.write(sn.SendStreamRequest(items=good[10:]))
            await call.done_writing()
            answers = {a.opaque: a async for response in call for a in response.answers}
            assert len(answers) == 25
            assert await call.code() == grpc.StatusCode.OK

            for opaque in (1, 2, 3, 4):
                assert answers[opaque].WhichOneof("outcome") == "refused"
            assert answers[1].refused.grpc_code == INVALID
            assert answers[1].refused.code == pb.RESPONSE_CODE_INVALID_PARAMETER
            assert "queue id 9 is out of range" in answers[1].refused.message
            assert answers[2].refused.code == pb.RESPONSE_CODE_TOPIC_NOT_EXIST
            assert answers[2].refused.grpc_code == grpc.StatusCode.NOT_FOUND.value[0]
            assert answers[3].refused.code == pb.RESPONSE_CODE_MESSAGE_ILLEGAL
            assert "empty batch" in answers[3].refused.message
            assert "neither message nor batch" in answers[4].refused.message

            assert list(answers[7].result.queue_offsets) == [10, 11]
            # Appended in the order written: m0..m9, the batch, m10..m19.
            offsets = {i: answers[100 + i].result.queue_offsets[0] for i in range(20)}
            assert [offsets[i] for i in range(20)] == [*range(10), *range(12, 22)]
            got = await stub.GetMessage(
                sn.GetMessageRequest(group="G", topic=TOPIC, queue_id=1, offset=0, max_msg_nums=32)
            )
            bodies = [decode_record(r).body for r in split_records(got.records.data)]
            assert bodies == [b"m%d" % i for i in range(10)] + [b"b0", b"b1"] + [
                b"m%d" % i for i in range(10, 20)
            ]

    run(scenario)


def test_send_stream_creates_topics_while_the_known_ones_keep_flowing(tmp_path: Path) -> None:
    """Sends to a topic the node does not serve yet await its creation (a task);
    sends to a served topic on the same stream are started where they are read.
    Every send is answered, and each new topic holds its own, in order."""

    async def scenario() -> None:
        async with node(tmp_path) as (_, stub, topics):
            call = stub.SendStream()
            items = [
                sn.SendStreamItem(
                    opaque=i,
                    message=sn.SendMessageRequest(
                        message=wire(TOPIC if i % 2 else f"Fresh{i % 4}", b"s%d" % i)
                    ),
                )
                for i in range(12)
            ]
            bad_name = sn.SendStreamItem(
                opaque=99, message=sn.SendMessageRequest(message=wire("no spaces", b"x"))
            )
            await call.write(sn.SendStreamRequest(items=[*items[:6], bad_name]))
            await call.write(sn.SendStreamRequest(items=items[6:]))
            await call.done_writing()
            answers = {a.opaque: a async for response in call for a in response.answers}
            assert await call.code() == grpc.StatusCode.OK
            assert sorted(answers) == [*range(12), 99]
            assert answers[99].refused.code == pb.RESPONSE_CODE_MESSAGE_ILLEGAL
            assert all(answers[i].result.status == pb.SEND_STATUS_SEND_OK for i in range(12))
            assert topics.topic("Fresh0") is not None and topics.topic("Fresh2") is not None
            for fresh in ("Fresh0", "Fresh2"):
                got = await stub.GetMessage(
                    sn.GetMessageRequest(group="G", topic=fresh, queue_id=0, max_msg_nums=32)
                )
                bodies = [decode_record(r).body for r in split_records(got.records.data)]
                first = int(fresh[-1])
                assert bodies == [b"s%d" % i for i in range(first, 12, 4)]

    run(scenario)


@pytest.mark.parametrize("flush", list(FlushDiskType))
def test_send_stream_answers_lone_and_pipelined_sends_in_turn(
    tmp_path: Path, flush: FlushDiskType
) -> None:
    """One send at a time (the lone send written at once and answered by the
    stream's reader), then many in flight (the writer task's answers), then one
    at a time again: every send answered once, in the order written."""

    def store_config(root: Path) -> MessageStoreConfig:
        return dataclasses.replace(node_store_config(root), flush_disk_type=flush)

    def item(i: int) -> sn.SendStreamItem:
        return sn.SendStreamItem(
            opaque=1000 + i,
            message=sn.SendMessageRequest(message=wire(TOPIC, b"s%d" % i), queue_id=2),
        )

    async def scenario() -> None:
        async with node(tmp_path, store_config=store_config) as (_, stub, _):
            call = stub.SendStream()
            offsets: dict[int, int] = {}

            async def answers(n: int) -> None:
                while n:
                    response = await asyncio.wait_for(call.read(), 10)
                    for a in response.answers:
                        assert a.opaque - 1000 not in offsets, "answered twice"
                        assert a.result.status == pb.SEND_STATUS_SEND_OK, a
                        offsets[a.opaque - 1000] = a.result.queue_offsets[0]
                        n -= 1

            for i in range(30):
                await call.write(sn.SendStreamRequest(items=[item(i)]))
                await answers(1)
            for i in range(30, 70):
                await call.write(sn.SendStreamRequest(items=[item(i)]))
            await answers(40)
            for i in range(70, 80):
                await call.write(sn.SendStreamRequest(items=[item(i)]))
                await answers(1)
            await call.done_writing()
            assert await call.read() is grpc.aio.EOF
            assert await call.code() == grpc.StatusCode.OK

            assert [offsets[i] for i in range(80)] == list(range(80))
            got = await stub.GetMessage(
                sn.GetMessageRequest(group="G", topic=TOPIC, queue_id=2, offset=0, max_msg_nums=80)
            )
            bodies = [decode_record(r).body for r in split_records(got.records.data)]
            assert bodies == [b"s%d" % i for i in range(80)]

    run(scenario)


def test_send_stream_keeps_serving_after_a_client_goes_away(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def scenario() -> None:
        async with node(tmp_path) as (_, stub, _):
            call = stub.SendStream()
            for i in range(50):
                item = sn.SendStreamItem(
                    opaque=i, message=sn.SendMessageRequest(message=wire(TOPIC, b"x"), queue_id=0)
                )
                await call.write(sn.SendStreamRequest(items=[item]))
            call.cancel()  # gone without reading a single answer
            await asyncio.sleep(0.2)
            again = stub.SendStream()
            item = sn.SendStreamItem(
                opaque=9, message=sn.SendMessageRequest(message=wire(TOPIC, b"y"), queue_id=0)
            )
            await again.write(sn.SendStreamRequest(items=[item]))
            (answer,) = (await again.read()).answers
            await again.done_writing()
            assert answer.opaque == 9
            assert answer.result.status == pb.SEND_STATUS_SEND_OK

    with caplog.at_level(logging.WARNING):
        run(scenario)
    # A client going away is not the node's error: answers it will not read are dropped.
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


def test_get_messages_reads_every_queue_and_refuses_entries_one_by_one(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with node(tmp_path) as (_, stub, _):
            for q, n in ((0, 3), (2, 1)):
                for i in range(n):
                    await stub.SendMessage(
                        sn.SendMessageRequest(message=wire(TOPIC, b"q%d-%d" % (q, i)), queue_id=q)
                    )
            got = await stub.GetMessages(
                sn.GetMessagesRequest(
                    reads=[
                        get(0, 1, commit_offset=1),
                        get(1),  # empty queue
                        get(2),
                        get(9),  # out of range
                        sn.GetMessageRequest(group="G", topic="Nope", queue_id=0, max_msg_nums=1),
                        get(3, subscription=pb.Subscription(type=1, expression="a >")),
                    ],
                    suspend_timeout_ms=60_000,  # not held: entries were refused
                )
            )
            r = got.results
            assert len(r) == 6
            assert r[0].store_status == pb.GET_MESSAGE_STATUS_FOUND
            assert (r[0].code, r[0].status) == (pb.RESPONSE_CODE_SUCCESS, pb.PULL_STATUS_FOUND)
            assert [decode_record(x).body for x in split_records(r[0].records.data)] == [
                b"q0-1",
                b"q0-2",
            ]
            assert r[0].commit.code == pb.RESPONSE_CODE_SUCCESS
            assert r[1].store_status == pb.GET_MESSAGE_STATUS_NO_MATCHED_LOGIC_QUEUE
            assert r[1].status == pb.PULL_STATUS_NO_NEW_MSG  # an empty queue at offset 0
            assert r[2].records.count == 1 and r[2].next_begin_offset == 1
            assert r[3].refused.code == pb.RESPONSE_CODE_INVALID_PARAMETER
            assert "queue id 9 is out of range" in r[3].refused.message
            assert r[4].refused.code == pb.RESPONSE_CODE_TOPIC_NOT_EXIST
            assert r[5].refused.code == pb.RESPONSE_CODE_SUBSCRIPTION_PARSE_FAILED
            assert not r[5].HasField("records")
            committed = await stub.QueryConsumerOffset(
                sn.QueryConsumerOffsetRequest(group="G", topic=TOPIC, queue_id=0)
            )
            assert committed.offset == 1

    run(scenario)


def test_get_messages_is_held_as_a_whole_and_woken_by_any_of_its_queues(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with node(tmp_path) as (running, stub, _):
            held = asyncio.ensure_future(
                stub.GetMessages(
                    sn.GetMessagesRequest(reads=[get(0), get(1), get(2)], suspend_timeout_ms=30_000)
                )
            )
            await eventually(lambda: running.servicer.hold.held >= 1)
            assert not held.done()
            await stub.SendMessage(sn.SendMessageRequest(message=wire(TOPIC, b"late"), queue_id=2))
            got = await asyncio.wait_for(held, 10)
            assert [x.records.count for x in got.results] == [0, 0, 1]
            assert running.servicer.hold.held == 0
            # Nothing arrives: answered empty at the timeout.
            quiet = await stub.GetMessages(
                sn.GetMessagesRequest(reads=[get(0), get(1)], suspend_timeout_ms=200)
            )
            assert [x.records.count for x in quiet.results] == [0, 0]

    run(scenario)


def test_get_messages_refuses_malformed_calls_and_keeps_serving(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with node(tmp_path) as (_, stub, _):
            cases = [
                (sn.GetMessagesRequest(), "0 reads"),
                (sn.GetMessagesRequest(reads=[get(q % 4, q) for q in range(33)]), "33 reads"),
                (sn.GetMessagesRequest(reads=[get(1), get(1)]), f"queue {TOPIC}/1 is read twice"),
                (
                    sn.GetMessagesRequest(reads=[get(1, suspend_timeout_ms=5)]),
                    "no suspend_timeout_ms",
                ),
                (sn.GetMessagesRequest(reads=[get(1)], suspend_timeout_ms=-1), "is negative"),
            ]
            for request, words in cases:
                status, code, message = await refused(stub.GetMessages(request))
                assert status == grpc.StatusCode.INVALID_ARGUMENT
                assert code == pb.RESPONSE_CODE_INVALID_PARAMETER
                assert words in message
            ok = await stub.GetMessages(sn.GetMessagesRequest(reads=[get(0)]))
            assert ok.results[0].store_status == pb.GET_MESSAGE_STATUS_NO_MATCHED_LOGIC_QUEUE

    run(scenario)


def test_the_node_counts_its_open_send_streams(tmp_path: Path) -> None:
    # What tells a lone send on uvloop that no other stream's send can join it (sole).
    async def scenario() -> None:
        async with node(tmp_path, auto_create=False) as (running, stub, _):

            def sending() -> int:
                return running.servicer.streams.serving(serve_send_stream)

            calls = [stub.SendStream() for _ in range(2)]
            for k, call in enumerate(calls):
                item = sn.SendStreamItem(
                    opaque=k, message=sn.SendMessageRequest(message=wire(TOPIC, b"x"))
                )
                await call.write(sn.SendStreamRequest(items=[item]))
                assert (await call.read()).answers[0].result.queue_offsets == [k]
            assert sending() == 2
            await calls[0].done_writing()
            assert await calls[0].read() is grpc.aio.EOF
            await eventually(
                lambda: sending() == 1,
                what="the ended stream uncounted",
            )
            calls[1].cancel()
            await eventually(
                lambda: sending() == 0,
                what="the cancelled one too",
            )

    run(scenario)
