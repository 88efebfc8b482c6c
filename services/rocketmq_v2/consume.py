"""Consumption through the v2 front: ReceiveMessage, AckMessage,
ChangeInvisibleDuration, ForwardMessageToDeadLetterQueue, QueryAssignment.

Pop-and-ack over the store-nodes' pop state (docs/pop.md): the front keeps
nothing, every delivery's receipt handle names its store-node, so any front
routes its ack. What RocketMQ 5's proxy does, mapped:

* ``ReceiveMessage`` pops the topic's readable queues on the broker of the
  request's ``message_queue`` (all its queues: RocketMQ's pop mode, queue id
  -1), or on every live broker when it names none, with the request's filter,
  batch size and invisible duration (``auto_renew``, a PushConsumer: the
  front's ``rocketmq_v2_push_invisible_ms``; Basalt does not renew, so a
  listener slower than that sees its message again), long polling for the
  request's ``long_polling_timeout`` cut to the client's deadline less a
  margin. The stream: a Status (OK, or MESSAGE_NOT_FOUND when nothing came),
  the messages, a delivery timestamp.
* **Dead letters.** A popped message whose ``delivery_attempt`` exceeds the
  group's max attempts (``rocketmq_v2_consumer_max_attempts``, told to the
  clients in Telemetry's backoff policy) is written to ``%DLQ%<group>``
  (created on its store-node as RocketMQ auto-creates it, one queue) and
  acked, not delivered: RocketMQ's proxy filter (PopMessageResultFilter
  TO_DLQ). ``ForwardMessageToDeadLetterQueue`` does the same for one handle.
* **FIFO.** A group named in ``rocketmq_v2_fifo_groups`` is FIFO (Basalt has
  no subscription-group store): Telemetry answers ``fifo`` and pops pass the
  store-node's ``fifo`` flag (a queue's next message waits while one is in
  flight).
* ``AckMessage`` / ``ChangeInvisibleDuration``: a handle that does not
  decode, is stale, or names another topic or broker is
  INVALID_RECEIPT_HANDLE (RocketMQ's proxy answer for each).
* ``PullMessage`` (offset-based): :mod:`.pulls`.
* ``QueryAssignment``: one assignment per live broker whose queues are
  readable, queue id -1 (every queue of the broker: pop is shared by the
  group's clients, so every client is assigned every broker, as RocketMQ 5's
  proxy answers in pop mode).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING, Any

import grpc

from basalt.common.message import (
    PROPERTY_UNIQ_KEY,
    Message,
    MessageRecord,
    dead_letter,
    dlq_topic,
)
from basalt.common.receipt import ReceiptHandle, ReceiptHandleError
from basalt.common.record import CorruptRecordError, DamagedRecord, decode_records
from basalt.rocketmq.v2 import definition_pb2 as v2
from basalt.rocketmq.v2 import service_pb2 as sv
from basalt.services.errors import Refusal
from basalt.services.meta.errors import MetaError
from basalt.services.meta.model import TopicConfig
from basalt.services.pull_service.metrics import damaged_records
from basalt.services.rocketmq_v2.conversions import (
    ACCEPTED_MESSAGE_TYPES,
    StoreQueue,
    V2Error,
    endpoints_of,
    entries_status,
    group_name,
    ok_status,
    readable_brokers,
    to_v2_message,
)
from basalt.services.rocketmq_v2.store_calls import StoreCalls, local_error
from basalt.services.validation import (
    INVISIBLE_DURATION,
    POLLING_TIME,
    LimitError,
    Rule,
    check_invisible_ms,
    duration_ms,
)
from basalt.store.pop import AckStatus
from basalt.v1 import common_pb2 as pb
from basalt.v1 import store_node_pb2 as sn

if TYPE_CHECKING:
    from basalt.services.rocketmq_v2.call_batching import Coalescer
    from basalt.services.rocketmq_v2.service import RocketMQv2Config

#: Most messages one receive delivers (a larger batch_size is cut to it: one
#: answer stays well under the gRPC message limit).
MAX_BATCH = 32
#: Most queues one PopMessages names (the store-node's default
#: max_queues_per_get_messages).
_MAX_QUEUES_PER_POP = 32
#: Taken off the client's deadline before long polling: the answer must reach
#: the client before it gives up.
_DEADLINE_MARGIN_S = 1.0
#: How long a dead letter waits for its topic to reach the store-node.
_DLQ_TOPIC_WAIT_S = 5.0

_FILTER_TYPE = {
    v2.FILTER_TYPE_UNSPECIFIED: pb.EXPRESSION_TYPE_TAG,
    v2.TAG: pb.EXPRESSION_TYPE_TAG,
    v2.SQL: pb.EXPRESSION_TYPE_SQL92,
}


def poll_ms_of(
    request: sv.ReceiveMessageRequest | sv.PullMessageRequest,
    context: grpc.aio.ServicerContext[Any, Any],
) -> int:
    """How long a receive or pull may be held: its ``long_polling_timeout``, cut
    to the client's deadline less a margin (the answer must reach the client
    before it gives up); V2Error ILLEGAL_POLLING_TIME when negative."""
    poll_ms = 0
    if request.HasField("long_polling_timeout"):
        poll_ms = limited(
            duration_ms, request.long_polling_timeout, "long_polling_timeout",
            POLLING_TIME,
        )  # fmt: skip
        if poll_ms < 0:
            raise V2Error(v2.ILLEGAL_POLLING_TIME, f"long_polling_timeout {poll_ms} ms < 0")
    remaining = context.time_remaining()
    if remaining is not None:
        poll_ms = max(0, min(poll_ms, int((remaining - _DEADLINE_MARGIN_S) * 1000)))
    return poll_ms


def subscription_of(expression: v2.FilterExpression) -> pb.Subscription:
    """The store-node's subscription of a v2 filter (TAG when unspecified, ``*``
    when empty)."""
    return pb.Subscription(
        type=_FILTER_TYPE.get(expression.type, pb.EXPRESSION_TYPE_TAG),
        expression=expression.expression or "*",
    )


def limited(read: Callable[[Any, str, Rule], int], value: Any, field: str, rule: Rule) -> int:
    """``read(value, field, rule)`` (a basalt.services.validation reader); its
    LimitError as a V2Error with the rule's code."""
    try:
        return read(value, field, rule)
    except LimitError as e:
        raise V2Error(e.v2_code, e.message) from None


