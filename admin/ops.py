"""The operator's operations (mqadmin's), over etcd and the store-nodes.

Each function takes a connected :class:`basalt.services.meta.MetaClient` (topic
configs and registrations) and reaches store-nodes over gRPC at their
registered addresses; it returns plain rows for :mod:`basalt.admin.verbs` to print
and :mod:`basalt.admin.service` to answer. Topic config writes are in
:mod:`basalt.admin.topics`. Errors (:mod:`basalt.admin.errors`): an unknown topic is
``basalt.services.meta.TopicNotFoundError``; a store-node that is not registered,
BrokerNotRegisteredError; a store-node or pull-service that failed a call,
PeerCallError naming it; anything else that cannot be done, AdminError; etcd
being away surfaces as ``basalt.services.meta.MetaUnavailableError``.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import time
from collections.abc import AsyncIterator, Awaitable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import grpc
from opentelemetry import trace

from basalt.admin.errors import AdminError, BrokerNotRegisteredError, PeerCallError
from basalt.admin.topics import TopicChange, topic_config, update_topic
from basalt.common import dial
from basalt.common.message import MessageRecord, parse_offset_msg_id
from basalt.common.record import decode_record, split_records, store_timestamp_at
from basalt.common.status import response_code_of
from basalt.common.tls import TlsConfig
from basalt.services.meta import BrokerRegistration, TopicConfig
from basalt.v1 import common_pb2 as pb
from basalt.v1 import pull_service_pb2 as ps
from basalt.v1 import pull_service_pb2_grpc as ps_grpc
from basalt.v1 import store_node_pb2 as sn
from basalt.v1 import store_node_pb2_grpc as sn_grpc

if TYPE_CHECKING:
    # etcd's client: the server extra. What the admin service's callers use
    # (ResetOutcome, parse_timestamp) imports without it (basalt.admin.extras).
    from basalt.services.meta import MetaClient

T = TypeVar("T")

#: The group name admin reads with (reads never commit).
ADMIN_GROUP = "basalt-admin"
CALL_TIMEOUT_S = 5.0

#: The API's proxy: it binds to whatever TracerProvider the process installs.
_tracer = trace.get_tracer("basalt.admin")


@dataclass(frozen=True, slots=True)
class QueueStatus:
    """topicStatus' row: one queue on one store-node."""

    broker_name: str
    queue_id: int
    min_offset: int
    max_offset: int
    last_update_timestamp_ms: int


@dataclass(frozen=True, slots=True)
class QueueProgress:
    """consumerProgress' row: a group's position in one queue."""

    topic: str
    broker_name: str
    queue_id: int
    broker_offset: int
    consumer_offset: int

    @property
    def lag(self) -> int:
        return max(0, self.broker_offset - max(self.consumer_offset, 0))


async def topic_status(meta: MetaClient, topic: str) -> list[QueueStatus]:
    """mqadmin topicStatus: every read queue's min, max and last store time."""
    config = await topic_config(meta, topic)
    brokers = await meta.list_brokers()
    rows: list[QueueStatus] = []
    for name in config.brokers:
        async with _store_node(meta.tls, brokers, name) as stub:
            rows += await asyncio.gather(
                *(_queue_status(stub, name, topic, q) for q in range(config.read_queue_nums))
            )
    return rows


async def _queue_status(
    stub: sn_grpc.StoreNodeAsyncStub, broker: str, topic: str, queue_id: int
) -> QueueStatus:
    bounds = await queue_bounds(stub, broker, topic, queue_id)
    last = 0
    if bounds.max_offset > bounds.min_offset:
        got = await read_queue_at(stub, broker, topic, queue_id, bounds.max_offset - 1, 1)
        if got.records.data:
            last = store_timestamp_at(got.records.data)
    return QueueStatus(broker, queue_id, bounds.min_offset, bounds.max_offset, last)


