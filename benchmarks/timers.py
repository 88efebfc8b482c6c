"""Timers (issue 30 section 5, docs/timers.md): delivery lateness on a steady
schedule, and a store-node's memory and disk with millions of timers pending.

Each part starts its own ``basalt cluster up --store-nodes 1 --store-files
production`` (etcd, ``broker-a``, a pull-service, on this machine) and always
runs ``cluster down``. Messages go to the store-node's ``SendBatch`` with the
wire's ``deliver_time_ms`` (the store-node encodes and parks each), a
``--body`` byte body holding the message's sequence number and delivery time.

1. **Lateness**: ``--messages`` (1,000,000) delivery times drawn at random
   over ``--window-s`` (600 s) starting ``--lead-s`` (5 s) from now, sorted;
   they are sent in that order at a steady rate over the first half of the
   window (a batch every 100 ms), so a message waits from ``--lead-s`` to
   about half the window and messages come due at a steady rate all window
   long. A ``LitePullConsumer`` on every queue (through the pull-service)
   takes them as they come: lateness = its clock when ``poll`` returned the
   message - the delivery time asked for (one host, one clock), p50 / p99 /
   max; early = delivered before its time (must be 0). It is split in two:
   "put" lateness = the delivered copy's STORETIMESTAMP - the delivery time
   (the timer's part), and the consumer part = arrival - STORETIMESTAMP
   (dispatch, long poll, pull-service, SDK). Meanwhile the store-node's RSS
   is sampled every second from ``/proc/<pid>/status``: RssAnon (its own
   memory) and RssFile (mapped files' pages in the page cache, the kernel's
   to drop) apart; CPU is its
   utime + stime from the first send to the last delivery, a scheduled
   message (put, parked, delivered, pulled).
2. **Pending**: a fresh cluster; RSS and disk at 0 pending, then
   ``--pending`` (10,000,000) timers due ``--pending-ahead-s`` (1 day) from
   now, spread over an hour, sent in batches of ``--batch`` with
   ``--senders`` calls in flight as fast as the node takes them; once the
   store-node says they are all pending (GetScheduleStatus) or stops
   counting, RSS again, and the disk: the timer files (``timerlog/``,
   ``timerwheel``, ``config/timer*``) and the CommitLog, as allocated
   blocks (``du``). RssAnon is also read after each tenth of the sends:
   whether it grows with the number pending or only once, with the load.

Targets (issue 30): lateness p99 <= 100 ms; RSS at ``--pending`` <= RSS at 0
+ 64 MiB (RssAnon: what the store-node holds; RssFile shown beside it).
Prints a table a part and writes the same figures as JSON (benchmarks/report.py:
``benchmarks/results/timers-<UTC start>.json``, or ``--json-out DIR``). Usage::

    .venv/bin/python benchmarks/timers.py                 # ~15-20 min
    .venv/bin/python benchmarks/timers.py --quick         # ~2 min smoke run

``--timer-precision-ms`` sets the store-node's ``timer_precision_ms``; any
other store-node setting goes through its ``BASALT_*`` environment variable
(``cluster up``'s processes inherit it), e.g.
``BASALT_HA_HEARTBEAT_INTERVAL_MS=10``.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import random
import shutil
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import grpc

from basalt.client import ConsumeFromWhere, LitePullConfig, LitePullConsumer
from basalt.common import dial
from basalt.common.message import PROPERTY_UNIQ_KEY, new_uniq_keys
from basalt.services.cluster.local import CLUSTER_NAME
from basalt.services.meta import MetaClient, MetaConfig, TopicConfig
from basalt.v1 import common_pb2 as pb
from basalt.v1 import store_node_pb2 as sn
from basalt.v1 import store_node_pb2_grpc as sn_grpc
from benchmarks.e2e_client import Cluster, cpu_seconds, machine_busy
from benchmarks.report import Cell, Figure, Report, Table, add_json_out, count

TOPIC = "TimerBench"
BROKER = "broker-a"
QUEUES = 8
MiB = 1 << 20
#: Targets (issue 30 section 5).
LATENESS_P99_TARGET_MS = 100.0
RSS_GROWTH_TARGET_MIB = 64.0
#: Body header: sequence number, delivery time (ms).
_HEAD = struct.Struct(">qq")
#: A steady sender's tick.
TICK_S = 0.1


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) of sorted ``values`` by nearest rank."""
    return values[min(len(values) - 1, max(0, round(q * len(values) + 0.5) - 1))]


