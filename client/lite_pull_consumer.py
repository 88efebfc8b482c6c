"""LitePullConsumer: the application polls; it names the queues, or the group shares them.

RocketMQ's DefaultLitePullConsumer, in one of two modes (not both):

* **assign** (:meth:`LitePullConsumer.assign`): no rebalance, the application
  owns the queues it assigned (batch jobs, the Spark pipeline);
* **subscribe** (:meth:`LitePullConsumer.subscribe` before :meth:`start`):
  the consumer is a member of its group like a PushConsumer
  (:class:`client.membership.GroupMember`: session, AllocateMessageQueueAveragely
  rebalance under queue locks, RESET_OFFSET); a queue given up to another
  member has its position committed first, so what :meth:`poll` returned
  counts as consumed (RocketMQ's auto-commit), and :meth:`poll` drops what
  it read of a queue given up or reset meanwhile.

Each :meth:`LitePullConsumer.poll` reads every owned queue with one
``PullService.PullBatch`` per store-node, concurrently, and long-polls when
nothing is new; records come back decoded by ``store.record`` (the one
definition of the layout). Positions start at the group's committed offset
(``QueryConsumerOffset``), else by ``consume_from_where``; :meth:`seek` moves
one; :meth:`commit` stores them on the store-nodes (``UpdateConsumerOffset``
under the reset epoch learned with them; a stale epoch re-reads the offsets
a reset stored, so a reset is never undone).

Concurrency: one event loop; not for concurrent ``poll`` calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import grpc

from basalt.v1 import common_pb2 as pb
from basalt.v1 import pull_service_pb2 as ps
from client.consumer_base import (
    ConsumeFromWhere,
    ConsumerClient,
    ConsumerConfig,
    MessageQueue,
    Position,
    subscription_of,
)
from client.membership import GroupMember, TopicSubscription
from client.producer import ClientError, response_code
from store.message import MessageRecord
from store.record import decode_records

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class LitePullConfig(ConsumerConfig):
    """RocketMQ's lite pull settings, by its names in snake_case (subscribe mode
    uses the membership settings of :class:`ConsumerConfig` too)."""

    #: Assign mode's filter: TAG expression ("*", "a || b") or, with ``sql92``, SQL92.
    subscription: str = "*"
    sql92: bool = False


class LitePullConsumer(ConsumerClient):
    """Polls its queues through a pull-service; ``async with`` or :meth:`start` /
    :meth:`close` (close commits; in subscribe mode it also leaves the group)."""

    def __init__(self, endpoints: str, *, config: LitePullConfig) -> None:
        super().__init__(
            endpoints,
            consumer_group=config.consumer_group,
            consume_from_where=config.consume_from_where,
        )
        self.config = config
        #: Each owned queue's position; a reset or a new owner replaces the object,
        #: which is how a poll in flight knows its reads are stale.
        self._positions: dict[MessageQueue, Position] = {}
        self._subscriptions: dict[str, TopicSubscription] = {}
        self._member: GroupMember | None = None
        #: Set when the group gives this consumer queues (a waiting poll reads them).
        self._taken = asyncio.Event()

    async def start(self) -> None:
        await super().start()
        if self._subscriptions:
            self._member = GroupMember(self, self, self.config, self._subscriptions)
            self._member.start()

    async def close(self) -> None:
        try:
            if self._member is not None:
                await self._member.close()  # commits what it gives up
            elif self._positions:
                await self.commit()
        finally:
            await super().close()

    # -- subscribe mode ---------------------------------------------------------------

    def subscribe(self, topic: str, expression: str = "*", *, sql92: bool = False) -> None:
        """Share ``topic``'s queues with the group, filtered by a TAG expression or,
        with ``sql92``, an SQL92 filter. Before :meth:`start`; not with :meth:`assign`."""
        if self._member is not None:
            raise RuntimeError("subscribe before start")
        if self._positions:
            raise RuntimeError("a consumer that assigned queues cannot subscribe")
        self._subscriptions[topic] = TopicSubscription(topic, expression, sql92)

    async def rebalance(self) -> None:
        """Subscribe mode: rebalance now (it also happens by itself)."""
        if self._member is None:
            raise RuntimeError("rebalance is for a started consumer in subscribe mode")
        await self._member.rebalance()

    def owned(self) -> set[MessageQueue]:
        return set(self._positions)

    async def take(self, queues: dict[MessageQueue, Position]) -> None:
        self._positions.update(queues)
        if queues:
            self._taken.set()

    async def give_up(self, queues: Sequence[MessageQueue], *, commit: bool) -> None:
        gone = {q: self._positions.pop(q) for q in queues if q in self._positions}
        if commit:
            await asyncio.gather(
                *(self._commit(q, p) for q, p in gone.items() if p.offset != p.committed),
                return_exceptions=True,  # a failed commit only means a re-read
            )

    async def reset(self, table: dict[MessageQueue, pb.QueueOffset]) -> int:
        affected = [q for q in self._positions if q in table]
        for q in affected:
            new = table[q]
            self._positions[q] = Position(new.offset, new.reset_epoch, new.offset)
        return len(affected)

    # -- assignment -------------------------------------------------------------------

    async def assign(self, queues: Sequence[MessageQueue]) -> None:
        """Own exactly ``queues`` from now on, each starting at the group's
        committed offset, else by ``consume_from_where``. Not in subscribe mode."""
        if self._subscriptions:
            raise RuntimeError("a subscribing consumer's queues come from its group")
        for topic in {q.topic for q in queues} - {q.topic for q in self._positions}:
            await self.queues_of(topic)  # learn the store-nodes' addresses
        keep = {q: p for q, p in self._positions.items() if q in queues}
        new = [q for q in queues if q not in keep]
        starts = await asyncio.gather(*(self._start_position(q) for q in new))
        self._positions = {**keep, **dict(zip(new, starts, strict=True))}

    def assignment(self) -> list[MessageQueue]:
        return sorted(self._positions)

    def position(self, queue: MessageQueue) -> int:
        return self._positions[queue].offset

    def seek(self, queue: MessageQueue, offset: int) -> None:
        """Read ``queue`` from ``offset`` on (the next poll)."""
        if offset < 0:
            raise ValueError(f"offset {offset} is negative")
        self._positions[queue].offset = offset

    # -- polling and committing -------------------------------------------------------

    async def poll(
        self, timeout_ms: int = 1000, max_records: int | None = None
    ) -> list[MessageRecord]:
        """The next records of the assigned queues, waiting up to ``timeout_ms``
        for some when none is there; each queue's in offset order, at most
        ``max_records``. Positions move past what is returned, and only that.

        One PullBatch per store-node, concurrently; the first to bring records
        ends the poll and the others (held, with nothing yet) are cancelled,
        so that a quiet store-node does not hold back a busy one."""
        if not self._positions:
            # Subscribe mode before the group gave us queues: wait for some.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._taken.wait(), timeout_ms / 1000)
            self._taken.clear()
            return []
        by_broker: dict[str, list[tuple[MessageQueue, Position]]] = {}
        for q, position in sorted(self._positions.items()):
            by_broker.setdefault(q.broker_name, []).append((q, position))
        pending = {
            asyncio.ensure_future(self._poll_broker(queues, timeout_ms))
            for queues in by_broker.values()
        }
        reads: list[tuple[MessageQueue, Position, list[MessageRecord], int]] = []
        try:
            while pending and not any(records for _, _, records, _ in reads):
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    reads += task.result()
        finally:
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        out: list[MessageRecord] = []
        room = max_records if max_records is not None else -1
        for queue, position, records, next_offset in sorted(reads, key=lambda r: r[0]):
            if self._positions.get(queue) is not position:
                continue  # given up or reset while we read: what we read is stale
            taken = records if room < 0 else records[: max(0, room - len(out))]
            out += taken
            # Past what was taken: the next read starts at the first record left.
            left = records[len(taken) :]
            position.offset = left[0].queue_offset if left else next_offset
        return out

    async def _poll_broker(
        self, queues: list[tuple[MessageQueue, Position]], timeout_ms: int
    ) -> list[tuple[MessageQueue, Position, list[MessageRecord], int]]:
        """One PullBatch of ``queues``: each queue's records and where it goes on."""
        request = ps.PullBatchRequest(
            group=self.config.consumer_group,
            pulls=[
                ps.PullRequest(
                    queue=q.to_proto(),
                    offset=position.offset,
                    max_nums=self.config.pull_batch_size,
                    subscription=self._subscription(q.topic),
                )
                for q, position in queues
            ],
            suspend_timeout_ms=timeout_ms,
        )
        try:
            reply = await self._pull_service().PullBatch(request, timeout=timeout_ms / 1000 + 10)
        except grpc.aio.AioRpcError as e:
            raise ClientError(response_code(e), e.details() or str(e.code())) from None
        out = []
        for (q, position), entry in zip(queues, reply.results, strict=True):
            if entry.HasField("refused"):
                if self._member is None:
                    raise ClientError(entry.refused.code, f"{q}: {entry.refused.message}")
                # Subscribe mode: the queue left the topic's read queues (a
                # shrink) or its broker went; the group's next rebalance says.
                log.warning("%s: %s", q, entry.refused.message)
                self._member.request_rebalance()
                continue
            records = decode_records(entry.records.data)
            # OFFSET_ILLEGAL (the offset left the queue's range) moves on to the
            # corrected offset, as RocketMQ's consumers do.
            out.append((q, position, records, entry.next_begin_offset))
        return out

    def _subscription(self, topic: str) -> pb.Subscription:
        sub = self._subscriptions.get(topic)
        if sub is None:
            return subscription_of(self.config.subscription, self.config.sql92)
        return subscription_of(sub.expression, sub.sql92)

    async def commit(self) -> None:
        """Store every queue's position as the group's offset (those that moved)."""
        await asyncio.gather(
            *(self._commit(q, p) for q, p in self._positions.items() if p.offset != p.committed)
        )

    async def _commit(self, queue: MessageQueue, position: Position) -> None:
        offset = position.offset
        if await self._store_offset(queue, offset, position.reset_epoch):
            position.committed = offset
            return
        # Reset since we learned our offsets: adopt the reset, do not undo it.
        fresh = await self._start_position(queue)
        position.offset, position.reset_epoch = fresh.offset, fresh.reset_epoch
        position.committed = fresh.committed


__all__ = ["ConsumeFromWhere", "LitePullConfig", "LitePullConsumer", "MessageQueue"]
