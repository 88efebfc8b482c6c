"""The store-node's OpenTelemetry metrics and its hot-path spans.

Only the OpenTelemetry *API* is used: the instruments bind to whatever
MeterProvider/TracerProvider the process installs (``basalt.common.telemetry``
in a service, an in-memory reader in the tests); with none installed they
are no-ops. :mod:`basalt.store` knows nothing of this: the node reads the
store's state in observable callbacks and hears of flushes through the
CommitLog's ``flush_listeners``.

Instruments (Prometheus names in ``docs/observability.md#metrics``):

* counters per topic (``messaging.destination.name``): messages and bytes put,
  messages and bytes got (observable: plain ints on the hot path, read at
  collection);
* histograms per node: put duration per send (s), messages per send,
  GetMessage(s) call duration (s, a held long poll included), CommitLog fsync
  duration (s); the durations bucketed in seconds,
  :data:`basalt.services.histograms.DURATION_BUCKETS_S`;
* observable gauges per node (``basalt.broker.name``): dispatch-behind and
  index-behind bytes, CommitLog min/max offsets, the last disk-use ratio the
  expiry service measured, held long polls, health per background service
  (1 serving, 0 failed), and consumer lag per group/topic/queue of the topics
  the node serves now (a deleted topic's committed offsets report nothing).

The instruments are made once per process (a second observable instrument of
one name would be dropped by the SDK), so the observable callbacks walk the
set of live :class:`StoreNodeMetrics`: a test process may run several nodes.

Cost: a send adds two ``perf_counter`` calls, two int additions and two
histogram ``record`` calls; a SendStream request or GetMessage(s) call adds a
span only when its gRPC span is sampled. Observable callbacks run
on the exporter's thread and read in-memory state only (no disk, no network).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager, suppress
from typing import TYPE_CHECKING

from opentelemetry import metrics, trace
from opentelemetry.metrics import CallbackOptions, Observation

from basalt.services.histograms import duration_histogram

if TYPE_CHECKING:
    from basalt.services.store_node.long_polling import PullRequestHoldService
    from basalt.services.store_node.topics import TopicDirectory
    from basalt.store import MessageStore
    from basalt.v1 import store_node_pb2 as sn

#: The OpenTelemetry attribute naming a message's topic (messaging conventions).
TOPIC = "messaging.destination.name"
BROKER = "basalt.broker.name"

_meter = metrics.get_meter("basalt.services.store_node")
_tracer = trace.get_tracer("basalt.services.store_node")

_put_duration = duration_histogram(
    _meter,
    "basalt.store.put.duration",
    "One send (a message or a batch) stored; per node (a histogram per topic "
    "would be tens of thousands of series).",
)
_get_duration = duration_histogram(
    _meter,
    "basalt.store.get.duration",
    "One GetMessage or GetMessages call, a held long poll included.",
)
_put_batch = _meter.create_histogram(
    "basalt.store.put.batch.messages",
    unit="{message}",
    description="Messages in one send: 1 for a message, N for a batch.",
)
_flush_duration = duration_histogram(_meter, "basalt.store.flush.duration", "One CommitLog fsync.")

#: The nodes the observable callbacks report on.
_live: set[StoreNodeMetrics] = set()


class StoreNodeMetrics:
    """One store-node's instruments: call :meth:`close` when the node stops.

    Concurrency: the ``on_*`` methods run on the node's event loop; the flush
    listener on the flush thread (histogram ``record`` is thread-safe).
    """

    def __init__(
        self,
        broker_name: str,
        store: MessageStore,
        hold: PullRequestHoldService,
        topics: TopicDirectory,
    ) -> None:
        """``topics``: the node's topic directory; consumer lag is reported only
        for the topics it lists with this node among their brokers."""
        self.broker_name = broker_name
        self.store = store
        self.hold = hold
        self.topics = topics
        self._node = {BROKER: broker_name}
        self._topics: dict[str, Mapping[str, str]] = {}
        #: Per topic, [messages, bytes] put and got since the node started: plain
        #: ints on the hot path, reported as observable counters at collection.
        self._put: dict[str, list[int]] = {}
        self._got: dict[str, list[int]] = {}
        store.commitlog.flush_listeners.append(self._on_flush)
        _live.add(self)

    def close(self) -> None:
        """Stop reporting this node's gauges and flushes."""
        _live.discard(self)
        with suppress(ValueError):
            self.store.commitlog.flush_listeners.remove(self._on_flush)

    def topic(self, topic: str) -> Mapping[str, str]:
        """The attributes of ``topic``, made once (a dict per call costs on the hot path)."""
        attrs = self._topics.get(topic)
        if attrs is None:
            attrs = self._topics[topic] = {TOPIC: topic, BROKER: self.broker_name}
        return attrs

    def on_put(self, topic: str, messages: int, size: int, started: float) -> None:
        """A send of ``messages`` records of ``size`` bytes, begun at ``started``
        (``time.perf_counter()``), was stored."""
        _count(self._put, topic, messages, size)
        _put_duration.record(time.perf_counter() - started, self._node)
        _put_batch.record(messages, self._node)

    def on_get(self, topic: str, messages: int, size: int) -> None:
        """A read of one queue of ``topic`` answered ``messages`` records."""
        if messages:
            _count(self._got, topic, messages, size)

    def _totals(self, which: dict[str, list[int]], index: int) -> Iterator[Observation]:
        # list(): one C call under the GIL, a snapshot while the loop adds topics.
        for topic, totals in list(which.items()):
            yield Observation(totals[index], self.topic(topic))

    def on_get_call(self, started: float) -> None:
        """A GetMessage(s) call begun at ``started`` answered."""
        _get_duration.record(time.perf_counter() - started, self._node)

    def _on_flush(self, elapsed_s: float) -> None:
        _flush_duration.record(elapsed_s, self._node)

    # -- what the observable callbacks read ----------------------------------------

    def _serves(self, topic: str) -> bool:
        """Whether ``topic`` is configured with this node among its brokers (the
        directory's cached config: no I/O)."""
        config = self.topics.topic(topic)
        return config is not None and self.broker_name in config.brokers

    def _lag(self) -> Iterator[Observation]:
        # A deleted topic (deleteTopic removes its config; its files and committed
        # offsets stay until they expire) or one moved off this node has no
        # consumer to catch up here: no lag series for it.
        store = self.store
        serves: dict[str, bool] = {}
        for group, topic, queue_id, offset in store.consumer_offsets.all_offsets():
            known = serves.get(topic)
            if known is None:
                known = serves[topic] = self._serves(topic)
            if not known:
                continue
            behind = store.get_max_offset_in_queue(topic, queue_id) - offset
            yield Observation(
                max(behind, 0),
                {
                    BROKER: self.broker_name,
                    "messaging.consumer.group.name": group,
                    TOPIC: topic,
                    "basalt.queue.id": queue_id,
                },
            )

    def _health(self) -> Iterator[Observation]:
        failed = {f.service for f in self.store.failures.failures}
        for name in self.store.service_names:
            yield Observation(
                0 if name in failed else 1, {BROKER: self.broker_name, "basalt.service": name}
            )


