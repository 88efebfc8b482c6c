"""Replication's cost and failover (issue 29, docs/replication.md).

Each part starts its own ``basalt cluster up --store-nodes 1 --replicas N``
(etcd, the members of ``broker-a``, a pull-service; RocketMQ's file sizes, all
on this machine's one disk, on loopback) and always runs ``cluster down``:

1. **Produce** with 1, 2 and 3 replicas, SYNC and ASYNC (``replica_ack_mode``;
   one copy has no mode), in ``--rounds`` rounds, the configurations in
   another order each round: the SDK's batched produce (``Producer.send_batch``
   of ``--batch`` 1 KiB messages, ``--senders`` in flight, ``--duration`` s)
   and one send in flight (``await producer.send`` one after another,
   ``--latency-sends`` of them: p50 / p99). The machine's speed moves by
   ±20 % from one run to the next, so each replicated figure is also given as
   a ratio to the single-copy figure of the same round (the median ratio).
2. **Failover**: 3 replicas, SYNC, ``min_in_sync_replicas`` 2, lease TTL 3 s
   (the defaults). A prober sends one message after another through the SDK
   (``send_msg_timeout_ms`` 500: the route, NOT_MASTER refusals and retries
   are the SDK's). Each of ``--kills`` times: ``kill -9`` the master, time
   until the first send *started after the kill* is acknowledged (by the new
   master: the old one is dead), then start the killed member again with its
   own argv (it rejoins as a slave) and wait until the group's in-sync set is
   whole again before the next kill.
3. **Catch-up**: 2 replicas, ASYNC, ``min_in_sync_replicas`` 1. Stop the
   slave (SIGTERM), write ``--catchup-mib`` MiB to the master with batched
   sends, start the slave again and time until its registered max offset
   (``groups/broker-a/members/1`` in etcd, what ``clusterList`` shows; a
   slave acks what it has written) reaches the master's. Members refresh
   their registration every 0.5 s, so the end is seen up to ~0.5 s late; the
   "transfer" figure is the slope between the first and last registration
   that moved, which that lag does not bias.

Prints one table per part (and the per-round ratios) and writes them as JSON
(``--json-out``, benchmarks/report.py). Usage::

    .venv/bin/python benchmarks/replication.py [--rounds 3] [--kills 20] [--catchup-mib 1024]
    .venv/bin/python benchmarks/replication.py --quick   # ~3 min smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from basalt.client import Producer, ProducerConfig
from basalt.client.errors import ClientError
from basalt.common.local_cluster import CLUSTER_FILE, load_processes, write_processes
from basalt.common.message import Message
from basalt.services import process
from basalt.services.cluster.local import CLUSTER_NAME, healthy
from basalt.services.meta import MetaClient, MetaConfig, TopicConfig
from benchmarks.e2e_client import Cluster
from benchmarks.report import Figure, Report, Table, add_json_out

TOPIC = "ReplBench"
BROKER = "broker-a"
BODY = 1024
#: (replicas, ack mode) of part 1; one copy has no mode to choose.
CONFIGS: tuple[tuple[int, str], ...] = (
    (1, "-"),
    (2, "SYNC"),
    (2, "ASYNC"),
    (3, "SYNC"),
    (3, "ASYNC"),
)
LEASE_TTL_S = 3.0
#: Targets (issue 29 section 6).
PRODUCE_RATIO_TARGET = 0.60  # 3 replicas SYNC batched produce / one copy, same round
FAILOVER_P99_TARGET_S = LEASE_TTL_S + 1.0
CATCHUP_TARGET_MB_S = 200.0


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) by nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered) + 0.5) - 1))]


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# -- the cluster ------------------------------------------------------------------------


class Group:
    """A ``cluster up`` of one broker group; kill and restart its members."""

    def __init__(self, root: Path, replicas: int, mode: str, *, min_in_sync: int | None) -> None:
        args = ["--store-nodes", "1", "--replicas", str(replicas)]
        if mode != "-":
            args += ["--replica-ack-mode", mode]
        if min_in_sync is not None:
            args += ["--min-in-sync-replicas", str(min_in_sync)]
        self.cluster = Cluster(root, up_args=args)
        self.replicas = replicas
        self.meta: MetaClient | None = None

    async def __aenter__(self) -> Group:
        self.cluster.up()
        self.meta = MetaClient(
            MetaConfig(endpoints=(self.cluster.etcd_address,), cluster=CLUSTER_NAME)
        )
        await self.meta.connect()
        await self.meta.create_topic(
            TopicConfig(topic_name=TOPIC, read_queue_nums=8, write_queue_nums=8, brokers=(BROKER,))
        )
        await self.wait_whole(60.0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.meta is not None:
            await self.meta.close()
        self.cluster.down()
        shutil.rmtree(self.cluster.data_dir, ignore_errors=True)

    def name(self, broker_id: int) -> str:
        return BROKER if self.replicas == 1 else f"{BROKER}-{broker_id}"

    async def group(self) -> tuple[int, frozenset[int], dict[int, int]]:
        """(master id, in-sync set, registered max offset by member id); the
        master id is -1 while there is no state."""
        assert self.meta is not None
        state, members = await self.meta.get_group(BROKER)
        offsets = {i: m.max_offset for i, m in members.items()}
        if state is None:
            return -1, frozenset(), offsets
        return state.master_id, state.sync_state_set, offsets

    async def wait_whole(self, timeout_s: float) -> None:
        """Until every member is registered and in the in-sync set (a single
        copy: until its route is published)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            master, in_sync, members = await self.group()
            if self.replicas == 1:
                if master >= 0 or await self._routed():
                    return
            elif len(in_sync) == self.replicas and len(members) == self.replicas:
                return
            await asyncio.sleep(0.05)
        raise RuntimeError(f"group not whole after {timeout_s} s: {await self.group()}")

    async def wait_caught_up(self, timeout_s: float) -> None:
        """Until every member's registered max offset is the master's, twice in
        a row 0.6 s apart (registrations are refreshed every 0.5 s)."""
        deadline = time.monotonic() + timeout_s
        seen: tuple[int, ...] = ()
        while time.monotonic() < deadline:
            _, _, offsets = await self.group()
            values = tuple(offsets[i] for i in sorted(offsets))
            if len(values) == self.replicas and len(set(values)) == 1:
                if values == seen:
                    return
                seen = values
            await asyncio.sleep(0.6)
        raise RuntimeError(f"members not caught up after {timeout_s} s: {await self.group()}")

    async def _routed(self) -> bool:
        assert self.meta is not None
        return BROKER in await self.meta.list_brokers()

    def stop(self, broker_id: int, sig: signal.Signals) -> list[str]:
        """Signal member ``broker_id``, wait until it is gone; its argv."""
        node = next(p for p in self.cluster.processes if p.name == self.name(broker_id))
        argv = Path(f"/proc/{node.pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
        os.kill(node.pid, sig)
        deadline = time.monotonic() + 60
        while not exited(node.pid):
            if time.monotonic() > deadline:
                if sig is signal.SIGKILL:
                    raise RuntimeError(f"{node.name} still running 60 s after SIGKILL")
                # Seen once (a slave, on a machine at load average ~8): say so
                # and go on, the measure is of what follows.
                log(f"{node.name} still running 60 s after {sig.name}: SIGKILL")
                sig = signal.SIGKILL
                os.kill(node.pid, sig)
                deadline = time.monotonic() + 60
            time.sleep(0.001)
        return [a.decode() for a in argv]

    async def start(self, broker_id: int, argv: list[str]) -> None:
        """Start member ``broker_id`` again with ``argv`` (same port, same store
        root); returns once it serves. Its pid goes to cluster.json so that
        ``cluster down`` stops it."""
        name = self.name(broker_id)
        state = self.cluster.data_dir / CLUSTER_FILE
        infos = load_processes(state)
        info = next(p for p in infos if p.name == name)
        with open(info.log, "ab") as out:
            child = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=process.service_env(),
                start_new_session=True,
            )
        # Our child now: reaped by a thread, or `cluster down` waits on a zombie.
        threading.Thread(target=child.wait, daemon=True).start()
        write_processes(state, [replace(p, pid=child.pid) if p.name == name else p for p in infos])
        self.cluster.processes = [
            replace(p, pid=child.pid) if p.name == name else p for p in self.cluster.processes
        ]
        deadline = time.monotonic() + 120
        while not await healthy(info.address):
            if child.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not come back: see {info.log}")
            await asyncio.sleep(0.02)


