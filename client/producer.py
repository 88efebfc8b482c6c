"""The Producer: RocketMQ's DefaultMQProducer over Basalt's gRPC contracts.

Routes come from a pull-service's ``QueryRoute`` (refreshed every
``poll_name_server_interval_ms`` and after a failed send); a send goes to the
next writable queue, round robin (RocketMQ's selectOneMessageQueue), over
one ``StoreNode.SendStream`` per store-node: every send carries an
``opaque`` and many are in flight at once on one stream. A batch is encoded
here (RocketMQ's MessageBatch: ``basalt.common.record.encode_batch``, one C call) and
sent as one item: the store-node never decodes it into objects. The stream's
requests are serialized here (:func:`send_stream_batch`), the records
framed rather than copied through protobuf objects, and the sends started in
one loop turn share one write.

The round robin starts at a random queue, per producer (RocketMQ's
ThreadLocalIndex), so short-lived producers spread over the queues.

A topic with no route yet is sent on the route of ``TBW102`` (RocketMQ's
default topic: the store-nodes that create topics on first send) until the
next route refresh: every store-node the round robin reaches creates it there.

Failures: a refusal RocketMQ's producer retries (the broker unavailable,
busy or failing, the topic or permission missing there), a broken stream and
a store-node silent past the deadline are retried on another broker, up to
``retry_times_when_send_failed`` more times within ``send_msg_timeout_ms``;
anything else (an illegal message, a bad argument) raises at once. Every
failure is a :class:`ClientError` subclass with the store-node's code and
message, never a gRPC or asyncio exception: a stream whose call ends (the
store-node killed, stopping, or aborting it) or whose write fails fails its
sends in flight at once with :class:`ServiceUnavailableError`, and is
replaced by a fresh one on the next send to that store-node.

Tracing: a send (one message or one batch) is one PRODUCER span, "send
<topic>", and its messages carry its context in the ``traceparent`` property
(:mod:`basalt.common.tracing`); untraced, nothing is added.

Concurrency: one event loop; :meth:`Producer.send_async` may be called many
times before awaiting any of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import itertools
import logging
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

import grpc
from opentelemetry import trace
from opentelemetry.util.types import AttributeValue

from basalt.client.channels import Client, finish_requests
from basalt.client.errors import (
    ClientError,
    NotMasterError,
    ServiceUnavailableError,
    TopicNotFoundError,
    describe_failure,
)
from basalt.client.tasks import TaskOwner
from basalt.common import _records, dial
from basalt.common.auth import Credentials
from basalt.common.message import (
    PROPERTY_CRC32,
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_UNIQ_KEY,
    TIMER_REQUEST_PROPERTIES,
    Message,
    encode_host,
    new_uniq_keys,
)
from basalt.common.protowire import LENGTH_DELIMITED, VARINT, tag, varint
from basalt.common.recall import RecallHandle
from basalt.common.record import encode_batch
from basalt.common.settings import (
    config_dataclass,
    non_empty,
    non_negative,
    positive,
    setting,
    validate,
)
from basalt.common.tls import TlsConfig
from basalt.common.tracing import (
    MESSAGING_BATCH_MESSAGE_COUNT,
    MESSAGING_DESTINATION_NAME,
    MESSAGING_MESSAGE_ID,
    MESSAGING_OPERATION_NAME,
    MESSAGING_OPERATION_TYPE,
    MESSAGING_ROCKETMQ_MESSAGE_KEYS,
    MESSAGING_ROCKETMQ_MESSAGE_TAG,
    MESSAGING_SYSTEM,
    MESSAGING_SYSTEM_ROCKETMQ,
    message_trace_properties,
    tracing_installed,
)
from basalt.v1 import common_pb2 as pb
from basalt.v1 import pull_service_pb2 as ps
from basalt.v1 import store_node_pb2 as sn
from basalt.v1 import store_node_pb2_grpc as sn_grpc

log = logging.getLogger(__name__)

#: The API's proxy: it binds to whatever TracerProvider the process installs.
_tracer = trace.get_tracer("basalt.client")

#: RocketMQ's default topic, whose route takes a topic that does not exist yet.
AUTO_CREATE_TOPIC = "TBW102"

#: The round robin's random start is drawn below this (any start works: the
#: turn is taken modulo the route's queue count).
_TURN_START_RANGE = 1 << 16

#: Refusals RocketMQ's producer retries on another broker (DefaultMQProducer's
#: retryResponseCodes, plus SYSTEM_BUSY: Basalt's flow control, and
#: INVALID_PARAMETER: the producer picks queue ids from its route, so a queue
#: id refused means the route is stale, e.g. write_queue_nums just lowered;
#: RocketMQ's broker answers SYSTEM_ERROR there, which it retries).
RETRIED_CODES = frozenset(
    {
        pb.RESPONSE_CODE_TOPIC_NOT_EXIST,
        pb.RESPONSE_CODE_SERVICE_NOT_AVAILABLE,
        pb.RESPONSE_CODE_SYSTEM_ERROR,
        pb.RESPONSE_CODE_SYSTEM_BUSY,
        pb.RESPONSE_CODE_NO_PERMISSION,
        pb.RESPONSE_CODE_INVALID_PARAMETER,
        pb.RESPONSE_CODE_NOT_MASTER,
        pb.RESPONSE_CODE_IN_SYNC_REPLICAS_NOT_ENOUGH,
    }
)


@config_dataclass
class ProducerConfig:
    """RocketMQ's producer settings, by its names in snake_case. Validated at
    construction: ValueError names the first bad field."""

    producer_group: str = setting(check=non_empty, doc="RocketMQ's producerGroup.")
    retry_times_when_send_failed: int = setting(
        default=2,
        check=non_negative,
        doc="More attempts after a failed send, each on another broker when there is one.",
    )
    send_msg_timeout_ms: int = setting(
        default=3000, check=positive, doc="A send's deadline, retries included."
    )
    poll_name_server_interval_ms: int = setting(
        default=30_000,
        check=positive,
        doc="Route refresh period (RocketMQ's pollNameServerInterval).",
    )

    def __post_init__(self) -> None:
        validate(self, ValueError)


@dataclass(frozen=True, slots=True)
class QueueAddress:
    """A writable queue and where its store-node is."""

    broker_name: str
    queue_id: int
    address: str
    store_host: str


@dataclass(frozen=True, slots=True)
class SendResult:
    """One message's outcome (RocketMQ's SendResult)."""

    status: int  # pb.SendStatus: SEND_OK, or FLUSH_DISK_TIMEOUT (written, fsync late)
    #: The producer's message id (UNIQ_KEY).
    msg_id: str
    #: The store's id (ViewMessage takes it).
    offset_msg_id: str
    topic: str
    broker_name: str
    queue_id: int
    queue_offset: int
    #: For a timer message (``Message.deliver_time_ms``), what
    #: :meth:`Producer.recall` cancels it with before it is due; "" otherwise.
    recall_handle: str = ""

    @property
    def ok(self) -> bool:
        return self.status == pb.SEND_STATUS_SEND_OK


#: SendResult's fields in the order _send_to passes their values.
_SEND_RESULT_FIELDS = (
    "status",
    "msg_id",
    "offset_msg_id",
    "topic",
    "broker_name",
    "queue_id",
    "queue_offset",
    "recall_handle",
)


#: The gRPC service RecallMessage belongs to (named when a call hits another).
_STORE_NODE = sn.DESCRIPTOR.services_by_name["StoreNode"].full_name
#: SendStream, opened by :func:`basalt.common.dial.open_stream`.
_SEND_STREAM = dial.rpc_path(
    sn.DESCRIPTOR.services_by_name["StoreNode"].methods_by_name["SendStream"]
)


class _Stream:
    """One SendStream to a store-node: futures by opaque, answered by a reader
    task; sends made while a write is under way go out together in the next,
    written by a writer task of the stream's own.

    The stream takes requests as bytes (see :func:`send_stream_batch`): a
    SendStreamRequest is its items' serializations back to back, so a write
    is one ``b"".join`` of what was queued, not protobuf objects built around
    each 100 KB batch, copied into the request and serialized again.

    Breaking: the first of the reader ending (the store-node died, ended or
    aborted the call), a write failing or :meth:`close` breaks the stream for
    good: every send waiting on it fails at once with
    :class:`ServiceUnavailableError`, and so does every later :meth:`send`
    (:attr:`broken` tells the producer to open a fresh one). No other exception
    leaves :meth:`send` but the caller's own cancellation."""

    def __init__(self, channel: grpc.aio.Channel, address: str, tasks: TaskOwner) -> None:
        self.address = address
        self.tasks = tasks
        self.call: grpc.aio.StreamStreamCall[bytes, sn.SendStreamResponse] = dial.open_stream(
            channel,
            _SEND_STREAM,
            None,  # requests are already serialized
            sn.SendStreamResponse.FromString,
        )
        self.waiting: dict[int, asyncio.Future[sn.SendStreamAnswer]] = {}
        self.unsent: list[bytes] = []
        #: Why the stream broke; None while it works.
        self.failure: str | None = None
        #: Set while the writer waits for a send to write.
        self.idle: asyncio.Future[None] | None = None
        self.reader = tasks.spawn(self._read(), name=f"SendStream reader {address}")
        self.writer = tasks.spawn(self._write_unsent(), name=f"SendStream writer {address}")

    async def _read(self) -> None:
        why = "the store-node ended the stream"
        try:
            async for response in self.call:
                for answer in response.answers:
                    future = self.waiting.pop(answer.opaque, None)
                    if future is not None and not future.done():
                        future.set_result(answer)
        except asyncio.CancelledError:
            # Not re-raised (the reader ends here either way): a task that ends
            # cancelled keeps the CancelledError, whose traceback's frames hold
            # this stream and its call, a cycle that outlives the event loop until
            # a garbage collection (gRPC's completion queue stays bound to the
            # closed loop meanwhile: "Event loop is closed" in a later one).
            why = "closed"
        except Exception as e:  # whatever ended the reader, nothing will be answered
            why = describe_failure(e)
        finally:
            self._fail(why)
            with contextlib.suppress(asyncio.CancelledError):  # as above
                await finish_requests(self.call)  # gRPC's own write task ends too

    @property
    def broken(self) -> bool:
        return self.failure is not None or self.reader.done()

    def error(self) -> ServiceUnavailableError:
        """The error a send on this broken stream fails with (a new one each
        time: one exception raised in many tasks would chain their tracebacks)."""
        return ServiceUnavailableError(
            pb.RESPONSE_CODE_SERVICE_NOT_AVAILABLE,
            f"SendStream to {self.address} broke: {self.failure or 'the reader ended'}",
        )

    def _fail(self, why: str) -> None:
        """Break the stream (once): fail what waits on it, drop what is unsent
        and cancel the call, which ends the reader and any write under way."""
        if self.failure is not None:
            return
        self.failure = why
        self._wake_writer()  # to end
        waiting, self.waiting = self.waiting, {}
        self.unsent.clear()
        for future in waiting.values():
            if not future.done():
                future.set_exception(self.error())
        self.call.cancel()

    async def send(self, opaque: int, item: Sequence[bytes]) -> sn.SendStreamAnswer:
        """Send one serialized SendStreamItem (with its ``items`` field header,
        in pieces: see :func:`send_stream_batch`) and wait for its answer;
        :class:`ServiceUnavailableError` at once when the stream is (or
        breaks while this waits) broken."""
        # Checked where the send registers, with no await between: a send can
        # never wait on a stream whose reader already ended.
        if self.broken:
            raise self.error()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[sn.SendStreamAnswer] = loop.create_future()
        future.add_done_callback(_mark_seen)
        self.waiting[opaque] = future
        self.unsent += item
        self._wake_writer()
        return await future

    def _wake_writer(self) -> None:
        idle = self.idle
        if idle is not None and not idle.done():
            idle.set_result(None)

    async def _write_unsent(self) -> None:
        """The stream's writer, for its life: write every send not yet written, a
        message at a time (grpc.aio allows one write at a time); a failed write
        breaks the stream.

        A task of the stream's, not the sender's: a sender whose deadline passes
        mid-write would cancel the write, and grpc.aio cancels the whole call
        with it. Woken by a send, it runs after the senders already runnable
        (answers come several to a response, their senders wake together and
        each sends its next batch), so they share one write: each write costs
        gRPC and the kernel the same fixed work. One task for the stream's life,
        not one each time a send finds it idle: a lone send then costs a wake-up,
        not a task made, run and ended."""
        loop = asyncio.get_running_loop()
        try:
            while self.failure is None:
                if not self.unsent:
                    self.idle = loop.create_future()
                    await self.idle
                    continue
                request = b"".join(self.unsent)
                self.unsent.clear()
                await self.call.write(request)
        except asyncio.CancelledError:
            # Not re-raised, as the reader's (a task that ends cancelled keeps its
            # traceback's frames, and with them this stream and its call).
            self._fail("closed")
        except Exception as e:  # InvalidStateError (call finished), AioRpcError
            self._fail(f"a write failed: {describe_failure(e)}")

    def close(self) -> None:
        """Break the stream (its waiting sends fail) and end its tasks."""
        self._fail("closed")
        self.reader.cancel()
        self.writer.cancel()


