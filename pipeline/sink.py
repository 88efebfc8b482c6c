"""Basalt as a Spark sink: ``df.write.format("basalt")`` and ``writeStream``.

A DataFrame's rows become messages, sent through the SDK's
:class:`~basalt.client.Producer` (which finds routes through the pull-service
named by the ``endpoint`` option), in batches of one topic (``send_batch``:
one queue, one append per batch), each write task on its own producer.

Columns (any other column is ignored, so a DataFrame read from the Basalt
source can be written back as it is)::

    column      type                            required
    topic       string                          unless the ``topic`` option is set
                                                (the option wins over the column)
    body        binary or string (UTF-8)        yes (null: an empty body)
    tags        string                          no
    keys        string (space-separated, as     no
                RocketMQ's KEYS) or array<string>
    properties  map<string,string>              no

Options (Spark's option names are case-insensitive): :class:`SinkOptions`.

Delivery is at least once: a task or micro-batch Spark runs again sends its
rows again (a send carries a fresh message id; Basalt has no idempotent
producer). A send that fails for good (after the producer's own retries)
fails its task with a :class:`SinkError` naming the topic, the partition and
the cause, and so the job. Each task's :class:`SinkCommitMessage` reports what
it sent; the driver's ``commit`` logs the total (:func:`summarize`).

The writer classes take a :class:`SinkOptions` checked against the DataFrame's
schema (:func:`sink_options`); the ``basalt`` format's DataSource
(:class:`basalt.pipeline.source.BasaltDataSource`) returns them from
``writer()`` / ``streamWriter()``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import ArrayType, BinaryType, MapType, StringType, StructType

from basalt.client import ClientError, Message, Producer, ProducerConfig
from basalt.common import auth
from basalt.common import tls as transport
from basalt.common.message import KEY_SEPARATOR
from basalt.common.settings import (
    config_dataclass,
    instance_of,
    non_empty,
    positive,
    setting,
    validate,
)

log = logging.getLogger(__name__)

#: RocketMQ's default topic: the route a send to a not yet created topic takes,
#: asked for on the driver when no ``topic`` option names one.
_DEFAULT_TOPIC = "TBW102"


class SinkError(RuntimeError):
    """A sink's option, column or send that cannot work; the text says which."""


@config_dataclass
class SinkOptions:
    """The sink's options: each field is the Spark option of its name in
    camelCase (``batch_size``: ``batchSize``). Validated at construction:
    :class:`SinkError` names the first bad option."""

    endpoint: str = setting(
        check=non_empty, doc="host:port of a pull-service; the producer reads routes from it."
    )
    topic: str = setting(
        default="", check=instance_of(str), doc="Every row's topic (empty: the topic column)."
    )
    batch_size: int = setting(default=256, check=positive, doc="Most messages per send_batch.")
    batch_bytes: int = setting(
        default=1024 * 1024,
        check=positive,
        doc="Most body bytes per send_batch (a larger message goes alone).",
    )
    max_in_flight: int = setting(
        default=4, check=positive, doc="Batches a write task has in flight at once."
    )
    producer_group: str = setting(
        default="basalt-spark-sink", check=non_empty, doc="RocketMQ's producerGroup."
    )
    send_msg_timeout_ms: int = setting(
        default=3000, check=positive, doc="A send's deadline, the producer's retries included."
    )

    def __post_init__(self) -> None:
        validate(self, SinkError)

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> SinkOptions:
        """The options from Spark's (string) options; unknown ones are left to
        other readers of the same map (Spark passes ``path``,
        ``checkpointLocation``...). Raises :class:`SinkError` for a missing
        ``endpoint`` or a value that does not parse or check."""
        given = {k.lower(): v for k, v in options.items()}
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            name = _camel(f.name)
            raw = given.get(name.lower())
            if raw is None:
                continue
            if f.type == "int":
                try:
                    values[f.name] = int(raw)
                except ValueError:
                    raise SinkError(f"option {name} must be an integer, got {raw!r}") from None
            else:
                values[f.name] = raw
        if "endpoint" not in values:
            raise SinkError("option endpoint (a pull-service's host:port) is required")
        try:
            return cls(**values)
        except SinkError as e:
            # validate() names the field; the user wrote the option's name.
            field, _, rule = str(e).partition(" ")
            raise SinkError(f"option {_camel(field)} {rule}") from None


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


# -- the schema -------------------------------------------------------------------------


def check_schema(schema: StructType, options: SinkOptions) -> None:
    """Refuse, with :class:`SinkError`, a DataFrame the sink cannot write: no
    ``body`` column, no topic (column or option), or a known column of the
    wrong type. Runs on the driver, before any task."""
    fields = {f.name: f.dataType for f in schema.fields}
    expected = {
        "topic": "string",
        "body": "binary or string",
        "tags": "string",
        "keys": "string or array<string>",
        "properties": "map<string,string>",
    }
    if "body" not in fields:
        raise SinkError(
            f"the DataFrame has no body column (columns: {', '.join(fields) or 'none'}); "
            "the sink writes columns topic, body, tags, keys, properties"
        )
    if "topic" not in fields and not options.topic:
        raise SinkError("no topic: give the topic option or a topic column")
    for name, kind in fields.items():
        if name in expected and not _fits(name, kind):
            raise SinkError(f"column {name} must be {expected[name]}, not {kind.simpleString()}")


