"""What gRPC itself costs on this machine, with no Basalt code at all.

A server process answers every call at once (bytes in, bytes out, no
protobuf); the benchmark process measures, one call in flight:

* **unary** round trips (grpc.aio client and server), p50 / p99;
* **stream** round trips: one message written and its answer read on an
  open bidirectional stream, p50 / p99;
* a raw **TCP** round trip between two processes, for comparison.

These are the floors under ``e2e_throughput.py``'s send latency: a send
cannot answer faster than a bare round trip on the same transport.

:func:`unary_server_cpu` is the other floor, of CPU: what a bare grpc.aio
server spends per unary call at a given concurrency (``benchmarks/rocketmq_v2.py``
measures it in its own run, as the official RocketMQ 5 clients make one
unary call per message sent or acked).

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


#: The answer of ``Ack``: about a v2 SendMessage or AckMessage answer's size.
_ACK = bytes(48)


async def _ack(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
    return _ACK


async def _stream(
    requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext[bytes, bytes]
) -> AsyncIterator[bytes]:
    async for request in requests:
        yield request


async def _ack_stream(
    requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext[bytes, bytes]
) -> None:
    # As SendStream answers: a small answer a request, written by the handler.
    async for _ in requests:
        await context.write(_ACK)


#: The answer of ``Fetch``: one 1 KiB message.
_FETCHED = bytes(1024)


async def _fetch(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
    return _FETCHED


async def _fetch_stream(
    requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext[bytes, bytes]
) -> None:
    # As GetMessagesStream answers a fetch that finds a message: 1 KiB a request.
    async for _ in requests:
        await context.write(_FETCHED)


#: The metadata the official RocketMQ 5 Python client sends with every call
#: (its Signature.metadata: eight entries, an HMAC signature among them).
V2_METADATA = (
    ("x-mq-language", "PYTHON"),
    ("x-mq-protocol", "GRPC_V2"),
    ("x-mq-client-version", "5.1.2"),
    ("x-mq-date-time", "20261129T041000Z"),
    ("x-mq-request-id", "5f1e6a3c-8b1b-4f5e-9d2b-0123456789ab"),
    ("x-mq-client-id", "host@1234@0@abcdef0123456789"),
    ("x-mq-namespace", ""),
    (
        "authorization",
        "MQv2-HMAC-SHA1 Credential=, SignedHeaders=x-mq-date-time, "
        "Signature=0123456789abcdef0123456789abcdef01234567",
    ),
)


def _serve_grpc(
    port: multiprocessing.Queue,  # type: ignore[type-arg]
    basalt: bool = False,
    listen: int = 0,
) -> None:
    """A server answering at once, on 127.0.0.1:``listen`` (0: any port), the
    port put on ``port``; ``basalt``: made as Basalt's services make theirs
    (:func:`basalt.services.process.grpc_server`: its interceptors).

    Methods of ``f.F``: ``Unary`` (the request back), ``Ack`` (48 bytes),
    ``Fetch`` (1 KiB), ``Stream`` (each request back), ``AckStream`` (48 bytes
    a request, written as SendStream writes its answers), ``FetchStream`` (1 KiB
    a request, as GetMessagesStream answers a fetch that finds a message)."""

    async def main() -> None:
        if basalt:
            from basalt.services.process import grpc_server

            server = grpc_server(64 * 1024 * 1024)
        else:
            server = grpc.aio.server()
        handlers = {
            "Unary": grpc.unary_unary_rpc_method_handler(
                _unary, request_deserializer=_identity, response_serializer=_identity
            ),
            "Ack": grpc.unary_unary_rpc_method_handler(
                _ack, request_deserializer=_identity, response_serializer=_identity
            ),
            "Fetch": grpc.unary_unary_rpc_method_handler(
                _fetch, request_deserializer=_identity, response_serializer=_identity
            ),
            "Stream": grpc.stream_stream_rpc_method_handler(
                _stream, request_deserializer=_identity, response_serializer=_identity
            ),
            "AckStream": grpc.stream_stream_rpc_method_handler(
                _ack_stream, request_deserializer=_identity, response_serializer=_identity
            ),
            "FetchStream": grpc.stream_stream_rpc_method_handler(
                _fetch_stream, request_deserializer=_identity, response_serializer=_identity
            ),
        }
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("f.F", handlers),))
        port.put(server.add_insecure_port(f"127.0.0.1:{listen}"))
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


def _cpu_s(pid: int) -> float:
    """User+system CPU seconds of process ``pid`` so far (``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _load_unary(
    address: str,
    in_flight: int,
    body_bytes: int,
    duration_s: float,
    metadata: tuple[tuple[str, str], ...] | None,
    go: multiprocessing.Queue,  # type: ignore[type-arg]
    out: multiprocessing.Queue,  # type: ignore[type-arg]
) -> None:
    """A client process: warm up, say ready, wait for go, then ``in_flight``
    concurrent ``Ack`` calls of ``body_bytes`` (with ``metadata``) for
    ``duration_s``; puts the calls made and the seconds they took."""

    async def main() -> None:
        async with grpc.aio.insecure_channel(address) as channel:
            call: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary("/f.F/Ack")
            body = bytes(body_bytes)
            for _ in range(200):
                await call(body, metadata=metadata)
            out.put("ready")
            await asyncio.get_running_loop().run_in_executor(None, go.get)
            done = 0
            started = time.monotonic()
            stop = started + duration_s

            async def caller() -> None:
                nonlocal done
                while time.monotonic() < stop:
                    await call(body, metadata=metadata)
                    done += 1

            await asyncio.gather(*(caller() for _ in range(in_flight)))
            out.put((done, time.monotonic() - started))

    asyncio.run(main())


def unary_server_cpu(
    *,
    in_flight: int = 32,
    body_bytes: int = 1024,
    duration_s: float = 5.0,
    as_v2_clients_call_basalt: bool = False,
) -> tuple[float, float]:
    """The bare unary floor: a grpc.aio server answering every call at once
    (bytes in, 48 bytes out, no protobuf, no interceptors), on the gRPC
    settings Basalt's services run with (:data:`SERVICE_ENV`), called by
    another process with ``in_flight`` calls of ``body_bytes`` in flight for
    ``duration_s``. ``as_v2_clients_call_basalt``: the server made as
    Basalt's are (its interceptors) and every call carrying the official
    client's metadata (:data:`V2_METADATA`) - what one unary call of an
    official client costs any Basalt server, its handler aside. Returns
    (calls/s, the server's CPU µs per call)."""
    ctx = multiprocessing.get_context("spawn")
    ports: multiprocessing.Queue = ctx.Queue()  # type: ignore[type-arg]
    go: multiprocessing.Queue = ctx.Queue()  # type: ignore[type-arg]
    out: multiprocessing.Queue = ctx.Queue()  # type: ignore[type-arg]
    saved = dict(os.environ)
    os.environ.update(SERVICE_ENV)
    try:
        server = ctx.Process(
            target=_serve_grpc, args=(ports, as_v2_clients_call_basalt), daemon=True
        )
        server.start()
        address = f"127.0.0.1:{ports.get(timeout=30)}"
        metadata = V2_METADATA if as_v2_clients_call_basalt else None
        client = ctx.Process(
            target=_load_unary,
            args=(address, in_flight, body_bytes, duration_s, metadata, go, out),
            daemon=True,
        )
        client.start()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    try:
        assert out.get(timeout=60) == "ready"
        assert server.pid is not None
        before = _cpu_s(server.pid)
        go.put("go")
        calls, secs = out.get(timeout=duration_s + 60)
        spent = _cpu_s(server.pid) - before
        client.join(timeout=30)
    finally:
        server.terminate()
        if client.is_alive():
            client.terminate()
    return calls / secs, spent / max(calls, 1) * 1e6


class _Printed:
    """Where ``--serve`` puts the port: this process's stdout."""

    def put(self, port: int) -> None:
        print(port, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=1, help="times to run each transport")
    parser.add_argument(
        "--serve",
        type=int,
        metavar="PORT",
        help="only serve the bare server on PORT until killed (benchmarks/peers.py's floor)",
    )
    add_json_out(parser)
    args = parser.parse_args(argv)
    if args.serve is not None:
        _serve_grpc(_Printed(), listen=args.serve)  # type: ignore[arg-type]
        return 0
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
