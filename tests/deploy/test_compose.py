"""The root's ``docker-compose.yml`` run for real: image built, cluster up, the SDK on the
host producing and consuming through the published ports, a restart keeping volumes.

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
and installs the dependencies into the image): build; ``up -d --wait``; create
a topic through the admin service; produce 10,000 messages and consume 6,000
of them as a group; ``down`` (volumes kept); ``up -d --wait`` again and consume
the 4,000 left - the group's offsets and the messages survived; ``down -v``.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from basalt.client import ConsumeFromWhere, LitePullConfig, LitePullConsumer, Message, Producer
from basalt.services.cluster.etcd import free_port
from tests.support.docker import (
    COMPOSE_FILE,
    HOST_OVERRIDE,
    Compose,
    base_image,
    can_start_engine,
    docker_engine,
    engine_answers,
)
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
    "BASALT_COMPOSE_PULL_SERVICE_PORT",
    "BASALT_COMPOSE_ROCKETMQ_V2_PORT",
    "BASALT_COMPOSE_ADMIN_SERVICE_PORT",
)


@pytest.mark.parametrize("files", [(COMPOSE_FILE,), (COMPOSE_FILE, HOST_OVERRIDE)])
def test_compose_files_are_valid(files: tuple[Path, ...]) -> None:
    """``docker compose config -q``: what users run, and with the test's override (no
    engine needed)."""
    Compose("basalt-config-check", {}, files=files).run("config", "-q")


@pytest.fixture
def stack() -> Iterator[tuple[Compose, dict[str, str]]]:
    """The compose project on free ports, on an engine that answers (started here if
    need be); ``down -v`` at the end whatever happened, then the engine stops."""
    if not engine_answers({}) and not can_start_engine():
        pytest.fail("no Docker engine answers and dockerd cannot be started (not root?)")
    with docker_engine() as engine:
        ports = {name: str(free_port()) for name in PORT_VARIABLES}
        env = {
            **engine,
            **ports,
            "BASALT_IMAGE": "basalt:test",
            "BASALT_BASE_IMAGE": base_image(engine),
            "BASALT_ETCD_IMAGE": "basalt:test",
            # Debian's engine ships no buildx: the classic builder.
            "DOCKER_BUILDKIT": "0",
        }
        compose = Compose(f"basalt-test-{uuid.uuid4().hex[:8]}", env)
        try:
            yield compose, ports
        finally:
            compose.run("down", "-v", "--remove-orphans", "--timeout", "30")
            # Nothing of the project is left: no container, no volume.
            assert compose.run("ps", "-a", "-q").strip() == ""
            assert compose.run("volumes", "-q").strip() == ""


async def _produce(endpoints: str) -> None:
    async with Producer(endpoints, group="compose-test-producer") as producer:
        for start in range(0, MESSAGES, 100):
            batch = [
                Message(TOPIC, f"m-{i}".encode(), keys=(f"k-{i}",))
                for i in range(start, start + 100)
            ]
            results = await producer.send_batch(batch)
            assert all(r.ok for r in results)


async def _consume(endpoints: str, count: int, *, then_nothing: bool) -> list[str]:
    """``count`` bodies read as GROUP from its committed offsets, committed on close;
    with ``then_nothing``, a further poll must find none."""
    config = LitePullConfig(
        consumer_group=GROUP, consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET
    )
    bodies: list[str] = []
    async with LitePullConsumer(endpoints, config=config) as consumer:
        await consumer.assign(await consumer.queues_of(TOPIC))
        while len(bodies) < count:
            records = await consumer.poll(timeout_ms=10_000, max_records=count - len(bodies))
            assert records, f"nothing more after {len(bodies)} of {count}"
            bodies += [r.body.decode() for r in records]
        if then_nothing:
            assert await consumer.poll(timeout_ms=1000) == []
    return bodies


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_compose_cluster_serves_the_sdk_and_survives_down_and_up(
    stack: tuple[Compose, dict[str, str]],
) -> None:
    compose, ports = stack
    endpoints = f"127.0.0.1:{ports['BASALT_COMPOSE_PULL_SERVICE_PORT']}"
    admin = f"127.0.0.1:{ports['BASALT_COMPOSE_ADMIN_SERVICE_PORT']}"
    compose.run("build")
    compose.run("up", "-d", "--wait", "--no-build")
    assert "(healthy)" in compose.run("ps")

    created = run_basalt_sync("admin", "updateTopic", "--server", admin, "-t", TOPIC, "-w", "4")
    assert created.returncode == 0, created.stderr
    assert "broker-a,broker-b" in created.stdout, created.stdout
    asyncio.run(_produce(endpoints))
    first = asyncio.run(_consume(endpoints, FIRST_PART, then_nothing=False))

    compose.run("down", "--timeout", "30")  # the named volumes stay
    compose.run("up", "-d", "--wait", "--no-build")
    rest = asyncio.run(_consume(endpoints, MESSAGES - FIRST_PART, then_nothing=True))

    assert len(set(first)) == FIRST_PART
    assert sorted(first + rest) == sorted(f"m-{i}" for i in range(MESSAGES))
