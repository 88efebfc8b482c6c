"""End-to-end benchmark: produce, consume and long polling against a real cluster.

Starts its own cluster with ``basalt cluster up --data-dir <root>/cluster``
(etcd, two store-nodes, one pull-service: separate processes, ASYNC flush),
drives it over loopback gRPC, prints one table, and always runs ``basalt
cluster down``. Every message has a 1 KiB body, TAGS and a UNIQ_KEY property.
Each topic is created in etcd first with ``--queues`` (8, mqadmin
updateTopic's default) queues on each store-node (``--queues 0``: auto-created
by a first send, 4 per store-node) and its queues are read back with
``PullService.QueryRoute``. Rows (targets on the streamed and batched forms;
the unary forms are there to compare):

* **produce** — msgs/s acked by the store-nodes, sends spread over every queue
  of the topic on both store-nodes: batches of 1 and of 100 on
  ``StoreNode.SendStream`` (each stream many requests in flight), the batches
  in their ``messages`` form (Message objects the store-node encodes) and
  their ``records`` form (RocketMQ's MessageBatch, encoded by the producer
  with ``basalt.store.batch.EncodedBatch``); then unary ``SendMessage`` and
  ``SendBatch`` records. Requests are serialized once up front (a pool of 16
  per queue, UNIQ_KEYs unique within the pool) so the load processes spend
  their CPU on gRPC; one answer in 64 is checked.
* **consume** — msgs/s received through ``PullService.PullBatch`` with
  ``max_nums`` 32 and 256 per queue, each broker's queues split into calls of
  ``--queues-per-pull`` (4), one call in flight per group of queues, each
  entry committing the offset it starts from (``commit_offset``), every
  queue of the records-form topic read from offset 0 by a fresh group; then
  unary ``Pull`` (one per queue in flight, as a RocketMQ consumer). "also"
  shows the batch sizes actually received.
* **both at once** — producers (``records`` batches of 100 on SendStream,
  paced at ``--both-rate`` msgs/s: flat out, they take every core and the
  question is whether both directions hold at once) and PullBatch consumers
  (``max_nums`` 256, long polling 1 s, committing) on one fresh topic at the
  same time: msgs/s each way, and the consumers' lag at the end.
* **send latency** — sequential sends, one in flight, round-robin over the
  queues of both store-nodes, after a warm-up: on one SendStream per
  store-node (the target), and unary ``SendMessage``; p99 (p50 and max in
  "also").
* **gRPC floor** (no target) — the same number of ``grpc.health.v1`` Check
  round trips to a store-node first: what a call costs on this machine with
  no store work at all.
* **long-poll wake** — a consumer process holds a ``Pull`` with
  ``suspend_timeout_ms`` on a queue with nothing new; once the store-node
  reports it held (``GetRuntimeInfo``'s ``held_pulls``), the benchmark sends
  one message; the latency is from the send's ack (client side) to the
  pull's return in the consumer (both ``CLOCK_MONOTONIC``). Negative means the
  pull returned before the producer saw its ack. p99 (p50, and send start ->
  return, in "also").

Throughput cells run in load processes (``multiprocessing``, spawn), each
with one event loop, ``--channels`` channels (TCP connections) per address
and many coroutines: ``--procs`` processes per role (default 1 producer
process, 1 consumer process; on 2 cores a second one only added contention),
their queues split between them. A cell warms up ``--warmup`` s then counts
what completes in the next ``--duration`` s. Latency cells run in this
process (the wake-up's consumer in one load process).

After the table, CPU per process during each cell (from /proc, % of one
core) shows where the time went, with the machine's busy and stolen time
(a VM) and any process outside the benchmark that took >= 5 % of a core:
the cluster and the load processes share the machine's cores, so client CPU
and anything else running are part of every figure.

Usage::

    .venv/bin/python benchmarks/e2e_throughput.py            # full run, ~2-3 min
    .venv/bin/python benchmarks/e2e_throughput.py --quick    # smoke run, < 1 min
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any, cast

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from basalt.services import process
from basalt.v1 import common_pb2 as pb
from basalt.v1 import pull_service_pb2_grpc as ps_grpc
from basalt.v1 import store_node_pb2 as sn
from basalt.v1 import store_node_pb2_grpc as sn_grpc
from benchmarks.e2e_client import (
    Cluster,
    QueueRef,
    WorkerResult,
    WorkerSpec,
    all_cpu_seconds,
    cpu_seconds,
    describe,
    machine_busy,
    query_route,
    worker_main,
)
from benchmarks.report import (
    Figure,
    Report,
    Row,
    Table,
    Target,
    add_json_out,
    load_text,
    rows_table,
)
from benchmarks.store_append import bench_root

BODY = 1024
BATCH = 100
TARGET_PRODUCE = 200_000
TARGET_CONSUME = 250_000
TARGET_BOTH = 100_000
TARGET_SEND_P99_US = 1000.0
TARGET_WAKE_P99_US = 5000.0
TOPICS = {
    "latency": "E2eLatency",
    "wake": "E2eWake",
    "send": "E2eSend1",
    "messages": "E2eBatchMessages",
    "records": "E2eBatchRecords",
    "both": "E2eBoth",
}


def _progress(msg: str) -> None:
    print(f"  .. {msg}", file=sys.stderr, flush=True)


@dataclass(slots=True)
class CpuRow:
    """CPU per process over one cell's window, % of one core."""

    cell: str
    seconds: float
    by_process: dict[str, float] = field(default_factory=dict)
    clients: float = 0.0
    client_procs: int = 0
    machine: float = 0.0
    steal: float = 0.0
    #: Processes outside the benchmark that took >= 5 % of a core: (what, %).
    others: list[tuple[str, float]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Sample:
    by_name: dict[str, float | None]
    every_pid: dict[int, float]
    busy: float
    steal: float
    at: float


class CpuMeter:
    """Samples /proc for the cluster's processes, the load processes and this one."""

    def __init__(self, named_pids: dict[str, int]) -> None:
        self.named = named_pids
        self.cores = len(os.sched_getaffinity(0))
        self.clients: list[int] = []

    def sample(self, clients: Sequence[int]) -> Sample:
        names: dict[str, float | None] = {n: cpu_seconds(p) for n, p in self.named.items()}
        names["bench"] = cpu_seconds(os.getpid())
        for i, pid in enumerate(clients):
            names[f"client{i}"] = cpu_seconds(pid)
        busy, steal = machine_busy()
        self.clients = list(clients)
        return Sample(names, all_cpu_seconds(), busy, steal, time.monotonic())

    def row(self, cell: str, before: Sample, after: Sample) -> CpuRow:
        b, busy0, steal0, t0 = before.by_name, before.busy, before.steal, before.at
        a, busy1, steal1, t1 = after.by_name, after.busy, after.steal, after.at
        secs = max(t1 - t0, 1e-9)
        row = CpuRow(cell, secs)

        def pct(name: str) -> float:
            x, y = b.get(name), a.get(name)
            return 0.0 if x is None or y is None else 100 * (y - x) / secs

        for name in [*self.named, "bench"]:
            row.by_process[name] = pct(name)
        clients = [n for n in a if n.startswith("client")]
        row.clients = sum(pct(n) for n in clients)
        row.client_procs = len(clients)
        row.machine = 100 * (busy1 - busy0) / secs
        row.steal = 100 * (steal1 - steal0) / secs
        ours = {*self.named.values(), os.getpid(), *self.clients}
        for pid, end in after.every_pid.items():
            start = before.every_pid.get(pid)
            share = 0.0 if start is None else 100 * (end - start) / secs
            if pid not in ours and share >= 5:
                row.others.append((describe(pid), share))
        row.others.sort(key=lambda o: -o[1])
        return row


def cpu_table(rows: Sequence[CpuRow], cores: int) -> Table:
    """CPU per process during each cell, % of one core (not judged: a faster
    cell may well take more CPU a second)."""
    names = list(rows[0].by_process) if rows else []
    table = Table(
        "cpu",
        ["cell", *names, "load procs", "other", "busy", "stolen", f"idle (of {100 * cores}%)"],
    )

    def pct(x: float) -> Figure:
        return Figure(x, "%", better=None, fmt=".0f")

    for r in rows:
        table.add(
            r.cell,
            *(pct(r.by_process.get(n, 0.0)) for n in names),
            pct(r.clients) if r.client_procs else "-",
            pct(max(0.0, r.machine - r.clients - sum(r.by_process.values()))),
            pct(r.machine),
            pct(r.steal),
            pct(max(0.0, 100 * cores - r.machine - r.steal)),
        )
    return table


# -- load processes ---------------------------------------------------------------------


@dataclass(slots=True)
class Workers:
    procs: list[BaseProcess]
    conns: list[Connection]

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs if p.pid is not None]


