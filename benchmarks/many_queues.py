"""Many queues: what a topic costs a store-node, from 1 to 20,000 topics × 4 queues.

Starts ``basalt cluster up`` (etcd, 2 store-nodes with default settings, 1
pull-service) in a temp directory and grows it step by step to each ``--topics``
count N (default 1, 100, 1,000, 5,000, 20,000). A topic has 4 queues: 2 on each
store-node (``read_queue_nums = write_queue_nums = 2`` on both brokers), so N
topics are 2·N queues per node. Each step:

1. **create** the new topics in etcd (MetaClient, as ``mqadmin updateTopic`` does);
2. **wake, fresh** — on a sample of the new, never-written queues: a long poll
   through the pull-service held at offset 0, then one SendMessage straight to
   the store-node; the wake latency runs from the send's start to the pull's
   answer;
3. **first put** — one SendMessage into each of a sample of other fresh queues,
   one after another (the sends of step 2 count too: they are first puts);
4. **fill** — every new queue gets ``--messages-per-queue`` 1 KiB messages
   (one SendBatch each), so every queue is "idle with a few messages";
5. **resources** per store-node: RSS (``/proc/<pid>/status`` VmRSS), open fds
   (``/proc/<pid>/fd``), mmaps (``/proc/<pid>/maps`` lines), disk used
   (``st_blocks``) by its store root and by its ``consumequeue/``; per queue:
   the ``consumequeue/`` disk over the node's queues, and the RSS outside the
   CommitLog and IndexFile mappings (``/proc/<pid>/smaps``) grown since the
   cluster had no topic, over the node's queues;
6. **wake, old** — as 2, on queues that hold messages (held at their max offset);
7. **produce** — the SDK ``Producer`` (through the pull-service), ``--senders``
   ``send_batch`` calls of ``--batch`` 1 KiB messages in flight for
   ``--duration`` s, round robin over the N topics (routes fetched first);
8. **restart** ``broker-a``: SIGTERM, then kill -9; each timed from the signal
   until the new process answers health SERVING (its own argv, same port).

Targets (issue 15), printed beside the figures as met / NOT MET: 20,000 topics
× 4 run with default settings; an idle queue with a few messages costs <= 64
KiB of disk and <= 64 KiB of RSS; produce over 5,000 topics within 20 % of 1
topic in the same run; first put into a new queue <= 1 ms (p50); restart <= 5
s at 40,000 queues per node (checked at every step, binding at N = 20,000).

**Disk and memory guard.** Before a step the script projects what the new
queues will take from the per-queue cost measured so far (6 MiB a queue
before the first measurement): when that exceeds the free disk of the data
directory less a reserve (10 % of the filesystem, at least 5 GiB), or
MemAvailable less a reserve (20 % of MemTotal, at least 4 GiB; the ConsumeQueue
pages are mapped, so they are RSS and page cache), it stops there and says
why. Other processes share the machine: the reserves leave them room. The
cluster is always torn down (``basalt cluster down``) and its directory deleted.

The cluster shares the machine's cores with this process, so rates move with
whatever else runs; the per-queue costs and latencies are what to compare
across trees.

Usage::

    .venv/bin/python benchmarks/many_queues.py [--topics 1,100,1000,5000,20000] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import TypeVar

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import grpc

from basalt.client import Producer
from basalt.common.local_cluster import CLUSTER_FILE, load_processes, write_processes
from basalt.common.message import Message
from basalt.services import process
from basalt.services.cluster.local import CLUSTER_NAME, healthy
from basalt.services.meta import MetaClient, MetaConfig, TopicConfig
from basalt.v1 import common_pb2 as pb
from basalt.v1 import pull_service_pb2 as ps
from basalt.v1 import pull_service_pb2_grpc as ps_grpc
from basalt.v1 import store_node_pb2 as sn
from basalt.v1 import store_node_pb2_grpc as sn_grpc
from benchmarks.e2e_client import Cluster, ProcessEntry
from benchmarks.report import Cell, Figure, Report, Table, add_json_out

T = TypeVar("T")

KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB
#: Queues of a topic on each store-node (4 a topic over the two nodes).
QUEUES_PER_NODE = 2
BODY = bytes(1024)
TOPIC_PREFIX = "ManyQ"
GROUP = "many-queues-bench"
#: A queue's cost before any is measured: today's 6,000,000-byte ConsumeQueue file.
ASSUMED_QUEUE_COST = 6_000_000
#: RPCs in flight while creating topics and filling queues.
CONCURRENCY = 32
#: How long a probe's pull is held before the send that wakes it.
HOLD_S = 0.1

# Targets (issue 15).
TARGET_TOPICS = 20_000
TARGET_QUEUE_DISK = 64 * KIB
TARGET_QUEUE_RSS = 64 * KIB
TARGET_PRODUCE_RATIO = 0.8  # N = 5,000 against N = 1
TARGET_FIRST_PUT_MS = 1.0
TARGET_RESTART_S = 5.0
TARGET_RESTART_QUEUES = 40_000


def topic_name(i: int) -> str:
    return f"{TOPIC_PREFIX}{i:05d}"


@dataclass(frozen=True, slots=True)
class QueueId:
    """One queue: a topic's queue ``queue_id`` on store-node ``node``."""

    node: ProcessEntry
    topic: str
    queue_id: int


