"""The v2 front against ``basalt cluster up``: the official Python and Node.js
Producers (subprocesses: the Python client registers apache.rocketmq.v2 in
protobuf's pool, as basalt.rocketmq.v2 does here) and raw v2 calls."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from basalt.rocketmq.v2 import definition_pb2 as v2
from basalt.rocketmq.v2 import service_pb2 as sv
from basalt.rocketmq.v2 import service_pb2_grpc as sv_grpc
from basalt.services.rocketmq_v2.conversions import PROPERTY_SHARDING_KEY
from tests.support.interop import PRODUCERS, ensure_node_modules, run_client
from tests.support.processes import run_basalt_sync
from tests.support.v2_front import V2Cluster, read_all, v2_cluster

TOPIC, BAD_TOPIC = "V2Topic", "V2Bad"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[V2Cluster]:
    ensure_node_modules()
    with v2_cluster(tmp_path_factory.mktemp("v2") / "c", "--store-nodes", "1") as c:
        for topic in (TOPIC, BAD_TOPIC):
            c.topic(topic, queues=4)
        yield c


@pytest.mark.parametrize("client", sorted(PRODUCERS))
def test_official_producer_messages_read_back_exactly(cluster: V2Cluster, client: str) -> None:
    normal = [
        {"body": f"{client}-{i}", "tag": "TagA", "keys": [f"k{i}", "other"],
         "properties": {"color": "red", "n": str(i)}}
        for i in range(3)
    ]  # fmt: skip
    fifo = [{"body": f"{client}-fifo-{i}", "group": f"{client}-g", "tag": "F"} for i in range(3)]
    topic = f"{TOPIC}-{client}"
    made = run_basalt_sync(
        "admin", "updateTopic", "-t", topic, "-r", "4", "-w", "4", "-b", "broker-a",
        "--etcd", cluster.etcd,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    sent = run_client(PRODUCERS[client], cluster.v2, {"topic": topic, "messages": normal + fifo})
    assert all("message_id" in r for r in sent), sent
    records = asyncio.run(read_all(cluster.pull, topic, f"G-{client}", len(sent)))
    assert len(records) == len(sent)
    by_id = {r.properties["UNIQ_KEY"]: r for r in records}
    for spec, receipt in zip(normal + fifo, sent, strict=True):
        r = by_id[receipt["message_id"]]
        assert r.body == spec["body"].encode()
        assert r.tags == spec["tag"]
        assert sorted(r.keys) == sorted(spec.get("keys", []))
        for k, v in spec.get("properties", {}).items():
            assert r.properties[k] == v
    fifo_records = [by_id[s["message_id"]] for s in sent[len(normal) :]]
    assert {r.queue_id for r in fifo_records} == {fifo_records[0].queue_id}
    assert [r.body for r in sorted(fifo_records, key=lambda r: r.queue_offset)] == [
        f["body"].encode() for f in fifo
    ]
    assert {r.properties[PROPERTY_SHARDING_KEY] for r in fifo_records} == {f"{client}-g"}


# -- raw v2 calls -------------------------------------------------------------------------


def _send(stub: sv_grpc.MessagingServiceStub, topic: str, **kw: Any) -> sv.SendMessageResponse:
    props = kw.pop("props", {})
    body = kw.pop("body", b"x")
    message = v2.Message(
        topic=v2.Resource(name=topic),
        user_properties=props,
        system_properties=v2.SystemProperties(message_id="01BAD", **kw),
        body=body,
    )
    auth = (
        (
            "authorization",
            "MQv2-HMAC-SHA1 Credential=ak, SignedHeaders=x-mq-date-time, Signature=00",
        ),
    )
    response: sv.SendMessageResponse = stub.SendMessage(
        sv.SendMessageRequest(messages=[message]), metadata=auth, timeout=10
    )
    return response


def test_query_route_and_bad_input(cluster: V2Cluster) -> None:
    channel, stub = cluster.stub()
    with channel:
        host, _, port = cluster.v2.rpartition(":")
        endpoints = v2.Endpoints(addresses=[v2.Address(host=host, port=int(port))])
        route = stub.QueryRoute(
            sv.QueryRouteRequest(topic=v2.Resource(name=TOPIC), endpoints=endpoints), timeout=10
        )
        assert route.status.code == v2.OK
        assert [q.id for q in route.message_queues] == [0, 1, 2, 3]
        assert {q.permission for q in route.message_queues} == {v2.READ_WRITE}
        assert route.message_queues[0].broker.endpoints == endpoints
        missing = stub.QueryRoute(sv.QueryRouteRequest(topic=v2.Resource(name="Nope")), timeout=10)
        assert missing.status.code == v2.TOPIC_NOT_FOUND
        assert _send(stub, "Nope").status.code == v2.TOPIC_NOT_FOUND
        assert _send(stub, BAD_TOPIC, body=b"x" * (4 * 1024 * 1024 + 1)).status.code == (
            v2.MESSAGE_BODY_TOO_LARGE
        )
        assert _send(stub, BAD_TOPIC, props={"UNIQ_KEY": "x"}).status.code == (
            v2.ILLEGAL_MESSAGE_PROPERTY_KEY
        )
        assert _send(stub, BAD_TOPIC, message_type=v2.DELAY).status.code == (
            v2.ILLEGAL_DELIVERY_TIME
        )
        empty = stub.SendMessage(sv.SendMessageRequest(), timeout=10)
        assert empty.status.code == v2.BAD_REQUEST
        ended = stub.EndTransaction(sv.EndTransactionRequest(), timeout=10)
        assert ended.status.code == v2.INVALID_TRANSACTION_ID
        with pytest.raises(grpc.RpcError) as e:
            stub.SyncLiteSubscription(sv.SyncLiteSubscriptionRequest(), timeout=10)
        assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert asyncio.run(read_all(cluster.pull, BAD_TOPIC, "G-bad", 0)) == []


def test_telemetry_answers_settings_and_stays_open(cluster: V2Cluster) -> None:
    channel, stub = cluster.stub()
    with channel:
        settings = v2.Settings(
            client_type=v2.PRODUCER,
            publishing=v2.Publishing(topics=[v2.Resource(name=TOPIC)]),
        )
        sent = [sv.TelemetryCommand(settings=settings)] * 2
        answers = stub.Telemetry(iter(sent), timeout=10)
        got = list(answers)  # the stream ends once the client closes its side
        assert len(got) == 2
        assert got[0].status.code == v2.OK
        assert got[0].settings.publishing.max_body_size == 4 * 1024 * 1024
        assert got[0].settings.backoff_policy.max_attempts == 3
        sub = v2.Settings(
            client_type=v2.SIMPLE_CONSUMER,
            subscription=v2.Subscription(group=v2.Resource(name="G")),
        )
        (answer,) = stub.Telemetry(iter([sv.TelemetryCommand(settings=sub)]), timeout=10)
        assert answer.settings.subscription.receive_batch_size == 32
        assert answer.settings.subscription.long_polling_timeout.seconds == 20
        assert not answer.settings.subscription.fifo


def test_raw_send_to_the_clients_queue_and_offsets(cluster: V2Cluster) -> None:
    channel, stub = cluster.stub()
    with channel:
        message = v2.Message(
            topic=v2.Resource(name=TOPIC),
            system_properties=v2.SystemProperties(message_id="01OFFSETS", queue_id=1, tag="T"),
            body=b"offsets",
        )
        sent = stub.SendMessage(sv.SendMessageRequest(messages=[message]), timeout=10)
        assert sent.status.code == v2.OK, sent.status
        assert [(e.message_id, e.offset) for e in sent.entries] == [("01OFFSETS", 0)]
        queue = v2.MessageQueue(topic=v2.Resource(name=TOPIC), id=1)

        def query(policy: int, **kw: Any) -> sv.QueryOffsetResponse:
            request = sv.QueryOffsetRequest(message_queue=queue, query_offset_policy=policy, **kw)
            answer: sv.QueryOffsetResponse = stub.QueryOffset(request, timeout=10)
            return answer

        assert query(v2.BEGINNING).offset == 0
        assert query(v2.END).offset == 1
        assert query(v2.TIMESTAMP).status.code == v2.BAD_REQUEST
        group = v2.Resource(name="G-offsets")
        got = stub.GetOffset(sv.GetOffsetRequest(group=group, message_queue=queue), timeout=10)
        assert got.status.code == v2.OFFSET_NOT_FOUND
        update = sv.UpdateOffsetRequest(group=group, message_queue=queue, offset=1)
        assert stub.UpdateOffset(update, timeout=10).status.code == v2.OK
        got = stub.GetOffset(sv.GetOffsetRequest(group=group, message_queue=queue), timeout=10)
        assert (got.status.code, got.offset) == (v2.OK, 1)
        outside = v2.MessageQueue(topic=v2.Resource(name=TOPIC), id=99)
        bad = sv.UpdateOffsetRequest(group=group, message_queue=outside, offset=1)
        assert stub.UpdateOffset(bad, timeout=10).status.code == v2.BAD_REQUEST
        unknown = v2.MessageQueue(topic=v2.Resource(name="Nope"), id=0)
        assert (
            stub.QueryOffset(sv.QueryOffsetRequest(message_queue=unknown), timeout=10).status.code
            == v2.TOPIC_NOT_FOUND
        )


def _pull(
    stub: sv_grpc.MessagingServiceStub, topic: str, offset: int, **kw: Any
) -> tuple[v2.Status, list[v2.Message], int | None]:
    """A PullMessage's status, messages and next offset (None when not sent)."""
    request = sv.PullMessageRequest(
        group=v2.Resource(name=kw.pop("group", "G-pull")),
        message_queue=v2.MessageQueue(topic=v2.Resource(name=topic), id=kw.pop("queue", 2)),
        offset=offset,
        batch_size=kw.pop("batch_size", 32),
        **kw,
    )
    status, messages, next_offset = v2.Status(), [], None
    for answer in stub.PullMessage(request, timeout=10):
        kind = answer.WhichOneof("content")
        if kind == "status":
            status = answer.status
        elif kind == "message":
            messages.append(answer.message)
        else:
            next_offset = answer.next_offset
    return status, messages, next_offset