async def start_workers(specs: Sequence[WorkerSpec]) -> Workers:
    """Spawn one load process per spec and wait until each has connected."""
    ctx = multiprocessing.get_context("spawn")
    procs: list[BaseProcess] = []
    conns: list[Connection] = []
    for spec in specs:
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=worker_main, args=(spec, child), daemon=True)
        proc.start()
        child.close()
        procs.append(proc)
        conns.append(parent)
    workers = Workers(procs, conns)
    for conn in conns:
        if not await asyncio.to_thread(conn.poll, 60):
            await stop_workers(workers)
            raise RuntimeError("a load process did not get ready within 60 s")
        ready = conn.recv()
        if ready != "ready":
            await stop_workers(workers)
            raise RuntimeError(f"a load process failed to start: {ready}")
    return workers


async def stop_workers(workers: Workers) -> None:
    for p in workers.procs:
        await asyncio.to_thread(p.join, 10)
        if p.is_alive():
            p.terminate()
            await asyncio.to_thread(p.join, 5)


async def run_window(
    specs: Sequence[WorkerSpec], meter: CpuMeter, cell: str, cpu_rows: list[CpuRow]
) -> tuple[list[WorkerResult], float]:
    """Run the load processes of one cell together; returns their results and the
    window's start (monotonic)."""
    workers = await start_workers(specs)
    try:
        start_at = time.monotonic() + 0.2
        for conn in workers.conns:
            conn.send(start_at)
        w0 = start_at + specs[0].warmup_s
        w1 = w0 + specs[0].duration_s
        await asyncio.sleep(max(0.0, w0 - time.monotonic()))
        before = meter.sample(workers.pids)
        await asyncio.sleep(max(0.0, w1 - time.monotonic()))
        after = meter.sample(workers.pids)
        cpu_rows.append(meter.row(cell, before, after))
        results = []
        for conn in workers.conns:
            if not await asyncio.to_thread(conn.poll, 60):
                raise RuntimeError(f"{cell}: a load process did not report within 60 s")
            results.append(conn.recv())
    finally:
        await stop_workers(workers)
    for r in results:
        if r.errors:
            raise RuntimeError(f"{cell}: {r.errors}")
    return results, w0


