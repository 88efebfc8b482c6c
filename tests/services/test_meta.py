"""The etcd metadata layer against real etcd processes: values, CRUD, CAS, caches,
leases, a killed registrant, and an etcd outage."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace

import pytest

from basalt.services.cluster.etcd import EtcdProcess, free_port
from basalt.services.meta import (
    BrokerRegistration,
    ConsumerRegistration,
    ExpressionType,
    MetaChange,
    MetaClient,
    MetaConfig,
    MetaConflictError,
    MetaUnavailableError,
    MetaValidationError,
    Perm,
    PullServiceRegistration,
    Subscription,
    TopicConfig,
    TopicExistsError,
    TopicNotFoundError,
    parse_endpoints,
)
from basalt.services.meta.session import EtcdSession
from tests.support.aio import async_test
from tests.support.etcd import unique_cluster
from tests.support.polling import eventually
from tests.support.processes import REPO_ROOT
from tests.support.timeouts import SUBPROCESS_TEST_TIMEOUT_S, SUBPROCESS_TIMEOUT_S


def broker(name: str = "broker-a", **overrides: object) -> BrokerRegistration:
    values: dict[str, object] = {
        "broker_name": name,
        "address": "127.0.0.1:10911",
        "store_root_id": f"root-{name}",
        "started_at_ms": 1_700_000_000_000,
    }
    values.update(overrides)
    return BrokerRegistration(**values)  # type: ignore[arg-type]


def raw_value(etcd: EtcdProcess, key: str) -> str:
    return etcd.etcdctl("get", key, "--print-value-only").strip()


# -- values and validation (no etcd) ---------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"topic_name": ""}, "is not 1-127 characters"),
        ({"topic_name": "a/b"}, "is not 1-127 characters"),
        ({"topic_name": "has space"}, "is not 1-127 characters"),
        ({"topic_name": "t" * 128}, "is not 1-127 characters"),
        ({"read_queue_nums": 0}, "read_queue_nums must be 1..1024"),
        ({"write_queue_nums": 1025}, "write_queue_nums must be 1..1024"),
        ({"write_queue_nums": True}, "write_queue_nums must be an integer"),
        ({"perm": 16}, "perm must be RocketMQ PermName bits"),
        ({"perm": -1}, "perm must be RocketMQ PermName bits"),
        ({"perm": "X"}, "perm must be RW, R, W, DENY"),
        ({"brokers": ("b", "b")}, "lists a name twice"),
        ({"brokers": ("a/b",)}, "broker name 'a/b'"),
        ({"brokers": "broker-a"}, "brokers must be a list"),
        ({"filter": "SQL"}, "'SQL' is not a valid TopicFilterType"),
        ({"order": "yes"}, "order must be true or false"),
    ],
)
def test_invalid_topic_configs_are_rejected(fields: dict[str, object], message: str) -> None:
    values: dict[str, object] = {"topic_name": "T", **fields}
    with pytest.raises(MetaValidationError, match=message):
        TopicConfig(**values)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"{", "topics/T: value is not JSON"),
        (b"[1]", "topics/T: value must be a JSON object"),
        (b'{"topic_name":"T","write_queue_nums":4,"perm":6}', "'read_queue_nums' is missing"),
        (
            b'{"topic_name":"T","read_queue_nums":"4","write_queue_nums":4,"perm":6}',
            "'read_queue_nums' must be an integer",
        ),
        (
            b'{"topic_name":"U","read_queue_nums":4,"write_queue_nums":4,"perm":6}',
            "'topic_name' is 'U' but the key says 'T'",
        ),
        (
            b'{"read_queue_nums":4,"write_queue_nums":0,"perm":6}',
            "topics/T: topic 'T': write_queue_nums must be 1..1024",
        ),
        (
            b'{"read_queue_nums":4,"write_queue_nums":4,"perm":6,"brokers":[1]}',
            "'brokers' must be a list of strings",
        ),
    ],
)
def test_malformed_topic_json_is_rejected(raw: bytes, message: str) -> None:
    with pytest.raises(MetaValidationError, match=message):
        TopicConfig.from_json(raw, topic_name="T")


def test_perm_is_rocketmq_permname() -> None:
    assert (int(Perm.RW), int(Perm.READ), int(Perm.WRITE), int(Perm.DENY)) == (6, 4, 2, 0)
    assert Perm.parse("rw") is Perm.RW and Perm.parse("R") is Perm.READ
    assert Perm.parse("deny") is Perm.DENY and Perm.parse("6") is Perm.RW
    assert Perm.parse(6).readable and Perm.parse(6).writable
    assert not Perm.parse(4).writable and not Perm.parse(2).readable
    config = TopicConfig(topic_name="T", perm=4)  # type: ignore[arg-type]
    assert config.perm is Perm.READ and config.readable and not config.writable


def test_json_shapes() -> None:
    topic = TopicConfig(
        topic_name="T", read_queue_nums=8, write_queue_nums=4, brokers=("b1", "b2"), order=True
    )
    assert json.loads(topic.to_json()) == {
        "topic_name": "T",
        "read_queue_nums": 8,
        "write_queue_nums": 4,
        "perm": 6,
        "brokers": ["b1", "b2"],
        "order": True,
        "filter": "SINGLE_TAG",
    }
    assert TopicConfig.from_json(topic.to_json(), topic_name="T") == topic
    # Only the three counts are required; newer fields from newer writers are ignored.
    minimal = b'{"read_queue_nums":2,"write_queue_nums":2,"perm":4,"future":1}'
    assert TopicConfig.from_json(minimal, topic_name="T") == TopicConfig(
        topic_name="T", read_queue_nums=2, write_queue_nums=2, perm=Perm.READ
    )

    b = broker(perm=Perm.READ)
    assert json.loads(b.to_json()) == {
        "broker_name": "broker-a",
        "address": "127.0.0.1:10911",
        "store_root_id": "root-broker-a",
        "started_at_ms": 1_700_000_000_000,
        "perm": 4,
    }
    assert BrokerRegistration.from_json(b.to_json(), broker_name="broker-a") == b

    p = PullServiceRegistration(pull_service_id="pull-1", address="[::1]:8081", started_at_ms=5)
    assert json.loads(p.to_json()) == {
        "pull_service_id": "pull-1",
        "address": "[::1]:8081",
        "started_at_ms": 5,
    }
    assert PullServiceRegistration.from_json(p.to_json(), pull_service_id="pull-1") == p

    c = ConsumerRegistration(
        group="G",
        client_id="10.0.0.5@4242",
        pull_service_id="pull-1",
        subscriptions=(
            Subscription(topic="T", expression="a || b"),
            Subscription(topic="U", expression_type=ExpressionType.SQL92, expression="x > 1"),
        ),
        client_version="basalt-py/0.1.0",
        connected_since_ms=1_700_000_000_000,
    )
    assert json.loads(c.to_json()) == {
        "group": "G",
        "client_id": "10.0.0.5@4242",
        "pull_service_id": "pull-1",
        "subscriptions": [
            {"topic": "T", "expression_type": "TAG", "expression": "a || b"},
            {"topic": "U", "expression_type": "SQL92", "expression": "x > 1"},
        ],
        "client_version": "basalt-py/0.1.0",
        "connected_since_ms": 1_700_000_000_000,
    }
    assert ConsumerRegistration.from_json(c.to_json(), group="G", client_id="10.0.0.5@4242") == c
    assert c.key_suffix() == "consumers/G/10.0.0.5@4242"
    # A registration written before connected_since_ms existed: 0, unknown.
    older = b'{"group":"G","client_id":"c","pull_service_id":"pull-1"}'
    assert ConsumerRegistration.from_json(older, group="G", client_id="c").connected_since_ms == 0


def test_invalid_registrations_and_config_are_rejected() -> None:
    with pytest.raises(MetaValidationError, match="broker name 'a/b'"):
        broker("a/b")
    with pytest.raises(MetaValidationError, match="address must be host:port"):
        broker(address="localhost")
    with pytest.raises(MetaValidationError, match="started_at_ms must be epoch millis"):
        broker(started_at_ms=-1)
    with pytest.raises(MetaValidationError, match="group 'G/x'"):
        ConsumerRegistration(group="G/x", client_id="c", pull_service_id="p")
    for since in (-1, True, "1"):
        with pytest.raises(MetaValidationError, match="G/c: connected_since_ms must be epoch"):
            ConsumerRegistration(
                group="G",
                client_id="c",
                pull_service_id="p",
                connected_since_ms=since,  # type: ignore[arg-type]
            )
    with pytest.raises(MetaValidationError, match=r"consumers/G/c: .*connected_since_ms"):
        ConsumerRegistration.from_json(
            b'{"pull_service_id":"p","connected_since_ms":-5}', group="G", client_id="c"
        )
    with pytest.raises(MetaValidationError, match="expression_type must be TAG or SQL92"):
        Subscription(topic="T", expression_type="REGEX")  # type: ignore[arg-type]
    with pytest.raises(MetaValidationError, match="etcd endpoint must be host:port"):
        MetaConfig(endpoints=("nohost",))
    with pytest.raises(MetaValidationError, match="lease_ttl_s must be at least 2"):
        MetaConfig(lease_ttl_s=1)
    with pytest.raises(MetaValidationError, match="cluster name"):
        MetaConfig(cluster="a/b")
    assert parse_endpoints("http://a:1, b:2/") == ("a:1", "b:2")
    assert MetaConfig(endpoints="a:1,b:2").endpoints == ("a:1", "b:2")  # type: ignore[arg-type]


# -- topics: CRUD and compare-and-swap ---------------------------------------------------


@async_test
async def test_topic_crud_and_key_layout(meta_config: MetaConfig, etcd: EtcdProcess) -> None:
    async with MetaClient(meta_config) as meta:
        created = await meta.create_topic(TopicConfig(topic_name="T", brokers=("b1",)))
        key = f"/basalt/{meta_config.cluster}/topics/T"
        assert meta.keys.topic("T") == key
        assert json.loads(raw_value(etcd, key)) == json.loads(created.to_json())
        assert await meta.get_topic("T") == created
        assert await meta.get_topic("missing") is None
        with pytest.raises(TopicExistsError, match="topic 'T' already exists"):
            await meta.create_topic(TopicConfig(topic_name="T"))

        await meta.create_topic(TopicConfig(topic_name="U", perm=Perm.READ))
        assert sorted(await meta.list_topics()) == ["T", "U"]

        updated = await meta.update_topic("T", lambda c: replace(c, write_queue_nums=4))
        assert updated.write_queue_nums == 4 and updated.read_queue_nums == 16
        assert await meta.get_topic("T") == updated
        with pytest.raises(TopicNotFoundError, match="topic 'nope' does not exist"):
            await meta.update_topic("nope", lambda c: c)
        with pytest.raises(MetaValidationError, match="may not rename"):
            await meta.update_topic("T", lambda c: replace(c, topic_name="V"))

        assert await meta.delete_topic("T") is True
        assert await meta.delete_topic("T") is False
        assert await meta.get_topic("T") is None
        # A malformed value is reported on a direct read and skipped by listings.
        etcd.etcdctl("put", meta.keys.topic("Bad"), "{oops")
        with pytest.raises(MetaValidationError, match="topics/Bad: value is not JSON"):
            await meta.get_topic("Bad")
        assert sorted(await meta.list_topics()) == ["U"]


@async_test
async def test_a_listing_comes_in_pages_of_one_revision(
    meta_config: MetaConfig, etcd: EtcdProcess
) -> None:
    """A prefix is listed in Range pages (one answer for 20,000 topics passed gRPC's
    4 MiB limit and the topic cache never loaded), all at the first page's revision."""
    session = EtcdSession(meta_config)
    try:
        prefix = f"/basalt/{meta_config.cluster}/paged/"
        big = b"v" * 1_000_000  # five of them are past one gRPC message's default 4 MiB
        for i in range(5):
            await session.put(f"{prefix}{i}", big)
        await session.put(f"/basalt/{meta_config.cluster}/paged0", b"not under the prefix")
        revision, kvs = await session.get_prefix(prefix, page_keys=2)
        assert [kv.key for kv in kvs] == [f"{prefix}{i}" for i in range(5)]
        assert all(kv.value == big for kv in kvs)
        assert revision == max(kv.mod_revision for kv in kvs) + 1  # the unrelated put
        whole_revision, whole = await session.get_prefix(prefix)
        assert (whole_revision, whole) == (revision, kvs)
        with pytest.raises(ValueError, match="page_keys must be at least 1"):
            await session.get_prefix(prefix, page_keys=0)
    finally:
        await session.close()


