"""Rebalance with consumers in their own processes: they join, leave and are
killed with -9 while a producer keeps sending. Every acknowledged message is
consumed at least once, no queue is ever in two consumers' listener calls at
once, and the queues are all owned again after each change."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from basalt.services.meta import MetaConfig

from tests.client.helpers import producing
from tests.client.test_quickstart import REPO_ROOT
from tests.services.conftest import async_test
from tests.services.test_pull_service import TOPIC, cluster
from tests.services.test_pull_sessions import eventually

GROUP = "RG"
QUEUES = 8  # 2 store-nodes x 4


@dataclass(frozen=True)
class Call:
    start: float
    end: float
    client: str
    queue: tuple[str, int]
    offset: int
    body: str


def calls(log: Path) -> list[Call]:
    out = []
    for line in log.read_text().splitlines():
        parts = line.split()
        if len(parts) == 7:  # a line cut by kill -9 has fewer
            start, end, client, broker, qid, offset, body = parts
            out.append(
                Call(float(start), float(end), client, (broker, int(qid)), int(offset), body)
            )
    return out


def overlaps(log: Path) -> list[tuple[Call, Call]]:
    """Listener calls of one queue by two consumers that overlap in time."""
    by_queue: dict[tuple[str, int], list[Call]] = {}
    for call in calls(log):
        by_queue.setdefault(call.queue, []).append(call)
    bad = []
    for queue_calls in by_queue.values():
        queue_calls.sort(key=lambda c: c.start)
        latest: dict[str, float] = {}  # client -> latest end so far
        for call in queue_calls:
            for other, end in latest.items():
                if other != call.client and call.start < end:
                    bad.append((call, next(c for c in queue_calls if c.client == other)))
            latest[call.client] = max(latest.get(call.client, 0.0), call.end)
    return bad


@contextlib.asynccontextmanager
async def worker(
    address: str, client_id: str, log: Path, group: str = GROUP, topic: str = TOPIC, mode: str = ""
) -> AsyncIterator[asyncio.subprocess.Process]:
    """A push_worker process, once it reports its consumer started; killed at exit."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.client.push_worker",
        address,
        group,
        topic,
        client_id,
        str(log),
        mode,
        stdout=asyncio.subprocess.PIPE,
        cwd=REPO_ROOT,
    )
    try:
        assert proc.stdout is not None
        assert (await asyncio.wait_for(proc.stdout.readline(), 30)) == b"started\n"
        yield proc
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()


@async_test
async def test_join_leave_and_kill_9_during_consumption(
    tmp_path: Path, meta_config: MetaConfig
) -> None:
    log = tmp_path / "consumed.log"
    async with cluster(tmp_path, meta_config, heartbeat_interval_ms=500) as h:
        address = h.services[0].address
        acked: set[str] = set()

        async def owners_are(clients: set[str]) -> None:
            """Every queue locked, by exactly ``clients`` (each its fair share)."""

            async def check() -> bool:
                owners = await h.meta.queue_lock_owners(GROUP)
                counts = [list(owners.values()).count(c) for c in clients]
                return (
                    len(owners) == QUEUES
                    and set(owners.values()) == clients
                    and max(counts) - min(counts) <= 1
                )

            await eventually(check, 30)

        async with contextlib.AsyncExitStack() as workers:
            w1 = await workers.enter_async_context(worker(address, "W1", log))
            w2 = await workers.enter_async_context(worker(address, "W2", log))
            async with producing(address, TOPIC, acked=acked):
                await owners_are({"W1", "W2"})
                await workers.enter_async_context(worker(address, "W3", log))
                await owners_are({"W1", "W2", "W3"})
                w1.send_signal(signal.SIGKILL)  # no commit, no unlock: the session breaks
                await w1.wait()
                await owners_are({"W2", "W3"})
                w2.send_signal(signal.SIGTERM)  # a clean leave: commit, unlock, close
                assert await asyncio.wait_for(w2.wait(), 30) == 0
                await owners_are({"W3"})

            async def all_consumed() -> bool:
                return {c.body for c in calls(log)} >= acked

            await eventually(all_consumed, 60)
        assert len(acked) > 100
        assert overlaps(log) == []
        by = {c.client for c in calls(log)}
        assert by == {"W1", "W2", "W3"}
