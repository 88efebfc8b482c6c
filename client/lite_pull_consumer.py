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
fetcher task per store-node keeps a GetMessages on that node (long polling,
``broker_suspend_max_time_ms``; the store-node's address as the route gives
it, :mod:`basalt.client.consumer_base` says why not through the pull-service)
in flight for the owned queues of that node whose buffer has room for another
``pull_batch_size`` records, as an item on one ``GetMessagesStream`` to it
(:mod:`basalt.client.fetch_stream`: a message on a stream costs gRPC a
fraction of a unary call); a queue holding ``pull_threshold_for_queue``
records (the bound: a fetch never asks for more than the room left) is left
out until :meth:`poll` drains it, which wakes the fetcher (an event, so a
fetcher's turn starts no task). A reply is applied where the stream's reader
reads it, and the fetcher woken before poll, so the next fetch goes out before
:meth:`poll` runs: poll decodes the
records it returns (``basalt.common.record``, the one definition of the layout), so
decoding overlaps the next fetch and nothing dropped is ever decoded.

A queue's buffer and its fetches in flight belong to one *read* of it;
:meth:`seek`, :meth:`assign`, a reset, a take and a give-up start a new read
(or end it), so the old buffer is dropped and whatever a fetch of the old
read brings is discarded: after a reset or a give-up, :meth:`poll` never
returns a record fetched before it.

**Fetch errors** (the rule): a failed fetch (its stream broke, or the fetch
was refused as the unary call would fail; naming the store-node) is raised by
the next :meth:`poll` as a :class:`ClientError`, in both modes; an entry the
store-node refused (what the pull-service's Pull refuses, with its codes: an
unknown or unreadable topic, a queue id past ``read_queue_nums``, a
subscription that does not parse) is one too in assign mode, while in
subscribe mode it is logged and asks the group for a rebalance (the queue left
the topic's read queues, or its store-node went).
:meth:`poll` raises the first such error since the previous poll, once,
before returning any record (records buffered stay buffered for the next
poll; nothing is lost), and a poll that waits wakes up for it. A failed
fetch pauses its store-node's fetcher, a refused entry its queue, for
``pull_time_delay_ms_when_exception``, doubling up to 30 times that while
the failures go on.

Positions start at the group's committed offset (``QueryConsumerOffset``),
else by ``consume_from_where``; :meth:`commit` stores them on the
store-nodes under the reset epoch learned with them (a stale epoch re-reads
the offsets a reset stored and the queue is read again from there, so a
reset is never undone). A queue whose next fetch is about to go when
:meth:`commit` is called (one message at a time: poll drained its buffer,
then commit) has its offset carried by that fetch (``commit_offset``, stored by
the store-node before it reads, the outcome in the answer; such a fetch is
never held by long polling): one round trip for a poll and a commit instead of
two. Any other queue, and a carried commit whose fetch failed or did not go,
is stored with ``UpdateConsumerOffset``. :meth:`close` stops the fetchers,
then commits.

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
from collections.abc import Callable, Sequence

from opentelemetry import trace

from basalt.client.consumer_base import (
    PULL_DEADLINE_MARGIN_S,
    ConsumeFromWhere,
    ConsumerClient,
    ConsumerConfig,
    MessageQueue,
    Position,
    subscription_of,
)
from basalt.client.errors import ClientError
from basalt.client.fetch_stream import FetchOutcome, FetchStream
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
from basalt.common.tracing import (
    commit_attributes,
    consume_attributes,
    message_links,
    tracing_installed,
)
from basalt.v1 import common_pb2 as pb
from basalt.v1 import store_node_pb2 as sn

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
        "carry",
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
        #: A commit to carry on this read's next GetMessages (see :meth:`LitePullConsumer._carry`).
        self.carry: _Carry | None = None


class _Carry:
    """A commit riding on its read's next GetMessages (``commit_offset``): the
    offset and the reset epoch fencing it, and what :meth:`LitePullConsumer.commit`
    awaits: True stored, False refused as stale (a reset since), None not
    carried (the call failed or was cancelled, the entry was refused, the read
    ended or its fetcher paused first): commit then stores it itself."""

    __slots__ = ("offset", "outcome", "reset_epoch")

    def __init__(self, offset: int, reset_epoch: int, outcome: asyncio.Future[bool | None]) -> None:
        self.offset = offset
        self.reset_epoch = reset_epoch
        self.outcome = outcome

    def settle(self, stored: bool | None) -> None:
        if not self.outcome.done():  # commit() may have been cancelled
            self.outcome.set_result(stored)


class _Fetch:
    """One GetMessages in flight: its reads, in the request's order, and the
    commits it carries with the index of their entry."""

    __slots__ = ("carried", "reads")

    def __init__(self, reads: list[_Read], carried: list[tuple[int, _Carry]]) -> None:
        self.reads = reads
        self.carried = carried

    def settle(self, reply: pb.PullBatchResponse | None) -> None:
        """Each carried commit's outcome from its entry of ``reply`` (None: no reply)."""
        for i, carry in self.carried:
            entry = reply.results[i] if reply is not None else None
            if entry is not None and entry.HasField("commit"):
                carry.settle(entry.commit.code != pb.RESPONSE_CODE_STALE_RESET_EPOCH)
            else:
                carry.settle(None)


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
        #: Each topic's subscription as read requests carry it (_subscription).
        self._filters: dict[str, pb.Subscription] = {}
        self._member: GroupMember | None = None
        #: Set when records arrive or an error is pending (a waiting poll wakes).
        self._arrived = asyncio.Event()
        #: The first fetch error since the last poll (see the module docstring).
        self._error: ClientError | None = None
        self._fetchers: dict[str, asyncio.Task[None]] = {}
        #: Store-nodes whose fetcher pauses after a failed call.
        self._held: set[str] = set()
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
        old = self._reads.get(queue)
        if old is not None:
            _drop_carry(old)
        self._reads[queue] = _Read(queue, position)
        self._wake(queue.broker_name)

    def _end_read(self, queue: MessageQueue) -> _Read | None:
        """Stop owning ``queue``: its read and buffer go (fetches in flight discarded)."""
        self._ready.pop(queue, None)
        read = self._reads.pop(queue, None)
        if read is not None:
            _drop_carry(read)
        return read

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
        for read in self._reads.values():
            _drop_carry(read)  # commit() stores them itself

    # -- fetching ---------------------------------------------------------------------

    async def _fetch(self, broker: str, wake: asyncio.Event) -> None:
        """``broker``'s fetcher (one task, until close): keeps fetches in flight for
        its owned queues that want records, on one GetMessagesStream to its
        store-node (:mod:`basalt.client.fetch_stream`).

        Answers are applied where the stream's reader reads them (``on_answer``:
        no hop to this task); it is woken only when a read wants the next fetch,
        before a waiting poll is, so the next fetch goes out before poll runs
        (and decodes). It sleeps on ``wake`` alone: a turn costs no task."""
        fetches: dict[int, _Fetch] = {}
        stream: FetchStream | None = None
        failures = 0
        loop = asyncio.get_running_loop()

        def on_answer(opaque: int, answer: FetchOutcome) -> None:
            nonlocal failures
            fetch = fetches.pop(opaque, None)
            if fetch is None:
                return  # cancelled by _send: its reads went into a newer fetch
            for read in fetch.reads:
                read.in_flight = False
            outcome = self._reply(fetch, answer)
            if isinstance(outcome, ClientError):
                self._failed(outcome)
                # Pause this store-node's fetches (its other fetches finish);
                # commits waiting to ride on them are stored by commit() itself.
                failures += 1
                self._held.add(broker)
                for read in self._reads.values():
                    if read.queue.broker_name == broker:
                        _drop_carry(read)
                loop.call_later(self.config.retry_delay_s(failures), resume)
                return
            failures = 0
            if any(self._wants_fetch(r) for r in fetch.reads):
                wake.set()
            if outcome:
                self._arrived.set()  # after the fetcher's wake: its turn comes first

        def resume() -> None:
            self._held.discard(broker)
            wake.set()

        try:
            while True:
                wake.clear()
                if broker not in self._held:
                    stream = await self._send(broker, stream, fetches, on_answer)
                await wake.wait()
        finally:
            self._held.discard(broker)
            for fetch in fetches.values():
                fetch.settle(None)
            fetches.clear()
            if stream is not None:
                stream.close()

    def _stream(
        self,
        broker: str,
        stream: FetchStream | None,
        fetches: dict[int, _Fetch],
        on_answer: Callable[[int, FetchOutcome], None],
    ) -> FetchStream:
        """``stream`` if it still works and goes where the route says ``broker``
        is, else a new one. A stream left behind by a route that moved (a
        failed-over group) is closed, what was in flight on it fetched anew."""
        address = self._addresses[broker]
        if stream is not None and not stream.broken:
            if stream.address == address:
                return stream
            for fetch in fetches.values():
                fetch.settle(None)
                for r in fetch.reads:
                    r.in_flight = False
            fetches.clear()
            stream.close()
        return FetchStream(
            self._channel(address), address, self._tasks, on_answer, PULL_DEADLINE_MARGIN_S
        )

    def _reply(self, fetch: _Fetch, answer: FetchOutcome) -> bool | ClientError:
        """Apply one fetch's answer: whether records came, or the error it failed
        with (a ClientError naming the store-node)."""
        if isinstance(answer, ClientError):
            fetch.settle(None)
            # A failed-over group's new master: the next read goes there (the
            # route is asked meanwhile; the pause after a failure outlasts it).
            self._tasks.spawn(self.reroute(fetch.reads[0].queue.topic), untraced=True)
            return answer
        try:
            fetch.settle(answer)
            return self._apply(fetch.reads, answer)
        except Exception as e:  # a bug
            log.exception("%s: fetch failed", fetch.reads[0].queue.broker_name)
            fetch.settle(None)
            return ClientError.from_code(pb.RESPONSE_CODE_SYSTEM_ERROR, repr(e))

    async def _send(
        self,
        broker: str,
        stream: FetchStream | None,
        fetches: dict[int, _Fetch],
        on_answer: Callable[[int, FetchOutcome], None],
    ) -> FetchStream | None:
        """Fetch ``broker``'s reads that want records, if any, on ``stream`` or the
        one that replaces it (:meth:`_stream`; returned); fetches in flight that
        are likely held (only caught-up reads, no commit carried) are cancelled
        and their reads fetched with the new ones, so a seek, a take or a drained
        buffer does not wait out a long poll."""
        wanted = [
            r for q, r in self._reads.items() if q.broker_name == broker and self._wants_fetch(r)
        ]
        if not wanted:
            return stream
        stream = self._stream(broker, stream, fetches, on_answer)
        cancels = []
        for opaque, fetch in list(fetches.items()):
            if not fetch.carried and all(r.caught_up for r in fetch.reads):
                cancels.append(opaque)
                del fetches[opaque]
                for r in fetch.reads:
                    r.in_flight = False
                    if self._reads.get(r.queue) is r and self._wants_fetch(r):
                        wanted.append(r)
        requests = []
        for i in range(0, len(wanted), MAX_QUEUES_PER_PULL):
            chunk = wanted[i : i + MAX_QUEUES_PER_PULL]
            for r in chunk:
                r.in_flight = True
            request, fetch = self._get_messages(chunk)
            opaque = stream.next_opaque()
            fetches[opaque] = fetch
            requests.append((opaque, request))
        await stream.fetch(requests, cancels)
        return stream

    def _get_messages(self, reads: list[_Read]) -> tuple[sn.GetMessagesRequest, _Fetch]:
        """One GetMessages of ``reads`` on their store-node, carrying the commits
        waiting on them. A fetch that carries one is not held (suspend 0): the
        commit's caller waits for its answer, which must not wait out a long poll."""
        threshold, batch = self.config.pull_threshold_for_queue, self.config.pull_batch_size
        requests: list[sn.GetMessageRequest] = []
        carried: list[tuple[int, _Carry]] = []
        for i, r in enumerate(reads):
            request = self._read_request(
                r.queue,
                r.fetch_offset,
                # Never more than the room left: the buffer's bound is exact.
                min(batch, threshold - r.count),
                self._subscription(r.queue.topic),
            )
            carry, r.carry = r.carry, None
            if carry is not None and not carry.outcome.done():
                request.commit_offset = carry.offset
                request.reset_epoch = carry.reset_epoch
                carried.append((i, carry))
            requests.append(request)
        suspend_ms = 0 if carried else self.config.broker_suspend_max_time_ms
        return sn.GetMessagesRequest(reads=requests, suspend_timeout_ms=suspend_ms), _Fetch(
            reads, carried
        )

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
        """``topic``'s filter on the wire, made once (a read request copies it)."""
        made = self._filters.get(topic)
        if made is None:
            sub = self._subscriptions.get(topic)
            if sub is None:
                made = subscription_of(self.config.subscription, self.config.sql92)
            else:
                made = subscription_of(sub.expression, sub.sql92)
            self._filters[topic] = made
        return made

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
            # A timeout scope, not wait_for (a task per waiting poll).
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(timeout_ms, 0) / 1000):
                    await self._arrived.wait()
            self._raise_pending()
        records = self._take(max_records)
        if records and tracing_installed():
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
        past what poll returned, never past what is only buffered.

        A queue whose next GetMessages is about to go (its buffer drained by
        the poll before, nothing in flight: one message at a time) has its
        offset carried by that call (``commit_offset``, stored by the store-node
        before it reads), one round trip instead of two; any other is stored
        with ``UpdateConsumerOffset``, as is a carried one whose call failed."""
        moved = [
            (q, r.position, self._carry(r))
            for q, r in self._reads.items()
            if r.position.offset != r.position.committed
        ]
        if len(moved) == 1:
            await self._commit(*moved[0])  # no task for the one queue
        else:
            await gather_all(*(self._commit(q, p, carried) for q, p, carried in moved))

    def _carry(self, read: _Read) -> _Carry | None:
        """Hand ``read``'s commit to its next GetMessages, if one is about to go:
        the read wants records (so its fetcher, woken, sends it at its next
        turn), its fetcher runs and is not paused, and no commit waits on it yet."""
        broker = read.queue.broker_name
        if (
            read.carry is not None
            or self._closing
            or broker not in self._fetchers
            or broker in self._held
            or not self._wants_fetch(read)
        ):
            return None
        position = read.position
        carry = _Carry(
            position.offset, position.reset_epoch, asyncio.get_running_loop().create_future()
        )
        read.carry = carry
        self._wake(broker)
        return carry

    async def _commit(
        self, queue: MessageQueue, position: Position, carried: _Carry | None = None
    ) -> None:
        offset, epoch = position.offset, position.reset_epoch
        stored = None if carried is None else await self._carried(queue, carried)
        if stored is None:
            stored = await self._store_offset(queue, offset, epoch)
        if stored:
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

    async def _carried(self, queue: MessageQueue, carried: _Carry) -> bool | None:
        """``carried``'s outcome. In a caller's recorded trace, awaited in a
        CLIENT span "commit <topic>" of its own: the carrying GetMessages runs in
        the fetcher's context, so without it the caller's trace would lose the
        commit that its UpdateConsumerOffset call's span used to show."""
        if not trace.get_current_span().is_recording():
            return await carried.outcome
        with _tracer.start_as_current_span(
            f"commit {queue.topic}",
            kind=trace.SpanKind.CLIENT,
            attributes=commit_attributes(
                topic=queue.topic,
                queue_id=queue.queue_id,
                group=self.consumer_group,
                client_id=self.config.client_id,
            ),
        ):
            return await carried.outcome


def _drop_carry(read: _Read) -> None:
    """The commit waiting to ride on ``read``'s next fetch goes on its own:
    that fetch will not be sent (the read ended, or its fetcher paused)."""
    carry, read.carry = read.carry, None
    if carry is not None:
        carry.settle(None)


def _running_on(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether this thread is running ``loop``."""
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


__all__ = ["ConsumeFromWhere", "LitePullConfig", "LitePullConsumer", "MessageQueue"]
