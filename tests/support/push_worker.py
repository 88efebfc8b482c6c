"""A PushConsumer in its own process, for the tests that kill one with -9.

Run as a program this is the **child**:
``python -m tests.support.push_worker ENDPOINT GROUP TOPIC CLIENT_ID LOG [orderly]``.
Each finished listener call appends one line to LOG per message,
``start end client_id broker queue_id offset body`` (start and end from
``time.monotonic()``, which is system-wide on Linux, so calls of different
processes compare), flushed at once. Prints ``started`` when the consumer
runs; SIGTERM closes it cleanly (commit, unlock, end the session).

Imported, it offers the **parent** side: :func:`worker` runs a child, and
:func:`calls` and :func:`overlaps` read what the children logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from basalt.client import (
    ConsumeFromWhere,
    ConsumeStatus,
    MessageQueue,
    PushConsumer,
    PushConsumerConfig,
)
from basalt.common.message import MessageRecord
from tests.support.timeouts import SUBPROCESS_TIMEOUT_S


async def main(
    endpoint: str, group: str, topic: str, client_id: str, log_path: str, mode: str = ""
) -> None:
    out = open(log_path, "a", buffering=1)  # noqa: SIM115 - open for the process's life
    lock = threading.Lock()

    def listener(messages: list[MessageRecord], queue: MessageQueue) -> ConsumeStatus:
        start = time.monotonic()
        time.sleep(0.002)  # a listener that takes a moment, so that calls can overlap
        end = time.monotonic()
        with lock:
            for m in messages:
                out.write(
                    f"{start:.6f} {end:.6f} {client_id} {queue.broker_name} {queue.queue_id} "
                    f"{m.queue_offset} {m.body.decode()}\n"
                )
        return ConsumeStatus.CONSUME_SUCCESS

    consumer = PushConsumer(
        endpoint,
        config=PushConsumerConfig(
            consumer_group=group,
            client_id=client_id,
            consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
            broker_suspend_max_time_ms=1000,
            consume_thread_nums=4,
            orderly=mode == "orderly",
        ),
        listener=listener,
    )
    consumer.subscribe(topic)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with consumer:
        print("started", flush=True)
        await stop.wait()
    out.close()


# -- the parent ----------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def worker(
    address: str, client_id: str, log: Path, group: str, topic: str, mode: str = ""
) -> AsyncIterator[asyncio.subprocess.Process]:
    """A push_worker process, once it reports its consumer started; killed at exit."""
    # Imported here: the child runs this module too and needs none of the services.
    from tests.support.processes import REPO_ROOT

    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.support.push_worker",
        address,
        group,
        topic,
        client_id,
        str(log),
        mode,
        stdout=asyncio.subprocess.PIPE,
        cwd=REPO_ROOT,
    )
    try:
        assert proc.stdout is not None
        started = await asyncio.wait_for(proc.stdout.readline(), SUBPROCESS_TIMEOUT_S)
        assert started == b"started\n"
        yield proc
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()


@dataclass(frozen=True)
class Call:
    """One message of a listener call, as a worker logged it."""

    start: float
    end: float
    client: str
    queue: tuple[str, int]
    offset: int
    body: str


def calls(log: Path) -> list[Call]:
    """Every whole line of ``log``, in the order written."""
    out = []
    for line in log.read_text().splitlines():
        parts = line.split()
        if len(parts) == 7:  # a line cut by kill -9 has fewer
            start, end, client, broker, qid, offset, body = parts
            out.append(
                Call(float(start), float(end), client, (broker, int(qid)), int(offset), body)
            )
    return out


def overlaps(log: Path) -> list[tuple[Call, Call]]:
    """Listener calls of one queue by two consumers that overlap in time."""
    by_queue: dict[tuple[str, int], list[Call]] = {}
    for call in calls(log):
        by_queue.setdefault(call.queue, []).append(call)
    bad = []
    for queue_calls in by_queue.values():
        queue_calls.sort(key=lambda c: c.start)
        latest: dict[str, float] = {}  # client -> latest end so far
        for call in queue_calls:
            for other, end in latest.items():
                if other != call.client and call.start < end:
                    bad.append((call, next(c for c in queue_calls if c.client == other)))
            latest[call.client] = max(latest.get(call.client, 0.0), call.end)
    return bad


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:7]))
