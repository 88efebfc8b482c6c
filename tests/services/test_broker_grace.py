"""RegisteredBrokers over a real MetaWatcher on a real etcd: registrations put
and deleted for real, the grace period measured on a manual clock."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from basalt.services.cluster.etcd import EtcdProcess
from basalt.services.errors import Refusal
from basalt.services.meta import (
    BrokerRegistration,
    MetaClient,
    MetaConfig,
    MetaWatcher,
    TopicConfig,
)
from basalt.services.pull_service.broker_grace import RegisteredBrokers
from basalt.services.pull_service.pull_rules import check_pull
from basalt.v1 import common_pb2 as pb
from basalt.v1 import pull_service_pb2 as ps
from tests.support.aio import async_test

GRACE_S = 4.0
#: How long a real etcd change may take to reach the watcher.
SEEN_S = 2.0


class ManualMonotonic:
    """A monotonic clock in seconds that moves only when told to."""

    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s

    def advance(self, delta_s: float) -> None:
        self.now_s += delta_s


def broker(name: str = "broker-a", address: str = "127.0.0.1:10911") -> BrokerRegistration:
    return BrokerRegistration(
        broker_name=name, address=address, store_root_id=f"root-{name}", started_at_ms=1
    )


@dataclass
class Harness:
    """A started broker watcher on ``meta``'s cluster and RegisteredBrokers over it."""

    meta: MetaClient
    watcher: MetaWatcher[BrokerRegistration]
    brokers: RegisteredBrokers
    clock: ManualMonotonic

    async def gone(self, name: str) -> None:
        assert await self.watcher.wait_until(lambda s: name not in s, timeout_s=SEEN_S)

    async def present(self, value: BrokerRegistration) -> None:
        name = value.broker_name
        assert await self.watcher.wait_until(lambda s: s.get(name) == value, timeout_s=SEEN_S)

    async def put_and_delete(self, value: BrokerRegistration) -> None:
        """Register ``value``, then revoke its lease (etcd deletes the key); both seen."""
        registration = await self.meta.register(value)
        await self.present(value)
        await registration.close()
        await self.gone(value.broker_name)


@contextlib.asynccontextmanager
async def harness(meta_config: MetaConfig) -> AsyncIterator[Harness]:
    async with MetaClient(meta_config) as meta:
        watcher = meta.broker_cache()
        clock = ManualMonotonic()
        brokers = RegisteredBrokers(watcher, grace_s=GRACE_S, monotonic_s=clock)
        await watcher.start()
        try:
            yield Harness(meta, watcher, brokers, clock)
        finally:
            brokers.close()
            await watcher.close()


def test_grace_must_not_be_negative(meta_config: MetaConfig) -> None:
    watcher = MetaClient(meta_config).broker_cache()
    with pytest.raises(ValueError, match="grace_s must be >= 0"):
        RegisteredBrokers(watcher, grace_s=-1)


@async_test
async def test_deleted_broker_is_served_within_the_grace_and_gone_after(
    meta_config: MetaConfig,
) -> None:
    async with harness(meta_config) as h:
        a = broker("broker-a")
        registration = await h.meta.register(a)
        await h.present(a)
        assert h.brokers.get("broker-a") == a

        await registration.close()  # revokes the lease: etcd deletes the key
        await h.gone("broker-a")
        assert h.brokers.get("broker-a") == a
        h.clock.advance(GRACE_S - 0.001)
        assert h.brokers.get("broker-a") == a
        h.clock.advance(0.001)
        assert h.brokers.get("broker-a") is None
        h.clock.advance(3600)
        assert h.brokers.get("broker-a") is None


@async_test
async def test_broker_put_again_is_its_new_registration(meta_config: MetaConfig) -> None:
    async with harness(meta_config) as h:
        old = broker("broker-a", "127.0.0.1:10911")
        await h.put_and_delete(old)
        h.clock.advance(1.0)
        assert h.brokers.get("broker-a") == old

        # Back on another port (a restarted store-node), within the grace.
        new = broker("broker-a", "127.0.0.1:10912")
        registration = await h.meta.register(new)
        await h.present(new)
        assert h.brokers.get("broker-a") == new
        # The old deletion's grace no longer matters, not even once it is over.
        h.clock.advance(GRACE_S)
        assert h.brokers.get("broker-a") == new

        # A second deletion starts a grace of its own, with the newer value.
        await registration.close()
        await h.gone("broker-a")
        h.clock.advance(GRACE_S - 0.5)
        assert h.brokers.get("broker-a") == new
        h.clock.advance(0.5)
        assert h.brokers.get("broker-a") is None


@async_test
async def test_expired_lease_the_registrant_puts_again(
    meta_config: MetaConfig, etcd: EtcdProcess
) -> None:
    """The outage case itself: the lease vanishes (as when etcd stalled past the
    TTL), the key with it, and the registrant re-puts under a new lease; the
    broker is served throughout and kept once the old grace is over."""
    async with harness(meta_config) as h, MetaClient(meta_config) as store_node:
        # What the pull-service would read at each change, right as the watcher applies it
        # (subscribed after ``h.brokers``, so its view of the change is already taken).
        seen: list[tuple[str, BrokerRegistration | None]] = []
        h.watcher.subscribe(
            lambda c: seen.append(("put" if c.new else "delete", h.brokers.get(c.name)))
        )
        a = broker("broker-a")
        registration = await store_node.register(a, ttl_s=3)
        await h.present(a)
        old_lease = registration.lease_id
        etcd.etcdctl("lease", "revoke", f"{old_lease:x}")
        # Deleted, then put again by the registration's keepalive task.
        assert await h.watcher.wait_until(lambda _: len(seen) == 3, timeout_s=5.0)
        assert seen == [("put", a), ("delete", a), ("put", a)]
        assert registration.lease_id != old_lease
        h.clock.advance(GRACE_S + 1)
        assert h.brokers.get("broker-a") == a


@async_test
async def test_unknown_broker_and_closed_wrapper(meta_config: MetaConfig) -> None:
    async with harness(meta_config) as h:
        assert h.brokers.get("never-seen") is None
        b = broker("broker-b")
        registration = await h.meta.register(b)
        await h.present(b)
        assert h.brokers.get("never-seen") is None

        # Closed, it answers what the watcher holds: no grace any more.
        h.brokers.close()
        h.brokers.close()
        await registration.close()
        await h.gone("broker-b")
        assert h.brokers.get("broker-b") is None


@async_test
async def test_check_pull_accepts_a_broker_within_its_grace(meta_config: MetaConfig) -> None:
    """What the pull-service relies on: ``get`` is check_pull's broker lookup."""
    topics = {"T": TopicConfig(topic_name="T", brokers=("broker-a",))}
    request = ps.PullRequest(
        group="G", queue=pb.MessageQueue(topic="T", broker_name="broker-a", queue_id=0), max_nums=1
    )
    async with harness(meta_config) as h:
        a = broker("broker-a")
        await h.put_and_delete(a)
        assert check_pull(request, h.brokers.get, topics.get) == a
        h.clock.advance(GRACE_S)
        with pytest.raises(Refusal, match="broker 'broker-a' is not registered") as refusal:
            check_pull(request, h.brokers.get, topics.get)
        assert refusal.value.code == pb.RESPONSE_CODE_BROKER_NOT_EXIST
