"""The Spark sink (``basalt.pipeline.sink``) against a real ``cluster up``: a
batch write read back with the SDK, a streaming write from a checkpointed
file stream, a send the store-node refuses failing the job with its cause, and
bad options and columns refused on the driver before any job starts.

One cluster and one Spark session for the module (``local[2]``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from basalt.client import (
    ConsumeFromWhere,
    LitePullConfig,
    SyncLitePullConsumer,
)
from basalt.common.message import MessageRecord
from basalt.pipeline import register
from basalt.pipeline.sink import (
    QueueRange,
    SinkCommitMessage,
    SinkError,
    SinkOptions,
    send_partition,
    summarize,
)
from basalt.services.cluster.etcd import free_port
from tests.support.polling import eventually_sync
from tests.support.processes import local_cluster
from tests.support.spark import spark  # noqa: F401

pytestmark = pytest.mark.slow

#: Properties the SDK and the store add to every message: not the row's.
SYSTEM_PROPERTIES = {"TAGS", "KEYS", "UNIQ_KEY", "CRC32", "traceparent", "tracestate"}


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A ``cluster up`` (one store-node, auto-created topics): its pull-service."""
    with local_cluster(tmp_path_factory.mktemp("sink") / "cluster") as rows:
        yield next(r["address"] for r in rows if r["role"] == "pull-service")


@pytest.fixture(scope="module")
def sink(spark: Any) -> Any:  # noqa: F811
    register(spark)
    return spark


def read_all(endpoint: str, topic: str, count: int) -> list[MessageRecord]:
    """Every message of ``topic`` from its first offset, once ``count`` have arrived."""
    config = LitePullConfig(
        consumer_group=f"check-{topic}",
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
    )
    got: list[MessageRecord] = []
    with SyncLitePullConsumer(endpoint, config=config) as consumer:
        consumer.assign(consumer.queues_of(topic))

        def arrived() -> bool:
            got.extend(consumer.poll(timeout_ms=200))
            return len(got) >= count

        eventually_sync(arrived, what=f"{count} messages of {topic}")
        got.extend(consumer.poll(timeout_ms=200))  # nothing more may come
    return got


def user_properties(record: MessageRecord) -> dict[str, str]:
    return {k: v for k, v in record.properties.items() if k not in SYSTEM_PROPERTIES}


# -- pure parts -----------------------------------------------------------------------------


def test_options_come_from_spark_names_and_refuse_bad_values() -> None:
    options = SinkOptions.from_options(
        {"endpoint": "h:1", "TOPIC": "T", "batchsize": "10", "producerGroup": "G"}
    )
    assert (options.endpoint, options.topic, options.batch_size) == ("h:1", "T", 10)
    assert options.producer_group == "G" and options.batch_bytes == 1024 * 1024
    with pytest.raises(SinkError, match=r"option endpoint .* is required"):
        SinkOptions.from_options({"topic": "T"})
    with pytest.raises(SinkError, match="option batchSize must be an integer, got 'ten'"):
        SinkOptions.from_options({"endpoint": "h:1", "batchSize": "ten"})
    with pytest.raises(SinkError, match="option batchSize must be positive, got 0"):
        SinkOptions.from_options({"endpoint": "h:1", "batchSize": "0"})


def test_summarize_merges_each_queue_over_tasks() -> None:
    a = SinkCommitMessage(
        0, 3, 30, (QueueRange("T", "b", 0, 0, 1, 2), QueueRange("T", "b", 1, 0, 0, 1))
    )
    b = SinkCommitMessage(1, 2, 20, (QueueRange("T", "b", 0, 2, 3, 2),))
    total = summarize([a, None, b])
    assert (total.tasks, total.messages, total.body_bytes) == (2, 5, 50)
    assert total.queues == (QueueRange("T", "b", 0, 0, 3, 4), QueueRange("T", "b", 1, 0, 0, 1))


# -- against the cluster --------------------------------------------------------------------


def test_a_task_reports_each_queue_it_sent_to(endpoint: str) -> None:
    import pyarrow as pa

    options = SinkOptions.from_options(
        {"endpoint": endpoint, "topic": "SinkReport", "batchSize": "4", "maxInFlight": "2"}
    )
    bodies = [b"r%d" % i for i in range(10)]
    report = send_partition(options, iter([pa.RecordBatch.from_pydict({"body": bodies})]))
    # No Spark task here: no partition id.
    assert (report.partition_id, report.messages, report.body_bytes) == (
        -1,
        10,
        sum(map(len, bodies)),
    )
    # Batches of 4, 4 and 2, each to one queue of a topic only this test writes.
    assert sum(q.messages for q in report.queues) == 10
    assert all(q.topic == "SinkReport" for q in report.queues)
    assert all(q.last - q.first + 1 == q.messages for q in report.queues)
    assert {q.messages for q in report.queues} <= {2, 4, 6, 8, 10}
    assert sorted(r.body for r in read_all(endpoint, "SinkReport", 10)) == sorted(bodies)


