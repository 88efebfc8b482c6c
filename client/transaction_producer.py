"""The TransactionProducer: RocketMQ's TransactionMQProducer over Basalt's contracts.

:meth:`TransactionProducer.send_message_in_transaction` is RocketMQ's two
phases (docs/transactions.md):

1. the message is sent as a *half* (properties TRAN_MSG=true and PGROUP =
   the producer group; a plain :meth:`Producer.send` otherwise, retries
   included): stored, invisible to consumers;
2. ``execute_local_transaction(message)`` runs (a function or a coroutine
   function) and answers a :class:`LocalTransactionState`; an exception is
   UNKNOW, as in RocketMQ;
3. COMMIT_MESSAGE or ROLLBACK_MESSAGE is sent to the store-node holding the
   half (``EndTransaction``, carried on the producer's ``SendStream`` to that
   store-node: no call of its own per message); UNKNOW sends nothing. A failed
   EndTransaction is logged, not raised (RocketMQ sends it one-way): the
   store-node's check-back resolves the half later.

**Check-back.** The producer keeps a ``WatchTransactionChecks`` stream open to
the master store-node of every broker in the routes of the topics it knows
(those given as ``topics``, those it sent to, and ``TBW102``: the nodes
that create topics), re-read every ``poll_name_server_interval_ms``; a
stream that fails is opened again after a second. Each check is handed to
``checker(record)``: the half as stored, with its topic and queue id set back
to the real ones (as RocketMQ's broker does before it asks); its answer goes
back as ``EndTransaction(from_check=True)``. A producer of the same group
started after a crash resolves what the dead one left.

Concurrency: one event loop; callbacks run on it (a blocking local
transaction blocks the producer: make it a coroutine, or run it in a thread).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import inspect
import logging
import os
import socket
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

import grpc

from basalt.client.errors import ClientError, TopicNotFoundError
from basalt.client.producer import AUTO_CREATE_TOPIC, Producer, ProducerConfig, SendResult
from basalt.common.auth import Credentials
from basalt.common.message import (
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TRANSACTION_PREPARED,
    Message,
    MessageRecord,
)
from basalt.common.protowire import LENGTH_DELIMITED, tag, varint
from basalt.common.record import decode_record
from basalt.common.tls import TlsConfig
from basalt.v1 import common_pb2 as pb
from basalt.v1 import store_node_pb2 as sn
from basalt.v1 import store_node_pb2_grpc as sn_grpc

log = logging.getLogger(__name__)

#: Wait before a failed check stream is opened again.
_REOPEN_S = 1.0


class LocalTransactionState(enum.Enum):
    """What a local transaction decided (RocketMQ's LocalTransactionState)."""

    COMMIT_MESSAGE = "COMMIT_MESSAGE"
    ROLLBACK_MESSAGE = "ROLLBACK_MESSAGE"
    #: Not known yet (RocketMQ's spelling): the store-node asks again later.
    UNKNOW = "UNKNOW"


_RESOLUTION = {
    LocalTransactionState.COMMIT_MESSAGE: sn.TRANSACTION_RESOLUTION_COMMIT,
    LocalTransactionState.ROLLBACK_MESSAGE: sn.TRANSACTION_RESOLUTION_ROLLBACK,
}

StateOrAwaitable = LocalTransactionState | Awaitable[LocalTransactionState]
#: ``execute_local_transaction(message)``.
LocalTransaction = Callable[[Message], StateOrAwaitable]
#: ``checker(record)``: the half (real topic and queue id) whose outcome is asked.
TransactionChecker = Callable[[MessageRecord], StateOrAwaitable]


@dataclass(frozen=True, slots=True)
class TransactionSendResult(SendResult):
    """The half's send result and what the local transaction decided
    (RocketMQ's TransactionSendResult). ``msg_id`` is the transaction id."""

    local_transaction_state: LocalTransactionState = LocalTransactionState.UNKNOW


class TransactionProducer(Producer):
    """A :class:`Producer` of transactional messages (see the module docstring)."""

    def __init__(
        self,
        endpoints: str,
        *,
        group: str,
        checker: TransactionChecker,
        topics: Iterable[str] = (),
        config: ProducerConfig | None = None,
        tls: TlsConfig | None = None,
        credentials: Credentials | None = None,
    ) -> None:
        super().__init__(endpoints, group=group, config=config, tls=tls, credentials=credentials)
        self.checker = checker
        #: The topics whose brokers this producer listens to for check-backs.
        self.topics: set[str] = set(topics)
        self.client_id = f"{socket.gethostname()}@{os.getpid()}@{id(self):x}"
        self._watches: dict[str, asyncio.Task[None]] = {}
        self._stubs: dict[str, sn_grpc.StoreNodeAsyncStub] = {}
        self._watching: asyncio.Task[None] | None = None
        self._routes_changed = asyncio.Event()

    @property
    def group(self) -> str:
        return self.config.producer_group

    async def start(self) -> None:
        await super().start()
        self._watching = self._tasks.spawn(
            self._watch_brokers(), name="transaction-checks", untraced=True
        )

    async def close(self) -> None:
        """Stop listening for check-backs, then close as a :class:`Producer`."""
        tasks = [t for t in (self._watching, *self._watches.values()) if t is not None]
        self._watching = None
        self._watches.clear()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._stubs.clear()  # their channels close with the producer's
        await super().close()

    # -- the two phases ---------------------------------------------------------------

    async def send_message_in_transaction(
        self, message: Message, execute_local_transaction: LocalTransaction
    ) -> TransactionSendResult:
        """Send ``message`` as a half, run the local transaction, end it (see the
        module docstring). Raises :class:`ClientError` when the half cannot be
        sent (the local transaction does not run), ValueError for a delayed
        message (RocketMQ's producer refuses to delay a transaction's commit)."""
        if message.delay_time_level > 0 or PROPERTY_DELAY_TIME_LEVEL in message.properties:
            raise ValueError("a transactional message cannot have a delay level")
        half = dataclasses.replace(
            message,
            properties={
                **message.properties,
                PROPERTY_TRANSACTION_PREPARED: "true",
                PROPERTY_PRODUCER_GROUP: self.group,
            },
        )
        self.topics.add(message.topic)
        sent = await self.send(half)
        try:
            state = await _decide(execute_local_transaction, message)
        except Exception:
            log.exception("local transaction %s failed: UNKNOW", sent.msg_id)
            state = LocalTransactionState.UNKNOW
        if state is not LocalTransactionState.UNKNOW:
            await self._end(sent, state)
        fields = {f.name: getattr(sent, f.name) for f in dataclasses.fields(SendResult)}
        return TransactionSendResult(**fields, local_transaction_state=state)

    async def _end(self, sent: SendResult, state: LocalTransactionState) -> None:
        """EndTransaction on the store-node's SendStream (one frame among the
        sends, not a call of its own); failures are logged: the check-back asks."""
        request = sn.EndTransactionRequest(
            producer_group=self.group,
            offset_msg_id=sent.offset_msg_id,
            transaction_id=sent.msg_id,
            resolution=_RESOLUTION[state],
        )
        try:
            address = await self._address_of(sent.topic, sent.broker_name)
            opaque = next(self._opaque)
            async with asyncio.timeout(self.config.send_msg_timeout_ms / 1000):
                answer = await self._stream(address).send(opaque, _end_item(opaque, request))
            if answer.HasField("refused"):
                raise ClientError.from_code(answer.refused.code, answer.refused.message)
        except (ClientError, TimeoutError) as e:
            # RocketMQ's endTransactionOneway: the check-back settles it.
            log.warning(
                "ending transaction %s (%s) failed: %s; the check-back will ask",
                sent.msg_id,
                state.value,
                e or "no answer in time",
            )

    async def _address_of(self, topic: str, broker_name: str) -> str:
        master = self._masters.get(broker_name)
        if master is not None:
            return master
        for queue in await self.route(topic):
            if queue.broker_name == broker_name:
                return queue.address
        raise ClientError.from_code(
            pb.RESPONSE_CODE_BROKER_NOT_EXIST, f"broker {broker_name!r} is not in {topic}'s route"
        )

    def _stub(self, address: str) -> sn_grpc.StoreNodeAsyncStub:
        # Kept: a stub builds a callable per RPC of the service, every time.
        stub = self._stubs.get(address)
        if stub is None:
            stub = self._stubs[address] = sn_grpc.StoreNodeStub(self._channel(address))
        return stub

    # -- check-back -------------------------------------------------------------------

    async def _watch_brokers(self) -> None:
        """Keep one check stream per master store-node of the known routes."""
        while True:
            addresses = await self._master_addresses()
            for address in addresses - self._watches.keys():
                self._watches[address] = self._tasks.spawn(
                    self._watch(address), name=f"transaction-checks {address}", untraced=True
                )
            for address in self._watches.keys() - addresses:
                self._watches.pop(address).cancel()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.config.poll_name_server_interval_ms / 1000):
                    await self._routes_changed.wait()
            self._routes_changed.clear()

    async def _master_addresses(self) -> set[str]:
        addresses: set[str] = set()
        for topic in (AUTO_CREATE_TOPIC, *sorted(self.topics)):
            try:
                queues = await self.route(topic, refresh=True)
            except TopicNotFoundError:
                continue
            except ClientError as e:
                log.info("no route for %s now (%s): its brokers are asked later", topic, e)
                continue
            for queue in queues:
                addresses.add(self._masters.get(queue.broker_name, queue.address))
        return addresses

    async def _watch(self, address: str) -> None:
        """One store-node's check stream, opened again whenever it ends."""
        while True:
            try:
                call = self._stub(address).WatchTransactionChecks(
                    sn.WatchTransactionChecksRequest(
                        producer_group=self.group, client_id=self.client_id
                    )
                )
                async for check in call:
                    await self._answer(address, check)
            except grpc.aio.AioRpcError as e:
                log.debug("check stream to %s ended: %s", address, e.code().name)
                if e.code() is grpc.StatusCode.FAILED_PRECONDITION:
                    self._routes_changed.set()  # NOT_MASTER: the routes say who is
            await asyncio.sleep(_REOPEN_S)

    async def _answer(self, address: str, check: sn.TransactionCheck) -> None:
        """Ask the checker about one half and send its answer (UNKNOW: none)."""
        try:
            record = decode_record(check.record)
            record = dataclasses.replace(
                record,
                topic=record.properties.get(PROPERTY_REAL_TOPIC, record.topic),
                queue_id=int(record.properties.get(PROPERTY_REAL_QUEUE_ID, record.queue_id)),
            )
            state = await _decide(self.checker, record)
        except Exception:
            log.exception("checking transaction %s failed: UNKNOW", check.transaction_id)
            return
        if state is LocalTransactionState.UNKNOW:
            return
        try:
            await self._stub(address).EndTransaction(
                sn.EndTransactionRequest(
                    producer_group=self.group,
                    offset_msg_id=check.offset_msg_id,
                    transaction_id=check.transaction_id,
                    resolution=_RESOLUTION[state],
                    from_check=True,
                ),
                timeout=self.config.send_msg_timeout_ms / 1000,
            )
        except grpc.aio.AioRpcError as e:
            log.warning("answering the check of %s failed: %s", check.transaction_id, e.details())