def split(queues: Sequence[QueueRef], parts: int) -> list[list[QueueRef]]:
    """Queues dealt round-robin to ``parts`` processes (each gets both store-nodes)."""
    parts = max(1, min(parts, len(queues)))
    return [list(queues[i::parts]) for i in range(parts)]


# -- setup ------------------------------------------------------------------------------


async def create_topics(
    cluster: Cluster, pull: ps_grpc.PullServiceAsyncStub, queues_per_node: int
) -> dict[str, list[QueueRef]]:
    """Each topic on both store-nodes; returns its queues from QueryRoute.

    By default a first send to queue 0 of each store-node creates the topic
    (auto-create: the first node creates it with 4 queues, the second adds
    itself to its route). With ``queues_per_node`` the topic is created in etcd
    first, as admin would, with that many queues on both store-nodes."""
    brokers = cluster.of_role("store-node")
    if queues_per_node:
        from basalt.services.cluster.local import CLUSTER_NAME
        from basalt.services.meta import MetaClient, MetaConfig, TopicConfig

        config = MetaConfig(endpoints=(cluster.etcd_address,), cluster=CLUSTER_NAME)
        async with MetaClient(config) as meta:
            for topic in TOPICS.values():
                await meta.create_topic(
                    TopicConfig(
                        topic_name=topic,
                        read_queue_nums=queues_per_node,
                        write_queue_nums=queues_per_node,
                        brokers=tuple(b.name for b in brokers),
                    )
                )
    for b in brokers:
        async with grpc.aio.insecure_channel(b.address) as ch:
            stub: sn_grpc.StoreNodeAsyncStub = sn_grpc.StoreNodeStub(ch)
            for topic in TOPICS.values():
                await stub.SendMessage(
                    sn.SendMessageRequest(
                        message=pb.Message(topic=topic, tags="TagA", body=b"x" * BODY), queue_id=0
                    ),
                    timeout=10,
                )
    routes: dict[str, list[QueueRef]] = {}
    deadline = time.monotonic() + 20
    for key, topic in TOPICS.items():
        while True:
            try:
                queues = await query_route(pull, topic)
            except grpc.aio.AioRpcError:
                queues = []
            if {q.broker for q in queues} == {b.name for b in brokers}:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"route of {topic} lacks a store-node: {queues}")
            await asyncio.sleep(0.1)
        routes[key] = queues
    return routes


