"""Load from the official RocketMQ 5 Python client (rocketmq-python-client
5.1.2) for benchmarks/rocketmq_v2.py: run as a script, never imported (the
client registers apache.rocketmq.v2 in protobuf's process-wide pool).

    python python_v2.py produce|consume ENDPOINTS < spec

The first stdin line is a JSON spec: ``topic``, ``group``, ``concurrency``,
``body_size``, ``duration_s`` (produce), ``expect`` and ``batch`` (consume).
The script starts its client (routes, settings, one warm-up send or
receive), prints ``ready``, waits for a ``go`` line, runs, then prints one
JSON line: ``count`` (messages sent, or received and acked), ``secs`` (from
``go`` to the last completion), ``errors`` and ``cpu_s`` (this process's CPU
over that window: the client's own cost).

* produce: ``Producer.send_async`` with ``concurrency`` sends in flight (the
  client is thread-based; its async API is its fastest: the sends run on its
  own event loop thread), one 1 KiB message each, for ``duration_s``;
* consume: ``concurrency`` threads, each ``SimpleConsumer.receive(batch)``
  then ``ack`` of each message in turn (one AckMessage RPC each: the
  client acks one message per RPC), until ``expect`` messages are acked or
  nothing came for 3 s.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from concurrent.futures import Future
from typing import Any

# The client ships no type information.
from rocketmq import (  # type: ignore[import-untyped]
    ClientConfiguration,
    Credentials,
    FilterExpression,
    Message,
    Producer,
    SimpleConsumer,
)

INVISIBLE_S = 30
#: A receive loop stops once nothing was acked for this long.
IDLE_S = 3


def _go(warmed: int) -> None:
    print(json.dumps({"ready": True, "warmed": warmed}), flush=True)
    line = sys.stdin.readline()
    if line.strip() != "go":
        raise SystemExit(f"expected go, got {line!r}")


def _cpu() -> float:
    return time.process_time()


def produce(endpoints: str, spec: dict[str, Any]) -> dict[str, Any]:
    producer = Producer(
        ClientConfiguration(endpoints, Credentials(), request_timeout=10), (spec["topic"],)
    )
    producer.startup()
    body = bytes(spec["body_size"])

    def message() -> Message:
        m = Message()
        m.topic = spec["topic"]
        m.body = body
        m.tag = "TagA"
        return m

    try:
        producer.send(message())  # routes, settings, the channel
        _go(1)
        window = threading.Semaphore(spec["concurrency"])
        lock = threading.Lock()
        done = {"count": 0, "errors": 0, "last": 0.0}

        def finished(f: Future[Any]) -> None:
            with lock:
                if f.exception() is None:
                    done["count"] += 1
                else:
                    done["errors"] += 1
                done["last"] = time.monotonic()
            window.release()

        started, cpu = time.monotonic(), _cpu()
        stop = started + spec["duration_s"]
        while time.monotonic() < stop:
            window.acquire()
            producer.send_async(message()).add_done_callback(finished)
        for _ in range(spec["concurrency"]):  # every send in flight completes
            window.acquire()
        cpu = _cpu() - cpu
        return {
            "count": done["count"], "errors": done["errors"],
            "secs": done["last"] - started, "cpu_s": cpu,
        }  # fmt: skip
    finally:
        producer.shutdown()


def consume(endpoints: str, spec: dict[str, Any]) -> dict[str, Any]:
    consumer = SimpleConsumer(
        ClientConfiguration(endpoints, Credentials(), request_timeout=10),
        spec["group"],
        {spec["topic"]: FilterExpression("*")},
        await_duration=1,
    )
    consumer.startup()
    try:
        _go(0)
        lock = threading.Lock()
        done = {"count": 0, "errors": 0, "last": 0.0}
        expect, batch = spec["expect"], spec["batch"]

        def loop() -> None:
            # The client's sync calls build asyncio futures: a thread of our
            # own needs an event loop set (the main thread has one).
            asyncio.set_event_loop(asyncio.new_event_loop())
            while True:
                with lock:
                    if done["count"] >= expect:
                        return
                messages = consumer.receive(batch, INVISIBLE_S) or []
                if not messages and time.monotonic() - max(done["last"], started) > IDLE_S:
                    return  # drained: nothing came for IDLE_S
                # One ack after another: the client's ack_async hands back
                # nothing to wait on (its inner future is an asyncio one of
                # its own loop), so its parallelism is the receive loops.
                for m in messages:
                    try:
                        consumer.ack(m)
                        ok = True
                    except Exception:
                        ok = False
                    with lock:
                        done["count" if ok else "errors"] += 1
                        done["last"] = time.monotonic()

        started, cpu = time.monotonic(), _cpu()
        threads = [threading.Thread(target=loop) for _ in range(spec["concurrency"])]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        cpu = _cpu() - cpu
        return {
            "count": done["count"], "errors": done["errors"],
            "secs": done["last"] - started, "cpu_s": cpu,
        }  # fmt: skip
    finally:
        consumer.shutdown()


def main() -> int:
    mode, endpoints = sys.argv[1], sys.argv[2]
    spec = json.loads(sys.stdin.readline())
    result = (produce if mode == "produce" else consume)(endpoints, spec)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
