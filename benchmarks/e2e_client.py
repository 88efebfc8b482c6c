"""Client side of ``benchmarks/e2e_throughput.py``: the cluster, payloads, load workers.

* :class:`Cluster` runs ``basalt cluster up`` / ``down`` as a subprocess and
  reads ``<data-dir>/cluster.json`` (each process's role, pid and address);
  :meth:`Cluster.create_topics` creates a benchmark's topics on its store-nodes.
* :func:`query_route` turns a topic's ``PullService.QueryRoute`` answer into
  :class:`QueueRef`\\ s (broker, its address and store host, queue id).
* :func:`send_payloads` pre-serializes SendMessage / SendBatch requests
  (``messages`` form, or ``records`` the producer encoded with
  :class:`basalt.store.batch.EncodedBatch`), so a load process spends its CPU on
  gRPC, not on building requests. Every message has 1 KiB of body (by
  default), TAGS, and a UNIQ_KEY property unique within the pool of requests
  a queue cycles through.
* :func:`worker_main` is a load process (``multiprocessing``, spawn): one
  event loop, a few channels per address, many coroutines. It reports
  ``ready`` once its channels connect, waits for the start time, warms up,
  then counts what completes inside the measured window and sends back a
  :class:`WorkerResult`.

Times are ``time.monotonic()``: CLOCK_MONOTONIC, comparable across processes
of one machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
import zlib
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, cast

import grpc

from basalt.common.message import Message, encode_host
from basalt.common.record import EncodedMessage
from basalt.store.batch import EncodedBatch
from basalt.v1 import common_pb2 as pb
from basalt.v1 import pull_service_pb2 as ps
from basalt.v1 import pull_service_pb2_grpc as ps_grpc
from basalt.v1 import store_node_pb2 as sn

if TYPE_CHECKING:
    from basalt.common.tls import TlsConfig

SEND_MESSAGE = "/basalt.v1.StoreNode/SendMessage"
SEND_BATCH = "/basalt.v1.StoreNode/SendBatch"
SEND_STREAM = "/basalt.v1.StoreNode/SendStream"
#: A load channel's options: its own TCP connection (no global subchannel
#: sharing), and room for a batch of large records.
CHANNEL_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.use_local_subchannel_pool", 1),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
)
#: One send answer in this many is decoded and checked (SEND_OK, one offset per message).
CHECK_EVERY = 64

# -- the cluster ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ProcessEntry:
    role: str  # etcd | store-node | pull-service
    name: str
    pid: int
    address: str


class Cluster:
    """``basalt cluster up`` in ``data_dir`` (a subprocess); :meth:`down` always."""

    def __init__(self, data_dir: Path, *, up_args: Sequence[str] = ()) -> None:
        self.data_dir = data_dir
        #: More ``cluster up`` flags (``--tls``: benchmarks/security.py).
        self.up_args = tuple(up_args)
        self.processes: list[ProcessEntry] = []

    def up(self) -> str:
        """Start it; returns ``up``'s output. RuntimeError when it does not come up."""
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "basalt.admin",
                "cluster",
                "up",
                "--data-dir",
                str(self.data_dir),
                # What the figures have always measured: RocketMQ's file sizes.
                "--store-files",
                "production",
                *self.up_args,
            ],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=Path(__file__).resolve().parent.parent,
        )
        if done.returncode != 0:
            raise RuntimeError(f"cluster up failed ({done.returncode}): {done.stdout}{done.stderr}")
        state = json.loads((self.data_dir / "cluster.json").read_text())
        self.processes = [
            ProcessEntry(p["role"], p["name"], int(p["pid"]), p["address"]) for p in state
        ]
        return done.stdout

    def down(self) -> str:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "basalt.admin",
                "cluster",
                "down",
                "--data-dir",
                str(self.data_dir),
            ],
            capture_output=True,
            text=True,
            timeout=180,
            cwd=Path(__file__).resolve().parent.parent,
        )
        return done.stdout + done.stderr

    def of_role(self, role: str) -> list[ProcessEntry]:
        return [p for p in self.processes if p.role == role]

    @property
    def pull_address(self) -> str:
        return self.of_role("pull-service")[0].address

    @property
    def etcd_address(self) -> str:
        return self.of_role("etcd")[0].address

    async def create_topics(
        self, topics: Iterable[str], queues: int, *, tls: TlsConfig | None = None
    ) -> None:
        """Each of ``topics`` in etcd, as admin would, with ``queues`` queues on
        every store-node; then a second for the pull-service's watch to see them."""
        # Imported here: the load workers (spawned, importing this module) need
        # no etcd client.
        from basalt.services.cluster.local import CLUSTER_NAME
        from basalt.services.meta import MetaClient, MetaConfig, TopicConfig

        brokers = tuple(p.name for p in self.of_role("store-node"))
        config = MetaConfig(endpoints=(self.etcd_address,), cluster=CLUSTER_NAME)
        async with MetaClient(config, tls=tls) as meta:
            for topic in topics:
                await meta.create_topic(
                    TopicConfig(
                        topic_name=topic,
                        read_queue_nums=queues,
                        write_queue_nums=queues,
                        brokers=brokers,
                    )
                )
        await asyncio.sleep(1.0)  # the pull-service's watch


