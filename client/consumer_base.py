"""What both consumers share: queues of a topic, reads, start positions and offset commits.

Consumers read each queue from its store-node (``StoreNode.GetMessages``, at
the address the topic's route gives), not through the pull-service, as
RocketMQ 4 clients and Kafka consumers fetch from the broker or leader: the
records cross one connection (one TLS hop, one copy) instead of two. The
store-node refuses exactly what the pull-service's ``Pull`` would (the
services share those checks), so the answer, a ``PullBatchResponse``, is the
one ``PullService.PullBatch`` would give. The pull-service keeps the rest: the
routes, the group's session, rebalance and queue locks.

A queue's position starts at the group's committed offset on its store-node
(``QueryConsumerOffset``), else where ``consume_from_where`` says; commits go
to the store-node (``UpdateConsumerOffset``) under the reset epoch learned
with the position, so a consumer that has not yet seen a reset cannot undo
it (the store-node answers STALE_RESET_EPOCH and stores nothing).
"""

from __future__ import annotations

import contextlib
import enum
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from basalt.client.channels import Client
from basalt.client.errors import ClientError
from basalt.common.auth import Credentials
from basalt.common.message import RETRY_GROUP_TOPIC_PREFIX, MessageRecord
from basalt.common.record import DamagedRecord, decode_records
from basalt.common.settings import (
    between,
    boolean,
    config_dataclass,
    non_empty,
    one_of,
    positive,
    setting,
    validate,
)
from basalt.common.tls import TlsConfig
from basalt.v1 import common_pb2 as pb
from basalt.v1 import pull_service_pb2 as ps
from basalt.v1 import store_node_pb2 as sn
from basalt.v1 import store_node_pb2_grpc as sn_grpc

log = logging.getLogger(__name__)

#: Deadline of the small unary calls a consumer makes to store-nodes.
CALL_TIMEOUT_S = 10.0
#: A read's deadline past the long poll it asks for.
PULL_DEADLINE_MARGIN_S = 10.0
#: Least time between two route lookups of one topic after failed reads
#: (:meth:`ConsumerClient.reroute`): a failover is seen within it, a dead node
#: costs the pull-service one QueryRoute per topic this often.
REROUTE_INTERVAL_S = 0.5


def default_client_id() -> str:
    """RocketMQ's ``ip@pid`` (host name here), made unique per consumer object."""
    return f"{socket.gethostname()}@{os.getpid()}@{uuid.uuid4().hex[:8]}"


class ConsumeFromWhere(enum.Enum):
    """Where a group with no committed offset starts (RocketMQ's names)."""

    CONSUME_FROM_LAST_OFFSET = "last"
    CONSUME_FROM_FIRST_OFFSET = "first"