def with_queues(c: TopicConfig, write: int) -> TopicConfig:
    return replace(c, write_queue_nums=write)


@async_test
async def test_cas_retries_after_a_concurrent_write_without_losing_it(
    meta_config: MetaConfig, etcd: EtcdProcess
) -> None:
    async with MetaClient(meta_config) as meta:
        await meta.create_topic(TopicConfig(topic_name="T"))
        calls = 0

        def change(c: TopicConfig) -> TopicConfig:
            nonlocal calls
            calls += 1
            if calls == 1:
                # Another admin writes between our read and our write.
                other = replace(c, order=True)
                etcd.etcdctl("put", meta.keys.topic("T"), other.to_json().decode())
            return with_queues(c, 4)

        result = await meta.update_topic("T", change)
        assert calls == 2 and meta.cas_conflicts == 1
        # Both writes survive: the other admin's order flag and our queue count.
        assert result.order and result.write_queue_nums == 4
        assert await meta.get_topic("T") == result


@async_test
async def test_cas_exhaustion_raises_a_clear_conflict(
    meta_config: MetaConfig, etcd: EtcdProcess
) -> None:
    config = MetaConfig(
        endpoints=meta_config.endpoints, cluster=meta_config.cluster, max_cas_attempts=3
    )
    async with MetaClient(config) as meta:
        await meta.create_topic(TopicConfig(topic_name="T"))
        interfering = TopicConfig(topic_name="T", order=True)

        def change(c: TopicConfig) -> TopicConfig:
            etcd.etcdctl("put", meta.keys.topic("T"), interfering.to_json().decode())
            return with_queues(c, 4)

        with pytest.raises(MetaConflictError, match="modified concurrently on each of 3 attempts"):
            await meta.update_topic("T", change)
        assert await meta.get_topic("T") == interfering


