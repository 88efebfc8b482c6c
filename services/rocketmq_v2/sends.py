"""SendMessage: the v2 front's sends (a mixin of the servicer).

Every message is checked and converted first (one bad message: nothing
stored), then stored as one batch of records per target queue
(:func:`basalt.common.record.encode_batch`, the SDK's encoder). A FIFO
message's group picks its (broker, queue) by hash over the topic's writable
queues; otherwise a ``queue_id`` the client set (not 0) goes to the next
writable broker round robin, its queue ``queue_id`` modulo that broker's
count (a v2 send names no broker); an unset one to the next writable queue
round robin - in a store-node's front, of its own queues when the topic has
writable ones there (:meth:`SendRpcs._preferred`).

Where the batch goes: the store-node this front runs in takes it in-process
(:meth:`~basalt.services.rocketmq_v2.host.LocalStoreNode.send_records`; the
store joins what one loop turn sends); another store-node gets the batches
of concurrent requests joined (:mod:`.call_batching`) into one message of
its ``SendStream`` (:mod:`.store_streams`). A timer (DELAY) or
transactional message is sent alone (:mod:`.transactions`).
"""

from __future__ import annotations

import itertools
import time
from typing import TYPE_CHECKING, Any

import grpc

from basalt.common.message import Message, encode_host
from basalt.common.record import encode_batch
from basalt.rocketmq.v2 import definition_pb2 as v2
from basalt.rocketmq.v2 import service_pb2 as sv
from basalt.services.errors import Refusal
from basalt.services.meta.model import TopicConfig
from basalt.services.pull_service.channels import call_timeout_s
from basalt.services.rocketmq_v2.call_batching import Coalescer
from basalt.services.rocketmq_v2.conversions import (
    CODE_OF_SEND_STATUS,
    StoreQueue,
    V2Error,
    asked_queue,
    deliver_time_ms,
    entries_status,
    fifo_queue,
    to_message,
    writable_queues,
)
from basalt.services.rocketmq_v2.host import LocalStoreNode
from basalt.services.rocketmq_v2.store_calls import STORE_NODE_BUDGET_S, local_error
from basalt.services.rocketmq_v2.store_streams import SendStreams, refused
from basalt.services.rocketmq_v2.transactions import TransactionRpcs
from basalt.v1 import common_pb2 as pb
from basalt.v1 import store_node_pb2 as sn

if TYPE_CHECKING:
    from basalt.services.rocketmq_v2.service import RocketMQv2Config

#: What a joined send of one message answers: its v2 code and queue offset,
#: or its batch's refusal.
Stored = tuple[v2.Code.ValueType, int] | V2Error