# -- the store-node's process and files --------------------------------------------------


@dataclass(frozen=True, slots=True)
class Memory:
    """A process's resident set split as /proc/<pid>/status gives it, bytes."""

    anon: int
    file: int

    @staticmethod
    def of(pid: int) -> Memory:
        values: dict[str, int] = {}
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            name, _, rest = line.partition(":")
            if name in ("RssAnon", "RssFile"):
                values[name] = int(rest.split()[0]) * 1024
        return Memory(values["RssAnon"], values["RssFile"])


class Sampler:
    """Samples a process's :class:`Memory` every ``period_s`` on a thread; keeps the peak."""

    def __init__(self, pid: int, period_s: float = 1.0) -> None:
        self.pid = pid
        self.period_s = period_s
        self.peak_anon = 0
        self.peak_file = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                m = Memory.of(self.pid)
            except (OSError, KeyError):
                pass  # the process is gone: the peaks so far stand
            else:
                self.peak_anon = max(self.peak_anon, m.anon)
                self.peak_file = max(self.peak_file, m.file)
            self._stop.wait(self.period_s)


def allocated(path: Path) -> int:
    """Bytes of disk ``path`` takes (allocated blocks, as ``du``): a file, or a tree."""
    if not path.exists():
        return 0
    if path.is_file():
        return path.stat().st_blocks * 512
    return sum(p.stat().st_blocks * 512 for p in path.rglob("*") if p.is_file())


def timer_files(root: Path) -> int:
    """The timer store's files under store root ``root`` (docs/timers.md): the
    TimerLog, the wheel and its checkpoint and metrics."""
    names = [root / "timerlog", root / "timerwheel"]
    names += sorted((root / "config").glob("timer*"))
    return sum(allocated(p) for p in names)


def store_root(cluster: Cluster) -> Path:
    """The store root of ``broker-a`` (its data dir, or the ``store`` under it)."""
    data = cluster.data_dir / BROKER
    return data / "store" if (data / "store" / "commitlog").exists() else data


# -- a cluster of one store-node ---------------------------------------------------------


class Node:
    """``cluster up`` of one store-node with :data:`TOPIC`; its pid, address, stub."""

    def __init__(self, root: Path) -> None:
        self.cluster = Cluster(root, up_args=["--store-nodes", "1"])
        self.channel: grpc.aio.Channel | None = None

    async def __aenter__(self) -> Node:
        log(self.cluster.up().rstrip())
        config = MetaConfig(endpoints=(self.cluster.etcd_address,), cluster=CLUSTER_NAME)
        async with MetaClient(config) as meta:
            await meta.create_topic(
                TopicConfig(
                    topic_name=TOPIC,
                    read_queue_nums=QUEUES,
                    write_queue_nums=QUEUES,
                    brokers=(BROKER,),
                )
            )
        (node,) = self.cluster.of_role("store-node")
        self.pid = node.pid
        self.channel = dial.channel(node.address, None)
        self.stub = sn_grpc.StoreNodeStub(self.channel)
        await asyncio.sleep(1.5)  # the store-node's and pull-service's topic watches
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.channel is not None:
            await self.channel.close()
        log(self.cluster.down().rstrip())
        shutil.rmtree(self.cluster.data_dir, ignore_errors=True)

    async def send(self, queue_id: int, messages: list[pb.Message]) -> None:
        reply = await self.stub.SendBatch(
            sn.SendBatchRequest(
                topic=TOPIC, queue_id=queue_id, messages=pb.MessageList(messages=messages)
            ),
            timeout=60,
        )
        status = reply.result.status
        if status != pb.SEND_STATUS_SEND_OK:
            raise RuntimeError(f"send status {pb.SendStatus.Name(status)}")

    async def schedule(self) -> sn.GetScheduleStatusResponse | None:
        """The store-node's GetScheduleStatus; None when it does not answer it."""
        try:
            return await self.stub.GetScheduleStatus(
                sn.GetScheduleStatusRequest(topic=TOPIC), timeout=10
            )
        except grpc.aio.AioRpcError as e:
            log(f"GetScheduleStatus: {e.code().name} {e.details()}")
            return None