def _invisible_ms(duration: Any, *, minimum_ms: int) -> int:
    """An ``invisible_duration`` in ms; V2Error ILLEGAL_INVISIBLE_TIME when it is
    not a valid Duration or not within ``minimum_ms`` .. 12 h (the table in
    basalt.services.validation)."""
    ms = limited(duration_ms, duration, "invisible_duration", INVISIBLE_DURATION)
    try:
        return check_invisible_ms(ms, "invisible_duration", minimum_ms=minimum_ms)
    except LimitError as e:
        raise V2Error(e.v2_code, e.message) from None


def _handle(text: str, topic: str, config: TopicConfig | None) -> ReceiptHandle:
    """The decoded handle of a delivery of ``topic`` (``config``: the topic's,
    None when it has none); V2Error INVALID_RECEIPT_HANDLE when it does not
    decode, is another topic's or names a broker the topic is not on (a forged
    or mangled handle: no store-node to ask), TOPIC_NOT_FOUND for an unknown
    topic."""
    try:
        handle = ReceiptHandle.decode(text)
    except ReceiptHandleError as e:
        raise V2Error(v2.INVALID_RECEIPT_HANDLE, str(e)) from None
    if handle.topic != topic:
        raise V2Error(
            v2.INVALID_RECEIPT_HANDLE, f"the receipt handle is not topic {topic[:200]!r}'s"
        )
    if config is None:
        raise V2Error(v2.TOPIC_NOT_FOUND, f"topic {topic[:200]!r} not found")
    if handle.broker_name not in config.brokers:
        raise V2Error(
            v2.INVALID_RECEIPT_HANDLE,
            f"the receipt handle names broker {handle.broker_name[:80]!r}, "
            f"which topic {topic[:200]!r} is not on",
        )
    return handle


def _ack_code(status: int) -> int:
    return v2.OK if status == sn.POP_ACK_STATUS_OK else v2.INVALID_RECEIPT_HANDLE