@async_test
async def test_concurrent_updaters_lose_no_update(meta_config: MetaConfig) -> None:
    async with MetaClient(meta_config) as a, MetaClient(meta_config) as b:
        await a.create_topic(TopicConfig(topic_name="T"))
        names = [f"b{i}" for i in range(16)]
        # All read the same revision first, so most lose a race and must retry.
        await asyncio.gather(
            *(
                (a if i % 2 else b).update_topic("T", lambda c, n=n: c.with_broker(n))
                for i, n in enumerate(names)
            )
        )
        final = await a.get_topic("T")
        assert final is not None and sorted(final.brokers) == sorted(names)
        assert a.cas_conflicts + b.cas_conflicts > 0


@async_test
async def test_ensure_topic_auto_creates_and_adds_brokers(meta_config: MetaConfig) -> None:
    async with MetaClient(meta_config) as meta:
        created = await meta.ensure_topic("Auto", broker="b1")
        assert created == TopicConfig(
            topic_name="Auto", read_queue_nums=4, write_queue_nums=4, brokers=("b1",)
        )
        assert await meta.ensure_topic("Auto", broker="b1") == created
        # Three store-nodes receive their first send at once.
        results = await asyncio.gather(
            *(meta.ensure_topic("Race", broker=f"n{i}", default_queue_nums=2) for i in range(3))
        )
        final = await meta.get_topic("Race")
        assert final is not None and sorted(final.brokers) == ["n0", "n1", "n2"]
        assert final.write_queue_nums == 2 and all(r.topic_name == "Race" for r in results)
        with pytest.raises(MetaValidationError):
            await meta.ensure_topic("bad topic", broker="b1")


