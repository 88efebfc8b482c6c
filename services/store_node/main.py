"""``basalt store-node`` / ``python -m basalt.services.store_node.main``: run one store-node.

::

    basalt store-node --name broker-a --data-dir .basalt/broker-a \\
        --listen 127.0.0.1:10911 --etcd 127.0.0.1:2379 [--cluster DefaultCluster] \\
        [--flush-disk-type SYNC_FLUSH] [--config broker.conf] [--print-config]

Every setting of MessageStoreConfig, StoreNodeConfig, MetaConfig,
StoreNodeProcessConfig and RocketMQv2Config is a flag, a ``BASALT_*`` env var
and a config file key (:mod:`basalt.services.config`, docs/configuration.md).

``--rocketmq-v2-listen HOST:PORT`` (with ``--etcd``) serves the official
RocketMQ 5 clients from the node itself (RocketMQ 5's local proxy mode:
:mod:`basalt.services.store_node.front`); its endpoint is logged and printed
after the serving line.

With ``--etcd`` the node is a member (``--broker-id``, default 0) of the
broker group ``--name``: it registers under a lease it keeps alive, and
leads the group or follows its master (docs/replication.md; the master
publishes ``brokers/<name>``); it reads topic configs from a watched cache
(serving from it while etcd is away) and creates unknown topics on first
send. Without it, topics live
in memory (a single node on a laptop). SIGTERM or SIGINT stops it
gracefully: a master hands its group to a caught-up slave, the registration
is revoked, in-flight calls finish, the store
shuts down cleanly (``abort`` removed). Logs go to stderr, one line per
event: ``time level logger [trace_id span_id] message`` or JSON, and
``--metrics-port`` serves Prometheus metrics (docs/observability.md).
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import logging
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial
from typing import Any

from basalt.common.settings import config_dataclass, positive, setting, validate
from basalt.services import config, process
from basalt.services.meta import (
    BrokerRegistration,
    MetaClient,
    MetaConfig,
    MetaWatcher,
    TopicConfig,
)
from basalt.services.meta.model import Perm
from basalt.services.rocketmq_v2.service import RocketMQv2Config
from basalt.services.store_node.front import LocalFront, start_front
from basalt.services.store_node.ha.config import ReplicationConfig
from basalt.services.store_node.ha.role import DuplicateMemberError, GroupMember, MemberAddresses
from basalt.services.store_node.server import start_store_node
from basalt.services.store_node.service import StoreNodeConfig
from basalt.services.store_node.topics import LocalTopics, TopicDirectory
from basalt.store import MessageStore, MessageStoreConfig

log = logging.getLogger("basalt.services.store_node.service")


class EtcdTopics:
    """Topic configs from etcd: the watched cache, plus what this node just created
    (until the watch delivers it, so a burst of first sends costs one write)."""

    def __init__(
        self, meta: MetaClient, cache: MetaWatcher[TopicConfig], default_topic_queue_nums: int
    ) -> None:
        self.meta = meta
        self.cache = cache
        self.default_topic_queue_nums = default_topic_queue_nums
        self._created: dict[str, TopicConfig] = {}

    def topic(self, name: str) -> TopicConfig | None:
        config = self.cache.get(name)
        if config is not None:
            self._created.pop(name, None)
            return config
        return self._created.get(name)

    async def ensure_topic(
        self, name: str, broker: str, *, queue_nums: int | None = None
    ) -> TopicConfig:
        config = await self.meta.ensure_topic(
            name, broker=broker, default_queue_nums=queue_nums or self.default_topic_queue_nums
        )
        self._created[name] = config
        return config


async def _list_all(*caches: MetaWatcher[Any]) -> None:
    """List (and start watching) every cache, side by side."""
    await asyncio.gather(*(c.start() for c in caches))


def _registered_perm(brokers: MetaWatcher[BrokerRegistration], name: str, configured: Perm) -> Perm:
    """The broker's permission as its registration says (registered from
    ``broker_permission``; an operator may put another in etcd, RocketMQ's
    ``updateBrokerConfig -k brokerPermission``); ``configured`` until the
    registration is seen."""
    registration = brokers.get(name)
    return registration.perm if registration is not None else configured


def _reachable(address: str) -> str:
    """``address`` with a wildcard host replaced (:func:`config.reachable_host`)."""
    return f"{config.reachable_host(address)}:{address.rpartition(':')[2]}"


def _store_host(advertise_address: str) -> str:
    """STOREHOST must be ``ip:port``: the advertise address when its host is an
    IP, else 127.0.0.1 with its port (a DNS name is not looked up at start)."""
    host, _, port = advertise_address.rpartition(":")
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return f"127.0.0.1:{port}"
    return advertise_address


@config_dataclass
class StoreNodeProcessConfig:
    """A store-node process's addresses and topic defaults (what has no home in
    StoreNodeConfig, MessageStoreConfig or MetaConfig)."""

    listen: str = setting(
        default="127.0.0.1:10911",
        check=config.listen_address,
        doc="host:port to serve on (port 0: any).",
    )
    advertise_address: str = setting(
        default="",
        check=config.address_or_empty,
        doc="host:port registered in etcd, what services dial; empty: the listen "
        "address as bound, a wildcard host replaced by 127.0.0.1.",
    )
    client_address: str = setting(
        default="",
        check=config.address_or_empty,
        doc="host:port clients are given in routes (Kafka's external listener); "
        "empty: the advertise address.",
    )
    default_topic_queue_nums: int = setting(
        default=4, check=positive, doc="Queues of a topic created by its first send."
    )
    stop_grace_s: float = config.stop_grace_setting()

    def __post_init__(self) -> None:
        validate(self, ValueError)


#: ``broker_name`` is ``--name``, ``store_path_root_dir`` ``--data-dir`` and
#: ``endpoints`` ``--etcd`` (none given: no etcd, topics in memory).
SPEC = config.ServiceSpec(
    "basalt-store-node",
    (
        config.Section(StoreNodeProcessConfig),
        config.Section(StoreNodeConfig, aliases={"broker_name": "name"}),
        config.Section(ReplicationConfig),
        config.Section(RocketMQv2Config),
        config.Section(MessageStoreConfig, aliases={"store_path_root_dir": "data_dir"}),
        config.Section(
            MetaConfig, aliases={"endpoints": "etcd"}, defaults={"endpoints": ()}, enabled_by="etcd"
        ),
    ),
    derived=(
        # Port 0 is known once bound: left empty here, taken from the bound address.
        config.Derived(
            "advertise_address",
            lambda v: "" if str(v["listen"]).endswith(":0") else _reachable(str(v["listen"])),
            "listen",
        ),
        config.Derived("client_address", lambda v: v["advertise_address"], "advertise_address"),
        config.Derived(
            "store_host",
            lambda v: _store_host(str(v["advertise_address"] or _reachable(str(v["listen"])))),
            "advertise_address",
        ),
    ),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    config.add_arguments(parser, SPEC)
    # Today's switch, kept: the same as --auto-create-topic-enable false.
    parser.add_argument(
        "--no-auto-create-topic",
        dest="auto_create_topic_enable",
        action="store_const",
        const="false",
        default=argparse.SUPPRESS,
        help="the same as --auto-create-topic-enable false",
    )


async def serve(args: argparse.Namespace) -> int:
    """Run until SIGTERM/SIGINT; returns the exit status."""
    stop = process.stop_signal()
    settings = process.settings(args)
    addresses = settings.build(StoreNodeProcessConfig)
    store_config = settings.build(MessageStoreConfig)
    node = settings.build(StoreNodeConfig)
    replication = settings.build(ReplicationConfig)
    front_listen = settings.build(RocketMQv2Config)
    tls = process.tls_config(args)
    if front_listen.rocketmq_v2_listen and not settings.given("etcd"):
        print(
            "basalt store-node: --rocketmq-v2-listen needs --etcd (the front reads the "
            "cluster's topics and brokers there)",
            file=sys.stderr,
        )
        return 2
    group: Callable[[MessageStore], GroupMember] | None = None
    meta: MetaClient | None = None
    topics: TopicDirectory
    cache: MetaWatcher[TopicConfig] | None = None
    brokers: MetaWatcher[BrokerRegistration] | None = None
    broker_perm: Callable[[], Perm] | None = None
    if settings.given("etcd"):
        meta = MetaClient(settings.build(MetaConfig), tls=tls)
        await meta.connect()
        cache = meta.topic_cache()
        brokers = meta.broker_cache()
        # Listed while the store recovers (a restart over 20,000 topics overlaps
        # ~0.4 s of etcd listing with the queues' recovery); served only once both end.
        listing = asyncio.ensure_future(_list_all(cache, brokers))
        topics = EtcdTopics(meta, cache, addresses.default_topic_queue_nums)
        broker_perm = partial(
            _registered_perm, brokers, node.broker_name, Perm(node.broker_permission)
        )
        # With etcd every node is a member of its broker group, a group of one
        # included: its records become consumable once its in-sync set has them.
        store_config = replace(store_config, enable_controller_mode=True)
        group = partial(
            GroupMember, config=replication, broker_name=node.broker_name, meta=meta, tls=tls
        )
    else:
        listing = None
        topics = LocalTopics(addresses.default_topic_queue_nums)
    running = await start_store_node(
        node,
        store_config,
        topics,
        listen=addresses.listen,
        ready=listing,
        tls=tls,
        broker_perm=broker_perm,
        group=group,
    )
    # Not given: the address as bound (port 0 resolved), as services reach it.
    advertise = (
        addresses.advertise_address
        if settings.given("advertise_address")
        else _reachable(running.address)
    )
    client = addresses.client_address if settings.given("client_address") else advertise
    if running.group is not None:
        try:
            await running.group.start(
                MemberAddresses(
                    address=advertise,
                    client_address=client,
                    store_root_id=str(store_config.store_path_root_dir.resolve()),
                    started_at_ms=int(time.time() * 1000),
                    perm=Perm(node.broker_permission),
                )
            )
        except BaseException as e:
            await running.group.close()
            await running.stop(addresses.stop_grace_s)
            if isinstance(e, DuplicateMemberError):
                print(f"basalt store-node: {e}", file=sys.stderr)
                return 2
            raise
    front: LocalFront | None = None
    if front_listen.rocketmq_v2_listen:
        assert meta is not None and cache is not None and brokers is not None  # etcd: checked
        try:
            front = await start_front(
                front_listen,
                servicer=running.servicer,
                meta=meta,
                topics=cache,
                brokers=brokers,
                broker_id=replication.broker_id,
                address=advertise,
                client_host=client.rpartition(":")[0],
                tls=tls,
                front_tls=front_listen.tls(tls),
            )
        except BaseException:
            if running.group is not None:
                await running.group.close()
            await running.stop(addresses.stop_grace_s)
            raise
    print(f"store-node {node.broker_name} serving on {running.address}", flush=True)
    if front is not None:
        print(f"store-node {node.broker_name} RocketMQ 5 front on {front.endpoint}", flush=True)
    await stop.wait()
    with process.stopping(addresses.stop_grace_s):
        if front is not None:
            await front.stop(addresses.stop_grace_s)
        # Not clean (a flush or the offsets' last save failed): the exit status says so.
        clean = await running.stop(addresses.stop_grace_s)
        if cache is not None:
            await cache.close()
        if brokers is not None:
            await brokers.close()
        if meta is not None:
            await meta.close()
    return 0 if clean else 1


def main(argv: Sequence[str] | None = None) -> int:
    return process.main("basalt store-node", __doc__.split("\n")[0], add_arguments, serve, argv)


if __name__ == "__main__":
    process.exit_now(main())