def exited(pid: int) -> bool:
    """Whether ``pid`` is gone or a zombie (its port and files are free)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat[stat.rindex(")") + 2] == "Z"


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def messages(n: int) -> list[Message]:
    body = bytes(BODY)
    return [Message(TOPIC, body, tags="TagA") for _ in range(n)]


async def first_send(producer: Producer, timeout_s: float = 30.0) -> None:
    """One send acknowledged (routes known, streams up)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            await producer.send(messages(1)[0])
            return
        except ClientError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


# -- part 1: produce ---------------------------------------------------------------------


@dataclass(slots=True)
class ProduceResult:
    replicas: int
    mode: str
    round: int
    rate: float  # batched msgs/s
    p50_us: float
    p99_us: float
    sends: int
    #: CPU µs a message during the batched window: the master, the slaves
    #: (together), this process (the SDK).
    cpu_us: tuple[float, float, float] = (0.0, 0.0, 0.0)


async def batched(producer: Producer, senders: int, batch: int, duration_s: float) -> float:
    """msgs/s of ``senders`` send_batch loops for ``duration_s``."""
    sent = 0
    stop = time.monotonic() + duration_s

    async def sender() -> None:
        nonlocal sent
        while time.monotonic() < stop:
            # Not `sent += len(await ...)`: that reads `sent` before the await,
            # and the other senders' counts made meanwhile would be lost.
            acked = len(await producer.send_batch(messages(batch)))
            sent += acked

    started = time.monotonic()
    await asyncio.gather(*(sender() for _ in range(senders)))
    return sent / (time.monotonic() - started)


