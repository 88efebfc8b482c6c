"""The store-node's pop-and-ack RPCs: PopMessages, AckMessages, ChangeInvisibleDuration.

Thin adapters over :class:`basalt.store.pop.PopStore` for a stateless front
(the apache.rocketmq.v2 MessagingService): the state is the store's, and every
delivery carries a self-describing receipt handle (:mod:`basalt.common.receipt`)
naming this store-node, so any front instance routes its ack here.

Long polling: a PopMessages that delivers nothing with a ``poll_timeout_ms``
parks on the hold service's arrival futures for its queues (past each queue's
cursor), at most until the earliest in-flight message becomes visible again,
or until an ack or a change of invisible time of its (group, topic) - an ack
unblocks a FIFO queue, a shortened invisible time (a PushConsumer's retry
delay) makes a message due sooner than the held pop computed - then pops
once more. A ``wait_only`` pop pops nothing: it answers empty as soon as
something may be deliverable (a front holding one receive on several
store-nodes at once, docs/rocketmq-v2.md). Pops, acks and changes run in a
worker thread, those of concurrent calls joined (:mod:`.pop_batching`): they
append to the journal and may fsync it.

A mixin of :class:`basalt.services.store_node.service.StoreNodeServicer`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import grpc

from basalt.common.receipt import ReceiptHandle, ReceiptHandleError
from basalt.services.checks import (
    check_broker_perm,
    check_group,
    no_such_topic,
    subscription_filter,
)
from basalt.services.errors import Refusal, invalid
from basalt.services.meta.model import Perm, TopicConfig
from basalt.services.rpc import rpc_method as _rpc
from basalt.services.store_node.ha.gate import WriteGate
from basalt.services.store_node.long_polling import HeldRead, PullRequestHoldService
from basalt.services.store_node.pop_batching import PopWork
from basalt.services.store_node.topics import TopicDirectory
from basalt.services.validation import LimitError, check_invisible_ms
from basalt.store import MessageStore
from basalt.store.message_filter import MessageFilter
from basalt.store.pop import AckStatus, PoppedMessage
from basalt.v1 import common_pb2 as pb
from basalt.v1 import store_node_pb2 as sn

if TYPE_CHECKING:
    from basalt.services.store_node.service import StoreNodeConfig

_ACK_STATUS = {
    AckStatus.OK: sn.POP_ACK_STATUS_OK,
    AckStatus.STALE: sn.POP_ACK_STATUS_STALE_HANDLE,
}


def _check_invisible_ms(ms: int, *, minimum_ms: int) -> int:
    """``invisible_duration_ms`` when within ``minimum_ms`` .. 12 h; else the
    INVALID_PARAMETER refusal (basalt.services.validation's table)."""
    try:
        return check_invisible_ms(ms, "invisible_duration_ms", minimum_ms=minimum_ms)
    except LimitError as e:
        raise e.refusal() from None


class PopRpcs:
    """PopMessages, AckMessages and ChangeInvisibleDuration (see the module docstring)."""

    config: StoreNodeConfig
    store: MessageStore
    topics: TopicDirectory
    hold: PullRequestHoldService
    writable: bool
    broker_perm: Callable[[], Perm]
    group: WriteGate | None

    #: (group, topic) -> the future its next ack or change resolves (held pops
    #: wait on it); set on the instance at the first held pop.
    _pop_changes: dict[tuple[str, str], asyncio.Future[None]] | None = None
    #: The joined store work of concurrent pop calls; set at the first.
    _pop_work: PopWork | None = None

    def _work(self) -> PopWork:
        if self._pop_work is None:
            self._pop_work = PopWork(self.store.pop)
        return self._pop_work

    if TYPE_CHECKING:  # StoreNodeServicer's

        def _readable_topic(self, topic: str, queue_id: int) -> TopicConfig: ...

    def _known_topic(self, group: str, topic: str) -> None:
        check_group(group)
        if not self.writable:
            raise Refusal(pb.RESPONSE_CODE_SERVICE_NOT_AVAILABLE, "the store-node is stopping")
        if self.group is not None:
            self.group.check_master()  # pop state lives on the master, as sends do
        if self.topics.topic(topic) is None:
            raise no_such_topic(topic)

    def _check_pop(self, request: sn.PopMessagesRequest) -> MessageFilter:
        self._known_topic(request.group, request.topic)
        ids, most = list(request.queue_ids), self.config.max_queues_per_get_messages
        if not 1 <= len(ids) <= most or len(set(ids)) != len(ids):
            raise invalid(f"queue_ids {ids}: 1..{most} distinct queues of this broker")
        check_broker_perm(self.config.broker_name, self.broker_perm(), write=False)
        for queue_id in ids:
            self._readable_topic(request.topic, queue_id)
        if not 1 <= request.max_messages <= self.config.max_msg_nums_per_pull:
            raise invalid(
                f"max_messages {request.max_messages} is not within "
                f"1..{self.config.max_msg_nums_per_pull}"
            )
        _check_invisible_ms(request.invisible_duration_ms, minimum_ms=1)
        if request.poll_timeout_ms < 0:
            raise invalid(f"poll_timeout_ms {request.poll_timeout_ms} is negative")
        return subscription_filter(request.subscription)

    def _pop_all(
        self, request: sn.PopMessagesRequest, flt: MessageFilter
    ) -> tuple[list[PoppedMessage], list[int]]:
        """One pop round over the queues in order, until max_messages (worker
        thread); with each queue's max offset as it was before the round."""
        store, now = self.store, self.store.clock.now_ms()
        ends = [store.get_max_offset_in_queue(request.topic, q) for q in request.queue_ids]
        out: list[PoppedMessage] = []
        for queue_id in request.queue_ids:
            room = request.max_messages - len(out)
            if room <= 0:
                break
            out += store.pop.pop(
                request.group, request.topic, queue_id, room, request.invisible_duration_ms,
                now, fifo=request.fifo, message_filter=flt,
            )  # fmt: skip
        return out, ends

    def _peek(self, request: sn.PopMessagesRequest) -> tuple[bool, list[int]]:
        """A ``wait_only`` round (worker thread): whether a pop could deliver
        something now, with each queue's max offset as it was before looking."""
        store, now = self.store, self.store.clock.now_ms()
        ends = [store.get_max_offset_in_queue(request.topic, q) for q in request.queue_ids]
        found = any(
            store.pop.deliverable(request.group, request.topic, q, now, fifo=request.fifo)
            for q in request.queue_ids
        )
        return found, ends

    def _wait_reads(
        self, topic: str, queue_ids: list[int], ends: list[int]
    ) -> list[HeldRead[None]]:
        """What the hold service parks on: each queue past its max offset before
        the round that found nothing. Not past the cursor: a FIFO queue blocked by
        an in-flight message has undelivered messages past it, and the wait would
        end at once, again and again; an arrival after the round still wakes it."""
        store = self.store

        def read(queue_id: int, end: int) -> HeldRead[None]:
            return HeldRead(
                topic=topic,
                queue_id=queue_id,
                offset=end,
                pull=lambda _: None,
                found=lambda _: False,
                next_offset=lambda _: end,
                max_offset=lambda: store.get_max_offset_in_queue(topic, queue_id),
            )

        return [read(q, end) for q, end in zip(queue_ids, ends, strict=True)]

    def _until_visible_s(self, request: sn.PopMessagesRequest) -> float | None:
        """Seconds until an in-flight message of the queues is visible again."""
        pops, now = self.store.pop, self.store.clock.now_ms()
        times = [pops.next_visible_ms(request.group, request.topic, q) for q in request.queue_ids]
        due = [t for t in times if t is not None]
        return max(0.0, (min(due) - now) / 1000) if due else None

    def _popped(self, m: PoppedMessage, topic: str, invisible_ms: int) -> sn.PoppedMessage:
        handle = ReceiptHandle(
            self.config.broker_name, topic, m.queue_id, m.queue_offset, m.commit_log_offset,
            m.nonce, m.visible_at_ms, invisible_ms,
        )  # fmt: skip
        return sn.PoppedMessage(
            queue_id=m.queue_id,
            queue_offset=m.queue_offset,
            delivery_attempt=m.attempt,
            receipt_handle=handle.encode(),
            visible_at_ms=m.visible_at_ms,
            record=m.record,
        )

    @_rpc
    async def PopMessages(
        self, request: sn.PopMessagesRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> sn.PopMessagesResponse:
        flt = self._check_pop(request)
        loop = asyncio.get_running_loop()
        timeout_ms = min(request.poll_timeout_ms, self.config.max_suspend_timeout_ms)
        deadline = loop.time() + timeout_ms / 1000
        popped: list[PoppedMessage] = []
        while True:
            if request.wait_only:
                found, ends = await self._work().run(lambda: self._peek(request))
            else:
                popped, ends = await self._work().run(lambda: self._pop_all(request, flt))
                found = bool(popped)
            remaining = deadline - loop.time()
            if found or remaining <= 0:
                break
            visible = self._until_visible_s(request)
            wait = remaining if visible is None else min(remaining, visible)
            reads = self._wait_reads(request.topic, list(request.queue_ids), ends)
            arrival = asyncio.ensure_future(self.hold.wait_for_arrival(reads, wait))
            changed = self._next_change(request.group, request.topic)
            try:
                await asyncio.wait((arrival, changed), return_when=asyncio.FIRST_COMPLETED)
            finally:
                arrival.cancel()  # it unparks its waiters when cancelled
            if not self.writable:
                break
        ms = request.invisible_duration_ms
        return sn.PopMessagesResponse(messages=[self._popped(m, request.topic, ms) for m in popped])

    def _next_change(self, group: str, topic: str) -> asyncio.Future[None]:
        """The future the (group, topic)'s next ack or change resolves."""
        if self._pop_changes is None:
            self._pop_changes = {}
        future = self._pop_changes.get((group, topic))
        if future is None:
            future = asyncio.get_running_loop().create_future()
            self._pop_changes[(group, topic)] = future
        return future

    def _wake_held_pops(self, group: str, topic: str) -> None:
        """Held pops of (group, topic) pop again (after an ack or a change)."""
        future = None if self._pop_changes is None else self._pop_changes.pop((group, topic), None)
        if future is not None:
            future.set_result(None)

    def _handle(self, text: str, topic: str) -> ReceiptHandle | sn.AckResult:
        """The handle, or the result that refuses it."""
        try:
            handle = ReceiptHandle.decode(text)
        except ReceiptHandleError as e:
            return sn.AckResult(
                receipt_handle=text, status=sn.POP_ACK_STATUS_MALFORMED_HANDLE, detail=str(e)
            )
        here = self.config.broker_name
        if handle.broker_name != here:
            return sn.AckResult(
                receipt_handle=text,
                status=sn.POP_ACK_STATUS_WRONG_BROKER,
                detail=f"the handle is broker {handle.broker_name!r}'s, not {here!r}'s",
            )
        if handle.topic != topic:
            return sn.AckResult(
                receipt_handle=text,
                status=sn.POP_ACK_STATUS_MALFORMED_HANDLE,
                detail=f"the handle is of topic {handle.topic!r}, not {topic!r}",
            )
        return handle

    def _ack_all(self, group: str, topic: str, texts: list[str]) -> list[sn.AckResult]:
        """Each handle's result, in order; the valid ones acked as one journal
        write (worker thread)."""
        out: list[sn.AckResult | None] = []
        valid: list[tuple[int, ReceiptHandle]] = []
        for text in texts:
            h = self._handle(text, topic)
            if isinstance(h, sn.AckResult):
                out.append(h)
            else:
                valid.append((len(out), h))
                out.append(None)
        statuses = self.store.pop.ack_many(
            group, topic, [(h.queue_id, h.queue_offset, h.nonce) for _, h in valid]
        )
        for (i, _), status in zip(valid, statuses, strict=True):
            detail = "" if status is AckStatus.OK else "not in flight with this handle"
            out[i] = sn.AckResult(
                receipt_handle=texts[i], status=_ACK_STATUS[status], detail=detail
            )
        return [r for r in out if r is not None]

    async def ack_handles(
        self, group: str, topic: str, handles: Sequence[ReceiptHandle]
    ) -> list[AckStatus]:
        """AckMessages for a caller in this process that decoded the handles and
        checked that they are this broker's and ``topic``'s (the v2 front in
        this store-node): each handle's status, in order. Refusals as
        AckMessages'."""
        self._known_topic(group, topic)
        count, most = len(handles), self.config.max_msg_nums_per_pull
        if count > most:
            raise invalid(f"{count} handles: at most {most}")
        entries = [(h.queue_id, h.queue_offset, h.nonce) for h in handles]
        pops = self.store.pop
        statuses = await self._work().run(lambda: pops.ack_many(group, topic, entries))
        self._wake_held_pops(group, topic)
        return statuses

    @_rpc
    async def AckMessages(
        self, request: sn.AckMessagesRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> sn.AckMessagesResponse:
        self._known_topic(request.group, request.topic)
        count, most = len(request.receipt_handles), self.config.max_msg_nums_per_pull
        if count > most:
            raise invalid(f"{count} handles: at most {most}")
        handles = list(request.receipt_handles)
        results = await self._work().run(
            lambda: self._ack_all(request.group, request.topic, handles)
        )
        self._wake_held_pops(request.group, request.topic)
        return sn.AckMessagesResponse(results=results)

    @_rpc
    async def ChangeInvisibleDuration(
        self,
        request: sn.ChangeInvisibleDurationRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> sn.ChangeInvisibleDurationResponse:
        self._known_topic(request.group, request.topic)
        ms = _check_invisible_ms(request.invisible_duration_ms, minimum_ms=0)
        h = self._handle(request.receipt_handle, request.topic)
        if isinstance(h, sn.AckResult):
            return sn.ChangeInvisibleDurationResponse(status=h.status, detail=h.detail)
        pops, now = self.store.pop, self.store.clock.now_ms()
        result = await self._work().run(
            lambda: pops.change_invisible(
                request.group, request.topic, h.queue_id, h.queue_offset, h.nonce, ms, now
            )
        )
        if result.status is not AckStatus.OK:
            return sn.ChangeInvisibleDurationResponse(
                status=_ACK_STATUS[result.status], detail="not in flight with this handle"
            )
        self._wake_held_pops(request.group, request.topic)
        new = ReceiptHandle(
            h.broker_name, h.topic, h.queue_id, h.queue_offset, h.commit_log_offset,
            result.nonce, result.visible_at_ms, ms,
        )  # fmt: skip
        return sn.ChangeInvisibleDurationResponse(
            status=sn.POP_ACK_STATUS_OK,
            receipt_handle=new.encode(),
            visible_at_ms=result.visible_at_ms,
        )
