"""etcd reachability as a gauge: 1 while a watcher's watch is live, 0 once etcd stops."""

from __future__ import annotations

import asyncio

from basalt.services.cluster.etcd import EtcdProcess
from basalt.services.meta import MetaClient, MetaConfig
from tests.support.aio import async_test
from tests.support.etcd import unique_cluster
from tests.support.polling import eventually
from tests.support.telemetry import metric_reader


@async_test
async def test_etcd_reachable_gauge_follows_etcd(private_etcd: EtcdProcess) -> None:
    t = metric_reader()
    config = MetaConfig(
        endpoints=(private_etcd.endpoint,), cluster=unique_cluster(), op_timeout_s=1.0
    )
    async with MetaClient(config) as meta:
        cache = meta.topic_cache()
        await cache.start()
        where = {"basalt.etcd.prefix": cache.prefix}
        assert t.value("basalt.etcd.reachable", **where) == 1
        await asyncio.to_thread(private_etcd.stop)
        await eventually(lambda: t.value("basalt.etcd.reachable", **where) == 0, what="etcd gone")
    # A closed watcher reports nothing.
    assert t.value("basalt.etcd.reachable", **where) is None
