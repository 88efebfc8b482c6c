"""LitePullConsumer: the application polls; it names the queues, or the group shares them.

RocketMQ's DefaultLitePullConsumer, in one of two modes (not both):

* **assign** (:meth:`LitePullConsumer.assign`): no rebalance, the application
  owns the queues it assigned (batch jobs, the Spark pipeline);
* **subscribe** (:meth:`LitePullConsumer.subscribe` before :meth:`start`):
  the consumer is a member of its group like a PushConsumer
  (:class:`basalt.client.membership.GroupMember`: session, AllocateMessageQueueAveragely
  rebalance under queue locks, RESET_OFFSET); a queue given up to another
  member has its position committed first, so what :meth:`poll` returned
  counts as consumed (RocketMQ's auto-commit).

**Prefetch** (RocketMQ's consumeRequestCache). Records are fetched in the
background into a buffer per owned queue, and :meth:`poll` takes from the
buffers. Each queue has two offsets: the *fetch* offset (where its next read
starts) and its :class:`Position`'s ``offset``, the *consume* offset: just
past what :meth:`poll` returned, which is what :meth:`commit` stores. One
fetcher task per store-node keeps a ``StoreNode.GetMessages`` on that node
(long polling, ``broker_suspend_max_time_ms``; the store-node's address as
the route gives it, :mod:`basalt.client.consumer_base` says why not through
the pull-service) in flight for the owned queues of that node
whose buffer has room for another ``pull_batch_size`` records; a queue
holding ``pull_threshold_for_queue`` records (the bound: a fetch never asks
for more than the room left) is left out until :meth:`poll` drains it,
which wakes the fetcher (events, no polling loop). A reply is filed as it
came and the next GetMessages sent before :meth:`poll` runs: poll decodes the
records it returns (``basalt.common.record``, the one definition of the layout), so
decoding overlaps the next fetch and nothing dropped is ever decoded.

A queue's buffer and its fetches in flight belong to one *read* of it;
:meth:`seek`, :meth:`assign`, a reset, a take and a give-up start a new read
(or end it), so the old buffer is dropped and whatever a fetch of the old
read brings is discarded: after a reset or a give-up, :meth:`poll` never
returns a record fetched before it.

**Fetch errors** (the rule): a failed GetMessages (a gRPC error, naming the
store-node) is raised by the next :meth:`poll` as a :class:`ClientError`, in
both modes; an entry the store-node refused (what the pull-service's Pull
refuses, with its codes: an unknown or unreadable topic, a queue id past
``read_queue_nums``, a subscription that does not parse) is one too in
assign mode, while in subscribe mode it is logged and asks the group for a
rebalance (the queue left the topic's read queues, or its store-node went).
:meth:`poll` raises the first such error since the previous poll, once,
before returning any record (records buffered stay buffered for the next
poll; nothing is lost), and a poll that waits wakes up for it. A failed
call pauses its store-node's fetcher, a refused entry its queue, for
``pull_time_delay_ms_when_exception``, doubling up to 30 times that while
the failures go on.

Positions start at the group's committed offset (``QueryConsumerOffset``),
else by ``consume_from_where``; :meth:`commit` stores them on the
store-nodes (``UpdateConsumerOffset`` under the reset epoch learned with
them; a stale epoch re-reads the offsets a reset stored and the queue is
read again from there, so a reset is never undone). :meth:`close` stops the
fetchers, then commits.

Tracing: a :meth:`poll` that returns records is one CONSUMER span, "receive
<topic>", linked to the send spans its messages carry
(:mod:`basalt.common.tracing`).

Concurrency: one event loop (the fetchers are tasks on it; :meth:`seek` may
also be called from another thread, see there); not for concurrent ``poll``
calls.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Sequence
from typing import Any

import grpc
from opentelemetry import trace

from basalt.client.consumer_base import (
    ConsumeFromWhere,
    ConsumerClient,
    ConsumerConfig,
    MessageQueue,
    Position,
    subscription_of,
)
from basalt.client.errors import ClientError
from basalt.client.membership import GroupMember, TopicSubscription
from basalt.client.tasks import TaskOwner, gather_all
from basalt.common.auth import Credentials
from basalt.common.message import MessageRecord
from basalt.common.settings import (
    boolean,
    config_dataclass,
    instance_of,
    non_negative,
    positive,
    setting,
)
from basalt.common.tls import TlsConfig
from basalt.common.tracing import consume_attributes, message_links
from basalt.v1 import common_pb2 as pb

log = logging.getLogger(__name__)

#: The API's proxy: it binds to whatever TracerProvider the process installs.
_tracer = trace.get_tracer("basalt.client")

#: Most queues in one GetMessages (the store-node's default ``max_queues_per_get_messages``).
MAX_QUEUES_PER_PULL = 32


@config_dataclass
class LitePullConfig(ConsumerConfig):
    """RocketMQ's lite pull settings, by its names in snake_case (subscribe mode
    uses the membership settings of :class:`ConsumerConfig` too, which
    validates them all)."""

    subscription: str = setting(
        default="*",
        check=instance_of(str, "a string"),
        doc="Assign mode's filter: TAG expression ('*', 'a || b') or, with sql92, SQL92.",
    )
    sql92: bool = setting(default=False, check=boolean, doc="subscription is an SQL92 expression.")
    pull_threshold_for_queue: int = setting(
        default=1000,
        check=positive,
        doc="Most records fetched and not yet returned by poll, per queue.",
    )
    broker_suspend_max_time_ms: int = setting(
        default=15_000,
        check=non_negative,
        doc="Long-poll hold asked of the store-node (RocketMQ's brokerSuspendMaxTimeMillis).",
    )


class _Read:
    """One read of an owned queue: its consume position, where its next fetch
    starts, and the records fetched and not yet returned, in offset order:
    ``records`` (decoded) then ``chunks`` (as fetched: poll decodes what it
    returns, so the fetcher only files a reply and sends the next call).

    A new read replaces the object (seek, reset, take, assign); a fetch result
    is applied only if its read is still the queue's current one."""

    __slots__ = (
        "caught_up",
        "chunks",
        "count",
        "fetch_offset",
        "in_flight",
        "paused",
        "position",
        "queue",
        "records",
        "refusals",
    )

    def __init__(self, queue: MessageQueue, position: Position) -> None:
        self.queue = queue
        self.position = position
        self.fetch_offset = position.offset
        self.records: list[MessageRecord] = []
        #: Undecoded pulls: (records' bytes, how many, the offset the pull read from).
        self.chunks: collections.deque[tuple[bytes, int, int]] = collections.deque()
        #: Records buffered, decoded or not (the bound applies to this).
        self.count = 0
        #: Part of a GetMessages in flight.
        self.in_flight = False
        #: The last fetch reached the queue's max offset: a GetMessages of only
        #: caught-up reads is likely held by the store-node (long polling).
        self.caught_up = False
        #: Refused lately: not fetched until the pause ends.
        self.paused = False
        self.refusals = 0