def _mark_seen(future: asyncio.Future[sn.SendStreamAnswer]) -> None:
    """A sender that gave up (its deadline) no longer awaits its future: mark a
    failure set on it as seen, or asyncio reports it as never retrieved."""
    if not future.cancelled():
        future.exception()


class Producer(Client):
    """Sends messages to a Basalt cluster; ``async with Producer(...)`` or
    :meth:`start` / :meth:`close`."""

    def __init__(
        self,
        endpoints: str,
        *,
        group: str,
        config: ProducerConfig | None = None,
        tls: TlsConfig | None = None,
        credentials: Credentials | None = None,
    ) -> None:
        super().__init__(endpoints, tls=tls, credentials=credentials)
        self.config = config or ProducerConfig(producer_group=group)
        self._streams: dict[str, _Stream] = {}
        #: The streams' readers and writers and send_async's sends.
        self._tasks = TaskOwner()
        self._routes: dict[str, tuple[float, list[QueueAddress]]] = {}
        #: Broker name -> its master's address, as a NOT_MASTER refusal named it:
        #: fresher than any route until a send there fails.
        self._masters: dict[str, str] = {}
        self._opaque = itertools.count(1)
        # RocketMQ's sendWhichQueue (ThreadLocalIndex) starts at a random index: a
        # fleet of short-lived producers spreads over the queues and brokers
        # rather than all writing to the first queue of the first broker.
        self._turn = itertools.count(random.randrange(_TURN_START_RANGE))
        self._closed = False

    async def start(self) -> None:
        self._closed = False
        await super().start()

    async def close(self) -> None:
        """Close the streams and channels; sends still in flight fail with
        :class:`ServiceUnavailableError` (not retried: the producer is closed)."""
        self._closed = True
        for stream in self._streams.values():
            stream.close()
        self._streams.clear()
        await self._tasks.close()
        await super().close()

    # -- sending ----------------------------------------------------------------------

    async def send(self, message: Message) -> SendResult:
        """Send one message to the next writable queue of its topic."""
        (result,) = await self._send([message])
        return result

    async def send_batch(self, messages: Sequence[Message]) -> list[SendResult]:
        """Send messages of one topic as one batch (one queue, one append)."""
        if not messages:
            raise ValueError("a batch needs at least one message")
        topics = {m.topic for m in messages}
        if len(topics) > 1:
            raise ValueError(f"a batch goes to one topic, not {sorted(topics)}")
        if len(messages) > 1 and any(_delayed(m) or _timed(m) for m in messages):
            # RocketMQ's MessageBatch refuses a delay level too: a store-node parks
            # messages one by one, a batch of records is one queue's run.
            raise ValueError("delayed and timer messages cannot be batched: send them one by one")
        return await self._send(messages)

    def send_async(self, message: Message) -> asyncio.Future[SendResult]:
        """:meth:`send` started now; await the future for its result."""
        return self._tasks.spawn(self.send(message))

    async def _send(self, messages: Sequence[Message]) -> list[SendResult]:
        """:meth:`_attempt_sends` in a PRODUCER span, "send <topic>", one per
        call (a batch is one span): when the span records, each message carries
        its context in ``traceparent`` (the caller's messages are not changed:
        copies go out); when it does not, the messages go as they are. With no
        OpenTelemetry SDK installed there is no span at all (tracing_installed)."""
        if not tracing_installed():
            return await self._attempt_sends(messages)
        topic = messages[0].topic
        with _tracer.start_as_current_span(f"send {topic}", kind=trace.SpanKind.PRODUCER) as span:
            if span.is_recording():
                span.set_attributes(_send_attributes(messages))
                carried = message_trace_properties()
                messages = [
                    dataclasses.replace(m, properties={**m.properties, **carried}) for m in messages
                ]
                results = await self._attempt_sends(messages)
                if len(results) == 1:
                    span.set_attribute(MESSAGING_MESSAGE_ID, results[0].msg_id)
                return results
            return await self._attempt_sends(messages)

    async def _attempt_sends(self, messages: Sequence[Message]) -> list[SendResult]:
        """Send ``messages`` (one topic) as one item, retrying a retried refusal,
        a broken stream or a store-node that does not answer on another broker,
        within ``send_msg_timeout_ms``. Raises only :class:`ClientError` subclasses
        (and ValueError for messages that cannot be encoded)."""
        topic = messages[0].topic
        # One id per message for all attempts: a retried message keeps its UNIQ_KEY.
        ids = _uniq_keys(messages)
        deadline = time.monotonic() + self.config.send_msg_timeout_ms / 1000
        failed: set[str] = set()
        last: ClientError | None = None
        for _attempt in range(1 + self.config.retry_times_when_send_failed):
            if time.monotonic() >= deadline:
                break
            self._check_open()
            try:
                queue = self._at_master(await self._pick(topic, failed, refresh=last is not None))
            except ClientError:
                raise
            except Exception:
                self._check_open()  # close() ran during the route lookup: say so
                raise
            try:
                # A timer on this task, not wait_for's task around _send_to:
                # the same deadline without a task per attempt.
                async with asyncio.timeout(deadline - time.monotonic()):
                    return await self._send_to(queue, messages, ids)
            except NotMasterError as e:
                # A slave of the broker's group: the master it names takes the
                # retry, on the same broker, before any route poll (a route
                # polled every 30 s lost messages in RocketMQ #7923).
                last = e
                master = e.master_address
                if master is not None and master != queue.address:
                    self._masters[queue.broker_name] = master
                    continue
            except ClientError as e:
                # A broken stream fails its sends with ServiceUnavailableError
                # (retried) and is replaced on the next send to its node.
                if e.code not in RETRIED_CODES:
                    raise
                last = e
            except TimeoutError:
                self._check_open()
                # The deadline passed with the node silent (hung, or its host
                # gone without a reset): its stream may never answer again.
                self._drop_stream(queue.address)
                last = ClientError.from_code(
                    pb.RESPONSE_CODE_SERVICE_NOT_AVAILABLE,
                    f"{queue.broker_name} at {queue.address} did not answer within "
                    f"send_msg_timeout_ms={self.config.send_msg_timeout_ms}",
                )
            except Exception:
                # close() ran while this send waited on a channel it has closed
                # since: whatever the closed channel raised, the caller learns
                # only that the producer is closed.
                self._check_open()
                raise
            if self._masters.get(queue.broker_name) == queue.address:
                del self._masters[queue.broker_name]  # that master is gone too
            failed.add(queue.broker_name)
            log.info("send to %s failed (%s); retrying elsewhere", queue.broker_name, last)
        raise last or ClientError.from_code(pb.RESPONSE_CODE_SYSTEM_BUSY, "send timed out")

    async def _send_to(
        self, queue: QueueAddress, messages: Sequence[Message], ids: list[str]
    ) -> list[SendResult]:
        topic = messages[0].topic
        opaque = next(self._opaque)
        if len(messages) == 1 and _stored_by_the_store_node(messages[0]):
            m = messages[0]
            parts = send_stream_message(
                opaque, sn.SendMessageRequest(message=_wire(m, ids[0]), queue_id=queue.queue_id)
            )
        else:
            # A plain message goes as a batch of one record, encoded here in C: the
            # store-node validates and stamps it (as every batch) instead of building
            # the record from a wire Message in Python.
            records = encode_batch(
                messages,
                ids,
                queue_id=queue.queue_id,
                store_host=_store_host_bytes(queue.store_host),
                born_timestamp_ms=int(time.time() * 1000),
            )
            parts = send_stream_batch(opaque, topic, queue.queue_id, records)
        answer = await self._stream(queue.address).send(opaque, parts)
        if answer.HasField("refused"):
            raise ClientError.from_code(answer.refused.code, answer.refused.message)
        r = answer.result
        n = len(ids)
        # SendResult's fields in order (_SEND_RESULT_FIELDS); built in C, one
        # frozen dataclass __init__ per message costing more than its encoding.
        return _records.slotted(
            SendResult,
            _SEND_RESULT_FIELDS,
            (
                [r.status] * n,
                ids,
                r.offset_msg_ids,
                [topic] * n,
                [queue.broker_name] * n,
                [queue.queue_id] * n,
                r.queue_offsets,
                r.recall_handles or [""] * n,
            ),
        )

    async def recall(self, topic: str, recall_handle: str) -> str:
        """Cancel a timer message before it is due (RocketMQ 5.3's recall), by the
        ``recall_handle`` its :class:`SendResult` carried; returns its message id.

        Raises ValueError for text that is not a recall handle, and ClientError:
        QUERY_NOT_FOUND when the message is not pending (delivered already, or
        unknown), INVALID_PARAMETER for a handle of another topic."""
        handle = RecallHandle.decode(recall_handle)
        self._check_open()
        queues = await self.route(topic)
        mine = [q for q in queues if q.broker_name == handle.broker_name]
        if not mine:
            raise ClientError.from_code(
                pb.RESPONSE_CODE_INVALID_PARAMETER,
                f"the recall handle names broker {handle.broker_name!r}, which does not "
                f"serve topic {topic!r}",
            )
        address = self._at_master(mine[0]).address
        stub = sn_grpc.StoreNodeStub(self._channel(address))
        try:
            answer = await stub.RecallMessage(
                sn.RecallMessageRequest(topic=topic, recall_handle=recall_handle),
                timeout=self.config.send_msg_timeout_ms / 1000,
            )
        except grpc.aio.AioRpcError as e:
            raise ClientError.from_rpc_error(e, address=address, service=_STORE_NODE) from None
        return answer.message_id

    # -- routes -----------------------------------------------------------------------

    def _at_master(self, queue: QueueAddress) -> QueueAddress:
        """``queue`` at its broker's master when a NOT_MASTER refusal named one.
        Its store host stays the route's: the members of a group hold the same
        bytes at the same offsets, so an offset message id naming any member
        finds the message (docs/replication.md)."""
        master = self._masters.get(queue.broker_name)
        return queue if master is None else replace(queue, address=master)

    async def _pick(self, topic: str, avoid: set[str], *, refresh: bool) -> QueueAddress:
        """The next writable queue of ``topic``, round robin, on a broker not in
        ``avoid`` when there is one (RocketMQ's selectOneMessageQueue)."""
        queues = await self.route(topic, refresh=refresh)
        turn = next(self._turn)
        for k in range(len(queues)):
            queue = queues[(turn + k) % len(queues)]
            if queue.broker_name not in avoid:
                return queue
        return queues[turn % len(queues)]

    async def route(self, topic: str, *, refresh: bool = False) -> list[QueueAddress]:
        """The topic's writable queues, from QueryRoute (cached; ClientError
        TOPIC_NOT_EXIST, or NO_PERMISSION when none is writable)."""
        cached = self._routes.get(topic)
        now = time.monotonic()
        if cached is not None and not refresh and now < cached[0]:
            return cached[1]
        try:
            reply = await self._pull_service().QueryRoute(
                ps.QueryRouteRequest(topic=topic),
                timeout=self.config.send_msg_timeout_ms / 1000,
            )
        except grpc.aio.AioRpcError as e:
            if cached is not None:  # keep sending on what we had
                return cached[1]
            error = ClientError.from_rpc_error(e, address=self.endpoints)
            if not isinstance(error, TopicNotFoundError) or topic == AUTO_CREATE_TOPIC:
                raise error from None
            # A new topic: send it where RocketMQ's producer does, on the default
            # topic's route, kept as the topic's route until the next refresh
            # (RocketMQ's topicPublishInfoTable until pollNameServerInterval):
            # the sends round robin over every writable store-node of it, and
            # each store-node's first one creates the topic there (or adds the
            # node to its brokers), so the topic is served by every node this
            # producer reached. A failed send asks for the topic's own route.
            queues = await self.route(AUTO_CREATE_TOPIC, refresh=refresh)
            self._routes[topic] = (now + self.config.poll_name_server_interval_ms / 1000, queues)
            return queues
        queues = writable_queues(reply.route)
        if not queues:
            raise ClientError.from_code(
                pb.RESPONSE_CODE_NO_PERMISSION, f"topic {topic!r} has no writable queue"
            )
        self._routes[topic] = (now + self.config.poll_name_server_interval_ms / 1000, queues)
        return queues

    # -- channels ---------------------------------------------------------------------

    def _check_open(self) -> None:
        """Raise the typed refusal of a send on (or caught by) a closed producer."""
        if self._closed:
            raise ClientError.from_code(
                pb.RESPONSE_CODE_SERVICE_NOT_AVAILABLE, "the producer is closed"
            )

    def _stream(self, address: str) -> _Stream:
        self._check_open()  # never a new stream on a channel close() has closed
        stream = self._streams.get(address)
        if stream is None or stream.broken:
            if stream is not None:
                stream.close()  # its tasks end; the owner awaits them
            stream = self._streams[address] = _Stream(self._channel(address), address, self._tasks)
        return stream

    def _drop_stream(self, address: str) -> None:
        stream = self._streams.pop(address, None)
        if stream is not None:
            stream.close()