def test_pull_message_reads_a_queue_by_offset(cluster: V2Cluster) -> None:
    topic = "V2Pull"
    made = run_basalt_sync(
        "admin", "updateTopic", "-t", topic, "-r", "4", "-w", "4", "-b", "broker-a",
        "--etcd", cluster.etcd,
    )  # fmt: skip
    assert made.returncode == 0, made.stdout + made.stderr
    channel, stub = cluster.stub()
    with channel:
        for i, tag in enumerate(["A", "B", "A"]):
            message = v2.Message(
                topic=v2.Resource(name=topic),
                system_properties=v2.SystemProperties(message_id=f"01PULL{i}", queue_id=2, tag=tag),
                user_properties={"n": str(i)},
                body=b"pull-%d" % i,
            )
            sent = stub.SendMessage(sv.SendMessageRequest(messages=[message]), timeout=10)
            assert sent.status.code == v2.OK, sent.status
        status, messages, next_offset = _pull(stub, topic, 0)
        assert status.code == v2.OK, status
        assert [m.body for m in messages] == [b"pull-0", b"pull-1", b"pull-2"]
        assert [m.system_properties.queue_offset for m in messages] == [0, 1, 2]
        assert [m.system_properties.message_id for m in messages] == [
            "01PULL0",
            "01PULL1",
            "01PULL2",
        ]
        assert [m.system_properties.tag for m in messages] == ["A", "B", "A"]
        assert [m.user_properties["n"] for m in messages] == ["0", "1", "2"]
        assert next_offset == 3
        # the filter is applied on the store-node; the next offset passes what it skipped
        only_a = v2.FilterExpression(type=v2.TAG, expression="A")
        status, messages, next_offset = _pull(stub, topic, 1, filter_expression=only_a)
        assert (status.code, [m.body for m in messages], next_offset) == (v2.OK, [b"pull-2"], 3)
        status, messages, next_offset = _pull(stub, topic, 0, batch_size=2)
        assert (len(messages), next_offset) == (2, 2)
        # nothing new: held for the long poll, then MESSAGE_NOT_FOUND at the same offset
        wait = sv.PullMessageRequest().long_polling_timeout
        wait.FromMilliseconds(200)
        status, messages, next_offset = _pull(stub, topic, 3, long_polling_timeout=wait)
        assert (status.code, messages, next_offset) == (v2.MESSAGE_NOT_FOUND, [], 3)
        status, messages, next_offset = _pull(stub, topic, 10)
        # past the end: the store's correction, RocketMQ's rule (the min offset
        # while it is 0, else the max)
        assert (status.code, messages, next_offset) == (v2.ILLEGAL_OFFSET, [], 0)
        # bad input: a status, no next offset
        assert _pull(stub, topic, 0, group="")[0].code == v2.ILLEGAL_CONSUMER_GROUP
        assert _pull(stub, "Nope", 0)[0].code == v2.TOPIC_NOT_FOUND
        assert _pull(stub, topic, -1)[0].code == v2.ILLEGAL_OFFSET
        assert _pull(stub, topic, 0, batch_size=0)[0].code == v2.BAD_REQUEST
        assert _pull(stub, topic, 0, queue=99)[0].code == v2.BAD_REQUEST
        assert _pull(stub, topic, 0, group="")[2] is None


