"""PushConsumer: a consumer group member that rebalances and calls a listener.

RocketMQ's DefaultMQPushConsumer in clustering mode, on Basalt's services:

* **Session.** One ``PullService.Session`` stream, opened on :meth:`start`:
  heartbeats at the interval the service asks, commands answered by acks.
  If the stream breaks, every queue is dropped at once (its locks went with
  the session's lease) and the session is opened again with a backoff.
* **Rebalance.** Per subscribed topic, AllocateMessageQueueAveragely over the
  group's live client ids (``ListConsumers``, sorted) and the topic's read
  queues (``QueryRoute``, sorted): on start, when the service pushes a
  RebalanceCommand (a member joined or left, the topic's queues changed), and
  every ``rebalance_interval_ms``. A queue is processed only under its lock
  (``LockQueues``, bound to the session): queues this consumer no longer gets
  are dropped, their offsets committed, and then unlocked, so the next owner
  starts where this one stopped; queues still locked by their previous owner
  are retried every ``lock_retry_interval_ms`` until it lets go. So no queue is
  processed by two consumers of the group at once, short of a listener
  running past ``drop_await_termination_ms`` after its queue was dropped.
* **ProcessQueue.** One per owned queue: a long-poll pull loop (``Pull``, the
  commit offset riding along), the pulled messages not yet consumed (at most
  ``pull_threshold_for_queue``: the loop waits for room, no sleep), and the
  listener calls in flight.
* **Listener.** ``listener(messages, queue) -> ConsumeStatus``, a plain
  function run on a pool of ``consume_thread_nums`` threads, or a coroutine
  function run on the loop (at most ``consume_thread_nums`` at once).
  Concurrently (default): batches of up to ``consume_message_batch_max_size``
  run in parallel, in any order. Orderly (``orderly=True``): one batch of a
  queue at a time, in offset order. RECONSUME_LATER (or an exception) runs
  the batch again after ``suspend_current_queue_time_ms``: Basalt has no retry
  topic, so the retry is local and holds the queue's commit back meanwhile.
* **Commit.** The lowest offset not yet consumed (or, with none pending, the
  next to pull): with every pull, every ``persist_consumer_offset_interval_ms``
  and when a queue is dropped or the consumer closes.
* **RESET_OFFSET.** The affected ProcessQueues are dropped (their pulls
  cancelled), the listener calls already running are awaited (at most
  ``drop_await_termination_ms``), the new offsets and reset epochs adopted,
  pulls resume from them, and then the command is acked. No fixed sleep.

Concurrency: everything but the threaded listener runs on one event loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import enum
import inspect
import itertools
import logging
import os
import socket
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import grpc

from basalt.v1 import common_pb2 as pb
from basalt.v1 import pull_service_pb2 as ps
from client.consumer_base import (
    ConsumeFromWhere,
    ConsumerClient,
    MessageQueue,
    subscription_of,
)
from client.producer import ClientError
from client.rebalance import allocate_averagely
from store.message import MessageRecord
from store.record import decode_records

log = logging.getLogger(__name__)

CLIENT_VERSION = "basalt-py 0.1.0"


class ConsumeStatus(enum.Enum):
    """What a listener answers (RocketMQ's ConsumeConcurrentlyStatus)."""

    CONSUME_SUCCESS = "success"
    #: Run the batch again later (orderly: SUSPEND_CURRENT_QUEUE_A_MOMENT).
    RECONSUME_LATER = "later"


Listener = Callable[[list[MessageRecord], MessageQueue], ConsumeStatus | Awaitable[ConsumeStatus]]


def default_client_id() -> str:
    """RocketMQ's ``ip@pid`` (host name here), made unique per consumer object."""
    return f"{socket.gethostname()}@{os.getpid()}@{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True, slots=True, kw_only=True)
class PushConsumerConfig:
    """RocketMQ's DefaultMQPushConsumer settings, by its names in snake_case."""

    consumer_group: str
    client_id: str = field(default_factory=default_client_id)
    consume_from_where: ConsumeFromWhere = ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET
    #: Listener calls at once (RocketMQ's consumeThreadMax).
    consume_thread_nums: int = 20
    #: Most messages per listener call.
    consume_message_batch_max_size: int = 1
    #: Most records per pull.
    pull_batch_size: int = 32
    #: Most pulled-but-unconsumed messages per queue before its pulls wait.
    pull_threshold_for_queue: int = 1000
    #: Long-poll hold asked of the store-node (RocketMQ's brokerSuspendMaxTimeMillis).
    broker_suspend_max_time_ms: int = 15_000
    #: The periodic rebalance (RocketMQ's 20 s).
    rebalance_interval_ms: int = 20_000
    #: How soon a queue still locked by its previous owner is tried again.
    lock_retry_interval_ms: int = 200
    persist_consumer_offset_interval_ms: int = 5_000
    #: The pause before a batch answered RECONSUME_LATER runs again.
    suspend_current_queue_time_ms: int = 1_000
    #: How long a dropped queue waits for its running listener calls.
    drop_await_termination_ms: int = 10_000
    #: The pause after a failed pull or session, doubling up to 30x this.
    pull_time_delay_ms_when_exception: int = 100
    #: One batch of a queue at a time, in offset order (MessageListenerOrderly).
    orderly: bool = False

    def __post_init__(self) -> None:
        if not self.consumer_group:
            raise ValueError("consumer_group must not be empty")
        if not self.client_id:
            raise ValueError("client_id must not be empty")
        for name in (
            "consume_thread_nums",
            "consume_message_batch_max_size",
            "pull_threshold_for_queue",
            "rebalance_interval_ms",
            "lock_retry_interval_ms",
            "persist_consumer_offset_interval_ms",
            "pull_time_delay_ms_when_exception",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if not 1 <= self.pull_batch_size <= 1024:
            raise ValueError(f"pull_batch_size {self.pull_batch_size} is not within 1..1024")
        for name in (
            "broker_suspend_max_time_ms",
            "suspend_current_queue_time_ms",
            "drop_await_termination_ms",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")


@dataclass(frozen=True, slots=True)
class TopicSubscription:
    topic: str
    expression: str
    sql92: bool

    def to_proto(self) -> pb.TopicSubscription:
        return pb.TopicSubscription(
            topic=self.topic, subscription=subscription_of(self.expression, self.sql92)
        )


class ProcessQueue:
    """One owned queue: where its pulls are, what was pulled and not yet consumed
    (by offset, in offset order), the listener calls in flight, and the tasks
    working on it. Dropped once; a queue owned again gets a new one."""

    def __init__(self, queue: MessageQueue, offset: int, reset_epoch: int, committed: int) -> None:
        self.queue = queue
        #: Where the next pull starts.
        self.next_offset = offset
        self.reset_epoch = reset_epoch
        #: The offset last stored for the group (-1: none).
        self.committed = committed
        #: Pulled, not yet consumed; insertion order is offset order.
        self.pending: dict[int, MessageRecord] = {}
        self.dropped = False
        #: Set while there is room below the pull threshold.
        self.room = asyncio.Event()
        self.room.set()
        #: Set while there are messages no listener call has taken (orderly).
        self.ready = asyncio.Event()
        #: Orderly: the offsets a listener call or a retry holds.
        self.taken = 0
        self.calls: set[asyncio.Future[object]] = set()
        self.tasks: set[asyncio.Task[None]] = set()

    def commit_offset(self) -> int:
        """The lowest offset not yet consumed; with none pending, the next to pull."""
        return next(iter(self.pending), self.next_offset)

    def add(self, records: list[MessageRecord], threshold: int) -> None:
        for record in records:
            self.pending[record.queue_offset] = record
        if len(self.pending) >= threshold:
            self.room.clear()
        self.ready.set()

    def consumed(self, records: list[MessageRecord], threshold: int) -> None:
        for record in records:
            self.pending.pop(record.queue_offset, None)
        if len(self.pending) < threshold:
            self.room.set()


class PushConsumer(ConsumerClient):
    """A member of a consumer group; see the module docstring. Subscribe, then
    ``async with`` it (or :meth:`start` / :meth:`close`, which commits and
    releases the queues)."""

    def __init__(self, endpoints: str, *, config: PushConsumerConfig, listener: Listener) -> None:
        super().__init__(
            endpoints,
            consumer_group=config.consumer_group,
            consume_from_where=config.consume_from_where,
        )
        self.config = config
        self.client_id = config.client_id
        self._listener = listener
        self._async_listener = inspect.iscoroutinefunction(listener)
        self._subscriptions: dict[str, TopicSubscription] = {}
        self._queues: dict[MessageQueue, ProcessQueue] = {}
        #: Serializes rebalances, resets and the session's drop-everything.
        self._lock = asyncio.Lock()
        self._rebalance_now = asyncio.Event()
        #: Some queue this consumer should own is still locked by another.
        self._locks_pending = False
        self._session_up = asyncio.Event()
        self._closing = False
        self._session_task: asyncio.Task[None] | None = None
        #: The rebalancer, the offset persister, and commands being carried out.
        self._tasks: set[asyncio.Task[None]] = set()
        self._calls = asyncio.Semaphore(config.consume_thread_nums)
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._call: grpc.aio.StreamStreamCall[ps.SessionRequest, ps.SessionResponse] | None = None
        self._write_lock = asyncio.Lock()

    # -- set-up -----------------------------------------------------------------------

    def subscribe(self, topic: str, expression: str = "*", *, sql92: bool = False) -> None:
        """Consume ``topic`` filtered by a TAG expression (``*``, ``a || b``) or,
        with ``sql92``, an SQL92 filter. Before :meth:`start`."""
        if self._session_task is not None:
            raise RuntimeError("subscribe before start")
        self._subscriptions[topic] = TopicSubscription(topic, expression, sql92)

    async def start(self) -> None:
        if not self._subscriptions:
            raise RuntimeError("subscribe to a topic before start")
        await super().start()
        if not self._async_listener:
            self._pool = concurrent.futures.ThreadPoolExecutor(
                self.config.consume_thread_nums, thread_name_prefix="basalt-consume"
            )
        self._session_task = asyncio.get_running_loop().create_task(
            self._keep_session(), name="basalt-session"
        )
        self._background(self._rebalancer())
        self._background(self._persister())

    def _background(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        """Stop pulling, wait for the running listener calls, commit, release the
        queues, then end the session (so the locks are released before the
        group sees this consumer leave and rebalances)."""
        self._closing = True
        self._rebalance_now.set()
        try:
            async with self._lock:
                for task in list(self._tasks):
                    task.cancel()
                queues = list(self._queues.values())
                self._queues.clear()
                await asyncio.gather(*(self._drop(pq, commit=True) for pq in queues))
                if queues and self._session_up.is_set():
                    with contextlib.suppress(grpc.aio.AioRpcError):
                        await self._unlock([pq.queue for pq in queues])
            if self._call is not None:
                with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
                    await self._write_done()
            if self._session_task is not None:
                with contextlib.suppress(TimeoutError):
                    # The service ends the stream once we half-close it.
                    await asyncio.wait_for(asyncio.shield(self._session_task), 5)
                self._session_task.cancel()
                await asyncio.gather(self._session_task, return_exceptions=True)
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=False, cancel_futures=True)
            await super().close()

    def assignment(self) -> list[MessageQueue]:
        """The queues this consumer owns now."""
        return sorted(self._queues)

    # -- the session ------------------------------------------------------------------

    async def _keep_session(self) -> None:
        """Hold a Session open, opening it again whenever it ends."""
        delay = self._backoff()
        while not self._closing:
            try:
                if await self._run_session():
                    delay = self._backoff()
            except grpc.aio.AioRpcError as e:
                if not self._closing:
                    log.warning("%s: session ended: %s %s", self.client_id, e.code(), e.details())
            except Exception:  # a bug must not end the consumer's session for good
                log.exception("%s: session failed", self.client_id)
            finally:
                await self._session_lost()
            if not self._closing:
                await asyncio.sleep(next(delay))

    def _backoff(self) -> Iterator[float]:
        base = self.config.pull_time_delay_ms_when_exception / 1000
        n = 0
        while True:
            yield min(base * 2**n, 30 * base)
            n += 1

    async def _run_session(self) -> bool:
        """One session, to its end; False if it never opened."""
        call = self._call = self._pull_service().Session()
        await call.write(
            ps.SessionRequest(
                open=ps.OpenSession(
                    group=self.consumer_group,
                    client_id=self.client_id,
                    subscriptions=[s.to_proto() for s in self._subscriptions.values()],
                    client_version=CLIENT_VERSION,
                )
            )
        )
        first = await call.read()
        if not isinstance(first, ps.SessionResponse) or first.WhichOneof("frame") != "opened":
            return False
        interval_s = first.opened.heartbeat_interval_ms / 1000
        self._session_up.set()
        self._rebalance_now.set()
        beats = asyncio.get_running_loop().create_task(self._heartbeats(interval_s))
        try:
            while True:
                frame = await call.read()
                if not isinstance(frame, ps.SessionResponse):
                    return True  # EOF: the service ended the stream
                if frame.WhichOneof("frame") == "command":
                    self._background(self._on_command(frame.command))
        finally:
            beats.cancel()

    async def _heartbeats(self, interval_s: float) -> None:
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
            while True:
                await asyncio.sleep(interval_s)
                await self._write(ps.SessionRequest(heartbeat=ps.Heartbeat()))

    async def _write_done(self) -> None:
        async with self._write_lock:
            if self._call is not None:
                await self._call.done_writing()

    async def _write(self, frame: ps.SessionRequest) -> None:
        # grpc.aio allows one write at a time on a stream.
        async with self._write_lock:
            if self._call is not None:
                await self._call.write(frame)

    async def _session_lost(self) -> None:
        """The session ended, and with it the locks: stop processing every queue
        now, without committing (another consumer may own them already)."""
        self._session_up.clear()
        async with self._lock:
            queues = list(self._queues.values())
            self._queues.clear()
            await asyncio.gather(*(self._drop(pq, commit=False) for pq in queues))

    async def _on_command(self, command: ps.Command) -> None:
        kind = command.WhichOneof("body")
        ok, detail = True, ""
        try:
            if kind == "reset_offset":
                detail = await self._reset(command.reset_offset)
            elif kind == "rebalance":
                self._rebalance_now.set()
                detail = "rebalance scheduled"
            else:
                ok, detail = False, f"unknown command {kind!r}; this client is {CLIENT_VERSION}"
        except (grpc.aio.AioRpcError, OSError) as e:
            ok, detail = False, f"{type(e).__name__}: {e}"
        ack = ps.CommandAck(command_id=command.command_id, ok=ok, detail=detail)
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
            await self._write(ps.SessionRequest(ack=ack))

    # -- reset ------------------------------------------------------------------------

    async def _reset(self, command: ps.ResetOffsetCommand) -> str:
        """Seed 004's resetOffset, client side, without its 10 s sleep."""
        table = {MessageQueue.of(o.queue): o for o in command.offsets}
        async with self._lock:
            affected = [pq for q, pq in self._queues.items() if q in table]
            await asyncio.gather(*(self._drop(pq, commit=False) for pq in affected))
            for pq in affected:
                new = table[pq.queue]
                self._own(ProcessQueue(pq.queue, new.offset, new.reset_epoch, new.offset))
        return f"{len(affected)} queue(s) of {command.topic} resumed from the reset offsets"

    # -- rebalance --------------------------------------------------------------------

    async def _rebalancer(self) -> None:
        """Rebalance when asked, when locks are pending, and on the interval."""
        while not self._closing:
            wait_ms = (
                self.config.lock_retry_interval_ms
                if self._locks_pending
                else self.config.rebalance_interval_ms
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._rebalance_now.wait(), wait_ms / 1000)
            self._rebalance_now.clear()
            if self._closing or not self._session_up.is_set():
                continue
            try:
                await self.rebalance()
            except (grpc.aio.AioRpcError, ClientError, OSError) as e:
                log.warning("%s: rebalance failed: %s", self.client_id, e)
                self._locks_pending = True  # try again soon

    async def rebalance(self) -> None:
        """One rebalance of every subscribed topic (see the module docstring)."""
        async with self._lock:
            pending = False
            members = await self._pull_service().ListConsumers(
                ps.ListConsumersRequest(group=self.consumer_group), timeout=10
            )
            client_ids = sorted(c.client_id for c in members.consumers)
            for topic in self._subscriptions:
                pending |= await self._rebalance_topic(topic, client_ids)
            self._locks_pending = pending

    async def _rebalance_topic(self, topic: str, client_ids: list[str]) -> bool:
        """Rebalance ``topic``; True when some queue of ours is still locked elsewhere."""
        if self.client_id not in client_ids:
            return True  # our registration is not visible yet: again soon
        queues = await self.queues_of(topic)
        mine = set(allocate_averagely(queues, client_ids, self.client_id))
        owned = {q for q in self._queues if q.topic == topic}
        leaving = [self._queues.pop(q) for q in sorted(owned - mine)]
        if leaving:
            await asyncio.gather(*(self._drop(pq, commit=True) for pq in leaving))
            await self._unlock([pq.queue for pq in leaving])
        if not mine:
            return False
        held = await self._lock_queues(sorted(mine))
        for q in sorted(owned & mine - held):  # our lock went (etcd lost the lease)
            await self._drop(self._queues.pop(q), commit=False)
        new = sorted(held - owned)
        positions = await asyncio.gather(*(self._start_position(q) for q in new))
        for q, p in zip(new, positions, strict=True):
            self._own(ProcessQueue(q, p.offset, p.reset_epoch, p.committed))
        if leaving or new:
            log.info(
                "%s: %s rebalanced: %d queue(s) owned, +%d -%d",
                self.client_id,
                topic,
                len(held),
                len(new),
                len(leaving),
            )
        return held != mine

    async def _lock_queues(self, queues: Sequence[MessageQueue]) -> set[MessageQueue]:
        reply = await self._pull_service().LockQueues(
            ps.LockQueuesRequest(
                group=self.consumer_group,
                client_id=self.client_id,
                queues=[q.to_proto() for q in queues],
            ),
            timeout=10,
        )
        return {MessageQueue.of(q) for q in reply.locked}

    async def _unlock(self, queues: Sequence[MessageQueue]) -> None:
        await self._pull_service().UnlockQueues(
            ps.UnlockQueuesRequest(
                group=self.consumer_group,
                client_id=self.client_id,
                queues=[q.to_proto() for q in queues],
            ),
            timeout=10,
        )

    # -- process queues ---------------------------------------------------------------

    def _own(self, pq: ProcessQueue) -> None:
        """Start processing ``pq`` (its queue's lock is held)."""
        self._queues[pq.queue] = pq
        self._spawn(pq, self._pull_loop(pq))
        if self.config.orderly:
            self._spawn(pq, self._consume_orderly(pq))

    def _spawn(self, pq: ProcessQueue, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        pq.tasks.add(task)
        task.add_done_callback(pq.tasks.discard)

    async def _drop(self, pq: ProcessQueue, *, commit: bool) -> None:
        """Stop ``pq``'s pulls, wait (bounded) for its running listener calls, and
        with ``commit`` store its offset. The caller removes it from the table."""
        pq.dropped = True
        for task in list(pq.tasks):
            task.cancel()
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
            await self._commit(pq)

    async def _commit(self, pq: ProcessQueue) -> None:
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
            async with self._lock:
                if self._queues.get(pq.queue) is not pq:
                    return  # dropped or replaced meanwhile
                await self._drop(self._queues.pop(pq.queue), commit=False)
                p = await self._start_position(pq.queue)
                self._own(ProcessQueue(pq.queue, p.offset, p.reset_epoch, p.committed))

        self._background(again())

    async def _persister(self) -> None:
        while True:
            await asyncio.sleep(self.config.persist_consumer_offset_interval_ms / 1000)
            await asyncio.gather(*(self._commit(pq) for pq in list(self._queues.values())))

    async def _pull_loop(self, pq: ProcessQueue) -> None:
        """Pull ``pq``'s queue until it is dropped: long polls, the commit offset
        riding along, waiting for room when the backlog is full."""
        sub = self._subscriptions[pq.queue.topic]
        subscription = subscription_of(sub.expression, sub.sql92)
        suspend_ms = self.config.broker_suspend_max_time_ms
        delay = self._backoff()
        while not pq.dropped:
            await pq.room.wait()
            request = ps.PullRequest(
                group=self.consumer_group,
                queue=pq.queue.to_proto(),
                offset=pq.next_offset,
                max_nums=self.config.pull_batch_size,
                subscription=subscription,
                suspend_timeout_ms=suspend_ms,
                reset_epoch=pq.reset_epoch,
            )
            commit = pq.commit_offset()
            if commit != pq.committed:
                request.commit_offset = commit
            try:
                reply = await self._pull_service().Pull(request, timeout=suspend_ms / 1000 + 10)
            except grpc.aio.AioRpcError as e:
                log.warning("%s: pull of %s failed: %s", self.client_id, pq.queue, e.details())
                await asyncio.sleep(next(delay))
                continue
            delay = self._backoff()
            if reply.HasField("commit"):
                if reply.commit.code == pb.RESPONSE_CODE_STALE_RESET_EPOCH:
                    self._adopt_reset(pq)
                    return
                pq.committed = commit
            pq.next_offset = reply.next_begin_offset
            if reply.status == pb.PULL_STATUS_FOUND:
                records = decode_records(reply.records.data)
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
        while not pq.dropped:
            if await self._call_listener(pq, batch) is ConsumeStatus.CONSUME_SUCCESS:
                pq.consumed(batch, self.config.pull_threshold_for_queue)
                return
            await asyncio.sleep(self.config.suspend_current_queue_time_ms / 1000)

    async def _consume_orderly(self, pq: ProcessQueue) -> None:
        """Orderly: the lowest pending batch, one call at a time, again until it succeeds."""
        size = self.config.consume_message_batch_max_size
        while not pq.dropped:
            await pq.ready.wait()
            batch = list(itertools.islice(pq.pending.values(), size))
            if not batch:
                pq.ready.clear()
                continue
            if await self._call_listener(pq, batch) is ConsumeStatus.CONSUME_SUCCESS:
                pq.consumed(batch, self.config.pull_threshold_for_queue)
            else:
                await asyncio.sleep(self.config.suspend_current_queue_time_ms / 1000)

    async def _call_listener(self, pq: ProcessQueue, batch: list[MessageRecord]) -> ConsumeStatus:
        """Run the listener on ``batch``; an exception counts as RECONSUME_LATER.
        The call is tracked in ``pq.calls`` until it really ends (a thread runs
        on after its awaiting task is cancelled), so a drop can wait for it."""
        async with self._calls:
            if pq.dropped:
                return ConsumeStatus.RECONSUME_LATER
            loop = asyncio.get_running_loop()
            call: asyncio.Future[object]
            if self._async_listener:
                awaitable = cast(Awaitable[ConsumeStatus], self._listener(batch, pq.queue))
                call = asyncio.ensure_future(awaitable)
            else:
                call = loop.run_in_executor(self._pool, self._listener, batch, pq.queue)
            pq.calls.add(call)
            call.add_done_callback(pq.calls.discard)
            try:
                status = await asyncio.shield(call)
            except Exception:
                log.exception("%s: listener failed on %s", self.client_id, pq.queue)
                return ConsumeStatus.RECONSUME_LATER
        return status if isinstance(status, ConsumeStatus) else ConsumeStatus.RECONSUME_LATER


__all__ = ["ConsumeStatus", "Listener", "ProcessQueue", "PushConsumer", "PushConsumerConfig"]
