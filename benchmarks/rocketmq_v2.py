"""The RocketMQ 5 front (gRPC v2) against basalt.v1 and the bare unary floor:
throughput and server CPU per message.

Starts ``basalt cluster up`` (etcd, 2 store-nodes, 1 pull-service; the
pull-service and each store-node serve a v2 front) in a temp directory,
creates one topic per client and front (``--queues`` queues on each of the
two store-nodes) and runs, one row at a time, for each front of ``--fronts``:
``pull-service`` (the clients dial the pull-service's front, which forwards
every call to a store-node over gRPC) and ``store-node`` (they dial
broker-a's own front and follow its routes to each broker's: RocketMQ 5's
local proxy mode, sends, pops and acks of a node's queues in-process):

* **official Python client** (rocketmq-python-client 5.1.2) and **official
  Node.js client** (rocketmq-client-nodejs 1.0.8), as subprocesses
  (benchmarks/interop/): ``Producer`` sends of one 1 KiB message with
  ``--senders`` in flight for ``--duration`` s; then a ``SimpleConsumer``
  receiving batches of 32 and acking every message (each ack one
  ``AckMessage`` RPC: that is how both clients ack) until all are acked;
* **Basalt's SDK over basalt.v1** (in this process), the same work at the same
  batch sizes: unbatched ``Producer.send`` with ``--senders`` in flight (the
  v2 clients send one message per RPC, so no ``send_batch``); a
  ``LitePullConsumer`` with ``pull_batch_size`` 32 that commits after every
  ``poll``.

Server CPU per message: the user+system CPU of the store-node and
pull-service processes (``/proc/<pid>/stat``) over the measured window,
divided by the messages. The window opens once a client has started
(routes, settings, a warm-up send) and closes when its last message
completes, so it holds the load and little else (the cluster's idle CPU over
the same time is printed too). "client CPU/msg" is the client process's own
CPU: where a client, not the server, is the limit. The machine's cores are
shared with the clients, so rates move with the load average; the CPU per
message is the figure to compare. Always runs ``basalt cluster down``.

**The floor** (:func:`benchmarks.grpc_floor.unary_server_cpu`): a bare
grpc.aio server's CPU per unary call, ``--senders`` in flight with 1 KiB
requests, measured in this run before and after the v2 rows (their mean is
the floor). The official clients make one unary call per message sent and
per message acked, so that is the least a message can cost a Python gRPC
server. A second floor is measured beside it: the same call as the official
clients make it (their eight metadata entries) to a server made as
Basalt's are (its telemetry and auth interceptors): what a call costs any
Basalt server before its handler runs. Targets: the v2 path's server CPU
per message at most 2x the bare floor, for produce and for receive + ack
(issue 31 §2; ``x floor``), and within 1.5x of basalt.v1's for the same
work (issue 19 §6; ``v2/v1``).

Usage::

    .venv/bin/python benchmarks/rocketmq_v2.py [--duration 5] [--senders 32] \
        [--fronts pull-service store-node] [--clients python node] [--profile PREFIX]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from basalt.client import ConsumeFromWhere, LitePullConfig, LitePullConsumer, Producer
from basalt.common.message import Message
from benchmarks.e2e_client import Cluster
from benchmarks.grpc_floor import unary_server_cpu
from benchmarks.report import Cell, Figure, Report, Table, add_json_out, count

REPO = Path(__file__).resolve().parent.parent
INTEROP = REPO / "benchmarks" / "interop"
NODE_MODULES = REPO / "tests" / "interop" / "node" / "node_modules"
BODY = 1024
BATCH = 32
#: Target: the v2 path's server CPU per message at most this times basalt.v1's.
TARGET_RATIO = 1.5
#: Target: the v2 path's server CPU per message at most this times the floor's.
FLOOR_RATIO = 2.0
#: Where the official clients dial (module docstring).
FRONTS = ("pull-service", "store-node")
#: The floors measured: the target's, and one call as the official clients
#: make it to a Basalt server (their metadata, the services' interceptors).
BARE = "bare unary"
V2_SHAPED = "v2 client's call, Basalt server"
CLIENTS = {
    "python": [sys.executable, str(INTEROP / "python_v2.py")],
    "node": ["node", str(INTEROP / "node_v2.js")],
}
_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pids: Sequence[int]) -> tuple[float, float]:
    """User+system CPU seconds the processes ``pids`` have used so far
    (``/proc/<pid>/stat`` fields 14 and 15, in clock ticks): all of them, and
    the first one's (the pull-service: the front's share)."""
    ticks = []
    for pid in pids:
        # The command name (field 2) may hold spaces: split after its ')'.
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        ticks.append(int(fields[11]) + int(fields[12]))
    return sum(ticks) / _TICK, ticks[0] / _TICK


def _spent(before: tuple[float, float], after: tuple[float, float]) -> tuple[float, float]:
    return after[0] - before[0], after[1] - before[1]


@dataclass(frozen=True, slots=True)
class Result:
    """One measured run: ``count`` messages in ``secs``; ``server_cpu_s`` the
    store-nodes' and pull-service's CPU over that window; ``client_cpu_s`` the
    client's own."""

    path: str  # "produce" | "consume"
    front: str  # FRONTS, or "-" for basalt.v1
    client: str
    how: str
    count: int
    secs: float
    server_cpu_s: float
    pull_cpu_s: float  # of server_cpu_s, the pull-service's (the first pid's)
    client_cpu_s: float
    errors: int = 0

    @property
    def rate(self) -> float:
        return self.count / self.secs if self.secs > 0 else 0.0

    @property
    def server_us(self) -> float:
        return self.server_cpu_s / max(self.count, 1) * 1e6

    @property
    def pull_us(self) -> float:
        return self.pull_cpu_s / max(self.count, 1) * 1e6

    @property
    def client_us(self) -> float:
        return self.client_cpu_s / max(self.count, 1) * 1e6


