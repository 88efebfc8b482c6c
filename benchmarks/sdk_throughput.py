"""SDK throughput: client.Producer and client.LitePullConsumer against a real cluster.

Starts ``basalt cluster up`` (etcd, 2 store-nodes, 1 pull-service) in a temp
directory, creates a topic with ``--queues`` queues per store-node, then in
this process (one event loop):

* **produce** — ``--senders`` coroutines, each ``Producer.send_batch`` of
  ``--batch`` new 1 KiB messages after another (the SDK encodes every batch:
  UNIQ_KEYs, properties, RocketMQ's MessageBatch) for ``--duration`` s;
* **consume** — ``LitePullConsumer`` assigned every queue, ``poll`` in a loop
  with ``pull_batch_size`` 256 until everything produced is read (its
  fetchers prefetch up to ``pull_threshold_for_queue``, 1000 records a
  queue, while the loop runs); every record is decoded into a
  ``MessageRecord`` (what an application gets).

Compare with ``e2e_throughput.py``'s raw-stub rows (pre-serialized requests,
nothing decoded). "also" gives this process's CPU time per message (all its
threads: the SDK, gRPC, the event loop, and the benchmark's own Message
objects): the cluster shares the machine's cores, so the rates move with
whatever else runs, and the CPU a message costs here is what the SDK
decides. Prints one table; always runs ``basalt cluster down``.

Usage::

    .venv/bin/python benchmarks/sdk_throughput.py [--duration 10]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from basalt.client import ConsumeFromWhere, LitePullConfig, LitePullConsumer, Producer
from basalt.common.auth import Credentials
from basalt.common.message import Message
from basalt.common.tls import TlsConfig
from benchmarks.e2e_client import Cluster
from benchmarks.report import Figure, Report, Row, add_json_out, rows_table

TOPIC = "SdkBench"
BODY = 1024


async def produce(
    address: str,
    senders: int,
    batch: int,
    duration_s: float,
    *,
    tls: TlsConfig | None = None,
    credentials: Credentials | None = None,
) -> Row:
    body = bytes(BODY)
    sent = 0
    calls = 0
    async with Producer(address, group="sdk-bench", tls=tls, credentials=credentials) as producer:
        await producer.send(Message(TOPIC, body, tags="TagA"))  # routes and streams up
        stop = time.monotonic() + duration_s

        async def sender() -> None:
            nonlocal sent, calls
            while time.monotonic() < stop:
                messages = [Message(TOPIC, body, tags="TagA") for _ in range(batch)]
                results = await producer.send_batch(messages)
                sent += len(results)
                calls += 1

        started, cpu = time.monotonic(), time.process_time()
        await asyncio.gather(*(sender() for _ in range(senders)))
        secs, cpu = time.monotonic() - started, time.process_time() - cpu
    return Row(
        "sdk produce",
        f"Producer.send_batch of {batch}, {senders} in flight",
        sent / secs,
        "msgs/s",
        sent,
        secs,
        None,
        [Figure(calls / secs, "batches/s", fmt=",.0f"), cpu_us_per_message(cpu, sent)],
    )


async def consume(
    address: str,
    expected: int,
    *,
    tls: TlsConfig | None = None,
    credentials: Credentials | None = None,
    group: str = "sdk-bench",
    check_crcs: bool = True,
) -> Row:
    config = LitePullConfig(
        consumer_group=group,
        pull_batch_size=256,
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
        check_crcs=check_crcs,
    )
    got = 0
    polls = 0
    async with LitePullConsumer(
        address, config=config, tls=tls, credentials=credentials
    ) as consumer:
        await consumer.assign(await consumer.queues_of(TOPIC))
        started, cpu = time.monotonic(), time.process_time()
        while got < expected:
            records = await consumer.poll(timeout_ms=1000)
            if not records:
                break
            got += len(records)
            polls += 1
        secs, cpu = time.monotonic() - started, time.process_time() - cpu
    return Row(
        "sdk consume" + ("" if check_crcs else ", check_crcs off"),
        "LitePullConsumer.poll, pull_batch_size 256, prefetched, decoded",
        got / secs,
        "msgs/s",
        got,
        secs,
        None,
        [
            Figure(polls / secs, "polls/s", fmt=",.0f"),
            Figure(got / max(polls, 1), "records/poll", better=None, fmt=".0f"),
            cpu_us_per_message(cpu, got),
        ],
    )


def cpu_us_per_message(cpu_s: float, count: int) -> Figure:
    """This process's CPU seconds spread over ``count`` messages: ``CPU 12.3 µs/msg``."""
    return Figure(cpu_s / max(count, 1) * 1e6, "µs/msg", "CPU", fmt=".1f")


async def run(args: argparse.Namespace, root: Path) -> list[Row]:
    cluster = Cluster(root / "cluster")
    try:
        print(cluster.up().rstrip(), file=sys.stderr)
        await cluster.create_topics((TOPIC,), args.queues)
        produced = await produce(cluster.pull_address, args.senders, args.batch, args.duration)
        consumed = await consume(cluster.pull_address, produced.count + 1)
        rows = [produced, consumed]
        # CRC-on-read's cost: the same records read again by fresh groups,
        # check_crcs off and on alternating (the host's drift hits both).
        ratios = []
        for r in range(args.crc_rounds):
            pair = []
            for check in (False, True) if r % 2 == 0 else (True, False):
                group = f"sdk-bench-crc-{r}-{int(check)}"
                row = await consume(
                    cluster.pull_address, produced.count, group=group, check_crcs=check
                )
                rows.append(row)
                pair.append((check, row.rate))
            off = next(rate for check, rate in pair if not check)
            on = next(rate for check, rate in pair if check)
            ratios.append(on / off)
        if ratios:
            print(
                "check_crcs on/off consume rate, per round: "
                + ", ".join(f"{x:.3f}" for x in ratios)
                + f"; mean {sum(ratios) / len(ratios):.3f}",
                file=sys.stderr,
            )
        return rows
    finally:
        print(cluster.down().rstrip(), file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--senders", type=int, default=32, help="send_batch calls in flight")
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--queues", type=int, default=8, help="queues per store-node")
    parser.add_argument(
        "--crc-rounds",
        type=int,
        default=0,
        help="rounds of consume with check_crcs off and on, alternating (CRC-on-read's cost)",
    )
    add_json_out(parser)
    args = parser.parse_args(argv)
    report = Report.start(__file__, args, argv)
    with tempfile.TemporaryDirectory(prefix="basalt-sdk-") as tmp:
        rows = asyncio.run(run(args, Path(tmp)))
    report.emit(rows_table("cells", rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
