"""Timer and transactional sends, ``RecallMessage`` and ``EndTransaction``.

* **Timers.** A v2 message with a ``delivery_timestamp`` (type DELAY) is sent
  alone as a store-node ``Message`` with ``deliver_time_ms``
  (:meth:`TransactionRpcs._send_one`): the store-node refuses a batch of
  records carrying a timer, as RocketMQ refuses a delayed batch. The entry's
  ``recall_handle`` is the store-node's own (RocketMQ 5.3's format, naming
  topic and broker: :mod:`basalt.common.recall`); a time past the store-node's
  ``timer_max_delay_sec`` is its INVALID_PARAMETER, answered
  ILLEGAL_DELIVERY_TIME (RocketMQ 5's proxy code for it).
* **Recall.** ``RecallMessage`` decodes the handle and calls
  ``StoreNode.RecallMessage`` on the broker it names; a handle that does not
  decode, is another topic's or names a broker the topic is not on:
  BAD_REQUEST; a message already delivered: the store-node's answer
  (MESSAGE_NOT_FOUND for its QUERY_NOT_FOUND).
* **Transactions.** A TRANSACTION message is sent alone too, with the half
  message's properties (:mod:`.conversions`: TRAN_MSG, PGROUP = the topic);
  the entry's ``transaction_id`` names the broker and the half's offset
  message id (:class:`.handles.TransactionId`), so ``EndTransaction`` (from
  the client, source SOURCE_CLIENT, or its checker, SOURCE_SERVER_CHECK:
  ``from_check``) reaches the store-node holding the half through any
  pull-service. Bad ids (empty, not decoding, another topic's) are
  INVALID_TRANSACTION_ID; so is the store-node's refusal of an id it does
  not hold (a half already resolved, a wrong message id).

A mixin of :class:`basalt.services.rocketmq_v2.service.MessagingServiceServicer`.
"""

from __future__ import annotations

from typing import Any

import grpc

from basalt.common.message import Message
from basalt.common.recall import RecallHandle, RecallHandleError
from basalt.rocketmq.v2 import definition_pb2 as v2
from basalt.rocketmq.v2 import service_pb2 as sv
from basalt.services.rocketmq_v2.conversions import (
    CODE_OF_SEND_STATUS,
    StoreQueue,
    V2Error,
    ok_status,
    to_wire,
)
from basalt.services.rocketmq_v2.handles import HandleError, TransactionId
from basalt.services.rocketmq_v2.store_calls import StoreCalls
from basalt.v1 import common_pb2 as pb
from basalt.v1 import store_node_pb2 as sn

#: A timer send's store-node refusals in v2 terms, where they differ from the
#: general table: INVALID_PARAMETER is a delivery time past the maximum.
_TIMER_CODES: dict[int, int] = {pb.RESPONSE_CODE_INVALID_PARAMETER: v2.ILLEGAL_DELIVERY_TIME}
#: EndTransaction's: the store-node holds no such half (resolved already, a
#: wrong message id, an id of another producer group).
_END_CODES: dict[int, int] = {
    pb.RESPONSE_CODE_INVALID_PARAMETER: v2.INVALID_TRANSACTION_ID,
    pb.RESPONSE_CODE_MESSAGE_ILLEGAL: v2.INVALID_TRANSACTION_ID,
    pb.RESPONSE_CODE_QUERY_NOT_FOUND: v2.INVALID_TRANSACTION_ID,
}
_RESOLUTIONS = {
    v2.COMMIT: sn.TRANSACTION_RESOLUTION_COMMIT,
    v2.ROLLBACK: sn.TRANSACTION_RESOLUTION_ROLLBACK,
}


