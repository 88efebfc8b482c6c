"""Consumption through the v2 front against ``basalt cluster up``: the official
Python and Node.js SimpleConsumers, the Python PushConsumer (retries, dead
letters, FIFO), raw v2 calls with bad input; topics on one store-node and on
both of the cluster's two. The cluster's front runs with 3
max attempts, 1 s retry delays, 3 s PushConsumer polls and one FIFO group, so
retries and shutdowns end quickly."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import grpc
import pytest

from basalt.client import Producer
from basalt.common.message import Message
from basalt.rocketmq.v2 import definition_pb2 as v2
from basalt.rocketmq.v2 import service_pb2 as sv
from basalt.rocketmq.v2 import service_pb2_grpc as sv_grpc
from tests.support.interop import (
    PRODUCERS,
    PUSH_CONSUMERS,
    SIMPLE_CONSUMERS,
    ensure_node_modules,
    run_client,
)
from tests.support.v2_front import FRONTS, V2Cluster, read_all, v2_cluster

FIFO_GROUP = "GFifo"
#: A topic spread over both store-nodes.
BOTH = ("broker-a", "broker-b")
MAX_ATTEMPTS = 3


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[V2Cluster]:
    ensure_node_modules()
    env = {
        "BASALT_ROCKETMQ_V2_CONSUMER_MAX_ATTEMPTS": str(MAX_ATTEMPTS),
        "BASALT_ROCKETMQ_V2_CONSUMER_MAX_RETRY_DELAY_MS": "1000",
        "BASALT_ROCKETMQ_V2_FIFO_GROUPS": FIFO_GROUP,
        # PushConsumers' polls: a client's shutdown waits for its poll to end.
        "BASALT_ROCKETMQ_V2_LONG_POLLING_TIMEOUT_MS": "3000",
    }
    data = tmp_path_factory.mktemp("v2c") / "c"
    # Two store-nodes: topics on one (broker-a) and topics spread over both.
    with v2_cluster(data, "--store-nodes", "2", env=env) as cluster:
        yield cluster


async def _sdk_send(pull: str, messages: list[Message]) -> list[str]:
    async with Producer(pull, group="P") as producer:
        return [(await producer.send(m)).msg_id for m in messages]


@pytest.mark.parametrize("front", ["pull-service", "store-node"])
@pytest.mark.parametrize("client", sorted(SIMPLE_CONSUMERS))
def test_simple_consumer_receive_ack_invisible_redelivery(
    cluster: V2Cluster, client: str, front: str
) -> None:
    topic = cluster.topic(f"V2Simple-{client}-{front}")
    messages = [
        Message(topic, f"s{i}".encode(), tags="T", keys=[f"k{i}"], properties={"n": str(i)})
        for i in range(4)
    ]
    asyncio.run(_sdk_send(cluster.pull, messages))
    group = f"GSimple-{client}-{front}"
    spec = {"topic": topic, "group": group, "expect": 4, "invisible_s": 20}
    out = run_client(SIMPLE_CONSUMERS[client], cluster.endpoint(front), spec)
    first = out["first"]
    assert sorted(m["body"] for m in first) == ["s0", "s1", "s2", "s3"]
    for m in first:
        i = m["body"][1:]
        assert (m["attempt"], m["tag"], m["keys"]) == (1, "T", [f"k{i}"])
        assert m["properties"] == {"n": i}
    assert out["stale_ack"], "an ack by the handle a change replaced must be refused"
    again = out["again"]
    assert sorted(m["id"] for m in again) == sorted(m["id"] for m in first[:2])
    assert {m["attempt"] for m in again} == {2}
    assert out["double_ack"], "a second ack of one delivery must be refused"
    # Everything is acked: nothing comes again.
    channel, stub = cluster.stub()
    with channel:
        assert _receive(stub, topic, group).status.code == v2.MESSAGE_NOT_FOUND


@pytest.mark.parametrize("client", sorted(SIMPLE_CONSUMERS))
def test_simple_consumers_read_both_store_nodes_of_a_topic(cluster: V2Cluster, client: str) -> None:
    # The Node.js SimpleConsumer 1.0.8 reads only through route queues numbered
    # 0: every store-node must have one, as in RocketMQ 5's routes.
    topic = cluster.topic(f"V2Spread-{client}", BOTH)
    channel, stub = cluster.stub()
    with channel:
        host, _, port = cluster.v2.rpartition(":")
        endpoints = v2.Endpoints(addresses=[v2.Address(host=host, port=int(port))])
        route = stub.QueryRoute(
            sv.QueryRouteRequest(topic=v2.Resource(name=topic), endpoints=endpoints), timeout=10
        )
        assert [(q.broker.name, q.id) for q in route.message_queues] == [
            (b, i) for b in BOTH for i in range(2)
        ]
        # Unset queue ids go round robin over all four queues: 2 on each.
        for n in range(8):
            system = v2.SystemProperties(message_id=f"01SPREAD{client}{n}", tag="T")
            message = v2.Message(
                topic=v2.Resource(name=topic), system_properties=system, body=f"s{n}".encode()
            )
            sent = stub.SendMessage(sv.SendMessageRequest(messages=[message]), timeout=10)
            assert sent.status.code == v2.OK, sent.status
        for q in route.message_queues:  # offsets RPCs go to the MessageQueue's broker
            end = sv.QueryOffsetRequest(message_queue=q, query_offset_policy=v2.END)
            assert stub.QueryOffset(end, timeout=10).offset == 2, q.broker.name
        assigned = stub.QueryAssignment(
            sv.QueryAssignmentRequest(
                topic=v2.Resource(name=topic), group=v2.Resource(name="G"), endpoints=endpoints
            ),
            timeout=10,
        )
        assert [a.message_queue.broker.name for a in assigned.assignments] == list(BOTH)
        group = f"GSpread-{client}"
        # 20 s invisible: the Node.js client alternates brokers, long polling the
        # one without redeliveries, and on a loaded machine a short invisible time
        # ran out while the first receives were still gathering (the held-back
        # two are set to 1 s by the scripts themselves).
        spec = {"topic": topic, "group": group, "expect": 8, "invisible_s": 20}
        out = run_client(SIMPLE_CONSUMERS[client], cluster.v2, spec)
        assert sorted(m["body"] for m in out["first"]) == [f"s{n}" for n in range(8)]
        assert sorted(m["id"] for m in out["again"]) == sorted(m["id"] for m in out["first"][:2])
        assert _receive(stub, topic, group).status.code == v2.MESSAGE_NOT_FOUND


@pytest.mark.parametrize("client", sorted(PUSH_CONSUMERS))
def test_push_consumer_retries_then_dead_letters(cluster: V2Cluster, client: str) -> None:
    topic, group = cluster.topic(f"V2Push-{client}"), f"GPush-{client}"
    specs = [{"body": f"ok-{i}", "tag": "A"} for i in range(5)]
    specs += [{"body": f"fail-{i}", "tag": "B", "properties": {"p": "x"}} for i in range(2)]
    sent = run_client(PRODUCERS["python"], cluster.v2, {"topic": topic, "messages": specs})
    ids = {s["body"]: r["message_id"] for s, r in zip(specs, sent, strict=True)}
    calls = run_client(
        PUSH_CONSUMERS[client], cluster.v2,
        {"topic": topic, "group": group, "succeed": 5, "fail_prefix": "fail-", "settle_s": 6},
    )  # fmt: skip
    by_body: dict[str, list[int]] = {}
    for c in calls:
        assert c["id"] == ids[c["body"]]
        by_body.setdefault(c["body"], []).append(c["attempt"])
    for i in range(5):
        assert by_body[f"ok-{i}"] == [1]
    for i in range(2):
        assert by_body[f"fail-{i}"] == list(range(1, MAX_ATTEMPTS + 1))
    dead = asyncio.run(read_all(cluster.pull, f"%DLQ%{group}", "GRead", 2))
    assert sorted(r.body for r in dead) == [b"fail-0", b"fail-1"]
    for r in dead:
        assert r.uniq_key == ids[r.body.decode()]
        assert (r.tags, r.properties["p"]) == ("B", "x")
        assert r.properties["DLQ_ORIGIN_TOPIC"] == topic


@pytest.mark.parametrize("front", ["pull-service", "store-node"])
@pytest.mark.parametrize("brokers", [("broker-a",), BOTH], ids=["one-broker", "two-brokers"])
def test_fifo_push_consumer_keeps_each_message_groups_order(
    cluster: V2Cluster, brokers: tuple[str, ...], front: str
) -> None:
    # Through a store-node's front: the producer and the consumer follow the
    # route to each broker's own front; a message group still hashes to one
    # queue of the topic wherever it is sent.
    topic = cluster.topic(f"V2Fifo-{len(brokers)}-{front}", brokers)
    endpoint = cluster.endpoint(front)
    specs = [{"body": f"{g}-{i}", "group": g} for i in range(5) for g in ("ga", "gb")]
    run_client(PRODUCERS["python"], endpoint, {"topic": topic, "messages": specs})
    calls = run_client(
        PUSH_CONSUMERS["python"], endpoint,
        {"topic": topic, "group": FIFO_GROUP, "succeed": 10, "fail_prefix": "", "settle_s": 1},
    )  # fmt: skip
    for g in ("ga", "gb"):
        assert [c["body"] for c in calls if c["group"] == g] == [f"{g}-{i}" for i in range(5)]
    assert all(c["attempt"] == 1 for c in calls)


# -- raw v2 calls -------------------------------------------------------------------------


def _receive(
    stub: sv_grpc.MessagingServiceStub, topic: str, group: str, **kw: object
) -> sv.ReceiveMessageResponse:
    """The Status of a one-shot ReceiveMessage (invisible 10 s, no long polling)."""
    fields: dict[str, object] = {
        "group": v2.Resource(name=group),
        "message_queue": v2.MessageQueue(topic=v2.Resource(name=topic)),
        "batch_size": 8,
        "invisible_duration": {"seconds": 10},
    }
    fields.update(kw)
    responses = list(stub.ReceiveMessage(sv.ReceiveMessageRequest(**fields), timeout=10))  # type: ignore[arg-type]
    statuses = [r for r in responses if r.HasField("status")]
    assert len(statuses) == 1
    return statuses[0]


@pytest.mark.parametrize("front", FRONTS)
def test_raw_consumption_calls_and_bad_input(cluster: V2Cluster, front: str) -> None:
    # Through a store-node's own front the pops, acks, changes and the dead
    # letter of its queues are in-process calls; through the other's, gRPC.
    topic = cluster.topic(f"V2Raw-{front}")
    raw = f"GRaw-{front}"
    asyncio.run(_sdk_send(cluster.pull, [Message(topic, b"raw", tags="R")]))
    channel, stub = cluster.stub(cluster.endpoint(front))
    with channel:
        group = v2.Resource(name=raw)
        request = sv.ReceiveMessageRequest(
            group=group, message_queue=v2.MessageQueue(topic=v2.Resource(name=topic)),
            batch_size=4, invisible_duration={"seconds": 30},
        )  # fmt: skip
        responses = list(stub.ReceiveMessage(request, timeout=10))
        assert responses[0].status.code == v2.OK
        (message,) = [r.message for r in responses if r.HasField("message")]
        assert responses[-1].HasField("delivery_timestamp")
        system = message.system_properties
        assert (message.body, system.tag, system.delivery_attempt) == (b"raw", "R", 1)
        assert system.body_digest.type == v2.MD5
        assert system.queue_offset == 0 and system.receipt_handle
        handle = system.receipt_handle
        assert _receive(stub, "Nope", raw).status.code == v2.TOPIC_NOT_FOUND
        assert _receive(stub, topic, "").status.code == v2.ILLEGAL_CONSUMER_GROUP
        unset = _receive(stub, topic, raw, invisible_duration=None)
        assert unset.status.code == v2.ILLEGAL_INVISIBLE_TIME
        change = sv.ChangeInvisibleDurationRequest(
            group=group, topic=v2.Resource(name=topic), receipt_handle=handle,
            invisible_duration={"seconds": -1},
        )  # fmt: skip
        answer = stub.ChangeInvisibleDuration(change, timeout=10)
        assert answer.status.code == v2.ILLEGAL_INVISIBLE_TIME
        for bad in ("", "not-a-handle", handle[:-4] + "AAAA"):
            entry = sv.AckMessageEntry(message_id="x", receipt_handle=bad)
            acked = stub.AckMessage(
                sv.AckMessageRequest(group=group, topic=v2.Resource(name=topic), entries=[entry]),
                timeout=10,
            )
            assert acked.status.code == v2.INVALID_RECEIPT_HANDLE, bad
            change.receipt_handle, change.invisible_duration.seconds = bad, 1
            assert stub.ChangeInvisibleDuration(change, timeout=10).status.code == (
                v2.INVALID_RECEIPT_HANDLE
            )
        other_topic = sv.AckMessageRequest(
            group=group, topic=v2.Resource(name="V2Other"),
            entries=[sv.AckMessageEntry(message_id="x", receipt_handle=handle)],
        )  # fmt: skip
        assert stub.AckMessage(other_topic, timeout=10).status.code == v2.INVALID_RECEIPT_HANDLE
        forward = sv.ForwardMessageToDeadLetterQueueRequest(
            group=group, topic=v2.Resource(name=topic), receipt_handle=handle,
            message_id=message.system_properties.message_id, delivery_attempt=1,
            max_delivery_attempts=3,
        )  # fmt: skip
        assert stub.ForwardMessageToDeadLetterQueue(forward, timeout=10).status.code == v2.OK
        # Forwarded means acked: the handle is spent, nothing comes again.
        ok = sv.AckMessageRequest(
            group=group, topic=v2.Resource(name=topic),
            entries=[sv.AckMessageEntry(message_id="x", receipt_handle=handle)],
        )  # fmt: skip
        assert stub.AckMessage(ok, timeout=10).status.code == v2.INVALID_RECEIPT_HANDLE
        assert _receive(stub, topic, raw).status.code == v2.MESSAGE_NOT_FOUND
        (dead,) = asyncio.run(read_all(cluster.pull, f"%DLQ%{raw}", "GRead", 1))
        assert dead.body == b"raw"
        host, _, port = cluster.endpoint(front).rpartition(":")
        endpoints = v2.Endpoints(addresses=[v2.Address(host=host, port=int(port))])
        assigned = stub.QueryAssignment(
            sv.QueryAssignmentRequest(
                topic=v2.Resource(name=topic), group=group, endpoints=endpoints
            ),
            timeout=10,
        )
        assert assigned.status.code == v2.OK
        assert [
            (a.message_queue.id, a.message_queue.broker.name) for a in assigned.assignments
        ] == [(-1, "broker-a")]
        # A store-node's front assigns the broker at its own front (where its
        # pops are in-process); the pull-service's at the endpoint called.
        own = cluster.v2 if front == "pull-service" else cluster.fronts["broker-a"]
        (at,) = assigned.assignments[0].message_queue.broker.endpoints.addresses
        assert f"{at.host}:{at.port}" == own


def test_receive_filters_by_tag_and_sql92(cluster: V2Cluster) -> None:
    topic = cluster.topic("V2Filter")
    sent = [
        Message(topic, f"f{i}".encode(), tags="A" if i % 2 else "B", properties={"n": str(i)})
        for i in range(6)
    ]
    asyncio.run(_sdk_send(cluster.pull, sent))
    channel, stub = cluster.stub()
    with channel:

        def bodies(group: str, kind: int, expression: str) -> list[bytes]:
            request = sv.ReceiveMessageRequest(
                group=v2.Resource(name=group),
                message_queue=v2.MessageQueue(topic=v2.Resource(name=topic)),
                filter_expression=v2.FilterExpression(type=kind, expression=expression),  # type: ignore[arg-type]
                batch_size=32, invisible_duration={"seconds": 30},
            )  # fmt: skip
            responses = list(stub.ReceiveMessage(request, timeout=10))
            return sorted(r.message.body for r in responses if r.HasField("message"))

        assert bodies("GTag", v2.TAG, "A") == [b"f1", b"f3", b"f5"]
        assert bodies("GSql", v2.SQL, "n > 3") == [b"f4", b"f5"]
        bad = sv.ReceiveMessageRequest(
            group=v2.Resource(name="GBad"),
            message_queue=v2.MessageQueue(topic=v2.Resource(name=topic)),
            filter_expression=v2.FilterExpression(type=v2.SQL, expression="n >>> ("),
            batch_size=1, invisible_duration={"seconds": 30},
        )  # fmt: skip
        (answer,) = list(stub.ReceiveMessage(bad, timeout=10))
        assert answer.status.code == v2.ILLEGAL_FILTER_EXPRESSION


def test_a_long_poll_outlasts_the_store_node_budget_and_wakes_on_arrival(
    cluster: V2Cluster,
) -> None:
    topic = cluster.topic("V2LongPoll")
    request = sv.ReceiveMessageRequest(
        group=v2.Resource(name="GLong"),
        message_queue=v2.MessageQueue(topic=v2.Resource(name=topic)),
        batch_size=4, invisible_duration={"seconds": 30}, long_polling_timeout={"seconds": 15},
    )  # fmt: skip

    async def scenario() -> list[sv.ReceiveMessageResponse]:
        async with grpc.aio.insecure_channel(cluster.v2) as channel:
            stub = sv_grpc.MessagingServiceStub(channel)

            async def receive() -> list[sv.ReceiveMessageResponse]:
                return [r async for r in stub.ReceiveMessage(request, timeout=20)]

            held = asyncio.ensure_future(receive())
            await asyncio.sleep(11)  # past the front's 10 s budget of a store-node call
            assert not held.done()
            await _sdk_send(cluster.pull, [Message(topic, b"late")])
            return await asyncio.wait_for(held, 5)

    responses = asyncio.run(scenario())
    assert responses[0].status.code == v2.OK
    assert [r.message.body for r in responses if r.HasField("message")] == [b"late"]
