"""The v2 front's calls to the store-nodes: one base of the servicer and its mixins.

:class:`StoreCalls` finds a queue's store-node (:meth:`StoreCalls._address`)
and calls it within the client's deadline (:meth:`StoreCalls._call`, or
:meth:`StoreCalls._start` for a call the caller may cancel), turning a refusal
into :class:`~basalt.services.rocketmq_v2.conversions.V2Error` in v2 terms.
The store-node the front runs in, if any, is called in-process
(:class:`~basalt.services.rocketmq_v2.host.LocalStoreNode`), the others over
gRPC; the answers and refusals are the same either way.
:class:`~basalt.services.rocketmq_v2.service.MessagingServiceServicer` and its
mixins (:mod:`.consume`, :mod:`.transactions`) inherit it, so the one
definition is what all of them call.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc

from basalt.rocketmq.v2 import definition_pb2 as v2
from basalt.services.errors import Refusal, downstream_refusal
from basalt.services.pull_service.channels import call_timeout_s
from basalt.services.rocketmq_v2.conversions import StoreQueue, V2Error, code_of_response, queue_of

if TYPE_CHECKING:
    from basalt.services.rocketmq_v2.host import FrontHost, LocalStoreNode

#: How long a call may wait on a store-node (cut to the client's deadline).
STORE_NODE_BUDGET_S = 10.0


@dataclass(frozen=True, slots=True)
class StoreCall:
    """A started store-node call (:meth:`StoreCalls._start`)."""

    #: The gRPC call, or the in-process call's task.
    call: grpc.aio.UnaryUnaryCall[Any, Any] | asyncio.Task[Any]
    #: Who is called, for the refusal's message.
    peer: str
    timeout_s: float
    #: Refusal codes answered otherwise than :func:`code_of_response` says.
    codes: Mapping[int, int] | None = None

    def cancel(self) -> bool:
        """Cancel the call; False when it had already answered (then
        :meth:`answer` still has its answer)."""
        return bool(self.call.cancel())

    async def answer(self) -> Any:
        """The store-node's answer, or V2Error with its refusal in v2 terms."""
        try:
            return await self.call
        except grpc.aio.AioRpcError as e:
            raise _v2_error(downstream_refusal(e, self.peer, self.timeout_s), self.codes) from None
        except Refusal as r:  # the local store-node's
            raise _v2_error(r, self.codes, self.peer) from None


def _v2_error(refusal: Refusal, codes: Mapping[int, int] | None, peer: str = "") -> V2Error:
    """A store-node's refusal in v2 terms (``codes`` first, then
    :func:`code_of_response`); ``peer``: the local store-node that refused,
    named as :func:`downstream_refusal` names a remote one."""
    code = (codes or {}).get(refusal.code) or code_of_response(refusal.code)
    return V2Error(code, f"{peer}: {refusal.message}" if peer else refusal.message)


def local_error(refusal: Refusal, local: LocalStoreNode) -> V2Error:
    """The front's own store-node's refusal in v2 terms, named as a remote one is."""
    return _v2_error(refusal, None, f"store-node {local.broker_name!r} at {local.address}")


class StoreCalls:
    """Calls to the store-node of a queue, over the host's view of the brokers
    and its channels (``host``, set by the servicer)."""

    host: FrontHost

    def _address(self, queue: StoreQueue) -> str:
        """The address of ``queue``'s store-node; V2Error INTERNAL_SERVER_ERROR
        when it is not registered (down)."""
        broker = self.host.brokers.get(queue.broker_name)
        if broker is None:
            raise V2Error(v2.INTERNAL_SERVER_ERROR, f"store-node {queue.broker_name!r} is down")
        return broker.address

    def _local(self, broker: str) -> LocalStoreNode | None:
        """The store-node this front runs in when it is ``broker``'s registered
        master now; else None (call ``broker`` over gRPC). V2Error
        INTERNAL_SERVER_ERROR when ``broker`` is not registered (down)."""
        if self.host.local is None:
            return None
        return self.host.local_at(broker, self._address(StoreQueue(broker, 0)))

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

    async def _call(
        self,
        queue: StoreQueue,
        address: str,
        rpc: str,
        request: Any,
        context: grpc.aio.ServicerContext[Any, Any],
        hold_s: float = 0.0,
        codes: Mapping[int, int] | None = None,
    ) -> Any:
        """StoreNode ``rpc`` at ``address`` (within the client's deadline; a
        call the store-node may hold, a long-polling pop, gets ``hold_s`` more);
        its answer, or V2Error with the store-node's refusal in v2 terms
        (``codes`` first, then :func:`code_of_response`)."""
        local = self.host.local_at(queue.broker_name, address)
        if local is not None:  # in the same task: nothing to schedule
            try:
                return await local.call(rpc, request)
            except Refusal as r:
                peer = f"store-node {queue.broker_name!r} at {address}"
                raise _v2_error(r, codes, peer) from None
        start = self._start(queue, address, rpc, request, context, hold_s)
        if codes is not None:
            start = StoreCall(start.call, start.peer, start.timeout_s, codes)
        return await start.answer()

    def _start(
        self,
        queue: StoreQueue,
        address: str,
        rpc: str,
        request: Any,
        context: grpc.aio.ServicerContext[Any, Any],
        hold_s: float = 0.0,
    ) -> StoreCall:
        """StoreNode ``rpc`` at ``address``, started as :meth:`_call` does, not
        awaited: a caller may cancel it."""
        timeout = call_timeout_s(context, STORE_NODE_BUDGET_S + hold_s)
        peer = f"store-node {queue.broker_name!r} at {address}"
        local = self.host.local_at(queue.broker_name, address)
        if local is not None:
            return StoreCall(local.start(rpc, request), peer, timeout)
        call = getattr(self.host.channels.store_node(address), rpc)(request, timeout=timeout)
        return StoreCall(call, peer, timeout)