# -- measurements --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NodeUsage:
    """One store-node's resources at one moment (bytes and counts)."""

    rss: int
    rss_shared_files: int  # Rss of the CommitLog and IndexFile mappings
    fds: int
    mmaps: int
    disk: int  # the whole store root, st_blocks
    disk_cq: int  # consumequeue/, st_blocks

    @property
    def rss_own(self) -> int:
        """RSS outside the CommitLog and IndexFile mappings: what queues and topics cost."""
        return self.rss - self.rss_shared_files


def disk_used(root: Path) -> int:
    """Bytes allocated (``st_blocks`` × 512) under ``root``; files that vanish are skipped."""
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
            except FileNotFoundError:
                continue
    return total


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds ``pid`` has used (``/proc/<pid>/stat``), all threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def vm_rss(pid: int) -> int:
    """The resident set of ``pid`` in bytes (``/proc/<pid>/status`` VmRSS)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * KIB
    return 0


def node_usage(pid: int, store_root: Path) -> NodeUsage:
    """:class:`NodeUsage` of the store-node ``pid`` whose store lives in ``store_root``."""
    proc = Path(f"/proc/{pid}")
    shared = 0
    counting = False
    mmaps = 0
    with (proc / "smaps").open() as smaps:
        for line in smaps:
            head = line.split(maxsplit=6)
            if "-" in head[0] and len(head) >= 5 and ":" in head[3]:  # a mapping's first line
                mmaps += 1
                path = head[5].rstrip("\n") if len(head) > 5 else ""
                counting = "/commitlog/" in path or "/index/" in path
            elif counting and head[0] == "Rss:":
                shared += int(head[1]) * KIB
    return NodeUsage(
        rss=vm_rss(pid),
        rss_shared_files=shared,
        fds=len(os.listdir(proc / "fd")),
        mmaps=mmaps,
        disk=disk_used(store_root),
        disk_cq=disk_used(store_root / "consumequeue"),
    )


def free_disk(path: Path) -> tuple[int, int]:
    """(bytes available to this user, filesystem size) of ``path``'s filesystem."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize


def memory() -> tuple[int, int]:
    """(MemAvailable, MemTotal) in bytes, from /proc/meminfo."""
    fields = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        name, value = line.split(":", 1)
        fields[name] = int(value.split()[0]) * KIB
    return fields["MemAvailable"], fields["MemTotal"]


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (``p`` in 0..100); NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


# -- the cluster's plumbing ------------------------------------------------------------


async def bounded(n: int, jobs: Iterable[Callable[[], Awaitable[T]]]) -> list[T]:
    """Run ``jobs`` with at most ``n`` in flight; their results in order."""
    gate = asyncio.Semaphore(n)

    async def one(job: Callable[[], Awaitable[T]]) -> T:
        async with gate:
            return await job()

    return await asyncio.gather(*(one(job) for job in jobs))


