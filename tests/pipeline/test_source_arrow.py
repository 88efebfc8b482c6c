"""The ``basalt`` source's Arrow path over many store-node answers, against one
real ``basalt cluster up`` and a local Spark session.

A partition's batch is built from several ``GetMessages`` answers read in
place (no join) by a thread ahead of Spark's worker. These tests hold what
Spark receives to the readable reference path: the same queues read record by
record with ``GetMessage`` from each store-node, decoded by ``decode_records``
and made rows by ``record_batch`` — every column, every value, exactly the
offsets asked for; and a stream's micro-batches to exactly the offsets Spark
records for them.
"""

# The module-scoped `spark` fixture is imported, then named by the tests' parameters.
# ruff: noqa: F811

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from basalt.client import Message, Producer
from basalt.common.record import decode_records
from basalt.pipeline import _cluster, register
from basalt.pipeline._rows import ARROW_SCHEMA, SCHEMA_DDL, record_batch
from basalt.pipeline.source import PULL_MAX_NUMS
from basalt.services.cluster.local import CLUSTER_NAME
from basalt.services.meta import MetaClient, MetaConfig, TopicConfig
from basalt.v1 import common_pb2 as pb
from basalt.v1 import store_node_pb2 as sn
from basalt.v1 import store_node_pb2_grpc as sn_grpc
from tests.support.nodes import BROKERS
from tests.support.processes import local_cluster
from tests.support.spark import spark  # noqa: F401

pytestmark = pytest.mark.slow

TOPIC = "SparkArrow"
#: Queues per store-node.
QUEUES = 2
#: Messages sent, in batches of 100 (each batch to one queue, the producer's
#: round robin): ~2,300 a queue, several store-node answers (PULL_MAX_NUMS
#: records at most) each.
TOTAL = 9_200


def message(i: int) -> Message:
    """Message ``i``: bodies of every length up to 2 KiB (none empty), tags on
    two thirds, keys on half, user properties on all."""
    return Message(
        topic=TOPIC,
        body=bytes([i % 251]) * (1 + i % 2048),
        tags=None if i % 3 == 0 else f"Tag{i % 3}",
        keys=[f"k{i}", f"j{i}"] if i % 2 else None,
        properties={"n": str(i), "é": "ü" * (i % 5)},
    )


async def fill(endpoint: str, etcd: str) -> None:
    """TOPIC with QUEUES queues on each store-node, TOTAL messages sent to it."""
    async with MetaClient(MetaConfig(endpoints=(etcd,), cluster=CLUSTER_NAME)) as meta:
        await meta.create_topic(
            TopicConfig(
                topic_name=TOPIC, read_queue_nums=QUEUES, write_queue_nums=QUEUES, brokers=BROKERS
            )
        )
    async with Producer(endpoint, group="SparkArrowP") as producer:
        for start in range(0, TOTAL, 100):
            sent = await producer.send_batch([message(i) for i in range(start, start + 100)])
            assert all(r.ok for r in sent)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, spark: Any) -> Iterator[list[dict[str, Any]]]:
    register(spark)
    with local_cluster(tmp_path_factory.mktemp("arrow") / "cluster") as rows:
        address = {r["role"]: r["address"] for r in rows}
        asyncio.run(fill(address["pull-service"], address["etcd"]))
        yield rows


def endpoint(rows: list[dict[str, Any]]) -> str:
    return str(next(r["address"] for r in rows if r["role"] == "pull-service"))


def stored(rows: list[dict[str, Any]]) -> dict[tuple[str, int], tuple[int, int]]:
    """Each (broker, queue)'s stored offsets; each spans more than two answers."""
    bounds = {
        (q.broker, q.queue_id): _cluster.min_max(q)
        for q in _cluster.queues_of(endpoint(rows), [TOPIC])
    }
    assert len(bounds) == QUEUES * len(BROKERS) and sum(e - s for s, e in bounds.values()) == TOTAL
    assert all(s == 0 and e > 2 * PULL_MAX_NUMS for s, e in bounds.values())
    return bounds


def reference(
    rows: list[dict[str, Any]], bounds: dict[tuple[str, int], tuple[int, int]]
) -> list[dict[str, Any]]:
    """The rows of each (broker, queue)'s ``[start, end)`` by the reference path:
    ``GetMessage`` from the store-node, ``decode_records``, ``record_batch``."""
    out: list[dict[str, Any]] = []
    for node in (r for r in rows if r["role"] == "store-node"):
        with grpc.insecure_channel(node["address"]) as ch:
            stub = sn_grpc.StoreNodeStub(ch)
            for (broker, queue_id), (start, end) in sorted(bounds.items()):
                if broker != node["name"]:
                    continue
                offset = start
                while offset < end:
                    got = stub.GetMessage(
                        sn.GetMessageRequest(
                            group="SparkArrowRef",
                            topic=TOPIC,
                            queue_id=queue_id,
                            offset=offset,
                            max_msg_nums=min(32, end - offset),
                        )
                    )
                    assert got.status == pb.GET_MESSAGE_STATUS_FOUND, got
                    records = decode_records(got.records.data, check_crc=True)
                    out.extend(record_batch(broker, records).to_pylist())
                    offset = got.next_begin_offset
    return [r for r in out if r["queue_offset"] < bounds[(r["broker"], r["queue_id"])][1]]