def run_official(
    client: str,
    mode: str,
    front: str,
    endpoints: str,
    spec: dict[str, object],
    server: Sequence[int],
) -> Result:
    """One official-client script (benchmarks/interop/) in ``mode``; the server
    CPU is read between its ``ready`` and its result line."""
    env = dict(os.environ, NODE_PATH=str(NODE_MODULES))
    proc = subprocess.Popen(
        [*CLIENTS[client], mode, endpoints],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=REPO,
    )  # fmt: skip
    assert proc.stdin is not None and proc.stdout is not None
    try:
        proc.stdin.write(json.dumps(spec) + "\n")
        proc.stdin.flush()
        ready = proc.stdout.readline()
        if not ready.startswith("{"):
            raise RuntimeError(f"{client} {mode} did not start: {ready!r}")
        before = cpu_seconds(server)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        line = proc.stdout.readline()
        after = cpu_seconds(server)
        if not line.startswith("{"):
            raise RuntimeError(f"{client} {mode} failed: {line!r}")
        out = json.loads(line)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    how = (
        f"Producer.send_async, {spec['concurrency']} in flight"
        if client == "python" and mode == "produce"
        else f"Producer.send, {spec['concurrency']} in flight"
        if mode == "produce"
        else f"SimpleConsumer.receive({BATCH}) + ack each, {spec['concurrency']} loops"
    )
    return Result(
        mode, front, f"{client} v2", how, out["count"], out["secs"], *_spent(before, after),
        out["cpu_s"], out["errors"],
    )  # fmt: skip


async def v1_produce(
    address: str, topic: str, senders: int, duration_s: float, server: Sequence[int]
) -> Result:
    body = bytes(BODY)
    sent = errors = 0
    last = 0.0
    async with Producer(address, group="v2-bench") as producer:
        await producer.send(Message(topic, body, tags="TagA"))  # routes and streams up
        before, cpu, started = cpu_seconds(server), time.process_time(), time.monotonic()
        stop = started + duration_s

        async def sender() -> None:
            nonlocal sent, errors, last
            while time.monotonic() < stop:
                try:
                    await producer.send(Message(topic, body, tags="TagA"))
                    sent += 1
                except Exception:
                    errors += 1
                last = time.monotonic()

        await asyncio.gather(*(sender() for _ in range(senders)))
        after, cpu = cpu_seconds(server), time.process_time() - cpu
    return Result(
        "produce", "-", "basalt SDK v1", f"Producer.send (unbatched), {senders} in flight",
        sent, last - started, *_spent(before, after), cpu, errors,
    )  # fmt: skip


