"""The pull-service: the consumers' front (docs/pull-service.md; pull_service.proto).

It holds nothing durable. Routes and topic configs come from its etcd watch
caches; records and offsets from the store-nodes; consumers keep a Session
stream with it so that admin can reach them. The RPCs:

* ``QueryRoute(topic)``: the topic's TopicRoute from the caches
  (:func:`basalt.services.pull_service.pull_rules.topic_route`); TOPIC_NOT_EXIST if unknown.
  ``TBW102`` (RocketMQ's default topic), unless configured in etcd, routes to
  every registered writable store-node: producers send a new topic there,
  and the store-node that takes the send creates it.
* ``Pull``: RocketMQ's PullMessageProcessor checks
  (:func:`basalt.services.pull_service.pull_rules.check_pull`), then
  one ``GetMessage`` on the owning store-node carrying the subscription,
  ``suspend_timeout_ms`` (the store-node holds the call: long polling) and the
  commit offset with its reset epoch (stored in the same round trip). The
  store's status becomes the client's code and PullStatus by the table in
  :mod:`basalt.services.errors` (``pull_outcome``). A store-node that cannot be reached fails the
  pull UNAVAILABLE naming it; nothing else is affected.
* ``Session``: see :mod:`basalt.services.pull_service.sessions`.
* ``ListConsumers(group)`` and ``NotifyConsumers(group, command)``: by
  default cluster-wide. The group's consumers are read from etcd
  (``consumers/<group>/``), so consumers with a session on another
  pull-service are listed too and a command reaches them through their
  pull-service (a forwarded NotifyConsumers). A call carrying the request
  metadata ``basalt-scope: local`` is limited to this pull-service's own
  sessions (what a forwarded call uses, so forwarding never loops; admin
  may use it too). ListConsumers' ``connected_since_ms`` is the session's
  start wherever it is held (the registration in etcd carries it; 0 only for
  a registration written before it did). Cluster-wide, a group with no live
  consumer at all is refused CONSUMER_NOT_ONLINE, as RocketMQ's broker
  answers consumerConnection and a reset (so admin can take the offline
  path); a group is otherwise not registered anywhere: a pull or commit of a
  group never seen creates its offsets (RocketMQ's autoCreateSubscriptionGroup).

Refusals go through :mod:`basalt.services.errors`, caught by
:func:`basalt.services.rpc.rpc_method`. Concurrency: one event loop.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from basalt.common.settings import config_dataclass, non_negative, positive, setting, validate
from basalt.services.checks import check_batch_entries, check_group, no_such_topic
from basalt.services.errors import Refusal, downstream_refusal, invalid, pull_response, refused
from basalt.services.meta.client import MetaClient, QueueKey
from basalt.services.meta.config import name_rule
from basalt.services.meta.errors import MetaUnavailableError
from basalt.services.meta.model import (
    BrokerRegistration,
    ConsumerRegistration,
    PullServiceRegistration,
    TopicConfig,
)
from basalt.services.meta.watch import MetaWatcher
from basalt.services.process import MAX_PENDING_CALLS
from basalt.services.pull_service.answers import cap_bytes, decode_answer
from basalt.services.pull_service.broker_grace import RegisteredBrokers
from basalt.services.pull_service.channels import ChannelPool, StoreHosts, call_timeout_s
from basalt.services.pull_service.metrics import pull_call, track_sessions
from basalt.services.pull_service.pull_rules import check_pull, topic_route
from basalt.services.pull_service.sessions import SessionRegistry, consumer_info
from basalt.services.rpc import rpc_method
from basalt.v1 import common_pb2 as pb
from basalt.v1 import pull_service_pb2 as ps
from basalt.v1 import pull_service_pb2_grpc as ps_grpc
from basalt.v1 import store_node_pb2 as sn

log = logging.getLogger(__name__)

#: RocketMQ's default topic: its route is where a topic that does not exist yet
#: is sent to be created (TopicValidator.AUTO_CREATE_TOPIC_KEY_TOPIC).
AUTO_CREATE_TOPIC_KEY_TOPIC = "TBW102"
#: Request metadata limiting ListConsumers / NotifyConsumers to local sessions.
SCOPE_KEY = "basalt-scope"
SCOPE_LOCAL = "local"
#: How much earlier than the caller's deadline NotifyConsumers stops waiting for
#: acks, so that its answer (with the TIMEOUTs) still reaches the caller.
_ANSWER_MARGIN_S = 0.1


@config_dataclass
class PullServiceConfig:
    """What a pull-service is told at start. Validated at construction:
    ValueError names the first bad field."""

    pull_service_id: str = setting(
        check=name_rule("pull-service id"),
        doc="Its key under etcd pull-services/ and the pull_service_id of its sessions.",
    )
    heartbeat_interval_ms: int = setting(
        default=10_000,
        check=positive,
        doc="Consumers heartbeat at least this often; 3x this of silence ends a session.",
    )
    max_suspend_timeout_ms: int = setting(
        default=30_000,
        check=non_negative,
        doc="The longest a pull may be held (a larger suspend_timeout_ms is capped).",
    )
    max_pull_nums: int = setting(
        default=1024,
        check=positive,
        doc=(
            "The most records asked of a store-node per pull (a larger max_nums is cut: "
            "the proto lets a pull return fewer). The store-node's own default cap."
        ),
    )
    default_command_timeout_ms: int = setting(
        default=5_000,
        check=positive,
        doc="A command's ack wait when its timeout_ms is 0.",
    )
    max_command_timeout_ms: int = setting(
        default=60_000, check=positive, doc="The cap on a command's ack wait."
    )
    downstream_margin_ms: int = setting(
        default=5_000,
        check=non_negative,
        doc=(
            "A downstream call may take this much longer than the wait it asks for "
            "(suspend time, ack time) before its peer counts as not answering."
        ),
    )
    max_queues_per_pull: int = setting(
        default=32, check=positive, doc="Most queues one PullBatch reads."
    )
    default_topic_queue_nums: int = setting(
        default=4,
        check=positive,
        doc="Queues per store-node in the TBW102 route (the store-nodes' auto-create default).",
    )
    max_pending_calls: int = setting(
        default=MAX_PENDING_CALLS,
        check=positive,
        doc="Calls arrived but not yet picked up by the event loop (a burst of long "
        "polls) that gRPC queues; past it a call is refused CANCELLED.",
    )
    max_message_bytes: int = setting(
        default=64 * 1024 * 1024,
        check=positive,
        doc="gRPC message size limit, both ways (a pull answer carries records).",
    )

    def __post_init__(self) -> None:
        validate(self, ValueError)


@dataclass(frozen=True, slots=True)
class ClusterView:
    """The etcd caches a pull-service reads (started and closed by its owner)."""

    topics: MetaWatcher[TopicConfig]
    brokers: MetaWatcher[BrokerRegistration]
    pull_services: MetaWatcher[PullServiceRegistration]
    #: Every group's consumers, by "group/client_id".
    consumers: MetaWatcher[ConsumerRegistration]

    @property
    def caches(self) -> tuple[MetaWatcher[Any], ...]:
        return (self.topics, self.brokers, self.pull_services, self.consumers)


class PullServiceServicer(ps_grpc.PullServiceServicer):
    """The PullService RPCs (see the module docstring)."""

    def __init__(
        self,
        config: PullServiceConfig,
        meta: MetaClient,
        view: ClusterView,
        channels: ChannelPool,
        sessions: SessionRegistry,
    ) -> None:
        self.config = config
        self.meta = meta
        self.view = view
        self.channels = channels
        self.sessions = sessions
        track_sessions(config.pull_service_id, sessions)
        self.store_hosts = StoreHosts(channels)
        #: Broker look-ups for routes and pulls: a broker whose key etcd just
        #: deleted (its lease expired while etcd stalled) stays routable while
        #: it registers again - a lease TTL (the cluster's, as this service's
        #: own) plus a second.
        self.brokers = RegisteredBrokers(view.brokers, grace_s=meta.config.lease_ttl_s + 1)
        # Command ids are unique per pull-service life: its id, its start, a counter.
        self._command_ids = (
            f"{config.pull_service_id}-{int(time.time() * 1000):x}-{n}" for n in itertools.count()
        )

    # -- routes and pulls -------------------------------------------------------------

    @rpc_method
    async def QueryRoute(
        self, request: ps.QueryRouteRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> ps.QueryRouteResponse:
        config = self.view.topics.get(request.topic)
        if config is None and request.topic == AUTO_CREATE_TOPIC_KEY_TOPIC:
            config = self._auto_create_route()
        if config is None:
            raise no_such_topic(request.topic)
        addresses = {
            name: broker.address
            for name in config.brokers
            if (broker := self.brokers.get(name)) is not None
        }
        hosts = await self.store_hosts.of(addresses)
        return ps.QueryRouteResponse(route=topic_route(config, self.brokers.get, hosts))

    def _auto_create_route(self) -> TopicConfig | None:
        """RocketMQ's TBW102 route: every registered writable store-node with
        ``default_topic_queue_nums`` queues. A producer sends a topic that does
        not exist yet there; the store-node that takes the send creates it."""
        brokers = tuple(
            sorted(name for name, b in self.view.brokers.snapshot().items() if b.perm.writable)
        )
        if not brokers:
            return None
        n = self.config.default_topic_queue_nums
        return TopicConfig(
            topic_name=AUTO_CREATE_TOPIC_KEY_TOPIC,
            read_queue_nums=n,
            write_queue_nums=n,
            brokers=brokers,
        )

    def _get_request(
        self, request: ps.PullRequest, group: str, suspend_ms: int
    ) -> sn.GetMessageRequest:
        """The store-node read a checked pull asks for."""
        q = request.queue
        get = sn.GetMessageRequest(
            group=group,
            topic=q.topic,
            queue_id=q.queue_id,
            offset=request.offset,
            max_msg_nums=min(request.max_nums, self.config.max_pull_nums),
            suspend_timeout_ms=suspend_ms,
        )
        if request.HasField("subscription"):
            get.subscription.CopyFrom(request.subscription)
        if request.HasField("commit_offset"):
            get.commit_offset = request.commit_offset
        if request.HasField("reset_epoch"):
            get.reset_epoch = request.reset_epoch
        return get

    async def _call_store_node(
        self,
        broker: BrokerRegistration,
        rpc: Callable[[str], Callable[..., Awaitable[Any]]],
        request: Any,
        suspend_ms: int,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> Any:
        """``rpc(address)`` on the broker's store-node, given the suspend time plus
        the margin (within the caller's deadline); a failure names the store-node."""
        timeout_s = call_timeout_s(context, (suspend_ms + self.config.downstream_margin_ms) / 1000)
        try:
            return await rpc(broker.address)(request, timeout=timeout_s)
        except grpc.aio.AioRpcError as e:
            peer = f"store-node {broker.broker_name!r} at {broker.address}"
            raise downstream_refusal(e, peer, timeout_s) from None

    @rpc_method
    async def Pull(
        self, request: ps.PullRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.PullResponse:
        broker = check_pull(request, self.brokers.get, self.view.topics.get)
        suspend_ms = min(request.suspend_timeout_ms, self.config.max_suspend_timeout_ms)
        get = self._get_request(request, request.group, suspend_ms)
        with pull_call("Pull", 1, request.group, suspend_ms):
            got = await self._call_store_node(
                broker, lambda a: self.channels.store_node(a).GetMessage, get, suspend_ms, context
            )
        answer = _pull_response(got, request.offset)
        if request.decode:
            decode_answer(answer, call="Pull", broker=broker.broker_name)
        return answer

    @rpc_method
    async def PullBatch(  # type: ignore[override]  # may answer serialized bytes
        self, request: ps.PullBatchRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.PullBatchResponse | bytes:
        """Whole-call checks (pull_service.proto), then each entry's
        PullMessageProcessor checks; the accepted entries go to the broker as one GetMessages, held
        as a whole unless an entry was refused (an answer worth sending now)."""
        suspend_ms = max(min(request.suspend_timeout_ms, self.config.max_suspend_timeout_ms), 0)
        with pull_call("PullBatch", len(request.pulls), request.group, suspend_ms):
            return await self._pull_batch(request, context)

    async def _pull_batch(
        self, request: ps.PullBatchRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.PullBatchResponse | bytes:
        group, pulls = request.group, request.pulls
        check_group(group)
        # One broker first: a queue id repeats across brokers, and that is the
        # mistake to name, not a duplicate queue.
        brokers = sorted({p.queue.broker_name for p in pulls})
        if len(brokers) > 1:
            raise invalid(f"a PullBatch reads one broker, not {', '.join(map(repr, brokers))}")
        check_batch_entries(
            "PullBatch",
            "pulls",
            "pulled",
            self.config.max_queues_per_pull,
            [(p.queue.topic, p.queue.queue_id, p.suspend_timeout_ms) for p in pulls],
        )
        if request.suspend_timeout_ms < 0:
            raise invalid(f"suspend_timeout_ms {request.suspend_timeout_ms} is negative")
        max_bytes = request.max_bytes if request.HasField("max_bytes") else None
        if max_bytes is not None and max_bytes < 1:
            raise invalid(f"max_bytes {max_bytes} must be at least 1 (unset = no cap)")
        for p in pulls:
            if p.group and p.group != group:
                raise invalid(f"an entry's group {p.group!r} is not the call's {group!r}")
            if p.decode:
                raise invalid("an entry sets decode: set PullBatchRequest.decode for the call")
            p.group = group  # the checks below read each entry's own group
        answers: list[pb.PullResponse | None] = []
        gets: list[sn.GetMessageRequest] = []
        broker: BrokerRegistration | None = None
        for p in pulls:
            try:
                broker = check_pull(p, self.brokers.get, self.view.topics.get)
            except Refusal as r:
                answers.append(pb.PullResponse(refused=refused(r)))
                continue
            gets.append(self._get_request(p, group, 0))
            answers.append(None)
        if broker is None:
            return pb.PullBatchResponse(results=[a for a in answers if a is not None])
        suspend_ms = min(request.suspend_timeout_ms, self.config.max_suspend_timeout_ms)
        get_messages = sn.GetMessagesRequest(reads=gets, suspend_timeout_ms=suspend_ms)
        reshape = request.decode or max_bytes is not None
        if len(gets) == len(pulls) and not reshape:
            # The store-node's answer is this call's, entry for entry: pass its
            # bytes through undecoded (the registration in pull_server lets
            # PullBatch answer with bytes). Decoding and re-encoding the
            # records was most of a pull-service's work per byte.
            raw: bytes = await self._call_store_node(
                broker, self.channels.get_messages_raw, get_messages, suspend_ms, context
            )
            return raw
        # Some entries were refused here: answer at once (nothing held), the
        # store-node's answers slotted in between. Decoding or capping needs the
        # answer parsed; it is held as the fast path's is when nothing was refused.
        if len(gets) < len(pulls):
            get_messages.suspend_timeout_ms = suspend_ms = 0
        got = await self._call_store_node(
            broker,
            lambda a: self.channels.store_node(a).GetMessages,
            get_messages,
            suspend_ms,
            context,
        )
        results = iter(got.results)
        merged = [a if a is not None else next(results) for a in answers]
        if max_bytes is not None:
            cap_bytes(merged, max_bytes)
        if request.decode:
            for answer in merged:
                decode_answer(answer, call="PullBatch", broker=broker.broker_name)
        return pb.PullBatchResponse(results=merged)

    # -- offsets ----------------------------------------------------------------------

    def _offset_broker(self, group: str, q: pb.MessageQueue) -> BrokerRegistration:
        """The broker holding ``q``'s offsets, after QueryOffsetRequest's checks
        (pull_service.proto) in their order."""
        check_group(group)
        broker = self.brokers.get(q.broker_name)
        if broker is None:
            raise Refusal(
                pb.RESPONSE_CODE_BROKER_NOT_EXIST, f"broker {q.broker_name!r} is not registered"
            )
        config = self.view.topics.get(q.topic)
        if config is None:
            raise no_such_topic(q.topic)
        if not 0 <= q.queue_id < config.read_queue_nums:
            raise invalid(
                f"queue id {q.queue_id} is out of range: topic {q.topic!r} has "
                f"{config.read_queue_nums} read queues"
            )
        return broker

    @rpc_method
    async def QueryOffset(
        self, request: ps.QueryOffsetRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> ps.QueryOffsetResponse:
        q = request.queue
        broker = self._offset_broker(request.group, q)
        committed, bounds = await asyncio.gather(
            self._call_store_node(
                broker,
                lambda a: self.channels.store_node(a).QueryConsumerOffset,
                sn.QueryConsumerOffsetRequest(
                    group=request.group, topic=q.topic, queue_id=q.queue_id
                ),
                0,
                context,
            ),
            self._call_store_node(
                broker,
                lambda a: self.channels.store_node(a).GetMinMaxOffset,
                sn.GetMinMaxOffsetRequest(topic=q.topic, queue_id=q.queue_id),
                0,
                context,
            ),
        )
        return ps.QueryOffsetResponse(
            offset=committed.offset,
            reset_epoch=committed.reset_epoch,
            min_offset=bounds.min_offset,
            max_offset=bounds.max_offset,
        )

    @rpc_method
    async def CommitOffset(
        self, request: ps.CommitOffsetRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> ps.CommitOffsetResponse:
        q = request.queue
        broker = self._offset_broker(request.group, q)
        if request.offset < 0:
            raise invalid(f"offset {request.offset} is negative")
        update = sn.UpdateConsumerOffsetRequest(
            group=request.group, topic=q.topic, queue_id=q.queue_id, offset=request.offset
        )
        if request.HasField("reset_epoch"):
            update.reset_epoch = request.reset_epoch
        got = await self._call_store_node(
            broker,
            lambda a: self.channels.store_node(a).UpdateConsumerOffset,
            update,
            0,
            context,
        )
        return ps.CommitOffsetResponse(commit=got.commit)

    # -- consumers --------------------------------------------------------------------

    @rpc_method
    async def Session(  # type: ignore[override]
        self, request_iterator: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> None:
        # A coroutine using context.read()/write() rather than a generator: grpc.aio
        # supports both, and this one both reads and writes at any time.
        await self.sessions.serve(context)

    @rpc_method
    async def ListConsumers(
        self, request: ps.ListConsumersRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> ps.ListConsumersResponse:
        check_group(request.group)
        local = {s.client_id: s.info for s in self.sessions.of_group(request.group)}
        if not _local_scope(context):
            for client_id, registration in (await self._registered(request.group)).items():
                local.setdefault(client_id, consumer_info(registration))
            if not local:
                raise _not_online(request.group)
        return ps.ListConsumersResponse(consumers=[local[c] for c in sorted(local)])

    @rpc_method
    async def NotifyConsumers(
        self, request: ps.NotifyConsumersRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> ps.NotifyConsumersResponse:
        check_group(request.group)
        command = self._command(request.command)
        wait_s = command.timeout_ms / 1000
        remaining: float | None = context.time_remaining()
        if remaining is not None:
            wait_s = max(0.0, min(wait_s, remaining - _ANSWER_MARGIN_S))
        client_ids = list(request.client_ids)
        if _local_scope(context):
            acks = await self.sessions.notify(request.group, command, client_ids, wait_s)
        else:
            acks = await self._notify_cluster(request.group, command, client_ids, wait_s, context)
        return ps.NotifyConsumersResponse(command_id=command.command_id, acks=acks)

    @rpc_method
    async def LockQueues(
        self, request: ps.LockQueuesRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> ps.LockQueuesResponse:
        queues = _lock_keys(request.queues)
        held = await self.sessions.lock_queues(request.group, request.client_id, queues)
        return ps.LockQueuesResponse(
            locked=[q for q, ok in zip(request.queues, held, strict=True) if ok]
        )

    @rpc_method
    async def UnlockQueues(
        self, request: ps.UnlockQueuesRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> ps.UnlockQueuesResponse:
        queues = _lock_keys(request.queues)
        released = await self.sessions.lock_queues(
            request.group, request.client_id, queues, release=True
        )
        return ps.UnlockQueuesResponse(
            unlocked=[q for q, ok in zip(request.queues, released, strict=True) if ok]
        )

    def _command(self, given: ps.Command) -> ps.Command:
        """The command to push: ``given`` with its id assigned and its timeout
        defaulted and capped. INVALID_PARAMETER without a body or with a negative timeout."""
        if given.WhichOneof("body") is None:
            raise invalid("the command has no body (reset_offset or rebalance)")
        if given.timeout_ms < 0:
            raise invalid(f"command timeout_ms {given.timeout_ms} is negative")
        command = ps.Command()
        command.CopyFrom(given)
        if not command.command_id:
            command.command_id = next(self._command_ids)
        command.timeout_ms = min(
            command.timeout_ms or self.config.default_command_timeout_ms,
            self.config.max_command_timeout_ms,
        )
        return command

    async def _registered(self, group: str) -> dict[str, ConsumerRegistration]:
        """The group's consumers in etcd now; SERVICE_NOT_AVAILABLE when etcd is away
        (a partial answer would hide consumers from admin)."""
        try:
            return await self.meta.list_consumers(group)
        except MetaUnavailableError as e:
            raise Refusal(
                pb.RESPONSE_CODE_SERVICE_NOT_AVAILABLE,
                f"{e}; only this pull-service's sessions are known "
                f"(ask with metadata {SCOPE_KEY}: {SCOPE_LOCAL} for those)",
            ) from None

    async def _notify_cluster(
        self,
        group: str,
        command: ps.Command,
        client_ids: list[str],
        wait_s: float,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> list[ps.ConsumerAck]:
        """Deliver to the group's consumers wherever their session is: here
        directly, elsewhere through their pull-service; one ack per consumer."""
        me = self.config.pull_service_id
        owners = {c: r.pull_service_id for c, r in (await self._registered(group)).items()}
        # A session opened here whose key is not in etcd yet is still live.
        owners.update({s.client_id: me for s in self.sessions.of_group(group)})
        if not owners and not client_ids:
            raise _not_online(group)
        acks: list[ps.ConsumerAck] = []
        by_owner: dict[str, list[str]] = {}
        for client_id in sorted(set(client_ids)) or sorted(owners):
            owner = owners.get(client_id)
            if owner is None:
                acks.append(
                    ps.ConsumerAck(
                        client_id=client_id,
                        outcome=ps.COMMAND_OUTCOME_NOT_CONNECTED,
                        detail=f"consumer {group}/{client_id} has no session in the cluster",
                    )
                )
            else:
                by_owner.setdefault(owner, []).append(client_id)
        parts = await asyncio.gather(
            *(
                self.sessions.notify(group, command, ids, wait_s)
                if owner == me
                else self._forward(owner, group, command, ids, wait_s, context)
                for owner, ids in by_owner.items()
            )
        )
        for part in parts:
            acks.extend(part)
        return sorted(acks, key=lambda a: a.client_id)

    async def _forward(
        self,
        owner: str,
        group: str,
        command: ps.Command,
        client_ids: list[str],
        wait_s: float,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> list[ps.ConsumerAck]:
        """NotifyConsumers on pull-service ``owner``, limited to its own sessions;
        an owner that cannot be reached makes its consumers NOT_CONNECTED (TIMEOUT
        when it did not answer in time), with the reason as the detail."""
        registration = self.view.pull_services.get(owner)

        def unreached(outcome: ps.CommandOutcome.ValueType, why: str) -> list[ps.ConsumerAck]:
            return [ps.ConsumerAck(client_id=c, outcome=outcome, detail=why) for c in client_ids]

        if registration is None:
            return unreached(
                ps.COMMAND_OUTCOME_NOT_CONNECTED, f"its pull-service {owner!r} is not registered"
            )
        timeout_s = call_timeout_s(context, wait_s + self.config.downstream_margin_ms / 1000)
        stub = self.channels.pull_service(registration.address)
        try:
            reply = await stub.NotifyConsumers(
                ps.NotifyConsumersRequest(group=group, command=command, client_ids=client_ids),
                metadata=((SCOPE_KEY, SCOPE_LOCAL),),
                timeout=timeout_s,
            )
        except grpc.aio.AioRpcError as e:
            peer = f"pull-service {owner!r} at {registration.address}"
            why = downstream_refusal(e, peer, timeout_s).message
            if e.code() is grpc.StatusCode.DEADLINE_EXCEEDED:
                return unreached(ps.COMMAND_OUTCOME_TIMEOUT, why)
            return unreached(ps.COMMAND_OUTCOME_NOT_CONNECTED, why)
        return list(reply.acks)


def _pull_response(got: sn.GetMessageResponse, offset: int) -> pb.PullResponse:
    return pull_response(
        got.status,
        offset,
        next_begin_offset=got.next_begin_offset,
        min_offset=got.min_offset,
        max_offset=got.max_offset,
        records=got.records,
        commit=got.commit if got.HasField("commit") else None,
    )


#: Most queues one LockQueues / UnlockQueues names.
MAX_LOCK_QUEUES = 1024


def _lock_keys(queues: Sequence[pb.MessageQueue]) -> list[QueueKey]:
    """The lock keys' parts of ``queues``; INVALID_PARAMETER for too many (names
    and queue ids are checked as the keys are built: MetaKeys.queue_lock)."""
    if len(queues) > MAX_LOCK_QUEUES:
        raise invalid(f"{len(queues)} queues in one call; at most {MAX_LOCK_QUEUES}")
    return [(q.topic, q.broker_name, q.queue_id) for q in queues]


def _not_online(group: str) -> Refusal:
    """RocketMQ's answer for a group with no live consumer (consumerConnection,
    and the reset that then takes the offline path)."""
    return Refusal(
        pb.RESPONSE_CODE_CONSUMER_NOT_ONLINE, f"consumer group {group!r} has no live consumer"
    )


def _local_scope(context: grpc.aio.ServicerContext[Any, Any]) -> bool:
    return any(
        key == SCOPE_KEY and value == SCOPE_LOCAL
        for key, value in context.invocation_metadata() or ()
    )
