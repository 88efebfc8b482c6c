"""Transactional sends against plain sends, with the SDK, on one real cluster.

Starts ``basalt cluster up`` (etcd, 2 store-nodes, 1 pull-service) in a temp
directory, creates a topic with ``--queues`` queues per store-node, then in
this process (one event loop), for ``--duration`` s each, ``--in-flight``
coroutines sending one 1 KiB message after another:

* **plain** — ``Producer.send`` (one message per send: a transactional
  message cannot be batched, so the comparison is one message against one);
* **transactional** — ``TransactionProducer.send_message_in_transaction``
  with a local transaction that commits at once: the half's send, the
  callback, then ``EndTransaction`` (the store-node puts the real message
  and the op mark as one append) — two round trips and three records per
  message.

The two alternate for ``--rounds`` rounds (the host's drift hits both), and the
table gives each round's rate and the ratio of the means (issue 30's target:
transactional >= 30 % of plain). "also" gives this process's CPU per message.
Always runs ``basalt cluster down``.

Usage::

    .venv/bin/python benchmarks/transactions.py [--duration 10] [--in-flight 64]
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

from basalt.client import LocalTransactionState, Producer, TransactionProducer
from basalt.common.message import Message, MessageRecord
from benchmarks.e2e_client import Cluster
from benchmarks.report import Report, add_json_out, rows_table
from benchmarks.sdk_throughput import cpu_us_per_message
from benchmarks.store_read import Row

TOPIC = "TxBench"
BODY = 1024


def _commit(message: Message) -> LocalTransactionState:
    return LocalTransactionState.COMMIT_MESSAGE


def _check(record: MessageRecord) -> LocalTransactionState:
    return LocalTransactionState.COMMIT_MESSAGE


async def _drive(send: object, in_flight: int, duration_s: float, what: str, how: str) -> Row:
    """``in_flight`` coroutines awaiting ``send()`` back to back for ``duration_s``."""
    sent = 0
    stop = time.monotonic() + duration_s

    async def sender() -> None:
        nonlocal sent
        while time.monotonic() < stop:
            await send()  # type: ignore[operator]
            sent += 1

    started, cpu = time.monotonic(), time.process_time()
    await asyncio.gather(*(sender() for _ in range(in_flight)))
    secs, cpu = time.monotonic() - started, time.process_time() - cpu
    return Row(what, how, sent / secs, "msgs/s", sent, secs, None, cpu_us_per_message(cpu, sent))


async def plain(address: str, in_flight: int, duration_s: float, r: int) -> Row:
    body = bytes(BODY)
    async with Producer(address, group="tx-bench-plain") as producer:
        await producer.send(Message(TOPIC, body))  # routes and streams up

        async def send() -> None:
            await producer.send(Message(TOPIC, body, tags="TagA"))

        return await _drive(
            send,
            in_flight,
            duration_s,
            f"plain send, round {r}",
            f"Producer.send, {in_flight} in flight",
        )


async def transactional(address: str, in_flight: int, duration_s: float, r: int) -> Row:
    body = bytes(BODY)
    async with TransactionProducer(address, group="tx-bench", checker=_check) as producer:
        await producer.send_message_in_transaction(Message(TOPIC, body), _commit)

        async def send() -> None:
            result = await producer.send_message_in_transaction(
                Message(TOPIC, body, tags="TagA"), _commit
            )
            assert result.local_transaction_state is LocalTransactionState.COMMIT_MESSAGE

        return await _drive(
            send,
            in_flight,
            duration_s,
            f"transactional send, round {r}",
            f"half + local commit + EndTransaction, {in_flight} in flight",
        )


async def run(args: argparse.Namespace, root: Path, report: Report) -> list[Row]:
    cluster = Cluster(root / "cluster")
    try:
        print(cluster.up().rstrip(), file=sys.stderr)
        await cluster.create_topics((TOPIC,), args.queues)
        rows: list[Row] = []
        plain_rates, tx_rates = [], []
        for r in range(1, args.rounds + 1):
            order = (False, True) if r % 2 else (True, False)
            for tx in order:
                if tx:
                    row = await transactional(
                        cluster.pull_address, args.in_flight, args.duration, r
                    )
                    tx_rates.append(row.rate)
                else:
                    row = await plain(cluster.pull_address, args.in_flight, args.duration, r)
                    plain_rates.append(row.rate)
                rows.append(row)
        ratio = (sum(tx_rates) / len(tx_rates)) / (sum(plain_rates) / len(plain_rates))
        report.note(
            f"transactional / plain (means over {args.rounds} rounds): {ratio:.2f} (target >= 0.30)"
        )
        return rows
    finally:
        print(cluster.down().rstrip(), file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per row")
    parser.add_argument("--in-flight", type=int, default=64, help="sends in flight")
    parser.add_argument("--queues", type=int, default=8, help="queues per store-node")
    parser.add_argument("--rounds", type=int, default=2, help="plain/transactional pairs")
    add_json_out(parser)
    args = parser.parse_args(argv)
    report = Report.start(__file__, args, argv)
    with tempfile.TemporaryDirectory(prefix="basalt-tx-") as tmp:
        rows = asyncio.run(run(args, Path(tmp), report))
    report.emit(rows_table("sends", rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
