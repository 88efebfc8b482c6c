"""The root's ``docker-compose.yml`` run for real: image built, cluster up, the SDK on the
host producing and consuming through the published ports, a restart keeping volumes.

**The image is built from the working tree every run**, under a tag of its own
(``basalt:test-<random>``, removed at the end): no image an earlier run or a
failed build left in the engine can stand in. The engine's cache keeps the
debootstrapped base and the build's layers between runs, nothing tagged. A
failed build fails the test with the build's last lines. Every step is judged
by its outcome as the engine reports it - the image present, each container
running and healthy (``docker inspect``), the project's containers and volumes
gone after ``down -v`` - not by compose's exit status alone.

**The one difference from what users run** is ``tests/deploy/compose.host.yml``:
the engine here has no bridge network (``dockerd --bridge=none``), so every
container uses host networking and listens on 127.0.0.1 at the port the main
file would publish it on (and etcd, run from the Basalt image here, gets a
tmpfs over that image's unused store volume). Everything else is the file users run: the same
image (built from the Dockerfile, on a debootstrapped Debian base instead of
``python:3.11-slim`` since no registry is reachable; etcd runs from it too,
through ``BASALT_ETCD_IMAGE``), the same healthchecks and ``depends_on``
conditions, the same named volumes.

The flow (~2-3 min on 2 cores with a warm cache; a first run also debootstraps
and installs the dependencies into the image): build; the image's ``basalt
--help`` runs; ``up -d --wait``; every container running and healthy; create
a topic through the admin service; produce 10,000 messages and consume 6,000
of them as a group; ``down`` (volumes kept); ``up -d --wait`` again and consume
the 4,000 left - the group's offsets and the messages survived; ``down -v``.
Then, on the same image (no second build), ``docker-compose.replicated.yml``
over it: broker-a a group of three (``tests/deploy/compose.replicated.host.yml``
is its members' host networking), every container healthy, ``basalt admin
clusterList`` from the host through the published etcd showing broker-a's
three members, a topic on broker-a alone taking 1,000 SYNC sends, then
clusterList showing one master and two slaves in sync, each holding the
master's whole CommitLog (one epoch, confirm offset = max offset on each), the
messages consumed back; ``down -v``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from basalt.client import (
    ConsumeFromWhere,
    LitePullConfig,
    LitePullConsumer,
    Message,
    NotEnoughReplicasError,
    Producer,
)
from basalt.services.cluster.etcd import free_port
from tests.support.docker import (
    COMPOSE_FILE,
    HOST_OVERRIDE,
    Compose,
    base_image,
    build_image,
    can_start_engine,
    docker_engine,
    engine_answers,
    image_exists,
    remove_image,
)
from tests.support.packaging import REPO, build_inputs
from tests.support.polling import eventually_sync
from tests.support.processes import run_basalt_sync

TOPIC = "ComposeTest"
GROUP = "compose-test-group"
MESSAGES = 10_000
FIRST_PART = 6_000
#: Each host port the stack uses, by the compose file's variable.
PORT_VARIABLES = (
    "BASALT_COMPOSE_ETCD_PORT",
    "BASALT_COMPOSE_ETCD_PEER_PORT",
    "BASALT_COMPOSE_STORE_NODE_A_PORT",
    "BASALT_COMPOSE_STORE_NODE_B_PORT",
    "BASALT_COMPOSE_STORE_NODE_A1_PORT",
    "BASALT_COMPOSE_STORE_NODE_A2_PORT",
    "BASALT_COMPOSE_PULL_SERVICE_PORT",
    "BASALT_COMPOSE_ROCKETMQ_V2_PORT",
    "BASALT_COMPOSE_ADMIN_SERVICE_PORT",
)
#: The file's services, each with a healthcheck.
SERVICES = ("etcd", "store-node-a", "store-node-b", "pull-service", "admin-service")
#: broker-a as a group of three: the override users add to the main file, and its
#: members' host networking for this machine's engine (as HOST_OVERRIDE for the rest).
REPLICATED_FILE = REPO / "docker-compose.replicated.yml"
REPLICATED_HOST_OVERRIDE = REPO / "tests" / "deploy" / "compose.replicated.host.yml"
REPLICATED_FILES = (COMPOSE_FILE, REPLICATED_FILE, HOST_OVERRIDE, REPLICATED_HOST_OVERRIDE)
#: The replicated stack's services: broker-a's members store-node-a (id 0), -a1, -a2.
REPLICATED_SERVICES = (*SERVICES, "store-node-a1", "store-node-a2")
REPLICATED_TOPIC = "ReplicatedComposeTest"
REPLICATED_MESSAGES = 1_000


@pytest.mark.parametrize(
    "files",
    [
        (COMPOSE_FILE,),
        (COMPOSE_FILE, HOST_OVERRIDE),
        (COMPOSE_FILE, REPLICATED_FILE),
        REPLICATED_FILES,
    ],
)
def test_compose_files_are_valid(files: tuple[Path, ...]) -> None:
    """``docker compose config -q``: what users run, alone and with the replicated
    override, and each with the test's overrides (no engine needed)."""
    Compose("basalt-config-check", {}, files=files).run("config", "-q")