# -- watch caches ----------------------------------------------------------------------------


@async_test
async def test_topic_cache_follows_changes_within_a_second(
    meta_config: MetaConfig, etcd: EtcdProcess
) -> None:
    async with MetaClient(meta_config) as admin, MetaClient(meta_config) as service:
        await admin.create_topic(TopicConfig(topic_name="T", read_queue_nums=8, write_queue_nums=8))
        cache = service.topic_cache()
        changes: list[MetaChange[TopicConfig]] = []
        cache.subscribe(changes.append)
        await cache.start()
        assert cache.synced and cache.available
        before = cache.get("T")
        assert before is not None and before.write_queue_nums == 8
        assert [c.name for c in changes] == ["T"] and changes[0].old is None

        started = time.monotonic()
        await admin.update_topic("T", lambda c: with_queues(c, 4))
        assert await cache.wait_until(lambda s: s["T"].write_queue_nums == 4, timeout_s=1.0)
        assert time.monotonic() - started < 1.0
        assert changes[-1].old == before and changes[-1].new == cache.get("T")

        waiter = asyncio.ensure_future(cache.wait_changed(timeout_s=1.0))
        await asyncio.sleep(0)
        await admin.create_topic(TopicConfig(topic_name="New"))
        assert await waiter and "New" in cache
        await admin.delete_topic("T")
        assert await cache.wait_until(lambda s: "T" not in s, timeout_s=1.0)
        assert changes[-1].new is None and changes[-1].name == "T"

        # A hand-edited bad value is ignored; the last good value keeps serving.
        good = cache.get("New")
        etcd.etcdctl("put", admin.keys.topic("New"), '{"read_queue_nums": 0}')
        await admin.create_topic(TopicConfig(topic_name="After"))
        assert await cache.wait_until(lambda s: "After" in s, timeout_s=1.0)
        assert cache.get("New") == good
        assert set(cache.snapshot()) == {"New", "After"}