def messages(first: int, due_ms: Sequence[int], body_size: int) -> list[pb.Message]:
    """Messages ``first``, ``first + 1``, … due at ``due_ms``, one new UNIQ_KEY each."""
    pad = bytes(max(0, body_size - _HEAD.size))
    born = int(time.time() * 1000)
    keys = new_uniq_keys(len(due_ms))
    return [
        pb.Message(
            topic=TOPIC,
            body=_HEAD.pack(first + i, due) + pad,
            properties={PROPERTY_UNIQ_KEY: key},
            born_timestamp_ms=born,
            deliver_time_ms=due,
        )
        for i, (due, key) in enumerate(zip(due_ms, keys, strict=True))
    ]


# -- part 1: lateness --------------------------------------------------------------------


@dataclass
class Lateness:
    messages: int
    window_s: float
    received: int = 0
    duplicates: int = 0
    early: int = 0
    late_ms: list[int] = field(default_factory=list)
    put_late_ms: list[int] = field(default_factory=list)
    pull_ms: list[int] = field(default_factory=list)
    send_s: float = 0.0
    cpu_s: float = 0.0
    rss_anon_start: int = 0
    rss_file_start: int = 0
    rss_anon_peak: int = 0
    rss_file_peak: int = 0
    machine_busy_pct: float = 0.0
    steal_pct: float = 0.0


async def lateness(args: argparse.Namespace, root: Path) -> Lateness:
    n, window_s = args.messages, args.window_s
    result = Lateness(n, window_s)
    async with Node(root / "lateness") as node:
        start = time.time() + 1.0
        rng = random.Random(30)
        first_due = start + args.lead_s
        due = sorted(int((first_due + rng.random() * window_s) * 1000) for _ in range(n))
        send_s = window_s / 2
        seen = bytearray(n)
        done = asyncio.Event()

        async def consume() -> None:
            config = LitePullConfig(
                consumer_group="timer-bench",
                pull_batch_size=256,
                consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
                check_crcs=False,
            )
            async with LitePullConsumer(node.cluster.pull_address, config=config) as consumer:
                await consumer.assign(await consumer.queues_of(TOPIC))
                while result.received < n:
                    records = await consumer.poll(timeout_ms=500)
                    now_ms = int(time.time() * 1000)
                    for r in records:
                        seq, at = _HEAD.unpack_from(r.body)
                        if seen[seq]:
                            result.duplicates += 1
                            continue
                        seen[seq] = 1
                        result.received += 1
                        result.late_ms.append(now_ms - at)
                        result.put_late_ms.append(r.store_timestamp_ms - at)
                        result.pull_ms.append(now_ms - r.store_timestamp_ms)
                        if r.store_timestamp_ms < at:
                            result.early += 1
            done.set()

        consumer = asyncio.create_task(consume())
        await asyncio.sleep(max(0.0, start - time.time()))
        cpu0, (busy0, steal0), wall0 = cpu_seconds(node.pid) or 0.0, machine_busy(), time.time()
        m0 = Memory.of(node.pid)
        result.rss_anon_start, result.rss_file_start = m0.anon, m0.file
        with Sampler(node.pid) as sampler:
            # A steady sender: every tick, the messages whose send time has come.
            ticks = max(1, int(send_s / TICK_S))
            sent = 0
            in_flight: set[asyncio.Task[None]] = set()
            for tick in range(ticks):
                until = (tick + 1) * n // ticks
                batch = messages(sent, due[sent:until], args.body)
                queue = tick % QUEUES
                task = asyncio.create_task(node.send(queue, batch))
                in_flight.add(task)
                task.add_done_callback(in_flight.discard)
                sent = until
                await asyncio.sleep(max(0.0, start + (tick + 1) * TICK_S - time.time()))
            await asyncio.gather(*in_flight)
            result.send_s = time.time() - start
            log(f"sent {sent:,} in {result.send_s:.1f} s; waiting for the last due ones")
            deadline = due[-1] / 1000 + args.grace_s
            while not done.is_set() and time.time() < deadline:
                await asyncio.sleep(1.0)
                if int(time.time()) % 30 == 0:
                    log(f"received {result.received:,} of {n:,}")
        consumer.cancel()
        await asyncio.gather(consumer, return_exceptions=True)
        wall = time.time() - wall0
        busy1, steal1 = machine_busy()
        result.cpu_s = (cpu_seconds(node.pid) or 0.0) - cpu0
        result.rss_anon_peak, result.rss_file_peak = sampler.peak_anon, sampler.peak_file
        cores = os.cpu_count() or 1
        result.machine_busy_pct = 100 * (busy1 - busy0) / (wall * cores)
        result.steal_pct = 100 * (steal1 - steal0) / (wall * cores)
    return result


