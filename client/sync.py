"""Thin blocking wrappers over the asyncio SDK, for code without an event loop.

Each wrapper owns a private event loop on a daemon thread and runs the async
client there; every method blocks the caller until that coroutine is done
(``send_async`` returns a ``concurrent.futures.Future`` instead). Methods may
be called from any thread. ``close()`` (or leaving the ``with`` block) closes
the client and stops the loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar

from basalt.client.lite_pull_consumer import LitePullConfig, LitePullConsumer, MessageQueue
from basalt.client.membership import TopicSubscription
from basalt.client.producer import Producer, ProducerConfig, SendResult
from basalt.client.push_consumer import Listener, PushConsumer, PushConsumerConfig
from basalt.common.message import Message, MessageRecord

T = TypeVar("T")


class _LoopThread:
    """An event loop running on its own daemon thread."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.submit(coro).result()

    def stop(self) -> None:
        """End every task still on the loop (a ``send_async`` the client's close
        did not wait for, or everything if that close failed: cancelled and
        awaited, as ``asyncio.run`` does), then stop and close the loop."""
        try:
            self.run(_end_other_tasks())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join()
            self.loop.close()


async def _end_other_tasks() -> None:
    """Cancel every task of the running loop but this one and wait until they have ended."""
    me = asyncio.current_task()
    others = [t for t in asyncio.all_tasks() if t is not me]
    for task in others:
        task.cancel()
    await asyncio.gather(*others, return_exceptions=True)
    await asyncio.get_running_loop().shutdown_asyncgens()


class SyncProducer:
    """:class:`basalt.client.Producer`, blocking."""

    def __init__(self, endpoints: str, *, group: str, config: ProducerConfig | None = None) -> None:
        self._loop = _LoopThread("basalt-producer")

        async def start() -> Producer:  # channels belong to the loop that makes them
            producer = Producer(endpoints, group=group, config=config)
            await producer.start()
            return producer

        self._producer = self._loop.run(start())

    def send(self, message: Message) -> SendResult:
        return self._loop.run(self._producer.send(message))

    def send_batch(self, messages: Sequence[Message]) -> list[SendResult]:
        return self._loop.run(self._producer.send_batch(messages))

    def send_async(self, message: Message) -> concurrent.futures.Future[SendResult]:
        return self._loop.submit(self._producer.send(message))

    def close(self) -> None:
        try:
            self._loop.run(self._producer.close())
        finally:
            self._loop.stop()

    def __enter__(self) -> SyncProducer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SyncLitePullConsumer:
    """:class:`basalt.client.LitePullConsumer`, blocking."""

    def __init__(
        self,
        endpoints: str,
        *,
        config: LitePullConfig,
        subscriptions: Sequence[TopicSubscription] = (),
    ) -> None:
        """Started here; with ``subscriptions`` in subscribe mode (see LitePullConsumer)."""
        self._loop = _LoopThread("basalt-consumer")

        async def start() -> LitePullConsumer:
            consumer = LitePullConsumer(endpoints, config=config)
            for s in subscriptions:
                consumer.subscribe(s.topic, s.expression, sql92=s.sql92)
            await consumer.start()
            return consumer

        self._consumer = self._loop.run(start())

    def queues_of(self, topic: str) -> list[MessageQueue]:
        return self._loop.run(self._consumer.queues_of(topic))

    def assign(self, queues: Sequence[MessageQueue]) -> None:
        self._loop.run(self._consumer.assign(queues))

    def poll(self, timeout_ms: int = 1000, max_records: int | None = None) -> list[MessageRecord]:
        return self._loop.run(self._consumer.poll(timeout_ms, max_records))

    def seek(self, queue: MessageQueue, offset: int) -> None:
        self._consumer.seek(queue, offset)

    def commit(self) -> None:
        self._loop.run(self._consumer.commit())

    def close(self) -> None:
        try:
            self._loop.run(self._consumer.close())
        finally:
            self._loop.stop()

    def __enter__(self) -> SyncLitePullConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SyncPushConsumer:
    """:class:`basalt.client.PushConsumer`, blocking: ``subscribe``, then ``start``; the
    listener runs on the consumer's thread pool as with the async one (a
    coroutine listener would run on the private loop)."""

    def __init__(self, endpoints: str, *, config: PushConsumerConfig, listener: Listener) -> None:
        self._loop = _LoopThread("basalt-push-consumer")
        self._consumer = PushConsumer(endpoints, config=config, listener=listener)

    def subscribe(self, topic: str, expression: str = "*", *, sql92: bool = False) -> None:
        self._consumer.subscribe(topic, expression, sql92=sql92)

    def start(self) -> None:
        self._loop.run(self._consumer.start())

    def assignment(self) -> list[MessageQueue]:
        async def get() -> list[MessageQueue]:
            return self._consumer.assignment()

        return self._loop.run(get())

    def close(self) -> None:
        try:
            self._loop.run(self._consumer.close())
        finally:
            self._loop.stop()

    def __enter__(self) -> SyncPushConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