def _fits(name: str, kind: Any) -> bool:
    string = isinstance(kind, StringType)
    if name == "body":
        return string or isinstance(kind, BinaryType)
    if name == "keys":
        return string or (isinstance(kind, ArrayType) and isinstance(kind.elementType, StringType))
    if name == "properties":
        return (
            isinstance(kind, MapType)
            and isinstance(kind.keyType, StringType)
            and isinstance(kind.valueType, StringType)
        )
    return string


def check_endpoint(options: SinkOptions) -> None:
    """Ask the endpoint for the route of the ``topic`` option (else of
    RocketMQ's default topic, which a send to a new topic takes): raises
    :class:`SinkError` naming the endpoint when it is unreachable or not a
    pull-service, so a bad endpoint fails on the driver, before any task."""

    async def ask() -> None:
        async with _producer(options) as producer:
            await producer.route(options.topic or _DEFAULT_TOPIC)

    try:
        asyncio.run(ask())
    except ClientError as e:
        raise SinkError(f"endpoint {options.endpoint} cannot take sends: {e}") from None


def _producer(options: SinkOptions) -> Producer:
    config = ProducerConfig(
        producer_group=options.producer_group, send_msg_timeout_ms=options.send_msg_timeout_ms
    )
    # TLS and signing from the environment, as the source's channels
    # (basalt.pipeline._cluster.channel): executors inherit the driver's.
    return Producer(
        options.endpoint,
        group=options.producer_group,
        config=config,
        tls=transport.from_env(),
        credentials=auth.credentials_from_env(),
    )


# -- what a task sent -------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class QueueRange:
    """The queue offsets one task wrote to one queue: ``first``..``last``, both
    included (a task's batches to a queue may interleave with other writers')."""

    topic: str
    broker_name: str
    queue_id: int
    first: int
    last: int
    messages: int

    def merged(self, other: QueueRange) -> QueueRange:
        """The range over both (of the same queue), their messages added."""
        return dataclasses.replace(
            self,
            first=min(self.first, other.first),
            last=max(self.last, other.last),
            messages=self.messages + other.messages,
        )