async def consumer_progress(
    meta: MetaClient, group: str, topic: str | None = None, *, missing_ok: bool = False
) -> list[QueueProgress]:
    """mqadmin consumerProgress: per queue, the broker's max offset, the group's
    committed offset and the lag; every topic the group has offsets in when
    ``topic`` is None."""
    topics = (
        [await topic_config(meta, topic)] if topic else list((await meta.list_topics()).values())
    )
    brokers = await meta.list_brokers()
    rows: list[QueueProgress] = []
    for config in topics:
        for name in config.brokers:
            async with _store_node(meta.tls, brokers, name) as stub:
                rows += await asyncio.gather(
                    *(
                        _progress(stub, name, group, config.topic_name, q)
                        for q in range(config.read_queue_nums)
                    )
                )
    if topic is None:
        touched = {r.topic for r in rows if r.consumer_offset >= 0}
        rows = [r for r in rows if r.topic in touched]
    if not rows and not missing_ok:
        raise AdminError(
            f"consumer group {group!r} has no offsets" + (f" in {topic!r}" if topic else "")
        )
    return rows


async def _progress(
    stub: sn_grpc.StoreNodeAsyncStub, broker: str, group: str, topic: str, queue_id: int
) -> QueueProgress:
    bounds = await queue_bounds(stub, broker, topic, queue_id)
    committed = await committed_offset(stub, broker, group, topic, queue_id)
    return QueueProgress(topic, broker, queue_id, bounds.max_offset, committed)


async def cluster_list(
    meta: MetaClient,
) -> list[tuple[BrokerRegistration, sn.GetRuntimeInfoResponse | None]]:
    """mqadmin clusterList: every registered store-node and its runtime info
    (None when it did not answer)."""
    brokers = await meta.list_brokers()

    async def info(name: str) -> sn.GetRuntimeInfoResponse | None:
        async with _store_node(meta.tls, brokers, name) as stub:
            try:
                return await stub.GetRuntimeInfo(sn.GetRuntimeInfoRequest(), timeout=CALL_TIMEOUT_S)
            except grpc.aio.AioRpcError:
                return None

    ordered = [brokers[name] for name in sorted(brokers)]
    infos = await asyncio.gather(*(info(b.broker_name) for b in ordered))
    return list(zip(ordered, infos, strict=True))


@contextlib.asynccontextmanager
async def _store_node(
    tls: TlsConfig | None, brokers: dict[str, BrokerRegistration], name: str
) -> AsyncIterator[sn_grpc.StoreNodeAsyncStub]:
    """A stub of registered store-node ``name`` (BrokerNotRegisteredError when it
    is not), on a channel of its own for the block (TLS when ``tls`` is enabled)."""
    broker = brokers.get(name)
    if broker is None:
        raise BrokerNotRegisteredError((name,), f"store-node {name!r} is not registered (down?)")
    async with dial.channel(broker.address, tls) as channel:
        yield sn_grpc.StoreNodeStub(channel)


async def _pull_service_address(meta: MetaClient) -> str | None:
    """A registered pull-service (any: ListConsumers and NotifyConsumers are
    cluster-wide), None when there is none."""
    services = await meta.list_pull_services()
    return services[min(services)].address if services else None


async def _call(broker: str, call: Awaitable[T]) -> T:
    """``call``'s answer; its failure as a PeerCallError naming the store-node."""
    try:
        return await call
    except grpc.aio.AioRpcError as e:
        raise _peer_error(f"store-node {broker!r}", e) from None


def _peer_error(peer: str, e: grpc.aio.AioRpcError) -> PeerCallError:
    return PeerCallError(peer, e.code(), response_code_of(e), e.details() or "")


# The store-node calls the verbs make of one queue (each failure a PeerCallError).


async def queue_bounds(
    stub: sn_grpc.StoreNodeAsyncStub, broker: str, topic: str, queue_id: int
) -> sn.GetMinMaxOffsetResponse:
    """The queue's min and max offsets on ``broker``."""
    return await _call(
        broker,
        stub.GetMinMaxOffset(
            sn.GetMinMaxOffsetRequest(topic=topic, queue_id=queue_id), timeout=CALL_TIMEOUT_S
        ),
    )


