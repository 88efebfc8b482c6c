"""Running a pull-service: caches, the gRPC server, its registration, graceful stop.

:func:`start_pull_service` starts the etcd watch caches it reads (topics,
brokers, pull-services, consumers), serves PullService, ``grpc.health.v1`` and
reflection on ``listen`` (port 0 picks a free port, for tests), and registers
``pull-services/<id>`` under a lease so other pull-services can forward
commands to its sessions. :meth:`RunningPullService.stop` is the SIGTERM
path, in the order that lets everyone else carry on:

1. NOT_SERVING, and the registration is revoked (nobody forwards here);
2. every session ends (UNAVAILABLE) and its consumer registration is revoked,
   so consumers reconnect to another pull-service at once;
3. the server stops accepting calls; in-flight ones (held pulls) finish
   within the grace period;
4. channels to store-nodes and the caches are closed.

With ``rocketmq_v2_listen``, the RocketMQ 5 front
(:mod:`basalt.services.rocketmq_v2`) is served on that second listener over
the same caches and channels, and stops with the pull-service's server (step 3).

The MetaClient belongs to the caller, who closes it afterwards.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health

from basalt.common.tls import TlsConfig
from basalt.services.errors import Refusal
from basalt.services.meta.client import MetaClient, decode_consumer
from basalt.services.meta.lease import Registration
from basalt.services.meta.model import (
    BrokerRegistration,
    ConsumerRegistration,
    PullServiceRegistration,
)
from basalt.services.meta.watch import MetaChange, MetaWatcher
from basalt.services.process import (
    add_health_and_reflection,
    add_port,
    add_servicer,
    grpc_server,
    set_serving,
)
from basalt.services.pull_service.channels import ChannelPool
from basalt.services.pull_service.service import ClusterView, PullServiceConfig, PullServiceServicer
from basalt.services.pull_service.sessions import SessionRegistry
from basalt.services.rocketmq_v2.host import FrontHost
from basalt.services.rocketmq_v2.server import RunningFront, start_rocketmq_v2
from basalt.services.rocketmq_v2.service import RocketMQv2Config
from basalt.v1 import common_pb2 as pb
from basalt.v1 import pull_service_pb2

log = logging.getLogger(__name__)

PULL_SERVICE = pull_service_pb2.DESCRIPTOR.services_by_name["PullService"].full_name


@dataclass(slots=True)
class RunningPullService:
    """A started pull-service; :meth:`stop` it exactly once."""

    config: PullServiceConfig
    server: grpc.aio.Server
    port: int
    address: str
    servicer: PullServiceServicer
    health: health.aio.HealthServicer
    registration: Registration | None
    #: The RocketMQ 5 front and its "host:port", when served.
    rocketmq_v2: RunningFront | None = None
    rocketmq_v2_address: str = ""

    async def stop(self, grace_s: float = 5.0) -> None:
        """Graceful stop, in the module docstring's order."""
        await set_serving(self.health, PULL_SERVICE, False)
        if self.registration is not None:
            with contextlib.suppress(Exception):  # etcd away: the lease expires by itself
                await self.registration.close()
        stopping = Refusal(
            pb.RESPONSE_CODE_SERVICE_NOT_AVAILABLE,
            f"pull-service {self.config.pull_service_id} is stopping; reconnect to another",
        )
        await self.servicer.sessions.close_all(stopping, grace_s)
        if self.rocketmq_v2 is not None:
            await self.rocketmq_v2.stop(grace_s)
        await self.server.stop(grace_s)
        await self.servicer.channels.close()
        self.servicer.brokers.close()
        for cache in self.servicer.view.caches:
            await cache.close()
        log.info("pull-service %s stopped", self.config.pull_service_id)