@dataclasses.dataclass(frozen=True)
class SinkCommitMessage(WriterCommitMessage):
    """What one write task sent: its partition, messages, body bytes and the
    ranges of queue offsets, one per queue it wrote to (sorted)."""

    partition_id: int
    messages: int
    body_bytes: int
    queues: tuple[QueueRange, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class SinkSummary:
    """A write's total over its tasks (:func:`summarize`)."""

    tasks: int
    messages: int
    body_bytes: int
    queues: tuple[QueueRange, ...]


def summarize(messages: Sequence[WriterCommitMessage | None]) -> SinkSummary:
    """The total of the tasks' commit messages (``None``: a task that failed
    or sent nothing counted): one range per queue over all tasks, sorted."""
    sent = [m for m in messages if isinstance(m, SinkCommitMessage)]
    merged: dict[tuple[str, str, int], QueueRange] = {}
    for m in sent:
        for q in m.queues:
            key = (q.topic, q.broker_name, q.queue_id)
            had = merged.get(key)
            merged[key] = q if had is None else had.merged(q)
    return SinkSummary(
        tasks=len(sent),
        messages=sum(m.messages for m in sent),
        body_bytes=sum(m.body_bytes for m in sent),
        queues=tuple(merged[k] for k in sorted(merged)),
    )


# -- one task's sends -------------------------------------------------------------------


class _Batches:
    """Rows to per-topic batches of at most ``batch_size`` messages and
    ``batch_bytes`` body bytes, sent with at most ``max_in_flight`` batches in
    flight; records what was sent. One event loop, one producer per task."""

    def __init__(self, producer: Producer, options: SinkOptions, partition_id: int) -> None:
        self.producer = producer
        self.options = options
        self.partition_id = partition_id
        self.pending: dict[str, tuple[list[Message], int]] = {}
        self.in_flight: set[asyncio.Task[None]] = set()
        self.messages = 0
        self.body_bytes = 0
        self.ranges: dict[tuple[str, str, int], QueueRange] = {}

    async def add(self, message: Message) -> None:
        batch, size = self.pending.get(message.topic, ([], 0))
        if batch and size + len(message.body) > self.options.batch_bytes:
            await self._flush(message.topic)
            batch, size = [], 0
        batch.append(message)
        self.pending[message.topic] = (batch, size + len(message.body))
        if len(batch) >= self.options.batch_size:
            await self._flush(message.topic)

    async def finish(self) -> SinkCommitMessage:
        """Send what is pending, wait for every send; the task's report."""
        for topic in list(self.pending):
            await self._flush(topic)
        while self.in_flight:
            await self._wait_one()
        return SinkCommitMessage(
            partition_id=self.partition_id,
            messages=self.messages,
            body_bytes=self.body_bytes,
            queues=tuple(self.ranges[k] for k in sorted(self.ranges)),
        )

    async def _flush(self, topic: str) -> None:
        batch, _ = self.pending.pop(topic)
        while len(self.in_flight) >= self.options.max_in_flight:
            await self._wait_one()
        self.in_flight.add(asyncio.ensure_future(self._send(topic, batch)))

    async def _wait_one(self) -> None:
        done, self.in_flight = await asyncio.wait(
            self.in_flight, return_when=asyncio.FIRST_COMPLETED
        )
        for task in done:
            task.result()  # the first failure fails the task; send_partition cancels the rest

    async def _send(self, topic: str, batch: list[Message]) -> None:
        try:
            results = await self.producer.send_batch(batch)
        except (ClientError, ValueError) as e:
            raise SinkError(
                f"sending {len(batch)} messages to topic {topic!r} from partition "
                f"{self.partition_id} failed: {e}"
            ) from e
        self.messages += len(results)
        self.body_bytes += sum(len(m.body) for m in batch)
        # A batch lands in one queue at consecutive offsets.
        first, last = results[0], results[-1]
        sent = QueueRange(
            first.topic,
            first.broker_name,
            first.queue_id,
            first.queue_offset,
            last.queue_offset,
            len(results),
        )
        key = (sent.topic, sent.broker_name, sent.queue_id)
        had = self.ranges.get(key)
        self.ranges[key] = sent if had is None else had.merged(sent)

    def cancel(self) -> None:
        """Cancel the sends still in flight (a failed task's others)."""
        for task in self.in_flight:
            task.cancel()


#: The columns the sink reads; any other is ignored.
_COLUMNS = ("topic", "body", "tags", "keys", "properties")


def rows_of(batch: Any, topic: str) -> Iterator[Message]:
    """The messages of one Arrow RecordBatch with the sink's columns (the
    schema :func:`check_schema` let through); ``topic``, when not empty, is
    every message's. Raises :class:`SinkError` for a row with no topic."""
    names = batch.schema.names
    columns = {n: batch.column(names.index(n)).to_pylist() for n in _COLUMNS if n in names}
    n = batch.num_rows
    nothing: list[Any] = [None] * n
    topics = [topic] * n if topic else columns["topic"]
    for body, t, tags, keys, props in zip(
        columns["body"],
        topics,
        columns.get("tags", nothing),
        columns.get("keys", nothing),
        columns.get("properties", nothing),
        strict=True,
    ):
        if not t:
            raise SinkError("a row has a null or empty topic and no topic option is set")
        if isinstance(keys, str):
            keys = [k for k in keys.split(KEY_SEPARATOR) if k]
        yield Message(
            t,
            body.encode("utf-8") if isinstance(body, str) else (body or b""),
            tags=tags or None,
            keys=tuple(keys or ()),
            # Arrow gives a map as (key, value) pairs.
            properties=dict(props) if props else {},
        )


def send_partition(options: SinkOptions, batches: Iterator[Any]) -> SinkCommitMessage:
    """Send every row of a task's Arrow batches; the task's report. Raises
    :class:`SinkError` (topic, partition, cause) when a send fails for good."""
    context = TaskContext.get()
    partition_id = context.partitionId() if context is not None else -1

    async def run() -> SinkCommitMessage:
        async with _producer(options) as producer:
            sender = _Batches(producer, options, partition_id)
            try:
                for batch in batches:
                    for message in rows_of(batch, options.topic):
                        await sender.add(message)
                return await sender.finish()
            finally:
                sender.cancel()

    return asyncio.run(run())


# -- Spark's writers --------------------------------------------------------------------


class BasaltWriter(DataSourceArrowWriter):
    """``df.write``: each task sends its partition (:func:`send_partition`);
    the driver logs the total."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[Any]) -> SinkCommitMessage:
        return send_partition(self.options, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        log.info("basalt sink wrote %s", summarize(messages))

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        log.warning("basalt sink write failed; tasks that finished sent %s", summarize(messages))


class BasaltStreamWriter(DataSourceStreamArrowWriter):
    """``writeStream``: each micro-batch's tasks send their partitions; the
    driver logs each micro-batch's total."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[Any]) -> SinkCommitMessage:
        return send_partition(self.options, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.info("basalt sink micro-batch %d wrote %s", batchId, summarize(messages))

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.warning(
            "basalt sink micro-batch %d failed; tasks that finished sent %s",
            batchId,
            summarize(messages),
        )


def sink_options(options: Mapping[str, str], schema: StructType) -> SinkOptions:
    """The options of a write of ``schema``, checked on the driver: the options,
    the columns (:func:`check_schema`), then the endpoint (:func:`check_endpoint`).
    Raises :class:`SinkError` before any task runs."""
    parsed = SinkOptions.from_options(options)
    check_schema(schema, parsed)
    check_endpoint(parsed)
    return parsed