def exited(pid: int) -> bool:
    """Whether ``pid`` is gone or a zombie (a store-node is not our child: whoever
    reaps it, its port and files are free once it is a zombie)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat[stat.rindex(")") + 2] == "Z"


async def restart(cluster: Cluster, name: str, sig: signal.Signals) -> tuple[float, float]:
    """Stop store-node ``name`` with ``sig``, start it again with its own argv (same
    port, same store root) and wait for health SERVING. Returns (seconds from the
    signal to SERVING, seconds from the new process's start to SERVING); records the
    new pid in cluster.json so ``cluster down`` stops it. RuntimeError if it does not
    stop, or come back, within 10 minutes."""
    node = next(p for p in cluster.processes if p.name == name)
    argv = Path(f"/proc/{node.pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
    state = cluster.data_dir / CLUSTER_FILE
    infos = load_processes(state)
    log_path = next(p.log for p in infos if p.name == name)
    signalled = time.monotonic()
    os.kill(node.pid, sig)
    while not exited(node.pid):
        if time.monotonic() - signalled > 600:
            raise RuntimeError(f"{name} still running 10 minutes after {sig.name}")
        await asyncio.sleep(0.01)
    with open(log_path, "ab") as log:
        child = subprocess.Popen(
            [a.decode() for a in argv],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=process.service_env(),
            start_new_session=True,
        )
    # The node is this process's child now: a thread reaps it when it exits, or
    # `cluster down` (another process) would wait on a zombie for its whole grace.
    reaper = threading.Thread(target=child.wait, name=f"reap-{name}", daemon=True)
    reaper.start()
    started = time.monotonic()
    fresh = replace(node, pid=child.pid)
    cluster.processes = [fresh if p.name == name else p for p in cluster.processes]
    write_processes(state, [replace(p, pid=child.pid) if p.name == name else p for p in infos])
    while not await healthy(node.address):
        if not reaper.is_alive():
            raise RuntimeError(f"{name} exited at restart ({child.returncode}): see {log_path}")
        if time.monotonic() - started > 600:
            raise RuntimeError(f"{name} not SERVING 10 minutes after restart: see {log_path}")
        await asyncio.sleep(0.01)
    done = time.monotonic()
    return done - signalled, done - started


async def create_topics(meta: MetaClient, first: int, end: int, brokers: tuple[str, ...]) -> None:
    """Topics ``first <= i < end``, 2 queues on each of ``brokers``."""

    def job(i: int) -> Callable[[], Awaitable[TopicConfig]]:
        return lambda: meta.create_topic(
            TopicConfig(
                topic_name=topic_name(i),
                read_queue_nums=QUEUES_PER_NODE,
                write_queue_nums=QUEUES_PER_NODE,
                brokers=brokers,
            )
        )

    await bounded(CONCURRENCY, (job(i) for i in range(first, end)))


class Nodes:
    """One channel and stub per store-node, and one to the pull-service."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.channels: dict[str, grpc.aio.Channel] = {}
        self.pull_channel = grpc.aio.insecure_channel(cluster.pull_address)
        self.pull: ps_grpc.PullServiceAsyncStub = ps_grpc.PullServiceStub(self.pull_channel)

    def stub(self, node: ProcessEntry) -> sn_grpc.StoreNodeAsyncStub:
        channel = self.channels.get(node.address)
        if channel is None:
            channel = self.channels[node.address] = grpc.aio.insecure_channel(node.address)
        return sn_grpc.StoreNodeStub(channel)

    async def close(self) -> None:
        for channel in [*self.channels.values(), self.pull_channel]:
            await channel.close()

    async def put(self, q: QueueId) -> float:
        """One 1 KiB SendMessage into ``q``; its latency in ms. RuntimeError unless SEND_OK."""
        started = time.perf_counter()
        reply = await self.stub(q.node).SendMessage(
            sn.SendMessageRequest(
                message=pb.Message(topic=q.topic, tags="TagA", body=BODY), queue_id=q.queue_id
            ),
            timeout=30,
        )
        ms = (time.perf_counter() - started) * 1000
        if reply.result.status != pb.SEND_STATUS_SEND_OK:
            raise RuntimeError(f"send to {q.topic}/{q.queue_id}: {reply.result.status}")
        return ms

    async def wait_for_topics(self, meta: MetaClient, topics: int, within_s: float = 60.0) -> str:
        """Return once every store-node and the pull-service have seen the topics
        created so far: create a sentinel topic after them (etcd's watch delivers in
        revision order), put into it on each store-node and ask the pull-service for
        its route until both succeed. The sentinel has one queue a node; the fresh
        queues under test stay untouched. Returns the sentinel's name."""
        sentinel = f"{TOPIC_PREFIX}Ready{topics}"
        stores = self.cluster.of_role("store-node")
        await meta.create_topic(
            TopicConfig(
                topic_name=sentinel,
                read_queue_nums=1,
                write_queue_nums=1,
                brokers=tuple(n.name for n in stores),
            )
        )
        deadline = time.monotonic() + within_s
        pending: list[Callable[[], Awaitable[object]]] = [
            *(partial(self.put, QueueId(node, sentinel, 0)) for node in stores),
            partial(self.pull.QueryRoute, ps.QueryRouteRequest(topic=sentinel), timeout=5),
        ]
        while pending:
            try:
                await pending[0]()
                pending.pop(0)
            except grpc.aio.AioRpcError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.05)
        return sentinel

    async def settle(self, sentinel: str, within_s: float = 600.0) -> float:
        """Wait until every store-node has dispatched everything put so far (its
        ConsumeQueues built): put into ``sentinel``'s queue 0 on each node and poll
        GetMinMaxOffset until that put is visible; dispatch runs in CommitLog order,
        so everything before it is too. Returns the seconds waited."""
        started = time.monotonic()
        for node in self.cluster.of_role("store-node"):
            q = QueueId(node, sentinel, 0)
            reply = await self.stub(node).SendMessage(
                sn.SendMessageRequest(message=pb.Message(topic=sentinel, body=BODY), queue_id=0),
                timeout=30,
            )
            while await self.max_offset(q) <= reply.result.queue_offsets[0]:
                if time.monotonic() - started > within_s:
                    raise RuntimeError(f"{node.name} has not dispatched within {within_s:.0f} s")
                await asyncio.sleep(0.02)
        return time.monotonic() - started

    async def fill(self, q: QueueId, count: int) -> None:
        """``count`` 1 KiB messages into ``q`` in one SendBatch."""
        messages = [pb.Message(tags="TagA", body=BODY) for _ in range(count)]
        await self.stub(q.node).SendBatch(
            sn.SendBatchRequest(
                topic=q.topic, queue_id=q.queue_id, messages=pb.MessageList(messages=messages)
            ),
            timeout=60,
        )

    async def max_offset(self, q: QueueId) -> int:
        reply = await self.stub(q.node).GetMinMaxOffset(
            sn.GetMinMaxOffsetRequest(topic=q.topic, queue_id=q.queue_id), timeout=10
        )
        return reply.max_offset

    async def wake(self, q: QueueId, offset: int) -> tuple[float, float]:
        """A long poll held on ``q`` at ``offset``, then one put into ``q``: (ms from
        the put's start to the pull's answer, the put's ms). RuntimeError when the
        pull comes back without the record."""
        mq = pb.MessageQueue(topic=q.topic, broker_name=q.node.name, queue_id=q.queue_id)
        pull = asyncio.ensure_future(
            self.pull.Pull(
                ps.PullRequest(
                    group=GROUP, queue=mq, offset=offset, max_nums=32, suspend_timeout_ms=10_000
                ),
                timeout=20,
            )
        )
        await asyncio.sleep(HOLD_S)
        if pull.done():
            got = pull.result()
            raise RuntimeError(f"pull on {q.topic}/{q.queue_id} not held: {got.status}")
        started = time.perf_counter()
        put_ms = await self.put(q)
        got = await pull
        wake_ms = (time.perf_counter() - started) * 1000
        if got.records.count < 1:
            raise RuntimeError(f"pull on {q.topic}/{q.queue_id} woke without the record")
        return wake_ms, put_ms