async def start_pull_service(
    config: PullServiceConfig,
    meta: MetaClient,
    *,
    listen: str = "127.0.0.1:0",
    advertise_host: str = "127.0.0.1",
    client_address: str = "",
    register: bool = True,
    rocketmq_v2_listen: str = "",
    rocketmq_v2: RocketMQv2Config | None = None,
    tls: TlsConfig | None = None,
    rocketmq_v2_tls: TlsConfig | None = None,
) -> RunningPullService:
    """Start the caches (MetaUnavailableError if etcd does not answer their first
    listing) and serve on ``listen``; with ``register``, put
    ``pull-services/<id>`` = ``advertise_host:port`` (and ``client_address``,
    empty: the same) under a lease (retried in the background while etcd is
    away). With ``tls`` enabled it serves (the v2 front too) and dials store-nodes
    and other pull-services with TLS; the v2 front serves with ``rocketmq_v2_tls``
    (None: ``tls``), whose client authentication may differ."""
    view = ClusterView(
        meta.topic_cache(), meta.broker_cache(), meta.pull_service_cache(), _consumers(meta)
    )
    for cache in view.caches:
        await cache.start()
    channels = ChannelPool(max_message_bytes=config.max_message_bytes, tls=tls)
    _evict_departed(view, channels)
    sessions = SessionRegistry(
        config.pull_service_id,
        meta,
        heartbeat_interval_ms=config.heartbeat_interval_ms,
        register_timeout_s=meta.config.op_timeout_s,
    )
    view.consumers.subscribe(sessions.on_consumer_change)
    view.topics.subscribe(sessions.on_topic_change)
    servicer = PullServiceServicer(config, meta, view, channels, sessions)
    server = grpc_server(config.max_message_bytes, max_pending_calls=config.max_pending_calls)
    add_servicer(
        server,
        servicer,
        pull_service_pb2.DESCRIPTOR.services_by_name["PullService"],
        may_answer_bytes=frozenset({"PullBatch"}),
    )
    health_servicer = add_health_and_reflection(server, PULL_SERVICE)
    front: RunningFront | None = None
    v2_address = ""
    try:
        port = add_port(server, listen, tls)
        await server.start()
        if rocketmq_v2_listen:
            front = await start_rocketmq_v2(
                rocketmq_v2 or RocketMQv2Config(),
                FrontHost.of_pull_service(servicer),
                rocketmq_v2_listen,
                tls=tls if rocketmq_v2_tls is None else rocketmq_v2_tls,
            )
            v2_address = f"{advertise_host}:{front.port}"
    except BaseException:
        await server.stop(None)
        await channels.close()
        for cache in view.caches:
            await cache.close()
        raise
    address = f"{advertise_host}:{port}"
    registration = None
    if register:
        registration = await meta.register(
            PullServiceRegistration(
                pull_service_id=config.pull_service_id,
                address=address,
                started_at_ms=int(time.time() * 1000),
                client_address=client_address,
            ),
            wait=False,
        )
    await set_serving(health_servicer, PULL_SERVICE, True)
    log.info("pull-service %s serving on %s", config.pull_service_id, address)
    if front is not None:
        log.info(
            "pull-service %s serves RocketMQ 5 clients on %s", config.pull_service_id, v2_address
        )
    return RunningPullService(
        config,
        server,
        port,
        address,
        servicer,
        health_servicer,
        registration,
        rocketmq_v2=front,
        rocketmq_v2_address=v2_address,
    )


def _evict_departed(view: ClusterView, channels: ChannelPool) -> None:
    """Close the channel of a store-node or pull-service that left or moved, unless
    another registration still uses its address (long-lived processes in a
    cluster whose nodes come back on new ports would otherwise pile them up)."""

    def in_use(address: str) -> bool:
        return any(b.address == address for b in view.brokers.snapshot().values()) or any(
            p.address == address for p in view.pull_services.snapshot().values()
        )

    def on_change(
        change: MetaChange[BrokerRegistration] | MetaChange[PullServiceRegistration],
    ) -> None:
        old, new = change.old, change.new
        if old is None or (new is not None and new.address == old.address):
            return
        if not in_use(old.address):
            channels.evict(old.address)

    view.brokers.subscribe(on_change)
    view.pull_services.subscribe(on_change)


def _consumers(meta: MetaClient) -> MetaWatcher[ConsumerRegistration]:
    """A watch of every consumer registration, named ``group/client_id`` (MetaClient
    offers one group's; a session may move between pull-services in any group)."""
    return MetaWatcher(
        meta.config,
        meta.keys.consumers,
        decode_consumer,
        what="consumer registrations",
        tls=meta.tls,
    )
