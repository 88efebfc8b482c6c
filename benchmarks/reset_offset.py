"""Reset offset by time and rebalance, timed on a real cluster with live push consumers.

Starts ``basalt cluster up`` (etcd, 2 store-nodes, 1 pull-service) in a temp
directory, creates a topic of ``--queues`` queues per store-node, keeps a
producer sending ``--rate`` messages/s, and runs ``--consumers`` PushConsumers
of one group, each in its own process (a listener that only counts). Then:

* **reset** — ``--resets`` times, ``basalt.admin.ops.reset_offset_by_time`` to a
  point a second back, forced: from the command to the last consumer's ack,
  which each sends only once its queues pull from the new offsets (RocketMQ's
  resetOffsetByTime flow, without its 10 s sleep). Every ack must be OK.
* **rebalance after a join** — ``--joins`` times, one more consumer process
  joins: from its registration appearing in etcd to every queue locked by the
  fair share of the new membership (AllocateMessageQueueAveragely; locks are
  what the consumers process under). Also in heartbeat intervals.
* **rebalance after a leave** — the joined consumer closes: from its
  registration leaving etcd to the others owning every queue again.

Prints one table; always runs ``basalt cluster down``.

Usage::

    .venv/bin/python benchmarks/reset_offset.py [--resets 20] [--joins 5]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from multiprocessing.synchronize import Event as EventType
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from basalt.admin import ops
from basalt.client import (
    ConsumeFromWhere,
    ConsumeStatus,
    MessageQueue,
    Producer,
    PushConsumer,
    PushConsumerConfig,
)
from basalt.common.message import Message, MessageRecord
from basalt.services.cluster.local import CLUSTER_NAME
from basalt.services.meta import MetaClient, MetaConfig, TopicConfig
from basalt.v1 import pull_service_pb2 as ps
from benchmarks.e2e_client import Cluster
from benchmarks.report import Figure, Report, Row, Target, add_json_out, rows_table

TOPIC = "ResetBench"
GROUP = "reset-bench"
#: The pull-service's heartbeat interval under ``basalt cluster up`` (its default).
HEARTBEAT_MS = 10_000


def consumer_process(address: str, client_id: str, ready: EventType, stop: EventType) -> None:
    """A PushConsumer until ``stop`` is set (then a clean close)."""

    def listener(messages: list[MessageRecord], queue: MessageQueue) -> ConsumeStatus:
        return ConsumeStatus.CONSUME_SUCCESS

    async def run() -> None:
        consumer = PushConsumer(
            address,
            config=PushConsumerConfig(
                consumer_group=GROUP,
                client_id=client_id,
                consume_from_where=ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET,
                consume_thread_nums=4,
            ),
            listener=listener,
        )
        consumer.subscribe(TOPIC)
        async with consumer:
            ready.set()
            while not stop.is_set():
                await asyncio.sleep(0.05)

    asyncio.run(run())


class Consumers:
    """Consumer processes by client id."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.ctx = multiprocessing.get_context("spawn")
        self.procs: dict[str, tuple[multiprocessing.process.BaseProcess, EventType]] = {}

    def start(self, client_id: str) -> None:
        ready, stop = self.ctx.Event(), self.ctx.Event()
        proc = self.ctx.Process(
            target=consumer_process, args=(self.address, client_id, ready, stop), daemon=True
        )
        proc.start()
        self.procs[client_id] = (proc, stop)
        if not ready.wait(60):
            raise RuntimeError(f"consumer {client_id} did not start")

    def stop(self, client_id: str) -> None:
        proc, stop = self.procs.pop(client_id)
        stop.set()
        proc.join(30)
        if proc.exitcode is None:
            proc.kill()

    def stop_all(self) -> None:
        for client_id in list(self.procs):
            self.stop(client_id)


async def fair(meta: MetaClient, members: set[str], queues: int) -> bool:
    """Every queue locked, by exactly ``members``, shares differing by at most one."""
    owners = list((await meta.queue_lock_owners(GROUP)).values())
    counts = [owners.count(m) for m in members]
    return len(owners) == queues and set(owners) == members and max(counts) - min(counts) <= 1


async def until(
    check: Callable[[], Awaitable[bool]], timeout_s: float = 60.0, every_s: float = 0.002
) -> float:
    """Poll the async ``check`` until it holds; the monotonic time it first did."""
    deadline = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() > deadline:
            raise RuntimeError("not reached in time")
        await asyncio.sleep(every_s)
    return time.monotonic()