# -- one step -----------------------------------------------------------------------------


@dataclass(slots=True)
class Step:
    """The figures of one topic count."""

    topics: int
    queues_per_node: int
    create_s: float = 0.0
    settle_s: float = 0.0
    first_put_ms: list[float] = field(default_factory=list)
    wake_fresh_ms: list[float] = field(default_factory=list)
    wake_old_ms: list[float] = field(default_factory=list)
    usage: dict[str, NodeUsage] = field(default_factory=dict)
    produce_rate: float = 0.0
    produced: int = 0
    #: CPU µs a produced message, by process (store-nodes, pull-service, this client).
    produce_cpu_us: dict[str, float] = field(default_factory=dict)
    restart_term_s: float = math.nan
    start_term_s: float = math.nan
    restart_kill_s: float = math.nan
    start_kill_s: float = math.nan


async def produce(
    address: str, topics: int, args: argparse.Namespace, watched: dict[str, int]
) -> tuple[float, int, dict[str, float]]:
    """SDK send_batch round robin over ``topics`` topics for ``args.duration`` s:
    (msgs/s, messages, CPU µs a message of each ``watched`` process, by name), all
    measured after the routes are fetched."""
    names = [topic_name(i) for i in range(topics)]
    sent = 0
    turn = 0
    async with Producer(address, group=GROUP) as producer:
        await bounded(CONCURRENCY, (partial(producer.route, t) for t in names))
        stop = time.monotonic() + args.duration

        async def sender() -> None:
            nonlocal sent, turn
            while time.monotonic() < stop:
                topic = names[turn % len(names)]
                turn += 1
                batch = [Message(topic, BODY, tags="TagA") for _ in range(args.batch)]
                results = await producer.send_batch(batch)
                sent += len(results)  # after the await: `sent +=` over it would lose counts

        cpu_before = {name: cpu_seconds(pid) for name, pid in watched.items()}
        started = time.monotonic()
        await asyncio.gather(*(sender() for _ in range(args.senders)))
        secs = time.monotonic() - started
        cpu_us = {
            name: (cpu_seconds(pid) - cpu_before[name]) * 1e6 / max(1, sent)
            for name, pid in watched.items()
        }
    return sent / secs, sent, cpu_us