# -- latency cells ----------------------------------------------------------------------


def _pct(sorted_values: Sequence[float], p: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * p))]


def _latency_row(path: str, config: str, us: list[float], target_us: float | None) -> Row:
    us = sorted(us)
    return Row(
        path,
        config,
        _pct(us, 0.99),
        "us p99",
        len(us),
        sum(us) / 1e6,
        None if target_us is None else Target(target_us, higher_is_better=False),
        [
            Figure(statistics.median(us), "us", "p50", fmt=",.0f"),
            Figure(_pct(us, 0.9), "us", "p90", fmt=",.0f"),
            Figure(us[-1], "us", "max", fmt=",.0f"),
        ],
    )


async def send_latency(
    queues: Sequence[QueueRef], warmup: int, samples: int, meter: CpuMeter, cpu: list[CpuRow]
) -> list[Row]:
    """Sequential SendMessage round trips; first the same number of Health.Check
    calls on a store-node: gRPC's own round trip on this machine, the floor."""
    channels = {a: grpc.aio.insecure_channel(a) for a in {q.address for q in queues}}
    try:
        health = cast(Any, health_pb2_grpc.HealthStub(channels[queues[0].address]))
        check = health_pb2.HealthCheckRequest(service="")
        floor: list[float] = []
        for i in range(warmup + samples):
            t = time.perf_counter_ns()
            await health.Check(check, timeout=10)
            if i >= warmup:
                floor.append((time.perf_counter_ns() - t) / 1000)
        stubs: dict[str, sn_grpc.StoreNodeAsyncStub] = {
            a: sn_grpc.StoreNodeStub(ch) for a, ch in channels.items()
        }
        body = os.urandom(BODY)
        requests = [
            (
                stubs[q.address],
                channels[q.address],
                sn.SendMessageRequest(
                    message=pb.Message(topic=TOPICS["latency"], tags="TagA", body=body),
                    queue_id=q.queue_id,
                ),
            )
            for q in queues
        ]
        unary = await _timed_sends(requests, warmup, samples, stream=False)
        before = meter.sample([])
        streamed = await _timed_sends(requests, warmup, samples, stream=True)
        cpu.append(meter.row("send latency", before, meter.sample([])))
    finally:
        for ch in channels.values():
            await ch.close()
    return [
        _latency_row(
            "send latency",
            f"SendStream 1 KiB, 1 in flight, over {len(queues)} queues",
            streamed,
            TARGET_SEND_P99_US,
        ),
        _latency_row(
            "send latency",
            f"SendMessage (unary) 1 KiB, 1 in flight, over {len(queues)} queues",
            unary,
            None,
        ),
        _latency_row(
            "gRPC floor", "Health.Check on a store-node, 1 in flight (no store work)", floor, None
        ),
    ]


async def _timed_sends(
    requests: list[tuple[sn_grpc.StoreNodeAsyncStub, grpc.aio.Channel, sn.SendMessageRequest]],
    warmup: int,
    samples: int,
    *,
    stream: bool,
) -> list[float]:
    """Sequential sends round-robin over ``requests``, µs each after ``warmup``:
    unary SendMessage calls, or requests on one SendStream per store-node."""
    streams: dict[int, Any] = {}
    if stream:
        for _, channel, _ in requests:
            if id(channel) not in streams:
                streams[id(channel)] = sn_grpc.StoreNodeStub(channel).SendStream()
    us: list[float] = []
    try:
        for i in range(warmup + samples):
            stub, channel, req = requests[i % len(requests)]
            req.message.properties["UNIQ_KEY"] = f"{int(stream)}{i:031X}"
            t = time.perf_counter_ns()
            if stream:
                call = streams[id(channel)]
                item = sn.SendStreamItem(opaque=i, message=req)
                await call.write(sn.SendStreamRequest(items=[item]))
                (answer,) = (await call.read()).answers
                result = answer.result
            else:
                result = (await stub.SendMessage(req, timeout=10)).result
            elapsed = time.perf_counter_ns() - t
            if result.status != pb.SEND_STATUS_SEND_OK:
                raise RuntimeError(f"send answered {result}")
            if i >= warmup:
                us.append(elapsed / 1000)
    finally:
        for call in streams.values():
            call.cancel()
    return us


