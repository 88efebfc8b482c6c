"""The RocketMQ 5 front inside each store-node (RocketMQ 5's local proxy mode)
against ``basalt cluster up`` with two store-nodes, each serving a front of its
own beside the pull-service's: routes name each broker's own front, a send
to a store-node's front is stored there when the topic has queues there and
routed over gRPC when it has none, and the official producers that dial one
store-node reach the queues of both. The pull-service's front answers as
before. (Consumption, FIFO, delay and transactions through a store-node's
front: test_consume.py and test_delay_transactions.py, ``front`` parameters.)"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from basalt.rocketmq.v2 import definition_pb2 as v2
from basalt.rocketmq.v2 import service_pb2 as sv
from basalt.rocketmq.v2 import service_pb2_grpc as sv_grpc
from tests.support.interop import PRODUCERS, ensure_node_modules, run_client
from tests.support.processes import run_basalt_sync
from tests.support.v2_front import V2Cluster, read_all, v2_cluster

BOTH = ("broker-a", "broker-b")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[V2Cluster]:
    ensure_node_modules()
    with v2_cluster(tmp_path_factory.mktemp("v2l") / "c", "--store-nodes", "2") as c:
        assert sorted(c.fronts) == list(BOTH), c.fronts
        yield c


def _endpoints(address: str) -> v2.Endpoints:
    host, _, port = address.rpartition(":")
    return v2.Endpoints(scheme=v2.IPv4, addresses=[v2.Address(host=host, port=int(port))])


def _at(endpoints: v2.Endpoints) -> str:
    (address,) = endpoints.addresses
    return f"{address.host}:{address.port}"


def _route(stub: sv_grpc.MessagingServiceStub, topic: str, called: str) -> list[v2.MessageQueue]:
    answer = stub.QueryRoute(
        sv.QueryRouteRequest(topic=v2.Resource(name=topic), endpoints=_endpoints(called)),
        timeout=10,
    )
    assert answer.status.code == v2.OK, answer.status
    return list(answer.message_queues)


def _send(stub: sv_grpc.MessagingServiceStub, topic: str, n: int, tag: str) -> None:
    """``n`` messages with no queue id (as the official Python client sends)."""
    for i in range(n):
        system = v2.SystemProperties(message_id=f"01{tag}{i}", tag=tag)
        message = v2.Message(topic=v2.Resource(name=topic), system_properties=system, body=b"x")
        sent = stub.SendMessage(sv.SendMessageRequest(messages=[message]), timeout=10)
        assert sent.status.code == v2.OK, sent.status


def _ends(stub: sv_grpc.MessagingServiceStub, topic: str) -> dict[tuple[str, int], int]:
    """Each queue's max offset, by (broker, queue id), as the route lists them."""
    out = {}
    for q in _route(stub, topic, "127.0.0.1:1"):
        request = sv.QueryOffsetRequest(message_queue=q, query_offset_policy=v2.END)
        answer = stub.QueryOffset(request, timeout=10)
        assert answer.status.code == v2.OK, answer.status
        out[(q.broker.name, q.id)] = answer.offset
    return out


def test_routes_and_assignments_name_each_brokers_own_front(cluster: V2Cluster) -> None:
    topic = cluster.topic("V2LocalRoute", BOTH)
    at_a = cluster.fronts["broker-a"]
    channel, stub = cluster.stub(at_a)
    with channel:
        # RocketMQ's LocalTopicRouteService: each broker at its own proxy.
        queues = _route(stub, topic, at_a)
        assert [(q.broker.name, q.id, _at(q.broker.endpoints)) for q in queues] == [
            (b, i, cluster.fronts[b]) for b in BOTH for i in range(2)
        ]
        assigned = stub.QueryAssignment(
            sv.QueryAssignmentRequest(
                topic=v2.Resource(name=topic), group=v2.Resource(name="G"),
                endpoints=_endpoints(at_a),
            ),
            timeout=10,
        )  # fmt: skip
        assert [
            (a.message_queue.broker.name, _at(a.message_queue.broker.endpoints))
            for a in assigned.assignments
        ] == [(b, cluster.fronts[b]) for b in BOTH]
    channel, stub = cluster.stub()
    with channel:
        # The pull-service's front is unchanged: every queue at the access point.
        queues = _route(stub, topic, cluster.v2)
        assert {_at(q.broker.endpoints) for q in queues} == {cluster.v2}


