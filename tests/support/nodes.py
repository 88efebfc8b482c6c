"""Services in the test's own process, on real grpc.aio servers bound to port 0.

* :func:`node`: one store-node over a real store, its topics from an
  in-process directory (no etcd);
* :func:`cluster`: a small cluster on a real etcd: store-nodes registered as
  their process registers them (each with a store host of its own, so an
  offset message id names one of them), and pull-services, as a :class:`Harness`;
* :func:`admin_server`: the admin service, with a MetaClient of its own.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import grpc

from basalt.admin.service import start_admin_service
from basalt.services.meta import BrokerRegistration, MetaClient, MetaConfig, Perm, TopicConfig
from basalt.services.pull_service.server import RunningPullService, start_pull_service
from basalt.services.pull_service.service import PullServiceConfig
from basalt.services.store_node.main import EtcdTopics
from basalt.services.store_node.server import RunningStoreNode, start_store_node
from basalt.services.store_node.service import StoreNodeConfig
from basalt.services.store_node.topics import LocalTopics
from basalt.store.config import MessageStoreConfig
from basalt.v1 import common_pb2 as pb
from basalt.v1 import pull_service_pb2_grpc as ps_grpc
from basalt.v1 import store_node_pb2 as sn
from basalt.v1 import store_node_pb2_grpc as sn_grpc
from tests.support.polling import eventually
from tests.support.stores import node_store_config

# -- one store-node, no etcd -------------------------------------------------------------

#: The topic :func:`node` hosts: 4 queues on broker-a.
NODE_TOPIC = "NodeTopic"


@asynccontextmanager
async def node(
    tmp_path: Path,
    *,
    auto_create: bool = True,
    broker_permission: int = 6,
    store_config: Callable[[Path], MessageStoreConfig] | None = None,
) -> AsyncIterator[tuple[RunningStoreNode, sn_grpc.StoreNodeStub, LocalTopics]]:
    """Store-node ``broker-a`` over a store in ``tmp_path / "store"`` (configured
    by ``store_config``, default :func:`node_store_config`), hosting NODE_TOPIC;
    yields the running node, a stub to it and its topic directory."""
    topics = LocalTopics()
    topics.put(
        TopicConfig(
            topic_name=NODE_TOPIC, read_queue_nums=4, write_queue_nums=4, brokers=("broker-a",)
        )
    )
    running = await start_store_node(
        StoreNodeConfig(
            broker_name="broker-a",
            auto_create_topic_enable=auto_create,
            broker_permission=broker_permission,
        ),
        (store_config or node_store_config)(tmp_path / "store"),
        topics,
    )
    channel = grpc.aio.insecure_channel(running.address)
    try:
        yield running, sn_grpc.StoreNodeStub(channel), topics
    finally:
        await channel.close()
        await running.stop(grace_s=1)


# -- a cluster on etcd ---------------------------------------------------------------------

#: The topic :func:`cluster` creates unless told otherwise: 4 queues on each broker.
TOPIC = "PullTopic"
BROKERS = ("broker-a", "broker-b")
DEFAULT_TOPIC = TopicConfig(
    topic_name=TOPIC, read_queue_nums=4, write_queue_nums=4, brokers=BROKERS
)


@dataclass
class Harness:
    """A small cluster in one process: etcd metadata, store-nodes, pull-services."""

    meta: MetaClient
    nodes: dict[str, RunningStoreNode] = field(default_factory=dict)
    node_stubs: dict[str, sn_grpc.StoreNodeAsyncStub] = field(default_factory=dict)
    services: list[RunningPullService] = field(default_factory=list)
    stubs: list[ps_grpc.PullServiceAsyncStub] = field(default_factory=list)
    channels: list[grpc.aio.Channel] = field(default_factory=list)

    @property
    def stub(self) -> ps_grpc.PullServiceAsyncStub:
        return self.stubs[0]

    async def create_topic(self, config: TopicConfig) -> None:
        await self.meta.create_topic(config)
        await self.seen(lambda s: s.servicer.view.topics.get(config.topic_name) == config)

    async def update_topic(self, topic: str, **changes: Any) -> TopicConfig:
        return await self.meta.update_topic(topic, lambda c: replace(c, **changes))

    async def register_broker(self, name: str, address: str, perm: Perm = Perm.RW) -> None:
        await self.meta.register(
            BrokerRegistration(
                broker_name=name,
                address=address,
                store_root_id=f"root-{name}",
                started_at_ms=int(time.time() * 1000),
                perm=perm,
            )
        )
        await self.seen(lambda s: name in s.servicer.view.brokers)

    async def seen(self, check: Callable[[RunningPullService], Any]) -> None:
        """Wait until every pull-service's caches satisfy ``check(service)``."""
        await eventually(
            lambda: all(check(s) for s in self.services),
            interval_s=0.01,
            what="the pull-service caches catching up",
        )

    async def send(
        self, broker: str, queue_id: int, body: bytes, topic: str = TOPIC, **kw: Any
    ) -> int:
        r = await self.node_stubs[broker].SendMessage(
            sn.SendMessageRequest(
                message=pb.Message(topic=topic, body=body, **kw), queue_id=queue_id
            )
        )
        return r.result.queue_offsets[0]