class SendRpcs(TransactionRpcs):
    """SendMessage (module docstring); a mixin of
    :class:`basalt.services.rocketmq_v2.service.MessagingServiceServicer`,
    which calls :meth:`_init_sends` once. Timer and half messages are sent
    one by one by :class:`TransactionRpcs`' ``_send_one``."""

    config: RocketMQv2Config

    def _init_sends(self) -> None:
        self._turn = itertools.count()
        #: Concurrent SendMessages to another store-node, joined into one stream
        #: message (a SendBatch per queue).
        self._sends: Coalescer[str, tuple[str, StoreQueue, Message, str], Stored] = Coalescer(
            self._send_joined
        )
        #: One SendStream per other store-node, for the joined sends.
        self._streams = SendStreams(self.host.channels.open_send_stream)
        #: Per topic: its config, (live brokers, mastership) and the queues
        #: :meth:`_writable` answered for them.
        self._routes: dict[
            str,
            tuple[TopicConfig, tuple[tuple[str, ...], bool], list[StoreQueue], list[StoreQueue]],
        ] = {}

    async def SendMessage(
        self, request: sv.SendMessageRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> sv.SendMessageResponse:
        try:
            entries = await self._send(request, context)
        except V2Error as e:
            return sv.SendMessageResponse(status=e.status())
        return sv.SendMessageResponse(status=entries_status(entries), entries=entries)

    async def _send(
        self, request: sv.SendMessageRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> list[sv.SendResultEntry]:
        """Check, convert and store the request's messages (module docstring);
        one entry per message, in order. V2Error when nothing is stored."""
        if not request.messages:
            raise V2Error(v2.BAD_REQUEST, "SendMessage without messages")
        topic = request.messages[0].topic.name
        if any(m.topic.name != topic for m in request.messages):
            raise V2Error(v2.BAD_REQUEST, "one SendMessage carries one topic's messages")
        max_body = self.config.rocketmq_v2_max_body_size_bytes
        messages = [to_message(m, max_body) for m in request.messages]
        config = self.host.topics.get(topic)
        if config is None:
            raise V2Error(v2.TOPIC_NOT_FOUND, f"topic {topic!r} not found")
        writable, spread = self._writable(config)
        if not writable:
            raise V2Error(v2.FORBIDDEN, f"topic {topic!r} has no writable queue")
        due = [deliver_time_ms(m) for m in request.messages]
        targets: dict[StoreQueue, list[int]] = {}
        alone: list[tuple[int, StoreQueue]] = []
        for i, m in enumerate(request.messages):
            system = m.system_properties
            if system.HasField("message_group"):
                queue = fifo_queue(system.message_group, writable)
            else:
                # queue_id 0 is also proto3's "not set", and the official Python
                # client never sets it: taken as the client's choice, all its
                # messages would land on one queue of one store-node.
                turn = next(self._turn)
                if system.queue_id:
                    queue = asked_queue(system.queue_id, turn, spread)
                else:
                    queue = spread[turn % len(spread)]
            if due[i] or system.message_type == v2.TRANSACTION:
                alone.append((i, queue))
            else:
                targets.setdefault(queue, []).append(i)
        entries: list[sv.SendResultEntry | None] = [None] * len(messages)
        for queue, indices in targets.items():
            ids = [request.messages[i].system_properties.message_id for i in indices]
            local = self._local(queue.broker_name)
            if local is not None:  # the store joins what concurrent calls send
                stored = await self._store_here(
                    local, topic, queue, [messages[i] for i in indices], ids
                )
            else:
                stored = await self._sends.submit(
                    queue.broker_name,
                    [(topic, queue, messages[i], ids[k]) for k, i in enumerate(indices)],
                    context,
                )
            for k, (i, outcome) in enumerate(zip(indices, stored, strict=True)):
                if isinstance(outcome, V2Error):
                    raise outcome
                code, offset = outcome
                status = v2.Status(code=code, message=v2.Code.Name(code))
                entries[i] = sv.SendResultEntry(status=status, message_id=ids[k], offset=offset)
        for i, queue in alone:
            m = request.messages[i]
            entries[i] = await self._send_one(
                queue, messages[i], m.system_properties.message_id, due[i],
                m.system_properties.message_type == v2.TRANSACTION, context,
            )  # fmt: skip
        return [e for e in entries if e is not None]

    def _writable(self, config: TopicConfig) -> tuple[list[StoreQueue], list[StoreQueue]]:
        """The topic's writable queues on its live brokers, and those a send
        without a message group goes to (:meth:`_preferred`); remembered while
        the topic's config, its live brokers and this node's mastership stay
        the same (every send asks)."""
        live = tuple(n for n in config.brokers if self.host.brokers.get(n) is not None)
        local = self.host.local
        master = (
            local is not None
            and local.broker_name in live
            and self._local(local.broker_name) is not None
        )
        known = self._routes.get(config.topic_name)
        if known is not None and known[0] is config and known[1] == (live, master):
            return known[2], known[3]
        writable = writable_queues(config, live)
        spread = self._preferred(writable)
        self._routes[config.topic_name] = (config, (live, master), writable, spread)
        return writable, spread

    def _preferred(self, writable: list[StoreQueue]) -> list[StoreQueue]:
        """The queues a send without a message group goes to: in a store-node's
        front, its own writable queues while it is its broker's master
        (RocketMQ 5's local proxy mode: a client sends to the broker whose queue
        it picked, and that broker stores it, with no hop); else, or when it
        has none of the topic's, all of ``writable``. A FIFO message group
        hashes over all of them wherever it is sent, so it keeps its queue."""
        local = self.host.local
        if local is None:
            return writable
        registered = self.host.brokers.get(local.broker_name)
        if registered is None or not local.serves(local.broker_name, registered.address):
            return writable
        own = [q for q in writable if q.broker_name == local.broker_name]
        return own or writable

    async def _store_here(
        self,
        local: LocalStoreNode,
        topic: str,
        queue: StoreQueue,
        messages: list[Message],
        ids: list[str],
    ) -> list[tuple[v2.Code.ValueType, int] | V2Error]:
        """``messages`` stored in ``queue`` of the store-node this front runs in,
        as one batch of records (:meth:`LocalStoreNode.send_records`): each one's
        v2 code and queue offset, or the batch's refusal."""
        records = encode_batch(
            messages,
            ids,
            queue_id=queue.queue_id,
            store_host=local.store_host,
            born_timestamp_ms=int(time.time() * 1000),
        )
        try:
            result = await local.send_records(topic, queue.queue_id, records)
        except Refusal as r:
            return [local_error(r, local)] * len(messages)
        code = v2.Code.ValueType(CODE_OF_SEND_STATUS.get(result.status, v2.INTERNAL_ERROR))
        return [(code, offset) for offset in result.queue_offsets]

    async def _send_joined(
        self,
        broker: str,
        items: list[tuple[str, StoreQueue, Message, str]],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> list[tuple[v2.Code.ValueType, int] | V2Error]:
        """The joined requests' messages to ``broker`` (``_sends``): one
        SendBatch per topic and queue, all as one message on the store-node's
        SendStream. Each message's v2 code and queue offset, or its batch's
        refusal."""
        address = self._address(StoreQueue(broker, 0))
        peer = f"store-node {broker!r} at {address}"
        hosts = await self.host.store_hosts.of({broker: address})
        store_host = hosts.get(broker)
        if store_host is None:
            raise V2Error(v2.INTERNAL_SERVER_ERROR, f"{peer} does not answer")
        host = encode_host(store_host)
        groups: dict[tuple[str, StoreQueue], list[int]] = {}
        for n, (topic, queue, _, _) in enumerate(items):
            groups.setdefault((topic, queue), []).append(n)
        born_ms = int(time.time() * 1000)
        batches = [
            sn.SendBatchRequest(
                topic=topic,
                queue_id=queue.queue_id,
                records=encode_batch(
                    [items[n][2] for n in group],
                    [items[n][3] for n in group],
                    queue_id=queue.queue_id,
                    store_host=host,
                    born_timestamp_ms=born_ms,
                ),
            )
            for (topic, queue), group in groups.items()
        ]
        local = self.host.local_at(broker, address)
        if local is not None:
            answers = await local.send(batches)
        else:
            timeout = call_timeout_s(context, STORE_NODE_BUDGET_S)
            answers = await self._streams.send(address, peer, batches, timeout)
        out: list[tuple[v2.Code.ValueType, int] | V2Error | None] = [None] * len(items)
        for group, answer in zip(groups.values(), answers, strict=True):
            refusal = refused(answer, peer)
            result = answer.result
            code = v2.Code.ValueType(CODE_OF_SEND_STATUS.get(result.status, v2.INTERNAL_ERROR))
            for k, n in enumerate(group):
                out[n] = refusal if refusal is not None else (code, result.queue_offsets[k])
        return [o for o in out if o is not None]

    async def _store(
        self,
        topic: str,
        queue: StoreQueue,
        messages: list[Message],
        ids: list[str],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> pb.SendResult:
        """One SendBatch of ``messages`` to ``queue``'s store-node; its SendResult,
        or V2Error with the store-node's refusal in v2 terms."""
        address = self._address(queue)
        hosts = await self.host.store_hosts.of({queue.broker_name: address})
        store_host = hosts.get(queue.broker_name)
        if store_host is None:
            raise V2Error(
                v2.INTERNAL_SERVER_ERROR,
                f"store-node {queue.broker_name!r} at {address} does not answer",
            )
        records = encode_batch(
            messages,
            ids,
            queue_id=queue.queue_id,
            store_host=encode_host(store_host),
            born_timestamp_ms=int(time.time() * 1000),
        )
        request = sn.SendBatchRequest(topic=topic, queue_id=queue.queue_id, records=records)
        response: sn.SendBatchResponse = await self._call(
            queue, address, "SendBatch", request, context
        )
        return response.result
