"""Which queues of a route a producer sends to (RocketMQ's topicRouteData2TopicPublishInfo)."""

from __future__ import annotations

from basalt.client.producer import writable_queues
from basalt.v1 import common_pb2 as pb


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