#: SendStreamRequest.items' tag: a request of one item is the tag, the item's length, the item.
_ITEMS = tag(sn.SendStreamRequest.DESCRIPTOR, "items", LENGTH_DELIMITED)


def _end_item(opaque: int, request: sn.EndTransactionRequest) -> list[bytes]:
    """``SendStreamRequest(items=[SendStreamItem(opaque, end_transaction=request)])``
    serialized, as pieces to join (producer.send_stream_message's framing)."""
    item = sn.SendStreamItem(opaque=opaque, end_transaction=request).SerializeToString()
    return [_ITEMS + varint(len(item)), item]


async def _decide(
    callback: Callable[[Message], StateOrAwaitable] | Callable[[MessageRecord], StateOrAwaitable],
    arg: Message | MessageRecord,
) -> LocalTransactionState:
    """A callback's answer, awaited if it is awaitable; anything but a
    LocalTransactionState is a TypeError."""
    answer = callback(arg)  # type: ignore[arg-type]
    if inspect.isawaitable(answer):
        answer = await answer
    if not isinstance(answer, LocalTransactionState):
        raise TypeError(f"expected a LocalTransactionState, got {answer!r}")
    return answer


__all__ = [
    "LocalTransaction",
    "LocalTransactionState",
    "TransactionChecker",
    "TransactionProducer",
    "TransactionSendResult",
]
