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
import enum
from collections.abc import Sequence
from dataclasses import dataclass

import grpc

from basalt.v1 import common_pb2 as pb
from basalt.v1 import pull_service_pb2 as ps
from basalt.v1 import store_node_pb2 as sn
from basalt.v1 import store_node_pb2_grpc as sn_grpc
from client.channels import Client
from client.producer import ClientError, response_code
from store.get_message import split_records
from store.message import MessageRecord
from store.record import decode_record


class ConsumeFromWhere(enum.Enum):
    """Where a group with no committed offset starts (RocketMQ's names)."""

    CONSUME_FROM_LAST_OFFSET = "last"
    CONSUME_FROM_FIRST_OFFSET = "first"


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


@dataclass(frozen=True, slots=True, order=True)
class MessageQueue:
    """One queue of a topic on one store-node."""

    topic: str
    broker_name: str
    queue_id: int


@dataclass(slots=True)
class _Position:
    offset: int
    reset_epoch: int
    committed: int


class LitePullConsumer(Client):
    """Polls assigned queues through a pull-service; ``async with`` or
    :meth:`start` / :meth:`close` (close commits)."""

    def __init__(self, endpoints: str, *, config: LitePullConfig) -> None:
        super().__init__(endpoints)
        self.config = config
        self._positions: dict[MessageQueue, _Position] = {}
        self._addresses: dict[str, str] = {}

    async def close(self) -> None:
        try:
            if self._positions:
                await self.commit()
        finally:
            await super().close()

    # -- assignment -------------------------------------------------------------------

    async def queues_of(self, topic: str) -> list[MessageQueue]:
        """The topic's readable queues (QueryRoute); ClientError TOPIC_NOT_EXIST."""
        try:
            route = (await self._pull_service().QueryRoute(ps.QueryRouteRequest(topic=topic))).route
        except grpc.aio.AioRpcError as e:
            raise ClientError(response_code(e), e.details() or str(e.code())) from None
        brokers = {b.broker_name: b.address for b in route.broker_datas}
        self._addresses.update(brokers)
        return sorted(
            MessageQueue(topic, qd.broker_name, q)
            for qd in route.queue_datas
            if qd.broker_name in brokers and qd.perm & 4  # PermName.PERM_READ
            for q in range(qd.read_queue_nums)
        )

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
        subscription = pb.Subscription(
            type=pb.EXPRESSION_TYPE_SQL92 if self.config.sql92 else pb.EXPRESSION_TYPE_TAG,
            expression=self.config.subscription,
        )
        request = ps.PullBatchRequest(
            group=self.config.consumer_group,
            pulls=[
                ps.PullRequest(
                    queue=pb.MessageQueue(
                        topic=q.topic, broker_name=q.broker_name, queue_id=q.queue_id
                    ),
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
            records = [decode_record(raw) for raw in split_records(entry.records.data)]
            # OFFSET_ILLEGAL (the offset left the queue's range) moves on to the
            # corrected offset, as RocketMQ's consumers do.
            out.append((q, records, entry.next_begin_offset))
        return out

    async def commit(self) -> None:
        """Store every queue's position as the group's offset (those that moved)."""
        await asyncio.gather(
            *(self._commit(q, p) for q, p in self._positions.items() if p.offset != p.committed)
        )

    async def _commit(self, queue: MessageQueue, position: _Position) -> None:
        stub = sn_grpc.StoreNodeStub(self._channel(self._addresses[queue.broker_name]))
        offset = position.offset
        reply = await stub.UpdateConsumerOffset(
            sn.UpdateConsumerOffsetRequest(
                group=self.config.consumer_group,
                topic=queue.topic,
                queue_id=queue.queue_id,
                offset=offset,
                reset_epoch=position.reset_epoch,
            ),
            timeout=10,
        )
        if reply.commit.code == pb.RESPONSE_CODE_STALE_RESET_EPOCH:
            # Reset since we learned our offsets: adopt the reset, do not undo it.
            fresh = await self._start_position(queue)
            position.offset, position.reset_epoch = fresh.offset, fresh.reset_epoch
            position.committed = fresh.committed
            return
        position.committed = offset

    async def _start_position(self, queue: MessageQueue) -> _Position:
        stub = sn_grpc.StoreNodeStub(self._channel(self._addresses[queue.broker_name]))
        got = await stub.QueryConsumerOffset(
            sn.QueryConsumerOffsetRequest(
                group=self.config.consumer_group, topic=queue.topic, queue_id=queue.queue_id
            ),
            timeout=10,
        )
        if got.offset >= 0:
            return _Position(got.offset, got.reset_epoch, got.offset)
        bounds = await stub.GetMinMaxOffset(
            sn.GetMinMaxOffsetRequest(topic=queue.topic, queue_id=queue.queue_id), timeout=10
        )
        first = self.config.consume_from_where is ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET
        start = bounds.min_offset if first else bounds.max_offset
        return _Position(start, got.reset_epoch, -1)


__all__ = ["ConsumeFromWhere", "LitePullConfig", "LitePullConsumer", "MessageQueue"]
