"""The SDK leaves no task behind while store-nodes die (issue 28, item 7).

A real cluster of processes (two store-nodes, a pull-service, a real etcd);
a Producer sending, a PushConsumer and a subscribing LitePullConsumer
consuming, while a store-node process is killed with SIGKILL and restarted,
five times. Then everything closes. asyncio must not have reported a task
destroyed while pending, nor a task exception never retrieved (both come
through the loop's exception handler, and would otherwise go to the
``asyncio`` logger: both are watched, with the garbage collected after
close), and no task but the test's own may be left on the loop.

No assertion on timing: the kills only have to happen while the clients
are busy.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from basalt.client import (
    ClientError,
    ConsumeStatus,
    LitePullConfig,
    LitePullConsumer,
    Producer,
    ProducerConfig,
    PushConsumer,
    PushConsumerConfig,
)
from basalt.client.consumer_base import ConsumeFromWhere, MessageQueue
from basalt.common.message import Message, MessageRecord
from basalt.services.cluster.etcd import EtcdProcess
from tests.support.etcd import unique_cluster
from tests.support.nodes import BROKERS
from tests.support.processes import TOPIC, ServiceProcess, create_topic, start_processes
from tests.support.timeouts import SUBPROCESS_TEST_TIMEOUT_S

KILLS = 5
#: What asyncio says of a task it lost track of.
LEAKS = ("Task was destroyed but it is pending", "Task exception was never retrieved")

pytestmark = pytest.mark.slow  # five restarts of a store-node process


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def asyncio_log() -> Iterator[list[str]]:
    """What the ``asyncio`` logger says during the test."""
    handler = _Records()
    logger = logging.getLogger("asyncio")
    logger.addHandler(handler)
    try:
        yield handler.messages
    finally:
        logger.removeHandler(handler)


def test_kill_9_of_store_nodes_under_running_clients_leaves_no_task_behind(
    tmp_path: Path,
    etcd: EtcdProcess,
    processes: list[ServiceProcess],
    asyncio_log: list[str],
) -> None:
    reported: list[dict[str, Any]] = []
    cluster = unique_cluster()
    # A lease longer than the test: the killed node stays in the routes, so
    # the clients keep calling it while it is down and when it is back.
    nodes, pull = start_processes(tmp_path, etcd, cluster, 30, processes)
    counts = {"sent": 0, "pushed": 0, "polled": 0}

    def listener(records: list[MessageRecord], _: MessageQueue) -> ConsumeStatus:
        counts["pushed"] += len(records)
        return ConsumeStatus.CONSUME_SUCCESS

    async def scenario() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda _, c: reported.append(c))
        async with asyncio.timeout(SUBPROCESS_TEST_TIMEOUT_S):
            await create_topic(etcd, cluster)
            producer = Producer(
                pull.address,
                group="P",
                config=ProducerConfig(producer_group="P", send_msg_timeout_ms=3_000),
            )
            push = PushConsumer(
                pull.address,
                config=PushConsumerConfig(
                    consumer_group="G-push",
                    consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
                    broker_suspend_max_time_ms=1_000,
                    persist_consumer_offset_interval_ms=500,
                ),
                listener=listener,
            )
            push.subscribe(TOPIC)
            lite = LitePullConsumer(
                pull.address,
                config=LitePullConfig(
                    consumer_group="G-lite",
                    consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
                    broker_suspend_max_time_ms=1_000,
                ),
            )
            lite.subscribe(TOPIC)
            await producer.start()
            await push.start()
            await lite.start()
            stop = asyncio.Event()

            async def send() -> None:
                n = 0
                while not stop.is_set():
                    try:
                        await producer.send(Message(TOPIC, b"m-%d" % n))
                        counts["sent"] += 1
                    except ClientError:
                        await asyncio.sleep(0.05)
                    n += 1

            async def poll() -> None:
                while not stop.is_set():
                    try:
                        counts["polled"] += len(await lite.poll(200))
                    except ClientError:
                        await asyncio.sleep(0.05)

            busy = [asyncio.create_task(send()), asyncio.create_task(poll())]
            for kill in range(KILLS):
                await asyncio.sleep(1.0)
                victim = nodes[BROKERS[kill % len(BROKERS)]]
                victim.stop(signal.SIGKILL)  # returns once the process is gone
                await asyncio.sleep(0.5)  # calls to it fail meanwhile
                victim.start()
                await asyncio.to_thread(victim.wait_serving)
            await asyncio.sleep(1.0)
            stop.set()
            await asyncio.gather(*busy)
            await producer.close()
            await push.close()
            await lite.close()
        # Every task the clients (and gRPC under them) started has ended.
        assert asyncio.all_tasks() == {asyncio.current_task()}
        gc.collect()
        # The collection finalizes abandoned async generators (gRPC's request
        # iterators) with aclose tasks: they end in a few loop iterations.
        for _ in range(100):
            if asyncio.all_tasks() == {asyncio.current_task()}:
                break
            await asyncio.sleep(0)
        assert asyncio.all_tasks() == {asyncio.current_task()}

    asyncio.run(scenario())
    gc.collect()
    assert counts["sent"] > 0 and counts["pushed"] > 0 and counts["polled"] > 0, counts
    said = [f"{c.get('message')}: {c.get('task')!r} {c.get('exception')!r}" for c in reported]
    leaks = [m for m in said + asyncio_log if m.startswith(LEAKS)]
    assert leaks == [], "\n".join(leaks)