async def committed_offset(
    stub: sn_grpc.StoreNodeAsyncStub, broker: str, group: str, topic: str, queue_id: int
) -> int:
    """``group``'s committed offset of the queue on ``broker``."""
    committed = await _call(
        broker,
        stub.QueryConsumerOffset(
            sn.QueryConsumerOffsetRequest(group=group, topic=topic, queue_id=queue_id),
            timeout=CALL_TIMEOUT_S,
        ),
    )
    return committed.offset


async def read_queue_at(
    stub: sn_grpc.StoreNodeAsyncStub, broker: str, topic: str, queue_id: int, offset: int, n: int
) -> sn.GetMessageResponse:
    """Up to ``n`` of the queue's records from ``offset`` (as :data:`ADMIN_GROUP`,
    which commits nothing)."""
    return await _call(
        broker,
        stub.GetMessage(
            sn.GetMessageRequest(
                group=ADMIN_GROUP, topic=topic, queue_id=queue_id, offset=offset, max_msg_nums=n
            ),
            timeout=CALL_TIMEOUT_S,
        ),
    )


# -- reset offset by time (RocketMQ's ResetOffsetByTimeCommand) ----------------------

#: mqadmin's date format for -s, yyyy-MM-dd#HH:mm:ss:SSS, local time.
DATE_FORMAT = "%Y-%m-%d#%H:%M:%S:%f"


def parse_timestamp(text: str, *, now_ms: int | None = None) -> int:
    """mqadmin resetOffsetByTime's ``-s``: ``now``, milliseconds (-1: the max
    offset) or ``yyyy-MM-dd#HH:mm:ss:SSS`` in local time. AdminError otherwise."""
    text = text.strip()
    if text == "now":
        return now_ms if now_ms is not None else int(time.time() * 1000)
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return int(datetime.datetime.strptime(text, DATE_FORMAT).timestamp() * 1000)
    except ValueError:
        raise AdminError(
            f"timestamp {text!r} is not now, milliseconds or yyyy-MM-dd#HH:mm:ss:SSS"
        ) from None


@dataclass(frozen=True, slots=True)
class ResetOutcome:
    """What a reset did: the merged table of the store-nodes that succeeded,
    the ones that failed (by name, with why), and the consumers' answers.
    ``acks`` is None when no consumer was told: the group had no live
    consumer (the offline path: the store-nodes' offsets are all there is),
    or a store-node failed (the table is partial; see ``failed``)."""

    offsets: list[pb.QueueOffset]
    failed: dict[str, Exception]
    acks: list[ps.ConsumerAck] | None
    command_id: str = ""


async def reset_offset_by_time(
    meta: MetaClient,
    group: str,
    topic: str,
    timestamp_ms: int,
    *,
    force: bool = True,
    ack_timeout_ms: int = 5000,
) -> ResetOutcome:
    """The reset of docs/admin.md#resetoffsetbytime: ``ResetOffset`` on every store-node hosting the
    topic at once (a deadline each), the tables merged, then RESET_OFFSET to
    the group's live consumers through a pull-service, waiting up to
    ``ack_timeout_ms`` for their acks.

    A store-node that fails is named in ``failed`` (BrokerNotRegisteredError
    or PeerCallError) and then no consumer is told: a consumer adopting a
    partial table would mix reset and unreset queues. What succeeded stays
    reset, and running the same reset again is safe (it recomputes the same
    offsets). Raises TopicNotFoundError for an unknown topic, PeerCallError
    when the pull-service fails the notification.

    Traced: one span "resetOffsetByTime", with a child per store-node call
    ("ResetOffset <broker>") and one for the notification ("NotifyConsumers
    <group>"); gRPC metadata carries the trace on from each."""
    with _tracer.start_as_current_span(
        "resetOffsetByTime",
        attributes={
            "messaging.system": "rocketmq",
            "messaging.consumer.group.name": group,
            "messaging.destination.name": topic,
            "basalt.reset.timestamp_ms": timestamp_ms,
        },
    ) as span:
        outcome = await _reset_offset_by_time(
            meta, group, topic, timestamp_ms, force=force, ack_timeout_ms=ack_timeout_ms
        )
        if outcome.failed:
            span.set_status(trace.StatusCode.ERROR, f"failed on {sorted(outcome.failed)}")
        return outcome


