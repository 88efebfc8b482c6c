"""``apache.rocketmq.v2.MessagingService``: the official RocketMQ 5 clients' front.

A thin, stateless adapter served on a listener of its own by the
pull-service or a store-node (:func:`start_rocketmq_v2`): it reads its
host's etcd view (topics, brokers) and calls the store-nodes through its
channels - in a store-node, its own in-process (:mod:`.host`) - so any
front serves any client. The RPCs:

* ``QueryRoute``: one MessageQueue per queue, each broker's numbered from 0
  and naming its broker (:mod:`.conversions`), each at the access point the
  client called (in a store-node's front, at each broker's own front where
  it has one); TOPIC_NOT_FOUND for an unknown topic (no auto-creation, as
  RocketMQ 5).
* ``Telemetry``: each ``Settings`` the client sends is answered at once with
  the server's (:meth:`MessagingServiceServicer.settings_answer`); a
  publishing client joins its topics' producer groups for transaction checks
  (:mod:`.check_relay`) while the stream is open, until the client closes it.
* ``Heartbeat``, ``NotifyClientTermination``: OK (no session state here).
* ``SendMessage``: :mod:`.sends`.
* ``QueryOffset`` (BEGINNING / END / TIMESTAMP: the store-node's
  GetMinMaxOffset or SearchOffset), ``GetOffset`` (a group's committed
  offset: QueryConsumerOffset; OFFSET_NOT_FOUND when it has none) and
  ``UpdateOffset`` (UpdateConsumerOffset) on the store-node the request's
  ``MessageQueue`` names (its broker; the first when it names none).
* ``EndTransaction``, ``RecallMessage``: :mod:`.transactions`; the Telemetry
  stream of a publishing client also relays its group's transaction checks
  (:mod:`.check_relay`).

* Consumption (``ReceiveMessage``, ``AckMessage``,
  ``ChangeInvisibleDuration``, ``ForwardMessageToDeadLetterQueue``,
  ``QueryAssignment``): :mod:`.consume`; the offset-based ``PullMessage``:
  :mod:`.pulls`.

Every answer carries a v2 ``Status``; refusals are Statuses, never gRPC
errors (``authorization`` headers are checked by the servers' auth
interceptor when auth is on, before a handler runs). Concurrency: one event
loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

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
from basalt.services.rocketmq_v2.call_batching import Coalescer
from basalt.services.rocketmq_v2.check_relay import CheckRelay, publishing_groups
from basalt.services.rocketmq_v2.consume import ConsumeRpcs
from basalt.services.rocketmq_v2.conversions import (
    V2Error,
    code_of_response,
    duration_ms,
    group_name,
    message_queues,
    ok_status,
)
from basalt.services.rocketmq_v2.host import FrontHost
from basalt.services.rocketmq_v2.pulls import PullRpcs
from basalt.services.rocketmq_v2.sends import SendRpcs
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


class MessagingServiceServicer(SendRpcs, ConsumeRpcs, PullRpcs):
    """The v2 RPCs (module docstring), over its host's view (a pull-service's
    or a store-node's: :class:`~basalt.services.rocketmq_v2.host.FrontHost`). Not
    the generated servicer's subclass: only the methods it has are registered
    (:mod:`basalt.services.rocketmq_v2.server`), the others are UNIMPLEMENTED."""

    def __init__(self, config: RocketMQv2Config, host: FrontHost) -> None:
        self.config = config
        self.host = host
        self._init_sends()
        #: Concurrent AckMessages of one group and topic on one store-node, joined.
        self._acks = Coalescer(self._ack_joined)
        #: Transaction checks of the publishing clients' groups.
        self.checks = CheckRelay(host)

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