# -- part 2: pending ---------------------------------------------------------------------


@dataclass
class Pending:
    pending: int
    counted: int = -1
    send_s: float = 0.0
    settle_s: float = 0.0
    rss_anon_0: int = 0
    rss_file_0: int = 0
    rss_anon_n: int = 0
    rss_file_n: int = 0
    timer_disk_0: int = 0
    timer_disk_n: int = 0
    commitlog_0: int = 0
    commitlog_n: int = 0
    cpu_s: float = 0.0
    #: (messages sent, RssAnon) after each tenth of the sends.
    rss_curve: list[tuple[int, int]] = field(default_factory=list)


async def pending(args: argparse.Namespace, root: Path) -> Pending:
    total = args.pending
    result = Pending(total)
    async with Node(root / "pending") as node:
        files = store_root(node.cluster)
        await asyncio.sleep(2.0)  # settled after start
        m0 = Memory.of(node.pid)
        result.rss_anon_0, result.rss_file_0 = m0.anon, m0.file
        result.timer_disk_0 = timer_files(files)
        result.commitlog_0 = allocated(files / "commitlog")
        base_ms = int((time.time() + args.pending_ahead_s) * 1000)
        rng = random.Random(31)
        next_seq = 0
        cpu0 = cpu_seconds(node.pid) or 0.0
        started = time.time()

        async def sender(worker: int) -> None:
            nonlocal next_seq
            queue = worker % QUEUES
            while next_seq < total:
                first = next_seq
                count = min(args.batch, total - first)
                next_seq += count
                due = [base_ms + rng.randrange(3_600_000) for _ in range(count)]
                await node.send(queue, messages(first, due, args.body))
                tenth = (first + count) * 10 // total
                if tenth > len(result.rss_curve):
                    result.rss_curve.append((first + count, Memory.of(node.pid).anon))
                if first // args.batch % 200 == 0:
                    rate = (first + count) / (time.time() - started)
                    log(f"pending: sent {first + count:,} of {total:,} ({rate:,.0f}/s)")

        await asyncio.gather(*(sender(w) for w in range(args.senders)))
        result.send_s = time.time() - started
        # The timer store counts a message once it has read it from the CommitLog.
        last, still = -1, 0
        while True:
            status = await node.schedule()
            counted = -1 if status is None else status.timer_pending
            if counted >= total or counted < 0:
                break
            still = still + 1 if counted == last else 0
            if still >= 10:
                break
            last = counted
            await asyncio.sleep(1.0)
        result.counted = counted
        result.settle_s = time.time() - started - result.send_s
        result.cpu_s = (cpu_seconds(node.pid) or 0.0) - cpu0
        await asyncio.sleep(2.0)
        mn = Memory.of(node.pid)
        result.rss_anon_n, result.rss_file_n = mn.anon, mn.file
        result.timer_disk_n = timer_files(files)
        result.commitlog_n = allocated(files / "commitlog")
    return result


