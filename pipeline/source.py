"""``spark.read.format("basalt")`` and ``spark.readStream.format("basalt")``.

:class:`BasaltDataSource` is a PySpark 4 Python data source. Options, in the
style of Spark's Kafka source (docs/pipeline.md has the table):

``endpoint``
    a pull-service's ``host:port`` (required).
``topic``
    a topic, or a comma list (required).
``startingOffsets`` / ``endingOffsets``
    ``earliest``, ``latest``, or JSON per topic, broker and queue id:
    ``{"TopicA": {"broker-a": {"0": 12, "1": -2}}}``, -2 earliest and -1
    latest as in Kafka; a queue the JSON leaves out takes the default
    (batch: earliest .. latest; streaming starts at latest). An offset is
    clamped to the queue's stored range. ``endingOffsets`` is batch only.
``startingTimestamp`` / ``endingTimestamp``
    Unix ms, each queue's bound being the store-node's ``SearchOffset``
    answer for it (in place of the ``...Offsets`` option of the same end).
``subscription`` / ``subscriptionType``
    an expression the store-node applies (only matching records leave it):
    ``TAG`` (the default; ``a || b``, ``*``) or ``SQL92``.
``maxOffsetsPerTrigger``
    streaming: at most this many offsets per micro-batch, over all queues.
``minPartitions``
    at least this many input partitions (a queue's range is split).
``group``
    the consumer group the pulls name; streaming commits each micro-batch's
    end offsets to it once Spark has committed the batch (``commit``), so
    ``basalt admin consumerProgress`` shows the query.

Planning happens on the driver (routes, bounds, time searches: one call per
queue to its store-node); each input partition is one queue's offset range
``[start, end)`` (or several queues of one store-node), read on an executor
from the store-node directly (``GetMessages``) and yielded as Arrow
RecordBatches (schema in :mod:`basalt.pipeline._rows`) built in C from the
answers, a thread fetching and building ahead of Spark's worker.
An option the cluster refuses (unknown topic, unreachable endpoint, an
expression that does not parse) raises :class:`BasaltSourceError` on the
driver from ``load()`` (``schema()`` checks), before any task runs.

Streaming offsets (Spark's checkpoint) are the per-queue next offsets as
``{"topic": {"broker": {"queue_id": offset}}}``: a micro-batch reads each
queue's ``[start, end)`` exactly, so a query restarted from its checkpoint
reads every message once.
"""

from __future__ import annotations

import functools
import gc
import itertools
import json
import logging
import math
from collections.abc import Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows
from pyspark.sql.types import StructType

from basalt.common.record import DamagedRecord
from basalt.pipeline import _cluster
from basalt.pipeline._ahead import ahead
from basalt.pipeline._cluster import BasaltSourceError, QueueRef
from basalt.pipeline._rows import BATCH_BYTES, BATCH_ROWS, SCHEMA_DDL, raw_batches, rows_where
from basalt.pipeline.sink import BasaltStreamWriter, BasaltWriter, sink_options
from basalt.v1 import common_pb2 as pb

log = logging.getLogger(__name__)

__all__ = ["BasaltDataSource", "BasaltSourceError", "SourceOptions"]

#: The group pulls name when the ``group`` option is not given (reads only:
#: nothing is committed to it).
DEFAULT_GROUP = "basalt-spark-source"
#: A queue range longer than this many offsets is split into several partitions.
MAX_PARTITION_OFFSETS = 1_000_000
#: Records asked of one queue a read: the store-node's largest (its
#: ``max_msg_nums_per_pull``); its transfer caps (1 MiB) may answer fewer.
PULL_MAX_NUMS = 1024
#: Partitions a read plans before several queues share one (:func:`_pack`).
PACK_ABOVE_PARTITIONS = 16
#: Most queues of one partition, so most entries of one GetMessages (the
#: store-node takes 32; 8 answers of ~1 MiB stay far under the 64 MiB message cap).
QUEUES_PER_CALL = 8
#: Batches a partition's read makes ahead of Spark's worker (each up to BATCH_ROWS
#: rows, ~8 MiB of 1 KiB bodies): one being written to the JVM, these waiting, one
#: being fetched. Two keep the store-node, the batch building and the write busy
#: at once; more only hold memory.
READ_AHEAD = 2
#: Kafka's special offsets in offsets JSON.
EARLIEST, LATEST = -2, -1

