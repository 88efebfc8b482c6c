"""The StoreNode gRPC service: a real grpc.aio server on port 0 over a real store.

Topics come from an in-process directory here (etcd has its own tests); every
refusal is checked for its gRPC status, its RocketMQ code and a message that
says what was wrong, and the service must keep serving after each.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from basalt.common.message import Message
from basalt.common.record import EncodedMessage, decode_record
from basalt.services.errors import Refusal
from basalt.services.meta.model import BrokerRegistration, Perm, TopicConfig
from basalt.services.pull_service.pull_rules import check_pull
from basalt.services.store_node.service import StoreNodeConfig
from basalt.store.batch import EncodedBatch
from basalt.v1 import common_pb2 as pb
from basalt.v1 import store_node_pb2 as sn
from tests.support.aio import run
from tests.support.nodes import NODE_TOPIC as TOPIC
from tests.support.nodes import node
from tests.support.polling import eventually
from tests.support.rpc import pull_request, refused, wire


def test_send_then_get_round_trip_with_tags_keys_and_properties(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with node(tmp_path) as (_, stub, _):
            sent = await stub.SendMessage(
                sn.SendMessageRequest(
                    message=wire(TOPIC, b"hello", tags="TagA", keys=["k1"], properties={"a": "1"}),
                    queue_id=2,
                )
            )
            assert sent.result.status == pb.SEND_STATUS_SEND_OK
            assert list(sent.result.queue_offsets) == [0]
            assert sent.result.queue.broker_name == "broker-a"
            got = await stub.GetMessage(
                sn.GetMessageRequest(group="G", topic=TOPIC, queue_id=2, offset=0, max_msg_nums=32)
            )
            assert got.status == pb.GET_MESSAGE_STATUS_FOUND
            assert got.next_begin_offset == 1
            record = decode_record(got.records.data)
            assert (record.body, record.tags, record.keys) == (b"hello", "TagA", ["k1"])
            assert record.properties["a"] == "1"
            assert record.msg_id == sent.result.offset_msg_ids[0]

    run(scenario)


def test_send_batch_as_messages_and_as_producer_encoded_records(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with node(tmp_path) as (running, stub, _):
            batch = pb.MessageList(messages=[wire("", b"m%d" % i, tags="T") for i in range(5)])
            r1 = await stub.SendBatch(sn.SendBatchRequest(topic=TOPIC, queue_id=1, messages=batch))
            assert list(r1.result.queue_offsets) == [0, 1, 2, 3, 4]
            host = running.store.commitlog.store_host
            encoded = EncodedBatch.of_messages(
                [
                    EncodedMessage(Message(TOPIC, b"e%d" % i, queue_id=1), store_host=host)
                    for i in range(3)
                ]
            ).data
            r2 = await stub.SendBatch(
                sn.SendBatchRequest(topic=TOPIC, queue_id=1, records=bytes(encoded))
            )
            assert list(r2.result.queue_offsets) == [5, 6, 7]
            got = await stub.GetMessage(
                sn.GetMessageRequest(group="G", topic=TOPIC, queue_id=1, offset=0, max_msg_nums=32)
            )
            bodies = [r.body for r in _records(got.records.data)]
            assert bodies == [b"m0", b"m1", b"m2", b"m3", b"m4", b"e0", b"e1", b"e2"]

    run(scenario)


def _records(data: bytes) -> list[Any]:
    from basalt.common.record import split_records

    return [decode_record(r) for r in split_records(data)]


def test_every_bad_input_is_refused_clearly_and_the_node_keeps_serving(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with node(tmp_path, auto_create=False) as (_, stub, topics):
            topics.put(TopicConfig(topic_name="ReadOnly", perm=Perm.READ, brokers=("broker-a",)))
            topics.put(TopicConfig(topic_name="Elsewhere", brokers=("broker-b",)))
            get = sn.GetMessageRequest
            cases: list[tuple[Awaitable[Any], grpc.StatusCode, int, str]] = [
                (
                    stub.SendMessage(sn.SendMessageRequest(message=wire("Nope", b"x"))),
                    grpc.StatusCode.NOT_FOUND,
                    pb.RESPONSE_CODE_TOPIC_NOT_EXIST,
                    "does not exist",
                ),
                (
                    stub.SendMessage(sn.SendMessageRequest(message=wire(TOPIC, b"x"), queue_id=4)),
                    grpc.StatusCode.INVALID_ARGUMENT,
                    pb.RESPONSE_CODE_INVALID_PARAMETER,
                    "4 write queues",
                ),
                (
                    stub.SendMessage(
                        sn.SendMessageRequest(message=wire(TOPIC, b"x" * (4 * 1024 * 1024 + 1)))
                    ),
                    grpc.StatusCode.INVALID_ARGUMENT,
                    pb.RESPONSE_CODE_MESSAGE_ILLEGAL,
                    "max_message_size",
                ),
                (
                    stub.SendMessage(sn.SendMessageRequest(message=wire("ReadOnly", b"x"))),
                    grpc.StatusCode.PERMISSION_DENIED,
                    pb.RESPONSE_CODE_NO_PERMISSION,
                    "not writable",
                ),
                (
                    stub.SendMessage(sn.SendMessageRequest(message=wire("Elsewhere", b"x"))),
                    grpc.StatusCode.PERMISSION_DENIED,
                    pb.RESPONSE_CODE_NO_PERMISSION,
                    "not served by broker",
                ),
                (
                    stub.SendBatch(sn.SendBatchRequest(topic=TOPIC, queue_id=0)),
                    grpc.StatusCode.INVALID_ARGUMENT,
                    pb.RESPONSE_CODE_MESSAGE_ILLEGAL,
                    "empty batch",
                ),
                (
                    stub.SendBatch(
                        sn.SendBatchRequest(topic=TOPIC, queue_id=0, records=b"\x00" * 200)
                    ),
                    grpc.StatusCode.INVALID_ARGUMENT,
                    pb.RESPONSE_CODE_MESSAGE_ILLEGAL,
                    "malformed",
                ),
                (
                    stub.GetMessage(
                        get(
                            group="G",
                            topic=TOPIC,
                            queue_id=0,
                            max_msg_nums=32,
                            subscription=pb.Subscription(
                                type=pb.EXPRESSION_TYPE_SQL92, expression="a > AND 3"
                            ),
                        )
                    ),
                    grpc.StatusCode.INVALID_ARGUMENT,
                    pb.RESPONSE_CODE_SUBSCRIPTION_PARSE_FAILED,
                    "position 4",
                ),
                (
                    stub.GetMessage(get(group="G", topic=TOPIC, offset=-1, max_msg_nums=32)),
                    grpc.StatusCode.INVALID_ARGUMENT,
                    pb.RESPONSE_CODE_INVALID_PARAMETER,
                    "negative",
                ),
                (
                    stub.GetMessage(get(group="G", topic=TOPIC, queue_id=9, max_msg_nums=32)),
                    grpc.StatusCode.INVALID_ARGUMENT,
                    pb.RESPONSE_CODE_INVALID_PARAMETER,
                    "read queues",
                ),
                (
                    stub.GetMessage(get(group="G", topic="Nope", max_msg_nums=32)),
                    grpc.StatusCode.NOT_FOUND,
                    pb.RESPONSE_CODE_TOPIC_NOT_EXIST,
                    "does not exist",
                ),
                (
                    stub.QueryConsumerOffset(sn.QueryConsumerOffsetRequest(group="", topic=TOPIC)),
                    grpc.StatusCode.INVALID_ARGUMENT,
                    pb.RESPONSE_CODE_INVALID_PARAMETER,
                    "group",
                ),
                (
                    stub.ViewMessage(sn.ViewMessageRequest(offset_msg_id="zz")),
                    grpc.StatusCode.INVALID_ARGUMENT,
                    pb.RESPONSE_CODE_INVALID_PARAMETER,
                    "offset message id",
                ),
                (
                    stub.SendMessage(
                        sn.SendMessageRequest(message=wire(TOPIC, b"x", delay_level=19))
                    ),
                    grpc.StatusCode.INVALID_ARGUMENT,
                    pb.RESPONSE_CODE_INVALID_PARAMETER,
                    "1-18",
                ),
            ]
            for call, status, code, words in cases:
                got_status, got_code, details = await refused(call)
                assert (got_status, got_code) == (status, code), details
                assert words in details
                # Still serving, and nothing acknowledged was lost:
                ok = await stub.SendMessage(sn.SendMessageRequest(message=wire(TOPIC, b"ok")))
                assert ok.result.status == pb.SEND_STATUS_SEND_OK
            count = await stub.GetMinMaxOffset(sn.GetMinMaxOffsetRequest(topic=TOPIC))
            assert count.max_offset == len(cases)

    run(scenario)


def test_a_send_to_an_unknown_topic_creates_it_when_auto_create_is_on(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with node(tmp_path) as (_, stub, topics):
            # A topic another broker serves: this node is added to its route first.
            topics.put(TopicConfig(topic_name="Shared", brokers=("broker-b",)))
            await stub.SendMessage(sn.SendMessageRequest(message=wire("Shared", b"x")))
            shared = topics.topic("Shared")
            assert shared is not None and shared.brokers == ("broker-b", "broker-a")
            r = await stub.SendMessage(
                sn.SendMessageRequest(message=wire("Fresh", b"x"), queue_id=3)
            )
            assert r.result.status == pb.SEND_STATUS_SEND_OK
            created = topics.topic("Fresh")
            assert created is not None
            assert (created.write_queue_nums, created.brokers) == (4, ("broker-a",))
            status, code, _ = await refused(
                stub.SendMessage(sn.SendMessageRequest(message=wire("bad topic!", b"x")))
            )
            assert (status, code) == (
                grpc.StatusCode.INVALID_ARGUMENT,
                pb.RESPONSE_CODE_MESSAGE_ILLEGAL,
            )

    run(scenario)


def test_long_polling_over_grpc_wakes_on_arrival_and_times_out_empty(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with node(tmp_path) as (_, stub, _):
            req = sn.GetMessageRequest(
                group="G",
                topic=TOPIC,
                queue_id=0,
                offset=0,
                max_msg_nums=32,
                suspend_timeout_ms=20_000,
            )
            pending = asyncio.ensure_future(stub.GetMessage(req))
            await asyncio.sleep(0.2)
            assert not pending.done()
            await stub.SendMessage(sn.SendMessageRequest(message=wire(TOPIC, b"wake")))
            got = await asyncio.wait_for(pending, 10)
            assert got.status == pb.GET_MESSAGE_STATUS_FOUND
            assert [r.body for r in _records(got.records.data)] == [b"wake"]
            empty = await stub.GetMessage(
                sn.GetMessageRequest(
                    group="G",
                    topic=TOPIC,
                    queue_id=0,
                    offset=1,
                    max_msg_nums=32,
                    suspend_timeout_ms=300,
                )
            )
            assert empty.status == pb.GET_MESSAGE_STATUS_OFFSET_OVERFLOW_ONE
            assert empty.records.count == 0

    run(scenario)


def test_offsets_commit_with_epochs_reset_by_time_and_look_ups(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with node(tmp_path) as (_, stub, _):
            sent = []
            for i in range(6):
                r = await stub.SendMessage(
                    sn.SendMessageRequest(message=wire(TOPIC, b"%d" % i, keys=[f"key{i}"]))
                )
                sent.append(r.result)
            c = await stub.UpdateConsumerOffset(
                sn.UpdateConsumerOffsetRequest(group="G", topic=TOPIC, queue_id=0, offset=5)
            )
            assert c.commit.code == pb.RESPONSE_CODE_SUCCESS
            reset = await stub.ResetOffset(
                sn.ResetOffsetRequest(topic=TOPIC, group="G", timestamp_ms=0, force=True)
            )
            assert reset.offsets[0] == 0 and reset.reset_epoch == 1
            stale = await stub.UpdateConsumerOffset(
                sn.UpdateConsumerOffsetRequest(
                    group="G", topic=TOPIC, queue_id=0, offset=6, reset_epoch=0
                )
            )
            assert stale.commit.code == pb.RESPONSE_CODE_STALE_RESET_EPOCH
            q = await stub.QueryConsumerOffset(
                sn.QueryConsumerOffsetRequest(group="G", topic=TOPIC, queue_id=0)
            )
            assert (q.offset, q.reset_epoch) == (0, 1)
            view = await stub.ViewMessage(
                sn.ViewMessageRequest(offset_msg_id=sent[3].offset_msg_ids[0])
            )
            assert decode_record(view.records.data).body == b"3"
            found = sn.QueryMessageResponse()

            async def indexed() -> bool:  # the index follows the dispatcher, every 10 ms
                nonlocal found
                found = await stub.QueryMessage(sn.QueryMessageRequest(topic=TOPIC, key="key4"))
                return bool(found.records.count)

            await eventually(indexed)
            assert decode_record(found.records.data).body == b"4"
            at = await stub.SearchOffset(
                sn.SearchOffsetRequest(
                    topic=TOPIC, queue_id=0, timestamp_ms=sent[2].store_timestamp_ms
                )
            )
            assert at.offset <= 2
            info = await stub.GetRuntimeInfo(sn.GetRuntimeInfoRequest())
            assert info.broker_name == "broker-a"
            assert info.commit_log_max_offset > 0
            # As df shows it (used / (used + avail)), as the store's space guard does.
            st = os.statvfs(tmp_path)
            used = st.f_blocks - st.f_bfree
            assert abs(info.disk_use_ratio - used / (used + st.f_bavail)) < 0.01

    run(scenario)


def test_health_and_graceful_stop_leave_a_clean_store(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with node(tmp_path) as (running, stub, _):
            channel = grpc.aio.insecure_channel(running.address)
            health = health_pb2_grpc.HealthStub(channel)
            reply = await health.Check(health_pb2.HealthCheckRequest(service=""))
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
            await stub.SendMessage(sn.SendMessageRequest(message=wire(TOPIC, b"last")))
            await channel.close()

    run(scenario)
    assert not (tmp_path / "store" / "abort").exists()  # clean shutdown removed it


def test_only_nothing_new_is_held_an_offset_past_an_empty_queue_answers_at_once(
    tmp_path: Path,
) -> None:
    """RocketMQ holds only PULL_NOT_FOUND: an offset past an empty queue is an
    offset to move, answered at once even with a long suspend time."""

    async def scenario() -> None:
        async with node(tmp_path) as (_, stub, _):
            moved = await asyncio.wait_for(
                stub.GetMessage(
                    sn.GetMessageRequest(
                        group="G",
                        topic=TOPIC,
                        queue_id=3,
                        offset=5,
                        max_msg_nums=32,
                        suspend_timeout_ms=60_000,
                    )
                ),
                20,  # far below the suspend time: it was not held
            )
            assert moved.status == pb.GET_MESSAGE_STATUS_NO_MATCHED_LOGIC_QUEUE
            assert moved.next_begin_offset == 0

    run(scenario)


def test_a_graceful_stop_answers_held_pulls_instead_of_cancelling_them(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with node(tmp_path) as (running, stub, _):
            held = asyncio.ensure_future(
                stub.GetMessage(
                    sn.GetMessageRequest(
                        group="G",
                        topic=TOPIC,
                        queue_id=0,
                        max_msg_nums=32,
                        suspend_timeout_ms=60_000,
                    )
                )
            )
            await eventually(lambda: running.servicer.hold.held == 1)
            stopping = asyncio.ensure_future(running.stop(grace_s=30))
            answer = await asyncio.wait_for(held, 20)  # long before the grace ends
            assert answer.records.count == 0
            await stopping

    run(scenario)


def test_reads_are_refused_what_the_pull_service_refuses_with_its_codes_and_messages(
    tmp_path: Path,
) -> None:
    """The SDK's consumers read the store-node directly: each read the
    pull-service's check_pull refuses (the node's broker being registered and
    readable) is refused by GetMessage and by a GetMessages entry alike, with
    the same gRPC status, response code and message."""
    broker = BrokerRegistration(
        broker_name="broker-a", address="unused:1", store_root_id="r", started_at_ms=0
    )
    sql = pb.Subscription(type=pb.EXPRESSION_TYPE_SQL92, expression="a > AND 3")
    cases = [
        {"topic": "Nope"},
        {"topic": "WriteOnly"},
        {"queue_id": 4},
        {"queue_id": -1},
        {"group": ""},
        {"group": "bad group!"},
        {"offset": -1},
        {"max_nums": 0},
        {"subscription": sql},
    ]

    async def scenario() -> None:
        async with node(tmp_path) as (_, stub, topics):
            topics.put(TopicConfig(topic_name="WriteOnly", perm=Perm.WRITE, brokers=("broker-a",)))
            for case in cases:
                kw: dict[str, Any] = {"topic": TOPIC, "group": "G", "max_nums": 32, **case}
                pull = pull_request(**kw)
                with pytest.raises(Refusal) as by_pull_service:
                    check_pull(pull, {"broker-a": broker}.get, topics.topic)
                expected = by_pull_service.value
                get = sn.GetMessageRequest(
                    group=pull.group,
                    topic=pull.queue.topic,
                    queue_id=pull.queue.queue_id,
                    offset=pull.offset,
                    max_msg_nums=pull.max_nums,
                    subscription=pull.subscription if pull.HasField("subscription") else None,
                )
                message = expected.message.replace("max_nums", "max_msg_nums")
                assert await refused(stub.GetMessage(get)) == (
                    expected.grpc_status,
                    expected.code,
                    message,
                ), case
                batch = await stub.GetMessages(sn.GetMessagesRequest(reads=[get]))
                (entry,) = batch.results
                assert (entry.refused.code, entry.refused.message) == (expected.code, message)

    run(scenario)


def test_a_read_only_broker_refuses_sends_and_serves_reads(tmp_path: Path) -> None:
    """``broker_permission`` 4 (RocketMQ's brokerPermission, read only): what
    was stored stays readable, a send is NO_PERMISSION in RocketMQ's words."""

    async def scenario() -> None:
        async with node(tmp_path) as (_, stub, _):
            await stub.SendMessage(sn.SendMessageRequest(message=wire(TOPIC, b"before")))
        async with node(tmp_path, broker_permission=4) as (_, stub, _):
            status, code, details = await refused(
                stub.SendMessage(sn.SendMessageRequest(message=wire(TOPIC, b"after")))
            )
            assert (status, code) == (
                grpc.StatusCode.PERMISSION_DENIED,
                pb.RESPONSE_CODE_NO_PERMISSION,
            )
            assert "broker 'broker-a' sending message is forbidden (perm 4)" in details
            got = await stub.GetMessage(
                sn.GetMessageRequest(group="g", topic=TOPIC, queue_id=0, max_msg_nums=8)
            )
            assert [r.body for r in _records(got.records.data)] == [b"before"]

    run(scenario)


@pytest.mark.parametrize("bad", [8, -1, True, "6"])
def test_broker_permission_is_rocketmq_perm_bits(bad: object) -> None:
    with pytest.raises(ValueError, match="broker_permission"):
        StoreNodeConfig(broker_name="broker-a", broker_permission=bad)  # type: ignore[arg-type]
