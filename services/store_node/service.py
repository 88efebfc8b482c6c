"""The store-node: one MessageStore behind the StoreNode gRPC service.

Every RPC is a thin adapter - decode, check, call :mod:`basalt.store`, encode - and
refusals go through :mod:`basalt.services.errors`. What the store-node checks
before the store sees a request (RocketMQ's SendMessageProcessor and
PullMessageProcessor, broker side):

* a send: the topic exists (or is created: ``auto_create_topic_enable``),
  the topic and the broker are writable, ``0 <= queue_id < write_queue_nums``;
* a read (GetMessage, each entry of GetMessages): what the pull-service's
  ``check_pull`` checks, in its order and with its codes and messages (a
  valid group, ``offset >= 0``, ``1 <= max_msg_nums``, the topic exists and
  is readable, ``0 <= queue_id < read_queue_nums``, the subscription
  parses), since the SDK's consumers read here directly; plus this node's
  own ``max_msg_nums_per_pull`` cap, and SERVICE_NOT_AVAILABLE while it stops.

Long polling: a GetMessage that finds nothing new with a ``suspend_timeout_ms``
is parked (:class:`basalt.services.store_node.long_polling.PullRequestHoldService`) until the
store reports an arrival on that queue, or the timeout.

Concurrency: one asyncio loop. Store calls that may block on the disk (fsync,
reading cold files) run in the default executor; reads of the page cache
(``get_message``) run on the loop, except those whose filter must be checked
against the CommitLog (SQL92): evaluating one over a pull's scan is Python code
per record, and a GetMessages of 32 queues with a filter at the limits took
~0.4 s, holding every other call (health Checks too) that long. Those run in a
worker thread of their own pool (``filtered_read_threads``); get_message is
safe there: it reads only below write positions and holds each mapped file it
reads against expiry (:mod:`basalt.store.get_message`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import grpc
from opentelemetry import trace

from basalt.common.message import (
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_TRANSACTION_PREPARED,
    SCHEDULE_TOPIC,
    SYSTEM_TOPICS,
    TIMER_PROPERTIES,
    TIMER_TOPIC,
    decode_host,
    parse_offset_msg_id,
)
from basalt.common.record import batch_has_property
from basalt.common.settings import (
    boolean,
    check,
    config_dataclass,
    non_empty,
    non_negative,
    positive,
    setting,
    validate,
)
from basalt.services.checks import (
    check_batch_entries,
    check_broker_perm,
    check_group,
    check_read_arguments,
    check_topic,
    no_such_topic,
    readable_queue,
    subscription_filter,
)
from basalt.services.errors import (
    Refusal,
    as_refusal,
    commit_response,
    invalid,
    pull_response,
    put_refusal,
    refused,
)
from basalt.services.meta.model import Perm, TopicConfig
from basalt.services.process import MAX_PENDING_CALLS
from basalt.services.rpc import rpc_method as _rpc
from basalt.services.store_node.fetch_stream import Fetch, serve_fetch_stream
from basalt.services.store_node.ha.gate import WriteGate
from basalt.services.store_node.long_polling import HeldRead, PullRequestHoldService
from basalt.services.store_node.metrics import StoreNodeMetrics, end_get_span, get_messages_span
from basalt.services.store_node.pop import PopRpcs
from basalt.services.store_node.retry_rpcs import RetryRpcs
from basalt.services.store_node.schedule_rpcs import (
    ScheduleRpcs,
    recall_handle,
    timer_properties,
    timer_record,
)
from basalt.services.store_node.send_stream import SendOutcome, SendRequest, serve_send_stream
from basalt.services.store_node.served_streams import ServedStreams
from basalt.services.store_node.topics import TopicDirectory
from basalt.services.store_node.transaction_rpcs import TransactionRpcs
from basalt.services.store_node.wire import pull_batch_wire
from basalt.services.validation import STORE_PROPERTIES, LimitError, check_property_names
from basalt.store import Message, MessageStore
from basalt.store.batch import EncodedBatch
from basalt.store.expiry import disk_used_percent
from basalt.store.get_message import GetMessageResult, GetStatus
from basalt.store.message_filter import MessageFilter
from basalt.store.put_result import PutMessageResult, PutStatus
from basalt.store.timer.park import TIMER_REQUEST_PROPERTIES
from basalt.store.transaction import BadHalf, half_message, is_transactional
from basalt.v1 import common_pb2 as pb
from basalt.v1 import store_node_pb2 as sn
from basalt.v1 import store_node_pb2_grpc as sn_grpc

log = logging.getLogger(__name__)

#: The API's proxy: it binds to whatever TracerProvider the process installs.
_tracer = trace.get_tracer("basalt.services.store_node")

#: Most subscription filters a store-node keeps parsed (StoreNodeServicer._filter).
_MAX_FILTERS_KEPT = 1024
#: Pull statuses that mean "nothing new yet" (RocketMQ's PULL_NOT_FOUND): the ones
#: long polling waits on; an empty or unknown queue only at offset 0.
_WAIT_STATUSES = frozenset({GetStatus.OFFSET_OVERFLOW_ONE, GetStatus.OFFSET_FOUND_NULL})
_WAIT_AT_ZERO = frozenset({GetStatus.NO_MESSAGE_IN_QUEUE, GetStatus.NO_MATCHED_LOGIC_QUEUE})
#: A send's store status on the wire.
_PUT_STATUS = {s: pb.PutMessageStatus.Value("PUT_MESSAGE_STATUS_" + s.name) for s in PutStatus}
#: A written send's SendStatus by its PutStatus (RocketMQ's SendMessageProcessor);
#: the others are refusals (services.errors.put_refusal).
_SEND_STATUS = {
    PutStatus.PUT_OK: pb.SEND_STATUS_SEND_OK,
    PutStatus.FLUSH_DISK_TIMEOUT: pb.SEND_STATUS_FLUSH_DISK_TIMEOUT,
    PutStatus.FLUSH_SLAVE_TIMEOUT: pb.SEND_STATUS_FLUSH_SLAVE_TIMEOUT,
}


def nothing_new(result: GetMessageResult, offset: int) -> bool:
    """Whether a pull from ``offset`` found nothing new yet, so it may be held.

    A filtered scan that matched nothing is held only when it reached the end of
    the queue (then only an arrival can match); with more units left it answers
    at once (PULL_RETRY_IMMEDIATELY), so a held pull never rescans a backlog on
    the event loop.
    """
    status = result.status
    if status in _WAIT_STATUSES:
        return True
    if status in _WAIT_AT_ZERO:
        return offset == 0
    return status is GetStatus.NO_MATCHED_MESSAGE and result.next_begin_offset >= result.max_offset


def checks_every_record(flt: MessageFilter) -> bool:
    """Whether a read with ``flt`` runs the filter's CommitLog check (Python) on
    every record it scans - SQL92's, which has no ConsumeQueue pre-check - and so
    belongs off the event loop. A TAG filter is decided in C on each unit's
    tagsCode; only the candidates it passes (at most a batch, plus hash
    collisions) reach its CommitLog check, and ``*`` reaches none."""
    return flt.needs_commit_log_check and flt.tags_codes is None


@config_dataclass
class StoreNodeConfig:
    """What a store-node is told at start (RocketMQ's BrokerConfig, in part).
    Validated at construction: ValueError names the first bad field."""

    broker_name: str = setting(
        check=non_empty, doc="The store-node's name in the cluster (its brokers/<name> key)."
    )
    broker_permission: int = setting(
        default=int(Perm.RW),
        check=check(
            "RocketMQ's PermName bits 0..7 (6 read and write, 4 read only, 2 write only)",
            lambda v: isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 7,
        ),
        doc="RocketMQ's brokerPermission, registered as the node's perm in etcd: 4 refuses "
        "sends, 2 refuses reads and pops (NO_PERMISSION). The node follows its "
        "registration, so a perm put there takes effect live, until the next start.",
    )
    auto_create_topic_enable: bool = setting(
        default=True,
        check=boolean,
        doc="A send to an unknown topic creates it (RocketMQ's autoCreateTopicEnable).",
    )
    max_suspend_timeout_ms: int = setting(
        default=30_000,
        check=non_negative,
        doc="The longest a GetMessage may be held (a larger suspend_timeout_ms is capped).",
    )
    max_msg_nums_per_pull: int = setting(
        default=1024, check=positive, doc="Largest max_msg_nums served per GetMessage."
    )
    max_queues_per_get_messages: int = setting(
        default=32, check=positive, doc="Most queues one GetMessages reads."
    )
    # One by default: SQL92 evaluation is Python code holding the GIL, so a second
    # thread reads no faster and takes the GIL from the event loop twice as often
    # (benchmarks/filter_latency.py, 4 hostile callers: health Check max 39 ms with
    # one thread, 149 ms with two).
    filtered_read_threads: int = setting(
        default=1,
        check=positive,
        doc="Worker threads for reads whose filter is checked against the CommitLog "
        "(SQL92); more such calls at once wait for one without holding the event loop.",
    )
    max_in_flight_per_send_stream: int = setting(
        default=256,
        check=positive,
        doc="Sends in flight on one SendStream before the node stops reading it.",
    )
    max_fetches_in_flight_per_stream: int = setting(
        default=256,
        check=positive,
        doc="GetMessages in flight (held included) on one GetMessagesStream before the "
        "node stops reading it.",
    )
    max_pending_calls: int = setting(
        default=MAX_PENDING_CALLS,
        check=positive,
        doc="Calls arrived but not yet picked up by the event loop (a burst of long "
        "polls) that gRPC queues; past it a call is refused CANCELLED.",
    )
    # Transactional messages (docs/transactions.md): RocketMQ's BrokerConfig
    # settings, the store-node's since it is the node that asks producers.
    transaction_timeout_ms: int = setting(
        default=6_000,
        check=positive,
        doc="A half message younger than this (from its born time) is not checked "
        "back yet (RocketMQ's transactionTimeOut).",
    )
    transaction_check_max: int = setting(
        default=15,
        check=positive,
        doc="Check-backs of one half message before it goes to TRANS_CHECK_MAX_TIME_TOPIC "
        "and is rolled back (RocketMQ's transactionCheckMax).",
    )
    transaction_check_interval_ms: int = setting(
        default=60_000,
        check=positive,
        doc="How often unresolved half messages are checked back with their producer "
        "group (RocketMQ's transactionCheckInterval).",
    )

    def __post_init__(self) -> None:
        validate(self, ValueError)


class _Stats:
    """Messages put, for GetRuntimeInfo's put TPS (over the time since the last ask)."""

    def __init__(self) -> None:
        self.messages = 0
        self._last = (time.monotonic(), 0)

    def tps(self) -> float:
        now, count = time.monotonic(), self.messages
        then, before = self._last
        self._last = (now, count)
        return (count - before) / (now - then) if now > then else 0.0


class StoreNodeServicer(
    PopRpcs, ScheduleRpcs, RetryRpcs, TransactionRpcs, sn_grpc.StoreNodeServicer
):
    """The StoreNode RPCs over one running store (the pop-and-ack ones from
    :class:`~basalt.services.store_node.pop.PopRpcs`)."""

    def __init__(
        self,
        config: StoreNodeConfig,
        store: MessageStore,
        topics: TopicDirectory,
        hold: PullRequestHoldService,
        broker_perm: Callable[[], Perm] | None = None,
        group: WriteGate | None = None,
    ) -> None:
        """``broker_perm`` gives this broker's permission as its registration in
        etcd says now (RocketMQ's ``brokerPermission``); None: the configured
        ``broker_permission``. ``group``: this node's broker group, asked before
        and after each send (docs/replication.md); None: a node without one."""
        self.config = config
        self.store = store
        self.topics = topics
        self.hold = hold
        configured = Perm(config.broker_permission)
        self.broker_perm: Callable[[], Perm] = broker_perm or (lambda: configured)
        self.group = group
        self.stats = _Stats()
        self.metrics = StoreNodeMetrics(config.broker_name, store, hold, topics)
        self.boot_timestamp_ms = int(time.time() * 1000)
        #: False while shutting down: sends and reads are refused, as RocketMQ's
        #: broker permission does once it is set unwritable.
        self.writable = True
        #: Each subscription's filter, parsed once (filters are immutable): a
        #: consumer sends the same one with every read, and parsing it was a
        #: tenth of a one-record read's handler. Cleared when full.
        self._filters: dict[tuple[int, str], MessageFilter] = {}
        #: The SendStreams and GetMessagesStreams served (a graceful stop ends them).
        self.streams = ServedStreams()

    # -- checks -----------------------------------------------------------------------

    def _check_node_writable(self) -> None:
        """Refuse a write unless this node takes writes now: not stopping, the
        master of its group (NOT_MASTER naming it), the broker's perm writable."""
        if not self.writable:
            raise Refusal(pb.RESPONSE_CODE_SERVICE_NOT_AVAILABLE, "the store-node is stopping")
        if self.group is not None:
            self.group.check_writable()
        check_broker_perm(self.config.broker_name, self.broker_perm(), write=True)

    def _writable_config(self, topic: str, queue_id: int) -> TopicConfig | None:
        """The checks of a send that need no await: the topic's config, or None
        when this node must create the topic first (:meth:`_writable_topic`).
        Raises :class:`Refusal`."""
        self._check_node_writable()
        broker = self.config.broker_name
        if topic in SYSTEM_TOPICS:
            # The store's own (RocketMQ's TopicValidator refuses sends to system topics):
            # only the store parks messages there, never through etcd's topics.
            how = _SYSTEM_TOPICS.get(topic, "ask for a transactional send instead")
            raise Refusal(
                pb.RESPONSE_CODE_NO_PERMISSION,
                f"topic {topic!r} is a system topic: {how}",
            )
        config = self.topics.topic(topic)
        if config is not None and not config.writable:
            raise Refusal(pb.RESPONSE_CODE_NO_PERMISSION, f"topic {topic!r} is not writable")
        if config is None or broker not in config.brokers:
            # A topic this node does not serve yet: its route must list this node
            # before a message is stored here, or no consumer would ever pull it.
            if not self.config.auto_create_topic_enable:
                if config is None:
                    raise no_such_topic(topic)
                raise Refusal(
                    pb.RESPONSE_CODE_NO_PERMISSION,
                    f"topic {topic!r} is not served by broker {broker!r}",
                )
            return None
        _check_write_queue(config, queue_id)
        return config

    async def _writable_topic(self, topic: str, queue_id: int) -> TopicConfig:
        config = self._writable_config(topic, queue_id)
        if config is None:
            check_topic(topic)
            config = await self.topics.ensure_topic(topic, self.config.broker_name)
            _check_write_queue(config, queue_id)
        return config

    def _readable_topic(self, topic: str, queue_id: int) -> TopicConfig:
        """The topic's config when ``queue_id`` may be read (the pull-service's
        checks 3-5, :func:`basalt.services.checks.readable_queue`)."""
        return readable_queue(self.topics.topic(topic), topic, queue_id)

    # -- sends ------------------------------------------------------------------------

    def _send_result(
        self,
        topic: str,
        queue_id: int,
        result: PutMessageResult,
        started: float,
        recall_handles: Sequence[str] = (),
    ) -> pb.SendResult:
        refusal = put_refusal(result)
        if refusal is not None:
            raise refusal
        self.stats.messages += len(result.queue_offsets)
        self.metrics.on_put(topic, len(result.queue_offsets), sum(result.sizes), started)
        return pb.SendResult(
            status=_SEND_STATUS[result.status],
            put_status=_PUT_STATUS[result.status],
            queue=pb.MessageQueue(
                topic=topic, broker_name=self.config.broker_name, queue_id=queue_id
            ),
            queue_offsets=result.queue_offsets,
            physical_offsets=result.physical_offsets,
            offset_msg_ids=result.msg_ids,
            store_timestamp_ms=result.store_timestamp_ms,
            store_host=decode_host(result.store_host) if result.store_host else "",
            recall_handles=recall_handles,
        )

    def _encode_send(
        self, request: SendRequest
    ) -> tuple[EncodedBatch | PutMessageResult, tuple[str, ...]]:
        """A checked send's records, or the store's refusal, and the recall handles
        of its timer messages (empty: none); refusals of the request itself (an
        empty batch, a message of another topic) raise."""
        broker = self.config.broker_name
        if isinstance(request, sn.SendMessageRequest):
            m = request.message
            stored, handle = _store_message(m, m.topic, request.queue_id, self.store, broker)
            if is_transactional(stored):
                stored = _half(m, stored)
            return self.store.encode_messages([stored]), (handle,) if handle else ()
        topic, queue_id = request.topic, request.queue_id
        if request.WhichOneof("batch") == "records":
            if not request.records:
                raise Refusal(pb.RESPONSE_CODE_MESSAGE_ILLEGAL, "empty batch")
            if batch_has_property(request.records, PROPERTY_TRANSACTION_PREPARED):
                raise Refusal(
                    pb.RESPONSE_CODE_INVALID_PARAMETER,
                    "a batch cannot carry TRAN_MSG: send transactional messages one by one",
                )
            if batch_has_property(request.records, PROPERTY_DELAY_TIME_LEVEL):
                # RocketMQ refuses a delayed MessageBatch too; a parked batch would be
                # one queue's run rewritten record by record.
                raise Refusal(
                    pb.RESPONSE_CODE_MESSAGE_ILLEGAL,
                    "a batch of records cannot carry DELAY: send delayed messages one by one",
                )
            if timer_record(request.records):
                raise Refusal(
                    pb.RESPONSE_CODE_MESSAGE_ILLEGAL,
                    "a batch of records cannot carry a delivery time (TIMER_DELIVER_MS, "
                    "__STARTDELIVERTIME, TIMER_DELAY_SEC/MS): send timer messages one by one",
                )
            return EncodedBatch.of_records(topic, queue_id, request.records), ()
        messages = request.messages.messages
        if not messages:
            raise Refusal(pb.RESPONSE_CODE_MESSAGE_ILLEGAL, "empty batch")
        for m in messages:
            if m.topic and m.topic != topic:
                raise Refusal(
                    pb.RESPONSE_CODE_MESSAGE_ILLEGAL,
                    f"a batch goes to one topic: {m.topic!r} in a batch for {topic!r}",
                )
        pairs = [_store_message(m, topic, queue_id, self.store, broker) for m in messages]
        if any(is_transactional(s) for s, _ in pairs):
            raise Refusal(
                pb.RESPONSE_CODE_INVALID_PARAMETER,
                "a batch cannot carry TRAN_MSG: send transactional messages one by one",
            )
        handles = tuple(h for _, h in pairs)
        return (
            self.store.encode_messages([s for s, _ in pairs]),
            handles if any(handles) else (),
        )

    async def send(self, request: SendRequest) -> pb.SendResult:
        """One send (a message or a batch), checked, stored and answered."""
        started = time.perf_counter()
        topic, queue_id = _send_target(request)
        await self._writable_topic(topic, queue_id)
        encoded, handles = self._encode_send(request)
        return await self._store_encoded(topic, queue_id, encoded, started, handles)

    async def _store_encoded(
        self,
        topic: str,
        queue_id: int,
        encoded: EncodedBatch | PutMessageResult,
        started: float,
        handles: tuple[str, ...] = (),
    ) -> pb.SendResult:
        """Append checked records (``encoded``, or the store's refusal of them),
        confirmed by the broker group when there is one, as a send's result
        (with the timer messages' recall ``handles``, one per record, if any)."""
        if not isinstance(encoded, PutMessageResult):
            encoded = await self.store.put_batch_async(encoded)
            if self.group is not None:
                confirmed: asyncio.Future[PutMessageResult] = (
                    asyncio.get_running_loop().create_future()
                )
                # A call cancelled meanwhile (its deadline) has nobody to answer.
                self.group.confirm_then(
                    encoded, lambda r: None if confirmed.done() else confirmed.set_result(r)
                )
                encoded = await confirmed
        return self._send_result(topic, queue_id, encoded, started, handles)

    def start_send(
        self,
        request: SendRequest,
        on_done: Callable[[SendOutcome], None],
        *,
        alone: bool = False,
        sole: bool = False,
    ) -> bool:
        """:meth:`send` without a coroutine, for SendStream's sends: False (and
        nothing done) when the send must await - its topic is created first -
        and :meth:`send` must take it. ``on_done`` gets the result or refusal,
        possibly before this returns. Refusals of the checks raise. ``alone``:
        the caller starts no other send in this loop turn (the store may then
        write it at once: :meth:`MessageStore.put_batch_then`); ``sole``: no
        other stream sends to this node now."""
        started = time.perf_counter()
        topic, queue_id = _send_target(request)
        if self._writable_config(topic, queue_id) is None:
            return False
        encoded, handles = self._encode_send(request)

        def settle(result: PutMessageResult) -> None:
            # Called by the store's drain, which settles the rest of the group
            # after this: nothing may escape.
            try:
                outcome: SendOutcome = self._send_result(topic, queue_id, result, started, handles)
            except Exception as e:
                outcome = as_refusal(e, "SendStream")
            on_done(outcome)

        if isinstance(encoded, PutMessageResult):
            settle(encoded)
        elif self.group is not None:
            group = self.group
            self.store.put_batch_then(
                encoded,
                lambda result: group.confirm_then(result, settle),
                alone=alone,
                sole=sole,
            )
        else:
            self.store.put_batch_then(encoded, settle, alone=alone, sole=sole)
        return True

    @_rpc
    async def SendMessage(
        self, request: sn.SendMessageRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> sn.SendMessageResponse:
        return sn.SendMessageResponse(result=await self.send(request))

    @_rpc
    async def SendBatch(
        self, request: sn.SendBatchRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> sn.SendBatchResponse:
        return sn.SendBatchResponse(result=await self.send(request))

    @_rpc
    async def SendStream(  # type: ignore[override]
        self, request_iterator: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> None:
        """Many sends in flight on one stream: see :mod:`basalt.services.store_node.send_stream`."""
        max_in_flight = self.config.max_in_flight_per_send_stream
        await self.streams.serve(serve_send_stream, self, context, max_in_flight)

    # -- reads ------------------------------------------------------------------------

    def _read(
        self, request: sn.GetMessageRequest
    ) -> tuple[HeldRead[GetMessageResult], pb.CommitResult | None]:
        """Check one queue's read and store its commit offset; the read to run
        (held or not) and the commit's outcome. Refusals as GetMessage's."""
        topic, queue_id = request.topic, request.queue_id
        if not self.writable:
            raise Refusal(pb.RESPONSE_CODE_SERVICE_NOT_AVAILABLE, "the store-node is stopping")
        # The pull-service's check_pull, in its order, with its codes and
        # messages (basalt.services.checks): the SDK reads here directly.
        check_read_arguments(
            request.group, request.offset, request.max_msg_nums, max_field="max_msg_nums"
        )
        if request.max_msg_nums > self.config.max_msg_nums_per_pull:
            raise invalid(
                f"max_msg_nums {request.max_msg_nums} is not within "
                f"1..{self.config.max_msg_nums_per_pull}"
            )
        check_broker_perm(self.config.broker_name, self.broker_perm(), write=False)
        self._readable_topic(topic, queue_id)
        flt = self._filter(request.subscription)
        commit = None
        if request.HasField("commit_offset"):
            commit = commit_response(
                self.store.commit_offset(
                    request.group,
                    topic,
                    queue_id,
                    request.commit_offset,
                    reset_epoch=request.reset_epoch if request.HasField("reset_epoch") else None,
                )
            )
        store, group, max_nums, first = (
            self.store,
            request.group,
            request.max_msg_nums,
            request.offset,
        )

        def pull(offset: int) -> GetMessageResult:
            return store.get_message(group, topic, queue_id, offset, max_nums, flt)

        read = HeldRead(
            topic=topic,
            queue_id=queue_id,
            offset=first,
            pull=pull,
            found=lambda r: not nothing_new(r, first),
            next_offset=lambda r: r.next_begin_offset,
            max_offset=lambda: store.get_max_offset_in_queue(topic, queue_id),
            slow=checks_every_record(flt),
        )
        return read, commit

    def _filter(self, subscription: pb.Subscription) -> MessageFilter:
        """``subscription_filter(subscription)``, kept (an expression that does not
        parse raises each time: it is never kept)."""
        key = (subscription.type, subscription.expression)
        flt = self._filters.get(key)
        if flt is None:
            flt = subscription_filter(subscription)
            if len(self._filters) >= _MAX_FILTERS_KEPT:
                self._filters.clear()
            self._filters[key] = flt
        return flt

    def _suspend_s(self, suspend_timeout_ms: int) -> float:
        if suspend_timeout_ms < 0:
            raise invalid(f"suspend_timeout_ms {suspend_timeout_ms} is negative")
        return min(suspend_timeout_ms, self.config.max_suspend_timeout_ms) / 1000

    @_rpc
    async def GetMessage(
        self, request: sn.GetMessageRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> sn.GetMessageResponse:
        started = time.perf_counter()
        with get_messages_span("GetMessage") as span:
            timeout_s = self._suspend_s(request.suspend_timeout_ms)
            read, commit = self._read(request)
            (result,) = await self.hold.hold([read], timeout_s)
            self.metrics.on_get(request.topic, result.message_count, len(result.records))
            end_get_span(span, 1, result.message_count)
        self.metrics.on_get_call(started)
        return _get_response(result, commit)

    @_rpc
    async def GetMessages(  # type: ignore[override]  # answers serialized bytes
        self, request: sn.GetMessagesRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> bytes:
        """Each entry checked (and its commit stored) as GetMessage would; the
        accepted ones held together, unless an entry was refused: that is an
        answer worth sending at once."""
        started = time.perf_counter()
        with get_messages_span("GetMessages") as span:
            answer = await self._get_messages(request)
            end_get_span(span, len(request.reads), answer[1])
        self.metrics.on_get_call(started)
        return answer[0]

    async def _get_messages(self, request: sn.GetMessagesRequest) -> tuple[bytes, int]:
        """GetMessages' answer, serialized, and the messages it carries."""
        fetch = self.start_fetch(request)
        if fetch.answer is None:
            await self.hold_fetch(fetch)
        assert fetch.answer is not None
        return fetch.answer

    def start_fetch(self, request: sn.GetMessagesRequest) -> Fetch:
        """Check a GetMessages, store its commits and read what it reads now, on
        the loop; answered (``answer`` set) unless it must wait: nothing found
        and a hold asked, or a read that runs in a worker thread
        (:meth:`hold_fetch` then). Raises what the call fails with."""
        timeout_s = self._suspend_s(request.suspend_timeout_ms)
        entries = request.reads
        check_batch_entries(
            "GetMessages",
            "reads",
            "read",
            self.config.max_queues_per_get_messages,
            [(e.topic, e.queue_id, e.suspend_timeout_ms) for e in entries],
        )
        fetch = Fetch(timeout_s)
        for entry in entries:
            try:
                fetch.reads.append(self._read(entry))
                fetch.refusals.append(None)
            except Exception as e:
                fetch.refusals.append(
                    pb.PullResponse(refused=refused(as_refusal(e, "GetMessages")))
                )
        if len(fetch.reads) < len(entries):
            fetch.timeout_s = 0.0  # a refusal is an answer worth sending at once
        held = [r for r, _ in fetch.reads]
        results = self.hold.pull_now(held) if held else []
        if results is not None and self.hold.settled(held, results, fetch.timeout_s):
            fetch.answer = self._fetch_answer(fetch, results)
        else:
            fetch.first = results
        return fetch

    async def hold_fetch(self, fetch: Fetch, until: asyncio.Future[Any] | None = None) -> None:
        """Hold a fetch :meth:`start_fetch` left unanswered until it finds something,
        its time is up or ``until`` is done; then answer it."""
        held = [r for r, _ in fetch.reads]
        results = await self.hold.hold(held, fetch.timeout_s, until=until, first=fetch.first)
        fetch.answer = self._fetch_answer(fetch, results)

    def _fetch_answer(self, fetch: Fetch, results: list[GetMessageResult]) -> tuple[bytes, int]:
        read = iter(zip(fetch.reads, results, strict=True))
        out: list[tuple[pb.PullResponse, bytes | None, int]] = []
        messages = 0
        for answer in fetch.refusals:
            if answer is not None:
                out.append((answer, None, 0))
                continue
            (held, commit), result = next(read)
            try:
                head = pull_response(
                    _store_status(result),
                    held.first_offset,
                    next_begin_offset=result.next_begin_offset,
                    min_offset=result.min_offset,
                    max_offset=result.max_offset,
                    records=None,
                    commit=commit,
                )
            except Refusal as r:  # a status the client's table does not know
                out.append((pb.PullResponse(refused=refused(r)), None, 0))
                continue
            out.append((head, result.records, result.message_count))
            messages += result.message_count
            self.metrics.on_get(held.topic, result.message_count, len(result.records))
        # Serialized here, the records copied once (basalt.services.store_node.wire); the
        # registration in basalt.services.store_node.server lets GetMessages answer bytes.
        return pull_batch_wire(out), messages

    @_rpc
    async def GetMessagesStream(  # type: ignore[override]
        self, request_iterator: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> None:
        """GetMessages calls on one stream: see :mod:`basalt.services.store_node.fetch_stream`."""
        max_in_flight = self.config.max_fetches_in_flight_per_stream
        await self.streams.serve(serve_fetch_stream, self, context, max_in_flight)

    @_rpc
    async def GetMinMaxOffset(
        self, request: sn.GetMinMaxOffsetRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> sn.GetMinMaxOffsetResponse:
        self._readable_topic(request.topic, request.queue_id)
        return sn.GetMinMaxOffsetResponse(
            min_offset=self.store.get_min_offset_in_queue(request.topic, request.queue_id),
            max_offset=self.store.get_max_offset_in_queue(request.topic, request.queue_id),
        )

    @_rpc
    async def SearchOffset(
        self, request: sn.SearchOffsetRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> sn.SearchOffsetResponse:
        self._readable_topic(request.topic, request.queue_id)
        offset = await asyncio.to_thread(
            self.store.get_offset_in_queue_by_time,
            request.topic,
            request.queue_id,
            request.timestamp_ms,
        )
        return sn.SearchOffsetResponse(offset=offset)

    @_rpc
    async def QueryConsumerOffset(
        self, request: sn.QueryConsumerOffsetRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> sn.QueryConsumerOffsetResponse:
        check_group(request.group)
        offsets = self.store.consumer_offsets
        return sn.QueryConsumerOffsetResponse(
            offset=offsets.query_offset(request.group, request.topic, request.queue_id),
            reset_epoch=offsets.reset_epoch(request.group, request.topic),
        )

    @_rpc
    async def UpdateConsumerOffset(
        self, request: sn.UpdateConsumerOffsetRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> sn.UpdateConsumerOffsetResponse:
        check_group(request.group)
        self._readable_topic(request.topic, request.queue_id)
        result = self.store.commit_offset(
            request.group,
            request.topic,
            request.queue_id,
            request.offset,
            reset_epoch=request.reset_epoch if request.HasField("reset_epoch") else None,
        )
        return sn.UpdateConsumerOffsetResponse(commit=commit_response(result))

    @_rpc
    async def QueryMessage(
        self, request: sn.QueryMessageRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> sn.QueryMessageResponse:
        if self.topics.topic(request.topic) is None:
            raise no_such_topic(request.topic)
        if not request.key:
            raise invalid("key must not be empty")
        end = request.end_timestamp_ms or 2**62
        result = await asyncio.to_thread(
            self.store.query_message,
            request.topic,
            request.key,
            request.max_num or 32,
            request.begin_timestamp_ms,
            end,
        )
        return sn.QueryMessageResponse(
            records=pb.Records(data=result.records, count=result.message_count),
            index_last_update_timestamp_ms=result.index_last_update_timestamp_ms,
            index_last_update_phy_offset=result.index_last_update_phy_offset,
        )

    @_rpc
    async def ViewMessage(
        self, request: sn.ViewMessageRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> sn.ViewMessageResponse:
        try:
            _, physical = parse_offset_msg_id(request.offset_msg_id)
        except ValueError as e:
            raise invalid(f"not an offset message id: {request.offset_msg_id!r}") from e
        raw = await asyncio.to_thread(self._read_record, physical)
        if raw is None:
            raise Refusal(
                pb.RESPONSE_CODE_QUERY_NOT_FOUND, f"no message at {request.offset_msg_id}"
            )
        return sn.ViewMessageResponse(records=pb.Records(data=raw, count=1))

    def _read_record(self, physical: int) -> bytes | None:
        record = self.store.lookup_message_by_offset(physical)
        return None if record is None else self.store.commitlog.read(physical, record.store_size)

    @_rpc
    async def ResetOffset(
        self, request: sn.ResetOffsetRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> sn.ResetOffsetResponse:
        check_group(request.group)
        config = self.topics.topic(request.topic)
        if config is None:
            raise no_such_topic(request.topic)
        if request.timestamp_ms < -1:
            raise invalid(f"timestamp_ms {request.timestamp_ms}: a time in ms, or -1 for the max")
        # The store's part (a binary search per queue, then the offsets and
        # epoch written) as a span of its own, under the RPC's.
        with _tracer.start_as_current_span(
            "reset offsets by time",
            attributes={
                "messaging.consumer.group.name": request.group,
                "messaging.destination.name": request.topic,
                "basalt.reset.queue_count": config.read_queue_nums,
            },
        ):
            table, epoch = await asyncio.to_thread(
                self.store.reset_offset_by_time,
                request.group,
                request.topic,
                range(config.read_queue_nums),
                request.timestamp_ms,
                force=request.force,
            )
        return sn.ResetOffsetResponse(
            offsets=table, reset_epoch=epoch, broker_name=self.config.broker_name
        )

    @_rpc
    async def GetRuntimeInfo(
        self, request: sn.GetRuntimeInfoRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> sn.GetRuntimeInfoResponse:
        store = self.store
        used_percent = disk_used_percent(store.config.store_path_root_dir)
        extra = {
            "held_pulls": str(self.hold.held),
            "woken_by_arrival": str(self.hold.woken_by_arrival),
        }
        # A failed background service (see store.failures): why sends are refused.
        for failure in store.failures.failures:
            extra[f"failed:{failure.service}"] = failure.describe()
        return sn.GetRuntimeInfoResponse(
            broker_name=self.config.broker_name,
            store_host=store.config.store_host,
            boot_timestamp_ms=self.boot_timestamp_ms,
            put_tps=self.stats.tps(),
            dispatch_behind_bytes=store.dispatch_behind_bytes,
            # As df shows it, as the store's own space guard measures it.
            disk_use_ratio=max(used_percent, 0.0) / 100,
            commit_log_min_offset=store.min_physical_offset,
            commit_log_max_offset=store.max_physical_offset,
            extra=extra,
        )


def _get_response(
    result: GetMessageResult, commit: pb.CommitResult | None
) -> sn.GetMessageResponse:
    return sn.GetMessageResponse(
        status=_store_status(result),
        next_begin_offset=result.next_begin_offset,
        min_offset=result.min_offset,
        max_offset=result.max_offset,
        records=pb.Records(data=result.records, count=result.message_count),
        commit=commit,
    )


def _store_status(result: GetMessageResult) -> pb.GetMessageStatus.ValueType:
    return pb.GetMessageStatus.Value("GET_MESSAGE_STATUS_" + result.status.name)


def _half(m: pb.Message, stored: Message) -> Message:
    """A transactional send as its half message (store.transaction); refused
    INVALID_PARAMETER with a delay or a timer (RocketMQ's producer refuses a
    delayed transactional message: the half, not the commit, would wait), or
    without a producer group or transaction id."""
    if stored.delay_time_level > 0 or m.deliver_time_ms or TIMER_PROPERTIES & m.properties.keys():
        raise Refusal(
            pb.RESPONSE_CODE_INVALID_PARAMETER,
            "a transactional message cannot have a delay level or a delivery time",
        )
    try:
        return half_message(stored)
    except BadHalf as e:
        raise Refusal(pb.RESPONSE_CODE_INVALID_PARAMETER, str(e)) from None


_TIMER_NAMES = frozenset(TIMER_REQUEST_PROPERTIES)
#: What a sender to one of the system topics should do instead (the rest: a transactional send).
_SYSTEM_TOPICS = {
    SCHEDULE_TOPIC: "ask for a delay level instead",
    TIMER_TOPIC: "ask for a delivery time (deliver_time_ms) instead",
}


def _send_target(request: SendRequest) -> tuple[str, int]:
    if isinstance(request, sn.SendMessageRequest):
        return request.message.topic, request.queue_id
    return request.topic, request.queue_id


def _check_write_queue(config: TopicConfig, queue_id: int) -> None:
    if not 0 <= queue_id < config.write_queue_nums:
        raise invalid(
            f"queue id {queue_id} is out of range: topic {config.topic_name!r} has "
            f"{config.write_queue_nums} write queues"
        )


def _store_message(
    m: pb.Message, topic: str, queue_id: int, store: MessageStore, broker: str
) -> tuple[Message, str]:
    """A wire Message as the store's, and its recall handle ("" but for a timer
    message); MESSAGE_ILLEGAL for a property named as the store's own
    (``__CRC32#``, basalt.services.validation), INVALID_PARAMETER for a delay
    level (``delay_level``, else the DELAY property) outside 0..N: the front
    refuses what the store would clamp (docs/scheduled.md), and for a bad timer
    (schedule_rpcs.timer_properties, docs/timers.md)."""
    levels = len(store.config.delay_levels_ms)
    try:
        check_property_names(m.properties, STORE_PROPERTIES)
    except LimitError as e:
        raise e.refusal() from None
    level = m.delay_level
    raw = m.properties.get(PROPERTY_DELAY_TIME_LEVEL)
    if not level and raw is not None:
        # A RocketMQ client sets the level as the DELAY property.
        try:
            level = int(raw)
        except ValueError:
            level = -1
    if not 0 <= level <= levels:
        raise Refusal(
            pb.RESPONSE_CODE_INVALID_PARAMETER,
            f"delay level {raw if raw is not None and not m.delay_level else level} is out of "
            f"range: 0 (no delay) or 1-{levels} (the store's message_delay_level)",
        )
    properties = dict(m.properties)
    handle = ""
    if m.deliver_time_ms or (properties and not _TIMER_NAMES.isdisjoint(properties)):
        deliver = timer_properties(m, properties, level, store)
        handle = recall_handle(topic, broker, deliver, properties)
    message = Message(
        topic,
        m.body,
        queue_id=queue_id,
        tags=m.tags or None,
        keys=tuple(m.keys),
        properties=properties,
        flag=m.flag,
        born_timestamp_ms=m.born_timestamp_ms,
        born_host=m.born_host or "127.0.0.1:0",
        delay_time_level=level,
    )
    return message, handle
