"""Which queues of a route clients use: a producer's writable ones (RocketMQ's
topicRouteData2TopicPublishInfo), a consumer's readable ones."""

from __future__ import annotations

from pathlib import Path

from basalt.client import LitePullConsumer, Producer
from basalt.client.producer import writable_queues
from basalt.common.message import Message
from basalt.services.meta import MetaConfig
from basalt.services.meta.model import Perm
from basalt.v1 import common_pb2 as pb
from tests.support.aio import async_test
from tests.support.consumers import lite_pull_config
from tests.support.nodes import TOPIC, cluster


def route(topic_perm: int, perms: dict[str, int]) -> pb.TopicRoute:
    return pb.TopicRoute(
        topic="T",
        queue_datas=[
            pb.QueueData(broker_name=name, read_queue_nums=2, write_queue_nums=2, perm=topic_perm)
            for name in ("broker-a", "broker-b", "broker-c")
        ],
        # broker-c is not registered (down): no BrokerData.
        broker_datas=[
            pb.BrokerData(broker_name=name, address=f"{name}:1", perm=perm)
            for name, perm in perms.items()
        ],
    )


def test_only_writable_registered_brokers_take_sends() -> None:
    got = writable_queues(route(6, {"broker-a": 6, "broker-b": 4}))
    # broker-b is read only (its brokerPermission), broker-c is down.
    assert [(q.broker_name, q.queue_id) for q in got] == [("broker-a", 0), ("broker-a", 1)]
    assert writable_queues(route(4, {"broker-a": 6, "broker-b": 6})) == []


@async_test
async def test_clients_leave_out_brokers_their_permission_closes(
    tmp_path: Path, meta_config: MetaConfig
) -> None:
    """A read-only broker takes no sends, a write-only one is not read (its
    ``brokerPermission``, as its registration says)."""
    async with cluster(tmp_path, meta_config) as h:
        address = h.services[0].address
        await h.register_broker("broker-a", h.nodes["broker-a"].address, perm=Perm.WRITE)
        await h.register_broker("broker-b", h.nodes["broker-b"].address, perm=Perm.READ)
        await h.seen(lambda s: s.servicer.view.brokers.get("broker-b").perm == Perm.READ)
        async with Producer(address, group="P") as producer:
            sent = [await producer.send(Message(topic=TOPIC, body=b"%d" % i)) for i in range(8)]
        assert {r.broker_name for r in sent} == {"broker-a"}
        async with LitePullConsumer(address, config=lite_pull_config()) as consumer:
            queues = await consumer.queues_of(TOPIC)
        assert {q.broker_name for q in queues} == {"broker-b"}
