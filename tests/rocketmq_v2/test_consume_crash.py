"""kill -9 of the store-node holding in-flight v2 deliveries, through the v2 front
(a pull-service process) on a real etcd: after the restart every un-acked
message is delivered again (attempt 2), no acked one is, a handle from before
the crash still acks, nothing is lost (docs/pop.md, crash semantics)."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from basalt.rocketmq.v2 import definition_pb2 as v2
from basalt.rocketmq.v2 import service_pb2 as sv
from basalt.rocketmq.v2 import service_pb2_grpc as sv_grpc
from basalt.services.cluster.etcd import EtcdProcess, free_port
from basalt.services.meta import MetaClient, MetaConfig, TopicConfig
from tests.support.aio import run
from tests.support.etcd import unique_cluster
from tests.support.polling import eventually_sync
from tests.support.processes import ServiceProcess, store_node_process

pytestmark = pytest.mark.slow

TOPIC, GROUP = "V2Crash", "GCrash"
INVISIBLE_S = 2


@pytest.fixture
def front(tmp_path: Path, etcd: EtcdProcess) -> Iterator[tuple[ServiceProcess, str]]:
    """broker-a and a pull-service serving the v2 front; yields the store-node
    and the front's address."""
    cluster = unique_cluster()
    common = ("--etcd", etcd.endpoint, "--cluster", cluster, "--lease-ttl-s", "2")

    async def create() -> None:
        async with MetaClient(MetaConfig(endpoints=(etcd.endpoint,), cluster=cluster)) as meta:
            await meta.create_topic(
                TopicConfig(topic_name=TOPIC, read_queue_nums=1, write_queue_nums=1,
                            brokers=("broker-a",))
            )  # fmt: skip

    run(create)
    node = store_node_process(tmp_path, "broker-a", *common)
    v2_address = f"127.0.0.1:{free_port()}"
    pull = ServiceProcess(
        tmp_path / "ps.log", "basalt.services.pull_service.main", "--id", "ps-1",
        "--rocketmq-v2-listen", v2_address, *common,
    )  # fmt: skip
    try:
        node.wait_serving()
        pull.wait_serving()
        yield node, v2_address
    finally:
        for p in (pull, node):
            if p.proc.poll() is None:
                p.stop(signal.SIGKILL)


def _send(stub: sv_grpc.MessagingServiceStub, count: int) -> None:
    messages = [
        v2.Message(
            topic=v2.Resource(name=TOPIC),
            system_properties=v2.SystemProperties(message_id=f"01CRASH{i:04d}"),
            body=b"%d" % i,
        )
        for i in range(count)
    ]
    sent = stub.SendMessage(sv.SendMessageRequest(messages=messages), timeout=10)
    assert sent.status.code == v2.OK, sent.status


def _receive(stub: sv_grpc.MessagingServiceStub, poll_s: int = 0) -> list[v2.Message]:
    request = sv.ReceiveMessageRequest(
        group=v2.Resource(name=GROUP), message_queue=v2.MessageQueue(topic=v2.Resource(name=TOPIC)),
        batch_size=32, invisible_duration={"seconds": INVISIBLE_S},
        long_polling_timeout={"seconds": poll_s},
    )  # fmt: skip
    responses = list(stub.ReceiveMessage(request, timeout=poll_s + 10))
    (status,) = [r.status for r in responses if r.HasField("status")]
    assert status.code in (v2.OK, v2.MESSAGE_NOT_FOUND), status
    return [r.message for r in responses if r.HasField("message")]


def _ack(stub: sv_grpc.MessagingServiceStub, messages: list[v2.Message]) -> int:
    entries = [
        sv.AckMessageEntry(
            message_id=m.system_properties.message_id,
            receipt_handle=m.system_properties.receipt_handle,
        )
        for m in messages
    ]
    request = sv.AckMessageRequest(
        group=v2.Resource(name=GROUP), topic=v2.Resource(name=TOPIC), entries=entries
    )
    code: int = stub.AckMessage(request, timeout=10).status.code
    return code


def test_kill_9_of_the_store_node_redelivers_every_unacked_message(
    front: tuple[ServiceProcess, str],
) -> None:
    node, address = front
    with grpc.insecure_channel(address) as channel:
        stub = sv_grpc.MessagingServiceStub(channel)
        eventually_sync(lambda: _topic_routed(stub), timeout_s=30, interval_s=0.2)
        _send(stub, 20)
        first = _receive(stub)
        assert sorted(m.system_properties.queue_offset for m in first) == list(range(20))
        first.sort(key=lambda m: m.system_properties.queue_offset)
        assert _ack(stub, first[:10]) == v2.OK
        node.stop(signal.SIGKILL)
        node.start()
        node.wait_serving()
        # A handle from before the crash still acks its delivery (once the front
        # reaches the restarted node and it knows the topic again).
        eventually_sync(lambda: _ack(stub, first[10:11]) == v2.OK, timeout_s=30, interval_s=0.3)
        seen: list[v2.Message] = []
        while len(seen) < 9:
            got = _receive(stub, poll_s=INVISIBLE_S * 2)
            assert got, "nothing delivered within twice the invisible time"
            seen += got
        assert sorted(m.system_properties.queue_offset for m in seen) == list(range(11, 20))
        assert {m.system_properties.delivery_attempt for m in seen} == {2}
        assert _ack(stub, seen) == v2.OK
        assert _receive(stub, poll_s=INVISIBLE_S + 1) == []


def _topic_routed(stub: sv_grpc.MessagingServiceStub) -> bool:
    route = stub.QueryRoute(sv.QueryRouteRequest(topic=v2.Resource(name=TOPIC)), timeout=10)
    return route.status.code == v2.OK and len(route.message_queues) == 1