async def wake_latency(
    queue: QueueRef,
    pull_address: str,
    warmup: int,
    samples: int,
    suspend_ms: int,
    meter: CpuMeter,
    cpu: list[CpuRow],
) -> Row:
    topic = TOPICS["wake"]
    async with grpc.aio.insecure_channel(queue.address) as ch:
        stub: sn_grpc.StoreNodeAsyncStub = sn_grpc.StoreNodeStub(ch)
        start = (
            await stub.GetMinMaxOffset(
                sn.GetMinMaxOffsetRequest(topic=topic, queue_id=queue.queue_id), timeout=5
            )
        ).max_offset
        spec = WorkerSpec(
            role="wake",
            topic=topic,
            queues=[queue],
            warmup_s=0,
            duration_s=0,
            pull_address=pull_address,
            group="e2e-wake",
            max_nums=32,
            suspend_ms=suspend_ms,
            offsets=[start],
            iterations=warmup + samples,
        )
        workers = await start_workers([spec])
        conn = workers.conns[0]
        body = os.urandom(BODY)
        after_ack: list[float] = []
        after_send: list[float] = []
        try:
            conn.send(time.monotonic())
            before = meter.sample(workers.pids)
            for i in range(warmup + samples):
                deadline = time.monotonic() + 10
                while True:  # wait until the store-node holds the pull
                    info = await stub.GetRuntimeInfo(sn.GetRuntimeInfoRequest(), timeout=5)
                    if int(info.extra.get("held_pulls", "0")) >= 1:
                        break
                    if time.monotonic() > deadline:
                        raise RuntimeError("the consumer's pull was never held")
                    await asyncio.sleep(0.0005)
                req = sn.SendMessageRequest(
                    message=pb.Message(
                        topic=topic, tags="TagA", body=body, properties={"UNIQ_KEY": f"{i:032X}"}
                    ),
                    queue_id=queue.queue_id,
                )
                t0 = time.monotonic_ns()
                await stub.SendMessage(req, timeout=10)
                t_ack = time.monotonic_ns()
                if not await asyncio.to_thread(conn.poll, suspend_ms / 1000 + 10):
                    raise RuntimeError("the held pull did not return")
                t_ret, count = conn.recv()
                if count < 1:
                    raise RuntimeError("the held pull returned without the message")
                if i >= warmup:
                    after_ack.append((t_ret - t_ack) / 1000)
                    after_send.append((t_ret - t0) / 1000)
            cpu.append(meter.row("long-poll wake", before, meter.sample(workers.pids)))
        finally:
            await stop_workers(workers)
    after_ack.sort()
    after_send.sort()
    early = sum(1 for x in after_ack if x < 0)
    return Row(
        "long-poll wake",
        f"send ack -> held Pull returns ({suspend_ms} ms suspend)",
        _pct(after_ack, 0.99),
        "us p99",
        len(after_ack),
        sum(after_send) / 1e6,
        Target(TARGET_WAKE_P99_US, higher_is_better=False),
        [
            Figure(statistics.median(after_ack), "us", "p50", fmt=",.0f"),
            Figure(statistics.median(after_send), "us", "send start -> return p50", fmt=",.0f"),
            Figure(_pct(after_send, 0.99), "us", "send start -> return p99", fmt=",.0f"),
            f"{early} returned before the ack",
        ],
    )


# -- throughput cells -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Settings:
    warmup_s: float
    duration_s: float
    procs: int
    channels: int
    senders_per_queue: int
    batchers_per_queue: int
    latency_warmup: int
    latency_samples: int
    wake_warmup: int
    wake_samples: int
    wake_suspend_ms: int
    queues: int
    queues_per_pull: int
    both_rate: float
    items_per_write: int


def _sum(results: Sequence[WorkerResult]) -> WorkerResult:
    out = WorkerResult()
    for r in results:
        out.msgs += r.msgs
        out.calls += r.calls
        out.data_bytes += r.data_bytes
        out.total_msgs += r.total_msgs
        out.empty_pulls += r.empty_pulls
        out.last_done = max(out.last_done, r.last_done)
        if r.drained_at is not None:
            out.drained_at = min(out.drained_at or r.drained_at, r.drained_at)
        for k, v in r.batch_sizes.items():
            out.batch_sizes[k] = out.batch_sizes.get(k, 0) + v
    return out


def _batches(r: WorkerResult) -> str:
    found = sum(r.batch_sizes.values())
    if not found:
        return "no records"
    common = sorted(r.batch_sizes.items(), key=lambda kv: -kv[1])[:3]
    text = ", ".join(f"{n} x{c:,}" for n, c in common)
    return f"{r.msgs / found:.1f} records/pull (most: {text}), {r.empty_pulls} empty"


