"""Group membership: what a subscribing consumer does to share queues with its group.

Both :class:`basalt.client.PushConsumer` and :class:`basalt.client.LitePullConsumer` in
subscribe mode hold a :class:`GroupMember`, which:

* keeps one ``PullService.Session`` stream open (heartbeats at the interval
  the service asks, commands answered by acks), opening it again with a
  backoff when it ends; a session that ends takes every queue away at once,
  uncommitted (its locks went with the session's lease, so another member
  may own them already);
* rebalances each subscribed topic (a PushConsumer's include its group's
  ``%RETRY%<group>``, which has no queues until it exists) with
  AllocateMessageQueueAveragely over
  the group's live client ids (``ListConsumers``, sorted) and the topic's
  read queues (``QueryRoute``, sorted): on start, when the service pushes a
  RebalanceCommand (a member joined or left, the topic's queues changed),
  and every ``rebalance_interval_ms``;
* takes a queue only under its lock (``LockQueues``, bound to the session):
  queues no longer allocated here are given up (their owner commits them)
  and then unlocked, so the next owner starts where this one stopped; queues
  still locked by their previous owner are tried again every
  ``lock_retry_interval_ms`` until it lets go;
* carries out RESET_OFFSET commands through its owner, then acks them, in a
  span of the trace the command carries (its ``trace_context``).

What "owning" a queue means is the consumer's: a :class:`QueueOwner`. Every
call into it runs under :attr:`GroupMember.lock`, which the owner takes too
for its own changes of ownership.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Coroutine, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import grpc
from opentelemetry import trace

from basalt.client.channels import finish_requests
from basalt.client.consumer_base import (
    ConsumerClient,
    ConsumerConfig,
    MessageQueue,
    Position,
    subscription_of,
)
from basalt.client.errors import ClientError, TopicNotFoundError
from basalt.client.rebalance import allocate_averagely
from basalt.client.tasks import TaskOwner, gather_all
from basalt.common import dial
from basalt.common.message import retry_topic
from basalt.common.tracing import (
    MESSAGING_CLIENT_ID,
    MESSAGING_CONSUMER_GROUP_NAME,
    MESSAGING_SYSTEM,
    MESSAGING_SYSTEM_ROCKETMQ,
    extracted_context,
)
from basalt.v1 import common_pb2 as pb
from basalt.v1 import pull_service_pb2 as ps

log = logging.getLogger(__name__)

#: The API's proxy: it binds to whatever TracerProvider the process installs.
_tracer = trace.get_tracer("basalt.client")

CLIENT_VERSION = "basalt-py 0.1.0"
#: Deadline of the membership's unary calls.
CALL_TIMEOUT_S = 10.0
#: PullService.Session, opened by :func:`basalt.common.dial.open_stream`.
_SESSION = dial.rpc_path(ps.DESCRIPTOR.services_by_name["PullService"].methods_by_name["Session"])


@dataclass(frozen=True, slots=True)
class TopicSubscription:
    """A subscribed topic and its filter (TAG expression, or SQL92)."""

    topic: str
    expression: str
    sql92: bool

    def to_proto(self) -> pb.TopicSubscription:
        return pb.TopicSubscription(
            topic=self.topic, subscription=subscription_of(self.expression, self.sql92)
        )


class QueueOwner(Protocol):
    """What a consumer does with the queues its membership gives it. Every
    method is called under :attr:`GroupMember.lock`."""

    def owned(self) -> set[MessageQueue]:
        """The queues owned now."""
        ...

    async def take(self, queues: dict[MessageQueue, Position]) -> None:
        """Start owning ``queues`` (their locks are held) from these positions."""
        ...

    async def give_up(self, queues: Sequence[MessageQueue], *, commit: bool) -> None:
        """Stop owning ``queues``: no more reads of them once this returns; with
        ``commit`` their progress is stored first."""
        ...

    async def reset(self, table: dict[MessageQueue, pb.QueueOffset]) -> int:
        """Adopt a reset's offsets and epochs for the owned queues in ``table``;
        returns how many were owned."""
        ...


class GroupMember:
    """One consumer's membership of its group (see the module docstring).
    :meth:`start` it once the owner is ready; :meth:`close` it before closing
    the client's channels."""

    def __init__(
        self,
        client: ConsumerClient,
        owner: QueueOwner,
        config: ConsumerConfig,
        subscriptions: dict[str, TopicSubscription],
    ) -> None:
        """``subscriptions`` is the consumer's own dict (filled before :meth:`start`)."""
        self.client = client
        self.owner = owner
        self.client_id = config.client_id
        self.group = config.consumer_group
        self.subscriptions = subscriptions
        self.config = config
        #: Serializes rebalances, resets, session loss and the owner's own changes.
        self.lock = asyncio.Lock()
        self._rebalance_now = asyncio.Event()
        #: Some queue allocated here is still locked by another member.
        self._locks_pending = False
        self.session_up = asyncio.Event()
        self._closing = False
        self._session_task: asyncio.Task[None] | None = None
        #: The session task, and the background work (rebalancer, commands,
        #: the owner's own loops): all ended by close.
        self._tasks = TaskOwner()
        self._call: grpc.aio.StreamStreamCall[ps.SessionRequest, ps.SessionResponse] | None = None
        self._write_lock = asyncio.Lock()

    @property
    def started(self) -> bool:
        return self._session_task is not None

    def start(self) -> None:
        self._session_task = self._tasks.spawn(
            self._keep_session(), name=f"basalt-session:{self.client_id}", untraced=True
        )
        self.background(self._rebalancer())

    def background(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` as a task that :meth:`close` cancels and awaits; once
        closing, ``work`` is dropped unstarted (a command or a reset adopted
        while closing must not take queues again after close gave them up)."""
        if self._closing:
            work.close()
            return
        self._tasks.spawn(work, untraced=True)

    async def close(self) -> None:
        """Give every queue up (committed), release the locks, then end the
        session, so the locks are free before the group sees this member leave."""
        self._closing = True
        self._rebalance_now.set()
        session = self._session_task
        async with self.lock:
            # Before the give-up: a rebalance waiting for the lock must not
            # take queues again once it is released.
            for task in self._background():
                task.cancel()
            queues = sorted(self.owner.owned())
            await self.owner.give_up(queues, commit=True)
            if queues and self.session_up.is_set():
                with contextlib.suppress(grpc.aio.AioRpcError):
                    await self._unlock(queues)
        # Out of the lock (a cancelled task may be waiting for it).
        await asyncio.gather(*self._background(), return_exceptions=True)
        if self._call is not None:
            with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
                async with self._write_lock:
                    await self._call.done_writing()
        if session is not None and not session.done():
            with contextlib.suppress(TimeoutError):
                # The service ends the stream once we half-close it.
                async with asyncio.timeout(5):
                    await asyncio.shield(session)
        # Whatever still runs (the session, if it did not end) is cancelled,
        # and every task has ended before close returns.
        await self._tasks.close()

    def _background(self) -> list[asyncio.Future[Any]]:
        """The running tasks but the session's."""
        return [t for t in self._tasks.running() if t is not self._session_task]

    def request_rebalance(self) -> None:
        self._rebalance_now.set()

    def backoff(self) -> Iterator[float]:
        """The pauses after failures in a row, s (:meth:`ConsumerConfig.retry_delay_s`)."""
        return map(self.config.retry_delay_s, itertools.count(1))

    # -- the session ------------------------------------------------------------------

    async def _keep_session(self) -> None:
        """Hold a Session open, opening it again whenever it ends."""
        delay = self.backoff()
        while not self._closing:
            try:
                if await self._run_session():
                    delay = self.backoff()
            except grpc.aio.AioRpcError as e:
                if not self._closing:
                    log.warning("%s: session ended: %s %s", self.client_id, e.code(), e.details())
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is None or task.cancelling():
                    raise  # this task is being cancelled (close() or the loop stopping)
                # grpc.aio raises CancelledError from a read on a call that was
                # cancelled (by the service, or its channel closing): that session
                # ended, and this task must not end with it.
                if not self._closing:
                    log.warning("%s: session ended: the call was cancelled", self.client_id)
            except Exception:  # a bug must not end the consumer's session for good
                log.exception("%s: session failed", self.client_id)
            finally:
                await self._session_lost()
            if not self._closing:
                await asyncio.sleep(next(delay))

    async def _run_session(self) -> bool:
        """One session, to its end; False if it never opened."""
        call = self._call = dial.open_stream(
            self.client._channel(self.client.endpoints),
            _SESSION,
            ps.SessionRequest.SerializeToString,
            ps.SessionResponse.FromString,
        )
        await call.write(
            ps.SessionRequest(
                open=ps.OpenSession(
                    group=self.group,
                    client_id=self.client_id,
                    subscriptions=[s.to_proto() for s in self.subscriptions.values()],
                    client_version=CLIENT_VERSION,
                )
            )
        )
        first = await call.read()
        if not isinstance(first, ps.SessionResponse) or first.WhichOneof("frame") != "opened":
            return False
        interval_s = first.opened.heartbeat_interval_ms / 1000
        self.session_up.set()
        self._rebalance_now.set()
        # Not in self._tasks: close cancels those first, and the session must
        # keep beating until close half-closes it; this task awaits it.
        beats = asyncio.get_running_loop().create_task(self._heartbeats(interval_s))
        try:
            while True:
                frame = await call.read()
                if not isinstance(frame, ps.SessionResponse):
                    return True  # EOF: the service ended the stream
                if frame.WhichOneof("frame") == "command":
                    self.background(self._on_command(frame.command))
        finally:
            beats.cancel()
            await asyncio.gather(beats, return_exceptions=True)
            async with self._write_lock:
                await finish_requests(call)  # gRPC's own write task ends too

    async def _heartbeats(self, interval_s: float) -> None:
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
            while True:
                await asyncio.sleep(interval_s)
                await self._write(ps.SessionRequest(heartbeat=ps.Heartbeat()))

    async def _write(self, frame: ps.SessionRequest) -> None:
        # grpc.aio allows one write at a time on a stream.
        async with self._write_lock:
            if self._call is not None:
                await self._call.write(frame)

    async def _session_lost(self) -> None:
        """The session ended, and with it the locks: every queue goes now, uncommitted."""
        self.session_up.clear()
        async with self.lock:
            await self.owner.give_up(sorted(self.owner.owned()), commit=False)

    async def _on_command(self, command: ps.Command) -> None:
        """Carry out ``command`` and ack it, in a CONSUMER span "handle <kind>"
        of the trace the command carries (``trace_context``: the one of the
        reset that sent it), so one reset is one trace down to every
        consumer's ack. A command without a trace starts none of its own
        (a span in the empty context would be a root: rebalance nudges would
        each make a trace)."""
        kind = command.WhichOneof("body")
        if not command.trace_context:
            await self._carry_out(command, kind)
            return
        with _tracer.start_as_current_span(
            f"handle {kind}",
            context=extracted_context(command.trace_context),
            kind=trace.SpanKind.CONSUMER,
            attributes={
                MESSAGING_SYSTEM: MESSAGING_SYSTEM_ROCKETMQ,
                MESSAGING_CONSUMER_GROUP_NAME: self.group,
                MESSAGING_CLIENT_ID: self.client_id,
                "basalt.command.id": command.command_id,
            },
        ) as span:
            ok = await self._carry_out(command, kind)
            if not ok:
                span.set_status(trace.StatusCode.ERROR)

    async def _carry_out(self, command: ps.Command, kind: str | None) -> bool:
        """Do what ``command`` (of body ``kind``) asks, then ack it; whether it was done."""
        ok, detail = True, ""
        try:
            if kind == "reset_offset":
                reset = command.reset_offset
                table = {MessageQueue.of(o.queue): o for o in reset.offsets}
                async with self.lock:
                    n = await self.owner.reset(table)
                detail = f"{n} queue(s) of {reset.topic} resumed from the reset offsets"
            elif kind == "rebalance":
                self._rebalance_now.set()
                detail = "rebalance scheduled"
            else:
                ok, detail = False, f"unknown command {kind!r}; this client is {CLIENT_VERSION}"
        except (grpc.aio.AioRpcError, OSError) as e:
            ok, detail = False, f"{type(e).__name__}: {e}"
        ack = ps.CommandAck(command_id=command.command_id, ok=ok, detail=detail)
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
            await self._write(ps.SessionRequest(ack=ack))
        return ok

    # -- rebalance --------------------------------------------------------------------

    async def _rebalancer(self) -> None:
        """Rebalance when asked, when locks are pending, and on the interval."""
        while not self._closing:
            wait_ms = (
                self.config.lock_retry_interval_ms
                if self._locks_pending
                else self.config.rebalance_interval_ms
            )
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait_ms / 1000):
                    await self._rebalance_now.wait()
            self._rebalance_now.clear()
            if self._closing or not self.session_up.is_set():
                continue
            try:
                await self.rebalance()
            except (grpc.aio.AioRpcError, ClientError, OSError) as e:
                log.warning("%s: rebalance failed: %s", self.client_id, e)
                self._locks_pending = True  # try again soon

    async def rebalance(self) -> None:
        """One rebalance of every subscribed topic."""
        async with self.lock:
            members = await self.client._pull_service().ListConsumers(
                ps.ListConsumersRequest(group=self.group), timeout=CALL_TIMEOUT_S
            )
            client_ids = sorted(c.client_id for c in members.consumers)
            pending = False
            for topic in self.subscriptions:
                pending |= await self._rebalance_topic(topic, client_ids)
            self._locks_pending = pending

    async def _rebalance_topic(self, topic: str, client_ids: list[str]) -> bool:
        """Rebalance ``topic``; True when some queue allocated here is still locked elsewhere."""
        if self.client_id not in client_ids:
            return True  # our registration is not visible yet: again soon
        try:
            queues = await self.client.queues_of(topic)
        except ClientError as e:
            if topic != retry_topic(self.group):
                raise
            # The group's retry topic: until a first send-back creates it (the
            # pull-service then pushes a rebalance of it), or when it cannot be
            # routed, it has no queues; the subscribed topics go on regardless.
            if not isinstance(e, TopicNotFoundError):
                log.warning("%s: %s has no route: %s", self.client_id, topic, e)
            queues = []
        mine = set(allocate_averagely(queues, client_ids, self.client_id))
        owned = {q for q in self.owner.owned() if q.topic == topic}
        leaving = sorted(owned - mine)
        if leaving:
            await self.owner.give_up(leaving, commit=True)
            await self._unlock(leaving)
        if not mine:
            return False
        held = await self._lock(sorted(mine))
        lost = sorted(owned & mine - held)  # our lock went (etcd lost the lease)
        if lost:
            await self.owner.give_up(lost, commit=False)
        new = sorted(held - owned)
        positions = await gather_all(*(self.client._start_position(q) for q in new))
        await self.owner.take(dict(zip(new, positions, strict=True)))
        if leaving or new:
            log.info(
                "%s: %s rebalanced: %d queue(s) owned, +%d -%d",
                self.client_id,
                topic,
                len(held),
                len(new),
                len(leaving),
            )
        return held != mine

    async def _lock(self, queues: Sequence[MessageQueue]) -> set[MessageQueue]:
        reply = await self.client._pull_service().LockQueues(
            ps.LockQueuesRequest(
                group=self.group, client_id=self.client_id, queues=[q.to_proto() for q in queues]
            ),
            timeout=CALL_TIMEOUT_S,
        )
        return {MessageQueue.of(q) for q in reply.locked}

    async def _unlock(self, queues: Sequence[MessageQueue]) -> None:
        await self.client._pull_service().UnlockQueues(
            ps.UnlockQueuesRequest(
                group=self.group, client_id=self.client_id, queues=[q.to_proto() for q in queues]
            ),
            timeout=CALL_TIMEOUT_S,
        )
