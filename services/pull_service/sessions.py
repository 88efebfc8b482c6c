"""Consumer sessions: the Session stream, its etcd registration, commands and acks.

A consumer keeps one bidirectional ``Session`` stream with a pull-service
(docs/pull-service.md#sessions). Its life, as :meth:`SessionRegistry.serve` runs it:

1. The first frame must be ``open`` (group, client id, subscriptions,
   version); it is validated, and a live session of the same
   ``(group, client_id)`` is ended (ABORTED): here at once, on another
   pull-service when that one sees the key change hands in etcd
   (:meth:`SessionRegistry.on_consumer_change`).
2. ``consumers/<group>/<client_id>`` is put in etcd as a
   ConsumerRegistration (subscriptions, version and the session's start,
   ``connected_since_ms``, so any pull-service can list it) under a lease
   this process keeps alive, so a consumer whose pull-service dies
   disappears one TTL later by itself.
   ``opened`` is sent once the key is in etcd (or after the etcd operation
   timeout, when etcd is away: the key is then put as soon as etcd answers).
3. Then any frame resets the silence timer (a ``heartbeat`` exists for
   that); ``ack`` answers a command; a session silent for
   ``session_timeout_ms`` (3 x the heartbeat interval) is ended.
4. The service pushes ``command`` frames (:meth:`SessionRegistry.deliver`),
   each answered by exactly one ``ack`` carrying its ``command_id``; a
   delivery is a span, and the command carries its context in
   ``trace_context`` (the stream's metadata is the consumer's own).
5. However the stream ends (the consumer half-closes, cancels, vanishes, is
   replaced or times out, or the service stops) the lease is revoked and
   the key goes at once; commands still waiting for an ack count as
   DISCONNECTED.

How a session ends (the gRPC status; the RocketMQ code in ``basalt-response-code``)::

    consumer half-closes the stream     OK
    first frame is not open / 2nd open  FAILED_PRECONDITION  INVALID_PARAMETER
    bad group, client id, topic         INVALID_ARGUMENT     INVALID_PARAMETER
    a subscription does not parse       INVALID_ARGUMENT     SUBSCRIPTION_PARSE_FAILED
    silent for session_timeout_ms       DEADLINE_EXCEEDED    CONSUMER_NOT_ONLINE
    replaced by a newer session         ABORTED              CONSUMER_NOT_ONLINE
    the pull-service is stopping        UNAVAILABLE          SERVICE_NOT_AVAILABLE

Concurrency: everything runs on the service's event loop; one task per
stream (the RPC's own) reads frames and writes commands.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from typing import Any

import grpc
from opentelemetry import trace

from basalt.common.tracing import (
    MESSAGING_CLIENT_ID,
    MESSAGING_CONSUMER_GROUP_NAME,
    MESSAGING_SYSTEM,
    MESSAGING_SYSTEM_ROCKETMQ,
    inject_context,
)
from basalt.services.checks import check_group
from basalt.services.errors import Outcome, Refusal, invalid
from basalt.services.meta.client import MetaClient, QueueKey
from basalt.services.meta.errors import MetaUnavailableError, MetaValidationError
from basalt.services.meta.lease import Registration
from basalt.services.meta.model import (
    ConsumerRegistration,
    ExpressionType,
    Subscription,
    TopicConfig,
)
from basalt.services.meta.watch import MetaChange
from basalt.services.pull_service.pull_rules import check_subscription
from basalt.v1 import common_pb2 as pb
from basalt.v1 import pull_service_pb2 as ps

log = logging.getLogger(__name__)

#: The API's proxy: it binds to whatever TracerProvider the process installs.
_tracer = trace.get_tracer("basalt.services.pull_service")


def consumer_info(registration: ConsumerRegistration) -> pb.ConsumerInfo:
    """A registered consumer as ListConsumers shows it, whichever pull-service holds
    its session (``connected_since_ms`` comes from the registration: 0, unknown, only
    for a registration written before it carried the field)."""
    return pb.ConsumerInfo(
        group=registration.group,
        client_id=registration.client_id,
        pull_service_id=registration.pull_service_id,
        subscriptions=[
            pb.TopicSubscription(
                topic=s.topic,
                subscription=pb.Subscription(
                    type=pb.EXPRESSION_TYPE_SQL92
                    if s.expression_type is ExpressionType.SQL92
                    else pb.EXPRESSION_TYPE_TAG,
                    expression=s.expression,
                ),
            )
            for s in registration.subscriptions
        ],
        client_version=registration.client_version,
        connected_since_ms=registration.connected_since_ms,
    )


class ConsumerSession:
    """One consumer's live session: its registration, outbound frames and pending acks."""

    def __init__(self, registration: ConsumerRegistration) -> None:
        self.value = registration
        self.key = (registration.group, registration.client_id)
        self.info = consumer_info(registration)
        #: The etcd registration, once started.
        self.registration: Registration | None = None
        #: Commands to write, or the Refusal that ends the stream.
        self._outbound: asyncio.Queue[ps.Command | Refusal] = asyncio.Queue()
        self._pending: dict[str, asyncio.Future[ps.ConsumerAck]] = {}
        self._finished = False
        #: Set once the session is over and its registration revoked.
        self.closed = asyncio.Event()

    @property
    def client_id(self) -> str:
        return self.value.client_id

    def push(self, command: ps.Command) -> asyncio.Future[ps.ConsumerAck]:
        """Queue ``command`` for the consumer; the future resolves with its ack
        (OK / FAILED) or DISCONNECTED. The same command id twice shares one future."""
        pending = self._pending.get(command.command_id)
        if pending is not None:
            return pending
        future: asyncio.Future[ps.ConsumerAck] = asyncio.get_running_loop().create_future()
        if self._finished:
            future.set_result(
                self._ack(ps.COMMAND_OUTCOME_DISCONNECTED, "the session ended before the command")
            )
            return future
        self._pending[command.command_id] = future
        self._outbound.put_nowait(command)
        return future

    def forget(self, command_id: str) -> None:
        """Stop waiting for ``command_id``'s ack (its sender timed out)."""
        self._pending.pop(command_id, None)

    def acked(self, ack: ps.CommandAck) -> None:
        future = self._pending.pop(ack.command_id, None)
        if future is None or future.done():
            # Late (the sender gave up) or unknown: nothing waits for it.
            log.debug("%s/%s: ack of %r ignored", *self.key, ack.command_id)
            return
        outcome = ps.COMMAND_OUTCOME_OK if ack.ok else ps.COMMAND_OUTCOME_FAILED
        future.set_result(self._ack(outcome, ack.detail))

    def end(self, refusal: Refusal) -> None:
        """Ask the stream to end with ``refusal`` (replaced, stopping)."""
        self._outbound.put_nowait(refusal)

    async def next_outbound(self) -> ps.Command | Refusal:
        return await self._outbound.get()

    def finish(self) -> None:
        """The stream is over: every command still waiting counts as DISCONNECTED."""
        self._finished = True
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_result(
                    self._ack(ps.COMMAND_OUTCOME_DISCONNECTED, "the session ended before the ack")
                )

    def _ack(self, outcome: ps.CommandOutcome.ValueType, detail: str) -> ps.ConsumerAck:
        return ps.ConsumerAck(client_id=self.client_id, outcome=outcome, detail=detail)