def test_unset_queue_id_goes_round_robin_and_concurrent_sends_share_offsets(
    cluster: V2Cluster,
) -> None:
    topic = f"{TOPIC}-spread"
    made = run_basalt_sync(
        "admin", "updateTopic", "-t", topic, "-r", "4", "-w", "4", "-b", "broker-a",
        "--etcd", cluster.etcd,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    channel, stub = cluster.stub()
    with channel:

        def message(n: int, queue_id: int = 0) -> sv.SendMessageRequest:
            system = v2.SystemProperties(message_id=f"01SPREAD{n}", queue_id=queue_id)
            return sv.SendMessageRequest(
                messages=[v2.Message(topic=v2.Resource(name=topic), system_properties=system)]
            )

        # queue_id 0 is proto3's unset (the official Python client never sets
        # it): not all on queue 0, but round robin.
        for n in range(8):
            assert stub.SendMessage(message(n), timeout=10).status.code == v2.OK

        def end(queue_id: int) -> int:
            queue = v2.MessageQueue(topic=v2.Resource(name=topic), id=queue_id)
            request = sv.QueryOffsetRequest(message_queue=queue, query_offset_policy=v2.END)
            answer: sv.QueryOffsetResponse = stub.QueryOffset(request, timeout=10)
            return answer.offset

        assert [end(q) for q in range(4)] == [2, 2, 2, 2]
        # Concurrent sends to one queue may share a SendBatch: each still
        # gets its own offset.
        calls = [
            stub.SendMessage.future(message(100 + n, queue_id=1), timeout=10) for n in range(16)
        ]
        answers = [c.result() for c in calls]
        assert all(a.status.code == v2.OK for a in answers)
        assert sorted(a.entries[0].offset for a in answers) == list(range(2, 18))
        assert end(1) == 18