#: Offsets as options and checkpoints carry them: topic -> broker -> queue id (str) -> offset.
OffsetJson = dict[str, dict[str, dict[str, int]]]
_EXAMPLE = '{"TopicA": {"broker-a": {"0": 12, "1": -2}}}'


def _parse_offsets(name: str, text: str, topics: Sequence[str]) -> str | OffsetJson:
    """``earliest``, ``latest`` or the validated JSON of option ``name``."""
    if text in ("earliest", "latest"):
        return text
    try:
        raw = json.loads(text)
    except ValueError as e:
        raise BasaltSourceError(
            f"option {name} {text!r} is not 'earliest', 'latest' or JSON such as {_EXAMPLE}: {e}"
        ) from e
    out: OffsetJson = {}
    if not isinstance(raw, dict):
        raise BasaltSourceError(f"option {name} must be a JSON object such as {_EXAMPLE}")
    for topic, brokers in raw.items():
        if topic not in topics:
            raise BasaltSourceError(f"option {name} names topic {topic!r}, not one of {topics}")
        if not isinstance(brokers, dict):
            raise BasaltSourceError(f"option {name}: {topic!r} must map brokers to queues")
        for broker, queues in brokers.items():
            if not isinstance(queues, dict):
                raise BasaltSourceError(f"option {name}: {topic}/{broker} must map queue ids")
            for queue_id, offset in queues.items():
                if not queue_id.isdigit() or type(offset) is not int or offset < EARLIEST:
                    raise BasaltSourceError(
                        f"option {name}: {topic}/{broker}/{queue_id}: {offset!r} is not a "
                        "queue id mapped to an offset >= 0, -2 (earliest) or -1 (latest)"
                    )
                out.setdefault(topic, {}).setdefault(broker, {})[str(int(queue_id))] = offset
    return out


def _int_option(options: Mapping[str, str], name: str, *, minimum: int) -> int | None:
    text = options.get(name)
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        value = minimum - 1
    if value < minimum:
        raise BasaltSourceError(f"option {name} {text!r} is not an integer >= {minimum}")
    return value


@dataclass(frozen=True)
class SourceOptions:
    """The source's options, validated without the network (see the module docstring)."""

    endpoint: str
    topics: tuple[str, ...]
    starting: str | OffsetJson | None  # None: the read's default (batch earliest, stream latest)
    ending: str | OffsetJson
    starting_timestamp_ms: int | None
    ending_timestamp_ms: int | None
    subscription: tuple[pb.ExpressionType.ValueType, str] | None  # (type, expression)
    max_offsets_per_trigger: int | None
    min_partitions: int | None
    group: str | None

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        """Validate Spark's (case-insensitive) options; raises :class:`BasaltSourceError`."""
        endpoint = options.get("endpoint", "").strip()
        if not endpoint:
            raise BasaltSourceError("option endpoint is required: a pull-service's host:port")
        topics = tuple(t.strip() for t in options.get("topic", "").split(",") if t.strip())
        if not topics:
            raise BasaltSourceError("option topic is required: a topic or a comma list")
        for end in ("starting", "ending"):
            if options.get(f"{end}Offsets") is not None and options.get(f"{end}Timestamp"):
                raise BasaltSourceError(f"give {end}Offsets or {end}Timestamp, not both")
        kind = options.get("subscriptionType", "TAG").upper()
        if kind not in ("TAG", "SQL92"):
            raise BasaltSourceError(f"option subscriptionType {kind!r} is not TAG or SQL92")
        expression = options.get("subscription")
        return cls(
            endpoint=endpoint,
            topics=topics,
            starting=None
            if options.get("startingOffsets") is None
            else _parse_offsets("startingOffsets", options["startingOffsets"], topics),
            ending=_parse_offsets("endingOffsets", options.get("endingOffsets", "latest"), topics),
            starting_timestamp_ms=_int_option(options, "startingTimestamp", minimum=0),
            ending_timestamp_ms=_int_option(options, "endingTimestamp", minimum=0),
            subscription=None
            if expression is None
            else (pb.ExpressionType.Value(f"EXPRESSION_TYPE_{kind}"), expression),
            max_offsets_per_trigger=_int_option(options, "maxOffsetsPerTrigger", minimum=1),
            min_partitions=_int_option(options, "minPartitions", minimum=1),
            group=options.get("group") or None,
        )

    @property
    def pull_group(self) -> str:
        return self.group or DEFAULT_GROUP

    def subscription_pb(self) -> pb.Subscription | None:
        if self.subscription is None:
            return None
        return pb.Subscription(type=self.subscription[0], expression=self.subscription[1])


