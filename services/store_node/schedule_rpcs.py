"""Timers on the store-node (docs/timers.md): the send path's checks and recall
handles, and the RPCs RecallMessage and GetScheduleStatus.

Sends (:func:`timer_properties`, called by ``service._store_message``): a
message asks for a delivery time with ``Message.deliver_time_ms`` or one of
RocketMQ's properties (TIMER_DELIVER_MS, __STARTDELIVERTIME, TIMER_DELAY_SEC,
TIMER_DELAY_MS). The front resolves it to an absolute TIMER_DELIVER_MS (so the
handle it answers names the very time the store files the message under),
gives the message a UNIQ_KEY when it has none (the recall names it), and
refuses with INVALID_PARAMETER: a value that is not an integer, a time more
than the store's ``timer_max_delay_sec`` ahead, a timer together with a delay
level, a timer while the store's ``timer_wheel_enable`` is off. A batch of
producer-encoded records must not carry one (:func:`timer_record`: MESSAGE_ILLEGAL,
as for DELAY). Each parked message's SendResult carries a recall handle
(basalt.common.recall, RocketMQ 5.3's format).

RecallMessage: the handle must decode, name the request's topic (else
INVALID_ARGUMENT/INVALID_PARAMETER) and this broker; only the group's master
recalls (NOT_MASTER otherwise, as sends). A time already passed, or a
message the store does not hold pending: NOT_FOUND/QUERY_NOT_FOUND. RocketMQ
5.3 answers ILLEGAL_OPERATION ("timestamp invalid") for a past time and
SUCCESS for an unknown id (it writes the marker without looking); Basalt
looks (the message index) and says NOT_FOUND in both cases, so a caller
knows the message was not stopped.

A mixin of :class:`basalt.services.store_node.service.StoreNodeServicer`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import grpc

from basalt.common.message import (
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_TIMER_DELIVER_MS,
    PROPERTY_UNIQ_KEY,
    new_uniq_key,
)
from basalt.common.recall import RecallHandle, RecallHandleError
from basalt.common.record import batch_has_property
from basalt.services.errors import Refusal, invalid
from basalt.services.rpc import rpc_method as _rpc
from basalt.services.store_node.ha.gate import WriteGate
from basalt.store import MessageStore
from basalt.store.timer.park import TIMER_REQUEST_PROPERTIES, BadTimer, requested_deliver_ms
from basalt.v1 import common_pb2 as pb
from basalt.v1 import store_node_pb2 as sn

#: The most next due times GetScheduleStatus lists per topic.
MAX_NEXT_DUE = 1000
if TYPE_CHECKING:
    from basalt.services.store_node.service import StoreNodeConfig


def timer_properties(
    m: pb.Message, properties: dict[str, str], level: int, store: MessageStore
) -> int:
    """Resolve a send's timer in ``properties`` (changed in place; see the
    module's doc); returns its delivery time (Unix ms), 0 for none. Raises
    :class:`Refusal`."""
    now = int(time.time() * 1000)
    if m.deliver_time_ms < 0:
        raise invalid(f"deliver_time_ms {m.deliver_time_ms} is not a time in Unix ms")
    if m.deliver_time_ms:
        deliver = m.deliver_time_ms
    else:
        try:
            found = requested_deliver_ms(properties, now)
        except BadTimer as e:
            raise invalid(str(e)) from None
        if found is None:
            return 0
        deliver = found
    config = store.config
    if level > 0 or PROPERTY_DELAY_TIME_LEVEL in properties:
        raise invalid("a message asks for a delay level and a delivery time: one or the other")
    if not config.timer_wheel_enable:
        raise invalid("timer messages are disabled on this store-node (timer_wheel_enable)")
    if deliver - now > config.timer_max_delay_sec * 1000:
        raise invalid(
            f"delivery time {deliver} is {(deliver - now) // 1000} s ahead: at most "
            f"timer_max_delay_sec ({config.timer_max_delay_sec} s)"
        )
    for name in TIMER_REQUEST_PROPERTIES:
        properties.pop(name, None)
    properties[PROPERTY_TIMER_DELIVER_MS] = str(deliver)
    if not properties.get(PROPERTY_UNIQ_KEY):
        properties[PROPERTY_UNIQ_KEY] = new_uniq_key()
    return deliver


def recall_handle(topic: str, broker: str, deliver_ms: int, properties: dict[str, str]) -> str:
    """The recall handle of a message parked until ``deliver_ms`` ("" when it was
    due already: it is stored directly, nothing to recall)."""
    if deliver_ms <= int(time.time() * 1000):
        return ""
    return RecallHandle(topic, broker, deliver_ms, properties[PROPERTY_UNIQ_KEY]).encode()


def timer_record(records: bytes) -> bool:
    """Whether a record of a producer's batch asks for a timer."""
    return batch_has_property(records, *TIMER_REQUEST_PROPERTIES)