def _count(totals: dict[str, list[int]], topic: str, messages: int, size: int) -> None:
    counts = totals.get(topic)
    if counts is None:
        counts = totals[topic] = [0, 0]
    counts[0] += messages
    counts[1] += size


@contextmanager
def send_stream_span(items: Iterable[sn.SendStreamItem]) -> Iterator[None]:
    """One span around the taking of one SendStream request's sends, when the
    stream's own span is recorded (sampled); none otherwise, at no cost.

    Its attributes: ``messaging.batch.message_count``, and the topic when
    every send goes to one.
    """
    if not trace.get_current_span().is_recording():
        yield
        return
    count, topics = 0, set()
    for item in items:
        if item.HasField("message"):
            count += 1
            topics.add(item.message.message.topic)
        elif item.HasField("batch"):
            count += _batch_count(item.batch)
            topics.add(item.batch.topic)
    with _tracer.start_as_current_span("SendStream") as span:
        _batch_attributes(span, count, topics)
        yield


@contextmanager
def get_messages_span(name: str) -> Iterator[trace.Span]:
    """One span per GetMessage(s) call when the call's own span is recorded
    (sampled); otherwise that non-recording span, and no new one.
    :func:`end_get_span` gives it the messages it answered."""
    current = trace.get_current_span()
    if not current.is_recording():
        yield current
        return
    with _tracer.start_as_current_span(name) as span:
        yield span


def end_get_span(span: trace.Span, queues: int, messages: int) -> None:
    """Name the queues read and the messages answered on a recorded span."""
    if span.is_recording():
        span.set_attribute("messaging.system", "rocketmq")
        span.set_attribute("basalt.queue.count", queues)
        span.set_attribute("messaging.batch.message_count", messages)