@config_dataclass
class ConsumerConfig:
    """The settings every consumer has, by RocketMQ's names in snake_case.
    Validated at construction (its subclasses' fields too): ValueError names
    the first bad field."""

    consumer_group: str = setting(check=non_empty, doc="RocketMQ's consumerGroup.")
    client_id: str = setting(
        default_factory=default_client_id,
        check=non_empty,
        doc="The member's id in its group (RocketMQ's clientId); unique per consumer object.",
    )
    consume_from_where: ConsumeFromWhere = setting(
        default=ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET,
        check=one_of(*ConsumeFromWhere),
        doc="Where a group with no committed offset starts.",
    )
    pull_batch_size: int = setting(
        default=32,
        check=between(1, 1024),
        doc="Most records per queue per pull (RocketMQ's pullBatchSize).",
    )
    rebalance_interval_ms: int = setting(
        default=20_000,
        check=positive,
        doc="The periodic rebalance (RocketMQ's 20 s); subscribing consumers only.",
    )
    lock_retry_interval_ms: int = setting(
        default=200,
        check=positive,
        doc="How soon a queue still locked by its previous owner is tried again.",
    )
    check_crcs: bool = setting(
        default=True,
        check=boolean,
        doc="Check each record's checksum (Kafka's check.crcs): a damaged record is "
        "skipped, logged at ERROR and counted, never delivered.",
    )
    pull_time_delay_ms_when_exception: int = setting(
        default=100,
        check=positive,
        unit="ms",
        doc="The pause after a failed pull or session, doubling up to 30x this.",
    )

    def __post_init__(self) -> None:
        validate(self, ValueError)

    def retry_delay_s(self, failures: int) -> float:
        """The pause after the ``failures``-th failure in a row (>= 1), s: doubling
        from ``pull_time_delay_ms_when_exception``, capped at 30 times it (the
        exponent is capped too, so a long outage never overflows a float)."""
        base = self.pull_time_delay_ms_when_exception / 1000
        return float(min(base * 2 ** min(max(failures, 1) - 1, 5), 30 * base))


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
        self,
        endpoints: str,
        *,
        consumer_group: str,
        consume_from_where: ConsumeFromWhere,
        tls: TlsConfig | None = None,
        credentials: Credentials | None = None,
    ) -> None:
        super().__init__(endpoints, tls=tls, credentials=credentials)
        self.consumer_group = consumer_group
        self.consume_from_where = consume_from_where
        #: Store-node addresses by broker name, as the last routes gave them.
        self._addresses: dict[str, str] = {}
        #: When each topic's route was last asked again after a failed read.
        self._rerouted_at: dict[str, float] = {}
        #: Each broker's store-node stub and the channel it was made on.
        self._stubs: dict[str, tuple[grpc.aio.Channel, sn_grpc.StoreNodeAsyncStub]] = {}
        #: Records left out because their checksum failed (check.crcs): never
        #: delivered, each logged at ERROR and passed to :attr:`on_damaged_record`.
        self.damaged_records = 0
        #: Called with the queue and each damaged record, after it is logged
        #: (e.g. to record its offset for repair); must not raise.
        self.on_damaged_record: Callable[[MessageQueue, DamagedRecord], None] | None = None

    def _decode(
        self, queue: MessageQueue, data: bytes | memoryview, *, check_crcs: bool = True
    ) -> list[MessageRecord]:
        """The records of a read of ``queue``, checksums checked (``check_crcs``): a
        damaged record is left out, logged at ERROR, counted and reported;
        CorruptRecordError when the bytes are not records at all."""
        damaged: list[DamagedRecord] = []
        records = decode_records(data, check_crc=check_crcs, damaged=damaged)
        for d in damaged:
            self.damaged_records += 1
            log.error("%s: %s: %s", self.consumer_group, queue, d.describe())
            if self.on_damaged_record is not None:
                self.on_damaged_record(queue, d)
        return records

    async def queues_of(self, topic: str) -> list[MessageQueue]:
        """The topic's readable queues on registered, readable brokers, sorted
        (QueryRoute; RocketMQ's topicRouteData2TopicSubscribeInfo, with the
        broker's own perm as well as the topic's); ClientError TOPIC_NOT_EXIST."""
        try:
            route = (await self._pull_service().QueryRoute(ps.QueryRouteRequest(topic=topic))).route
        except grpc.aio.AioRpcError as e:
            raise ClientError.from_rpc_error(e, address=self.endpoints) from None
        self._addresses.update((b.broker_name, b.address) for b in route.broker_datas)
        readable = {b.broker_name for b in route.broker_datas if b.perm & pb.PERM_READ}
        return sorted(
            MessageQueue(topic, qd.broker_name, q)
            for qd in route.queue_datas
            if qd.broker_name in readable and qd.perm & pb.PERM_READ
            for q in range(qd.read_queue_nums)
        )

    async def check_subscription(
        self, queue: MessageQueue, expression: str, *, sql92: bool
    ) -> None:
        """Raise :class:`basalt.client.errors.SubscriptionError` (naming the
        position) unless the pull-service accepts the subscription, asked
        before any fetch, so a bad expression is one error, not one per queue.

        The SDK has no SQL92 parser of its own (it never depends on the
        engine): the pull-service's, which checks a Pull's subscription
        before it reads, decides. The probe is a Pull of ``queue``'s first
        record that commits nothing; a record it returns is dropped. Any
        other refusal raises its own ClientError."""
        try:
            await self._pull_service().Pull(
                ps.PullRequest(
                    group=self.consumer_group,
                    queue=queue.to_proto(),
                    offset=0,
                    max_nums=1,
                    subscription=subscription_of(expression, sql92),
                ),
                timeout=CALL_TIMEOUT_S,
            )
        except grpc.aio.AioRpcError as e:
            raise ClientError.from_rpc_error(e, address=self.endpoints) from None

    async def brokers_by_store_host(self) -> dict[str, str]:
        """The broker name of each store host the records carry
        (``MessageRecord.store_host``), for the store-nodes the routes asked so
        far named (GetRuntimeInfo). A record names its store-node only by that
        host, which need not be the address a route gives (a node may listen
        on a wildcard); a node that does not answer, and a host two nodes
        claim (misconfigured), are left out."""
        claims: dict[str, set[str]] = {}
        for broker, address in sorted(self._addresses.items()):
            stub = sn_grpc.StoreNodeStub(self._channel(address))
            try:
                info = await stub.GetRuntimeInfo(sn.GetRuntimeInfoRequest(), timeout=CALL_TIMEOUT_S)
            except grpc.aio.AioRpcError:
                continue
            claims.setdefault(info.store_host, set()).add(broker)
        return {host: names.pop() for host, names in claims.items() if len(names) == 1}

    async def reroute(self, topic: str) -> None:
        """Ask ``topic``'s route again after a read of its store-node failed: a
        broker group that failed over has a new master, whose address the
        route now gives (docs/replication.md), so the next read goes there at
        once rather than at the next rebalance. At most every
        :data:`REROUTE_INTERVAL_S` per topic; a failure to ask is left to the
        next read."""
        now = time.monotonic()
        if now - self._rerouted_at.get(topic, -REROUTE_INTERVAL_S) < REROUTE_INTERVAL_S:
            return
        self._rerouted_at[topic] = now
        with contextlib.suppress(ClientError):
            await self.queues_of(topic)

    def _store_node(self, queue: MessageQueue) -> sn_grpc.StoreNodeAsyncStub:
        return self._store_node_stub(queue.broker_name)

    def _store_node_address(self, broker_name: str) -> str:
        """The address the last route gave for ``broker_name`` ("" if none did)."""
        return self._addresses.get(broker_name, "")

    def _store_node_stub(self, broker_name: str) -> sn_grpc.StoreNodeAsyncStub:
        """The stub of ``broker_name``'s store-node, kept per channel: a stub makes
        a callable per method of the service (~23 µs here), too much for every call."""
        channel = self._channel(self._addresses[broker_name])
        kept = self._stubs.get(broker_name)
        if kept is None or kept[0] is not channel:
            kept = self._stubs[broker_name] = (channel, sn_grpc.StoreNodeStub(channel))
        return kept[1]

    def _read_request(
        self, queue: MessageQueue, offset: int, max_nums: int, subscription: pb.Subscription
    ) -> sn.GetMessageRequest:
        """The group's read of up to ``max_nums`` records of ``queue`` from ``offset``."""
        return sn.GetMessageRequest(
            group=self.consumer_group,
            topic=queue.topic,
            queue_id=queue.queue_id,
            offset=offset,
            max_msg_nums=max_nums,
            subscription=subscription,
        )

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
        # A retry topic is read from its start (RocketMQ's computePullFromWhere):
        # what it holds was given back by this group and waits for it.
        first = (
            self.consume_from_where is ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET
            or queue.topic.startswith(RETRY_GROUP_TOPIC_PREFIX)
        )
        return Position(bounds.min_offset if first else bounds.max_offset, got.reset_epoch, -1)

    async def _send_back(
        self,
        queue: MessageQueue,
        record: MessageRecord,
        *,
        delay_level: int,
        max_reconsume_times: int,
    ) -> sn.ConsumerSendMsgBackResponse:
        """Give ``record``, read from ``queue``, back to its store-node
        (``ConsumerSendMsgBack``, docs/retry.md): it comes again from the group's
        retry topic after ``delay_level`` (0: the broker's ``3 + reconsume
        times``), or goes to the group's dead-letter topic (``delay_level < 0``,
        or reconsumed ``max_reconsume_times`` times already). Raises
        grpc.aio.AioRpcError when it was not stored."""
        return await self._store_node(queue).ConsumerSendMsgBack(
            sn.ConsumerSendMsgBackRequest(
                group=self.consumer_group,
                offset_msg_id=record.msg_id,
                origin_topic=queue.topic,
                delay_level=delay_level,
                max_reconsume_times=max_reconsume_times,
            ),
            timeout=CALL_TIMEOUT_S,
        )

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