class ScheduleRpcs:
    """RecallMessage and GetScheduleStatus (see the module's doc)."""

    config: StoreNodeConfig
    store: MessageStore
    writable: bool
    group: WriteGate | None
    broker_perm: Callable[[], Any]

    @_rpc
    async def RecallMessage(
        self, request: sn.RecallMessageRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> sn.RecallMessageResponse:
        try:
            handle = RecallHandle.decode(request.recall_handle)
        except RecallHandleError as e:
            raise invalid(f"recall_handle: {e}") from None
        if handle.topic != request.topic:
            raise invalid(f"the recall handle is for topic {handle.topic!r}, not {request.topic!r}")
        broker = self.config.broker_name
        if handle.broker_name != broker:
            raise invalid(
                f"the recall handle is for broker {handle.broker_name!r}, this is {broker!r}"
            )
        if not self.writable:
            raise Refusal(pb.RESPONSE_CODE_SERVICE_NOT_AVAILABLE, "the store-node is stopping")
        if self.group is not None:
            self.group.check_writable()  # the marker is a write: only the master takes it
        now = int(time.time() * 1000)
        if handle.deliver_time_ms <= now:
            raise Refusal(
                pb.RESPONSE_CODE_QUERY_NOT_FOUND,
                f"message {handle.message_id} was due at {handle.deliver_time_ms}: "
                "already delivered, it cannot be recalled",
            )
        limit = self.store.config.timer_max_delay_sec * 1000
        if handle.deliver_time_ms - now > limit:
            raise invalid(
                f"the recall handle's time is past timer_max_delay_sec ({limit // 1000} s)"
            )
        found = await asyncio.to_thread(
            self.store.recall_timer, handle.topic, handle.deliver_time_ms, handle.message_id
        )
        if not found:
            raise Refusal(
                pb.RESPONSE_CODE_QUERY_NOT_FOUND,
                f"no pending timer message {handle.message_id} of topic {handle.topic!r} "
                f"due at {handle.deliver_time_ms}: delivered already, recalled, or unknown",
            )
        return sn.RecallMessageResponse(message_id=handle.message_id)

    @_rpc
    async def GetScheduleStatus(
        self, request: sn.GetScheduleStatusRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> sn.GetScheduleStatusResponse:
        if not 0 <= request.max_next_due <= MAX_NEXT_DUE:
            raise invalid(f"max_next_due {request.max_next_due} is not within 0..{MAX_NEXT_DUE}")
        store = self.store
        levels = await asyncio.to_thread(store.schedule.pending)
        timers = await asyncio.to_thread(
            store.timer_status, request.topic or None, request.max_next_due
        )
        delays = store.config.delay_levels_ms
        return sn.GetScheduleStatusResponse(
            levels=[
                sn.DelayLevelStatus(
                    level=level,
                    delay_ms=delays[level - 1],
                    pending=max(high - offset, 0),
                    next_due_ms=due or 0,
                )
                for level, offset, high, due in levels
            ],
            timer_topics=[
                sn.TimerTopicStatus(topic=t.topic, pending=t.pending, next_due_ms=t.next_due_ms)
                for t in timers.topics
            ],
            timer_pending=timers.pending,
            timer_read_ms=timers.scan_ms,
        )
