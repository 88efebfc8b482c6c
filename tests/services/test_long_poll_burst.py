"""A burst of 2,000 long polls against real processes: every one is held and
answered, none is dropped CANCELLED (gRPC core's random early drop of a
backlog of calls; services/process.py ``grpc_server``).

Both paths are covered: Pull through a pull-service process (which forwards
every pull to its store-node over one channel) and GetMessage straight on a
store-node process.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable
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
    create_topic,
    start_processes,
)
from tests.support.rpc import bodies, pull_request

pytestmark = pytest.mark.slow

#: The burst: more than the 1,000 queued calls past which gRPC core's default
#: starts dropping newcomers.
BURST = 2_000
#: How long each pull is held when nothing arrives.
SUSPEND_MS = 2_000
#: Until the message that wakes one queue's pulls is sent: most of the burst
#: is held by then (a pull that reaches its queue later finds the message).
WAKE_AFTER_S = 1.0
#: The woken queue, on broker-a.
WOKEN_QUEUE = 0

Answer = tuple[str, float, list[bytes]]


async def burst(
    pull: Callable[[int], Awaitable[list[bytes]]], wake: Callable[[], Awaitable[None]]
) -> list[Answer]:
    """Issue ``pull(i)`` for i in range(BURST) at once, ``wake()`` after
    WAKE_AFTER_S; per pull: its outcome ("ok" or the gRPC status), how long
    it took, and the bodies it returned."""

    async def one(i: int) -> Answer:
        started = time.monotonic()
        try:
            got = await pull(i)
        except grpc.aio.AioRpcError as e:
            return f"{e.code().name}: {e.details()}", time.monotonic() - started, []
        return "ok", time.monotonic() - started, got

    calls = asyncio.gather(*(one(i) for i in range(BURST)))
    await asyncio.sleep(WAKE_AFTER_S)
    await wake()
    return await calls


def check(answers: list[Answer], woken: Callable[[int], bool]) -> None:
    """Every pull answered: a woken one with the message, the others empty
    once held their whole suspend time."""
    assert Counter(outcome for outcome, _, _ in answers) == {"ok": BURST}
    for i, (_, took_s, got) in enumerate(answers):
        if woken(i):
            assert got == [b"wake"], i
        else:
            assert got == [], i
            assert took_s >= SUSPEND_MS / 1000, (i, took_s)


def test_a_burst_of_long_polls_is_held_and_answered_on_both_paths(
    tmp_path: Path, etcd: EtcdProcess, processes: list[ServiceProcess]
) -> None:
    cluster = unique_cluster()
    asyncio.run(create_topic(etcd, cluster))
    nodes, pull_service = start_processes(tmp_path, etcd, cluster, 2, processes)
    queues = [(broker, q) for broker in BROKERS for q in range(QUEUES)]

    async def scenario() -> None:
        async with (
            grpc.aio.insecure_channel(pull_service.address) as channel,
            grpc.aio.insecure_channel(nodes["broker-a"].address) as node_a,
            grpc.aio.insecure_channel(nodes["broker-b"].address) as node_b,
        ):
            stub = ps_grpc.PullServiceStub(channel)
            stubs = {"broker-a": sn_grpc.StoreNodeStub(node_a)}
            stubs["broker-b"] = sn_grpc.StoreNodeStub(node_b)

            async def routed() -> bool:  # the store-nodes register in the background
                r = await stub.QueryRoute(ps.QueryRouteRequest(topic=TOPIC))
                return len(r.route.broker_datas) == len(BROKERS)

            await eventually(routed, interval_s=0.05, what="both store-nodes in the route")

            async def send(broker: str, queue_id: int) -> None:
                message = pb.Message(topic=TOPIC, body=b"wake")
                r = await stubs[broker].SendMessage(
                    sn.SendMessageRequest(message=message, queue_id=queue_id)
                )
                assert r.result.status == pb.SEND_STATUS_SEND_OK

            # Through the pull-service: every queue empty, each pull held at offset 0.
            async def pull(i: int) -> list[bytes]:
                broker, q = queues[i % len(queues)]
                request = pull_request(broker, q, 0, topic=TOPIC, suspend_timeout_ms=SUSPEND_MS)
                return bodies(await stub.Pull(request, timeout=SUSPEND_MS / 1000 + 20))

            answers = await burst(pull, lambda: send("broker-a", WOKEN_QUEUE))
            check(answers, lambda i: queues[i % len(queues)] == ("broker-a", WOKEN_QUEUE))

            # Straight on broker-b's store-node: its queues are still empty.
            async def get(i: int) -> list[bytes]:
                request = sn.GetMessageRequest(
                    group="G",
                    topic=TOPIC,
                    queue_id=i % QUEUES,
                    offset=0,
                    max_msg_nums=32,
                    suspend_timeout_ms=SUSPEND_MS,
                )
                answer = await stubs["broker-b"].GetMessage(request, timeout=SUSPEND_MS / 1000 + 20)
                return bodies(pb.PullResponse(records=answer.records))

            answers = await burst(get, lambda: send("broker-b", WOKEN_QUEUE))
            check(answers, lambda i: i % QUEUES == WOKEN_QUEUE)

    asyncio.run(scenario())