async def one_in_flight(producer: Producer, count: int) -> list[float]:
    """Latencies (µs) of ``count`` sends, one at a time."""
    out = []
    for m in messages(count):
        t0 = time.perf_counter()
        await producer.send(m)
        out.append((time.perf_counter() - t0) * 1e6)
    return out


async def produce_config(
    root: Path, replicas: int, mode: str, r: int, args: argparse.Namespace
) -> ProduceResult:
    group = Group(root / f"p{r}-{replicas}-{mode}", replicas, mode, min_in_sync=None)
    async with group as g, Producer(g.cluster.pull_address, group="repl-bench") as producer:
        await first_send(producer)
        await batched(producer, args.senders, args.batch, 1.0)  # warm-up
        master, _, _ = await g.group()
        pids = {p.name: p.pid for p in g.cluster.of_role("store-node")}
        before = {n: cpu_seconds(pid) for n, pid in pids.items()}
        own = time.process_time()
        rate = await batched(producer, args.senders, args.batch, args.duration)
        own = time.process_time() - own
        # ASYNC slaves may still be behind: their copying is part of the cost,
        # and the one-in-flight sends must not share the cores with it.
        await g.wait_caught_up(60.0)
        spent = {n: cpu_seconds(pid) - before[n] for n, pid in pids.items()}
        count = rate * args.duration
        master_name = g.name(max(master, 0))
        cpu = (
            spent[master_name] / count * 1e6,
            sum(v for n, v in spent.items() if n != master_name) / count * 1e6,
            own / count * 1e6,
        )
        lat = await one_in_flight(producer, args.latency_sends)
    result = ProduceResult(
        replicas, mode, r, rate, percentile(lat, 0.5), percentile(lat, 0.99), len(lat), cpu
    )
    log(
        f"  round {r} {replicas} x {mode}: {rate:,.0f} msgs/s, one in flight "
        f"p50 {result.p50_us:,.0f} µs p99 {result.p99_us:,.0f} µs; CPU µs/msg master "
        f"{cpu[0]:.1f} slaves {cpu[1]:.1f} client {cpu[2]:.1f}"
    )
    return result