class ConsumeRpcs(StoreCalls):
    """The consumption RPCs (module docstring); a mixin of
    :class:`basalt.services.rocketmq_v2.service.MessagingServiceServicer`."""

    config: RocketMQv2Config
    _acks: Coalescer[tuple[str, str, str], str, int]

    if TYPE_CHECKING:  # MessagingServiceServicer's

        async def _store(
            self,
            topic: str,
            queue: StoreQueue,
            messages: list[Message],
            ids: list[str],
            context: grpc.aio.ServicerContext[Any, Any],
        ) -> pb.SendResult: ...

    def _topic(self, topic: str) -> TopicConfig | None:
        return self.host.topics.get(topic)

    def _broker_perms(self, config: TopicConfig) -> dict[str, int]:
        """PermName bits of the topic's registered (live) brokers."""
        return {
            name: int(broker.perm)
            for name in config.brokers
            if (broker := self.host.brokers.get(name)) is not None
        }

    def _broker_fronts(self, config: TopicConfig) -> dict[str, v2.Endpoints] | None:
        """Each of the topic's brokers' own front (a store-node's), where it has
        one, for routes and assignments to name; None in a pull-service's front
        (every queue is served at the access point the client called)."""
        fronts = self.host.fronts
        if fronts is None:
            return None
        return {
            name: endpoints_of(endpoint)
            for name in config.brokers
            if (endpoint := fronts.endpoint_of(name)) is not None
        }

    def is_fifo(self, group: str) -> bool:
        """Whether ``group`` is a FIFO group (``rocketmq_v2_fifo_groups``)."""
        return group in self.config.fifo_groups()

    # -- receive ------------------------------------------------------------------------

    async def ReceiveMessage(
        self, request: sv.ReceiveMessageRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[sv.ReceiveMessageResponse]:
        try:
            messages = await self._receive(request, context)
        except V2Error as e:
            yield sv.ReceiveMessageResponse(status=e.status())
            return
        if not messages:
            status = v2.Status(code=v2.MESSAGE_NOT_FOUND, message="no new message")
            yield sv.ReceiveMessageResponse(status=status)
            return
        yield sv.ReceiveMessageResponse(status=ok_status())
        for message in messages:
            yield sv.ReceiveMessageResponse(message=message)
        now = sv.ReceiveMessageResponse()
        now.delivery_timestamp.GetCurrentTime()
        yield now

    async def _receive(
        self, request: sv.ReceiveMessageRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> list[v2.Message]:
        """The checked request's deliveries (dead letters taken out); V2Error
        for a refusal."""
        group = group_name(request.group)
        topic = request.message_queue.topic
        config = self.host.topics.get(topic.name)
        if config is None:
            raise V2Error(v2.TOPIC_NOT_FOUND, f"topic {topic.name!r} not found")
        if request.batch_size < 1:
            raise V2Error(v2.BAD_REQUEST, f"batch_size {request.batch_size} < 1")
        if request.auto_renew:
            invisible_ms = self.config.rocketmq_v2_push_invisible_ms
        else:
            if not request.HasField("invisible_duration"):
                raise V2Error(v2.ILLEGAL_INVISIBLE_TIME, "a receive needs an invisible_duration")
            invisible_ms = _invisible_ms(request.invisible_duration, minimum_ms=1000)
        poll_ms = poll_ms_of(request, context)
        subscription = subscription_of(request.filter_expression)
        wanted = request.message_queue.broker.name
        brokers = [
            name
            for name in readable_brokers(config, self._broker_perms(config))
            if not wanted or name == wanted
        ]
        if not brokers:
            raise V2Error(v2.FORBIDDEN, f"topic {topic.name!r} has no readable queue here")
        batch = min(request.batch_size, MAX_BATCH)
        ids = list(range(config.read_queue_nums))
        chunks = [
            (name, ids[start : start + _MAX_QUEUES_PER_POP])
            for name in brokers
            for start in range(0, len(ids), _MAX_QUEUES_PER_POP)
        ]

        def pop(name: str, queue_ids: list[int], room: int, hold_ms: int) -> sn.PopMessagesRequest:
            return sn.PopMessagesRequest(
                group=group, topic=config.topic_name, queue_ids=queue_ids, max_messages=room,
                invisible_duration_ms=invisible_ms, subscription=subscription,
                poll_timeout_ms=hold_ms, fifo=self.is_fifo(group),
            )  # fmt: skip

        # One pop (broker, <= 32 queues) to make: it is the held one. Several:
        # each pops without holding; when nothing came, the receive waits on all
        # of them at once (wait_only holds, which pop nothing) and pops them all
        # again when one answers, until something comes or the time is up.
        single = len(chunks) == 1
        out: list[v2.Message] = []
        while True:
            for name, queue_ids in chunks:
                if len(out) >= batch:
                    return out
                hold_ms = poll_ms if single else 0
                queue = StoreQueue(name, queue_ids[0])
                popped: sn.PopMessagesResponse = await self._call(
                    queue, self._address(queue), "PopMessages",
                    pop(name, queue_ids, batch - len(out), hold_ms), context, hold_ms / 1000,
                )  # fmt: skip
                out += await self._deliveries(group, popped.messages, invisible_ms, topic, context)
            if out or single:
                return out
            hold_ms = poll_ms_of(request, context)
            if hold_ms <= 0:
                return out
            holds = [
                (StoreQueue(name, queue_ids[0]), pop(name, queue_ids, 1, hold_ms))
                for name, queue_ids in chunks
            ]
            for _, hold in holds:
                hold.wait_only = True
            await self._wait_any(holds, hold_ms, context)

    async def _wait_any(
        self,
        holds: list[tuple[StoreQueue, sn.PopMessagesRequest]],
        hold_ms: int,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> None:
        """Hold ``wait_only`` pops on every store-node and queue chunk of a
        receive at once, until the first answers (something may be deliverable
        there, or its time is up); the others are then cancelled, which drops
        nothing: they pop nothing. A message arriving on any of them wakes the
        receive, not only one arriving where its last pop was held. V2Error
        when the first to end failed."""
        calls = [
            self._start(queue, self._address(queue), "PopMessages", hold, context, hold_ms / 1000)
            for queue, hold in holds
        ]
        waits = [asyncio.ensure_future(call.answer()) for call in calls]
        try:
            done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for call in calls:
                call.cancel()
            # Every wait is over before the receive goes on (none left pending).
            ended = await asyncio.gather(*waits, return_exceptions=True)
        for wait, result in zip(waits, ended, strict=True):
            if wait in done and isinstance(result, V2Error):
                raise result

    async def _deliveries(
        self,
        group: str,
        popped: Sequence[sn.PoppedMessage],
        invisible_ms: int,
        topic: v2.Resource,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> list[v2.Message]:
        """The v2 messages of popped deliveries (dead letters taken out)."""
        out: list[v2.Message] = []
        for m in popped:
            delivered = await self._delivery(group, m, invisible_ms, topic, context)
            if delivered is not None:
                out.append(delivered)
        return out

    async def _delivery(
        self,
        group: str,
        popped: sn.PoppedMessage,
        invisible_ms: int,
        topic: v2.Resource,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> v2.Message | None:
        """The v2 message of one popped delivery; None when it went to the
        dead-letter topic instead (past the max attempts), or because its
        checksum failed: a damaged record is never delivered; it is logged at
        ERROR, counted (``basalt.pull.records.damaged``) and acked, so that it
        does not come back at every pop. V2Error INTERNAL_SERVER_ERROR for a
        record that does not decode (the receive's deliveries stay in flight
        and come again: nothing is dropped)."""
        damaged: list[DamagedRecord] = []
        try:
            records = decode_records(popped.record, damaged=damaged)
            record = records[0] if records else None
        except CorruptRecordError as e:
            raise V2Error(v2.INTERNAL_SERVER_ERROR, f"stored record does not decode: {e}") from None
        if record is None:  # its topic may be what was damaged: the handle's is the store's
            try:  # the store-node's own handle: nothing to check it against
                handle = ReceiptHandle.decode(popped.receipt_handle)
            except ReceiptHandleError as e:
                raise V2Error(v2.INTERNAL_SERVER_ERROR, f"popped handle: {e}") from None
            damaged_records("ReceiveMessage", handle.broker_name, damaged)
            await self._ack_on(group, handle.topic, handle.broker_name, [handle.encode()], context)
            return None
        if popped.delivery_attempt > self.config.rocketmq_v2_consumer_max_attempts:
            handle = _handle(popped.receipt_handle, record.topic, self._topic(record.topic))
            await self._dead_letter(group, handle, record, context)
            return None
        return to_v2_message(
            record,
            namespace=topic.resource_namespace,
            queue_id=popped.queue_id,
            delivery_attempt=popped.delivery_attempt,
            receipt_handle=popped.receipt_handle,
            invisible_ms=invisible_ms,
        )

    # -- dead letters -------------------------------------------------------------------

    async def _dead_letter(
        self,
        group: str,
        handle: ReceiptHandle,
        record: MessageRecord,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> None:
        """Write ``record``'s copy to ``%DLQ%<group>`` on the handle's store-node
        (creating the topic), then ack the delivery. The write comes first: a
        crash between the two redelivers the message (and may dead-letter it
        twice), never loses it."""
        topic = dlq_topic(group)
        queue = StoreQueue(handle.broker_name, 0)
        known = self.host.topics.get(topic)
        if known is None or handle.broker_name not in known.brokers:
            try:
                await self.host.meta.ensure_topic(
                    topic, broker=handle.broker_name, default_queue_nums=1
                )
            except MetaError as e:
                raise V2Error(
                    v2.INTERNAL_SERVER_ERROR, f"cannot create dead-letter topic {topic!r}: {e}"
                ) from None
        message = dead_letter(record, group)
        uniq = message.properties.get(PROPERTY_UNIQ_KEY) or record.msg_id
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _DLQ_TOPIC_WAIT_S
        while True:
            try:
                await self._store(topic, queue, [message], [uniq], context)
                break
            except V2Error as e:
                # The store-node learns of the new topic through its etcd watch.
                if e.code != v2.TOPIC_NOT_FOUND or loop.time() > deadline:
                    raise
                await asyncio.sleep(0.1)
        await self._ack_on(group, record.topic, handle.broker_name, [handle.encode()], context)

    async def ForwardMessageToDeadLetterQueue(
        self,
        request: sv.ForwardMessageToDeadLetterQueueRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> sv.ForwardMessageToDeadLetterQueueResponse:
        """Dead-letter one delivery now (a FIFO PushConsumer past its local
        retries): its record is read again by the handle's queue offset."""
        try:
            group = group_name(request.group)
            handle = _handle(
                request.receipt_handle, request.topic.name, self._topic(request.topic.name)
            )
            queue = StoreQueue(handle.broker_name, handle.queue_id)
            get = sn.GetMessageRequest(
                group=group, topic=handle.topic, queue_id=handle.queue_id,
                offset=handle.queue_offset, max_msg_nums=1,
            )  # fmt: skip
            got: sn.GetMessageResponse = await self._call(
                queue, self._address(queue), "GetMessage", get, context
            )
            damaged: list[DamagedRecord] = []
            decoded = decode_records(got.records.data, damaged=damaged)
            damaged_records("ForwardMessageToDeadLetterQueue", handle.broker_name, damaged)
            records = [r for r in decoded if r.queue_offset == handle.queue_offset]
            if not records:
                raise V2Error(v2.MESSAGE_NOT_FOUND, "the message is no longer stored")
            await self._dead_letter(group, handle, records[0], context)
        except V2Error as e:
            return sv.ForwardMessageToDeadLetterQueueResponse(status=e.status())
        return sv.ForwardMessageToDeadLetterQueueResponse(status=ok_status())

    # -- acks ---------------------------------------------------------------------------

    async def _ack_on(
        self,
        group: str,
        topic: str,
        broker: str,
        handles: list[str],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> list[int]:
        """AckMessages of ``handles`` on ``broker``: one v2 code per handle
        (joined with concurrent acks of the group's on that broker: the
        official clients ack one message per AckMessage)."""
        return await self._acks.submit((group, topic, broker), handles, context)

    async def _ack_decoded(
        self,
        group: str,
        topic: str,
        broker: str,
        decoded: list[tuple[int, ReceiptHandle]],
        texts: list[str],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> list[int]:
        """An AckMessage's checked handles of ``broker`` (entry index, handle;
        ``texts``: every entry's handle as sent) acked: the store-node this
        front runs in takes them decoded (its pop work joins concurrent calls'
        acks); another gets them in an AckMessages joined with concurrent acks
        of the group (:meth:`_ack_on`). One v2 code each."""
        local = self._local(broker)
        if local is None:
            return await self._ack_on(group, topic, broker, [texts[i] for i, _ in decoded], context)
        try:
            statuses = await local.ack(group, topic, [h for _, h in decoded])
        except Refusal as r:
            raise local_error(r, local) from None
        return [v2.OK if s is AckStatus.OK else v2.INVALID_RECEIPT_HANDLE for s in statuses]

    async def _ack_joined(
        self,
        key: tuple[str, str, str],
        handles: list[str],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> list[int]:
        """One AckMessages of the joined requests' handles (``_acks``)."""
        group, topic, broker = key
        queue = StoreQueue(broker, 0)
        request = sn.AckMessagesRequest(group=group, topic=topic, receipt_handles=handles)
        done: sn.AckMessagesResponse = await self._call(
            queue, self._address(queue), "AckMessages", request, context
        )
        return [_ack_code(r.status) for r in done.results]

    async def AckMessage(
        self, request: sv.AckMessageRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> sv.AckMessageResponse:
        try:
            group = group_name(request.group)
            if not request.entries:
                raise V2Error(v2.BAD_REQUEST, "AckMessage without entries")
            codes: list[v2.Status | None] = [None] * len(request.entries)
            config = self._topic(request.topic.name)
            by_broker: dict[str, list[tuple[int, ReceiptHandle]]] = {}
            texts = [e.receipt_handle for e in request.entries]
            for i, entry in enumerate(request.entries):
                try:
                    handle = _handle(entry.receipt_handle, request.topic.name, config)
                except V2Error as e:
                    codes[i] = e.status()
                    continue
                by_broker.setdefault(handle.broker_name, []).append((i, handle))
            for broker, decoded in by_broker.items():
                indices = [i for i, _ in decoded]
                acked = await self._ack_decoded(
                    group, request.topic.name, broker, decoded, texts, context
                )
                for i, code in zip(indices, acked, strict=True):
                    codes[i] = ok_status() if code == v2.OK else v2.Status(
                        code=v2.INVALID_RECEIPT_HANDLE,
                        message="the receipt handle is stale, acked or not this topic's",
                    )  # fmt: skip
        except V2Error as e:
            return sv.AckMessageResponse(status=e.status())
        entries = [
            sv.AckMessageResultEntry(
                message_id=entry.message_id, receipt_handle=entry.receipt_handle, status=status
            )
            for entry, status in zip(request.entries, codes, strict=True)
            if status is not None
        ]
        return sv.AckMessageResponse(status=entries_status(entries), entries=entries)

    async def ChangeInvisibleDuration(
        self,
        request: sv.ChangeInvisibleDurationRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> sv.ChangeInvisibleDurationResponse:
        try:
            group = group_name(request.group)
            handle = _handle(
                request.receipt_handle, request.topic.name, self._topic(request.topic.name)
            )
            ms = _invisible_ms(request.invisible_duration, minimum_ms=0)
            queue = StoreQueue(handle.broker_name, handle.queue_id)
            change = sn.ChangeInvisibleDurationRequest(
                group=group, topic=request.topic.name,
                receipt_handle=request.receipt_handle, invisible_duration_ms=ms,
            )  # fmt: skip
            done: sn.ChangeInvisibleDurationResponse = await self._call(
                queue, self._address(queue), "ChangeInvisibleDuration", change, context
            )
        except V2Error as e:
            return sv.ChangeInvisibleDurationResponse(status=e.status())
        if done.status != sn.POP_ACK_STATUS_OK:
            return sv.ChangeInvisibleDurationResponse(
                status=V2Error(
                    v2.INVALID_RECEIPT_HANDLE,
                    "the receipt handle is stale, acked or not this topic's",
                ).status()
            )
        return sv.ChangeInvisibleDurationResponse(
            status=ok_status(), receipt_handle=done.receipt_handle
        )

    # -- assignment ---------------------------------------------------------------------

    async def QueryAssignment(
        self, request: sv.QueryAssignmentRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> sv.QueryAssignmentResponse:
        try:
            group_name(request.group)
        except V2Error as e:
            return sv.QueryAssignmentResponse(status=e.status())
        config = self.host.topics.get(request.topic.name)
        if config is None:
            return sv.QueryAssignmentResponse(
                status=V2Error(
                    v2.TOPIC_NOT_FOUND, f"topic {request.topic.name!r} not found"
                ).status()
            )
        own = self._broker_fronts(config) or {}
        assignments = [
            v2.Assignment(
                message_queue=v2.MessageQueue(
                    topic=request.topic,
                    id=-1,
                    permission=v2.READ,
                    broker=v2.Broker(name=name, id=0, endpoints=own.get(name, request.endpoints)),
                    accept_message_types=ACCEPTED_MESSAGE_TYPES,
                )
            )
            for name in readable_brokers(config, self._broker_perms(config))
        ]
        return sv.QueryAssignmentResponse(status=ok_status(), assignments=assignments)