def queues_of(nodes: Sequence[ProcessEntry], first: int, end: int) -> list[QueueId]:
    return [
        QueueId(node, topic_name(i), q)
        for i in range(first, end)
        for node in nodes
        for q in range(QUEUES_PER_NODE)
    ]


async def run_step(
    cluster: Cluster,
    conn: Nodes,
    meta: MetaClient,
    previous: int,
    topics: int,
    sentinels: int,
    args: argparse.Namespace,
    rng: random.Random,
) -> Step:
    stores = cluster.of_role("store-node")
    # Each step's sentinel topic (wait_for_topics) adds a queue a node.
    step = Step(topics, topics * QUEUES_PER_NODE + sentinels)
    started = time.monotonic()
    await create_topics(meta, previous, topics, tuple(n.name for n in stores))
    step.create_s = time.monotonic() - started
    print(f"  created {topics - previous:,} topics in {step.create_s:.1f} s", file=sys.stderr)

    sentinel = await conn.wait_for_topics(meta, topics)

    fresh = queues_of(stores, previous, topics)
    rng.shuffle(fresh)
    probe_wake = fresh[: args.wake_sample]
    probe_put = fresh[args.wake_sample : args.wake_sample + args.first_put_sample]
    for q in probe_wake:
        wake_ms, put_ms = await conn.wake(q, 0)
        step.wake_fresh_ms.append(wake_ms)
        step.first_put_ms.append(put_ms)
    for q in probe_put:
        step.first_put_ms.append(await conn.put(q))
    print(f"  probed {len(step.first_put_ms)} fresh queues", file=sys.stderr)

    await bounded(CONCURRENCY, (partial(conn.fill, q, args.messages_per_queue) for q in fresh))
    step.settle_s = await conn.settle(sentinel)
    print(
        f"  filled {len(fresh):,} queues; dispatch caught up {step.settle_s:.1f} s later",
        file=sys.stderr,
    )
    stores = cluster.of_role("store-node")
    for node in stores:
        step.usage[node.name] = node_usage(node.pid, cluster.data_dir / node.name)

    filled = queues_of(stores, 0, topics)
    old = rng.sample(filled, min(args.wake_sample, len(filled)))
    for q in old:
        wake_ms, _ = await conn.wake(q, await conn.max_offset(q))
        step.wake_old_ms.append(wake_ms)

    watched = {p.name: p.pid for p in cluster.of_role("store-node")}
    watched["client"] = os.getpid()
    step.produce_rate, step.produced, step.produce_cpu_us = await produce(
        cluster.pull_address, topics, args, watched
    )
    print(f"  produced {step.produced:,} messages", file=sys.stderr)

    step.restart_term_s, step.start_term_s = await restart(cluster, "broker-a", signal.SIGTERM)
    step.restart_kill_s, step.start_kill_s = await restart(cluster, "broker-a", signal.SIGKILL)
    await asyncio.sleep(1.0)  # the pull-service reconnects to the restarted node
    return step


# -- the report ------------------------------------------------------------------------


def verdict(ok: bool) -> str:
    return "met" if ok else "NOT MET"