@async_test
async def test_consumer_and_broker_caches(meta_config: MetaConfig) -> None:
    async with MetaClient(meta_config) as pull, MetaClient(meta_config) as admin:
        brokers = admin.broker_cache()
        consumers = admin.consumer_cache("G")
        await brokers.start()
        await consumers.start()
        reg = await pull.register(broker("broker-a"))
        c1 = ConsumerRegistration(group="G", client_id="c1", pull_service_id="p1")
        await pull.register(c1)
        await pull.register(ConsumerRegistration(group="H", client_id="c2", pull_service_id="p1"))
        assert await consumers.wait_until(lambda s: set(s) == {"c1"}, timeout_s=1.0)
        assert await brokers.wait_until(lambda s: "broker-a" in s, timeout_s=1.0)
        assert (await admin.list_consumers("G")) == {"c1": c1}

        await reg.update(broker("broker-a", perm=Perm.READ))
        assert await brokers.wait_until(lambda s: s["broker-a"].perm is Perm.READ, timeout_s=1.0)
        with pytest.raises(ValueError, match="cannot take a value"):
            await reg.update(broker("broker-b"))

        await reg.close()  # a clean shutdown removes the registration at once
        assert await brokers.wait_until(lambda s: "broker-a" not in s, timeout_s=1.0)
        assert await admin.list_brokers() == {}


# -- leases -----------------------------------------------------------------------------------


@async_test
async def test_registration_is_leased_and_comes_back_after_lease_loss(
    meta_config: MetaConfig, etcd: EtcdProcess
) -> None:
    async with MetaClient(meta_config) as meta:
        pull = PullServiceRegistration(pull_service_id="pull-1", address="127.0.0.1:8081")
        reg = await meta.register(pull, ttl_s=3)
        key = f"/basalt/{meta_config.cluster}/pull-services/pull-1"
        assert reg.key == key and reg.alive and reg.lease_id
        assert json.loads(raw_value(etcd, key)) == json.loads(pull.to_json())
        assert await meta.list_pull_services() == {"pull-1": pull}

        # The lease vanishes behind the registrant's back (as when etcd was cut
        # off from it for longer than the TTL): it grants a new one and re-puts.
        old_lease = reg.lease_id
        etcd.etcdctl("lease", "revoke", f"{old_lease:x}")
        assert raw_value(etcd, key) == ""
        await eventually(lambda: _has(meta, "pull-1"), timeout_s=3.0)
        assert reg.lease_id != old_lease and reg.alive


