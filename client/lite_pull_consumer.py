"""LitePullConsumer in assign mode: the application names the queues and polls.

RocketMQ's DefaultLitePullConsumer with ``assign``: no rebalance, the
application owns the queues it assigned (batch jobs, the Spark pipeline).
Each :meth:`LitePullConsumer.poll` reads every assigned queue with one
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
from collections.abc import Sequence
from dataclasses import dataclass

import grpc

from basalt.v1 import pull_service_pb2 as ps
from client.consumer_base import (
    ConsumeFromWhere,
    ConsumerClient,
    MessageQueue,
    Position,
    subscription_of,
)
from client.producer import ClientError, response_code
from store.message import MessageRecord
from store.record import decode_records


@dataclass(frozen=True, slots=True, kw_only=True)
class LitePullConfig:
    """RocketMQ's lite pull settings, by its names in snake_case."""

    consumer_group: str
    #: Records per queue per pull (RocketMQ's pullBatchSize).
    pull_batch_size: int = 32
    consume_from_where: ConsumeFromWhere = ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET
    #: TAG expression ("*", "a || b") or, with ``sql92``, an SQL92 filter.
    subscription: str = "*"
    sql92: bool = False

    def __post_init__(self) -> None:
        if not self.consumer_group:
            raise ValueError("consumer_group must not be empty")
        if not 1 <= self.pull_batch_size <= 1024:
            raise ValueError(f"pull_batch_size {self.pull_batch_size} is not within 1..1024")


class LitePullConsumer(ConsumerClient):
    """Polls assigned queues through a pull-service; ``async with`` or
    :meth:`start` / :meth:`close` (close commits)."""

    def __init__(self, endpoints: str, *, config: LitePullConfig) -> None:
        super().__init__(
            endpoints,
            consumer_group=config.consumer_group,
            consume_from_where=config.consume_from_where,
        )
        self.config = config
        self._positions: dict[MessageQueue, Position] = {}

    async def close(self) -> None:
        try:
            if self._positions:
                await self.commit()
        finally:
            await super().close()

    # -- assignment -------------------------------------------------------------------

    async def assign(self, queues: Sequence[MessageQueue]) -> None:
        """Own exactly ``queues`` from now on, each starting at the group's
        committed offset, else by ``consume_from_where``."""
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
        by_broker: dict[str, list[MessageQueue]] = {}
        for q in sorted(self._positions):
            by_broker.setdefault(q.broker_name, []).append(q)
        pending = {
            asyncio.ensure_future(self._poll_broker(queues, timeout_ms))
            for queues in by_broker.values()
        }
        reads: list[tuple[MessageQueue, list[MessageRecord], int]] = []
        try:
            while pending and not any(records for _, records, _ in reads):
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    reads += task.result()
        finally:
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        out: list[MessageRecord] = []
        room = max_records if max_records is not None else -1
        for queue, records, next_offset in sorted(reads, key=lambda r: r[0]):
            taken = records if room < 0 else records[: max(0, room - len(out))]
            out += taken
            # Past what was taken: the next read starts at the first record left.
            left = records[len(taken) :]
            self._positions[queue].offset = left[0].queue_offset if left else next_offset
        return out

    async def _poll_broker(
        self, queues: list[MessageQueue], timeout_ms: int
    ) -> list[tuple[MessageQueue, list[MessageRecord], int]]:
        """One PullBatch of ``queues``: each queue's records and where it goes on."""
        subscription = subscription_of(self.config.subscription, self.config.sql92)
        request = ps.PullBatchRequest(
            group=self.config.consumer_group,
            pulls=[
                ps.PullRequest(
                    queue=q.to_proto(),
                    offset=self._positions[q].offset,
                    max_nums=self.config.pull_batch_size,
                    subscription=subscription,
                )
                for q in queues
            ],
            suspend_timeout_ms=timeout_ms,
        )
        try:
            reply = await self._pull_service().PullBatch(request, timeout=timeout_ms / 1000 + 10)
        except grpc.aio.AioRpcError as e:
            raise ClientError(response_code(e), e.details() or str(e.code())) from None
        out = []
        for q, entry in zip(queues, reply.results, strict=True):
            if entry.HasField("refused"):
                raise ClientError(entry.refused.code, f"{q}: {entry.refused.message}")
            records = decode_records(entry.records.data)
            # OFFSET_ILLEGAL (the offset left the queue's range) moves on to the
            # corrected offset, as RocketMQ's consumers do.
            out.append((q, records, entry.next_begin_offset))
        return out

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