def ordered(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(rows, key=lambda r: (r["broker"], r["queue_id"], r["queue_offset"]))


def spark_rows(df: Any) -> list[dict[str, Any]]:
    """What Spark holds, as the reference's Arrow rows (a map as (key, value) pairs)."""
    table = df.toArrow()
    assert table.schema.names == ARROW_SCHEMA.names
    return [
        {**r, "properties": list(r["properties"] or [])}
        for r in table.cast(ARROW_SCHEMA).to_pylist()
    ]


def test_a_read_across_many_answers_equals_the_reference_path(
    spark: Any, cluster: list[dict[str, Any]]
) -> None:
    df = spark.read.format("basalt").options(endpoint=endpoint(cluster), topic=TOPIC).load()
    assert df.schema.simpleString() == spark.createDataFrame([], SCHEMA_DDL).schema.simpleString()
    got = ordered(spark_rows(df))
    bounds = stored(cluster)
    want = ordered(reference(cluster, bounds))
    assert len(got) == len(want) == TOTAL
    assert got == want
    # every offset of every queue once
    assert [(r["broker"], r["queue_id"], r["queue_offset"]) for r in got] == [
        (b, q, o) for (b, q), (s, e) in sorted(bounds.items()) for o in range(s, e)
    ]
    assert all(len(r["msg_id"]) == 32 for r in got)


def test_ranges_that_start_and_end_inside_answers_are_read_exactly(
    spark: Any, cluster: list[dict[str, Any]]
) -> None:
    """Bounds off the answers' edges (a range starting mid-answer, one ending
    mid-answer, one empty): exactly those offsets, as the reference reads them."""
    end = stored(cluster)
    a1, b1 = end[("broker-a", 1)][1], end[("broker-b", 1)][1]
    starting = {TOPIC: {"broker-a": {"0": 77, "1": a1}, "broker-b": {"0": 0, "1": 1500}}}
    ending = {TOPIC: {"broker-a": {"0": 1100, "1": a1}, "broker-b": {"0": 3, "1": -1}}}
    df = (
        spark.read.format("basalt")
        .options(endpoint=endpoint(cluster), topic=TOPIC)
        .option("startingOffsets", json.dumps(starting))
        .option("endingOffsets", json.dumps(ending))
        .load()
    )
    bounds = {
        ("broker-a", 0): (77, 1100),
        ("broker-a", 1): (a1, a1),
        ("broker-b", 0): (0, 3),
        ("broker-b", 1): (1500, b1),
    }
    got = ordered(spark_rows(df))
    assert [(r["broker"], r["queue_id"], r["queue_offset"]) for r in got] == [
        (b, q, o) for (b, q), (s, e) in sorted(bounds.items()) for o in range(s, e)
    ]
    assert got == ordered(reference(cluster, {k: v for k, v in bounds.items() if v[0] < v[1]}))


def test_each_micro_batch_holds_exactly_the_offsets_spark_records_for_it(
    spark: Any, cluster: list[dict[str, Any]], tmp_path: Path
) -> None:
    """A stream from the earliest offsets, 1,500 offsets a trigger: each batch's
    rows are exactly [startOffset, endOffset) of each queue as Spark's progress
    reports them, the end offsets are each queue's next offset, and the batches
    together are the reference's rows."""
    batches: dict[int, list[dict[str, Any]]] = {}

    def keep(df: Any, batch_id: int) -> None:
        batches[batch_id] = spark_rows(df)

    query = (
        spark.readStream.format("basalt")
        .options(endpoint=endpoint(cluster), topic=TOPIC)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "1500")
        .load()
        .writeStream.foreachBatch(keep)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .start()
    )
    try:
        query.processAllAvailable()
        progress = [p for p in query.recentProgress if p["numInputRows"]]
    finally:
        query.stop()
    bounds = stored(cluster)
    assert sum(p["numInputRows"] for p in progress) == TOTAL
    assert len(progress) == -(-TOTAL // 1500)
    for p in progress:
        source = p["sources"][0]
        start = json.loads(source["startOffset"] or "null") or {}  # JSON; the first: null
        end = json.loads(source["endOffset"])[TOPIC]
        offsets = {
            (b, int(q), o)
            for b, queues in end.items()
            for q, stop in queues.items()
            for o in range(start.get(TOPIC, {}).get(b, {}).get(q, 0), stop)
        }
        rows = batches[p["batchId"]]
        assert {(r["broker"], r["queue_id"], r["queue_offset"]) for r in rows} == offsets
        assert len(rows) == len(offsets) == p["numInputRows"] <= 1500
    final = json.loads(progress[-1]["sources"][0]["endOffset"])[TOPIC]
    assert final == {
        b: {str(q): e for (b2, q), (_, e) in bounds.items() if b2 == b} for b in BROKERS
    }
    every = ordered([r for rows in batches.values() for r in rows])
    assert every == ordered(reference(cluster, bounds))