def step_table(step: Step, baseline: dict[str, NodeUsage]) -> Table:
    """One topic count's figures: a row a measurement, its figures in one cell."""
    table = Table(f"{step.topics} topics", ("what", "figures", "target", "status"))

    def ms(x: float, label: str) -> Figure:
        return Figure(x, "ms", label, fmt=".2f")

    def latency(values: Sequence[float]) -> list[str | Figure]:
        return [
            ms(percentile(values, 50), "p50"),
            ms(percentile(values, 99), "p99"),
            Figure(len(values), label="n", better=None, fmt=","),
        ]

    table.add("create the topics", [Figure(step.create_s, "s", fmt=".1f")], "", "")
    table.add("dispatch caught up after the fill", [Figure(step.settle_s, "s", fmt=".1f")], "", "")
    p50 = percentile(step.first_put_ms, 50)
    table.add(
        "first put into a new queue",
        latency(step.first_put_ms),
        f"p50 <= {TARGET_FIRST_PUT_MS:g} ms",
        verdict(p50 <= TARGET_FIRST_PUT_MS),
    )
    table.add("long-poll wake, fresh queue", latency(step.wake_fresh_ms), "", "")
    table.add("long-poll wake, old queue", latency(step.wake_old_ms), "", "")
    table.add(
        "produce (SDK, round robin)",
        [
            Figure(step.produce_rate, "msgs/s", fmt=",.0f"),
            *(
                Figure(us, "µs/msg", f"CPU {name}", fmt=".2f")
                for name, us in step.produce_cpu_us.items()
            ),
        ],
        "",
        "",
    )
    costs = per_queue(step, baseline)
    for name, u in step.usage.items():
        base = baseline[name]
        disk_q, rss_q = costs[name]

        def mib(x: float, label: str) -> Figure:
            return Figure(x / MIB, "MiB", label, fmt=",.0f")

        table.add(
            f"{name}: resources",
            [
                mib(u.rss, "RSS"),
                mib(u.rss_own, "RSS outside CommitLog/IndexFile"),
                Figure(u.fds, label="fds", better=None, fmt=","),
                Figure(u.mmaps, label="mmaps", better=None, fmt=","),
                mib(u.disk, "disk"),
                mib(u.disk_cq, "consumequeue/"),
            ],
            "",
            "",
        )
        table.add(
            f"{name}: per queue",
            [
                Figure(disk_q / KIB, "KiB", "disk", fmt=",.1f"),
                Figure(rss_q / KIB, "KiB", "RSS", fmt=",.1f"),
                Figure((u.fds - base.fds) / step.queues_per_node, label="fds", better="lower"),
                Figure(
                    (u.mmaps - base.mmaps) / step.queues_per_node, label="mmaps", better="lower"
                ),
            ],
            "disk, RSS <= 64 KiB",
            f"{verdict(disk_q <= TARGET_QUEUE_DISK)}, {verdict(rss_q <= TARGET_QUEUE_RSS)}",
        )
    at_scale = step.queues_per_node >= TARGET_RESTART_QUEUES
    worst = max(step.restart_term_s, step.restart_kill_s)
    table.add(
        "restart broker-a",
        [
            Figure(step.restart_term_s, "s", "SIGTERM", fmt=".2f"),
            Figure(step.start_term_s, "s", "SIGTERM start", fmt=".2f"),
            Figure(step.restart_kill_s, "s", "kill -9", fmt=".2f"),
            Figure(step.start_kill_s, "s", "kill -9 start", fmt=".2f"),
        ],
        f"<= {TARGET_RESTART_S:g} s at {TARGET_RESTART_QUEUES:,} queues a node",
        verdict(worst <= TARGET_RESTART_S) if at_scale else "not this N",
    )
    return table


def per_queue(step: Step, baseline: dict[str, NodeUsage]) -> dict[str, tuple[float, float]]:
    """Each node's (disk, RSS) bytes a queue at ``step``: its ``consumequeue/`` over its
    queues, and its RSS outside the CommitLog and IndexFile mappings grown since
    ``baseline`` (no topic yet) over its queues."""
    return {
        name: (
            u.disk_cq / step.queues_per_node,
            (u.rss_own - baseline[name].rss_own) / step.queues_per_node,
        )
        for name, u in step.usage.items()
    }