async def produce_cell(
    s: Settings,
    kind: str,
    queues: list[QueueRef],
    meter: CpuMeter,
    cpu: list[CpuRow],
    *,
    stream: bool,
) -> Row:
    batch = 1 if kind == "send" else BATCH
    per_queue = s.senders_per_queue if kind == "send" else s.batchers_per_queue
    specs = [
        WorkerSpec(
            role=kind,
            topic=TOPICS[kind],
            queues=part,
            warmup_s=s.warmup_s,
            duration_s=s.duration_s,
            per_queue=per_queue,
            channels=s.channels,
            batch=batch,
            body_size=BODY,
            stream=stream,
            items_per_write=s.items_per_write if batch > 1 else 1,
        )
        for part in split(queues, s.procs)
    ]
    rpc = "SendStream" if stream else {"send": "SendMessage"}.get(kind, "SendBatch")
    config = {
        "send": f"batch 1, {rpc}",
        "messages": f"batch {BATCH}, {rpc} messages",
        "records": f"batch {BATCH}, {rpc} producer-encoded records",
    }[kind]
    inflight = per_queue * len(queues)
    label = f"produce {config}"
    _progress(f"{label}: {len(specs)} procs, {inflight} in flight")
    results, _ = await run_window(specs, meter, label, cpu)
    r = _sum(results)
    return Row(
        "produce",
        f"{config}; {len(specs)} procs x {inflight // len(specs)} in flight"
        + (f", {s.items_per_write} per message" if stream and batch > 1 else ""),
        r.msgs / s.duration_s,
        "msgs/s",
        r.msgs,
        s.duration_s,
        Target(TARGET_PRODUCE) if batch > 1 and stream else None,
        [
            Figure(r.calls / s.duration_s, "calls/s", fmt=",.0f"),
            Figure(r.msgs * BODY / s.duration_s / 2**20, "MiB/s", "body", fmt=".0f"),
        ],
    )


def pull_specs(
    s: Settings,
    topic: str,
    queues: list[QueueRef],
    pull_address: str,
    group: str,
    max_nums: int,
    suspend_ms: int,
    procs: int,
    *,
    batched: bool,
) -> list[WorkerSpec]:
    """Consumers of ``queues``: ``batched``, one PullBatch per store-node in
    flight per process (each process gets every store-node); else one Pull per queue."""
    return [
        WorkerSpec(
            role="pull-batch" if batched else "pull",
            topic=topic,
            queues=part,
            warmup_s=s.warmup_s,
            duration_s=s.duration_s,
            pull_address=pull_address,
            channels=min(s.channels, len(part)),
            group=group,
            max_nums=max_nums,
            suspend_ms=suspend_ms,
            queues_per_pull=s.queues_per_pull,
        )
        for part in split(queues, procs)
    ]


