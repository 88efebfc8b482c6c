"""RegisteredBrokers over a real MetaWatcher on a real etcd: registrations put
and deleted for real, the grace period measured on a manual clock."""

from __future__ import annotations

import pytest

from basalt.v1 import common_pb2 as pb
from basalt.v1 import pull_service_pb2 as ps
from services.broker_grace import RegisteredBrokers
from services.errors import Refusal
from services.etcd_process import EtcdProcess
from services.meta import BrokerRegistration, MetaClient, MetaConfig, MetaWatcher, TopicConfig
from services.pull_checks import check_pull
from tests.services.conftest import async_test

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


async def gone(watcher: MetaWatcher[BrokerRegistration], name: str) -> None:
    assert await watcher.wait_until(lambda s: name not in s, timeout_s=SEEN_S)


async def present(watcher: MetaWatcher[BrokerRegistration], value: BrokerRegistration) -> None:
    name = value.broker_name
    assert await watcher.wait_until(lambda s: s.get(name) == value, timeout_s=SEEN_S)


def test_grace_must_not_be_negative(meta_config: MetaConfig) -> None:
    watcher = MetaClient(meta_config).broker_cache()
    with pytest.raises(ValueError, match="grace_s must be >= 0"):
        RegisteredBrokers(watcher, grace_s=-1)


@async_test
async def test_deleted_broker_is_served_within_the_grace_and_gone_after(
    meta_config: MetaConfig,
) -> None:
    clock = ManualMonotonic()
    async with MetaClient(meta_config) as meta:
        watcher = meta.broker_cache()
        brokers = RegisteredBrokers(watcher, grace_s=GRACE_S, monotonic_s=clock)
        await watcher.start()
        try:
            a = broker("broker-a")
            reg = await meta.register(a)
            await present(watcher, a)
            assert brokers.get("broker-a") == a

            await reg.close()  # revokes the lease: etcd deletes the key
            await gone(watcher, "broker-a")
            assert brokers.get("broker-a") == a
            clock.advance(GRACE_S - 0.001)
            assert brokers.get("broker-a") == a
            clock.advance(0.001)
            assert brokers.get("broker-a") is None
            clock.advance(3600)
            assert brokers.get("broker-a") is None
        finally:
            brokers.close()
            await watcher.close()


@async_test
async def test_broker_put_again_is_its_new_registration(meta_config: MetaConfig) -> None:
    clock = ManualMonotonic()
    async with MetaClient(meta_config) as meta:
        watcher = meta.broker_cache()
        brokers = RegisteredBrokers(watcher, grace_s=GRACE_S, monotonic_s=clock)
        await watcher.start()
        try:
            old = broker("broker-a", "127.0.0.1:10911")
            await (await meta.register(old)).close()
            await gone(watcher, "broker-a")
            clock.advance(1.0)
            assert brokers.get("broker-a") == old

            # Back on another port (a restarted store-node), within the grace.
            new = broker("broker-a", "127.0.0.1:10912")
            reg = await meta.register(new)
            await present(watcher, new)
            assert brokers.get("broker-a") == new
            # The old deletion's grace no longer matters, not even once it is over.
            clock.advance(GRACE_S)
            assert brokers.get("broker-a") == new

            # A second deletion starts a grace of its own, with the newer value.
            await reg.close()
            await gone(watcher, "broker-a")
            clock.advance(GRACE_S - 0.5)
            assert brokers.get("broker-a") == new
            clock.advance(0.5)
            assert brokers.get("broker-a") is None
        finally:
            brokers.close()
            await watcher.close()


@async_test
async def test_expired_lease_the_registrant_puts_again(
    meta_config: MetaConfig, etcd: EtcdProcess
) -> None:
    """The outage case itself: the lease vanishes (as when etcd stalled past the
    TTL), the key with it, and the registrant re-puts under a new lease; the
    broker is served throughout and kept once the old grace is over."""
    clock = ManualMonotonic()
    async with MetaClient(meta_config) as meta, MetaClient(meta_config) as store_node:
        watcher = meta.broker_cache()
        brokers = RegisteredBrokers(watcher, grace_s=GRACE_S, monotonic_s=clock)
        # What the pull-service would read at each change, right as the watcher applies it
        # (subscribed after ``brokers``, so its view of the change is already taken).
        seen: list[tuple[str, BrokerRegistration | None]] = []
        watcher.subscribe(
            lambda c: seen.append(("put" if c.new else "delete", brokers.get(c.name)))
        )
        await watcher.start()
        try:
            a = broker("broker-a")
            reg = await store_node.register(a, ttl_s=3)
            await present(watcher, a)
            old_lease = reg.lease_id
            etcd.etcdctl("lease", "revoke", f"{old_lease:x}")
            # Deleted, then put again by the registration's keepalive task.
            assert await watcher.wait_until(lambda _: len(seen) == 3, timeout_s=5.0)
            assert seen == [("put", a), ("delete", a), ("put", a)]
            assert reg.lease_id != old_lease
            clock.advance(GRACE_S + 1)
            assert brokers.get("broker-a") == a
        finally:
            brokers.close()
            await watcher.close()


@async_test
async def test_unknown_broker_and_closed_wrapper(meta_config: MetaConfig) -> None:
    clock = ManualMonotonic()
    async with MetaClient(meta_config) as meta:
        watcher = meta.broker_cache()
        brokers = RegisteredBrokers(watcher, grace_s=GRACE_S, monotonic_s=clock)
        await watcher.start()
        try:
            assert brokers.get("never-seen") is None
            b = broker("broker-b")
            reg = await meta.register(b)
            await present(watcher, b)
            assert brokers.get("never-seen") is None

            # Closed, it answers what the watcher holds: no grace any more.
            brokers.close()
            brokers.close()
            await reg.close()
            await gone(watcher, "broker-b")
            assert brokers.get("broker-b") is None
        finally:
            brokers.close()
            await watcher.close()


@async_test
async def test_check_pull_accepts_a_broker_within_its_grace(meta_config: MetaConfig) -> None:
    """What the pull-service relies on: ``get`` is check_pull's broker lookup."""
    clock = ManualMonotonic()
    topics = {"T": TopicConfig(topic_name="T", brokers=("broker-a",))}
    request = ps.PullRequest(
        group="G", queue=pb.MessageQueue(topic="T", broker_name="broker-a", queue_id=0), max_nums=1
    )
    async with MetaClient(meta_config) as meta:
        watcher = meta.broker_cache()
        brokers = RegisteredBrokers(watcher, grace_s=GRACE_S, monotonic_s=clock)
        await watcher.start()
        try:
            a = broker("broker-a")
            await (await meta.register(a)).close()
            await gone(watcher, "broker-a")
            assert check_pull(request, brokers.get, topics.get) == a
            clock.advance(GRACE_S)
            with pytest.raises(Refusal, match="broker 'broker-a' is not registered") as refusal:
                check_pull(request, brokers.get, topics.get)
            assert refusal.value.code == pb.RESPONSE_CODE_BROKER_NOT_EXIST
        finally:
            brokers.close()
            await watcher.close()