# -- the report --------------------------------------------------------------------------

#: The tables' columns: a lone figure prints as its number, its unit beside it.
COLUMNS = ("figure", "value", "unit", "target", "status")


def _status(ok: bool) -> str:
    return "met" if ok else "NOT MET"


def _ms(label: str, value: float) -> Figure:
    return Figure(value, "ms", label=label, fmt=",.0f")


def _mib(value: int, label: str = "") -> Figure:
    return Figure(value / MiB, "MiB", label=label, better=None, fmt=",.1f")


def _spread(values: Sequence[int]) -> Cell:
    """p50, p99 and max of sorted ``values`` in ms (``-`` when there are none)."""
    if not values:
        return "-"
    return [
        _ms(label, percentile(values, q))
        for label, q in (("p50", 0.5), ("p99", 0.99), ("max", 1.0))
    ]


def _table(name: str, rows: Sequence[tuple[str, Cell] | tuple[str, Cell, str, bool]]) -> Table:
    """Rows of (what, value[, target, met]); a lone figure's unit goes beside it."""
    t = Table(name, COLUMNS)
    for what, value, *judged in rows:
        unit = value.unit if isinstance(value, Figure) else ""
        target, status = (judged[0], _status(bool(judged[1]))) if judged else ("", "")
        t.add(what, value, unit, str(target), status)
    return t


def lateness_table(late: Lateness) -> Table:
    """Part 1's figures (see the module's doc)."""
    values = sorted(late.late_ms)
    p99 = percentile(values, 0.99) if values else math.nan
    cpu_us = late.cpu_s / max(late.received, 1) * 1e6
    busy = Figure(late.machine_busy_pct, "%", label="busy", better=None, fmt=".0f")
    stolen = Figure(late.steal_pct, "%", label="stolen", better=None, fmt=".1f")
    return _table(
        "lateness",
        [
            (
                f"{late.messages:,} timers over {late.window_s:.0f} s: received",
                count(late.received),
            ),
            ("duplicates", count(late.duplicates, lower_is_better=True)),
            ("lateness p50 (consumer)", _ms("", percentile(values, 0.5) if values else math.nan)),
            ("lateness p99 (consumer)", _ms("", p99), "<= 100 ms", p99 <= LATENESS_P99_TARGET_MS),
            ("lateness max (consumer)", _ms("", values[-1] if values else math.nan)),
            ("consumer part (arrival - store time)", _spread(sorted(late.pull_ms))),
            ("put lateness (store time - due time)", _spread(sorted(late.put_late_ms))),
            (
                "delivered before their time",
                count(late.early, lower_is_better=True),
                "0",
                not late.early,
            ),
            (
                "store-node CPU / scheduled message",
                [Figure(cpu_us, "µs/msg", fmt=",.0f"), Figure(late.cpu_s, "s", "total", None)],
            ),
            (
                "store-node RssAnon",
                [_mib(late.rss_anon_start, "start"), _mib(late.rss_anon_peak, "peak")],
            ),
            (
                "store-node RssFile",
                [_mib(late.rss_file_start, "start"), _mib(late.rss_file_peak, "peak")],
            ),
            ("machine busy / stolen (part 1)", [busy, stolen]),
        ],
    )