async def _has(meta: MetaClient, pull_id: str) -> bool:
    return pull_id in await meta.list_pull_services()


CHILD = """
import asyncio, sys
from basalt.services.meta import BrokerRegistration, MetaClient, MetaConfig

async def main() -> None:
    meta = MetaClient(MetaConfig(endpoints=(sys.argv[1],), cluster=sys.argv[2], lease_ttl_s=2))
    await meta.register(BrokerRegistration(
        broker_name="doomed", address="127.0.0.1:10911", store_root_id="r", started_at_ms=1))
    print("REGISTERED", flush=True)
    await asyncio.sleep(3600)

asyncio.run(main())
"""


@pytest.mark.slow
@async_test(timeout_s=SUBPROCESS_TEST_TIMEOUT_S)
async def test_killed_registrant_disappears_within_its_ttl(meta_config: MetaConfig) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, meta_config.endpoints[0], meta_config.cluster],
        stdout=subprocess.PIPE,
        cwd=REPO_ROOT,
        env=env,
    )
    try:
        assert child.stdout is not None
        line = await asyncio.wait_for(
            asyncio.to_thread(child.stdout.readline), SUBPROCESS_TIMEOUT_S
        )
        assert line.strip() == b"REGISTERED"
        async with MetaClient(meta_config) as meta:
            assert "doomed" in await meta.list_brokers()
            # Alive for several TTLs: the child's keepalives hold it.
            await asyncio.sleep(2.5)
            assert "doomed" in await meta.list_brokers()
            os.kill(child.pid, signal.SIGKILL)
            child.wait()
            took = await eventually(lambda: _gone(meta), timeout_s=4.0)
            # TTL 2 s, plus etcd's 0.5 s expiry sweep, plus slack for a busy machine.
            assert took < 3.5
    finally:
        child.kill()
        child.wait()
        if child.stdout is not None:
            child.stdout.close()


async def _gone(meta: MetaClient) -> bool:
    return "doomed" not in await meta.list_brokers()


# -- etcd unreachable --------------------------------------------------------------------------


@async_test
async def test_unreachable_etcd_fails_writes_clearly_and_fast() -> None:
    dead = f"127.0.0.1:{free_port()}"
    meta = MetaClient(MetaConfig(endpoints=(dead,), cluster=unique_cluster(), op_timeout_s=2.0))
    try:
        started = time.monotonic()
        with pytest.raises(MetaUnavailableError, match=f"etcd at {dead} unreachable"):
            await meta.create_topic(TopicConfig(topic_name="T"))
        with pytest.raises(MetaUnavailableError):
            await meta.register(broker())
        assert time.monotonic() - started < 5
    finally:
        await meta.close()


@async_test
async def test_fails_over_to_the_next_endpoint(etcd: EtcdProcess) -> None:
    dead = f"127.0.0.1:{free_port()}"
    config = MetaConfig(endpoints=(dead, etcd.endpoint), cluster=unique_cluster())
    async with MetaClient(config) as meta:
        await meta.create_topic(TopicConfig(topic_name="T"))
        assert await meta.get_topic("T") is not None


