"""PushConsumer: a consumer group member that rebalances and calls a listener.

RocketMQ's DefaultMQPushConsumer in clustering mode, on Basalt's services:

* **Membership** (:class:`basalt.client.membership.GroupMember`): a Session stream
  with heartbeats and commands; AllocateMessageQueueAveragely rebalances on
  start, on a pushed RebalanceCommand and every ``rebalance_interval_ms``;
  a queue is processed only under its lock (``LockQueues``, bound to the
  session), given up (dropped, committed) before it is unlocked, so no queue
  is processed by two consumers of the group at once, short of a listener
  running past ``drop_await_termination_ms`` after its queue was dropped.
  A session that breaks drops every queue at once, uncommitted.
* **ProcessQueue.** One per owned queue: a long-poll pull loop reading the
  queue's store-node directly (a GetMessages on the consumer's one
  ``StoreNode.GetMessagesStream`` to it, :mod:`basalt.client.fetch_stream`; a
  dropped queue's held fetch is cancelled on the stream; the pull-service keeps
  the session, rebalance, locks and routes: :mod:`basalt.client.consumer_base`),
  the pulled messages not yet consumed (at most ``pull_threshold_for_queue``:
  the loop waits for room, no sleep), and the listener calls in flight.
* **Listener.** ``listener(messages, queue) -> ConsumeStatus``, a plain
  function run on a pool of ``consume_thread_nums`` threads, or a coroutine
  function run on the loop (at most ``consume_thread_nums`` at once).
  Concurrently (default): batches of up to ``consume_message_batch_max_size``
  run in parallel, in any order. Orderly (``orderly=True``): one batch of a
  queue at a time, in offset order.
* **Retries** (docs/retry.md). Concurrently, RECONSUME_LATER (or an
  exception) gives each message of the batch back to the store-node it was
  read from (``ConsumerSendMsgBack``): it comes again from the group's
  ``%RETRY%<group>`` after a delay level of ``3 + reconsume times``, and
  after ``max_reconsume_times`` it goes to ``%DLQ%<group>``; the queue goes
  on. A message whose send-back fails stays pending (it holds the queue's
  commit at its offset, so a crash cannot lose it) and its listener call is
  run again after ``suspend_current_queue_time_ms`` (RocketMQ's
  consumeMessageLater), then given back again if it fails again; the rest
  of the queue is consumed meanwhile. Every consumer of the group subscribes
  to the retry topic (RocketMQ's copySubscription), and a message read from
  it is shown to the listener with its original topic (RETRY_TOPIC) and its
  ``reconsume_times``. Orderly, a failed batch runs again in place after
  ``suspend_current_queue_time_ms``, holding its queue, until a message has
  been reconsumed ``max_reconsume_times`` times: it then goes to the
  dead-letter topic and the queue goes on.
* **Commit.** The lowest offset not yet consumed (or, with none pending, the
  next to pull): every ``persist_consumer_offset_interval_ms`` and when a
  queue is given up or the consumer closes, one at a time per queue.
* **RESET_OFFSET.** The affected ProcessQueues are dropped (their pulls
  cancelled), the listener calls already running are awaited (at most
  ``drop_await_termination_ms``), the new offsets and reset epochs adopted,
  pulls resume from them, and then the command is acked. No fixed sleep.
* **Tracing.** Each listener call is a CONSUMER span, "process <topic>",
  linked to the producers' send spans its messages carry
  (:mod:`basalt.common.tracing`).

Concurrency: everything but the threaded listener runs on one event loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import dataclasses
import enum
import inspect
import itertools
import logging
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, cast

import grpc
from opentelemetry import trace

from basalt.client.consumer_base import (
    PULL_DEADLINE_MARGIN_S,
    ConsumerClient,
    ConsumerConfig,
    MessageQueue,
    Position,
    subscription_of,
)
from basalt.client.errors import ClientError
from basalt.client.fetch_stream import AwaitedFetches
from basalt.client.membership import GroupMember, TopicSubscription
from basalt.client.process_queue import ProcessQueue
from basalt.client.tasks import TaskOwner, gather_all
from basalt.common.auth import Credentials
from basalt.common.message import (
    DEFAULT_MAX_RECONSUME_TIMES,
    PROPERTY_RETRY_TOPIC,
    RETRY_GROUP_TOPIC_PREFIX,
    MessageRecord,
    retry_topic,
)
from basalt.common.record import MAX_TOPIC_LENGTH
from basalt.common.settings import (
    boolean,
    check,
    config_dataclass,
    non_negative,
    positive,
    setting,
)
from basalt.common.tls import TlsConfig
from basalt.common.tracing import consume_attributes, message_links
from basalt.v1 import common_pb2 as pb
from basalt.v1 import store_node_pb2 as sn

log = logging.getLogger(__name__)

#: The API's proxy: it binds to whatever TracerProvider the process installs.
_tracer = trace.get_tracer("basalt.client")


class ConsumeStatus(enum.Enum):
    """What a listener answers (RocketMQ's ConsumeConcurrentlyStatus)."""

    CONSUME_SUCCESS = "success"
    #: Run the batch again later (orderly: SUSPEND_CURRENT_QUEUE_A_MOMENT).
    RECONSUME_LATER = "later"


Listener = Callable[[list[MessageRecord], MessageQueue], ConsumeStatus | Awaitable[ConsumeStatus]]


@config_dataclass
class PushConsumerConfig(ConsumerConfig):
    """RocketMQ's DefaultMQPushConsumer settings, by its names in snake_case
    (with :class:`ConsumerConfig`'s, which validates them all)."""

    consume_thread_nums: int = setting(
        default=20, check=positive, doc="Listener calls at once (RocketMQ's consumeThreadMax)."
    )
    consume_message_batch_max_size: int = setting(
        default=1, check=positive, doc="Most messages per listener call."
    )
    pull_threshold_for_queue: int = setting(
        default=1000,
        check=positive,
        doc="Most pulled-but-unconsumed messages per queue before its pulls wait.",
    )
    broker_suspend_max_time_ms: int = setting(
        default=15_000,
        check=non_negative,
        doc="Long-poll hold asked of the store-node (RocketMQ's brokerSuspendMaxTimeMillis).",
    )
    persist_consumer_offset_interval_ms: int = setting(
        default=5_000, check=positive, doc="How often consumed offsets are committed."
    )
    suspend_current_queue_time_ms: int = setting(
        default=1_000,
        check=non_negative,
        doc="The pause before a failed listener call runs again here: orderly, or "
        "when its send-back failed.",
    )
    drop_await_termination_ms: int = setting(
        default=10_000,
        check=non_negative,
        doc="How long a dropped queue waits for its running listener calls.",
    )
    orderly: bool = setting(
        default=False,
        check=boolean,
        doc="One batch of a queue at a time, in offset order (MessageListenerOrderly).",
    )
    max_reconsume_times: int = setting(
        default=DEFAULT_MAX_RECONSUME_TIMES,
        check=check(
            "an integer >= -1",
            lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= -1,
        ),
        doc="Retries of a failed message before it goes to %DLQ%<group> (RocketMQ's "
        "maxReconsumeTimes); -1: RocketMQ's default, 16 (orderly: no bound, retried "
        "in place for ever); 0: dead-lettered at its first failure.",
    )

    def reconsume_limit(self) -> int | None:
        """How many reconsumes a message gets before it is dead-lettered; None
        for no bound (orderly with -1, as RocketMQ's Integer.MAX_VALUE)."""
        if self.max_reconsume_times >= 0:
            return self.max_reconsume_times
        return None if self.orderly else DEFAULT_MAX_RECONSUME_TIMES


class PushConsumer(ConsumerClient):
    """A member of a consumer group; see the module docstring. Subscribe, then
    ``async with`` it (or :meth:`start` / :meth:`close`, which commits and
    releases the queues)."""

    def __init__(
        self,
        endpoints: str,
        *,
        config: PushConsumerConfig,
        listener: Listener,
        tls: TlsConfig | None = None,
        credentials: Credentials | None = None,
    ) -> None:
        super().__init__(
            endpoints,
            tls=tls,
            consumer_group=config.consumer_group,
            consume_from_where=config.consume_from_where,
            credentials=credentials,
        )
        self.config = config
        self.client_id = config.client_id
        self._listener = listener
        self._async_listener = inspect.iscoroutinefunction(listener)
        self._subscriptions: dict[str, TopicSubscription] = {}
        self._retry_topic = retry_topic(config.consumer_group)
        self._queues: dict[MessageQueue, ProcessQueue] = {}
        self._member = GroupMember(self, self, config, self._subscriptions)
        self._calls = asyncio.Semaphore(config.consume_thread_nums)
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        #: Every listener call (a task, or a thread's future) until it ends; the
        #: ones still running when close has given every queue up are cancelled.
        self._listener_calls = TaskOwner()
        #: The pull loops' fetches, on one GetMessagesStream per store-node.
        self._fetch_tasks = TaskOwner()
        self._fetches = AwaitedFetches(self._channel, self._fetch_tasks, PULL_DEADLINE_MARGIN_S)

    # -- set-up -----------------------------------------------------------------------

    def subscribe(self, topic: str, expression: str = "*", *, sql92: bool = False) -> None:
        """Consume ``topic`` filtered by a TAG expression (``*``, ``a || b``) or,
        with ``sql92``, an SQL92 filter. Before :meth:`start`."""
        if self._member.started:
            raise RuntimeError("subscribe before start")
        self._subscriptions[topic] = TopicSubscription(topic, expression, sql92)

    async def start(self) -> None:
        if not self._subscriptions:
            raise RuntimeError("subscribe to a topic before start")
        # The group's own retry topic, by every member (RocketMQ's copySubscription).
        if len(self._retry_topic) <= MAX_TOPIC_LENGTH:
            self._subscriptions.setdefault(
                self._retry_topic, TopicSubscription(self._retry_topic, "*", False)
            )
        else:
            log.warning(
                "%s: group %r is too long for a retry topic (%d characters at most): "
                "a failed message cannot be given back and is retried here only",
                self.client_id,
                self.consumer_group,
                MAX_TOPIC_LENGTH - len(RETRY_GROUP_TOPIC_PREFIX),
            )
        await super().start()
        if not self._async_listener:
            self._pool = concurrent.futures.ThreadPoolExecutor(
                self.config.consume_thread_nums, thread_name_prefix="basalt-consume"
            )
        self._member.start()
        self._member.background(self._persister())

    async def close(self) -> None:
        """Stop pulling, wait for the running listener calls, commit, release the
        queues, then end the session."""
        try:
            await self._member.close()
        finally:
            try:
                await self._listener_calls.close()
            finally:
                self._fetches.close()
                await self._fetch_tasks.close()
                if self._pool is not None:
                    self._pool.shutdown(wait=False, cancel_futures=True)
                await super().close()

    def assignment(self) -> list[MessageQueue]:
        """The queues this consumer owns now."""
        return sorted(self._queues)

    async def rebalance(self) -> None:
        """Rebalance now (it also happens by itself; see the module docstring)."""
        await self._member.rebalance()

    # -- QueueOwner: what the membership gives and takes ------------------------------

    def owned(self) -> set[MessageQueue]:
        return set(self._queues)

    async def take(self, queues: dict[MessageQueue, Position]) -> None:
        for q, p in queues.items():
            self._own(ProcessQueue(q, p.offset, p.reset_epoch, p.committed))

    async def give_up(self, queues: Sequence[MessageQueue], *, commit: bool) -> None:
        dropped = [self._queues.pop(q) for q in queues if q in self._queues]
        await gather_all(*(self._drop(pq, commit=commit) for pq in dropped))

    async def reset(self, table: dict[MessageQueue, pb.QueueOffset]) -> int:
        """Seed 004's resetOffset, client side, without its 10 s sleep: the
        affected queues stop, their running calls end, and they start again
        from the new offsets before this returns (and the command is acked)."""
        affected = [q for q in self._queues if q in table]
        await self.give_up(affected, commit=False)
        for q in affected:
            new = table[q]
            self._own(ProcessQueue(q, new.offset, new.reset_epoch, new.offset))
        return len(affected)

    # -- process queues ---------------------------------------------------------------

    def _own(self, pq: ProcessQueue) -> None:
        """Start processing ``pq`` (its queue's lock is held)."""
        self._queues[pq.queue] = pq
        self._spawn(pq, self._pull_loop(pq))
        if self.config.orderly:
            self._spawn(pq, self._consume_orderly(pq))

    def _spawn(self, pq: ProcessQueue, work: Coroutine[Any, Any, None]) -> None:
        pq.tasks.spawn(work, untraced=True)

    async def _drop(self, pq: ProcessQueue, *, commit: bool) -> None:
        """Stop ``pq``'s pulls, wait (bounded) for its running listener calls, and
        with ``commit`` store its offset. The caller removes it from the table."""
        pq.dropped = True
        # Its pulls and consume tasks end now (a listener call they await runs
        # on: it is in pq.calls, and shielded).
        await pq.tasks.close()
        if pq.calls:
            _, running = await asyncio.wait(
                list(pq.calls), timeout=self.config.drop_await_termination_ms / 1000
            )
            if running:
                log.warning(
                    "%s: %d listener call(s) of %s still running after %d ms; dropped anyway",
                    self.client_id,
                    len(running),
                    pq.queue,
                    self.config.drop_await_termination_ms,
                )
        if commit:
            await self._commit(pq, final=True)

    async def _commit(self, pq: ProcessQueue, *, final: bool = False) -> None:
        """Store ``pq``'s commit offset, one commit of a queue at a time and each
        awaited, so that commits reach the store-node in the order they were made
        (an older offset landing after a newer one would make the queue's next
        owner consume again what this one did). After a drop only the ``final``
        commit (the drop's own) goes."""
        async with pq.commit_lock:
            if pq.dropped and not final:
                return
            offset = pq.commit_offset()
            if offset == pq.committed:
                return
            try:
                stored = await self._store_offset(pq.queue, offset, pq.reset_epoch)
            except grpc.aio.AioRpcError as e:
                log.warning("%s: commit of %s failed: %s", self.client_id, pq.queue, e.details())
                return
            if stored:
                pq.committed = offset
            elif not pq.dropped:
                self._adopt_reset(pq)

    def _adopt_reset(self, pq: ProcessQueue) -> None:
        """A commit was refused STALE_RESET_EPOCH: a reset happened that this
        consumer missed (its command comes, or came while the session was
        away). Process the queue again from the offset the reset stored."""
        pq.dropped = True

        async def again() -> None:
            async with self._member.lock:
                if self._queues.get(pq.queue) is not pq:
                    return  # dropped or replaced meanwhile
                await self.give_up([pq.queue], commit=False)
                await self.take({pq.queue: await self._start_position(pq.queue)})

        self._member.background(again())

    async def _persister(self) -> None:
        while True:
            await asyncio.sleep(self.config.persist_consumer_offset_interval_ms / 1000)
            outcomes = await asyncio.gather(
                *(self._commit(pq) for pq in list(self._queues.values())),
                return_exceptions=True,
            )
            for outcome in outcomes:
                if isinstance(outcome, Exception):  # one queue's failure stops no other
                    log.warning("%s: commit failed: %r", self.client_id, outcome)

    async def _pull_loop(self, pq: ProcessQueue) -> None:
        """Pull ``pq``'s queue from its store-node until it is dropped: long
        polls (``GetMessages`` of the one queue, on the consumer's
        GetMessagesStream to that store-node), waiting for room when the
        backlog is full. No commit rides along
        (RocketMQ's does): a pull cancelled by a drop may still reach the
        store-node after the drop's own commit and store an older offset over
        it."""
        sub = self._subscriptions[pq.queue.topic]
        subscription = subscription_of(sub.expression, sub.sql92)
        suspend_ms = self.config.broker_suspend_max_time_ms
        broker = pq.queue.broker_name
        delay = self._member.backoff()
        while not pq.dropped:
            await pq.room.wait()
            read = self._read_request(
                pq.queue, pq.next_offset, self.config.pull_batch_size, subscription
            )
            request = sn.GetMessagesRequest(reads=[read], suspend_timeout_ms=suspend_ms)
            try:
                answer = await self._fetches.fetch(self._store_node_address(broker), request)
                (reply,) = answer.results
            except ClientError as e:
                log.warning("%s: pull of %s failed: %s", self.client_id, pq.queue, e)
                await asyncio.sleep(next(delay))
                await self.reroute(pq.queue.topic)  # a failed-over group's new master
                continue
            if reply.HasField("refused"):
                # What the pull-service's Pull refused as a gRPC error: the same
                # pause, until the group's next rebalance drops the queue.
                log.warning(
                    "%s: pull of %s refused: %s", self.client_id, pq.queue, reply.refused.message
                )
                await asyncio.sleep(next(delay))
                continue
            delay = self._member.backoff()
            pq.next_offset = reply.next_begin_offset
            if reply.status == pb.PULL_STATUS_FOUND:
                records = self._decode(
                    pq.queue, reply.records.data, check_crcs=self.config.check_crcs
                )
                pq.add(records, self.config.pull_threshold_for_queue)
                if not self.config.orderly:
                    self._dispatch(pq, records)

    # -- listener calls ---------------------------------------------------------------

    def _dispatch(self, pq: ProcessQueue, records: list[MessageRecord]) -> None:
        """Concurrently: every batch of ``records`` becomes its own listener call."""
        size = self.config.consume_message_batch_max_size
        for i in range(0, len(records), size):
            self._spawn(pq, self._consume_batch(pq, records[i : i + size]))

    async def _consume_batch(self, pq: ProcessQueue, batch: list[MessageRecord]) -> None:
        """Concurrently: one listener call of ``batch``; what fails is given back,
        and what cannot be given back now is called again later (module docstring)."""
        failures = 0
        while not pq.dropped:
            shown = [self._shown(r, failures) for r in batch]
            if await self._call_listener(pq, shown) is ConsumeStatus.CONSUME_SUCCESS:
                return  # marked consumed when the call ended (_run_listener)
            if pq.gone():
                return  # pending still: its next owner reads it again
            batch = await self._give_back(pq, batch)
            if not batch:
                return
            failures += 1
            await asyncio.sleep(self.config.suspend_current_queue_time_ms / 1000)

    async def _give_back(self, pq: ProcessQueue, batch: list[MessageRecord]) -> list[MessageRecord]:
        """Send each of ``batch`` back (a max of 0: to the dead-letter topic at
        once); those stored are consumed here, the others returned, still pending."""
        limit = self.config.reconsume_limit()
        assert limit is not None  # concurrently, -1 is RocketMQ's 16
        delay_level = -1 if limit == 0 else 0
        stored = await asyncio.gather(
            *(self._give_one_back(pq, r, delay_level, limit) for r in batch)
        )
        pq.consumed(
            [r for r, ok in zip(batch, stored, strict=True) if ok],
            self.config.pull_threshold_for_queue,
        )
        return [r for r, ok in zip(batch, stored, strict=True) if not ok]

    async def _give_one_back(
        self, pq: ProcessQueue, record: MessageRecord, delay_level: int, limit: int
    ) -> bool:
        """Whether ``record`` was stored back (its retry copy, or its dead letter)."""
        try:
            await self._send_back(
                pq.queue, record, delay_level=delay_level, max_reconsume_times=limit
            )
        except grpc.aio.AioRpcError as e:
            log.warning(
                "%s: send-back of %s@%d failed, retried here later: %s",
                self.client_id,
                pq.queue,
                record.queue_offset,
                e.details(),
            )
            await self.reroute(pq.queue.topic)  # a failed-over group's new master
            return False
        return True

    async def _consume_orderly(self, pq: ProcessQueue) -> None:
        """Orderly: the lowest pending batch, one call at a time, again until it
        succeeds or its messages are dead-lettered (module docstring)."""
        size = self.config.consume_message_batch_max_size
        while not pq.dropped:
            await pq.ready.wait()
            batch = list(itertools.islice(pq.pending.values(), size))
            if not batch:
                pq.ready.clear()
                continue
            shown = [self._shown(r, pq.failures.get(r.queue_offset, 0)) for r in batch]
            if await self._call_listener(pq, shown) is ConsumeStatus.CONSUME_SUCCESS:
                for r in batch:
                    pq.failures.pop(r.queue_offset, None)
                continue
            if pq.gone():
                return
            if await self._orderly_failed(pq, batch):
                await asyncio.sleep(self.config.suspend_current_queue_time_ms / 1000)

    async def _orderly_failed(self, pq: ProcessQueue, batch: list[MessageRecord]) -> bool:
        """Count a failed orderly call of ``batch``: each message reconsumed
        ``max_reconsume_times`` times goes to the dead-letter topic (RocketMQ's
        checkReconsumeTimes); whether any of ``batch`` is left to run again."""
        limit = self.config.reconsume_limit()
        left = False
        for r in batch:
            times = r.reconsume_times + pq.failures.get(r.queue_offset, 0)
            # Its last try: straight to the dead-letter topic (a negative level).
            if limit is not None and times >= limit and await self._give_one_back(pq, r, -1, limit):
                pq.failures.pop(r.queue_offset, None)
                pq.consumed([r], self.config.pull_threshold_for_queue)
                continue
            pq.failures[r.queue_offset] = pq.failures.get(r.queue_offset, 0) + 1
            left = True
        return left

    def _shown(self, record: MessageRecord, failures: int) -> MessageRecord:
        """``record`` as the listener sees it (RocketMQ's resetRetryAndNamespace):
        read from the group's retry topic, with its original topic; its reconsume
        times counting the failed calls made here too."""
        topic = record.topic
        if topic == self._retry_topic:
            topic = record.properties.get(PROPERTY_RETRY_TOPIC, topic)
        if topic == record.topic and not failures:
            return record
        return dataclasses.replace(
            record, topic=topic, reconsume_times=record.reconsume_times + failures
        )

    async def _call_listener(self, pq: ProcessQueue, batch: list[MessageRecord]) -> ConsumeStatus:
        """:meth:`_run_listener` in a CONSUMER span, "process <topic>", one per
        listener call (not per message), linked to the send span of each message
        that carries one (its ``traceparent`` property). The listener runs in
        the span's context, so its own spans are the span's children."""
        with _tracer.start_as_current_span(
            f"process {pq.queue.topic}",
            kind=trace.SpanKind.CONSUMER,
            links=message_links(r.properties for r in batch),
        ) as span:
            if span.is_recording():
                span.set_attributes(
                    consume_attributes(
                        "process",
                        topic=pq.queue.topic,
                        group=self.consumer_group,
                        client_id=self.client_id,
                        message_count=len(batch),
                        queue_id=pq.queue.queue_id,
                    )
                )
            status = await self._run_listener(pq, batch)
            if status is not ConsumeStatus.CONSUME_SUCCESS:
                span.set_status(trace.StatusCode.ERROR, "RECONSUME_LATER")
            return status

    async def _run_listener(self, pq: ProcessQueue, batch: list[MessageRecord]) -> ConsumeStatus:
        """Run the listener on ``batch``; an exception counts as RECONSUME_LATER.

        The call is tracked in ``pq.calls`` until it really ends (a thread runs
        on after its awaiting task is cancelled), so a drop can wait for it, and
        its success marks the batch consumed when the call ends, not when this
        coroutine resumes: a drop cancels the coroutine, and the commit that
        follows must still count a batch whose call succeeded."""
        async with self._calls:
            if pq.dropped:
                return ConsumeStatus.RECONSUME_LATER
            loop = asyncio.get_running_loop()
            call: asyncio.Future[object]
            if self._async_listener:
                awaitable = cast(Awaitable[ConsumeStatus], self._listener(batch, pq.queue))
                call = self._listener_calls.adopt(asyncio.ensure_future(awaitable))
            else:
                # In this task's context (the process span's), which an
                # executor's thread does not inherit by itself.
                run = contextvars.copy_context().run
                call = self._listener_calls.adopt(
                    loop.run_in_executor(self._pool, run, self._listener, batch, pq.queue)
                )
            threshold = self.config.pull_threshold_for_queue

            def ended(call: asyncio.Future[object]) -> None:
                pq.calls.discard(call)
                succeeded = not call.cancelled() and call.exception() is None
                if succeeded and call.result() is ConsumeStatus.CONSUME_SUCCESS:
                    pq.consumed(batch, threshold)

            pq.calls.add(call)
            call.add_done_callback(ended)  # before shield's: it runs first
            try:
                status = await asyncio.shield(call)
            except Exception as e:
                trace.get_current_span().record_exception(e)
                log.exception("%s: listener failed on %s", self.client_id, pq.queue)
                return ConsumeStatus.RECONSUME_LATER
        return status if isinstance(status, ConsumeStatus) else ConsumeStatus.RECONSUME_LATER


__all__ = ["ConsumeStatus", "Listener", "ProcessQueue", "PushConsumer", "PushConsumerConfig"]