def latency_row(
    path: str, config: str, samples_ms: list[float], target_ms: float, *, in_heartbeats: bool
) -> Row:
    p50 = statistics.median(samples_ms)
    worst = max(samples_ms)
    also: list[str | Figure] = [Figure(p50, "ms", "p50", fmt=".1f")]
    if in_heartbeats:
        also += [
            Figure(
                worst / HEARTBEAT_MS,
                f"heartbeats ({HEARTBEAT_MS} ms) at worst",
                better="lower",
                fmt=".3f",
            )
        ]
    return Row(
        path,
        config,
        worst,
        "ms max",
        len(samples_ms),
        sum(samples_ms) / 1000,
        Target(target_ms, higher_is_better=False),
        also,
    )


async def produce(address: str, rate: float, stop: asyncio.Event) -> None:
    async with Producer(address, group="reset-bench-p") as producer:
        while not stop.is_set():
            await producer.send(Message(TOPIC, bytes(1024)))
            await asyncio.sleep(1 / rate)


async def run(args: argparse.Namespace, root: Path) -> list[Row]:
    cluster = Cluster(root / "cluster")
    consumers: Consumers | None = None
    try:
        print(cluster.up().rstrip(), file=sys.stderr)
        meta_config = MetaConfig(endpoints=(cluster.etcd_address,), cluster=CLUSTER_NAME)
        async with MetaClient(meta_config) as meta:
            brokers = tuple(p.name for p in cluster.of_role("store-node"))
            queues = args.queues * len(brokers)
            await meta.create_topic(
                TopicConfig(
                    topic_name=TOPIC,
                    read_queue_nums=args.queues,
                    write_queue_nums=args.queues,
                    brokers=brokers,
                )
            )
            await asyncio.sleep(1.0)  # the pull-service's watch
            stop = asyncio.Event()
            producing = asyncio.ensure_future(produce(cluster.pull_address, args.rate, stop))
            consumers = Consumers(cluster.pull_address)
            members = {f"c{i}" for i in range(args.consumers)}
            for client_id in sorted(members):
                await asyncio.to_thread(consumers.start, client_id)
            await until(lambda: fair(meta, members, queues))

            resets: list[float] = []
            for _ in range(args.resets):
                point_ms = int(time.time() * 1000) - 1000
                started = time.perf_counter()
                outcome = await ops.reset_offset_by_time(meta, GROUP, TOPIC, point_ms)
                resets.append((time.perf_counter() - started) * 1000)
                assert outcome.acks is not None and not outcome.failed, outcome
                outcomes = {a.outcome for a in outcome.acks}
                assert outcomes == {ps.COMMAND_OUTCOME_OK} and len(outcome.acks) == len(members)
                await asyncio.sleep(0.2)

            joins: list[float] = []
            leaves: list[float] = []
            for n in range(args.joins):
                joiner = f"j{n}"
                task = asyncio.ensure_future(asyncio.to_thread(consumers.start, joiner))

                async def joined(who: str = joiner) -> bool:
                    return who in await meta.list_consumers(GROUP)

                async def shared(who: str = joiner) -> bool:
                    return await fair(meta, members | {who}, queues)

                seen = await until(joined)
                done = await until(shared)
                joins.append((done - seen) * 1000)
                await task

                stopping = asyncio.ensure_future(asyncio.to_thread(consumers.stop, joiner))

                async def left(who: str = joiner) -> bool:
                    return who not in await meta.list_consumers(GROUP)

                gone = await until(left)
                done = await until(lambda: fair(meta, members, queues))
                leaves.append((done - gone) * 1000)
                await stopping
            stop.set()
            await producing
        shape = f"{len(brokers)} nodes x {args.queues} queues, {args.consumers} consumers"
        return [
            latency_row(
                "resetOffsetByTime",
                f"{shape}, {args.rate:.0f} msgs/s",
                resets,
                300,
                in_heartbeats=False,
            ),
            latency_row(
                "rebalance: join", f"{shape} + 1", joins, 2 * HEARTBEAT_MS, in_heartbeats=True
            ),
            latency_row(
                "rebalance: leave", f"{shape} + 1 - 1", leaves, 2 * HEARTBEAT_MS, in_heartbeats=True
            ),
        ]
    finally:
        if consumers is not None:
            await asyncio.to_thread(consumers.stop_all)
        print(cluster.down().rstrip(), file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--queues", type=int, default=8, help="queues per store-node")
    parser.add_argument("--consumers", type=int, default=3)
    parser.add_argument("--rate", type=float, default=200.0, help="messages/s produced meanwhile")
    parser.add_argument("--resets", type=int, default=20)
    parser.add_argument("--joins", type=int, default=5)
    add_json_out(parser)
    args = parser.parse_args(argv)
    report = Report.start(__file__, args, argv)
    with tempfile.TemporaryDirectory(prefix="basalt-reset-") as tmp:
        rows = asyncio.run(run(args, Path(tmp)))
    report.emit(rows_table("cells", rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
