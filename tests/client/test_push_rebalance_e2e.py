"""Rebalance with consumers in their own processes: they join, leave and are
killed with -9 while a producer keeps sending. Every acknowledged message is
consumed at least once, no queue is ever in two consumers' listener calls at
once, and the queues are all owned again after each change."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from pathlib import Path

from basalt.services.meta import MetaConfig
from tests.support.aio import async_test
from tests.support.consumers import producing
from tests.support.nodes import TOPIC, cluster
from tests.support.polling import eventually
from tests.support.push_worker import calls, overlaps, worker
from tests.support.timeouts import SUBPROCESS_TEST_TIMEOUT_S, SUBPROCESS_TIMEOUT_S

GROUP = "RG"
QUEUES = 8  # 2 store-nodes x 4


@async_test(timeout_s=SUBPROCESS_TEST_TIMEOUT_S)
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

            await eventually(check, timeout_s=30)

        async with contextlib.AsyncExitStack() as workers:
            w1 = await workers.enter_async_context(worker(address, "W1", log, GROUP, TOPIC))
            w2 = await workers.enter_async_context(worker(address, "W2", log, GROUP, TOPIC))
            async with producing(address, TOPIC, acked=acked):
                await owners_are({"W1", "W2"})
                await workers.enter_async_context(worker(address, "W3", log, GROUP, TOPIC))
                await owners_are({"W1", "W2", "W3"})
                w1.send_signal(signal.SIGKILL)  # no commit, no unlock: the session breaks
                await w1.wait()
                await owners_are({"W2", "W3"})
                w2.send_signal(signal.SIGTERM)  # a clean leave: commit, unlock, close
                assert await asyncio.wait_for(w2.wait(), SUBPROCESS_TIMEOUT_S) == 0
                await owners_are({"W3"})

            async def all_consumed() -> bool:
                return {c.body for c in calls(log)} >= acked

            await eventually(all_consumed, timeout_s=60)
        assert len(acked) > 100
        assert overlaps(log) == []
        by = {c.client for c in calls(log)}
        assert by == {"W1", "W2", "W3"}