# -- routes and payloads ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class QueueRef:
    """One queue of a topic on one store-node."""

    broker: str
    address: str
    store_host: str
    queue_id: int


async def query_route(stub: ps_grpc.PullServiceAsyncStub, topic: str) -> list[QueueRef]:
    """The topic's writable and readable queues on registered store-nodes, by broker
    then queue id."""
    route = (await stub.QueryRoute(ps.QueryRouteRequest(topic=topic), timeout=5)).route
    brokers = {b.broker_name: b for b in route.broker_datas}
    queues = []
    for qd in sorted(route.queue_datas, key=lambda q: q.broker_name):
        b = brokers.get(qd.broker_name)
        if b is None:
            continue
        for q in range(min(qd.read_queue_nums, qd.write_queue_nums)):
            queues.append(QueueRef(b.broker_name, b.address, b.store_host, q))
    return queues


def _properties(topic: str, queue: QueueRef, n: int) -> dict[str, str]:
    # A UNIQ_KEY like a producer's (32 hex digits), unique per (topic, queue, n).
    prefix = zlib.crc32(f"{topic}/{queue.broker}".encode())
    return {"UNIQ_KEY": f"{prefix:08X}{queue.queue_id:08X}{n:016X}"}


def send_payloads(
    kind: str, topic: str, queue: QueueRef, batch: int, body_size: int, pool: int
) -> list[bytes]:
    """``pool`` serialized requests for one queue: ``send`` (SendMessageRequest) or
    ``messages`` / ``records`` (SendBatchRequest of ``batch`` messages)."""
    body = bytes(os.urandom(body_size))
    born_ms = int(time.time() * 1000)
    out: list[bytes] = []
    for p in range(pool):
        if kind == "send":
            req = sn.SendMessageRequest(
                message=pb.Message(
                    topic=topic,
                    tags="TagA",
                    body=body,
                    properties=_properties(topic, queue, p),
                    born_timestamp_ms=born_ms,
                ),
                queue_id=queue.queue_id,
            )
            out.append(req.SerializeToString())
        elif kind == "messages":
            msgs = [
                pb.Message(
                    tags="TagA",
                    body=body,
                    properties=_properties(topic, queue, p * batch + i),
                    born_timestamp_ms=born_ms,
                )
                for i in range(batch)
            ]
            batch_req = sn.SendBatchRequest(
                topic=topic, queue_id=queue.queue_id, messages=pb.MessageList(messages=msgs)
            )
            out.append(batch_req.SerializeToString())
        elif kind == "records":
            out.append(
                sn.SendBatchRequest(
                    topic=topic,
                    queue_id=queue.queue_id,
                    records=encode_records(topic, queue, batch, body, p * batch, born_ms),
                ).SerializeToString()
            )
        else:
            raise ValueError(f"unknown payload kind {kind!r}")
    return out


def encode_records(
    topic: str, queue: QueueRef, count: int, body: bytes, first: int, born_ms: int
) -> bytes:
    """A producer-encoded batch (RocketMQ's MessageBatch) for ``queue``: BODYCRC and
    the broker's fields left zero, SYSFLAG's store-host bit from its store host."""
    host = encode_host(queue.store_host)
    encoded = [
        EncodedMessage(
            Message(
                topic,
                body,
                queue_id=queue.queue_id,
                tags="TagA",
                properties=_properties(topic, queue, first + i),
                born_timestamp_ms=born_ms,
            ),
            store_host=host,
            compute_crc=False,
        )
        for i in range(count)
    ]
    return bytes(EncodedBatch.of_messages(encoded).data)