async def _reset_offset_by_time(
    meta: MetaClient,
    group: str,
    topic: str,
    timestamp_ms: int,
    *,
    force: bool,
    ack_timeout_ms: int,
) -> ResetOutcome:
    config = await topic_config(meta, topic)
    brokers = await meta.list_brokers()

    async def reset(name: str) -> sn.ResetOffsetResponse:
        with _tracer.start_as_current_span(
            f"ResetOffset {name}", attributes={"basalt.broker.name": name}
        ):
            return await reset_on(name)

    async def reset_on(name: str) -> sn.ResetOffsetResponse:
        async with _store_node(meta.tls, brokers, name) as stub:
            return await _call(
                name,
                stub.ResetOffset(
                    sn.ResetOffsetRequest(
                        topic=topic, group=group, timestamp_ms=timestamp_ms, force=force
                    ),
                    timeout=CALL_TIMEOUT_S,
                ),
            )

    answers = await asyncio.gather(*(reset(n) for n in config.brokers), return_exceptions=True)
    offsets: list[pb.QueueOffset] = []
    failed: dict[str, Exception] = {}
    for name, answer in zip(config.brokers, answers, strict=True):
        if isinstance(answer, Exception):
            failed[name] = answer
            continue
        if isinstance(answer, BaseException):  # cancelled: not a store-node's failure
            raise answer
        offsets += [
            pb.QueueOffset(
                queue=pb.MessageQueue(topic=topic, broker_name=name, queue_id=q),
                offset=offset,
                reset_epoch=answer.reset_epoch,
            )
            for q, offset in sorted(answer.offsets.items())
        ]
    if failed or not offsets:
        return ResetOutcome(offsets, failed, None)
    with _tracer.start_as_current_span(f"NotifyConsumers {group}"):
        acks, command_id = await _notify_reset(meta, group, topic, offsets, ack_timeout_ms)
    return ResetOutcome(offsets, failed, acks, command_id)


async def _notify_reset(
    meta: MetaClient, group: str, topic: str, offsets: list[pb.QueueOffset], ack_timeout_ms: int
) -> tuple[list[ps.ConsumerAck] | None, str]:
    """RESET_OFFSET to the group's consumers; (None, "") when none is live."""
    address = await _pull_service_address(meta)
    if address is None:
        if await meta.list_consumers(group):
            raise PeerCallError.unreachable(
                "pull-service", "none is registered, and the group has live consumers to tell"
            )
        return None, ""
    command = ps.Command(
        timeout_ms=ack_timeout_ms,
        reset_offset=ps.ResetOffsetCommand(topic=topic, offsets=offsets),
    )
    async with dial.channel(address, meta.tls) as channel:
        try:
            reply = await ps_grpc.PullServiceStub(channel).NotifyConsumers(
                ps.NotifyConsumersRequest(group=group, command=command),
                timeout=ack_timeout_ms / 1000 + CALL_TIMEOUT_S,
            )
        except grpc.aio.AioRpcError as e:
            if response_code_of(e) == pb.RESPONSE_CODE_CONSUMER_NOT_ONLINE:
                return None, ""  # RocketMQ's offline path: the brokers' reset is all
            raise _peer_error(f"pull-service at {address}", e) from None
    return list(reply.acks), reply.command_id


# -- consumers, messages, one store-node ------------------------------------------------