def writable_queues(route: pb.TopicRoute) -> list[QueueAddress]:
    """A TopicRoute's writable queues on registered, writable brokers, by broker
    then queue id (RocketMQ's topicRouteData2TopicPublishInfo; there the
    queue data's perm carries a broker's wiped write permission, here the
    broker's own ``perm`` does)."""
    brokers = {b.broker_name: b for b in route.broker_datas}
    out = []
    for qd in sorted(route.queue_datas, key=lambda q: q.broker_name):
        broker = brokers.get(qd.broker_name)
        if broker is None or not qd.perm & pb.PERM_WRITE or not broker.perm & pb.PERM_WRITE:
            continue
        out += [
            QueueAddress(qd.broker_name, q, broker.address, broker.store_host)
            for q in range(qd.write_queue_nums)
        ]
    return out


def _send_attributes(messages: Sequence[Message]) -> dict[str, AttributeValue]:
    """A send span's messaging attributes; a lone message's tag and keys too
    (a batch's differ per message, and the convention names one)."""
    attributes: dict[str, AttributeValue] = {
        MESSAGING_SYSTEM: MESSAGING_SYSTEM_ROCKETMQ,
        MESSAGING_DESTINATION_NAME: messages[0].topic,
        MESSAGING_OPERATION_NAME: "send",
        MESSAGING_OPERATION_TYPE: "send",
    }
    if len(messages) > 1:
        attributes[MESSAGING_BATCH_MESSAGE_COUNT] = len(messages)
        return attributes
    (m,) = messages
    if m.tags:
        attributes[MESSAGING_ROCKETMQ_MESSAGE_TAG] = m.tags
    if m.keys:
        attributes[MESSAGING_ROCKETMQ_MESSAGE_KEYS] = list(m.keys)
    return attributes