async def v1_consume(address: str, topic: str, expected: int, server: Sequence[int]) -> Result:
    config = LitePullConfig(
        consumer_group="v2-bench-v1",
        pull_batch_size=BATCH,
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
    )
    got = 0
    async with LitePullConsumer(address, config=config) as consumer:
        await consumer.assign(await consumer.queues_of(topic))
        before, cpu, started = cpu_seconds(server), time.process_time(), time.monotonic()
        last = started
        while got < expected:
            records = await consumer.poll(timeout_ms=1000)
            if not records:
                break
            got += len(records)
            await consumer.commit()
            last = time.monotonic()
        after, cpu = cpu_seconds(server), time.process_time() - cpu
    return Result(
        "consume", "-", "basalt SDK v1",
        f"LitePullConsumer pull_batch_size {BATCH}, poll + commit", got, last - started,
        *_spent(before, after), cpu,
    )  # fmt: skip


def results_table(results: Sequence[Result], floor_us: float) -> Table:
    """The table: a v2 row's ratios are against ``floor_us`` (the bare unary
    call's server CPU) and the v1 row of the same path."""
    v1 = {r.path: r for r in results if r.client.endswith("v1")}
    table = Table(
        "clients",
        ("path", "front", "client", "how", "msgs/s", "server CPU µs/msg", "x floor",
         "target <=2x floor", "v2/v1", "target <=1.5x v1", "of it pull-service",
         "client CPU µs/msg", "count", "errors"),
        key=("path", "front", "client"),
    )  # fmt: skip
    for r in results:
        base = v1.get(r.path)
        cells: list[Cell] = ["", "", "", ""]
        if not r.client.endswith("v1"):
            x = r.server_us / floor_us
            cells[:2] = [
                Figure(x, "x floor", better="lower", fmt=".2f"),
                "met" if x <= FLOOR_RATIO else "NOT MET",
            ]
            if base is not None:
                y = r.server_us / base.server_us
                cells[2:] = [
                    Figure(y, "x v1", better="lower", fmt=".2f"),
                    "met" if y <= TARGET_RATIO else "NOT MET",
                ]
        table.add(
            r.path,
            r.front,
            r.client,
            r.how,
            Figure(r.rate, "msgs/s", fmt=",.0f"),
            Figure(r.server_us, "µs/msg", fmt=",.1f"),
            *cells,
            Figure(r.pull_us, "µs/msg", fmt=",.1f"),
            Figure(r.client_us, "µs/msg", fmt=",.1f"),
            count(r.count),
            count(r.errors, lower_is_better=True),
        )
    return table


def floor_table(floors: Sequence[tuple[str, str, float, float]]) -> Table:
    """The floors' measurements (which, when, calls/s, server CPU µs per call)
    and each one's mean."""
    table = Table(
        "floor", ("floor", "when", "calls/s", "server CPU µs/call"), key=("floor", "when")
    )
    for which, when, rate, us in floors:
        table.add(
            which, when, Figure(rate, "calls/s", fmt=",.0f"), Figure(us, "µs/call", fmt=",.1f")
        )
    for which in dict.fromkeys(f[0] for f in floors):
        mine = [us for w, _, _, us in floors if w == which]
        table.add(which, "mean", "", Figure(sum(mine) / len(mine), "µs/call", fmt=",.1f"))
    return table


def _floor(args: argparse.Namespace, v2_shaped: bool = False) -> tuple[float, float]:
    rate, us = unary_server_cpu(
        in_flight=args.senders, duration_s=args.duration, as_v2_clients_call_basalt=v2_shaped
    )
    what = "as the v2 clients call a Basalt server" if v2_shaped else "bare unary floor"
    print(f"{what}: {rate:,.0f} calls/s, {us:,.1f} µs server CPU a call", file=sys.stderr)
    return rate, us


