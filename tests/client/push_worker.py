"""A PushConsumer in its own process, for the tests that kill one with -9.

Usage: ``python -m tests.client.push_worker ENDPOINT GROUP TOPIC CLIENT_ID LOG [orderly]``.
Each finished listener call appends one line to LOG per message,
``start end client_id broker queue_id offset body`` (start and end from
``time.monotonic()``, which is system-wide on Linux, so calls of different
processes compare), flushed at once. Prints ``started`` when the consumer
runs; SIGTERM closes it cleanly (commit, unlock, end the session).
"""

from __future__ import annotations

import asyncio
import signal
import sys
import threading
import time

from basalt.client import (
    ConsumeFromWhere,
    ConsumeStatus,
    MessageQueue,
    PushConsumer,
    PushConsumerConfig,
)

from basalt.common.message import MessageRecord


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


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:7]))