def _stored_by_the_store_node(m: Message) -> bool:
    """Whether ``m`` must go as a wire Message, which the store-node turns into its
    record itself: a delayed or timer message (parked in a system topic), a
    transactional half, or one naming a property the store owns (refused there,
    with the message form's code). A batch of records carries none of these."""
    return (
        _delayed(m)
        or _timed(m)
        or PROPERTY_TRANSACTION_PREPARED in m.properties
        or PROPERTY_CRC32 in m.properties
    )


def _delayed(m: Message) -> bool:
    return m.delay_time_level > 0 or PROPERTY_DELAY_TIME_LEVEL in m.properties


def _timed(m: Message) -> bool:
    return m.deliver_time_ms > 0 or any(p in m.properties for p in TIMER_REQUEST_PROPERTIES)


def deliver_after(seconds: float) -> int:
    """The ``Message.deliver_time_ms`` of a message to deliver ``seconds`` from now:
    ``Message("T", b"..", deliver_time_ms=deliver_after(30))``."""
    return int(time.time() * 1000 + seconds * 1000)


def _wire(m: Message, uniq: str) -> pb.Message:
    return pb.Message(
        topic=m.topic,
        tags=m.tags or "",
        keys=list(m.keys),
        properties={**m.properties, PROPERTY_UNIQ_KEY: uniq},
        body=m.body,
        flag=m.flag,
        born_timestamp_ms=m.born_timestamp_ms or int(time.time() * 1000),
        delay_level=max(m.delay_time_level, 0),
        deliver_time_ms=max(m.deliver_time_ms, 0),
    )