async def run(args: argparse.Namespace, root: Path) -> tuple[list[Result], float]:
    cluster = Cluster(root / "cluster")
    try:
        print(cluster.up().rstrip(), file=sys.stderr)
        state = json.loads((cluster.data_dir / "cluster.json").read_text())
        endpoints = {
            "pull-service": next(p["rocketmq_v2"] for p in state if p["role"] == "pull-service"),
            "store-node": next(p["rocketmq_v2"] for p in state if p["name"] == "broker-a"),
        }
        # The pull-service first: cpu_seconds reports its share apart.
        server = [p.pid for p in cluster.of_role("pull-service") + cluster.of_role("store-node")]
        # Whom --profile samples: the process the clients dial.
        hosts = {
            "pull-service": server[0],
            "store-node": next(p.pid for p in cluster.processes if p.name == "broker-a"),
        }
        topics = {
            (front, c): f"V2Bench{c.capitalize()}{front.title().replace('-', '')}"
            for front in args.fronts
            for c in args.clients
        }
        topics["-", "basalt"] = "V2BenchBasalt"
        await cluster.create_topics(topics.values(), args.queues)
        idle = cpu_seconds(server)[0]
        await asyncio.sleep(2.0)
        idle_per_s = (cpu_seconds(server)[0] - idle) / 2.0
        results: list[Result] = []
        produced = await v1_produce(
            cluster.pull_address, topics["-", "basalt"], args.senders, args.duration, server
        )
        results.append(produced)
        results.append(
            await v1_consume(
                cluster.pull_address, topics["-", "basalt"], produced.count + 1, server
            )
        )
        for front in args.fronts:
            spy = None
            if args.profile:
                # py-spy (pip install py-spy) sampling the process the clients dial.
                spy = subprocess.Popen(
                    [str(Path(sys.executable).parent / "py-spy"), "record", "--gil",
                     "--rate", "400", "--nonblocking", "--format", "raw",
                     "-o", f"{args.profile}-{front}.txt",
                     "-p", str(hosts[front])],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                )  # fmt: skip
            for client in args.clients:
                spec: dict[str, object] = {
                    "topic": topics[front, client], "group": f"v2-bench-{client}",
                    "body_size": BODY, "duration_s": args.duration, "concurrency": args.senders,
                }  # fmt: skip
                sent = run_official(client, "produce", front, endpoints[front], spec, server)
                results.append(sent)
                spec |= {"expect": sent.count + 1, "batch": BATCH, "concurrency": args.consumers}
                results.append(
                    run_official(client, "consume", front, endpoints[front], spec, server)
                )
            if spy is not None:
                spy.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
                spy.wait(timeout=60)
        return sorted(results, key=lambda r: r.path, reverse=True), idle_per_s
    finally:
        print(cluster.down().rstrip(), file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=5.0, help="seconds of each produce")
    parser.add_argument("--senders", type=int, default=32, help="sends in flight")
    parser.add_argument("--consumers", type=int, default=8, help="v2 receive loops")
    parser.add_argument("--queues", type=int, default=8, help="queues of each topic")
    parser.add_argument(
        "--profile",
        help="py-spy the process the clients dial during each front's v2 rows; "
        "collapsed stacks to PROFILE-<front>.txt",
    )
    parser.add_argument("--clients", nargs="*", default=["python", "node"], choices=sorted(CLIENTS))
    parser.add_argument("--fronts", nargs="*", default=list(FRONTS), choices=FRONTS)
    add_json_out(parser)
    args = parser.parse_args(argv)
    report = Report.start(__file__, args, argv)
    floors = [
        (BARE, "before", *_floor(args)),
        (V2_SHAPED, "before", *_floor(args, v2_shaped=True)),
    ]
    with tempfile.TemporaryDirectory(prefix="basalt-v2bench-") as tmp:
        results, idle = asyncio.run(run(args, Path(tmp)))
    floors += [
        (V2_SHAPED, "after", *_floor(args, v2_shaped=True)),
        (BARE, "after", *_floor(args)),
    ]
    report.emit(floor_table(floors))
    bare = [us for which, _, _, us in floors if which == BARE]
    report.emit(results_table(results, sum(bare) / len(bare)))
    report.note(f"idle cluster: {idle * 1e3:.1f} ms CPU/s; load average {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
