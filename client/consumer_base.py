"""What both consumers share: queues of a topic, start positions and offset commits.

A queue's position starts at the group's committed offset on its store-node
(``QueryConsumerOffset``), else where ``consume_from_where`` says; commits go
to the store-node (``UpdateConsumerOffset``) under the reset epoch learned
with the position, so a consumer that has not yet seen a reset cannot undo
it (the store-node answers STALE_RESET_EPOCH and stores nothing).
"""

from __future__ import annotations

import enum
import os
import socket
import uuid
from dataclasses import dataclass, field

import grpc
from basalt.client.channels import Client
from basalt.client.errors import ClientError

from basalt.v1 import common_pb2 as pb
from basalt.v1 import pull_service_pb2 as ps
from basalt.v1 import store_node_pb2 as sn
from basalt.v1 import store_node_pb2_grpc as sn_grpc

#: Deadline of the small unary calls a consumer makes to store-nodes.
CALL_TIMEOUT_S = 10.0


def default_client_id() -> str:
    """RocketMQ's ``ip@pid`` (host name here), made unique per consumer object."""
    return f"{socket.gethostname()}@{os.getpid()}@{uuid.uuid4().hex[:8]}"


class ConsumeFromWhere(enum.Enum):
    """Where a group with no committed offset starts (RocketMQ's names)."""

    CONSUME_FROM_LAST_OFFSET = "last"
    CONSUME_FROM_FIRST_OFFSET = "first"


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerConfig:
    """The settings every consumer has, by RocketMQ's names in snake_case."""

    consumer_group: str
    #: The member's id in its group (RocketMQ's clientId).
    client_id: str = field(default_factory=default_client_id)
    consume_from_where: ConsumeFromWhere = ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET
    #: Most records per queue per pull (RocketMQ's pullBatchSize).
    pull_batch_size: int = 32
    #: The periodic rebalance (RocketMQ's 20 s); subscribing consumers only.
    rebalance_interval_ms: int = 20_000
    #: How soon a queue still locked by its previous owner is tried again.
    lock_retry_interval_ms: int = 200
    #: The pause after a failed pull or session, doubling up to 30x this.
    pull_time_delay_ms_when_exception: int = 100

    def __post_init__(self) -> None:
        if not self.consumer_group:
            raise ValueError("consumer_group must not be empty")
        if not self.client_id:
            raise ValueError("client_id must not be empty")
        if not 1 <= self.pull_batch_size <= 1024:
            raise ValueError(f"pull_batch_size {self.pull_batch_size} is not within 1..1024")
        self.check_positive(
            "rebalance_interval_ms", "lock_retry_interval_ms", "pull_time_delay_ms_when_exception"
        )

    def retry_delay_s(self, failures: int) -> float:
        """The pause after the ``failures``-th failure in a row (>= 1), s: doubling
        from ``pull_time_delay_ms_when_exception``, capped at 30 times it (the
        exponent is capped too, so a long outage never overflows a float)."""
        base = self.pull_time_delay_ms_when_exception / 1000
        return float(min(base * 2 ** min(max(failures, 1) - 1, 5), 30 * base))

    def check_positive(self, *names: str) -> None:
        """ValueError naming the first of ``names`` that is not >= 1."""
        for name in names:
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")


@dataclass(frozen=True, slots=True, order=True)
class MessageQueue:
    """One queue of a topic on one store-node."""

    topic: str
    broker_name: str
    queue_id: int

    def to_proto(self) -> pb.MessageQueue:
        return pb.MessageQueue(
            topic=self.topic, broker_name=self.broker_name, queue_id=self.queue_id
        )

    @classmethod
    def of(cls, queue: pb.MessageQueue) -> MessageQueue:
        return cls(queue.topic, queue.broker_name, queue.queue_id)


@dataclass(slots=True)
class Position:
    """Where a queue is read from, the reset epoch it was learned under, and the
    offset last stored for the group (-1: none)."""

    offset: int
    reset_epoch: int
    committed: int


def subscription_of(expression: str, sql92: bool) -> pb.Subscription:
    """A TAG expression (``*``, ``a || b``) or, with ``sql92``, an SQL92 filter."""
    return pb.Subscription(
        type=pb.EXPRESSION_TYPE_SQL92 if sql92 else pb.EXPRESSION_TYPE_TAG, expression=expression
    )


class ConsumerClient(Client):
    """A :class:`Client` of one consumer group."""

    def __init__(
        self, endpoints: str, *, consumer_group: str, consume_from_where: ConsumeFromWhere
    ) -> None:
        super().__init__(endpoints)
        self.consumer_group = consumer_group
        self.consume_from_where = consume_from_where
        #: Store-node addresses by broker name, as the last routes gave them.
        self._addresses: dict[str, str] = {}

    async def queues_of(self, topic: str) -> list[MessageQueue]:
        """The topic's readable queues, sorted (QueryRoute); ClientError TOPIC_NOT_EXIST."""
        try:
            route = (await self._pull_service().QueryRoute(ps.QueryRouteRequest(topic=topic))).route
        except grpc.aio.AioRpcError as e:
            raise ClientError.from_rpc_error(e) from None
        brokers = {b.broker_name: b.address for b in route.broker_datas}
        self._addresses.update(brokers)
        return sorted(
            MessageQueue(topic, qd.broker_name, q)
            for qd in route.queue_datas
            if qd.broker_name in brokers and qd.perm & pb.PERM_READ
            for q in range(qd.read_queue_nums)
        )

    def _store_node(self, queue: MessageQueue) -> sn_grpc.StoreNodeAsyncStub:
        return sn_grpc.StoreNodeStub(self._channel(self._addresses[queue.broker_name]))

    async def _start_position(self, queue: MessageQueue) -> Position:
        """The group's committed position of ``queue``, else by ``consume_from_where``."""
        stub = self._store_node(queue)
        got = await stub.QueryConsumerOffset(
            sn.QueryConsumerOffsetRequest(
                group=self.consumer_group, topic=queue.topic, queue_id=queue.queue_id
            ),
            timeout=CALL_TIMEOUT_S,
        )
        if got.offset >= 0:
            return Position(got.offset, got.reset_epoch, got.offset)
        bounds = await stub.GetMinMaxOffset(
            sn.GetMinMaxOffsetRequest(topic=queue.topic, queue_id=queue.queue_id),
            timeout=CALL_TIMEOUT_S,
        )
        first = self.consume_from_where is ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET
        return Position(bounds.min_offset if first else bounds.max_offset, got.reset_epoch, -1)

    async def _store_offset(self, queue: MessageQueue, offset: int, reset_epoch: int) -> bool:
        """Store ``offset`` as the group's offset of ``queue``, fenced by
        ``reset_epoch``; False when a reset since then refused it."""
        reply = await self._store_node(queue).UpdateConsumerOffset(
            sn.UpdateConsumerOffsetRequest(
                group=self.consumer_group,
                topic=queue.topic,
                queue_id=queue.queue_id,
                offset=offset,
                reset_epoch=reset_epoch,
            ),
            timeout=CALL_TIMEOUT_S,
        )
        return reply.commit.code != pb.RESPONSE_CODE_STALE_RESET_EPOCH
