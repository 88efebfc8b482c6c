"""What gRPC itself costs on this machine, with no Basalt code at all.

A server process answers every call at once (bytes in, bytes out, no
protobuf); the benchmark process measures, one call in flight:

* **unary** round trips (grpc.aio client and server), p50 / p99;
* **stream** round trips: one message written and its answer read on an
  open bidirectional stream, p50 / p99;
* a raw **TCP** round trip between two processes, for comparison.

These are the floors under ``e2e_throughput.py``'s send latency: a send
cannot answer faster than a bare round trip on the same transport.

The gRPC rows run twice, server and client each in its own process started
for it: on gRPC's defaults (its EventEngine), and on the settings ``basalt
cluster up`` gives the services (:data:`basalt.services.process.SERVICE_ENV`:
gRPC core's iomgr poller). ``--rounds`` repeats the pair, alternating, as the
two drift with the machine's load.

Usage::

    .venv/bin/python benchmarks/grpc_floor.py [--samples 5000] [--rounds 1]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import socket
import sys
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import grpc

from basalt.services.process import SERVICE_ENV
from benchmarks.report import Figure, Report, Row, add_json_out, rows_table

#: The transports compared: a label and the environment gRPC starts with.
TRANSPORTS = {"gRPC defaults": {name: "" for name in SERVICE_ENV}, "Basalt services": SERVICE_ENV}


def _identity(data: bytes) -> bytes:
    return data


async def _unary(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
    return request


async def _stream(
    requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext[bytes, bytes]
) -> AsyncIterator[bytes]:
    async for request in requests:
        yield request


def _serve_grpc(port: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    async def main() -> None:
        server = grpc.aio.server()
        handlers = {
            "Unary": grpc.unary_unary_rpc_method_handler(
                _unary, request_deserializer=_identity, response_serializer=_identity
            ),
            "Stream": grpc.stream_stream_rpc_method_handler(
                _stream, request_deserializer=_identity, response_serializer=_identity
            ),
        }
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("f.F", handlers),))
        port.put(server.add_insecure_port("127.0.0.1:0"))
        await server.start()
        await server.wait_for_termination()

    asyncio.run(main())


def _serve_tcp(port: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    listener = socket.create_server(("127.0.0.1", 0))
    port.put(listener.getsockname()[1])
    conn, _ = listener.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while data := conn.recv(64):
        conn.sendall(data)


def _row(path: str, config: str, us: list[float]) -> Row:
    us.sort()
    p50, p99 = us[len(us) // 2], us[min(len(us) - 1, int(len(us) * 0.99))]
    p50_figure = Figure(p50, "us", "p50", fmt=",.0f")
    return Row(path, config, p99, "us p99", len(us), sum(us) / 1e6, None, [p50_figure])


def _measure_grpc(
    address: str,
    warmup: int,
    samples: int,
    transport: str,
    out: multiprocessing.Queue,  # type: ignore[type-arg]
) -> None:
    out.put(asyncio.run(_grpc_rows(address, warmup, samples, transport)))


async def _grpc_rows(address: str, warmup: int, samples: int, transport: str) -> list[Row]:
    async with grpc.aio.insecure_channel(address) as channel:
        unary: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary("/f.F/Unary")
        unary_us: list[float] = []
        for i in range(warmup + samples):
            t = time.perf_counter_ns()
            await unary(b"x")
            if i >= warmup:
                unary_us.append((time.perf_counter_ns() - t) / 1000)
        call: grpc.aio.StreamStreamCall[bytes, bytes] = channel.stream_stream("/f.F/Stream")()
        stream_us: list[float] = []
        for i in range(warmup + samples):
            t = time.perf_counter_ns()
            await call.write(b"x")
            await call.read()
            if i >= warmup:
                stream_us.append((time.perf_counter_ns() - t) / 1000)
        await call.done_writing()
    return [
        _row("gRPC unary", f"grpc.aio, 1 in flight, 1 byte; {transport}", unary_us),
        _row("gRPC stream", f"bidi stream, write then read; {transport}", stream_us),
    ]


def _tcp_row(port: int, warmup: int, samples: int) -> Row:
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        us: list[float] = []
        for i in range(warmup + samples):
            t = time.perf_counter_ns()
            conn.sendall(b"x")
            conn.recv(64)
            if i >= warmup:
                us.append((time.perf_counter_ns() - t) / 1000)
    return _row("TCP", "blocking sockets, two processes, 1 byte", us)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=1, help="times to run each transport")
    add_json_out(parser)
    args = parser.parse_args(argv)
    report = Report.start(__file__, args, argv)
    warmup = max(100, args.samples // 10)
    ctx = multiprocessing.get_context("spawn")
    queue: multiprocessing.Queue = ctx.Queue()  # type: ignore[type-arg]
    rows: list[Row] = []
    for _ in range(args.rounds):
        for transport, env in TRANSPORTS.items():
            # A spawned process starts a new interpreter with this environment, and
            # gRPC reads its settings there, when it is first imported.
            saved = dict(os.environ)
            os.environ.update(env)
            try:
                server = ctx.Process(target=_serve_grpc, args=(queue,), daemon=True)
                server.start()
                address = f"127.0.0.1:{queue.get(timeout=30)}"
                client = ctx.Process(
                    target=_measure_grpc,
                    args=(address, warmup, args.samples, transport, queue),
                    daemon=True,
                )
                client.start()
                rows.extend(queue.get(timeout=600))
                client.join()
            finally:
                os.environ.clear()
                os.environ.update(saved)
                server.terminate()
    tcp = ctx.Process(target=_serve_tcp, args=(queue,), daemon=True)
    tcp.start()
    try:
        rows.append(_tcp_row(queue.get(timeout=30), warmup, args.samples))
    finally:
        tcp.terminate()
    rows.sort(key=lambda r: r.path)
    report.emit(rows_table("round trips", rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