# -- load workers -----------------------------------------------------------------------


@dataclass(slots=True)
class WorkerSpec:
    """What one load process does. ``role``: ``send`` | ``messages`` | ``records``
    (producers, ``per_queue`` coroutines per queue, each one call in flight; or
    with ``stream`` as many requests in flight on SendStreams) or ``pull`` (one
    coroutine per queue, one pull in flight, committing) or ``pull-batch`` (one
    coroutine per broker, one PullBatch of all its queues in flight,
    committing) or ``wake``
    (one held pull after another on ``queues[0]``, each return's time sent to the
    parent at once)."""

    role: str
    topic: str
    queues: list[QueueRef]
    warmup_s: float
    duration_s: float
    pull_address: str = ""
    per_queue: int = 1
    channels: int = 1
    batch: int = 1
    body_size: int = 1024
    pool: int = 16
    group: str = ""
    max_nums: int = 32
    suspend_ms: int = 0
    #: Start offset of each queue (pull, wake); 0 when absent.
    offsets: list[int] = field(default_factory=list)
    #: wake: how many found pulls before the process ends.
    iterations: int = 0
    #: Producers: SendStream (``per_queue`` x queues requests in flight over one
    #: stream per channel) instead of unary calls.
    stream: bool = False
    #: Stream producers: sends (batches) per stream message, the store-node's
    #: queues in turn (Kafka's produce request: a batch per partition).
    items_per_write: int = 1
    #: Stream producers: msgs/s this process sends at most (0: as fast as it can).
    rate: float = 0.0
    #: pull-batch: queues per PullBatch (a broker's queues split into calls of
    #: this many, each with one call in flight); 0 = all of a broker's.
    queues_per_pull: int = 0


@dataclass(slots=True)
class WorkerResult:
    #: Messages acked (producers) or received (pull) inside the window.
    msgs: int = 0
    calls: int = 0
    #: Record bytes received (pull) inside the window.
    data_bytes: int = 0
    #: Messages over the whole run, warm-up included.
    total_msgs: int = 0
    errors: list[str] = field(default_factory=list)
    #: Pull: when the first queue ran dry (no suspend: nothing left), monotonic.
    drained_at: float | None = None
    #: The last completion inside the window, monotonic.
    last_done: float = 0.0
    #: Pull: records per FOUND pull inside the window -> how many pulls.
    batch_sizes: dict[int, int] = field(default_factory=dict)
    #: Pull: answers with no records inside the window (NO_NEW_MSG and the like).
    empty_pulls: int = 0
    #: Pull: each queue's next offset at the end.
    offsets: list[int] = field(default_factory=list)


def worker_main(spec: WorkerSpec, conn: Connection) -> None:
    """A load process's entry point (``multiprocessing`` target)."""
    try:
        result = asyncio.run(_worker(spec, conn))
    except BaseException as e:  # report rather than die silently
        result = WorkerResult(errors=[f"{type(e).__name__}: {e}"])
    with contextlib.suppress(OSError):
        conn.send(result)
        conn.close()


class _Window:
    def __init__(self, start_at: float, warmup_s: float, duration_s: float) -> None:
        self.start = start_at + warmup_s
        self.end = self.start + duration_s

    def inside(self, t: float) -> bool:
        return self.start <= t <= self.end