async def consumer_connection(meta: MetaClient, group: str) -> list[pb.ConsumerInfo]:
    """mqadmin consumerConnection: the group's live consumers, cluster-wide
    (through a pull-service); AdminError when none is live."""
    address = await _pull_service_address(meta)
    if address is None:
        raise AdminError("no pull-service is registered")
    async with dial.channel(address, meta.tls) as channel:
        try:
            reply = await ps_grpc.PullServiceStub(channel).ListConsumers(
                ps.ListConsumersRequest(group=group), timeout=CALL_TIMEOUT_S
            )
        except grpc.aio.AioRpcError as e:
            raise AdminError(e.details() or e.code().name) from None
    return list(reply.consumers)


async def query_msg_by_key(
    meta: MetaClient, topic: str, key: str, max_num: int = 64
) -> list[tuple[str, MessageRecord]]:
    """mqadmin queryMsgByKey: the topic's messages with ``key`` (KEYS or
    UNIQ_KEY) on every store-node hosting it, as (broker, record)."""
    config = await topic_config(meta, topic)
    brokers = await meta.list_brokers()
    out: list[tuple[str, MessageRecord]] = []
    for name in config.brokers:
        async with _store_node(meta.tls, brokers, name) as stub:
            got = await _call(
                name,
                stub.QueryMessage(
                    sn.QueryMessageRequest(topic=topic, key=key, max_num=max_num),
                    timeout=CALL_TIMEOUT_S,
                ),
            )
        out += [(name, decode_record(raw)) for raw in split_records(got.records.data)]
    return out


async def query_msg_by_id(
    meta: MetaClient, msg_id: str, topic: str | None = None
) -> list[tuple[str, MessageRecord]]:
    """mqadmin queryMsgById: the message ``msg_id`` names, as (broker, record) rows.

    Either id a send returns works, as in RocketMQ's DefaultMQAdminExt.viewMessage:
    an offset message id (``offsetMsgId``: store host and commit log offset) is
    read from the store-node whose store host it carries; any other id is taken
    for the client's message id (UNIQ_KEY, what ``basalt produce`` prints as
    ``msgId``) and looked up in the index of ``topic`` (every topic when None),
    which may give more than one row (a send retried after a lost reply). Both
    are 32 hex digits, so an id whose store host no store-node has is tried as
    a UNIQ_KEY too. Raises AdminError naming which id to give when neither
    finds it.
    """
    try:
        host, _ = parse_offset_msg_id(msg_id)
    except ValueError:
        raise AdminError(
            f"{msg_id!r} is not an offset message id nor a message id (UNIQ_KEY): "
            "both are the hex ids a send returns"
        ) from None
    brokers = await meta.list_brokers()
    for name in sorted(brokers):
        async with _store_node(meta.tls, brokers, name) as stub:
            try:
                info = await stub.GetRuntimeInfo(sn.GetRuntimeInfoRequest(), timeout=CALL_TIMEOUT_S)
                if info.store_host != host:
                    continue
                got = await stub.ViewMessage(
                    sn.ViewMessageRequest(offset_msg_id=msg_id), timeout=CALL_TIMEOUT_S
                )
            except grpc.aio.AioRpcError as e:
                raise AdminError(f"store-node {name!r}: {e.details() or e.code().name}") from None
            return [(name, decode_record(got.records.data))]
    names = [topic] if topic else sorted(await meta.list_topics())
    found: list[tuple[str, MessageRecord]] = []
    for name in names:
        found += [
            (broker, r)
            for broker, r in await query_msg_by_key(meta, name, msg_id)
            if r.uniq_key == msg_id
        ]
    if found:
        return found
    where = f"topic {topic!r}" if topic else "any topic"
    raise AdminError(
        f"no message {msg_id}: no registered store-node writes as {host} (the store host an "
        f"offset message id carries), and no message of {where} has it as its message id "
        "(UNIQ_KEY); give the msgId or offsetMsgId a send printed (-t TOPIC narrows a msgId)"
    )


async def broker_status(meta: MetaClient, broker_name: str) -> sn.GetRuntimeInfoResponse:
    """mqadmin brokerStatus: one store-node's runtime info."""
    async with _store_node(meta.tls, await meta.list_brokers(), broker_name) as stub:
        return await _call(
            broker_name,
            stub.GetRuntimeInfo(sn.GetRuntimeInfoRequest(), timeout=CALL_TIMEOUT_S),
        )


