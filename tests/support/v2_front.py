"""A local cluster as the RocketMQ 5 front's tests (tests/rocketmq_v2/) use it:
its addresses (the pull-service's front and each store-node's own), a topic
made with ``admin updateTopic``, a raw v2 stub."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from basalt.client import ConsumeFromWhere, LitePullConfig, LitePullConsumer
from basalt.common.message import MessageRecord
from basalt.rocketmq.v2 import service_pb2_grpc as sv_grpc
from tests.support.processes import local_cluster, run_basalt_sync

#: Where a test's client may dial the front (:meth:`V2Cluster.endpoint`).
FRONTS = ("pull-service", "store-node", "other-store-node")


@dataclass(frozen=True)
class V2Cluster:
    """The addresses of etcd, the pull-service and its v2 front, and each
    store-node's own v2 front by its name (``cluster up`` serves one on each)."""

    etcd: str
    pull: str
    v2: str
    fronts: dict[str, str] = field(default_factory=dict)

    def topic(self, name: str, brokers: tuple[str, ...] = ("broker-a",), queues: int = 2) -> str:
        """Create topic ``name`` with ``queues`` read and write queues on each of
        ``brokers`` (``admin updateTopic``, which must succeed); returns ``name``."""
        on = [arg for b in brokers for arg in ("-b", b)]
        made = run_basalt_sync(
            "admin", "updateTopic", "-t", name, "-r", str(queues), "-w", str(queues), *on,
            "--etcd", self.etcd,
        )  # fmt: skip
        assert made.returncode == 0, made.stdout + made.stderr
        return name

    def endpoint(self, front: str, broker: str = "broker-a") -> str:
        """The v2 endpoint a client dials for a topic on ``broker``, by
        ``front`` (:data:`FRONTS`): the pull-service's (``pull-service``),
        ``broker``'s own (``store-node``: its queues served in-process), or
        another store-node's (``other-store-node``: they are routed over gRPC)."""
        if front == "pull-service":
            return self.v2
        if front == "store-node":
            return self.fronts[broker]
        return next(a for name, a in sorted(self.fronts.items()) if name != broker)

    def stub(self, at: str | None = None) -> tuple[grpc.Channel, sv_grpc.MessagingServiceStub]:
        """A plaintext channel to a v2 front (``at``: its address; the
        pull-service's by default; the caller closes the channel) and its stub."""
        channel = grpc.insecure_channel(at or self.v2)
        return channel, sv_grpc.MessagingServiceStub(channel)


@contextlib.contextmanager
def v2_cluster(data: Path, *args: str, env: Mapping[str, str] | None = None) -> Iterator[V2Cluster]:
    """:func:`tests.support.processes.local_cluster` (``data``, ``args``,
    ``env``) as a :class:`V2Cluster`."""
    with local_cluster(data, *args, env=env) as rows:
        by_role = {r["role"]: r for r in rows}
        pull = by_role["pull-service"]
        fronts = {r["name"]: r["rocketmq_v2"] for r in rows if r["role"] == "store-node"}
        yield V2Cluster(by_role["etcd"]["address"], pull["address"], pull["rocketmq_v2"], fronts)


async def read_all(pull: str, topic: str, group: str, expect: int) -> list[MessageRecord]:
    """Every record of ``topic`` from its first offset, read with the SDK as
    ``group`` through the pull-service at ``pull``: until ``expect`` came (or
    15 s passed), then whatever more arrives in 0.3 s (nothing, when exact)."""
    consumer = LitePullConsumer(
        pull,
        config=LitePullConfig(
            consumer_group=group, consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET
        ),
    )
    consumer.subscribe(topic)
    got: list[MessageRecord] = []
    async with consumer:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 15
        while len(got) < expect and loop.time() < deadline:
            got += await consumer.poll(timeout_ms=500)
        got += await consumer.poll(timeout_ms=300)  # nothing more than expected
    return got
