"""ConsumerSendMsgBack: a consumer group gives a message back (docs/retry.md).

RocketMQ 4's ``consumerSendMsgBack`` (its broker's AbstractSendMessageProcessor):
the record named by its offset message id is read from this store and a copy
stored (:func:`basalt.common.message.send_back_copy` makes it):

* to ``%RETRY%<group>`` after delay level ``3 + reconsume times`` (or the
  request's level; the store clamps a level past its last), parked in
  ``SCHEDULE_TOPIC_XXXX`` until due (docs/scheduled.md), so the group's
  consumers, which subscribe to their retry topic, get it again then;
* to ``%DLQ%<group>`` at once when it was reconsumed ``max_reconsume_times``
  times already (0 or less in the request: RocketMQ's default, 16) or the request's
  level is negative: the consumer's last word.

Either topic is created in etcd when missing, with one queue served by this
broker (RocketMQ's retryQueueNums and DLQ_NUMS_PER_GROUP), whatever
``auto_create_topic_enable`` says: a broker always creates them. Only a
writable master takes a send-back (the checks of a send: NOT_MASTER names
the master). Refused, nothing stored: an empty or invalid group, an id that
is not an offset message id (INVALID_PARAMETER), an id naming another store
host or a record of another topic than ``origin_topic`` (INVALID_PARAMETER),
an offset with no message here (QUERY_NOT_FOUND).

A mixin of :class:`basalt.services.store_node.service.StoreNodeServicer`.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import grpc

from basalt.common.message import (
    DEFAULT_MAX_RECONSUME_TIMES,
    SCHEDULE_TOPIC,
    MessageRecord,
    decode_host,
    dlq_topic,
    encode_host,
    parse_offset_msg_id,
    send_back_copy,
)
from basalt.services.checks import check_group, check_topic
from basalt.services.errors import Refusal, invalid
from basalt.services.meta.model import Perm, TopicConfig
from basalt.services.rpc import rpc_method as _rpc
from basalt.services.store_node.ha.gate import WriteGate
from basalt.services.store_node.topics import TopicDirectory
from basalt.store import MessageStore
from basalt.store.batch import EncodedBatch
from basalt.store.errors import CorruptRecordError
from basalt.store.put_result import PutMessageResult
from basalt.v1 import common_pb2 as pb
from basalt.v1 import store_node_pb2 as sn

if TYPE_CHECKING:
    from basalt.services.store_node.service import StoreNodeConfig

#: Queues of a retry or dead-letter topic this node creates (RocketMQ's
#: retryQueueNums and DLQ_NUMS_PER_GROUP): one.
SEND_BACK_TOPIC_QUEUE_NUMS = 1


class RetryRpcs:
    """ConsumerSendMsgBack (see the module docstring)."""

    config: StoreNodeConfig
    store: MessageStore
    topics: TopicDirectory
    writable: bool
    broker_perm: Callable[[], Perm]
    group: WriteGate | None

    if TYPE_CHECKING:
        # The servicer's (basalt.services.store_node.service).
        def _check_node_writable(self) -> None: ...

        def _writable_config(self, topic: str, queue_id: int) -> TopicConfig | None: ...

        async def _store_encoded(
            self,
            topic: str,
            queue_id: int,
            encoded: EncodedBatch | PutMessageResult,
            started: float,
        ) -> pb.SendResult: ...

    @_rpc
    async def ConsumerSendMsgBack(
        self, request: sn.ConsumerSendMsgBackRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> sn.ConsumerSendMsgBackResponse:
        started = time.perf_counter()
        check_group(request.group)
        self._check_node_writable()
        record = await self._sent_back_record(request.offset_msg_id, request.origin_topic)
        copy = send_back_copy(
            record,
            request.group,
            delay_level=request.delay_level,
            max_reconsume_times=request.max_reconsume_times
            if request.max_reconsume_times > 0
            else DEFAULT_MAX_RECONSUME_TIMES,
        )
        config = await self._send_back_topic(copy.topic)
        copy.queue_id = random.randrange(config.write_queue_nums)
        self._writable_config(copy.topic, copy.queue_id)  # its perm, as a send's
        result = await self._store_encoded(
            copy.topic, copy.queue_id, self.store.encode_messages([copy]), started
        )
        return sn.ConsumerSendMsgBackResponse(
            topic=copy.topic,
            dead_lettered=copy.topic == dlq_topic(request.group),
            reconsume_times=copy.reconsume_times,
            result=result,
        )

    async def _sent_back_record(self, offset_msg_id: str, origin_topic: str) -> MessageRecord:
        """The record ``offset_msg_id`` names in this store, or the refusal
        (module docstring)."""
        try:
            host, physical = parse_offset_msg_id(offset_msg_id)
        except ValueError:
            raise invalid(f"not an offset message id: {offset_msg_id!r}") from None
        try:
            record = await asyncio.to_thread(self.store.lookup_message_by_offset, physical)
        except CorruptRecordError:  # the offset is not where a record starts
            record = None
        own = decode_host(encode_host(self.store.config.store_host))
        if (record is None and host != own) or (record is not None and record.store_host != host):
            # The store host a record carries is the one that first wrote it: a
            # group's members hold byte-identical copies, so an id stays valid
            # on a new master, and the check is against the record, not this node.
            raise invalid(
                f"message id {offset_msg_id} names store host {host}: not a message of "
                f"store-node {self.config.broker_name!r} (send it back where it was read)"
            )
        if record is None or record.topic == SCHEDULE_TOPIC:
            raise Refusal(
                pb.RESPONSE_CODE_QUERY_NOT_FOUND,
                f"no message at {offset_msg_id} on store-node {self.config.broker_name!r}",
            )
        if origin_topic and record.topic != origin_topic:
            raise invalid(
                f"message {offset_msg_id} is a message of topic {record.topic!r}, "
                f"not of origin_topic {origin_topic!r}"
            )
        return record

    async def _send_back_topic(self, topic: str) -> TopicConfig:
        """``topic``'s config, created (or this broker added) when this node does
        not serve it yet."""
        broker = self.config.broker_name
        config = self.topics.topic(topic)
        if config is None or broker not in config.brokers:
            check_topic(topic)  # a group name can make one too long
            config = await self.topics.ensure_topic(
                topic, broker, queue_nums=SEND_BACK_TOPIC_QUEUE_NUMS
            )
        return config