def _batch_attributes(span: trace.Span, count: int, topics: set[str]) -> None:
    span.set_attribute("messaging.system", "rocketmq")
    span.set_attribute("messaging.batch.message_count", count)
    if len(topics) == 1:
        span.set_attribute(TOPIC, next(iter(topics)))


def _batch_count(batch: sn.SendBatchRequest) -> int:
    """Messages in a SendBatch: the list's length, or the records walked by their
    TOTALSIZE fields (4 bytes, big-endian, at each record's start)."""
    if batch.WhichOneof("batch") != "records":
        return len(batch.messages.messages)
    data, pos, count = batch.records, 0, 0
    while pos + 4 <= len(data):
        size = int.from_bytes(data[pos : pos + 4], "big")
        if size <= 0:
            break
        pos += size
        count += 1
    return count


# -- the observable instruments, over every live node ------------------------------------


def _per_node(read: Callable[[StoreNodeMetrics], float | None]) -> metrics.CallbackT:
    """A gauge callback observing ``read(node)`` for every live node (None: no point)."""

    def callback(options: CallbackOptions) -> Iterable[Observation]:
        out = []
        for node in list(_live):
            value = read(node)
            if value is not None:
                out.append(Observation(value, node._node))
        return out

    return callback


def _disk_ratio(node: StoreNodeMetrics) -> float | None:
    expiry = node.store.expiry
    used = None if expiry is None else expiry.last_used_percent
    return None if used is None or used < 0 else used / 100


def _index_behind(node: StoreNodeMetrics) -> int | None:
    index = node.store.index
    if index is None:
        return None
    return max(node.store.max_physical_offset - index.reput_offset, 0)


def _all_totals(
    which: Callable[[StoreNodeMetrics], dict[str, list[int]]], index: int
) -> metrics.CallbackT:
    def callback(options: CallbackOptions) -> Iterable[Observation]:
        return [o for node in list(_live) for o in node._totals(which(node), index)]

    return callback


for _name, _which, _index, _unit, _description in (
    ("basalt.store.put.messages", lambda n: n._put, 0, "{message}", "Messages stored, per topic."),
    ("basalt.store.put.bytes", lambda n: n._put, 1, "By", "Record bytes stored, per topic."),
    ("basalt.store.get.messages", lambda n: n._got, 0, "{message}", "Messages read, per topic."),
    ("basalt.store.get.bytes", lambda n: n._got, 1, "By", "Record bytes read, per topic."),
):
    _meter.create_observable_counter(
        _name, [_all_totals(_which, _index)], unit=_unit, description=_description
    )


def _all_lag(options: CallbackOptions) -> Iterable[Observation]:
    return [o for node in list(_live) for o in node._lag()]


def _all_health(options: CallbackOptions) -> Iterable[Observation]:
    return [o for node in list(_live) for o in node._health()]


#: The per-node gauges: (name, what it reads of a node, unit, description).
_NODE_GAUGES: tuple[tuple[str, Callable[[StoreNodeMetrics], float | None], str, str], ...] = (
    ("basalt.store.dispatch.behind", lambda n: n.store.dispatch_behind_bytes, "By",
     "CommitLog bytes not yet dispatched to the ConsumeQueues."),
    ("basalt.store.index.behind", _index_behind, "By",
     "CommitLog bytes not yet in the IndexFiles."),
    ("basalt.store.commitlog.min_offset", lambda n: n.store.min_physical_offset, "By",
     "The CommitLog's first physical offset."),
    ("basalt.store.commitlog.max_offset", lambda n: n.store.max_physical_offset, "By",
     "The CommitLog's end (the next physical offset)."),
    ("basalt.store.disk.used_ratio", _disk_ratio, "1",
     "Disk use of the store's filesystem, as last measured by the expiry service."),
    ("basalt.store.long_polls.held", lambda n: n.hold.held, "{request}",
     "Pull requests held waiting for messages."),
)  # fmt: skip
for _name, _reading, _unit, _description in _NODE_GAUGES:
    _meter.create_observable_gauge(
        _name, [_per_node(_reading)], unit=_unit, description=_description
    )
_meter.create_observable_gauge(
    "basalt.store.service.healthy",
    [_all_health],
    unit="1",
    description="1 while a background service of the store runs, 0 once it failed.",
)
_meter.create_observable_gauge(
    "basalt.consumer.lag",
    [_all_lag],
    unit="{message}",
    description="Messages of a queue past a group's committed offset, on the node owning it.",
)