async def consume_cell(
    s: Settings,
    max_nums: int,
    queues: list[QueueRef],
    pull_address: str,
    meter: CpuMeter,
    cpu: list[CpuRow],
    *,
    batched: bool,
) -> tuple[Row, str | None]:
    group = f"e2e-pull-{max_nums}-{'batch' if batched else 'single'}"
    specs = pull_specs(
        s, TOPICS["records"], queues, pull_address, group, max_nums, 0, s.procs, batched=batched
    )
    rpc = "PullBatch" if batched else "Pull"
    label = f"consume {rpc} max_nums {max_nums}"
    brokers = len({q.broker for q in queues})
    per_call = min(s.queues_per_pull or len(queues), len(queues) // brokers)
    in_flight = (
        f"{len(queues) // per_call} PullBatch of {per_call} queues in flight"
        if batched
        else f"{len(queues)} queues x 1 in flight"
    )
    _progress(f"{label}: {len(specs)} procs, {in_flight}")
    results, w0 = await run_window(specs, meter, label, cpu)
    r = _sum(results)
    secs = s.duration_s
    note = None
    if r.drained_at is not None:
        secs = max(1e-3, min(s.duration_s, r.last_done - w0))
        note = (
            f"{label}: a queue ran dry {r.drained_at - w0:+.2f} s into "
            f"the window; rate over {secs:.2f} s (raise --duration of the produce cells)"
        )
    return (
        Row(
            "consume",
            f"{rpc} max_nums {max_nums} per queue, commit each; {len(specs)} procs, {in_flight}",
            r.msgs / secs,
            "msgs/s",
            r.msgs,
            secs,
            Target(TARGET_CONSUME) if batched else None,
            [Figure(r.calls / secs, "calls/s", fmt=",.0f"), _batches(r)],
        ),
        note,
    )


async def both_cell(
    s: Settings,
    queues: list[QueueRef],
    pull_address: str,
    meter: CpuMeter,
    cpu: list[CpuRow],
) -> list[Row]:
    """Producers paced at ``s.both_rate`` msgs/s (a flat-out producer takes every
    core and starves the consumers: what counts is whether both directions
    hold 100 k at once) and PullBatch consumers with long polling."""
    procs = s.procs
    producers = [
        WorkerSpec(
            role="records",
            topic=TOPICS["both"],
            queues=part,
            warmup_s=s.warmup_s,
            duration_s=s.duration_s,
            per_queue=s.batchers_per_queue,
            channels=s.channels,
            batch=BATCH,
            body_size=BODY,
            stream=True,
            items_per_write=s.items_per_write,
            rate=s.both_rate / procs,
        )
        for part in split(queues, procs)
    ]
    consumers = pull_specs(
        s, TOPICS["both"], queues, pull_address, "e2e-both", 256, 1000, procs, batched=True
    )
    label = "both at once"
    _progress(f"{label}: {len(producers)} producer + {len(consumers)} consumer procs")
    results, _ = await run_window([*producers, *consumers], meter, label, cpu)
    p, c = _sum(results[: len(producers)]), _sum(results[len(producers) :])
    lag = p.total_msgs - c.total_msgs
    return [
        Row(
            "both at once",
            f"produce batch {BATCH} records, SendStream, paced at {s.both_rate:,.0f} msgs/s; "
            f"{len(producers)} procs",
            p.msgs / s.duration_s,
            "msgs/s",
            p.msgs,
            s.duration_s,
            Target(TARGET_BOTH),
            [Figure(p.calls / s.duration_s, "calls/s", fmt=",.0f")],
        ),
        Row(
            "both at once",
            f"consume PullBatch max_nums 256 per queue, 1 s long poll, commit; "
            f"{len(consumers)} procs",
            c.msgs / s.duration_s,
            "msgs/s",
            c.msgs,
            s.duration_s,
            Target(TARGET_BOTH),
            [
                Figure(c.calls / s.duration_s, "calls/s", fmt=",.0f"),
                _batches(c),
                Figure(lag, "msgs", "lag at end", better=None, fmt=","),
            ],
        ),
    ]


async def run(s: Settings, root: Path) -> tuple[list[Row], list[CpuRow], list[str]]:
    cluster = Cluster(root / "cluster")
    rows: list[Row] = []
    cpu: list[CpuRow] = []
    notes: list[str] = []
    try:
        _progress("basalt cluster up")
        print(cluster.up().rstrip())  # on failure `up` has stopped what it started
        meter = CpuMeter({p.name: p.pid for p in cluster.processes})
        async with grpc.aio.insecure_channel(cluster.pull_address) as pch:
            pull: ps_grpc.PullServiceAsyncStub = ps_grpc.PullServiceStub(pch)
            routes = await create_topics(cluster, pull, s.queues)
        _progress("send latency")
        rows.extend(
            await send_latency(routes["latency"], s.latency_warmup, s.latency_samples, meter, cpu)
        )
        _progress("long-poll wake latency")
        rows.append(
            await wake_latency(
                routes["wake"][0],
                cluster.pull_address,
                s.wake_warmup,
                s.wake_samples,
                s.wake_suspend_ms,
                meter,
                cpu,
            )
        )
        for kind, stream in (
            ("send", True),
            ("messages", True),
            ("records", True),
            ("send", False),
            ("records", False),
        ):
            rows.append(await produce_cell(s, kind, routes[kind], meter, cpu, stream=stream))
        for max_nums, batched in ((32, True), (256, True), (32, False)):
            row, note = await consume_cell(
                s, max_nums, routes["records"], cluster.pull_address, meter, cpu, batched=batched
            )
            rows.append(row)
            if note:
                notes.append(note)
        rows.extend(await both_cell(s, routes["both"], cluster.pull_address, meter, cpu))
    finally:
        _progress("basalt cluster down")
        print(cluster.down().rstrip(), file=sys.stderr)
    order = ["produce", "consume", "both at once", "send latency", "long-poll wake", "gRPC floor"]
    rows.sort(key=lambda r: order.index(r.path))
    return rows, cpu, notes


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="short cells: a smoke run in < 1 min")
    p.add_argument("--warmup", type=float, default=2.0, help="s of warm-up per throughput cell")
    p.add_argument("--duration", type=float, default=10.0, help="s measured per throughput cell")
    p.add_argument(
        "--procs", type=int, default=1, help="load processes per role (producers; consumers)"
    )
    p.add_argument("--channels", type=int, default=2, help="channels per address per process")
    p.add_argument(
        "--senders-per-queue", type=int, default=8, help="SendMessage calls in flight per queue"
    )
    p.add_argument(
        "--batchers-per-queue", type=int, default=2, help="SendBatch calls in flight per queue"
    )
    p.add_argument("--latency-samples", type=int, default=10_000, help="timed SendMessage calls")
    p.add_argument("--wake-samples", type=int, default=1000, help="timed long-poll wake-ups")
    p.add_argument("--wake-suspend-ms", type=int, default=10_000, help="the held pull's suspend")
    p.add_argument(
        "--queues",
        type=int,
        default=8,
        help="queues per store-node of each topic, created in etcd first (mqadmin "
        "updateTopic's default, 8); 0: auto-created by a first send (4)",
    )
    p.add_argument(
        "--queues-per-pull",
        type=int,
        default=4,
        help="queues per PullBatch (each broker's split into calls of this many; 0 = all)",
    )
    p.add_argument(
        "--both-rate",
        type=float,
        default=115_000,
        help="msgs/s the producers of 'both at once' are paced at (0: flat out)",
    )
    p.add_argument(
        "--items-per-write",
        type=int,
        default=4,
        help="batches per SendStream message (each for another queue of the store-node)",
    )
    p.add_argument("--root", type=Path, help="cluster directory (default: a temp dir, removed)")
    add_json_out(p)
    args = p.parse_args(argv)
    if args.quick:
        args.warmup, args.duration = 0.5, 2.0
        args.latency_samples, args.wake_samples = 1000, 200
    return args