def targets_table(
    steps: Sequence[Step], baseline: dict[str, NodeUsage], stopped: str | None
) -> Table:
    """The issue's targets against the run's figures: met / NOT MET, with the figure."""
    table = Table("targets", ("target", "status", "figure", "note"))
    by_n = {s.topics: s for s in steps}
    reached = max(by_n, default=0)
    not_measured = "NOT MET (not measured)"
    topics = Figure(reached, "topics", "reached", better="higher", fmt=",")
    what = f"{TARGET_TOPICS:,} topics × 4 with default settings"
    if stopped or reached >= TARGET_TOPICS:
        table.add(what, verdict(reached >= TARGET_TOPICS), [topics], stopped or "")
    else:
        table.add(what, not_measured, [topics], f"--topics ended at {reached:,}")
    if steps:
        last = steps[-1]
        costs = per_queue(last, baseline).values()
        disk, rss = max(c[0] for c in costs), max(c[1] for c in costs)
        first_put = percentile(last.first_put_ms, 50)
        at = f"at {last.topics:,} topics"
        table.add(
            "idle queue <= 64 KiB of disk",
            verdict(disk <= TARGET_QUEUE_DISK),
            [Figure(disk / KIB, "KiB", fmt=",.1f")],
            at,
        )
        table.add(
            "idle queue <= 64 KiB of RSS",
            verdict(rss <= TARGET_QUEUE_RSS),
            [Figure(rss / KIB, "KiB", fmt=",.1f")],
            at,
        )
        table.add(
            f"first put into a new queue <= {TARGET_FIRST_PUT_MS:g} ms",
            verdict(first_put <= TARGET_FIRST_PUT_MS),
            [Figure(first_put, "ms", "p50", fmt=".2f")],
            at,
        )
    else:
        table.add("idle queue <= 64 KiB of disk and RSS", not_measured, "", "")
    produce = "produce over 5,000 topics within 20 % of 1 topic"
    if 1 in by_n and 5_000 in by_n:
        ratio = by_n[5_000].produce_rate / by_n[1].produce_rate
        figure: Cell = [Figure(ratio * 100, "% of 1 topic", better="higher", fmt=".0f")]
        table.add(produce, verdict(ratio >= TARGET_PRODUCE_RATIO), figure, "")
    else:
        table.add(produce, not_measured, "", "")
    restart = f"restart <= {TARGET_RESTART_S:g} s at {TARGET_RESTART_QUEUES:,} queues a node"
    big = [s for s in steps if s.queues_per_node >= TARGET_RESTART_QUEUES]
    if big:
        worst = max(max(s.restart_term_s, s.restart_kill_s) for s in big)
        table.add(restart, verdict(worst <= TARGET_RESTART_S), [Figure(worst, "s", fmt=".2f")], "")
    else:
        table.add(restart, not_measured, "", "")
    return table


# -- the guard -----------------------------------------------------------------------------