@dataclass(frozen=True)
class BasaltPartition(InputPartition):
    """Queue offsets ``[start, end)`` of one queue: one Spark input partition."""

    topic: str
    broker: str
    queue_id: int
    start: int
    end: int

    @property
    def queue_key(self) -> tuple[str, int]:
        """(topic, queue id): a broker's queue, whatever the range."""
        return self.topic, self.queue_id


def _position(
    spec: str | OffsetJson | None,
    timestamp_ms: int | None,
    queue: QueueRef,
    bounds: tuple[int, int],
    default: int,
) -> int:
    """Where ``spec`` (or the time search for ``timestamp_ms``) puts ``queue``,
    whose stored range is ``bounds``; ``default`` (EARLIEST or LATEST) for a
    queue the JSON leaves out."""
    low, high = bounds
    if timestamp_ms is not None:
        return _cluster.search_offset(queue, timestamp_ms)
    if spec is None:
        offset = default
    elif isinstance(spec, str):
        offset = EARLIEST if spec == "earliest" else LATEST
    else:
        offset = spec.get(queue.topic, {}).get(queue.broker, {}).get(str(queue.queue_id), default)
    if offset == EARLIEST:
        return low
    if offset == LATEST:
        return high
    return min(max(offset, low), high)


def _split(
    ranges: Sequence[tuple[str, str, int, int, int]], min_partitions: int | None
) -> list[BasaltPartition]:
    """One partition per non-empty range, split into equal parts so that none
    is over MAX_PARTITION_OFFSETS and there are at least ``min_partitions``
    when the offsets allow."""
    total = sum(end - start for *_, start, end in ranges)
    size = MAX_PARTITION_OFFSETS
    if min_partitions:
        size = min(size, max(1, math.ceil(total / min_partitions)))
    out: list[BasaltPartition] = []
    for topic, broker, queue_id, start, end in ranges:
        if end <= start:
            continue
        parts = math.ceil((end - start) / size)
        step = math.ceil((end - start) / parts)
        out.extend(
            BasaltPartition(topic, broker, queue_id, s, min(s + step, end))
            for s in range(start, end, step)
        )
    return out


@dataclass(frozen=True)
class BasaltQueues(InputPartition):
    """Ranges of several queues of one store-node (no queue twice), read
    together: one ``GetMessages`` entry per queue a call. :func:`_plan`
    makes these (:func:`_pack`, :func:`_stripe`) so that a call carries
    several queues' reads."""

    parts: tuple[BasaltPartition, ...]


def _pack(parts: list[BasaltPartition], wanted: int) -> list[InputPartition]:
    """``parts`` as they are when there are at most ``wanted``; otherwise
    those of each broker packed into :class:`BasaltQueues` of up to
    QUEUES_PER_CALL parts (fewer, larger reads: a call's cost is paid once
    for several queues), never one queue twice in a pack."""
    if len(parts) <= wanted:
        return list(parts)
    size = min(QUEUES_PER_CALL, math.ceil(len(parts) / wanted))
    packs: list[list[BasaltPartition]] = []
    open_packs: dict[str, list[list[BasaltPartition]]] = {}
    for part in parts:
        mine = open_packs.setdefault(part.broker, [])
        pack = next(
            (p for p in mine if len(p) < size and all(q.queue_key != part.queue_key for q in p)),
            None,
        )
        if pack is None:
            pack = []
            mine.append(pack)
            packs.append(pack)
        pack.append(part)
    return [p[0] if len(p) == 1 else BasaltQueues(tuple(p)) for p in packs]