def _config(files: tuple[Path, ...]) -> dict[str, Any]:
    """The services as compose resolves ``files`` (defaults in every variable)."""
    config = Compose("basalt-config-check", {}, files=files).run("config", "--format", "json")
    services: dict[str, Any] = json.loads(config)["services"]
    return services


@pytest.mark.parametrize(
    ("files", "names"),
    [((COMPOSE_FILE,), SERVICES), ((COMPOSE_FILE, REPLICATED_FILE), REPLICATED_SERVICES)],
)
def test_the_compose_file_builds_the_image_once(
    files: tuple[Path, ...], names: tuple[str, ...]
) -> None:
    """One service builds the image (never pulled under its name); every other Basalt
    service runs that tag as it is, so ``up`` builds once, not once per service."""
    services = _config(files)
    assert set(services) == set(names)
    builders = {name: s for name, s in services.items() if "build" in s}
    assert list(builders) == ["store-node-a"]
    (image,) = {s["image"] for s in builders.values()}
    assert builders["store-node-a"]["pull_policy"] == "build"
    for name in set(names) - {"etcd", "store-node-a"}:
        assert services[name]["image"] == image, name
        assert services[name]["pull_policy"] == "never", name


def test_the_replicated_file_makes_broker_a_a_group_of_three() -> None:
    """broker-a's three members: one broker name, ids 0, 1, 2, a volume and a published
    port each, SYNC with two in sync at least; broker-b stays a group of one (the
    store-node's defaults), and the pull-service waits for every member."""
    services = _config((COMPOSE_FILE, REPLICATED_FILE))
    members = {
        name: s["environment"] for name, s in services.items() if name.startswith("store-node-a")
    }
    assert sorted(members) == ["store-node-a", "store-node-a1", "store-node-a2"]
    assert sorted(env["BASALT_BROKER_ID"] for env in members.values()) == ["0", "1", "2"]
    for name, env in members.items():
        assert env["BASALT_NAME"] == "broker-a", name
        assert env["BASALT_REPLICA_ACK_MODE"] == "SYNC", name
        assert env["BASALT_MIN_IN_SYNC_REPLICAS"] == "2", name
        assert env["BASALT_ADVERTISE_ADDRESS"] == f"{name}:10911", name
        assert env["BASALT_HEALTH_ADDRESS"] == "127.0.0.1:10911", name
        assert services[name]["stop_grace_period"] == services["store-node-b"]["stop_grace_period"]
        assert services[name]["healthcheck"] == services["store-node-b"]["healthcheck"]
    volumes = {name: [v["source"] for v in services[name]["volumes"]] for name in members}
    assert volumes == {name: [name] for name in members}
    published = [p["published"] for name in members for p in services[name]["ports"]]
    clients = [env["BASALT_CLIENT_ADDRESS"].rpartition(":")[2] for env in members.values()]
    assert sorted(published) == sorted(clients) and len(set(published)) == 3
    b = services["store-node-b"]["environment"]
    assert b["BASALT_NAME"] == "broker-b"
    assert not {"BASALT_BROKER_ID", "BASALT_MIN_IN_SYNC_REPLICAS"} & set(b)
    assert set(services["pull-service"]["depends_on"]) == {
        "store-node-a",
        "store-node-a1",
        "store-node-a2",
        "store-node-b",
    }