def _uniq_keys(messages: Sequence[Message]) -> list[str]:
    """Each message's UNIQ_KEY: its own when it has one, else a new one."""
    own = [m.properties.get(PROPERTY_UNIQ_KEY) for m in messages]
    if not any(own):  # the common case: all new, in one call
        return new_uniq_keys(len(own))
    fresh = iter(new_uniq_keys(sum(1 for uniq in own if not uniq)))
    return [uniq or next(fresh) for uniq in own]


# -- SendStreamRequest on the wire -------------------------------------------------------
#
# Framed by hand (basalt.common.protowire): a repeated message field is one
# field per element, so a request's bytes are its items' (each with the
# ``items`` header) back to back, and fields go out by number as protobuf
# writes them. tests/client/test_producer_wire.py holds the bytes to
# protobuf's own.

_ITEMS = tag(sn.SendStreamRequest.DESCRIPTOR, "items", LENGTH_DELIMITED)
_ITEM_OPAQUE = tag(sn.SendStreamItem.DESCRIPTOR, "opaque", VARINT)
_ITEM_BATCH = tag(sn.SendStreamItem.DESCRIPTOR, "batch", LENGTH_DELIMITED)
_BATCH_TOPIC = tag(sn.SendBatchRequest.DESCRIPTOR, "topic", LENGTH_DELIMITED)
_BATCH_QUEUE_ID = tag(sn.SendBatchRequest.DESCRIPTOR, "queue_id", VARINT)
_BATCH_RECORDS = tag(sn.SendBatchRequest.DESCRIPTOR, "records", LENGTH_DELIMITED)