async def _worker(spec: WorkerSpec, conn: Connection) -> WorkerResult:
    addresses = sorted({q.address for q in spec.queues})
    if spec.role in ("pull", "pull-batch", "wake"):
        addresses = [spec.pull_address]
    channels = {
        a: [grpc.aio.insecure_channel(a, options=CHANNEL_OPTIONS) for _ in range(spec.channels)]
        for a in addresses
    }
    try:
        for chans in channels.values():
            for ch in chans:
                await asyncio.wait_for(ch.channel_ready(), 30)
        conn.send("ready")
        start_at: float = await asyncio.to_thread(conn.recv)
        await asyncio.sleep(max(0.0, start_at - time.monotonic()))
        window = _Window(start_at, spec.warmup_s, spec.duration_s)
        result = WorkerResult()
        if spec.role == "wake":
            await _wake_loop(spec, channels[spec.pull_address][0], conn)
            return result
        if spec.role == "pull":
            coros = [
                _pull_loop(spec, i, channels[spec.pull_address][i % spec.channels], window, result)
                for i in range(len(spec.queues))
            ]
        elif spec.role == "pull-batch":
            by_broker: dict[str, list[int]] = {}
            for i, q in enumerate(spec.queues):
                by_broker.setdefault(q.broker, []).append(i)
            per = spec.queues_per_pull or len(spec.queues)
            groups = [
                idx[j : j + per] for idx in by_broker.values() for j in range(0, len(idx), per)
            ]
            coros = [
                _pull_batch_loop(
                    spec, idx, channels[spec.pull_address][k % spec.channels], window, result
                )
                for k, idx in enumerate(groups)
            ]
        elif spec.stream:
            coros = []
            for address, chans in channels.items():
                mine = [q for q in spec.queues if q.address == address]
                payloads = stream_payloads(
                    spec.role,
                    spec.topic,
                    mine,
                    spec.batch,
                    spec.body_size,
                    spec.pool,
                    spec.items_per_write,
                )
                for k, ch in enumerate(chans):
                    in_flight = max(1, spec.per_queue * len(mine) // len(chans))
                    streams = len(chans) * len(channels)
                    coros.append(
                        _stream_loop(
                            spec,
                            ch,
                            payloads[k:] + payloads[:k],
                            in_flight,
                            streams,
                            window,
                            result,
                        )
                    )
        else:
            coros = []
            for q in spec.queues:
                payloads = send_payloads(
                    spec.role, spec.topic, q, spec.batch, spec.body_size, spec.pool
                )
                for k in range(spec.per_queue):
                    ch = channels[q.address][(q.queue_id * spec.per_queue + k) % spec.channels]
                    coros.append(_send_loop(spec, ch, payloads, k, window, result))
        tasks = [asyncio.ensure_future(c) for c in coros]
        await asyncio.sleep(max(0.0, window.end - time.monotonic()))
        # Producers finish their call in flight; held pulls are cut at the window's end.
        _, pending = await asyncio.wait(tasks, timeout=0.0 if "pull" in spec.role else 5.0)
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for t in tasks:
            exc = None if t.cancelled() else t.exception()
            if exc is not None and len(result.errors) < 5:
                result.errors.append(f"{type(exc).__name__}: {exc}")
        return result
    finally:
        for chans in channels.values():
            for ch in chans:
                await ch.close()


async def _send_loop(
    spec: WorkerSpec,
    channel: grpc.aio.Channel,
    payloads: list[bytes],
    k: int,
    window: _Window,
    result: WorkerResult,
) -> None:
    method = SEND_MESSAGE if spec.role == "send" else SEND_BATCH
    call: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(method)
    n = 1 if spec.role == "send" else spec.batch
    i = k
    while time.monotonic() < window.end:
        reply = await call(payloads[i % len(payloads)], timeout=30)
        t = time.monotonic()
        result.total_msgs += n
        if window.inside(t):
            result.msgs += n
            result.calls += 1
            result.last_done = max(result.last_done, t)
        if i % CHECK_EVERY == 0:
            sent = sn.SendBatchResponse.FromString(reply).result  # same layout as SendMessage's
            if sent.status != pb.SEND_STATUS_SEND_OK or len(sent.queue_offsets) != n:
                raise RuntimeError(f"send answered {sent.status} with {len(sent.queue_offsets)}")
        i += 1


def stream_payloads(
    kind: str, topic: str, queues: list[QueueRef], batch: int, body_size: int, pool: int, per: int
) -> list[bytes]:
    """:func:`send_payloads` of ``queues`` (one store-node's) as SendStream
    requests of ``per`` items each, the queues taken in turn (``opaque`` = the
    item's index)."""
    items: list[sn.SendStreamItem] = []
    by_queue = [send_payloads(kind, topic, q, batch, body_size, pool) for q in queues]
    for j in range(pool):
        for raws in by_queue:
            if kind == "send":
                item = sn.SendStreamItem(message=sn.SendMessageRequest.FromString(raws[j]))
            else:
                item = sn.SendStreamItem(batch=sn.SendBatchRequest.FromString(raws[j]))
            item.opaque = len(items)
            items.append(item)
    return [
        sn.SendStreamRequest(items=items[k : k + per]).SerializeToString()
        for k in range(0, len(items) - per + 1, per)
    ]


async def _stream_loop(
    spec: WorkerSpec,
    channel: grpc.aio.Channel,
    payloads: list[bytes],
    in_flight: int,
    streams: int,
    window: _Window,
    result: WorkerResult,
) -> None:
    """One SendStream (of ``streams`` in the process) with up to ``in_flight``
    sends outstanding (``spec.items_per_write`` per stream message), paced to
    its share of ``spec.rate`` when set."""
    call: grpc.aio.StreamStreamCall[bytes, bytes] = channel.stream_stream(SEND_STREAM)()
    n = 1 if spec.role == "send" else spec.batch
    slots = asyncio.Semaphore(in_flight)

    async def read_answers() -> None:
        k = 0
        while (reply := await call.read()) is not grpc.aio.EOF:
            answers = sn.SendStreamResponse.FromString(cast(bytes, reply)).answers
            t = time.monotonic()
            for answer in answers:
                slots.release()
                result.total_msgs += n
                if window.inside(t):
                    result.msgs += n
                    result.calls += 1
                    result.last_done = max(result.last_done, t)
                if k % CHECK_EVERY == 0:
                    got = answer.result
                    if got.status != pb.SEND_STATUS_SEND_OK or len(got.queue_offsets) != n:
                        raise RuntimeError(f"send answered {answer}")
                k += 1

    reader = asyncio.ensure_future(read_answers())
    i = 0
    # With a rate, request i is due at start + i * n / (this stream's share).
    share = spec.rate / streams if spec.rate else 0.0
    per = spec.items_per_write
    start = time.monotonic()
    try:
        while time.monotonic() < window.end:
            for _ in range(per):  # slots count sends, answered one by one
                await slots.acquire()
            if reader.done():
                break
            if share:
                await asyncio.sleep(max(0.0, start + i * per * n / share - time.monotonic()))
            await call.write(payloads[i % len(payloads)])
            i += 1
        await call.done_writing()
        await asyncio.wait_for(reader, 30)
    finally:
        reader.cancel()
        call.cancel()


async def _pull_batch_loop(
    spec: WorkerSpec,
    idx: list[int],
    channel: grpc.aio.Channel,
    window: _Window,
    result: WorkerResult,
) -> None:
    """PullBatch over the queues ``spec.queues[i] for i in idx`` (one broker's)."""
    stub: ps_grpc.PullServiceAsyncStub = ps_grpc.PullServiceStub(channel)
    mqs = [
        pb.MessageQueue(
            topic=spec.topic, broker_name=spec.queues[i].broker, queue_id=spec.queues[i].queue_id
        )
        for i in idx
    ]
    offsets = [spec.offsets[i] if i < len(spec.offsets) else 0 for i in idx]
    while len(result.offsets) < len(spec.queues):
        result.offsets.append(0)
    sizes: Counter[int] = Counter()
    try:
        while time.monotonic() < window.end:
            got = await stub.PullBatch(
                ps.PullBatchRequest(
                    group=spec.group,
                    pulls=[
                        ps.PullRequest(
                            queue=mq, offset=off, max_nums=spec.max_nums, commit_offset=off
                        )
                        for mq, off in zip(mqs, offsets, strict=True)
                    ],
                    suspend_timeout_ms=spec.suspend_ms,
                ),
                timeout=spec.suspend_ms / 1000 + 30,
            )
            t = time.monotonic()
            inside = window.inside(t)
            dry = 0
            for k, entry in enumerate(got.results):
                if entry.HasField("refused") or entry.commit.code != pb.RESPONSE_CODE_SUCCESS:
                    raise RuntimeError(f"pull of {mqs[k]} answered {entry}")
                n = entry.records.count
                result.total_msgs += n
                if inside:
                    result.msgs += n
                    result.data_bytes += len(entry.records.data)
                    if n:
                        sizes[n] += 1
                    else:
                        result.empty_pulls += 1
                if entry.status == pb.PULL_STATUS_NO_NEW_MSG:
                    dry += 1
                offsets[k] = entry.next_begin_offset
            if inside:
                result.calls += 1
                result.last_done = max(result.last_done, t)
            if dry == len(mqs) and spec.suspend_ms == 0:
                if result.drained_at is None or t < result.drained_at:
                    result.drained_at = t
                break
    finally:
        for i, off in zip(idx, offsets, strict=True):
            result.offsets[i] = off
        for size, count in sizes.items():
            result.batch_sizes[size] = result.batch_sizes.get(size, 0) + count


async def _pull_loop(
    spec: WorkerSpec, i: int, channel: grpc.aio.Channel, window: _Window, result: WorkerResult
) -> None:
    q = spec.queues[i]
    stub: ps_grpc.PullServiceAsyncStub = ps_grpc.PullServiceStub(channel)
    mq = pb.MessageQueue(topic=spec.topic, broker_name=q.broker, queue_id=q.queue_id)
    offset = spec.offsets[i] if i < len(spec.offsets) else 0
    while len(result.offsets) <= i:
        result.offsets.append(0)
    sizes: Counter[int] = Counter()
    try:
        while time.monotonic() < window.end:
            got = await stub.Pull(
                ps.PullRequest(
                    group=spec.group,
                    queue=mq,
                    offset=offset,
                    max_nums=spec.max_nums,
                    suspend_timeout_ms=spec.suspend_ms,
                    commit_offset=offset,
                ),
                timeout=spec.suspend_ms / 1000 + 30,
            )
            t = time.monotonic()
            n = got.records.count
            if got.commit.code != pb.RESPONSE_CODE_SUCCESS:
                raise RuntimeError(f"commit of {offset} answered {got.commit.code}")
            result.total_msgs += n
            if window.inside(t):
                result.msgs += n
                result.calls += 1
                result.data_bytes += len(got.records.data)
                result.last_done = max(result.last_done, t)
                if n:
                    sizes[n] += 1
                else:
                    result.empty_pulls += 1
            if got.status == pb.PULL_STATUS_NO_NEW_MSG and spec.suspend_ms == 0:
                if result.drained_at is None or t < result.drained_at:
                    result.drained_at = t
                break
            offset = got.next_begin_offset
    finally:
        result.offsets[i] = offset
        for size, count in sizes.items():
            result.batch_sizes[size] = result.batch_sizes.get(size, 0) + count


async def _wake_loop(spec: WorkerSpec, channel: grpc.aio.Channel, conn: Connection) -> None:
    """Held pulls one after another; after each return, send (monotonic ns, records)."""
    q = spec.queues[0]
    stub: ps_grpc.PullServiceAsyncStub = ps_grpc.PullServiceStub(channel)
    mq = pb.MessageQueue(topic=spec.topic, broker_name=q.broker, queue_id=q.queue_id)
    offset = spec.offsets[0] if spec.offsets else 0
    found = 0
    while found < spec.iterations:
        got = await stub.Pull(
            ps.PullRequest(
                group=spec.group,
                queue=mq,
                offset=offset,
                max_nums=spec.max_nums,
                suspend_timeout_ms=spec.suspend_ms,
            ),
            timeout=spec.suspend_ms / 1000 + 30,
        )
        t = time.monotonic_ns()
        conn.send((t, got.records.count))
        if got.records.count:
            found += 1
        offset = got.next_begin_offset


# -- CPU accounting ---------------------------------------------------------------------

CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float | None:
    """utime + stime of a process (all its threads), from /proc; None when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def all_cpu_seconds() -> dict[int, float]:
    """:func:`cpu_seconds` of every process on the machine, by pid."""
    out: dict[int, float] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            secs = cpu_seconds(int(entry.name))
            if secs is not None:
                out[int(entry.name)] = secs
    return out


def describe(pid: int, width: int = 70) -> str:
    """A process's command line, shortened (for naming CPU it took)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return f"pid {pid} (gone)"
    text = raw.replace(b"\0", b" ").decode(errors="replace").strip() or f"pid {pid}"
    return f"pid {pid}: {text[:width]}"


def machine_busy() -> tuple[float, float]:
    """(busy, stolen) CPU seconds of the whole machine so far, from /proc/stat: busy
    is user + nice + system + irq + softirq; stolen is time the hypervisor gave
    this VM's virtual CPUs to someone else."""
    first = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in first[:8])
    return (user + nice + system + irq + softirq) / CLK_TCK, steal / CLK_TCK