def test_a_store_node_front_stores_its_own_queues_sends_and_routes_the_others(
    cluster: V2Cluster,
) -> None:
    spread = cluster.topic("V2LocalSpread", BOTH)
    only_b = cluster.topic("V2LocalOnlyB", ("broker-b",))
    channel, stub = cluster.stub(cluster.fronts["broker-a"])
    with channel:
        # No hop: a send without a message group stays on broker-a, round robin
        # over its queues (the client chose broker-a by dialing its front).
        _send(stub, spread, 6, "SPREADA")
        assert _ends(stub, spread) == {
            ("broker-a", 0): 3, ("broker-a", 1): 3, ("broker-b", 0): 0, ("broker-b", 1): 0,
        }  # fmt: skip
        # A topic with no queue here is routed to the store-node that has it.
        _send(stub, only_b, 4, "ONLYB")
        assert _ends(stub, only_b) == {("broker-b", 0): 2, ("broker-b", 1): 2}
    channel, stub = cluster.stub()
    with channel:
        # The pull-service's front still spreads over every broker's queues.
        _send(stub, spread, 4, "SPREADPS")
        assert _ends(stub, spread) == {
            ("broker-a", 0): 4, ("broker-a", 1): 4, ("broker-b", 0): 1, ("broker-b", 1): 1,
        }  # fmt: skip


@pytest.mark.parametrize("client", sorted(PRODUCERS))
def test_an_official_producer_dialing_one_store_node_reaches_both(
    cluster: V2Cluster, client: str
) -> None:
    topic = cluster.topic(f"V2LocalProduce-{client}", BOTH)
    normal = [{"body": f"{client}-{i}", "tag": "T", "keys": [f"k{i}"]} for i in range(12)]
    fifo = [{"body": f"{client}-fifo-{i}", "group": f"{client}-g"} for i in range(4)]
    sent = run_client(
        PRODUCERS[client], cluster.fronts["broker-a"], {"topic": topic, "messages": normal + fifo}
    )
    assert all("message_id" in r for r in sent), sent
    records = asyncio.run(read_all(cluster.pull, topic, f"G-{topic}", len(sent)))
    by_id = {r.properties["UNIQ_KEY"]: r for r in records}
    assert len(records) == len(by_id) == len(sent)
    for spec, receipt in zip(normal + fifo, sent, strict=True):
        r = by_id[receipt["message_id"]]
        assert r.body == spec["body"].encode()
    # The client followed the route to broker-b's front for broker-b's queues.
    brokers = {r.store_host for r in records}
    assert len(brokers) == 2, brokers
    fifo_records = [by_id[s["message_id"]] for s in sent[len(normal) :]]
    assert len({(r.store_host, r.queue_id) for r in fifo_records}) == 1
    assert [r.body for r in sorted(fifo_records, key=lambda r: r.queue_offset)] == [
        f["body"].encode() for f in fifo
    ]


def test_a_store_node_front_without_etcd_is_refused_at_start(tmp_path: Path) -> None:
    # The front reads the cluster's topics, brokers and fronts from etcd.
    done = run_basalt_sync(
        "store-node", "--name", "broker-x", "--data-dir", str(tmp_path / "x"),
        "--listen", "127.0.0.1:0", "--rocketmq-v2-listen", "127.0.0.1:0",
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert "--rocketmq-v2-listen needs --etcd" in done.stderr
    assert not (tmp_path / "x").exists()  # refused before the store opened