def _slices(start: int, end: int, n: int) -> list[tuple[int, int]]:
    """``[start, end)`` cut into ``n`` consecutive slices as equal as may be
    (some empty when there are fewer offsets than slices)."""
    size = end - start
    return [(start + size * j // n, start + size * (j + 1) // n) for j in range(n)]


def _stripe(parts: list[BasaltPartition]) -> list[InputPartition]:
    """As many partitions as ``parts``, each reading a slice of several queues
    of one store-node rather than one queue whole.

    A store-node's queues are taken in groups of up to QUEUES_PER_CALL; a
    group whose queues had ``n`` parts in all becomes ``n`` stripes, stripe
    ``j`` reading the ``j``-th of ``n`` equal slices of every queue of the
    group. A call of a stripe then carries one read per queue of its group
    (several ~1 MiB answers) instead of one: the per-call cost, on the
    store-node (~0.5 ms of CPU: the RPC, its metrics and span) and in the
    executor, is paid once per several reads, and each queue is still read
    in offset order within its partition. Slices are no longer than the
    parts were (so within MAX_PARTITION_OFFSETS and the ``minPartitions``
    share); stripes come out with the store-nodes taken in turn, so that
    tasks running at once read from different store-nodes."""
    queues: dict[str, dict[tuple[str, int], list[BasaltPartition]]] = {}
    for part in parts:
        queues.setdefault(part.broker, {}).setdefault(part.queue_key, []).append(part)
    by_broker: list[list[InputPartition]] = []
    for mine in queues.values():
        keys = list(mine)
        groups = math.ceil(len(keys) / QUEUES_PER_CALL)
        stripes: list[InputPartition] = []
        for g in range(groups):
            group = [mine[k] for k in keys[g::groups]]  # groups of near-equal size
            n = sum(len(pieces) for pieces in group)
            cut: list[list[BasaltPartition]] = [[] for _ in range(n)]
            for pieces in group:
                first = pieces[0]  # _split's pieces of a queue are consecutive
                for j, (s, e) in enumerate(_slices(first.start, pieces[-1].end, n)):
                    if e > s:
                        cut[j].append(
                            BasaltPartition(first.topic, first.broker, first.queue_id, s, e)
                        )
            stripes.extend(p[0] if len(p) == 1 else BasaltQueues(tuple(p)) for p in cut if p)
        by_broker.append(stripes)
    return [p for turn in itertools.zip_longest(*by_broker) for p in turn if p is not None]


def _plan(
    ranges: Sequence[tuple[str, str, int, int, int]], min_partitions: int | None
) -> list[InputPartition]:
    """The input partitions of ``ranges``: :func:`_split`, then :func:`_pack`
    when that makes more partitions than wanted (16, or ``minPartitions``),
    else :func:`_stripe` (as many partitions, each call reading several queues)."""
    parts = _split(ranges, min_partitions)
    wanted = max(min_partitions or 0, PACK_ABOVE_PARTITIONS)
    return _pack(parts, wanted) if len(parts) > wanted else _stripe(parts)


def _read(options: SourceOptions, partition: InputPartition) -> Iterator[pa.RecordBatch]:
    """The matching messages of ``partition`` (one queue's range, or several
    of one store-node) as RecordBatches of about BATCH_ROWS rows: those of
    :func:`_fetch`, made in a thread READ_AHEAD batches ahead of Spark
    (:func:`basalt.pipeline._ahead.ahead`), so the store-node's read, the
    batch building and the worker's write of the previous batch to the JVM
    overlap.

    First freezes the objects the worker holds (:func:`gc.freeze`): Spark's
    daemon runs a full ``gc.collect()`` after every task of a reused worker,
    whose cost grows with every object the process holds, and this source's
    modules (gRPC, protobuf, basalt) hold ~20,000 more than PySpark and
    pyarrow alone: ~45 ms of the worker's CPU a task here, about a fifth of
    its time in a read. Frozen objects are still freed when their last
    reference goes; the daemon's collection before this task left no cyclic
    garbage to freeze."""
    gc.freeze()
    batches: Iterator[pa.RecordBatch] = ahead(
        functools.partial(_fetch, options, partition), READ_AHEAD
    )
    return batches


def _fetch(options: SourceOptions, partition: InputPartition) -> Iterator[pa.RecordBatch]:
    """:func:`_read`'s batches, made in the calling thread.

    Read from the queues' store-node (its address from the route, asked
    once) by :func:`_cluster.read_ranges`. Each queue's answers are gathered
    until they hold a batch (BATCH_ROWS records, or BATCH_BYTES) and turned
    into Arrow in C (:func:`raw_batches`, no Python object per row, the
    answers read in place); what is left over waits for the next answers, so
    every batch but a range's last is whole and a partition holds about one
    batch a queue (a stripe reads several queues at once). Rows past a
    range's end (a last filtered read may return some) are dropped."""
    if isinstance(partition, BasaltQueues):
        parts = partition.parts
    else:
        assert isinstance(partition, BasaltPartition)  # partitions() makes only these two
        parts = (partition,)
    parts = tuple(p for p in parts if p.end > p.start)
    if not parts:
        return
    first = parts[0]
    address = _cluster.queue_ref(options.endpoint, first.topic, first.broker, first.queue_id)
    ranges = [
        (QueueRef(p.topic, p.broker, p.queue_id, address.address), p.start, p.end) for p in parts
    ]
    pending: dict[int, list[memoryview]] = {}
    rows: dict[int, int] = {}  # records pending, as the store-node counted them
    sizes: dict[int, int] = {}
    for i, records, count in _cluster.read_ranges(
        ranges, group=options.pull_group, subscription=options.subscription_pb(),
        max_nums=PULL_MAX_NUMS,
    ):  # fmt: skip
        pending.setdefault(i, []).append(records)
        rows[i] = rows.get(i, 0) + count
        sizes[i] = sizes.get(i, 0) + len(records)
        if rows[i] >= BATCH_ROWS or sizes[i] >= BATCH_BYTES:
            whole = max(1, rows[i] // BATCH_ROWS)
            pending[i] = yield from _batches(parts[i], pending[i], whole)
            rows[i] = max(0, rows[i] - whole * BATCH_ROWS)
            sizes[i] = sum(len(c) for c in pending[i])
    for i, chunks in pending.items():
        yield from _batches(parts[i], chunks, None)


def _batches(
    part: BasaltPartition, chunks: list[memoryview], whole: int | None
) -> Generator[pa.RecordBatch, None, list[memoryview]]:
    """``chunks`` (whole records, back to back) as batches, rows past ``part.end``
    dropped: ``whole`` batches (all of them when None); returns what is left of
    the chunks (views of them, nothing copied).

    The chunks are read in place as one run (:func:`raw_batches` takes the
    list), so a batch is BATCH_ROWS rows rather than a read's ~1 MiB and no
    bytes are joined. A record whose checksum fails is no row: it is logged
    at ERROR with its offsets (the executor's log) and the read goes on past it."""
    damaged: list[DamagedRecord] = []
    batches = raw_batches(
        part.broker, chunks, max_rows=BATCH_ROWS, max_bytes=BATCH_BYTES, damaged=damaged,
        max_batches=whole,
    )  # fmt: skip
    while True:
        try:
            batch = next(batches)
        except StopIteration as stop:
            at: int = stop.value
            break
        yield rows_where(batch, pc.less(batch.column("queue_offset"), part.end))
    for d in damaged:
        if d.queue_offset < part.end:  # one past the range is the next range's to report
            log.error("basalt source: broker %s: %s", part.broker, d.describe())
    left: list[memoryview] = []
    for chunk in chunks:
        if at < len(chunk):
            left.append(chunk[at:] if at > 0 else chunk)
        at = max(0, at - len(chunk))
    return left


def _offsets_json(positions: Mapping[QueueRef, int]) -> OffsetJson:
    out: OffsetJson = {}
    for queue, offset in sorted(positions.items()):
        out.setdefault(queue.topic, {}).setdefault(queue.broker, {})[str(queue.queue_id)] = offset
    return out


def _flatten(offsets: Mapping[str, Any]) -> dict[tuple[str, str, int], int]:
    return {
        (topic, broker, int(queue_id)): int(offset)
        for topic, brokers in offsets.items()
        for broker, queues in brokers.items()
        for queue_id, offset in queues.items()
    }


class _Planner:
    """The driver's view of the cluster for one reader: the topics' queues,
    checked to exist and, with a subscription, that it parses."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self.queues = self.refresh()
        sub = options.subscription_pb()
        if sub is not None and self.queues:
            _cluster.check_subscription(options.endpoint, options.pull_group, self.queues[0], sub)

    def refresh(self) -> list[QueueRef]:
        """The topics' queues now (raises :class:`BasaltSourceError` if a topic is gone)."""
        self.queues = _cluster.queues_of(self.options.endpoint, list(self.options.topics))
        return self.queues

    def starting(self, default: int) -> dict[QueueRef, int]:
        """Each queue's first offset to read, by startingOffsets / startingTimestamp."""
        o = self.options
        return {
            q: _position(o.starting, o.starting_timestamp_ms, q, _cluster.min_max(q), default)
            for q in self.queues
        }


class BasaltReader(DataSourceReader):
    """A batch read: ranges resolved on the driver when constructed."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        planner = _Planner(options)
        ranges = []
        for q in planner.queues:
            bounds = _cluster.min_max(q)
            start = _position(options.starting, options.starting_timestamp_ms, q, bounds, EARLIEST)
            end = _position(options.ending, options.ending_timestamp_ms, q, bounds, LATEST)
            ranges.append((q.topic, q.broker, q.queue_id, start, end))
        self._partitions = _plan(ranges, options.min_partitions)

    def partitions(self) -> Sequence[InputPartition]:
        # Spark needs at least one partition; an empty one reads nothing.
        return self._partitions or [BasaltPartition("", "", 0, 0, 0)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        return _read(self.options, partition)


class BasaltStreamReader(DataSourceStreamReader):
    """A micro-batch stream; offsets are :data:`OffsetJson` (see the module docstring)."""

    def __init__(self, options: SourceOptions) -> None:
        if options.ending != "latest" or options.ending_timestamp_ms is not None:
            raise BasaltSourceError("endingOffsets / endingTimestamp are for batch reads only")
        self.options = options
        self._planner = _Planner(options)

    def initialOffset(self) -> dict[str, Any]:
        # Kafka's streaming default: only what arrives after the query starts.
        return dict(_offsets_json(self._planner.starting(LATEST)))

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.options.max_offsets_per_trigger
        return ReadAllAvailable() if n is None else ReadMaxRows(n)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        """Every queue's max offset now (a queue new since ``start`` from 0, i.e.
        its first stored offset), capped by ``limit`` over all queues in
        proportion to what each has waiting."""
        begin = _flatten(start)
        end: dict[QueueRef, int] = {}
        for q in self._planner.refresh():
            at = begin.get((q.topic, q.broker, q.queue_id), 0)
            end[q] = max(at, _cluster.min_max(q)[1])
        if isinstance(limit, ReadMaxRows):
            end = _cap(begin, end, limit.max_rows)
        return dict(_offsets_json(end))

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        begin = _flatten(start)
        ranges = [
            (topic, broker, queue_id, begin.get((topic, broker, queue_id), 0), offset)
            for (topic, broker, queue_id), offset in sorted(_flatten(end).items())
        ]
        return _plan(ranges, self.options.min_partitions)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        return _read(self.options, partition)

    def commit(self, end: dict[str, Any]) -> None:
        """Spark has committed the batch ending at ``end``: store it as the
        group's progress (only with the ``group`` option)."""
        group = self.options.group
        if group is None:
            return
        done = _flatten(end)
        for q in self._planner.queues:
            offset = done.get((q.topic, q.broker, q.queue_id))
            if offset is not None:
                _cluster.commit_offset(q, group, offset)


def _cap(
    begin: Mapping[tuple[str, str, int], int], end: Mapping[QueueRef, int], max_rows: int
) -> dict[QueueRef, int]:
    """``end`` moved back so that at most ``max_rows`` offsets lie past ``begin``
    in all, each queue getting its share of what it has waiting (at least one
    offset overall, so a stream always moves)."""
    waiting = {q: e - begin.get((q.topic, q.broker, q.queue_id), 0) for q, e in end.items()}
    total = sum(waiting.values())
    if total <= max_rows:
        return dict(end)
    grant = {q: w * max_rows // total for q, w in waiting.items()}
    spare = max_rows - sum(grant.values())
    for q in sorted(waiting):
        if spare == 0:
            break
        if grant[q] < waiting[q]:
            grant[q] += 1
            spare -= 1
    return {q: e - waiting[q] + grant[q] for q, e in end.items()}


class BasaltDataSource(DataSource):
    """The ``basalt`` format: batch and streaming reads of Basalt topics, and
    writes to them (:mod:`basalt.pipeline.sink`).

    A read's options are checked by :meth:`schema` (``load()``), a write's by
    :meth:`writer` / :meth:`streamWriter`: each on the driver, before any task
    runs. The two take different options (a write's topic may be a column)."""

    @classmethod
    def name(cls) -> str:
        return "basalt"

    @functools.cached_property
    def _source_options(self) -> SourceOptions:
        return SourceOptions.parse(self.options)

    def schema(self) -> StructType | str:
        """The fixed schema; first checks the options, then against the cluster
        (topics exist, the endpoint answers, the subscription parses), so
        that ``load()`` itself fails on a bad one."""
        _Planner(self._source_options)
        return SCHEMA_DDL

    def reader(self, schema: StructType) -> DataSourceReader:
        return BasaltReader(self._source_options)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return BasaltStreamReader(self._source_options)

    def writer(self, schema: StructType, overwrite: bool) -> BasaltWriter:
        return BasaltWriter(sink_options(self.options, schema))

    def streamWriter(self, schema: StructType, overwrite: bool) -> BasaltStreamWriter:
        return BasaltStreamWriter(sink_options(self.options, schema))