class TransactionRpcs(StoreCalls):
    """The module docstring's RPCs and sends; a mixin of the servicer."""

    async def _send_one(
        self,
        queue: StoreQueue,
        message: Message,
        message_id: str,
        deliver_ms: int,
        transactional: bool,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> sv.SendResultEntry:
        """Store one timer (``deliver_ms`` > 0) or half (``transactional``)
        message in ``queue`` (the module docstring); its entry, or V2Error."""
        request = sn.SendMessageRequest(
            message=to_wire(message, deliver_ms), queue_id=queue.queue_id
        )
        response: sn.SendMessageResponse = await self._call(
            queue, self._address(queue), "SendMessage", request, context,
            codes=_TIMER_CODES if deliver_ms else None,
        )  # fmt: skip
        result = response.result
        code = v2.Code.ValueType(CODE_OF_SEND_STATUS.get(result.status, v2.INTERNAL_ERROR))
        entry = sv.SendResultEntry(
            status=v2.Status(code=code, message=v2.Code.Name(code)),
            message_id=message_id,
            offset=result.queue_offsets[0] if result.queue_offsets else 0,
        )
        if deliver_ms and result.recall_handles:
            entry.recall_handle = result.recall_handles[0]
        if transactional:
            if not result.offset_msg_ids:
                raise V2Error(
                    v2.INTERNAL_SERVER_ERROR,
                    f"store-node {queue.broker_name!r} answered no offset message id",
                )
            entry.transaction_id = TransactionId(
                queue.broker_name, message.topic, result.offset_msg_ids[0]
            ).encode()
        return entry

    async def RecallMessage(
        self, request: sv.RecallMessageRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> sv.RecallMessageResponse:
        try:
            topic = request.topic.name
            try:
                handle = RecallHandle.decode(request.recall_handle)
            except RecallHandleError as e:
                raise V2Error(v2.BAD_REQUEST, f"recall_handle: {e}") from None
            if handle.topic != topic:
                raise V2Error(
                    v2.BAD_REQUEST, f"the recall handle is of topic {handle.topic!r}, not {topic!r}"
                )
            config = self.host.topics.get(topic)
            if config is None:
                raise V2Error(v2.TOPIC_NOT_FOUND, f"topic {topic!r} not found")
            if handle.broker_name not in config.brokers:
                raise V2Error(
                    v2.BAD_REQUEST,
                    f"the recall handle names broker {handle.broker_name!r}, which topic "
                    f"{topic!r} is not on",
                )
            queue = StoreQueue(handle.broker_name, 0)
            done: sn.RecallMessageResponse = await self._call(
                queue, self._address(queue), "RecallMessage",
                sn.RecallMessageRequest(topic=topic, recall_handle=request.recall_handle),
                context,
            )  # fmt: skip
        except V2Error as e:
            return sv.RecallMessageResponse(status=e.status())
        return sv.RecallMessageResponse(status=ok_status(), message_id=done.message_id)

    async def EndTransaction(
        self, request: sv.EndTransactionRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> sv.EndTransactionResponse:
        try:
            await self._end_transaction(request, context)
        except V2Error as e:
            return sv.EndTransactionResponse(status=e.status())
        return sv.EndTransactionResponse(status=ok_status())

    async def _end_transaction(
        self, request: sv.EndTransactionRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> None:
        topic = request.topic.name
        if not request.transaction_id:
            raise V2Error(v2.INVALID_TRANSACTION_ID, "no transaction_id")
        try:
            tid = TransactionId.decode(request.transaction_id)
        except HandleError as e:
            raise V2Error(v2.INVALID_TRANSACTION_ID, str(e)) from None
        if tid.topic != topic:
            raise V2Error(
                v2.INVALID_TRANSACTION_ID,
                f"the transaction id is of topic {tid.topic!r}, not {topic!r}",
            )
        resolution = _RESOLUTIONS.get(request.resolution)
        if resolution is None:
            raise V2Error(
                v2.BAD_REQUEST, f"resolution {request.resolution}: COMMIT (1) or ROLLBACK (2)"
            )
        if self.host.topics.get(topic) is None:
            raise V2Error(v2.TOPIC_NOT_FOUND, f"topic {topic!r} not found")
        queue = StoreQueue(tid.broker_name, 0)
        end = sn.EndTransactionRequest(
            producer_group=topic,  # the group the half was sent with (PGROUP)
            offset_msg_id=tid.offset_msg_id,
            transaction_id=request.message_id,
            resolution=resolution,
            from_check=request.source == v2.SOURCE_SERVER_CHECK,
        )
        await self._call(
            queue, self._address(queue), "EndTransaction", end, context, codes=_END_CODES
        )