def _image_tag() -> str:
    """A tag no earlier run used: a stale image cannot stand in for this run's build."""
    return f"basalt:test-{uuid.uuid4().hex[:12]}"


@contextlib.contextmanager
def _engine() -> Iterator[dict[str, str]]:
    if not engine_answers({}) and not can_start_engine():
        pytest.fail("no Docker engine answers and dockerd cannot be started (not root?)")
    with docker_engine() as engine:
        yield engine


@dataclass(frozen=True)
class Stack:
    compose: Compose
    #: The host ports, by the compose file's variable.
    ports: dict[str, str]
    #: This run's tag of the image the compose file builds.
    image: str
    #: The engine's environment (DOCKER_HOST).
    engine: dict[str, str]

    def replicated(self) -> Compose:
        """The same project and environment with docker-compose.replicated.yml over it."""
        return Compose(self.compose.project, self.compose.env, files=REPLICATED_FILES)


@pytest.fixture
def stack() -> Iterator[Stack]:
    """The compose project on free ports with an image tag of its own, on an engine that
    answers (started here if need be); at the end, whatever happened, ``down -v`` with
    the replicated files too (no container or volume of the project left, whichever
    files it ran with) and the image's tag removed, then the engine stops."""
    with _engine() as engine:
        ports = {name: str(free_port()) for name in PORT_VARIABLES}
        image = _image_tag()
        env = {
            **engine,
            **ports,
            "BASALT_IMAGE": image,
            "BASALT_BASE_IMAGE": base_image(engine),
            "BASALT_ETCD_IMAGE": image,
            # Debian's engine ships no buildx: the classic builder.
            "DOCKER_BUILDKIT": "0",
        }
        compose = Compose(f"basalt-test-{uuid.uuid4().hex[:8]}", env)
        stack = Stack(compose, ports, image, engine)
        try:
            yield stack
        finally:
            try:
                everything = stack.replicated()
                everything.run("down", "-v", "--remove-orphans", "--timeout", "30")
                assert everything.states() == {}
                assert everything.volumes() == []
            finally:
                remove_image(image, engine)


def _assert_all_healthy(compose: Compose, services: tuple[str, ...] = SERVICES) -> None:
    """Every service's container running and healthy, as the engine reports it."""
    states = compose.states()
    assert states == {name: ("running", "healthy") for name in services}, states