async def part_produce(root: Path, args: argparse.Namespace) -> list[ProduceResult]:
    results = []
    for r in range(args.rounds):
        order = CONFIGS if r % 2 == 0 else tuple(reversed(CONFIGS))
        log(f"produce round {r + 1}/{args.rounds}: {[f'{n}x{m}' for n, m in order]}")
        for replicas, mode in order:
            results.append(await produce_config(root, replicas, mode, r, args))
    return results


# -- part 2: failover --------------------------------------------------------------------


@dataclass(slots=True)
class Prober:
    """Sends one message after another; the times each acknowledged send started
    and ended (monotonic), and how many failed."""

    producer: Producer
    acked: list[tuple[float, float]] = field(default_factory=list)
    failed: int = 0
    running: bool = True

    async def run(self) -> None:
        (m,) = messages(1)
        while self.running:
            t0 = time.monotonic()
            try:
                await self.producer.send(m)
            except ClientError:
                self.failed += 1
                await asyncio.sleep(0.005)  # not a busy spin on a refused port
                continue
            self.acked.append((t0, time.monotonic()))

    async def first_ack_after(self, t: float, timeout_s: float) -> float:
        """The end of the first acknowledged send started at or after ``t``."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            later = [done for started, done in self.acked[-64:] if started >= t]
            if later:
                return min(later)
            await asyncio.sleep(0.002)
        raise RuntimeError(f"no send acknowledged within {timeout_s} s of the kill")


async def part_failover(root: Path, args: argparse.Namespace) -> list[float]:
    times: list[float] = []
    async with Group(root / "failover", 3, "SYNC", min_in_sync=2) as g:
        config = ProducerConfig(
            producer_group="repl-bench-probe",
            send_msg_timeout_ms=500,
            retry_times_when_send_failed=2,
        )
        async with Producer(g.cluster.pull_address, group="x", config=config) as producer:
            await first_send(producer)
            prober = Prober(producer)
            task = asyncio.create_task(prober.run())
            try:
                for k in range(args.kills):
                    await g.wait_whole(120.0)
                    await asyncio.sleep(0.5)  # a steady stream before the kill
                    master, _, _ = await g.group()
                    killed_at = time.monotonic()
                    argv = g.stop(master, signal.SIGKILL)
                    acked = await prober.first_ack_after(time.monotonic(), 60.0)
                    times.append(acked - killed_at)
                    new_master, _, _ = await g.group()
                    log(
                        f"  kill {k + 1}/{args.kills}: master {master} -> {new_master}, "
                        f"first ack after {times[-1]:.3f} s"
                    )
                    await g.start(master, argv)
            finally:
                prober.running = False
                await task
    return times


# -- part 3: catch-up --------------------------------------------------------------------


@dataclass(slots=True)
class CatchUp:
    behind_bytes: int
    total_s: float  # slave's start to its registered offset at the master's
    serving_s: float  # slave's start to health SERVING
    transfer_mb_s: float  # slope between the first and last registration that moved
    samples: int


async def part_catchup(root: Path, args: argparse.Namespace) -> CatchUp:
    async with Group(root / "catchup", 2, "ASYNC", min_in_sync=1) as g:
        async with Producer(g.cluster.pull_address, group="repl-bench") as producer:
            await first_send(producer)
            master, _, _ = await g.group()
            slave = 1 - master
            _, _, offsets = await g.group()
            slave_from = offsets[slave]  # idle: its registration stands
            argv = g.stop(slave, signal.SIGTERM)
            target_bytes = args.catchup_mib << 20
            log(f"catch-up: slave {slave} stopped; writing {args.catchup_mib} MiB to the master")
            written_from = offsets[master]
            while True:
                await batched(producer, args.senders, args.batch, 0.5)
                _, _, offsets = await g.group()
                if offsets[master] - written_from >= target_bytes:
                    break
        # The master's registration is refreshed every 0.5 s: wait until it stands.
        await asyncio.sleep(1.2)
        _, _, offsets = await g.group()
        master_offset = offsets[master]
        started = time.monotonic()
        start_task = asyncio.create_task(g.start(slave, argv))
        serving_s = 0.0
        samples: list[tuple[float, int]] = []
        while True:
            if start_task.done() and not serving_s:
                await start_task
                serving_s = time.monotonic() - started
            _, _, offsets = await g.group()
            now = time.monotonic()
            if slave in offsets:
                if not samples or offsets[slave] != samples[-1][1]:
                    samples.append((now, offsets[slave]))
                if offsets[slave] >= master_offset:
                    break
            if now - started > 600:
                raise RuntimeError(f"slave not caught up after 600 s: {samples[-3:]}")
            await asyncio.sleep(0.02)
        total_s = time.monotonic() - started
        await start_task
        if not serving_s:
            serving_s = total_s
        moved = [s for s in samples if s[1] > samples[0][1]]
        transfer = 0.0
        if len(moved) >= 2:
            (t0, o0), (t1, o1) = moved[0], moved[-1]
            transfer = (o1 - o0) / (t1 - t0) / 1e6 if t1 > t0 else 0.0
        return CatchUp(master_offset - slave_from, total_s, serving_s, transfer, len(samples))


# -- report ------------------------------------------------------------------------------


def produce_table(results: list[ProduceResult]) -> Table:
    """Per configuration: median batched rate, its median ratio to the single
    copy of the same round, the ratios per round, one-in-flight p50 / p99 and
    CPU a message (medians over rounds)."""
    single = {r.round: r.rate for r in results if r.replicas == 1}
    table = Table(
        "produce",
        ("replicas", "ack mode", "batched msgs/s", "ratio", "ratio per round",
         "1-in-flight p50 µs", "p99 µs", "CPU µs/msg master", "slaves", "SDK", "target",
         "status"),
        key=("replicas", "ack mode"),
    )  # fmt: skip
    for replicas, mode in CONFIGS:
        mine = [r for r in results if (r.replicas, r.mode) == (replicas, mode)]
        if not mine:
            continue
        ratios = [r.rate / single[r.round] for r in mine]
        ratio = statistics.median(ratios)
        target, status = "", ""
        if (replicas, mode) == (3, "SYNC"):
            target = f">= {PRODUCE_RATIO_TARGET:.0%} of 1 copy"
            status = "met" if ratio >= PRODUCE_RATIO_TARGET else "NOT MET"
        cpu = [statistics.median(r.cpu_us[i] for r in mine) for i in range(3)]
        table.add(
            f"{replicas} cop{'y' if replicas == 1 else 'ies'}",
            mode,
            Figure(statistics.median(r.rate for r in mine), "msgs/s", fmt=",.0f"),
            Figure(ratio, "x", better="higher", fmt=".2f"),
            " ".join(f"{x:.2f}" for x in ratios),
            Figure(statistics.median(r.p50_us for r in mine), "µs", fmt=",.0f"),
            Figure(statistics.median(r.p99_us for r in mine), "µs", fmt=",.0f"),
            *(Figure(x, "µs/msg", fmt=".1f") for x in cpu),
            target,
            status,
        )
    return table


def failover_table(times: list[float]) -> Table:
    p99 = percentile(times, 0.99)
    table = Table(
        "failover", ("what", "kills", "min s", "p50 s", "p99 s", "max s", "target", "status")
    )
    table.add(
        "kill -9 of the master to the next send acknowledged",
        Figure(len(times), better=None, fmt=","),
        *(Figure(x, "s", fmt=".3f") for x in (min(times), percentile(times, 0.5), p99, max(times))),
        f"<= {FAILOVER_P99_TARGET_S:.1f} s (p99)",
        "met" if p99 <= FAILOVER_P99_TARGET_S else "NOT MET",
    )
    return table


def catchup_table(c: CatchUp) -> Table:
    overall = c.behind_bytes / c.total_s / 1e6
    table = Table(
        "catch-up",
        ("what", "MiB behind", "to SERVING s", "to caught up s", "MB/s (start to caught up)",
         "MB/s (transfer slope)", "target", "status"),
    )  # fmt: skip
    table.add(
        "a slave restarted behind the master",
        Figure(c.behind_bytes / (1 << 20), better=None, fmt=",.0f"),
        Figure(c.serving_s, "s", fmt=".2f"),
        Figure(c.total_s, "s", fmt=".2f"),
        Figure(overall, "MB/s", fmt=",.0f"),
        Figure(c.transfer_mb_s, "MB/s", fmt=",.0f"),
        f">= {CATCHUP_TARGET_MB_S:.0f} MB/s",
        "met" if overall >= CATCHUP_TARGET_MB_S else "NOT MET",
    )
    return table


async def run(args: argparse.Namespace, root: Path, report: Report) -> None:
    if args.rounds:
        results = await part_produce(root, args)
        print(
            f"\nproduce: SDK send_batch of {args.batch} x 1 KiB, {args.senders} in flight, "
            f"{args.duration:g} s; one in flight: {args.latency_sends} sends; "
            f"{args.rounds} rounds (medians; ratio: to 1 copy of the same round)",
            flush=True,
        )
        report.emit(produce_table(results))
    if args.kills:
        times = await part_failover(root, args)
        print(
            "\nfailover: 3 replicas SYNC, min in-sync 2, lease TTL 3 s; kill -9 of the master "
            "to the first acknowledged send started after it",
            flush=True,
        )
        report.emit(failover_table(times))
    if args.catchup_mib:
        c = await part_catchup(root, args)
        print(
            "\ncatch-up: 2 replicas ASYNC; a slave restarted behind the master, "
            "until its registered offset reaches the master's",
            flush=True,
        )
        report.emit(catchup_table(c))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="produce rounds (0: skip)")
    parser.add_argument("--duration", type=float, default=5.0, help="batched produce seconds")
    parser.add_argument("--senders", type=int, default=32, help="send_batch calls in flight")
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--latency-sends", type=int, default=1000, help="one-in-flight sends")
    parser.add_argument("--kills", type=int, default=20, help="failover kills (0: skip)")
    parser.add_argument(
        "--catchup-mib", type=int, default=1024, help="how far behind the slave restarts (0: skip)"
    )
    parser.add_argument(
        "--quick", action="store_true", help="1 round of 2 s, 3 kills, 128 MiB behind"
    )
    add_json_out(parser)
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.duration, args.latency_sends = 1, 2.0, 300
        args.kills, args.catchup_mib = 3, 128
    report = Report.start(__file__, args, argv)
    free = shutil.disk_usage(tempfile.gettempdir()).free
    if args.catchup_mib and free < 4 * (args.catchup_mib << 20) + (8 << 30):
        log(f"only {free >> 30} GiB free: --catchup-mib {args.catchup_mib} needs more")
        return 2
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="basalt-repl-") as tmp:
        asyncio.run(run(args, Path(tmp), report))
    log(f"total {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