def settings_from(args: argparse.Namespace) -> Settings:
    return Settings(
        warmup_s=args.warmup,
        duration_s=args.duration,
        procs=args.procs,
        channels=args.channels,
        senders_per_queue=args.senders_per_queue,
        batchers_per_queue=args.batchers_per_queue,
        latency_warmup=max(100, args.latency_samples // 10),
        latency_samples=args.latency_samples,
        wake_warmup=20,
        wake_samples=args.wake_samples,
        wake_suspend_ms=args.wake_suspend_ms,
        queues=args.queues,
        queues_per_pull=args.queues_per_pull,
        both_rate=args.both_rate,
        items_per_write=args.items_per_write,
    )


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    s = settings_from(args)
    report = Report.start(__file__, args, argv)
    with bench_root(args.root, "e2e_throughput.py", argv) as root:
        print(
            f"settings:  warmup {s.warmup_s:g} s + {s.duration_s:g} s per throughput cell; "
            f"{s.procs} load procs per role x {s.channels} channels per address; "
            f"{s.senders_per_queue} SendMessage / {s.batchers_per_queue} SendBatch in flight "
            f"per queue; {BODY} B bodies; queues per store-node: "
            f"{s.queues or 'default (4)'}"
        )
        started = time.perf_counter()
        rows, cpu, notes = asyncio.run(run(s, root))
        print()
        report.emit(rows_table("cells", rows))
        for note in notes:
            report.note(f"note: {note}")
        print(
            "\nCPU per process during each cell's window (% of one core). busy = the whole"
            " machine (user, system, irq); other = busy minus the processes listed (kernel"
            " threads, anything else running); stolen = taken by the hypervisor (a VM)."
        )
        report.emit(cpu_table(cpu, len(os.sched_getaffinity(0))))
        for c in cpu:
            for what, share in c.others[:3]:
                report.note(f"other during {c.cell}: {share:.0f}% {what}")
        elapsed = time.perf_counter() - started
        print()
        report.note(f"load avg:  {load_text()} (1/5/15 min) at end; total {elapsed:.0f} s")
    return 0


if __name__ == "__main__":
    # This process and its load processes are gRPC clients of the cluster: they
    # run on the gRPC settings `basalt cluster up` gives the services (gRPC
    # reads them once, at import). GRPC_EXPERIMENTS= (empty) runs everything,
    # services included, on gRPC's own defaults.
    process.rerun_with_service_env()
    raise SystemExit(main())