def send_stream_message(opaque: int, request: sn.SendMessageRequest) -> list[bytes]:
    """``SendStreamRequest(items=[SendStreamItem(opaque=opaque, message=request)])
    .SerializeToString()``, as pieces to join (a single message is small: the
    item is protobuf's own serialization, framed here)."""
    item = sn.SendStreamItem(opaque=opaque, message=request).SerializeToString()
    return [_ITEMS + varint(len(item)), item]


def send_stream_batch(opaque: int, topic: str, queue_id: int, records: bytes) -> list[bytes]:
    """``SendStreamRequest(items=[SendStreamItem(opaque=opaque, batch=SendBatchRequest(
    topic=topic, queue_id=queue_id, records=records))]).SerializeToString()``, as
    pieces to join: ``records`` itself is the last, never copied here.
    ``opaque`` is a uint64, ``queue_id`` an int32 (protobuf's ranges)."""
    head = _BATCH_RECORDS + varint(len(records))
    if queue_id:
        head = _BATCH_QUEUE_ID + varint(queue_id & 0xFFFF_FFFF_FFFF_FFFF) + head
    if topic:
        name = topic.encode()
        head = _BATCH_TOPIC + varint(len(name)) + name + head
    batch_len = len(head) + len(records)
    item = _ITEM_BATCH + varint(batch_len)
    if opaque:
        item = _ITEM_OPAQUE + varint(opaque) + item
    item_len = len(item) + batch_len
    return [_ITEMS + varint(item_len) + item + head, records]


@functools.lru_cache(maxsize=64)
def _store_host_bytes(store_host: str) -> bytes:
    """A route's store host as STOREHOSTADDRESS bytes (parsed once, not per batch)."""
    return encode_host(store_host)


__all__ = [
    "Producer",
    "ProducerConfig",
    "QueueAddress",
    "SendResult",
    "deliver_after",
    "writable_queues",
]