def _docker_run(engine: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["docker", "run", "--rm", "--network", "host", *argv],
        env={**os.environ, **engine},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


async def _produce(
    endpoints: str,
    topic: str = TOPIC,
    count: int = MESSAGES,
    *,
    first: int = 0,
    broker: str | None = None,
) -> None:
    """Messages ``m-<first>`` .. ``m-<count - 1>`` to ``topic`` in batches of 100,
    each answered SEND_OK (under SYNC: on every in-sync member), by ``broker`` when
    one is named."""
    async with Producer(endpoints, group="compose-test-producer") as producer:
        for start in range(first, count, 100):
            batch = [
                Message(topic, f"m-{i}".encode(), keys=(f"k-{i}",))
                for i in range(start, start + 100)
            ]
            results = await producer.send_batch(batch)
            assert all(r.ok for r in results), [r.status for r in results if not r.ok]
            if broker is not None:
                assert {r.broker_name for r in results} == {broker}


async def _consume(
    endpoints: str, count: int, *, then_nothing: bool, topic: str = TOPIC
) -> list[str]:
    """``count`` bodies of ``topic`` read as GROUP from its committed offsets,
    committed on close; with ``then_nothing``, a further poll must find none."""
    config = LitePullConfig(
        consumer_group=GROUP, consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET
    )
    bodies: list[str] = []
    async with LitePullConsumer(endpoints, config=config) as consumer:
        await consumer.assign(await consumer.queues_of(topic))
        while len(bodies) < count:
            records = await consumer.poll(timeout_ms=10_000, max_records=count - len(bodies))
            assert records, f"nothing more after {len(bodies)} of {count}"
            bodies += [r.body.decode() for r in records]
        if then_nothing:
            assert await consumer.poll(timeout_ms=1000) == []
    return bodies


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_compose_cluster_serves_the_sdk_and_survives_down_and_up(stack: Stack) -> None:
    compose, ports = stack.compose, stack.ports
    endpoints = f"127.0.0.1:{ports['BASALT_COMPOSE_PULL_SERVICE_PORT']}"
    admin = f"127.0.0.1:{ports['BASALT_COMPOSE_ADMIN_SERVICE_PORT']}"
    assert not image_exists(stack.image, stack.engine)
    compose.run("build")  # the working tree, now; its last lines if it fails
    assert image_exists(stack.image, stack.engine), "compose build left no image"
    shown = _docker_run(stack.engine, stack.image, "--help")
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert shown.stdout.startswith("usage: basalt"), shown.stdout
    for group in ("store-node", "pull-service", "admin-service", "produce", "cluster"):
        assert group in shown.stdout, group

    compose.run("up", "-d", "--wait", "--no-build")
    _assert_all_healthy(compose)

    created = run_basalt_sync("admin", "updateTopic", "--server", admin, "-t", TOPIC, "-w", "4")
    assert created.returncode == 0, created.stderr
    assert "broker-a,broker-b" in created.stdout, created.stdout
    asyncio.run(_produce(endpoints))
    first = asyncio.run(_consume(endpoints, FIRST_PART, then_nothing=False))

    compose.run("down", "--timeout", "30")  # the named volumes stay
    assert compose.states() == {}
    assert len(compose.volumes()) == 3
    compose.run("up", "-d", "--wait", "--no-build")
    _assert_all_healthy(compose)
    rest = asyncio.run(_consume(endpoints, MESSAGES - FIRST_PART, then_nothing=True))

    assert len(set(first)) == FIRST_PART
    assert sorted(first + rest) == sorted(f"m-{i}" for i in range(MESSAGES))

    compose.run("down", "-v", "--timeout", "30")
    assert compose.states() == {} and compose.volumes() == []
    _replicated_broker_a(stack, endpoints, admin)


def _cluster_list(etcd: str) -> list[dict[str, Any]]:
    """``basalt admin clusterList --json`` from the host, through the published etcd."""
    done = run_basalt_sync("admin", "clusterList", "--etcd", etcd, "--json")
    assert done.returncode == 0, done.stderr
    rows: list[dict[str, Any]] = json.loads(done.stdout)
    return rows


def _broker_a(etcd: str) -> list[dict[str, Any]]:
    return [r for r in _cluster_list(etcd) if r["broker"] == "broker-a"]


def _one_master_two_slaves_in_sync(rows: list[dict[str, Any]]) -> bool:
    return sorted((r["role"], r["in_sync"]) for r in rows) == [
        ("MASTER", "yes"),
        ("SLAVE", "yes"),
        ("SLAVE", "yes"),
    ]


def _replicated_broker_a(stack: Stack, endpoints: str, admin: str) -> None:
    """docker-compose.replicated.yml on the image already built: broker-a's three
    members come up healthy and in sync, SYNC sends succeed, and every member ends
    with the master's whole log, confirmed."""
    replicated = stack.replicated()
    etcd = f"127.0.0.1:{stack.ports['BASALT_COMPOSE_ETCD_PORT']}"
    replicated.run("up", "-d", "--wait", "--no-build")
    _assert_all_healthy(replicated, REPLICATED_SERVICES)

    # Every member registered in etcd, one of them master. (Whether the slaves are
    # in sync yet is checked once the group is busy, below: an idle group's slaves
    # ack nothing and leave the in-sync set, see first_batch_taken.)
    def registered() -> bool:
        rows = _broker_a(etcd)
        return (
            sorted(r["id"] for r in rows) == [0, 1, 2]
            and [r["role"] for r in rows].count("MASTER") == 1
            and "(not registered)" not in {r["address"] for r in rows}
        )

    eventually_sync(
        registered,
        timeout_s=60,
        interval_s=0.5,
        what="clusterList: broker-a's members registered",
    )
    created = run_basalt_sync(
        "admin", "updateTopic", "--server", admin, "-t", REPLICATED_TOPIC, "-w", "4", "-b",
        "broker-a",
    )  # fmt: skip
    assert created.returncode == 0, created.stderr

    def first_batch_taken() -> bool:
        # An idle group's slaves ack nothing, so the master drops them from the
        # in-sync set after ha_max_time_slave_not_catchup_ms and they rejoin at
        # their next ack: broker-a may refuse a send, writing nothing, until it is
        # busy (reported; the test asserts the rest, sent while it is).
        try:
            asyncio.run(_produce(endpoints, REPLICATED_TOPIC, 100, broker="broker-a"))
        except NotEnoughReplicasError:
            return False
        return True

    eventually_sync(
        first_batch_taken, timeout_s=60, interval_s=0.5, what="broker-a takes a SYNC send"
    )
    asyncio.run(
        _produce(endpoints, REPLICATED_TOPIC, REPLICATED_MESSAGES, first=100, broker="broker-a")
    )

    def every_member_has_the_whole_log() -> bool:
        rows = _broker_a(etcd)
        # One epoch, one max offset and that offset confirmed, on all three.
        figures = {(r["epoch"], r["max_offset"], r["confirm_offset"]) for r in rows}
        if not _one_master_two_slaves_in_sync(rows) or len(figures) != 1:
            return False
        [(_, max_offset, confirm_offset)] = figures
        return isinstance(max_offset, int) and max_offset > 0 and confirm_offset == max_offset

    # The members report their offsets to etcd every few hundred ms.
    eventually_sync(
        every_member_has_the_whole_log,
        timeout_s=60,
        interval_s=0.5,
        what="broker-a's members all at the master's max offset, confirmed",
    )
    bodies = asyncio.run(
        _consume(endpoints, REPLICATED_MESSAGES, then_nothing=True, topic=REPLICATED_TOPIC)
    )
    assert sorted(bodies) == sorted(f"m-{i}" for i in range(REPLICATED_MESSAGES))


def _git_files(paths: list[str]) -> set[str]:
    done = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", *paths],
        cwd=REPO,
        capture_output=True,
        check=True,
        timeout=60,
    )
    return {p for p in done.stdout.decode().split("\0") if p and (REPO / p).is_file()}


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_the_image_build_stage_holds_exactly_the_source_the_wheel_is_built_from() -> None:
    """A real build's context, as Docker applied .dockerignore: the build stage's /src
    holds every file of the wheel's inputs (setup.py's PACKAGE_ROOT and SOURCE_FOLDERS,
    pyproject.toml, setup.py, the readme) and nothing else but what ``pip wheel`` wrote
    there (build/, *.egg-info). The stage's layers are those the compose test built."""
    with _engine() as engine:
        image = _image_tag() + "-build-stage"
        try:
            build_image(image, engine, base_image=base_image(engine), target="build")
            listed = _docker_run(engine, "--entrypoint", "find", image, "/src", "-type", "f")
            assert listed.returncode == 0, listed.stderr
        finally:
            remove_image(image, engine, prune=False)  # its steps are the build's cache
    in_image = {p.removeprefix("/src/") for p in listed.stdout.split()}
    written_by_the_build = {
        p for p in in_image if p.startswith("build/") or p.split("/")[0].endswith(".egg-info")
    }
    assert in_image - written_by_the_build == _git_files(build_inputs())