def pending_table(pend: Pending) -> Table:
    """Part 2's figures (see the module's doc)."""
    growth = (pend.rss_anon_n - pend.rss_anon_0) / MiB
    rate = Figure(pend.pending / max(pend.send_s, 1e-9), "msgs/s", fmt=",.0f")
    per_timer = (pend.timer_disk_n - pend.timer_disk_0) / max(pend.pending, 1)
    curve = " ".join(f"{anon / MiB:.0f}" for _, anon in pend.rss_curve) + " MiB"
    return _table(
        "pending",
        [
            (f"{pend.pending:,} pending: sent", [Figure(pend.send_s, "s", better=None), rate]),
            (
                "pending counted",
                count(pend.counted) if pend.counted >= 0 else "(no GetScheduleStatus)",
            ),
            ("counted after the last send", Figure(pend.settle_s, "s", better=None, fmt=",.0f")),
            ("RssAnon at 0 / at N", [_mib(pend.rss_anon_0, "at 0"), _mib(pend.rss_anon_n, "at N")]),
            ("RssAnon growth", Figure(growth, "MiB", fmt=",.1f"), "<= +64 MiB", growth <= 64),
            ("RssAnon after each 10 % sent", curve),
            ("RssFile at 0 / at N", [_mib(pend.rss_file_0, "at 0"), _mib(pend.rss_file_n, "at N")]),
            (
                "timer files at 0 / at N",
                [
                    _mib(pend.timer_disk_0, "at 0"),
                    _mib(pend.timer_disk_n, "at N"),
                    Figure(per_timer, "B/timer", fmt=".1f"),
                ],
            ),
            (
                "CommitLog at 0 / at N",
                [_mib(pend.commitlog_0, "at 0"), _mib(pend.commitlog_n, "at N")],
            ),
            (
                "store-node CPU / pending timer (put + enqueue)",
                Figure(pend.cpu_s / max(pend.pending, 1) * 1e6, "µs/msg", fmt=",.0f"),
            ),
        ],
    )


async def run(args: argparse.Namespace, root: Path) -> tuple[Lateness | None, Pending | None]:
    late = await lateness(args, root) if args.messages > 0 else None
    pend = await pending(args, root) if args.pending > 0 else None
    return late, pend


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000, help="part 1 (0: skip)")
    parser.add_argument("--window-s", type=float, default=600.0)
    parser.add_argument("--lead-s", type=float, default=5.0, help="the first due time from now")
    parser.add_argument("--grace-s", type=float, default=60.0, help="wait past the last due")
    parser.add_argument("--pending", type=int, default=10_000_000, help="part 2 (0: skip)")
    parser.add_argument("--pending-ahead-s", type=float, default=86_400.0)
    parser.add_argument("--batch", type=int, default=500, help="part 2's messages per send")
    parser.add_argument("--senders", type=int, default=4, help="part 2's sends in flight")
    parser.add_argument("--body", type=int, default=100, help="body bytes (>= 16)")
    parser.add_argument("--quick", action="store_true", help="~2 min: 30,000 / 60 s / 500,000")
    parser.add_argument(
        "--timer-precision-ms",
        type=int,
        help="the store-node's timer_precision_ms (BASALT_TIMER_PRECISION_MS; default: its own)",
    )
    add_json_out(parser)
    args = parser.parse_args(argv)
    if args.quick:
        args.messages, args.window_s, args.pending = 30_000, 60.0, 500_000
        args.grace_s = 20.0
    args.body = max(args.body, _HEAD.size)
    if args.timer_precision_ms is not None:
        # cluster up's processes inherit the environment; a BASALT_* variable
        # sets a store-node setting (docs/configuration.md).
        os.environ["BASALT_TIMER_PRECISION_MS"] = str(args.timer_precision_ms)
    report = Report.start(__file__, args, argv)
    # Where the clusters go: $BASALT_BENCH_DIR, or the system's temp dir.
    bench_dir = os.environ.get("BASALT_BENCH_DIR")
    with tempfile.TemporaryDirectory(prefix="basalt-timers-", dir=bench_dir) as tmp:
        late, pend = asyncio.run(run(args, Path(tmp)))
    if late is not None:
        report.emit(lateness_table(late))
    if pend is not None:
        report.emit(pending_table(pend))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
