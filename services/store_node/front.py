"""A store-node's own RocketMQ 5 front: RocketMQ 5's "local" proxy mode.

With ``rocketmq_v2_listen`` a store-node serves ``apache.rocketmq.v2.MessagingService``
itself, as a RocketMQ 5 broker started with its proxy in-process does
(``mqbroker --enable-proxy``; docs/rocketmq-v2.md#the-front-in-each-store-node):

* sends, pops, acks and the rest for this node's own queues go to its
  StoreNode servicer in-process (:class:`basalt.services.rocketmq_v2.host.LocalStoreNode`):
  no gRPC hop, no serialization; a send without a message group is stored
  here when the topic has writable queues here;
* anything for another broker's queues goes over gRPC, as from a
  pull-service's front (the same code: :mod:`basalt.services.rocketmq_v2`);
* the front registers ``rocketmq-v2/<broker>/<broker id>`` in etcd (its
  endpoint, under a lease of its own), and its routes name each broker's
  own front where it has one (RocketMQ's LocalTopicRouteService answers each
  broker's host with the proxy's port), so the official clients send and
  receive where the data is.

It needs etcd: the cluster's topics, brokers and fronts come from there.
:func:`start_front` runs once the node serves and knows its advertised
address; :meth:`LocalFront.stop` before the node stops.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass

from basalt.common.tls import TlsConfig
from basalt.services.meta import BrokerRegistration, MetaClient, MetaWatcher, TopicConfig
from basalt.services.meta.lease import Registration
from basalt.services.meta.model import FrontRegistration
from basalt.services.pull_service.broker_grace import RegisteredBrokers
from basalt.services.pull_service.channels import ChannelPool, StoreHosts
from basalt.services.rocketmq_v2.host import FrontDirectory, FrontHost, LocalStoreNode
from basalt.services.rocketmq_v2.server import RunningFront, start_rocketmq_v2
from basalt.services.rocketmq_v2.service import RocketMQv2Config
from basalt.services.store_node.service import StoreNodeServicer

log = logging.getLogger(__name__)

#: gRPC message limit of the front's calls, both ways (a pull-service's default).
MAX_MESSAGE_BYTES = 64 * 1024 * 1024


@dataclass(slots=True)
class LocalFront:
    """A store-node's running front and what it holds; :meth:`stop` it once."""

    running: RunningFront
    #: ``host:port`` the official clients dial (registered in etcd).
    endpoint: str
    registration: Registration | None
    fronts: MetaWatcher[FrontRegistration]
    brokers: RegisteredBrokers
    channels: ChannelPool

    async def stop(self, grace_s: float) -> None:
        """Deregister (routes stop naming it), NOT_SERVING, calls in flight get
        ``grace_s``, then the channels and caches it opened are closed."""
        if self.registration is not None:
            with contextlib.suppress(Exception):  # etcd away: the lease expires by itself
                await self.registration.close()
        await self.running.stop(grace_s)
        await self.channels.close()
        self.brokers.close()
        await self.fronts.close()


async def start_front(
    config: RocketMQv2Config,
    *,
    servicer: StoreNodeServicer,
    meta: MetaClient,
    topics: MetaWatcher[TopicConfig],
    brokers: MetaWatcher[BrokerRegistration],
    broker_id: int,
    address: str,
    client_host: str,
    tls: TlsConfig | None = None,
    front_tls: TlsConfig | None = None,
) -> LocalFront:
    """Serve the front of the node ``servicer`` serves on ``config``'s
    ``rocketmq_v2_listen`` (port 0: any) and register it in etcd (retried in
    the background while etcd is away). ``topics`` and ``brokers``: the node's started watch caches;
    ``address``: its registered StoreNode address (``brokers/<name>`` names it
    while it is master); ``client_host``: the host clients reach it at (the
    endpoint registered is that host and the bound port); ``tls``: what the
    node dials other store-nodes with; ``front_tls``: what the front serves
    with (None: ``tls``). Raises what binding raises."""
    broker_name = servicer.config.broker_name
    lookup = RegisteredBrokers(brokers, grace_s=meta.config.lease_ttl_s + 1)
    fronts = meta.front_cache()
    channels = ChannelPool(max_message_bytes=MAX_MESSAGE_BYTES, tls=tls)
    try:
        await fronts.start()
        host = FrontHost(
            topics=topics,
            broker_watch=brokers,
            brokers=lookup,
            channels=channels,
            store_hosts=StoreHosts(channels),
            meta=meta,
            listener_id=f"rocketmq-v2@{broker_name}-{broker_id}",
            max_message_bytes=MAX_MESSAGE_BYTES,
            local=LocalStoreNode(servicer, broker_name, address, servicer.store.config.store_host),
            fronts=FrontDirectory(fronts, lookup),
        )
        running = await start_rocketmq_v2(
            config, host, config.rocketmq_v2_listen, tls=tls if front_tls is None else front_tls
        )
    except BaseException:
        await channels.close()
        lookup.close()
        await fronts.close()
        raise
    endpoint = f"{client_host}:{running.port}"
    registration = await meta.register(
        FrontRegistration(
            broker_name=broker_name, broker_id=broker_id, address=address, endpoint=endpoint
        ),
        wait=False,
    )
    log.info("store-node %s serves RocketMQ 5 clients on %s", broker_name, endpoint)
    return LocalFront(running, endpoint, registration, fronts, lookup, channels)
