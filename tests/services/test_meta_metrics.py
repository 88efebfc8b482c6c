"""etcd reachability as a gauge (1 while a watcher's watch is live, 0 once etcd stops)
and the watch's lag in revisions."""

from __future__ import annotations

import asyncio

import pytest

from basalt.services.cluster.etcd import EtcdProcess
from basalt.services.meta import MetaClient, MetaConfig
from basalt.services.meta.session import EtcdSession
from basalt.services.meta.watch import MetaWatcher
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


class _Stalling(MetaWatcher[bytes]):
    """A watcher whose watch stops applying events while ``stalled`` (a stuck watch
    stream, as seen from the cache)."""

    stalled = False

    def _apply(self, name: str, raw: bytes | None, revision: int) -> None:
        if not self.stalled:
            super()._apply(name, raw, revision)


@async_test
async def test_watch_lag_counts_the_revisions_a_stalled_watch_has_not_applied(
    meta_config: MetaConfig,
) -> None:
    t = metric_reader()
    prefix = f"/basalt/{meta_config.cluster}/lagged/"
    watcher = _Stalling(
        meta_config, prefix, lambda name, raw: raw, what="lag test", lag_check_interval_s=0.05
    )
    writer = EtcdSession(meta_config)
    where = {"basalt.etcd.prefix": prefix}
    try:
        await writer.put(f"{prefix}a", b"1")
        await watcher.start()
        await eventually(lambda: watcher.get("a") == b"1", what="the first value")
        await eventually(lambda: t.value("basalt.etcd.watch.lag", **where) == 0, what="no lag")
        watcher.stalled = True
        for value in (b"2", b"3", b"4"):
            await writer.put(f"{prefix}a", value)
        await eventually(lambda: watcher.lag == 3, what="three revisions behind")
        assert t.value("basalt.etcd.watch.lag", **where) == 3
        assert watcher.get("a") == b"1"
        watcher.stalled = False
        await writer.put(f"{prefix}b", b"5")  # applied: the cache is at the newest revision
        await eventually(lambda: watcher.lag == 0, what="caught up")
        with pytest.raises(ValueError, match="lag_check_interval_s must be positive"):
            _Stalling(meta_config, prefix, lambda n, r: r, what="x", lag_check_interval_s=0)
    finally:
        await watcher.close()
        await writer.close()
