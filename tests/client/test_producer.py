"""client.Producer against real etcd, store-nodes and a pull-service (in-process
servers on port 0; the harness of tests/services/test_pull_service.py)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest

from basalt.client import (
    ClientError,
    IllegalMessageError,
    NoPermissionError,
    Producer,
    ProducerConfig,
)
from basalt.client.producer import _stored_by_the_store_node, _Stream, _wire, deliver_after
from basalt.common.message import (
    PROPERTY_CRC32,
    PROPERTY_TRANSACTION_PREPARED,
    Message,
    MessageRecord,
)
from basalt.common.record import decode_records
from basalt.services.meta import MetaConfig, Perm
from basalt.v1 import common_pb2 as pb
from basalt.v1 import pull_service_pb2 as ps
from basalt.v1 import store_node_pb2 as sn
from tests.support.aio import async_test
from tests.support.nodes import TOPIC, cluster
from tests.support.processes import run_basalt
from tests.support.rpc import pull_queue
from tests.support.timeouts import SUBPROCESS_TEST_TIMEOUT_S


def test_config_is_checked() -> None:
    with pytest.raises(ValueError, match="producer_group"):
        ProducerConfig(producer_group="")
    with pytest.raises(ValueError, match="retry_times_when_send_failed"):
        ProducerConfig(producer_group="P", retry_times_when_send_failed=-1)


@async_test
async def test_sends_go_round_robin_over_every_writable_queue_and_read_back(
    tmp_path: Path, meta_config: MetaConfig
) -> None:
    async with cluster(tmp_path, meta_config) as h:
        address = h.services[0].address
        async with Producer(address, group="P") as producer:
            results = [
                await producer.send(Message(TOPIC, f"m{i}".encode(), tags="TagA", keys=(f"k{i}",)))
                for i in range(8)
            ]
            assert all(r.ok for r in results)
            # 2 brokers x 4 queues: each queue once, each at offset 0.
            assert sorted((r.broker_name, r.queue_id) for r in results) == [
                (b, q) for b in ("broker-a", "broker-b") for q in range(4)
            ]
            assert {r.queue_offset for r in results} == {0}
            assert len({r.msg_id for r in results}) == 8
            got = {}
            for r in results:
                records = await pull_queue(h.stub, r.broker_name, r.queue_id)
                got[r.msg_id] = records
            assert sorted(b for bodies in got.values() for b in bodies) == sorted(
                f"m{i}".encode() for i in range(8)
            )

            batch = await producer.send_batch(
                [Message(TOPIC, b"b%d" % i, tags="TagB") for i in range(5)]
            )
            assert len({(r.broker_name, r.queue_id) for r in batch}) == 1  # one queue
            assert [r.queue_offset for r in batch] == list(range(1, 6))
            assert len({r.msg_id for r in batch}) == 5
            bodies = await pull_queue(h.stub, batch[0].broker_name, batch[0].queue_id)
            assert bodies[1:] == [b"b%d" % i for i in range(5)]

            # Many in flight at once on the streams.
            futures = [producer.send_async(Message(TOPIC, b"a%d" % i)) for i in range(200)]
            many = await asyncio.gather(*futures)
            placed = {(r.broker_name, r.queue_id, r.queue_offset) for r in many}
            assert len(placed) == 200  # no two on the same offset of a queue


class _CountingCall:
    """A SendStream call whose writes are recorded (the rest passes through)."""

    def __init__(self, call: object) -> None:
        self.call = call
        self.writes: list[bytes] = []

    async def write(self, request: bytes) -> None:
        self.writes.append(request)
        await self.call.write(request)  # type: ignore[attr-defined]

    def cancel(self) -> bool:
        return self.call.cancel()  # type: ignore[attr-defined,no-any-return]


@async_test
async def test_batches_sent_together_share_a_write(tmp_path: Path, meta_config: MetaConfig) -> None:
    async with (
        cluster(tmp_path, meta_config) as h,
        Producer(h.services[0].address, group="P") as producer,
    ):
        for _ in range(8):  # round robin over the 2 x 4 queues: a stream to each node
            assert (await producer.send(Message(TOPIC, b"warm"))).ok
        streams: list[_Stream] = list(producer._streams.values())
        assert len(streams) == 2
        calls = [_CountingCall(s.call) for s in streams]
        for stream, call in zip(streams, calls, strict=True):
            stream.call = call  # type: ignore[assignment]
        batches = [[Message(TOPIC, b"%d-%d" % (i, k)) for k in range(3)] for i in range(8)]
        results = await asyncio.gather(*(producer.send_batch(b) for b in batches))
        assert all(r.ok for rs in results for r in rs)
        # Round robin: 4 batches a store-node, started in one loop turn, so
        # written as one SendStreamRequest each.
        assert [len(c.writes) for c in calls] == [1, 1]
        for call in calls:
            items = sn.SendStreamRequest.FromString(call.writes[0]).items
            assert len(items) == 4
            assert all(item.batch.topic == TOPIC for item in items)


@async_test
async def test_a_failed_broker_is_retried_elsewhere_and_bad_sends_raise(
    tmp_path: Path, meta_config: MetaConfig
) -> None:
    async with cluster(tmp_path, meta_config) as h:
        address = h.services[0].address
        async with Producer(address, group="P") as producer:
            assert (await producer.send(Message(TOPIC, b"warm"))).ok
            await h.nodes["broker-a"].stop(grace_s=0.5)  # down, still in the route
            results = [await producer.send(Message(TOPIC, b"x%d" % i)) for i in range(6)]
            assert {r.broker_name for r in results} == {"broker-b"}

            with pytest.raises(ClientError) as bad_name:  # not retried
                await producer.send(Message("bad topic!", b"x"))
            assert bad_name.value.code == pb.RESPONSE_CODE_MESSAGE_ILLEGAL
            with pytest.raises(ClientError) as illegal:
                await producer.send(Message(TOPIC, b"x" * (4 * 1024 * 1024 + 1)))
            assert illegal.value.code == pb.RESPONSE_CODE_MESSAGE_ILLEGAL
            with pytest.raises(ValueError, match="one topic"):
                await producer.send_batch([Message(TOPIC, b"1"), Message("Other", b"2")])
            assert (await producer.send(Message(TOPIC, b"still"))).broker_name == "broker-b"
        # The harness stops broker-a again at exit: a second stop is harmless.


@async_test
async def test_a_new_topic_is_sent_on_the_default_route_and_created(
    tmp_path: Path, meta_config: MetaConfig
) -> None:
    async with cluster(tmp_path, meta_config) as h:
        route = (await h.stub.QueryRoute(ps.QueryRouteRequest(topic="TBW102"))).route
        assert sorted(b.broker_name for b in route.broker_datas) == ["broker-a", "broker-b"]
        assert {q.write_queue_nums for q in route.queue_datas} == {4}
        async with Producer(h.services[0].address, group="P") as producer:
            first = await producer.send(Message("FreshTopic", b"first"))
            assert first.ok
            await h.seen(lambda s: s.servicer.view.topics.get("FreshTopic") is not None)
            more = [await producer.send(Message("FreshTopic", b"x")) for _ in range(4)]
            assert all(r.ok for r in more)
        bodies = await pull_queue(h.stub, first.broker_name, first.queue_id, topic="FreshTopic")
        assert bodies[0] == b"first"


@async_test
async def test_each_producer_starts_its_round_robin_at_a_random_queue(
    tmp_path: Path, meta_config: MetaConfig
) -> None:
    """RocketMQ's ThreadLocalIndex: short-lived producers (one send each) spread
    over the queues and brokers instead of all taking the first queue of the
    first broker. 24 producers over 2 x 4 queues: all on one broker has odds of
    2 in 2^24, all on one queue 8 in 8^24."""
    async with cluster(tmp_path, meta_config) as h:
        firsts = []
        for i in range(24):
            async with Producer(h.services[0].address, group="P") as producer:
                r = await producer.send(Message(TOPIC, b"one-%d" % i))
                assert r.ok
                firsts.append((r.broker_name, r.queue_id))
        assert {b for b, _ in firsts} == {"broker-a", "broker-b"}
        assert len(set(firsts)) > 2


@async_test
async def test_a_new_topic_is_created_on_every_broker_the_producer_reaches(
    tmp_path: Path, meta_config: MetaConfig
) -> None:
    """The default route is the new topic's route until the next refresh (RocketMQ's
    producer): consecutive sends round robin over every store-node, each of which
    creates the topic there, so its route lists them all."""
    async with cluster(tmp_path, meta_config) as h:
        async with Producer(h.services[0].address, group="P") as producer:
            # 2 brokers x 4 queues of TBW102's route: 8 sends reach each queue once.
            results = [await producer.send(Message("SpreadTopic", b"%d" % i)) for i in range(8)]
        assert sorted((r.broker_name, r.queue_id) for r in results) == [
            (b, q) for b in ("broker-a", "broker-b") for q in range(4)
        ]
        config = await h.meta.get_topic("SpreadTopic")
        assert config is not None and sorted(config.brokers) == ["broker-a", "broker-b"]
        await h.seen(lambda s: s.servicer.view.topics.get("SpreadTopic") == config)
        route = (await h.stub.QueryRoute(ps.QueryRouteRequest(topic="SpreadTopic"))).route
        assert sorted(b.broker_name for b in route.broker_datas) == ["broker-a", "broker-b"]
        for r in results:
            bodies = await pull_queue(h.stub, r.broker_name, r.queue_id, topic="SpreadTopic")
            assert len(bodies) == 1


@async_test(timeout_s=SUBPROCESS_TEST_TIMEOUT_S)
async def test_basalt_produce_spreads_an_auto_created_topic_over_the_brokers(
    tmp_path: Path, meta_config: MetaConfig
) -> None:
    """``basalt produce -n 6`` to a topic that does not exist: six consecutive
    queues of the 2 x 4 of TBW102's route, whatever the random start, so both
    store-nodes take sends and both serve the topic."""
    async with cluster(tmp_path, meta_config) as h:
        address = h.services[0].address
        code, out, err = await run_basalt(
            "produce", "--endpoints", address, "-t", "CliSpread", "-n", "6", "--verbose"
        )
        assert code == 0, err
        placed = {
            line.split("queue=")[1].split(",")[0] for line in out.splitlines() if "queue=" in line
        }
        assert len(placed) == 6
        assert {q.split("/")[0] for q in placed} == {"broker-a", "broker-b"}
        config = await h.meta.get_topic("CliSpread")
        assert config is not None and sorted(config.brokers) == ["broker-a", "broker-b"]


@async_test
async def test_refusals_reach_the_user_as_their_typed_errors(
    tmp_path: Path, meta_config: MetaConfig
) -> None:
    async with cluster(tmp_path, meta_config) as h:
        await h.update_topic(TOPIC, perm=Perm.READ)
        await h.seen(lambda s: not s.servicer.view.topics.get(TOPIC).writable)
        async with Producer(h.services[0].address, group="P") as producer:
            with pytest.raises(NoPermissionError, match="no writable queue") as forbidden:
                await producer.send(Message(TOPIC, b"x"))
            assert forbidden.value.code == pb.RESPONSE_CODE_NO_PERMISSION
            # The store-node's refusal, through the SendStream's answer.
            with pytest.raises(IllegalMessageError) as illegal:
                await producer.send(Message("bad topic!", b"x"))
            assert illegal.value.code == pb.RESPONSE_CODE_MESSAGE_ILLEGAL
            assert isinstance(illegal.value, ClientError) and isinstance(illegal.value, ValueError)


@async_test
async def test_a_plain_message_is_stored_as_the_store_node_would_store_it(
    tmp_path: Path, meta_config: MetaConfig
) -> None:
    # A plain message goes as a batch of one record encoded by the SDK; the same
    # message as a wire Message (the form a delayed, timer or transactional one
    # takes) is encoded by the store-node. Both records must be the same message.
    message = Message(
        TOPIC,
        b"body",
        tags="TagA",
        keys=("k1", "k2"),
        properties={"a": "1", "b": "2"},
        flag=7,
        born_timestamp_ms=1_700_000_000_123,
    )
    async with cluster(tmp_path, meta_config) as h:
        async with Producer(h.services[0].address, group="P") as producer:
            sent = await producer.send(message)
        node = h.node_stubs[sent.broker_name]
        wired = await node.SendMessage(
            sn.SendMessageRequest(message=_wire(message, sent.msg_id), queue_id=sent.queue_id)
        )
        assert wired.result.queue_offsets == [sent.queue_offset + 1]
        answer = await node.GetMessage(
            sn.GetMessageRequest(
                group="G", topic=TOPIC, queue_id=sent.queue_id, offset=0, max_msg_nums=2
            )
        )
        by_sdk, by_node = decode_records(answer.records.data)

    def stored(record: MessageRecord) -> MessageRecord:
        # What the store assigns: offsets, its time and the checksums over them.
        properties = {k: v for k, v in record.properties.items() if k != PROPERTY_CRC32}
        return replace(
            record, queue_offset=0, commit_log_offset=0, store_timestamp_ms=0, properties=properties
        )

    assert stored(by_sdk) == stored(by_node)
    assert by_sdk.body == b"body" and by_sdk.flag == 7 and by_sdk.keys == ["k1", "k2"]
    assert by_sdk.properties["a"] == "1" and by_sdk.uniq_key == sent.msg_id
    assert by_sdk.born_timestamp_ms == 1_700_000_000_123


def test_only_a_plain_message_goes_as_a_record_the_sdk_encodes() -> None:
    assert not _stored_by_the_store_node(Message(TOPIC, b"x", tags="T", properties={"a": "1"}))
    for special in (
        Message(TOPIC, b"x", delay_time_level=3),
        Message(TOPIC, b"x", properties={"DELAY": "3"}),
        Message(TOPIC, b"x", deliver_time_ms=deliver_after(5)),
        Message(TOPIC, b"x", properties={"TIMER_DELAY_SEC": "5"}),
        Message(TOPIC, b"x", properties={PROPERTY_TRANSACTION_PREPARED: "true"}),
        Message(TOPIC, b"x", properties={PROPERTY_CRC32: "1"}),  # refused by the store-node
    ):
        assert _stored_by_the_store_node(special), special