@pytest.mark.slow
@async_test
async def test_etcd_outage_cache_serves_writes_fail_then_everything_returns(
    private_etcd: EtcdProcess,
) -> None:
    etcd = private_etcd
    config = MetaConfig(
        endpoints=(etcd.endpoint,), cluster=unique_cluster(), lease_ttl_s=2, op_timeout_s=1.0
    )
    async with MetaClient(config) as meta, MetaClient(config) as admin:
        await admin.create_topic(TopicConfig(topic_name="T", write_queue_nums=8))
        await admin.create_topic(TopicConfig(topic_name="Gone"))
        cache = meta.topic_cache()
        await cache.start()
        reg = await meta.register(broker("broker-a"))

        await asyncio.to_thread(etcd.stop)
        # Past the lease TTL: etcd keeps leases across restarts, the keepalives resume.
        outage_end = time.monotonic() + 3.0
        while time.monotonic() < outage_end:
            config_now = cache.get("T")
            assert config_now is not None and config_now.write_queue_nums == 8
            await asyncio.sleep(0.2)
        # The cache and the registration both know etcd is gone.
        await eventually(lambda: not cache.available and not reg.alive)
        assert set(cache.snapshot()) == {"T", "Gone"}
        with pytest.raises(MetaUnavailableError, match=f"etcd at {etcd.endpoint} unreachable"):
            await admin.update_topic("T", lambda c: with_queues(c, 4))
        with pytest.raises(MetaUnavailableError, match="unreachable"):
            await admin.create_topic(TopicConfig(topic_name="U"))
        # A session opened while etcd is away registers once it is back.
        late = await meta.register(
            PullServiceRegistration(pull_service_id="late", address="127.0.0.1:8081"), wait=False
        )
        assert not late.alive

        await asyncio.to_thread(etcd.start)
        # Changes made after the restart, deletes included, reach the cache.
        await eventually(
            lambda: _try(admin.update_topic("T", lambda c: with_queues(c, 4))), timeout_s=5.0
        )
        await admin.delete_topic("Gone")
        assert await cache.wait_until(
            lambda s: s["T"].write_queue_nums == 4 and "Gone" not in s, timeout_s=3.0
        )
        assert cache.available
        await eventually(lambda: _alive(reg), timeout_s=3.0)
        assert "broker-a" in await admin.list_brokers()
        assert await late.wait_registered(timeout_s=3.0)
        assert "late" in await admin.list_pull_services()


async def _try(coro) -> bool:  # type: ignore[no-untyped-def]
    try:
        await coro
    except MetaUnavailableError:
        return False
    return True


async def _alive(reg) -> bool:  # type: ignore[no-untyped-def]
    return bool(reg.alive)


def test_a_client_address_round_trips_and_old_records_load_without_one() -> None:
    b = BrokerRegistration(
        broker_name="broker-a",
        address="10.0.0.5:10911",
        client_address="broker-a.example.com:30911",
        store_root_id="r",
        started_at_ms=1,
    )
    assert BrokerRegistration.from_json(b.to_json()) == b
    old = (
        b'{"broker_name":"broker-a","address":"10.0.0.5:10911",'
        b'"store_root_id":"r","started_at_ms":1}'
    )
    assert BrokerRegistration.from_json(old).client_address == ""
    p = PullServiceRegistration(
        pull_service_id="ps-1", address="10.0.0.6:8081", client_address="ps.example.com:443"
    )
    assert PullServiceRegistration.from_json(p.to_json()) == p


@async_test
async def test_an_etcd_call_cancelled_in_the_turn_it_is_answered_still_raises_cancelled(
    meta_config: MetaConfig, etcd: EtcdProcess
) -> None:
    """Every etcd call runs under its deadline in the caller's task: a cancel
    that comes in the loop turn the answer does (a stop cancelling a reporter
    as its put returns) reaches the caller. Python 3.11's ``wait_for`` returned
    the answer and dropped the cancel there, and the stop waited forever on a
    task that went on looping."""
    session = EtcdSession(meta_config)
    try:
        await session.put(f"/basalt/{meta_config.cluster}/answered", b"v")
        answer: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        asked = asyncio.Event()

        async def op(client: object) -> bytes:
            asked.set()
            return await answer

        call = asyncio.create_task(session._call("get answered", op))
        await asked.wait()
        answer.set_result(b"v")  # answered ...
        call.cancel()  # ... and cancelled in the same turn
        with pytest.raises(asyncio.CancelledError):
            await call
        assert call.cancelled()
    finally:
        await session.close()
