"""``apache.rocketmq.v2.MessagingService``: the official RocketMQ 5 clients' front.

A thin, stateless adapter served by the pull-service on its own listener
(:func:`start_rocketmq_v2`): it reads the pull-service's etcd view (topics,
brokers) and sends through its channels to the store-nodes, so any
pull-service serves any client. The RPCs:

* ``QueryRoute``: one MessageQueue per queue, each broker's numbered from 0
  and naming its broker (:mod:`.conversions`), each at the access point the
  client called; TOPIC_NOT_FOUND for an unknown topic (no auto-creation, as
  RocketMQ 5).
* ``Telemetry``: each ``Settings`` the client sends is answered at once with
  the server's (:meth:`MessagingServiceServicer.settings_answer`); a
  publishing client joins its topics' producer groups for transaction checks
  (:mod:`.check_relay`) while the stream is open, until the client closes it.
* ``Heartbeat``, ``NotifyClientTermination``: OK (no session state here).
* ``SendMessage``: every message is checked and converted first (one bad
  message: nothing stored), then sent as one ``SendBatch`` per target queue
  with records from :func:`basalt.common.record.encode_batch`; concurrent
  requests' batches to one store-node are joined (:mod:`.call_batching`) into one
  message of its ``SendStream`` (:mod:`.store_streams`). A FIFO
  message's group picks its (broker, queue) by hash; otherwise a ``queue_id``
  the client set (not 0) goes to the next writable broker round robin, its
  queue ``queue_id`` modulo that broker's count (a v2 send names no broker);
  an unset one to the next writable queue of all brokers round robin.
* ``QueryOffset`` (BEGINNING / END / TIMESTAMP: the store-node's
  GetMinMaxOffset or SearchOffset), ``GetOffset`` (a group's committed
  offset: QueryConsumerOffset; OFFSET_NOT_FOUND when it has none) and
  ``UpdateOffset`` (UpdateConsumerOffset) on the store-node the request's
  ``MessageQueue`` names (its broker; the first when it names none).
  A timer (DELAY) or transactional message is sent alone
  (:mod:`.transactions`).
* ``EndTransaction``, ``RecallMessage``: :mod:`.transactions`; the Telemetry
  stream of a publishing client also relays its group's transaction checks
  (:mod:`.check_relay`).

* Consumption (``ReceiveMessage``, ``AckMessage``,
  ``ChangeInvisibleDuration``, ``ForwardMessageToDeadLetterQueue``,
  ``QueryAssignment``) and the offset-based ``PullMessage``: :mod:`.consume`.

Every answer carries a v2 ``Status``; refusals are Statuses, never gRPC
errors (``authorization`` headers are checked by the servers' auth
interceptor when auth is on, before a handler runs). Concurrency: one event
loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from basalt.common.message import Message, encode_host
from basalt.common.record import encode_batch
from basalt.common.settings import (
    config_dataclass,
    instance_of,
    one_of,
    positive,
    setting,
    validate,
)
from basalt.common.tls import ClientAuth, TlsConfig
from basalt.rocketmq.v2 import definition_pb2 as v2
from basalt.rocketmq.v2 import service_pb2 as sv
from basalt.services.config import listen_address_or_empty
from basalt.services.errors import Refusal
from basalt.services.meta.model import TopicConfig
from basalt.services.pull_service.channels import call_timeout_s
from basalt.services.rocketmq_v2.call_batching import Coalescer
from basalt.services.rocketmq_v2.check_relay import CheckRelay, publishing_groups
from basalt.services.rocketmq_v2.consume import ConsumeRpcs
from basalt.services.rocketmq_v2.conversions import (
    CODE_OF_SEND_STATUS,
    StoreQueue,
    V2Error,
    asked_queue,
    code_of_response,
    deliver_time_ms,
    duration_ms,
    fifo_queue,
    group_name,
    message_queues,
    ok_status,
    queue_of,
    to_message,
    writable_queues,
)
from basalt.services.rocketmq_v2.host import FrontHost, LocalStoreNode
from basalt.services.rocketmq_v2.store_calls import STORE_NODE_BUDGET_S, local_error
from basalt.services.rocketmq_v2.store_streams import SendStreams, refused
from basalt.services.rocketmq_v2.transactions import TransactionRpcs
from basalt.services.validation import LimitError, timestamp_ms
from basalt.v1 import common_pb2 as pb
from basalt.v1 import store_node_pb2 as sn

log = logging.getLogger(__name__)


@config_dataclass
class RocketMQv2Config:
    """Where a process (a pull-service or a store-node) serves the v2 front and
    what the front tells clients in Telemetry's Settings. Validated at
    construction: ValueError names the first bad field."""

    rocketmq_v2_listen: str = setting(
        default="",
        check=listen_address_or_empty,
        doc="host:port to serve RocketMQ 5 clients (apache.rocketmq.v2.MessagingService) "
        "on; empty: not served. A store-node's front serves its own queues in-process "
        "(RocketMQ 5's local proxy mode) and needs etcd (docs/rocketmq-v2.md).",
    )
    rocketmq_v2_tls_client_auth: ClientAuth = setting(
        default=ClientAuth.NONE,
        check=one_of(*ClientAuth),
        doc="With tls_enable: whether the RocketMQ 5 front requires client certificates. "
        "NONE by default, as RocketMQ's proxy: the official clients present none "
        "(they trust the server's; docs/security.md).",
    )

    rocketmq_v2_max_body_size_bytes: int = setting(
        default=4 * 1024 * 1024,
        check=positive,
        doc="Largest message body a v2 client may send (RocketMQ's maxMessageSize); "
        "larger is refused MESSAGE_BODY_TOO_LARGE.",
    )
    rocketmq_v2_receive_batch_size: int = setting(
        default=32, check=positive, doc="Messages per receive told to v2 consumers."
    )
    rocketmq_v2_long_polling_timeout_ms: int = setting(
        default=20_000, check=positive, doc="Long-polling time told to v2 consumers."
    )
    rocketmq_v2_consumer_max_attempts: int = setting(
        default=17,
        check=positive,
        doc="Deliveries of a message to a group before it goes to %DLQ%<group> "
        "(RocketMQ's retryMaxTimes 16 + the first); told to consumers.",
    )
    rocketmq_v2_consumer_max_retry_delay_ms: int = setting(
        default=7_200_000,
        check=positive,
        doc="Cap on the retry delays told to PushConsumers (RocketMQ's levels "
        "1 s, 5 s, 10 s, 30 s, 1 m .. 2 h).",
    )
    rocketmq_v2_push_invisible_ms: int = setting(
        default=60_000,
        check=positive,
        doc="Invisible time of a PushConsumer's deliveries (auto_renew receives; "
        "not renewed: a slower listener sees its message again).",
    )
    rocketmq_v2_fifo_groups: str = setting(
        default="",
        check=instance_of(str, "comma-separated group names"),
        doc="Consumer groups that are FIFO (a message group's next message waits "
        "while one is in flight); Basalt has no subscription-group store.",
    )

    def __post_init__(self) -> None:
        validate(self, ValueError)

    def tls(self, tls: TlsConfig) -> TlsConfig:
        """The front's TLS: the process's, with ``rocketmq_v2_tls_client_auth``."""
        return dataclasses.replace(tls, tls_client_auth=self.rocketmq_v2_tls_client_auth)

    def fifo_groups(self) -> frozenset[str]:
        """The FIFO groups ``rocketmq_v2_fifo_groups`` names."""
        return frozenset(g.strip() for g in self.rocketmq_v2_fifo_groups.split(",") if g.strip())


#: RocketMQ's messageDelayLevel from level 3 (1 s): the default retry delays of
#: a concurrently consuming group, ms.
_RETRY_DELAYS_MS = tuple(
    s * 1000
    for s in (1, 5, 10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200)
)


def _producer_backoff(max_attempts: int) -> v2.RetryPolicy:
    # RocketMQ's proxy default for producers: exponential 10 ms .. 1 s, x2.
    return v2.RetryPolicy(
        max_attempts=max_attempts or 3,
        exponential_backoff=v2.ExponentialBackoff(
            initial=duration_ms(10), max=duration_ms(1000), multiplier=2.0
        ),
    )


def _consumer_backoff(max_attempts: int, max_delay_ms: int) -> v2.RetryPolicy:
    # RocketMQ's proxy sends a group's delay levels as a customized backoff; the
    # official Python PushConsumer reads no other kind (exponential: 1 s always).
    delays = sorted({min(ms, max_delay_ms) for ms in _RETRY_DELAYS_MS})
    return v2.RetryPolicy(
        max_attempts=max_attempts,
        customized_backoff=v2.CustomizedBackoff(next=[duration_ms(ms) for ms in delays]),
    )


class MessagingServiceServicer(ConsumeRpcs, TransactionRpcs):
    """The v2 RPCs (module docstring), over a running pull-service's view. Not
    the generated servicer's subclass: only the methods it has are registered
    (:mod:`basalt.services.rocketmq_v2.server`), the others are UNIMPLEMENTED."""

    def __init__(self, config: RocketMQv2Config, host: FrontHost) -> None:
        self.config = config
        self.host = host
        self._turn = itertools.count()
        #: Concurrent SendMessages to one store-node, joined into one stream
        #: message (a SendBatch per queue).
        self._sends: Coalescer[
            str, tuple[str, StoreQueue, Message, str], tuple[v2.Code.ValueType, int] | V2Error
        ] = Coalescer(self._send_joined)
        #: One SendStream per store-node, for the joined sends.
        self._streams = SendStreams(host.channels.store_node)
        #: Concurrent AckMessages of one group and topic on one store-node, joined.
        self._acks = Coalescer(self._ack_joined)
        #: Transaction checks of the publishing clients' groups.
        self.checks = CheckRelay(host)
        #: Per topic: its config, (live brokers, mastership) and the queues
        #: :meth:`_writable` answered for them.
        self._routes: dict[
            str,
            tuple[TopicConfig, tuple[tuple[str, ...], bool], list[StoreQueue], list[StoreQueue]],
        ] = {}

    async def close(self) -> None:
        """End the store-node streams and check watches (once the server stopped)."""
        await self.checks.close()
        await self._streams.close()

    # -- routes and clients -------------------------------------------------------------

    async def QueryRoute(
        self, request: sv.QueryRouteRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> sv.QueryRouteResponse:
        config = self.host.topics.get(request.topic.name)
        if config is None:
            return sv.QueryRouteResponse(
                status=V2Error(
                    v2.TOPIC_NOT_FOUND, f"topic {request.topic.name!r} not found"
                ).status()
            )
        queues = message_queues(
            config,
            self._broker_perms(config),
            namespace=request.topic.resource_namespace,
            endpoints=request.endpoints,
            own=self._broker_fronts(config),
        )
        return sv.QueryRouteResponse(status=ok_status(), message_queues=queues)

    async def Heartbeat(
        self, request: sv.HeartbeatRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> sv.HeartbeatResponse:
        return sv.HeartbeatResponse(status=ok_status())

    async def NotifyClientTermination(
        self,
        request: sv.NotifyClientTerminationRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> sv.NotifyClientTerminationResponse:
        return sv.NotifyClientTerminationResponse(status=ok_status())

    async def Telemetry(
        self,
        request_iterator: AsyncIterator[sv.TelemetryCommand],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[sv.TelemetryCommand]:
        """Answer each Settings at once; a publishing client's Settings (re)join
        its topics' groups for transaction checks, relayed on this stream
        (:mod:`.check_relay`). Other commands (thread stacks, verify results the
        server never asked for) are read and dropped. Ends when the client
        closes its side; the client leaves its groups then."""
        outbox: asyncio.Queue[sv.TelemetryCommand | None] = asyncio.Queue()
        leave: Callable[[], None] | None = None

        async def read() -> None:
            nonlocal leave
            try:
                async for command in request_iterator:
                    if not command.HasField("settings"):
                        continue
                    settings = command.settings
                    outbox.put_nowait(
                        sv.TelemetryCommand(
                            status=ok_status(), settings=self.settings_answer(settings)
                        )
                    )
                    publishing = publishing_groups(settings)
                    if publishing is not None:
                        if leave is not None:
                            leave()
                        leave = self.checks.join(*publishing, outbox.put_nowait)
            finally:
                outbox.put_nowait(None)

        reader = asyncio.create_task(read())
        try:
            while (command := await outbox.get()) is not None:
                yield command
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
                await reader
            if leave is not None:
                leave()

    def settings_answer(self, client: v2.Settings) -> v2.Settings:
        """The client's Settings with the server's values: publishing
        ``max_body_size``, subscription ``fifo``, ``receive_batch_size``,
        ``long_polling_timeout``, and the backoff policy."""
        answer = v2.Settings()
        answer.CopyFrom(client)
        if client.HasField("publishing"):
            answer.publishing.max_body_size = self.config.rocketmq_v2_max_body_size_bytes
            answer.backoff_policy.CopyFrom(_producer_backoff(client.backoff_policy.max_attempts))
        elif client.HasField("subscription"):
            sub = answer.subscription
            sub.fifo = self.is_fifo(sub.group.name)
            sub.receive_batch_size = self.config.rocketmq_v2_receive_batch_size
            sub.long_polling_timeout.CopyFrom(
                duration_ms(self.config.rocketmq_v2_long_polling_timeout_ms)
            )
            answer.backoff_policy.CopyFrom(
                _consumer_backoff(
                    self.config.rocketmq_v2_consumer_max_attempts,
                    self.config.rocketmq_v2_consumer_max_retry_delay_ms,
                )
            )
        return answer

    # -- sends --------------------------------------------------------------------------

    async def SendMessage(
        self, request: sv.SendMessageRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> sv.SendMessageResponse:
        try:
            entries = await self._send(request, context)
        except V2Error as e:
            return sv.SendMessageResponse(status=e.status())
        codes = {e.status.code for e in entries}
        if len(codes) == 1:
            status = entries[0].status
        else:
            status = v2.Status(code=v2.MULTIPLE_RESULTS, message="entries differ")
        return sv.SendMessageResponse(status=status, entries=entries)

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

    # -- offsets ------------------------------------------------------------------------

    async def QueryOffset(
        self, request: sv.QueryOffsetRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> sv.QueryOffsetResponse:
        try:
            mq = request.message_queue
            if request.query_offset_policy == v2.TIMESTAMP:
                if not request.HasField("timestamp"):
                    raise V2Error(v2.BAD_REQUEST, "a TIMESTAMP query without a timestamp")
                ms = timestamp_ms(request.timestamp, "timestamp")
                found = await self._on_store_node(
                    mq, "SearchOffset", lambda t, q: sn.SearchOffsetRequest(
                        topic=t, queue_id=q, timestamp_ms=ms
                    ), context,
                )  # fmt: skip
                return sv.QueryOffsetResponse(status=ok_status(), offset=found.offset)
            bounds = await self._on_store_node(
                mq, "GetMinMaxOffset",
                lambda t, q: sn.GetMinMaxOffsetRequest(topic=t, queue_id=q), context,
            )  # fmt: skip
            end = request.query_offset_policy == v2.END
            offset = bounds.max_offset if end else bounds.min_offset
            return sv.QueryOffsetResponse(status=ok_status(), offset=offset)
        except V2Error as e:
            return sv.QueryOffsetResponse(status=e.status())
        except LimitError as e:
            code = v2.Code.ValueType(e.v2_code)
            return sv.QueryOffsetResponse(status=v2.Status(code=code, message=e.message))

    async def GetOffset(
        self, request: sv.GetOffsetRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> sv.GetOffsetResponse:
        try:
            group = group_name(request.group)
            found = await self._on_store_node(
                request.message_queue, "QueryConsumerOffset",
                lambda t, q: sn.QueryConsumerOffsetRequest(group=group, topic=t, queue_id=q),
                context,
            )  # fmt: skip
        except V2Error as e:
            return sv.GetOffsetResponse(status=e.status())
        if found.offset < 0:
            return sv.GetOffsetResponse(
                status=V2Error(v2.OFFSET_NOT_FOUND, f"group {group!r} has no offset here").status()
            )
        return sv.GetOffsetResponse(status=ok_status(), offset=found.offset)

    async def UpdateOffset(
        self, request: sv.UpdateOffsetRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> sv.UpdateOffsetResponse:
        try:
            group = group_name(request.group)
            if request.offset < 0:
                raise V2Error(v2.ILLEGAL_OFFSET, f"offset {request.offset} < 0")
            done = await self._on_store_node(
                request.message_queue, "UpdateConsumerOffset",
                lambda t, q: sn.UpdateConsumerOffsetRequest(
                    group=group, topic=t, queue_id=q, offset=request.offset
                ), context,
            )  # fmt: skip
        except V2Error as e:
            return sv.UpdateOffsetResponse(status=e.status())
        if done.commit.code != pb.RESPONSE_CODE_SUCCESS:
            return sv.UpdateOffsetResponse(
                status=V2Error(code_of_response(done.commit.code), done.commit.message).status()
            )
        return sv.UpdateOffsetResponse(status=ok_status())

    async def _on_store_node(
        self,
        mq: v2.MessageQueue,
        rpc: str,
        make: Callable[[str, int], Any],
        context: grpc.aio.ServicerContext[Any, Any],
        hold_s: float = 0.0,
    ) -> Any:
        """Call ``rpc`` with ``make(topic, queue_id)`` on the store-node of the
        queue ``mq`` names (:func:`queue_of`: its broker and queue id; a call the
        store-node may hold gets ``hold_s`` more time); its answer, or V2Error
        (TOPIC_NOT_FOUND, BAD_REQUEST for a broker or queue id outside the
        topic, the store-node's refusal in v2 terms)."""
        config = self.host.topics.get(mq.topic.name)
        if config is None:
            raise V2Error(v2.TOPIC_NOT_FOUND, f"topic {mq.topic.name!r} not found")
        queue = queue_of(config, mq)
        if queue is None:
            raise V2Error(
                v2.BAD_REQUEST,
                f"topic {mq.topic.name!r} has no queue {mq.id} on broker {mq.broker.name!r}",
            )
        request = make(config.topic_name, queue.queue_id)
        return await self._call(queue, self._address(queue), rpc, request, context, hold_s)
