"""EndTransaction, WatchTransactionChecks and the check-back: transactional
messages on the store-node (docs/transactions.md).

A mixin of :class:`basalt.services.store_node.service.StoreNodeServicer`; the
store's bookkeeping is :mod:`basalt.store.transaction`. What this module adds:

* **EndTransaction** (RocketMQ's EndTransactionProcessor): refused on a
  member that is not its group's master (NOT_MASTER, as a send); an
  unspecified resolution, an offset id that names no half message, a
  transaction id or producer group that is not the half's: a clear status,
  nothing stored. COMMIT puts the real message and the op mark as one batch
  (one append: both or neither survive a kill -9); ROLLBACK puts the mark.
  An end of a transaction already resolved the same way answers what was
  done and stores nothing (RocketMQ commits again: a duplicate); the other
  way is refused INVALID_PARAMETER "already resolved: commit".
* **WatchTransactionChecks**: a server stream per producer-group member;
  each check goes to one listener of the half's group, round robin. The
  stream ends when the node stops or stops being master.
* **The check service**: an asyncio task (started with the first listener or
  the first end, stopped by :meth:`TransactionRpcs.stop_transaction_checks`)
  that every ``transaction_check_interval_ms`` runs one
  :meth:`~basalt.store.transaction.TransactionalMessageService.check_round`
  in a worker thread, only while this member is its group's master (the
  WriteGate says; a node without a group always is) and only when someone
  listens: a check that has nobody to go to waits for the next round.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import grpc

from basalt.common.message import offset_msg_id, parse_offset_msg_id
from basalt.services.checks import check_group
from basalt.services.errors import Refusal, abort, as_refusal, invalid, put_refusal
from basalt.services.rpc import rpc_method as _rpc
from basalt.store import MessageStore
from basalt.store.put_result import PutMessageResult
from basalt.store.transaction import (
    EndPlan,
    EndRefusal,
    EndRefused,
    HalfCheck,
    Resolution,
    TransactionalMessageService,
)
from basalt.v1 import common_pb2 as pb
from basalt.v1 import store_node_pb2 as sn

if TYPE_CHECKING:
    from basalt.services.store_node.ha.gate import WriteGate
    from basalt.services.store_node.service import StoreNodeConfig

log = logging.getLogger(__name__)

_RESOLUTION = {
    sn.TRANSACTION_RESOLUTION_COMMIT: Resolution.COMMIT,
    sn.TRANSACTION_RESOLUTION_ROLLBACK: Resolution.ROLLBACK,
}
_REFUSAL_CODE = {
    EndRefusal.NO_SUCH_HALF: pb.RESPONSE_CODE_QUERY_NOT_FOUND,
    EndRefusal.WRONG_TRANSACTION: pb.RESPONSE_CODE_INVALID_PARAMETER,
    EndRefusal.WRONG_GROUP: pb.RESPONSE_CODE_INVALID_PARAMETER,
    EndRefusal.CONFLICT: pb.RESPONSE_CODE_INVALID_PARAMETER,
    EndRefusal.BUSY: pb.RESPONSE_CODE_SYSTEM_BUSY,
}


@dataclass
class _Group:
    """The listeners of one producer group on this node."""

    listeners: list[asyncio.Queue[sn.TransactionCheck | None]] = field(default_factory=list)
    turn: int = 0


class TransactionRpcs:
    """See the module docstring."""

    config: StoreNodeConfig
    store: MessageStore
    writable: bool
    group: WriteGate | None
    boot_timestamp_ms: int

    #: Set on the instance at first use (:meth:`_txn`).
    _txn_service: TransactionalMessageService | None = None
    _txn_groups: dict[str, _Group] | None = None
    _txn_task: asyncio.Task[None] | None = None
    _txn_wake: asyncio.Event | None = None
    _txn_stopping: bool = False

    if TYPE_CHECKING:  # StoreNodeServicer's

        def _send_result(
            self, topic: str, queue_id: int, result: PutMessageResult, started: float
        ) -> pb.SendResult: ...

    # -- state ------------------------------------------------------------------------

    @property
    def transactions(self) -> TransactionalMessageService:
        """The store's half-queue bookkeeping (made at first use)."""
        if self._txn_service is None:
            self._txn_service = TransactionalMessageService(
                self.store, now_ms=self.store.clock.now_ms, started_ms=self.boot_timestamp_ms
            )
        return self._txn_service

    def _listeners(self) -> dict[str, _Group]:
        if self._txn_groups is None:
            self._txn_groups = {}
        return self._txn_groups

    def _is_master(self) -> bool:
        if self.group is None:
            return True
        try:
            self.group.check_master()
        except Refusal:
            return False
        return True

    async def _loaded(self) -> TransactionalMessageService:
        """The bookkeeping with the op marks read (in a thread, once per mastership)."""
        service = self.transactions
        if not service.loaded:
            await asyncio.to_thread(service.load)
        self._start_checks()
        return service

    # -- EndTransaction ---------------------------------------------------------------

    @_rpc
    async def EndTransaction(
        self, request: sn.EndTransactionRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> sn.EndTransactionResponse:
        return await self.end_transaction_response(request)

    async def end_transaction(self, request: sn.EndTransactionRequest) -> pb.SendResult:
        """EndTransaction on a SendStream: the response's result (empty: none)."""
        return (await self.end_transaction_response(request)).result

    async def end_transaction_response(
        self, request: sn.EndTransactionRequest
    ) -> sn.EndTransactionResponse:
        """An EndTransaction checked, stored and answered; refusals raise."""
        started = time.perf_counter()
        resolution = _RESOLUTION.get(request.resolution)
        if resolution is None:
            raise invalid(
                "resolution must be TRANSACTION_RESOLUTION_COMMIT or _ROLLBACK "
                f"(got {_resolution_name(request.resolution)}): an unknown "
                "outcome is not sent, the check-back asks again"
            )
        check_group(request.producer_group)
        if not request.transaction_id:
            raise invalid("transaction_id must not be empty")
        try:
            _, physical = parse_offset_msg_id(request.offset_msg_id)
        except ValueError:
            raise invalid(f"not an offset message id: {request.offset_msg_id!r}") from None
        self._check_writable()
        service = await self._loaded()
        try:
            plan = service.plan_end(
                physical, request.transaction_id, request.producer_group, resolution
            )
        except EndRefused as e:
            raise Refusal(_REFUSAL_CODE[e.why], str(e)) from None
        result = await self._put_plan(service, plan)
        if request.from_check:
            log.info(
                "check-back answered for transaction %s of %s: %s",
                plan.key,
                request.producer_group,
                resolution.value,
            )
        committed = result if len(plan.messages) == 2 else plan.done_result
        if committed is None or plan.destination is None:
            return sn.EndTransactionResponse()
        # The batch's first record is the real message (the second the op mark).
        first = committed._replace(
            physical_offsets=committed.physical_offsets[:1],
            queue_offsets=committed.queue_offsets[:1],
            sizes=committed.sizes[:1],
        )
        topic, queue_id = plan.destination
        return sn.EndTransactionResponse(result=self._send_result(topic, queue_id, first, started))

    async def _put_plan(
        self, service: TransactionalMessageService, plan: EndPlan
    ) -> PutMessageResult | None:
        """Put the plan's batch (replicated as a send is), then record it."""
        if not plan.messages:
            return None
        result: PutMessageResult | None = None
        try:
            result = await self.store.put_messages_async(plan.messages)
            if self.group is not None:
                confirmed: asyncio.Future[PutMessageResult] = (
                    asyncio.get_running_loop().create_future()
                )
                self.group.confirm_then(
                    result, lambda r: None if confirmed.done() else confirmed.set_result(r)
                )
                result = await confirmed
        finally:
            service.finish_end(plan, result)
        refusal = put_refusal(result)
        if refusal is not None:
            raise refusal
        return result

    def _check_writable(self) -> None:
        if not self.writable or self._txn_stopping:
            raise Refusal(pb.RESPONSE_CODE_SERVICE_NOT_AVAILABLE, "the store-node is stopping")
        if self.group is not None:
            self.group.check_writable()

    # -- WatchTransactionChecks ------------------------------------------------------

    async def WatchTransactionChecks(  # type: ignore[override]
        self, request: sn.WatchTransactionChecksRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[sn.TransactionCheck]:
        try:
            check_group(request.producer_group)
            if not self.writable or self._txn_stopping:
                raise Refusal(pb.RESPONSE_CODE_SERVICE_NOT_AVAILABLE, "the store-node is stopping")
            if self.group is not None:
                self.group.check_master()
            await self._loaded()
        except Exception as e:
            await abort(context, as_refusal(e, "WatchTransactionChecks"))
        queue: asyncio.Queue[sn.TransactionCheck | None] = asyncio.Queue()
        groups = self._listeners()
        members = groups.setdefault(request.producer_group, _Group())
        members.listeners.append(queue)
        log.info(
            "%s listens for check-backs of %s",
            request.client_id or "a producer",
            request.producer_group,
        )
        try:
            # Headers now: the listener knows it is registered before any check.
            await context.send_initial_metadata(())
            while (check := await queue.get()) is not None:
                yield check
        finally:
            members.listeners.remove(queue)
            if not members.listeners and groups.get(request.producer_group) is members:
                del groups[request.producer_group]

    def _ask(self, check: HalfCheck) -> None:
        """Hand a check to one listener of its group, round robin (on the loop); with
        none left, it is dropped: the half stays unresolved for the next round."""
        members = self._listeners().get(check.group)
        if members is None or not members.listeners:
            return
        queue = members.listeners[members.turn % len(members.listeners)]
        members.turn += 1
        queue.put_nowait(
            sn.TransactionCheck(
                offset_msg_id=offset_msg_id(self.store.commitlog.store_host, check.physical_offset),
                transaction_id=check.transaction_id,
                record=check.record,
                check_times=check.check_times,
            )
        )

    # -- the check service ------------------------------------------------------------

    def _start_checks(self) -> None:
        if self._txn_task is None and not self._txn_stopping:
            self._txn_wake = asyncio.Event()
            self._txn_task = asyncio.get_running_loop().create_task(
                self._check_loop(), name="transaction-check-service"
            )

    async def _check_loop(self) -> None:
        loop = asyncio.get_running_loop()
        service = self.transactions
        config = self.config
        listeners = self._listeners()

        def ask(check: HalfCheck) -> None:
            loop.call_soon_threadsafe(self._ask, check)

        def listening(group: str) -> bool:
            members = listeners.get(group)
            return members is not None and bool(members.listeners)

        wake = self._txn_wake
        assert wake is not None
        was_master = True
        while not self._txn_stopping:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(config.transaction_check_interval_ms / 1000):
                    await wake.wait()
            if self._stopping():
                return
            if not self._is_master():
                # A slave's table goes stale: read the marks again once master.
                service.loaded = False
                was_master = False
                self._end_streams()
                continue
            if not listeners:
                continue  # nobody to ask: every check would wait anyway
            try:
                if not service.loaded:
                    since = None if was_master else self.store.clock.now_ms()
                    await asyncio.to_thread(functools.partial(service.load, since_ms=since))
                    was_master = True
                report = await asyncio.to_thread(
                    service.check_round,
                    timeout_ms=config.transaction_timeout_ms,
                    check_max=config.transaction_check_max,
                    listening=listening,
                    ask=ask,
                    halted=lambda: self._txn_stopping or not self.store.healthy,
                )
            except Exception:
                log.exception("transaction check round failed; the next round starts over")
                continue
            if report.checked or report.check_max:
                log.info(
                    "transaction check: %d asked, %d past check max, %d waiting for a listener",
                    report.checked,
                    report.check_max,
                    report.unheard,
                )

    def _stopping(self) -> bool:
        return self._txn_stopping

    def _end_streams(self) -> None:
        for members in self._listeners().values():
            for queue in members.listeners:
                queue.put_nowait(None)

    async def stop_transaction_checks(self) -> None:
        """End the watch streams and the check service (before the server and the
        store stop): a round in its thread ends at its next half."""
        self._txn_stopping = True
        self._end_streams()
        task, self._txn_task = self._txn_task, None
        if self._txn_wake is not None:
            self._txn_wake.set()
        if task is not None:
            # Not cancelled: a round in its thread would go on putting while the
            # store shuts down; halted() ends it at its next half instead.
            await task


def _resolution_name(value: int) -> str:
    """An enum value's name, or the number for one the proto does not define."""
    try:
        return sn.TransactionResolution.Name(value)  # type: ignore[arg-type]
    except ValueError:
        return str(value)
