"""The pull path as real processes: 2 store-nodes and 1 pull-service on a real etcd.

Producers send through the raw generated StoreNode stubs straight to both
store-nodes; a consumer pulls everything back through the pull-service
process, with and without filters and with long polling, and keeps a
session there; SIGTERM then stops everything cleanly.
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import grpc
import pytest

from basalt.services.cluster.etcd import EtcdProcess
from basalt.v1 import common_pb2 as pb
from basalt.v1 import pull_service_pb2 as ps
from basalt.v1 import pull_service_pb2_grpc as ps_grpc
from basalt.v1 import store_node_pb2 as sn
from basalt.v1 import store_node_pb2_grpc as sn_grpc
from tests.support.etcd import unique_cluster
from tests.support.polling import eventually
from tests.support.processes import (
    BROKERS,
    QUEUES,
    TOPIC,
    ServiceProcess,
    consume,
    create_topic,
    registered,
    start_processes,
)
from tests.support.rpc import bodies, pull_request
from tests.support.sessions import Consumer

pytestmark = pytest.mark.slow


async def produce(addresses: dict[str, str]) -> dict[tuple[str, int], list[tuple[bytes, str, int]]]:
    """Send through the raw stubs: a batch and single messages to every queue of both
    store-nodes. Returns (broker, queue) -> [(body, tag, n)] in send order."""
    sent: dict[tuple[str, int], list[tuple[bytes, str, int]]] = {}
    for broker, address in addresses.items():
        async with grpc.aio.insecure_channel(address) as channel:
            stub = sn_grpc.StoreNodeStub(channel)
            for q in range(QUEUES):
                batch = []
                for n in range(60):
                    tag = ("TagA", "TagB", "TagC")[n % 3]
                    body = f"{broker}/{q}/{n}".encode()
                    sent.setdefault((broker, q), []).append((body, tag, n))
                    message = pb.Message(body=body, tags=tag, properties={"n": str(n)})
                    if n < 50:
                        batch.append(message)
                        continue
                    message.topic = TOPIC
                    if batch:
                        r = await stub.SendBatch(
                            sn.SendBatchRequest(
                                topic=TOPIC, queue_id=q, messages=pb.MessageList(messages=batch)
                            )
                        )
                        assert list(r.result.queue_offsets) == list(range(50))
                        batch = []
                    single = await stub.SendMessage(
                        sn.SendMessageRequest(message=message, queue_id=q)
                    )
                    assert single.result.status == pb.SEND_STATUS_SEND_OK
    return sent


def test_produce_to_two_store_node_processes_and_consume_through_the_pull_service_process(
    tmp_path: Path, etcd: EtcdProcess, processes: list[ServiceProcess]
) -> None:
    cluster = unique_cluster()
    asyncio.run(create_topic(etcd, cluster))
    nodes, pull = start_processes(tmp_path, etcd, cluster, 2, processes)

    async def scenario() -> None:
        async with grpc.aio.insecure_channel(pull.address) as channel:
            stub = ps_grpc.PullServiceStub(channel)
            route = pb.TopicRoute()

            async def routed() -> bool:  # the store-nodes register in the background
                nonlocal route
                route = (await stub.QueryRoute(ps.QueryRouteRequest(topic=TOPIC))).route
                return len(route.broker_datas) == 2

            await eventually(routed, interval_s=0.05, what="both store-nodes in the route")
            assert {b.broker_name: b.address for b in route.broker_datas} == {
                n: p.address for n, p in nodes.items()
            }

            sent = await produce({n: p.address for n, p in nodes.items()})
            everything = await consume(stub, "GAll")
            assert everything == {k: [b for b, _, _ in v] for k, v in sent.items()}
            tags = pb.Subscription(type=pb.EXPRESSION_TYPE_TAG, expression="TagB")
            assert await consume(stub, "GTag", tags) == {
                k: [b for b, t, _ in v if t == "TagB"] for k, v in sent.items()
            }
            sql = pb.Subscription(
                type=pb.EXPRESSION_TYPE_SQL92, expression="n BETWEEN 45 AND 52 AND TAGS <> 'TagA'"
            )
            assert await consume(stub, "GSql", sql) == {
                k: [b for b, t, n in v if 45 <= n <= 52 and t != "TagA"] for k, v in sent.items()
            }

            # Long polling through the pull-service: held, then woken by a send.
            held = asyncio.ensure_future(
                stub.Pull(
                    pull_request("broker-b", 1, 60, topic=TOPIC, suspend_timeout_ms=20_000),
                    timeout=30,
                )
            )
            await asyncio.sleep(0.2)
            assert not held.done()
            async with grpc.aio.insecure_channel(nodes["broker-b"].address) as node_channel:
                await sn_grpc.StoreNodeStub(node_channel).SendMessage(
                    sn.SendMessageRequest(message=pb.Message(topic=TOPIC, body=b"late"), queue_id=1)
                )
            woken = await asyncio.wait_for(held, 10)  # well before the 20 s suspend timeout
            assert woken.status == pb.PULL_STATUS_FOUND and bodies(woken) == [b"late"]
            empty = await stub.Pull(
                pull_request("broker-a", 0, 60, topic=TOPIC, suspend_timeout_ms=300)
            )
            assert (empty.status, empty.records.count) == (pb.PULL_STATUS_NO_NEW_MSG, 0)

            # A consumer session on the process, registered in etcd.
            consumer = Consumer(stub, "10.1.1.1@7")
            await consumer.open()
            assert await registered(etcd, cluster) == ({*BROKERS}, {"ps-1"}, {"10.1.1.1@7"})
            # SIGTERM: the session ends UNAVAILABLE, every registration goes.
            pull.proc.send_signal(signal.SIGTERM)
            error = await asyncio.wait_for(consumer.ended, 10)
            assert error is not None and error.code() == grpc.StatusCode.UNAVAILABLE
            await consumer.cancel()

    asyncio.run(scenario())
    assert pull.stop() == 0
    assert asyncio.run(registered(etcd, cluster)) == ({*BROKERS}, set(), set())
    for p in nodes.values():
        assert p.stop() == 0
    for p in (*nodes.values(), pull):  # nothing went wrong on the way
        log = p.log.read_text()
        assert "Traceback" not in log and " ERROR " not in log, log