# -- changing a topic's queue count safely (RocketMQ's read and write queue counts) ----


async def subscribed_groups(meta: MetaClient, topic: str) -> set[str]:
    """The groups with a live consumer subscribed to ``topic``."""
    return {
        r.group
        for r in (await meta.list_all_consumers()).values()
        if any(s.topic == topic for s in r.subscriptions)
    }


async def undrained(
    meta: MetaClient, config: TopicConfig, first_queue: int, groups: set[str]
) -> list[QueueProgress]:
    """The queues ``first_queue <= q < read_queue_nums`` some of ``groups`` has
    not consumed to the end yet."""
    rows: list[QueueProgress] = []
    for group in sorted(groups):
        progress = await consumer_progress(meta, group, config.topic_name, missing_ok=True)
        rows += [r for r in progress if r.queue_id >= first_queue and r.lag > 0]
    return rows


async def change_queue_nums(
    meta: MetaClient,
    topic: str,
    queue_nums: int,
    *,
    wait_s: float = 0.0,
    groups: Sequence[str] = (),
    poll_s: float = 0.5,
) -> list[str]:
    """mqadmin's queue-count change done safely; the steps taken, as lines.

    Growing: read then write (a queue is read before anything can be written
    to it, so no consumer starting at its last offset skips what lands there).
    Shrinking: write first; read only once every group that consumes the
    topic - its live subscribers, and ``groups`` (offline ones) - has
    consumed the removed queues to their end, waiting up to ``wait_s`` for
    that. Until then read stays, and the removed queues are still pulled: no
    message is stranded in a queue no consumer reads."""
    if queue_nums < 1:
        raise AdminError(f"queue count {queue_nums} must be at least 1")
    config = await topic_config(meta, topic)
    steps: list[str] = []
    if queue_nums > config.read_queue_nums:
        config = (await update_topic(meta, topic, TopicChange(read_queue_nums=queue_nums))).config
        steps.append(f"read_queue_nums -> {queue_nums}")
    if queue_nums != config.write_queue_nums:
        config = (await update_topic(meta, topic, TopicChange(write_queue_nums=queue_nums))).config
        steps.append(f"write_queue_nums -> {queue_nums}")
    if queue_nums >= config.read_queue_nums:
        return steps or [f"already {queue_nums} read and write queues"]
    consumers = set(groups) | await subscribed_groups(meta, topic)
    if not consumers and all(
        q.min_offset == q.max_offset
        for q in await topic_status(meta, topic)
        if q.queue_id >= queue_nums
    ):
        # Nobody reads it, and the removed queues hold nothing: nothing to strand.
        await update_topic(meta, topic, TopicChange(read_queue_nums=queue_nums))
        steps.append(f"queues >= {queue_nums} hold no message")
        steps.append(f"read_queue_nums -> {queue_nums}")
        return steps
    if not consumers:
        raise AdminError(
            f"no live consumer subscribes to {topic!r}: name the groups that read it "
            f"(-g) before its read queues go, e.g. basalt admin shrinkTopic -t {topic} "
            f"-n {queue_nums} -g GROUP --wait-s 60; write_queue_nums is {queue_nums} now"
        )
    deadline = time.monotonic() + wait_s
    while left := await undrained(meta, config, queue_nums, consumers):
        if time.monotonic() >= deadline:
            behind = ", ".join(f"{r.topic}/{r.broker_name}/{r.queue_id}" for r in left[:8])
            steps.append(
                f"read_queue_nums stays {config.read_queue_nums}: not drained yet ({behind}); "
                "run it again, with a longer --wait-s, to finish"
            )
            return steps
        await asyncio.sleep(poll_s)
    await update_topic(meta, topic, TopicChange(read_queue_nums=queue_nums))
    steps.append(f"queues >= {queue_nums} drained by {', '.join(sorted(consumers))}")
    steps.append(f"read_queue_nums -> {queue_nums}")
    return steps