class LitePullConsumer(ConsumerClient):
    """Polls its queues from their store-nodes; ``async with`` or :meth:`start` /
    :meth:`close` (close stops fetching, then commits; in subscribe mode it
    also leaves the group)."""

    def __init__(
        self,
        endpoints: str,
        *,
        config: LitePullConfig,
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
        #: Each owned queue's current read (its Position included).
        self._reads: dict[MessageQueue, _Read] = {}
        #: The reads with records buffered, in the order they got them (poll's order).
        self._ready: dict[MessageQueue, _Read] = {}
        self._subscriptions: dict[str, TopicSubscription] = {}
        self._member: GroupMember | None = None
        #: Set when records arrive or an error is pending (a waiting poll wakes).
        self._arrived = asyncio.Event()
        #: The first fetch error since the last poll (see the module docstring).
        self._error: ClientError | None = None
        self._fetchers: dict[str, asyncio.Task[None]] = {}
        #: The fetchers and their GetMessages replies, all ended by close.
        self._tasks = TaskOwner()
        #: Per store-node: set when its fetcher has something new to fetch.
        self._wakes: dict[str, asyncio.Event] = {}
        #: The loop the consumer runs on (set by start).
        self._loop: asyncio.AbstractEventLoop | None = None
        self._started = False
        self._closing = False

    async def start(self) -> None:
        await super().start()
        self._loop = asyncio.get_running_loop()
        self._started = True
        for broker in {q.broker_name for q in self._reads}:
            self._wake(broker)
        if self._subscriptions:
            self._member = GroupMember(self, self, self.config, self._subscriptions)
            self._member.start()

    async def close(self) -> None:
        try:
            await self._stop_fetchers()
            if self._member is not None:
                await self._member.close()  # commits what it gives up
            elif self._reads:
                await self.commit()
        finally:
            try:
                await self._tasks.close()
            finally:
                await super().close()

    # -- subscribe mode ---------------------------------------------------------------

    def subscribe(self, topic: str, expression: str = "*", *, sql92: bool = False) -> None:
        """Share ``topic``'s queues with the group, filtered by a TAG expression or,
        with ``sql92``, an SQL92 filter. Before :meth:`start`; not with :meth:`assign`."""
        if self._member is not None:
            raise RuntimeError("subscribe before start")
        if self._reads:
            raise RuntimeError("a consumer that assigned queues cannot subscribe")
        self._subscriptions[topic] = TopicSubscription(topic, expression, sql92)

    async def rebalance(self) -> None:
        """Subscribe mode: rebalance now (it also happens by itself)."""
        if self._member is None:
            raise RuntimeError("rebalance is for a started consumer in subscribe mode")
        await self._member.rebalance()

    def owned(self) -> set[MessageQueue]:
        return set(self._reads)

    async def take(self, queues: dict[MessageQueue, Position]) -> None:
        for q, position in queues.items():
            self._new_read(q, position)

    async def give_up(self, queues: Sequence[MessageQueue], *, commit: bool) -> None:
        """Drop the queues' buffers (their records were not returned, so the
        commit stores only what poll returned); fetches in flight are discarded."""
        gone = {}
        for q in queues:
            read = self._end_read(q)
            if read is not None:
                gone[q] = read.position
        if commit:
            await asyncio.gather(
                *(self._commit(q, p) for q, p in gone.items() if p.offset != p.committed),
                return_exceptions=True,  # a failed commit only means a re-read
            )

    async def reset(self, table: dict[MessageQueue, pb.QueueOffset]) -> int:
        affected = [q for q in self._reads if q in table]
        for q in affected:
            new = table[q]
            self._new_read(q, Position(new.offset, new.reset_epoch, new.offset))
        return len(affected)

    # -- assignment -------------------------------------------------------------------

    async def assign(self, queues: Sequence[MessageQueue]) -> None:
        """Own exactly ``queues`` from now on, each starting at the group's
        committed offset, else by ``consume_from_where`` (queues already owned
        keep their positions and buffers). Not in subscribe mode."""
        if self._subscriptions:
            raise RuntimeError("a subscribing consumer's queues come from its group")
        for topic in {q.topic for q in queues} - {q.topic for q in self._reads}:
            await self.queues_of(topic)  # learn the store-nodes' addresses
        wanted = set(queues)
        new = [q for q in dict.fromkeys(queues) if q not in self._reads]
        starts = await gather_all(*(self._start_position(q) for q in new))
        for q in [q for q in self._reads if q not in wanted]:
            self._end_read(q)
        for q, position in zip(new, starts, strict=True):
            if q not in self._reads:  # not taken meanwhile by a concurrent assign
                self._new_read(q, position)

    def assignment(self) -> list[MessageQueue]:
        return sorted(self._reads)

    def position(self, queue: MessageQueue) -> int:
        """Where the next record :meth:`poll` returns of ``queue`` starts
        (past what it returned; what :meth:`commit` would store)."""
        return self._reads[queue].position.offset

    def seek(self, queue: MessageQueue, offset: int) -> None:
        """Read ``queue`` from ``offset`` on: what was fetched of it and not yet
        returned is dropped, and the next records poll returns of it start there.
        KeyError if ``queue`` is not owned.

        Called from another thread than the consumer's loop (as
        :class:`basalt.client.SyncLitePullConsumer` does), the seek is applied on
        that loop, before anything submitted to it afterwards (a poll)."""
        if offset < 0:
            raise ValueError(f"offset {offset} is negative")
        if queue not in self._reads:
            raise KeyError(queue)
        loop = self._loop
        if loop is not None and not _running_on(loop):
            loop.call_soon_threadsafe(self._seek, queue, offset)
        else:
            self._seek(queue, offset)

    def _seek(self, queue: MessageQueue, offset: int) -> None:
        read = self._reads.get(queue)
        if read is not None:
            read.position.offset = offset
            self._new_read(queue, read.position)

    # -- reads ------------------------------------------------------------------------

    def _new_read(self, queue: MessageQueue, position: Position) -> None:
        """Start a new read of ``queue`` at ``position.offset`` (the old one's
        buffer dropped, its fetches in flight discarded when they come back)."""
        self._ready.pop(queue, None)
        self._reads[queue] = _Read(queue, position)
        self._wake(queue.broker_name)

    def _end_read(self, queue: MessageQueue) -> _Read | None:
        """Stop owning ``queue``: its read and buffer go (fetches in flight discarded)."""
        self._ready.pop(queue, None)
        return self._reads.pop(queue, None)

    def _wants_fetch(self, read: _Read) -> bool:
        """Not in flight, not paused, and its buffer has room for a whole pull of
        ``pull_batch_size`` (with a threshold below that: is empty), so that a
        slow application does not turn the fetches into trickles."""
        if read.in_flight or read.paused:
            return False
        threshold = self.config.pull_threshold_for_queue
        return threshold - read.count >= min(self.config.pull_batch_size, threshold)

    def _wake(self, broker: str) -> None:
        """Tell ``broker``'s fetcher to look again, starting it if needed (once started)."""
        wake = self._wakes.get(broker)
        if wake is None:
            wake = self._wakes[broker] = asyncio.Event()
        wake.set()
        if self._started and not self._closing and broker not in self._fetchers:
            self._fetchers[broker] = self._tasks.spawn(
                self._fetch(broker, wake), name=f"basalt-lite-fetch:{broker}", untraced=True
            )

    async def _stop_fetchers(self) -> None:
        self._closing = True
        fetchers = list(self._fetchers.values())
        for task in fetchers:
            task.cancel()
        # Each fetcher's own calls are cancelled and awaited as it ends.
        await asyncio.gather(*fetchers, return_exceptions=True)
        self._fetchers.clear()

    # -- fetching ---------------------------------------------------------------------

    async def _fetch(self, broker: str, wake: asyncio.Event) -> None:
        """``broker``'s fetcher (one task, until close): keeps a GetMessages in
        flight for its owned queues that want records, applies what comes back."""
        calls: dict[asyncio.Future[pb.PullBatchResponse | ClientError], list[_Read]] = {}
        arrived = False
        failures = 0
        held = False  # after a failed call, until its pause ends
        loop = asyncio.get_running_loop()

        def resume() -> None:
            nonlocal held
            held = False
            wake.set()

        try:
            while True:
                wake.clear()
                if not held:
                    self._send(broker, calls)
                if arrived:
                    # Only now: the next GetMessages goes out before poll runs (and decodes).
                    arrived = False
                    self._arrived.set()
                waiter = loop.create_task(wake.wait())
                waiting: set[asyncio.Future[Any]] = {*calls, waiter}
                try:
                    done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    if not waiter.done():
                        waiter.cancel()
                        # Ended before this fetcher goes on (or ends): never left pending.
                        await asyncio.wait([waiter])
                for call in [c for c in calls if c in done]:
                    reads = calls.pop(call)
                    for read in reads:
                        read.in_flight = False
                    reply = call.result()
                    try:
                        if isinstance(reply, ClientError):
                            raise reply
                        arrived |= self._apply(reads, reply)
                        failures = 0
                        continue
                    except ClientError as e:
                        self._failed(e)
                    except Exception as e:  # a bug
                        log.exception("%s: fetch failed", broker)
                        self._failed(
                            ClientError.from_code(pb.RESPONSE_CODE_SYSTEM_ERROR, f"{broker}: {e!r}")
                        )
                    # Pause this store-node's fetches (its other calls finish).
                    failures += 1
                    held = True
                    loop.call_later(self.config.retry_delay_s(failures), resume)
        finally:
            for call in calls:
                call.cancel()
            # The replies end (their calls cancelled) before the fetcher does.
            await asyncio.gather(*calls, return_exceptions=True)

    def _send(
        self,
        broker: str,
        calls: dict[asyncio.Future[pb.PullBatchResponse | ClientError], list[_Read]],
    ) -> None:
        """Start GetMessages calls of ``broker``'s reads that want records, if any; calls
        in flight that are likely held (only caught-up reads) are cancelled and
        their reads fetched with the new ones, so a seek, a take or a drained
        buffer does not wait out a long poll."""
        wanted = [
            r for q, r in self._reads.items() if q.broker_name == broker and self._wants_fetch(r)
        ]
        if not wanted:
            return
        for call, reads in list(calls.items()):
            if all(r.caught_up for r in reads):
                call.cancel()
                del calls[call]
                for r in reads:
                    r.in_flight = False
                    if self._reads.get(r.queue) is r and self._wants_fetch(r):
                        wanted.append(r)
        for i in range(0, len(wanted), MAX_QUEUES_PER_PULL):
            chunk = wanted[i : i + MAX_QUEUES_PER_PULL]
            for r in chunk:
                r.in_flight = True
            calls[self._get_messages(chunk)] = chunk

    def _get_messages(
        self, reads: list[_Read]
    ) -> asyncio.Future[pb.PullBatchResponse | ClientError]:
        """One GetMessages of ``reads`` on their store-node, started now (so
        that it is on its way before poll runs and decodes); its reply, or a
        gRPC error as a ClientError naming the store-node. Cancelling the
        future cancels the call."""
        threshold, batch = self.config.pull_threshold_for_queue, self.config.pull_batch_size
        broker = reads[0].queue.broker_name
        call = self._read_store_node(
            broker,
            [
                # Never more than the room left: the buffer's bound is exact.
                self._read_request(
                    r.queue,
                    r.fetch_offset,
                    min(batch, threshold - r.count),
                    self._subscription(r.queue.topic),
                )
                for r in reads
            ],
            self.config.broker_suspend_max_time_ms,
        )

        async def reply() -> pb.PullBatchResponse | ClientError:
            try:
                got: pb.PullBatchResponse = await call
            except grpc.aio.AioRpcError as e:
                # A failed-over group's new master: the next read goes there.
                await self.reroute(reads[0].queue.topic)
                return ClientError.from_rpc_error(e, address=self._store_node_address(broker))
            return got

        future = self._tasks.spawn(reply())
        future.add_done_callback(lambda _: call.cancel())  # a no-op once the call ended
        return future

    def _apply(self, reads: list[_Read], reply: pb.PullBatchResponse) -> bool:
        """File what one GetMessages brought (undecoded) for the reads still
        current; True if records came."""
        arrived = False
        for read, entry in zip(reads, reply.results, strict=True):
            q = read.queue
            if self._reads.get(q) is not read:
                continue  # given up, reset or sought meanwhile: what came is stale
            if entry.HasField("refused"):
                self._refused(read, entry.refused)
                continue
            read.refusals = 0
            data = entry.records.data
            if data:
                read.chunks.append((data, entry.records.count, read.fetch_offset))
                read.count += entry.records.count
                self._ready.setdefault(q, read)
                arrived = True
            # OFFSET_ILLEGAL (the offset left the queue's range) moves on to the
            # corrected offset, as RocketMQ's consumers do.
            read.fetch_offset = entry.next_begin_offset
            read.caught_up = read.fetch_offset >= entry.max_offset
            if not read.count:
                # Nothing held back from the application (filtered out, or a
                # corrected offset): the consume position follows.
                read.position.offset = read.fetch_offset
        return arrived

    def _refused(self, read: _Read, refused: pb.Refused) -> None:
        q = read.queue
        if self._member is None:
            self._failed(ClientError.from_code(refused.code, f"{q}: {refused.message}"))
        else:
            # Subscribe mode: the queue left the topic's read queues (a
            # shrink) or its broker went; the group's next rebalance says.
            log.warning("%s: %s", q, refused.message)
            self._member.request_rebalance()
        read.refusals += 1
        read.paused = True

        def resume() -> None:
            read.paused = False
            self._wake(q.broker_name)

        asyncio.get_running_loop().call_later(self.config.retry_delay_s(read.refusals), resume)

    def _failed(self, error: ClientError) -> None:
        """Keep ``error`` for the next poll unless one is already waiting there."""
        if self._error is None:
            self._error = error
        else:
            log.warning("fetch failed (an earlier error awaits poll): %s", error)
        self._arrived.set()

    def _subscription(self, topic: str) -> pb.Subscription:
        sub = self._subscriptions.get(topic)
        if sub is None:
            return subscription_of(self.config.subscription, self.config.sql92)
        return subscription_of(sub.expression, sub.sql92)

    # -- polling and committing -------------------------------------------------------

    async def poll(
        self, timeout_ms: int = 1000, max_records: int | None = None
    ) -> list[MessageRecord]:
        """The next fetched records of the owned queues, at once if some are
        buffered, else waiting up to ``timeout_ms`` for some (0: only what is
        buffered); each queue's in offset order, at most ``max_records``.
        Positions move past what is returned, and only that.

        Raises the pending fetch error, if any, as :class:`ClientError` (see
        the module docstring), before returning records."""
        started_ns = time.time_ns()
        self._raise_pending()
        if not self._ready:
            self._arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), max(timeout_ms, 0) / 1000)
            self._raise_pending()
        records = self._take(max_records)
        if records:
            self._traced_receive(records, started_ns)
        return records

    def _traced_receive(self, records: list[MessageRecord], started_ns: int) -> None:
        """A poll that returned ``records`` as a CONSUMER span, "receive <topic>"
        ("receive" when they span topics), from the poll's start to now, linked
        to the send spans its messages carry. Made after the fact: its links
        are only known then, and an empty poll makes no span (an idle consumer
        polling every second would fill a trace backend with nothing)."""
        topics = {r.topic for r in records}
        topic = next(iter(topics)) if len(topics) == 1 else None
        span = _tracer.start_span(
            f"receive {topic}" if topic is not None else "receive",
            kind=trace.SpanKind.CONSUMER,
            links=message_links(r.properties for r in records),
            start_time=started_ns,
        )
        if span.is_recording():
            span.set_attributes(
                consume_attributes(
                    "receive",
                    topic=topic,
                    group=self.consumer_group,
                    client_id=self.config.client_id,
                    message_count=len(records),
                )
            )
        span.end()

    def _raise_pending(self) -> None:
        error, self._error = self._error, None
        if error is not None:
            raise error

    def _take(self, max_records: int | None) -> list[MessageRecord]:
        """Up to ``max_records`` buffered records, decoded, queue by queue in the
        order they arrived (a queue cut short goes last, so none starves).
        A pull that does not decode stays buffered, and is raised when it is
        the first record to return."""
        out: list[MessageRecord] = []
        room = max_records if max_records is not None else -1
        broken: Exception | None = None
        for read in list(self._ready.values()):
            if broken is not None or 0 <= room <= len(out):
                break
            while read.count and (room < 0 or len(out) < room):
                if not read.records:
                    data, count, _ = read.chunks[0]
                    try:
                        read.records = self._decode(
                            read.queue, data, check_crcs=self.config.check_crcs
                        )
                    except Exception as e:  # corrupt records (CorruptRecordError), or a bug
                        broken = e
                        break
                    read.chunks.popleft()
                    read.count += len(read.records) - count  # (the count is the node's word)
                records = read.records
                n = len(records) if room < 0 else min(len(records), room - len(out))
                if n == len(records):
                    out += records
                    read.records = []
                else:
                    out += records[:n]
                    del records[:n]
                read.count -= n
            q = read.queue
            del self._ready[q]
            if read.records:
                read.position.offset = read.records[0].queue_offset
                self._ready[q] = read  # cut short: last in line
            elif read.chunks:
                # Past what was returned: the next pull's records start at or after this.
                read.position.offset = read.chunks[0][2]
                self._ready[q] = read
            else:
                # Past the last record fetched (and whatever the filter skipped).
                read.position.offset = read.fetch_offset
            if self._wants_fetch(read):
                self._wake(q.broker_name)  # its buffer has room again
        if broken is not None and not out:
            raise broken
        return out

    async def commit(self) -> None:
        """Store every queue's position as the group's offset (those that moved):
        past what poll returned, never past what is only buffered."""
        await gather_all(
            *(
                self._commit(q, r.position)
                for q, r in self._reads.items()
                if r.position.offset != r.position.committed
            )
        )

    async def _commit(self, queue: MessageQueue, position: Position) -> None:
        offset = position.offset
        if await self._store_offset(queue, offset, position.reset_epoch):
            position.committed = offset
            return
        # Reset since we learned our offsets: adopt the reset, do not undo it,
        # and read again from there (what is buffered predates it).
        fresh = await self._start_position(queue)
        position.offset, position.reset_epoch = fresh.offset, fresh.reset_epoch
        position.committed = fresh.committed
        read = self._reads.get(queue)
        if read is not None and read.position is position:
            self._new_read(queue, position)


def _running_on(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether this thread is running ``loop``."""
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


__all__ = ["ConsumeFromWhere", "LitePullConfig", "LitePullConsumer", "MessageQueue"]