def guard(
    data_dir: Path,
    new_queues: int,
    queue_disk: float,
    queue_rss: float,
    commit_log: int,
    nodes_rss: int,
) -> str | None:
    """Why ``new_queues`` more queues (costing ``queue_disk`` / ``queue_rss`` bytes each)
    plus ``commit_log`` bytes of CommitLog would not fit this machine; None when they fit.
    ``nodes_rss`` is what the store-nodes hold now: MemAvailable counts the page cache
    behind their mappings as reclaimable, but those pages are in use."""
    free, size = free_disk(data_dir)
    disk_reserve = max(size // 10, 5 * GIB)
    need_disk = int(new_queues * queue_disk) + commit_log
    if need_disk > free - disk_reserve:
        return (
            f"the store would fill the disk: {new_queues:,} more queues at "
            f"{queue_disk / MIB:.2f} MiB each need {need_disk / GIB:.1f} GiB, "
            f"{free / GIB:.1f} GiB free less a {disk_reserve / GIB:.1f} GiB reserve"
        )
    available, total = memory()
    mem_reserve = max(total // 5, 4 * GIB)
    need_mem = int(new_queues * queue_rss)
    if need_mem > available - nodes_rss - mem_reserve:
        # Say where the disk alone would have stopped the run, too.
        room = max(free - disk_reserve - commit_log, 0) / max(queue_disk, 1.0)
        return (
            f"the store-nodes would exhaust memory: {new_queues:,} more queues at "
            f"{queue_rss / MIB:.2f} MiB of RSS each need {need_mem / GIB:.1f} GiB; "
            f"{available / GIB:.1f} GiB available less the {nodes_rss / GIB:.1f} GiB the "
            f"store-nodes map now and a {mem_reserve / GIB:.1f} GiB reserve (the free disk "
            f"would hold ~{room:,.0f} more queues, ~{room / 4:,.0f} topics)"
        )
    return None


async def run(args: argparse.Namespace, root: Path, report: Report) -> int:
    cluster = Cluster(root / "cluster")
    steps: list[Step] = []
    stopped: str | None = None
    rng = random.Random(args.seed)
    baseline: dict[str, NodeUsage] = {}
    free, size = free_disk(root)
    available, total = memory()
    print(
        f"free disk {free / GIB:.1f} of {size / GIB:.1f} GiB at {root}; memory available "
        f"{available / GIB:.1f} of {total / GIB:.1f} GiB; {os.cpu_count()} cores"
    )
    try:
        print(cluster.up().rstrip(), file=sys.stderr)
        stores = cluster.of_role("store-node")
        baseline = {n.name: node_usage(n.pid, cluster.data_dir / n.name) for n in stores}
        conn = Nodes(cluster)
        meta_config = MetaConfig(endpoints=(cluster.etcd_address,), cluster=CLUSTER_NAME)
        queue_disk = queue_rss = float(ASSUMED_QUEUE_COST)
        try:
            async with MetaClient(meta_config) as meta:
                previous = 0
                for topics in args.topics:
                    new_queues = (topics - previous) * QUEUES_PER_NODE * len(stores)
                    # The produce phase's CommitLog: a 1 GiB file a node, at most 2 more.
                    held = sum(vm_rss(n.pid) for n in cluster.of_role("store-node"))
                    why = guard(
                        root, new_queues, queue_disk, queue_rss, 2 * GIB * len(stores), held
                    )
                    if why is not None:
                        stopped = f"stopped before {topics:,} topics: {why}"
                        print(f"\n{stopped}")
                        break
                    print(f"{topics:,} topics ...", file=sys.stderr)
                    step = await run_step(
                        cluster, conn, meta, previous, topics, len(steps) + 1, args, rng
                    )
                    steps.append(step)
                    print(
                        f"\n== {step.topics:,} topics × 4 queues ({step.queues_per_node:,} a node)"
                    )
                    report.emit(step_table(step, baseline))
                    costs = per_queue(step, baseline).values()
                    queue_disk = max(c[0] for c in costs)
                    queue_rss = max(max(c[1] for c in costs), 0.0)
                    previous = topics
        finally:
            await conn.close()
    except (RuntimeError, OSError, grpc.aio.AioRpcError) as e:
        stopped = f"stopped by an error: {e!r}"
        print(f"\n{stopped}")
    finally:
        print(cluster.down().rstrip(), file=sys.stderr)
    print("\n== targets")
    report.emit(targets_table(steps, baseline, stopped))
    return 0 if stopped is None or not stopped.startswith("stopped by an error") else 1


def topic_counts(text: str) -> list[int]:
    counts = [int(part.replace("_", "")) for part in text.split(",") if part.strip()]
    if not counts or counts != sorted(set(counts)) or counts[0] < 1:
        raise argparse.ArgumentTypeError("increasing topic counts >= 1, e.g. 1,100,1000")
    return counts


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--topics", type=topic_counts, default=None,
        help="increasing topic counts, each 4 queues (default 1,100,1000,5000,20000; "
        "with --quick 1,100)",
    )  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="a smoke run: 1,100 topics, short")
    parser.add_argument("--duration", type=float, default=5.0, help="produce seconds a step")
    parser.add_argument("--senders", type=int, default=16, help="send_batch calls in flight")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--messages-per-queue", type=int, default=4)
    parser.add_argument("--first-put-sample", type=int, default=200)
    parser.add_argument("--wake-sample", type=int, default=20)
    parser.add_argument("--seed", type=int, default=15)
    parser.add_argument(
        "--data-dir", type=Path, default=None,
        help="where the cluster's temp directory goes (default: the system's temp dir)",
    )  # fmt: skip
    add_json_out(parser)
    args = parser.parse_args(argv)
    if args.topics is None:
        args.topics = [1, 100] if args.quick else [1, 100, 1_000, 5_000, 20_000]
    if args.quick:
        args.duration = min(args.duration, 2.0)
        args.first_put_sample = min(args.first_put_sample, 50)
        args.wake_sample = min(args.wake_sample, 8)
    report = Report.start(__file__, args, argv)
    with tempfile.TemporaryDirectory(prefix="basalt-many-q-", dir=args.data_dir) as tmp:
        try:
            return asyncio.run(run(args, Path(tmp), report))
        except KeyboardInterrupt:  # run's finally has torn the cluster down
            print("interrupted", file=sys.stderr)
            return 130


if __name__ == "__main__":
    raise SystemExit(main())