class SessionRegistry:
    """The sessions held by one pull-service, by ``(group, client_id)``."""

    def __init__(
        self,
        pull_service_id: str,
        meta: MetaClient,
        *,
        heartbeat_interval_ms: int,
        register_timeout_s: float,
    ) -> None:
        self.pull_service_id = pull_service_id
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.session_timeout_ms = 3 * heartbeat_interval_ms
        self._meta = meta
        self._register_timeout_s = register_timeout_s
        self._sessions: dict[tuple[str, str], ConsumerSession] = {}
        #: Background work: take-over checks and rebalance pushes.
        self._checks: set[asyncio.Task[Any]] = set()
        self._rebalance_ids = itertools.count()

    # -- look-ups -------------------------------------------------------------------

    def get(self, group: str, client_id: str) -> ConsumerSession | None:
        return self._sessions.get((group, client_id))

    def of_group(self, group: str) -> list[ConsumerSession]:
        """The group's sessions here, by client id."""
        return sorted(
            (s for (g, _), s in self._sessions.items() if g == group), key=lambda s: s.client_id
        )

    def __len__(self) -> int:
        return len(self._sessions)

    # -- the stream -----------------------------------------------------------------

    async def serve(self, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        """The Session RPC: runs one stream to its end (see the module docstring).
        Raises the Refusal that ends it, if any."""
        first = await self._read_first(context)
        if first is None:
            return  # closed before opening: nothing to undo
        kind = first.WhichOneof("frame")
        if kind != "open":
            raise Refusal.of(
                Outcome.SESSION_OUT_OF_ORDER,
                f"the first frame of a session must be open, got {kind or 'an empty frame'}",
            )
        session, replaced = self._begin(first.open)
        try:
            await self._register(session, replaced)
            opened = ps.SessionOpened(
                pull_service_id=self.pull_service_id,
                heartbeat_interval_ms=self.heartbeat_interval_ms,
                session_timeout_ms=self.session_timeout_ms,
            )
            await context.write(ps.SessionResponse(opened=opened))
            await self._run(session, context)
        finally:
            # Shielded: a cancelled stream (the consumer vanished) must still
            # revoke its registration.
            await asyncio.shield(self._close(session))

    async def _read_first(
        self, context: grpc.aio.ServicerContext[Any, Any]
    ) -> ps.SessionRequest | None:
        """The first frame (None at end of stream), within the session timeout."""
        try:
            async with asyncio.timeout(self.session_timeout_ms / 1000):
                frame: object = await context.read()
        except TimeoutError:
            raise self._silent(None) from None
        if frame is grpc.aio.EOF:
            return None
        assert isinstance(frame, ps.SessionRequest)
        return frame

    def _silent(self, session: ConsumerSession | None) -> Refusal:
        who = "the consumer" if session is None else "consumer {}/{}".format(*session.key)
        return Refusal.of(
            Outcome.SESSION_SILENT,
            f"no frame from {who} for {self.session_timeout_ms} ms "
            f"(heartbeat interval {self.heartbeat_interval_ms} ms): session closed",
        )

    def _begin(self, request: ps.OpenSession) -> tuple[ConsumerSession, ConsumerSession | None]:
        """Validate ``request`` and make its session the live one, ending any older
        session of the same consumer here. Returns (new, replaced)."""
        session = ConsumerSession(self._registration_value(request))
        replaced = self._sessions.get(session.key)
        if replaced is not None:
            replaced.end(
                Refusal.of(
                    Outcome.SESSION_REPLACED,
                    "consumer {}/{} opened a newer session".format(*session.key),
                )
            )
        self._sessions[session.key] = session
        return session, replaced

    def _registration_value(self, request: ps.OpenSession) -> ConsumerRegistration:
        check_group(request.group)
        if not request.client_id:
            raise invalid("client_id must not be empty")
        try:
            subscriptions = []
            for s in request.subscriptions:
                check_subscription(s.subscription)
                sql = s.subscription.type == pb.EXPRESSION_TYPE_SQL92
                subscriptions.append(
                    Subscription(
                        topic=s.topic,
                        expression_type=ExpressionType.SQL92 if sql else ExpressionType.TAG,
                        # RocketMQ's FilterAPI: an empty TAG expression means "*".
                        expression=s.subscription.expression or ("" if sql else "*"),
                    )
                )
            return ConsumerRegistration(
                group=request.group,
                client_id=request.client_id,
                pull_service_id=self.pull_service_id,
                subscriptions=tuple(subscriptions),
                client_version=request.client_version,
                # The session's start, kept in etcd for ListConsumers on every pull-service.
                connected_since_ms=int(time.time() * 1000),
            )
        except MetaValidationError as e:
            raise invalid(str(e)) from None

    async def _register(self, session: ConsumerSession, replaced: ConsumerSession | None) -> None:
        if replaced is not None:
            # Let the older session revoke its lease first, so that revoking it
            # cannot delete the key this session is about to put.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._register_timeout_s):
                    await replaced.closed.wait()
        session.registration = await self._meta.register(session.value, wait=False)
        if not await session.registration.wait_registered(self._register_timeout_s):
            log.warning(
                "consumer %s/%s: etcd unreachable; it is registered once etcd answers",
                *session.key,
            )
        log.info("consumer %s/%s opened a session", *session.key)

    async def _run(
        self, session: ConsumerSession, context: grpc.aio.ServicerContext[Any, Any]
    ) -> None:
        """Read frames and write commands until the stream ends."""
        loop = asyncio.get_running_loop()
        timeout_s = self.session_timeout_ms / 1000
        deadline = loop.time() + timeout_s
        read: asyncio.Future[Any] = asyncio.ensure_future(context.read())
        out: asyncio.Future[ps.Command | Refusal] = asyncio.ensure_future(session.next_outbound())
        try:
            while True:
                done, _ = await asyncio.wait(
                    (read, out),
                    timeout=max(0.0, deadline - loop.time()),
                    return_when=asyncio.FIRST_COMPLETED,
                )
                if not done:
                    raise self._silent(session)
                if read in done:
                    frame = read.result()
                    if frame is grpc.aio.EOF:
                        return  # the consumer closed its side: a clean end
                    deadline = loop.time() + timeout_s
                    self._on_frame(session, frame)
                    read = asyncio.ensure_future(context.read())
                if out in done:
                    item = out.result()
                    if isinstance(item, Refusal):
                        raise item
                    await context.write(ps.SessionResponse(command=item))
                    out = asyncio.ensure_future(session.next_outbound())
        finally:
            read.cancel()
            out.cancel()

    def _on_frame(self, session: ConsumerSession, frame: ps.SessionRequest) -> None:
        kind = frame.WhichOneof("frame")
        if kind == "ack":
            session.acked(frame.ack)
        elif kind == "open":
            raise Refusal.of(
                Outcome.SESSION_OUT_OF_ORDER,
                "consumer {}/{}: the session is already open".format(*session.key),
            )
        # A heartbeat (or an empty frame) only proves the consumer is there.

    async def _close(self, session: ConsumerSession) -> None:
        if self._sessions.get(session.key) is session:
            del self._sessions[session.key]
        session.finish()
        try:
            if session.registration is not None:
                await session.registration.close()  # revokes: the key goes now
        finally:
            session.closed.set()
            log.info("consumer %s/%s: session closed", *session.key)

    # -- commands -------------------------------------------------------------------

    async def deliver(
        self, session: ConsumerSession, command: ps.Command, timeout_s: float
    ) -> ps.ConsumerAck:
        """Push ``command`` down ``session`` and wait up to ``timeout_s`` for its
        ack, in a CLIENT span "deliver <kind>" whose context the command carries
        (its ``trace_context``, on a copy: ``command`` goes to other sessions
        too): the stream's metadata is the consumer's, from when it opened."""
        kind = command.WhichOneof("body")
        with _tracer.start_as_current_span(
            f"deliver {kind}",
            kind=trace.SpanKind.CLIENT,
            attributes={
                MESSAGING_SYSTEM: MESSAGING_SYSTEM_ROCKETMQ,
                MESSAGING_CONSUMER_GROUP_NAME: session.value.group,
                MESSAGING_CLIENT_ID: session.client_id,
                "basalt.command.id": command.command_id,
            },
        ) as span:
            if span.is_recording():
                traced = ps.Command()
                traced.CopyFrom(command)
                traced.trace_context.clear()
                inject_context(traced.trace_context)
                command = traced
            ack = await self._deliver(session, command, timeout_s)
            span.set_attribute("basalt.command.outcome", ps.CommandOutcome.Name(ack.outcome))
            if ack.outcome != ps.COMMAND_OUTCOME_OK:
                span.set_status(trace.StatusCode.ERROR, ack.detail)
            return ack

    async def _deliver(
        self, session: ConsumerSession, command: ps.Command, timeout_s: float
    ) -> ps.ConsumerAck:
        future = session.push(command)
        try:
            async with asyncio.timeout(timeout_s):
                return await asyncio.shield(future)
        except TimeoutError:
            return ps.ConsumerAck(
                client_id=session.client_id,
                outcome=ps.COMMAND_OUTCOME_TIMEOUT,
                detail=f"no ack within {timeout_s * 1000:.0f} ms",
            )
        finally:
            if not future.done():  # timed out, or the caller went away
                session.forget(command.command_id)

    async def notify(
        self, group: str, command: ps.Command, client_ids: list[str], timeout_s: float
    ) -> list[ps.ConsumerAck]:
        """Deliver ``command`` to the group's sessions here (only ``client_ids`` when
        given: one without a session here is NOT_CONNECTED), concurrently; one ack
        per consumer, by client id."""
        targets = sorted(set(client_ids)) or [s.client_id for s in self.of_group(group)]

        async def one(client_id: str) -> ps.ConsumerAck:
            session = self.get(group, client_id)
            if session is None:
                return ps.ConsumerAck(
                    client_id=client_id,
                    outcome=ps.COMMAND_OUTCOME_NOT_CONNECTED,
                    detail=f"no session on pull-service {self.pull_service_id}",
                )
            return await self.deliver(session, command, timeout_s)

        return list(await asyncio.gather(*(one(c) for c in targets)))

    def request_rebalance(self, sessions: list[ConsumerSession], topics: list[str]) -> None:
        """Push a RebalanceCommand (of ``topics``; empty = all) to each of
        ``sessions`` without waiting: the ack only ends the delivery."""
        loop = asyncio.get_running_loop()
        timeout_s = self.session_timeout_ms / 1000
        for session in sessions:
            command = ps.Command(
                command_id=f"{self.pull_service_id}-rebalance-{next(self._rebalance_ids)}",
                timeout_ms=int(timeout_s * 1000),
                rebalance=ps.RebalanceCommand(topics=topics),
            )
            task = loop.create_task(self.deliver(session, command, timeout_s))
            self._checks.add(task)
            task.add_done_callback(self._checks.discard)

    def on_topic_change(self, change: MetaChange[TopicConfig]) -> None:
        """Listener of the topic cache: a topic whose queues changed (counts, perm,
        brokers) or that went away makes its subscribers here rebalance now."""
        old, new = change.old, change.new
        if old is not None and new is not None and _queues_of(old) == _queues_of(new):
            return
        config = new if new is not None else old
        assert config is not None  # a change has one side at least
        topic = config.topic_name
        subscribers = [
            s
            for s in self._sessions.values()
            if any(sub.topic == topic for sub in s.value.subscriptions)
        ]
        self.request_rebalance(subscribers, [topic])

    # -- queue locks ----------------------------------------------------------------

    async def lock_queues(
        self, group: str, client_id: str, queues: list[QueueKey], *, release: bool = False
    ) -> list[bool]:
        """Lock (or with ``release`` unlock) ``queues`` for the consumer whose session
        is here, under its registration's lease; per queue, True where it holds
        (released) it. CONSUMER_NOT_ONLINE without a session here,
        SERVICE_NOT_AVAILABLE while etcd is away or the session not yet registered."""
        check_group(group)
        session = self.get(group, client_id)
        if session is None:
            raise Refusal(
                pb.RESPONSE_CODE_CONSUMER_NOT_ONLINE,
                f"consumer {group}/{client_id} has no session on pull-service "
                f"{self.pull_service_id}: open one here before locking queues",
            )
        lease_id = None if session.registration is None else session.registration.lease_id
        try:
            if release:
                return await self._meta.unlock_queues(group, client_id, queues)
            if lease_id is None:
                raise Refusal(
                    pb.RESPONSE_CODE_SERVICE_NOT_AVAILABLE,
                    f"consumer {group}/{client_id} is not registered in etcd yet; retry",
                )
            return await self._meta.lock_queues(group, client_id, queues, lease_id)
        except MetaValidationError as e:  # a queue's name: the request's own
            raise invalid(str(e)) from None

    # -- sessions replaced on another pull-service ------------------------------------

    def on_consumer_change(self, change: MetaChange[ConsumerRegistration]) -> None:
        """Listener of a watch on ``consumers/``.

        A consumer that joined or left its group makes the group's other
        sessions here rebalance now (a RebalanceCommand) rather than at their
        next periodic rebalance. A consumer that has a session here and was
        just registered by another pull-service may have opened a newer
        session there; if etcd confirms it, the session here ends (ABORTED)."""
        old, new = change.old, change.new
        if (old is None) != (new is None):
            member = new or old
            assert member is not None
            self.request_rebalance(
                [s for s in self.of_group(member.group) if s.client_id != member.client_id], []
            )
        if new is None or new.pull_service_id == self.pull_service_id:
            return
        session = self._sessions.get((new.group, new.client_id))
        if session is not None:
            task = asyncio.get_running_loop().create_task(self._check_taken_over(session))
            self._checks.add(task)
            task.add_done_callback(self._checks.discard)

    async def _check_taken_over(self, session: ConsumerSession) -> None:
        # The watch may deliver another pull-service's put after this session's
        # own newer one: read the key now (after our put) to know who holds it.
        group, client_id = session.key
        try:
            current = (await self._meta.list_consumers(group)).get(client_id)
        except MetaUnavailableError:
            return  # cannot tell; the next change asks again
        if (
            current is not None
            and current.pull_service_id != self.pull_service_id
            and self._sessions.get(session.key) is session
        ):
            session.end(
                Refusal.of(
                    Outcome.SESSION_REPLACED,
                    f"consumer {group}/{client_id} opened a newer session on "
                    f"pull-service {current.pull_service_id}",
                )
            )

    # -- stopping -------------------------------------------------------------------

    async def close_all(self, refusal: Refusal, timeout_s: float) -> None:
        """End every session with ``refusal`` and wait (up to ``timeout_s``) until
        their registrations are revoked."""
        for task in list(self._checks):
            task.cancel()
        sessions = list(self._sessions.values())
        for session in sessions:
            session.end(refusal)
        if sessions:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout_s):
                    await asyncio.gather(*(s.closed.wait() for s in sessions))


def _queues_of(config: TopicConfig) -> tuple[object, ...]:
    """What of a topic's config decides which queues its consumers read."""
    return (config.read_queue_nums, config.perm, tuple(config.brokers))