@asynccontextmanager
async def cluster(
    tmp_path: Path,
    meta_config: MetaConfig,
    *,
    brokers: Sequence[str] = BROKERS,
    pull_services: Sequence[str] = ("ps-1",),
    heartbeat_interval_ms: int = 10_000,
    topic: TopicConfig | None = DEFAULT_TOPIC,
    store_config: Callable[[Path], MessageStoreConfig] = node_store_config,
    rocketmq_v2_listen: str = "",
) -> AsyncIterator[Harness]:
    """Pull-services, then store-nodes (stores under ``tmp_path / <broker>``
    configured by ``store_config``, topics from etcd, each registered), then
    ``topic`` created; yields once every pull-service has seen all of it.
    With ``rocketmq_v2_listen`` each pull-service serves the RocketMQ 5 front
    there too. Everything is stopped at exit."""
    meta = MetaClient(meta_config)
    await meta.connect()
    h = Harness(meta)
    topic_cache = meta.topic_cache()
    await topic_cache.start()
    try:
        for name in pull_services:
            running = await start_pull_service(
                PullServiceConfig(
                    pull_service_id=name, heartbeat_interval_ms=heartbeat_interval_ms
                ),
                meta,
                rocketmq_v2_listen=rocketmq_v2_listen,
            )
            h.services.append(running)
            channel = grpc.aio.insecure_channel(running.address)
            h.channels.append(channel)
            h.stubs.append(ps_grpc.PullServiceStub(channel))
        for index, name in enumerate(brokers):
            node = await start_store_node(
                StoreNodeConfig(broker_name=name),
                # A store host of its own, as each store-node process has (its
                # advertise address): offset message ids name one node.
                replace(store_config(tmp_path / name), store_host=f"127.0.0.1:{10911 + index}"),
                EtcdTopics(meta, topic_cache, 4),
            )
            h.nodes[name] = node
            channel = grpc.aio.insecure_channel(node.address)
            h.channels.append(channel)
            h.node_stubs[name] = sn_grpc.StoreNodeStub(channel)
            await h.register_broker(name, node.address)
        await h.seen(lambda s: set(pull_services) <= set(s.servicer.view.pull_services.snapshot()))
        if topic is not None:
            await h.create_topic(topic)
            await topic_cache.wait_until(lambda d: topic.topic_name in d, 5)
        yield h
    finally:
        for channel in h.channels:
            await channel.close()
        for running in h.services:
            await running.stop(grace_s=1)
        for node in h.nodes.values():
            await node.stop(grace_s=1)
        await meta.close()
        # grpc.aio delivers the completions of calls cancelled during the close
        # (lease keepalives, watches) a moment later; let them land on this loop
        # rather than on the next test's, which logs "Event loop is closed".
        await asyncio.sleep(0.05)


# -- the admin service ---------------------------------------------------------------------


@asynccontextmanager
async def admin_server(meta_config: MetaConfig) -> AsyncIterator[str]:
    """The admin service on a port of its own, with its own MetaClient (as its
    process has); yields its address."""
    meta = MetaClient(meta_config)
    await meta.connect()
    running = await start_admin_service(meta)
    try:
        yield running.address
    finally:
        await running.stop(grace_s=1)
        await meta.close()