def test_a_batch_write_is_read_back_equal(sink: Any, endpoint: str) -> None:
    from pyspark.sql.types import (
        ArrayType,
        BinaryType,
        MapType,
        StringType,
        StructField,
        StructType,
    )

    schema = StructType(
        [
            StructField("topic", StringType()),
            StructField("body", BinaryType()),
            StructField("tags", StringType()),
            StructField("keys", ArrayType(StringType())),
            StructField("properties", MapType(StringType(), StringType())),
            StructField("ignored", StringType()),
        ]
    )
    rows = [
        ("SinkBatch", b"m%03d" % i, f"Tag{i % 3}", [f"k{i}", "all"], {"i": str(i)}, "x")
        for i in range(40)
    ]
    rows.append(("SinkBatch", b"", None, None, None, None))  # every optional column null
    frame = sink.createDataFrame(rows, schema).repartition(3)
    frame.write.format("basalt").option("endpoint", endpoint).option("batchSize", "7").mode(
        "append"
    ).save()

    got = read_all(endpoint, "SinkBatch", len(rows))
    assert sorted(
        (r.body, r.tags, tuple(r.keys), tuple(sorted(user_properties(r).items()))) for r in got
    ) == sorted(
        (body, tags, tuple(keys or ()), tuple(sorted((props or {}).items())))
        for _, body, tags, keys, props, _ in rows
    )


def test_a_stream_from_a_checkpointed_query_arrives(
    sink: Any, endpoint: str, tmp_path: Path
) -> None:
    incoming = tmp_path / "in"
    incoming.mkdir()
    lines = [{"body": f"s{i}", "keys": f"id-{i} stream"} for i in range(25)]
    (incoming / "part-0.json").write_text("\n".join(json.dumps(line) for line in lines))
    query = (
        sink.readStream.schema("body string, keys string")
        .json(str(incoming))
        .writeStream.format("basalt")
        .option("endpoint", endpoint)
        .option("topic", "SinkStream")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(60)
    assert query.exception() is None
    got = read_all(endpoint, "SinkStream", len(lines))
    assert sorted((r.body.decode(), r.keys) for r in got) == sorted(
        (line["body"], line["keys"].split()) for line in lines
    )
    assert (tmp_path / "checkpoint" / "commits" / "0").exists()


def test_a_refused_send_fails_the_job_naming_topic_partition_and_cause(
    sink: Any, endpoint: str
) -> None:
    # One body past the store-node's max_message_size (4 MiB).
    frame = sink.range(1).selectExpr("cast(repeat('x', 5 * 1024 * 1024) as binary) as body")
    with pytest.raises(Exception) as failed:
        frame.write.format("basalt").option("endpoint", endpoint).option(
            "topic", "SinkTooBig"
        ).mode("append").save()
    text = str(failed.value)
    assert re.search(r"sending 1 messages to topic 'SinkTooBig' from partition \d failed", text)
    assert "MESSAGE_ILLEGAL: body of 5242880 bytes exceeds max_message_size" in text


@pytest.mark.parametrize(
    ("columns", "options", "says"),
    [
        ("id as value", {}, "the DataFrame has no body column (columns: value)"),
        ("cast(id as string) as body", {"topic": ""}, "no topic: give the topic option"),
        ("id as body", {"topic": "T"}, "column body must be binary or string, not bigint"),
        ("cast(id as string) as body", {"topic": "T", "endpoint": ""}, "is required"),
        ("cast(id as string) as body", {"topic": "T", "endpoint": None}, "cannot take sends"),
    ],
)
def test_a_bad_column_or_option_fails_before_any_job(
    sink: Any, endpoint: str, columns: str, options: dict[str, str | None], says: str
) -> None:
    given = {"endpoint": endpoint, **options}
    if given["endpoint"] is None:  # nothing listens there
        given["endpoint"] = f"127.0.0.1:{free_port()}"
    if given["endpoint"] == "":
        del given["endpoint"]
    group = f"bad-{abs(hash(says))}"
    sink.sparkContext.setJobGroup(group, "a write the driver must refuse")
    try:
        writer = sink.range(3).selectExpr(columns).write.format("basalt").mode("append")
        with pytest.raises(Exception) as refused:
            writer.options(**given).save()
        assert says in str(refused.value)
        assert sink.sparkContext.statusTracker().getJobIdsForGroup(group) == []
    finally:
        sink.sparkContext.setLocalProperty("spark.jobGroup.id", None)
