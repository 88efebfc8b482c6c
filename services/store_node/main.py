"""``basalt store-node`` / ``python -m basalt.services.store_node.main``: run one store-node.

::

    basalt store-node --name broker-a --data-dir .basalt/broker-a \\
        --listen 127.0.0.1:10911 --etcd 127.0.0.1:2379 [--cluster DefaultCluster] \\
        [--flush-disk-type SYNC_FLUSH]

With ``--etcd`` the node registers ``brokers/<name>`` under a lease it keeps
alive, reads topic configs from a watched cache (serving from it while etcd
is away) and creates unknown topics on first send. Without it, topics live
in memory (a single node on a laptop). SIGTERM or SIGINT stops it
gracefully: the registration is revoked, in-flight calls finish, the store
shuts down cleanly (``abort`` removed). Logs go to stderr, one line per
event: ``time level logger [trace_id span_id] message`` or JSON, and
``--metrics-port`` serves Prometheus metrics (docs/observability.md).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from pathlib import Path

from basalt.services import process
from basalt.services.meta import (
    BrokerRegistration,
    MetaClient,
    MetaConfig,
    MetaWatcher,
    TopicConfig,
    parse_endpoints,
)
from basalt.services.store_node.server import start_store_node
from basalt.services.store_node.service import StoreNodeConfig
from basalt.services.store_node.topics import LocalTopics, TopicDirectory
from basalt.store import FlushDiskType, MessageStoreConfig

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

    async def ensure_topic(self, name: str, broker: str) -> TopicConfig:
        config = await self.meta.ensure_topic(
            name, broker=broker, default_queue_nums=self.default_topic_queue_nums
        )
        self._created[name] = config
        return config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--name", required=True, help="broker name, unique in the cluster")
    parser.add_argument("--data-dir", required=True, type=Path, help="the store's root directory")
    parser.add_argument("--listen", default="127.0.0.1:10911", help="host:port to serve on")
    parser.add_argument("--etcd", help="etcd endpoints host:port[,host:port]; none: no etcd")
    parser.add_argument("--cluster", default="DefaultCluster", help="etcd key prefix's cluster")
    parser.add_argument(
        "--flush-disk-type",
        choices=[t.value for t in FlushDiskType],
        default=FlushDiskType.ASYNC_FLUSH.value,
    )
    # RocketMQ caps a pull from memory at 32 records / 256 KiB, sized for its
    # remoting protocol's per-request cost. A gRPC call costs far more here
    # (~0.5-1 ms of CPU), so a store-node serves up to 1024 records / 1 MiB per
    # queue read: a consumer's pull of 256 gets 256.
    parser.add_argument("--max-transfer-count-on-message-in-memory", type=int, default=1024)
    parser.add_argument("--max-transfer-bytes-on-message-in-memory", type=int, default=1024 * 1024)
    parser.add_argument("--default-topic-queue-nums", type=int, default=4)
    parser.add_argument("--no-auto-create-topic", action="store_true")
    parser.add_argument("--lease-ttl-s", type=int, default=10)
    parser.add_argument(
        "--max-pending-calls",
        type=int,
        default=process.MAX_PENDING_CALLS,
        help="arrived calls gRPC queues before the event loop picks them up",
    )


async def serve(args: argparse.Namespace) -> int:
    """Run until SIGTERM/SIGINT; returns the exit status."""
    stop = process.stop_signal()
    store_config = MessageStoreConfig(
        store_path_root_dir=args.data_dir,
        flush_disk_type=FlushDiskType(args.flush_disk_type),
        store_host=args.listen if ":" in args.listen else f"{args.listen}:10911",
        max_transfer_count_on_message_in_memory=args.max_transfer_count_on_message_in_memory,
        max_transfer_bytes_on_message_in_memory=args.max_transfer_bytes_on_message_in_memory,
    )
    node = StoreNodeConfig(
        broker_name=args.name,
        auto_create_topic_enable=not args.no_auto_create_topic,
        max_pending_calls=args.max_pending_calls,
    )
    meta: MetaClient | None = None
    topics: TopicDirectory
    cache: MetaWatcher[TopicConfig] | None = None
    if args.etcd:
        meta = MetaClient(
            MetaConfig(
                endpoints=parse_endpoints(args.etcd),
                cluster=args.cluster,
                lease_ttl_s=args.lease_ttl_s,
            )
        )
        await meta.connect()
        cache = meta.topic_cache()
        # Listed while the store recovers (a restart over 20,000 topics overlaps
        # ~0.4 s of etcd listing with the queues' recovery); served only once both end.
        listing = asyncio.ensure_future(cache.start())
        topics = EtcdTopics(meta, cache, args.default_topic_queue_nums)
    else:
        listing = None
        topics = LocalTopics(args.default_topic_queue_nums)
    running = await start_store_node(node, store_config, topics, listen=args.listen, ready=listing)
    registration = None
    if meta is not None:
        registration = await meta.register(
            BrokerRegistration(
                broker_name=args.name,
                address=running.address,
                store_root_id=str(Path(args.data_dir).resolve()),
                started_at_ms=int(time.time() * 1000),
            ),
            wait=False,
        )
    print(f"store-node {args.name} serving on {running.address}", flush=True)
    await stop.wait()
    log.info("stopping")
    if registration is not None:
        with contextlib.suppress(Exception):
            await registration.close()
    # Not clean (a flush or the offsets' last save failed): the exit status says so.
    clean = await running.stop()
    if cache is not None:
        await cache.close()
    if meta is not None:
        await meta.close()
    return 0 if clean else 1


def main(argv: Sequence[str] | None = None) -> int:
    return process.main("basalt store-node", __doc__.split("\n")[0], add_arguments, serve, argv)


if __name__ == "__main__":
    process.exit_now(main())
