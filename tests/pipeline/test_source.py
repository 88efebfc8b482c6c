"""``spark.read.format("basalt")`` and ``readStream`` against one real ``basalt
cluster up`` (etcd, two store-nodes, a pull-service) and one local Spark
session for the module: a batch read equals what the SDK consumes; timestamp
bounds are SearchOffset's; TAG and SQL92 filters are applied on the
store-node; a streaming query restarted from its checkpoint reads every
message exactly once; bad options fail on the driver with a clear message.
"""

# The module-scoped `spark` fixture is imported, then named by the tests' parameters.
# ruff: noqa: F811

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pyarrow as pa
import pytest

from basalt.client import (
    ConsumeFromWhere,
    LitePullConfig,
    LitePullConsumer,
    Message,
    MessageRecord,
    Producer,
)
from basalt.pipeline import _cluster, register
from basalt.pipeline._cluster import BasaltSourceError, QueueRef
from basalt.pipeline.source import (
    MAX_PARTITION_OFFSETS,
    QUEUES_PER_CALL,
    BasaltPartition,
    BasaltQueues,
    SourceOptions,
    _cap,
    _pack,
    _plan,
    _read,
    _split,
)
from basalt.services.cluster.local import CLUSTER_NAME
from basalt.services.meta import MetaClient, MetaConfig, TopicConfig
from basalt.v1 import common_pb2 as pb
from basalt.v1 import store_node_pb2 as sn
from basalt.v1 import store_node_pb2_grpc as sn_grpc
from tests.support.nodes import BROKERS
from tests.support.polling import eventually_sync
from tests.support.processes import REPO_ROOT, local_cluster
from tests.support.spark import spark  # noqa: F401
from tests.support.timeouts import SUBPROCESS_TIMEOUT_S

pytestmark = pytest.mark.slow

#: Read whole by the batch and timestamp tests.
TOPIC = "SparkSource"
#: Read only with filters: its store-side get counts are the filtered reads'.
FILTERED = "SparkFiltered"
#: The streaming test's topic.
STREAMED = "SparkStreamed"
SENT = 40
GET_MESSAGES = "basalt_store_get_messages_total"


@dataclass(frozen=True)
class Cluster:
    rows: list[dict[str, Any]]

    def address(self, role: str) -> str:
        return str(next(r["address"] for r in self.rows if r["role"] == role))

    @property
    def endpoint(self) -> str:
        return self.address("pull-service")

    def store_nodes(self) -> list[dict[str, Any]]:
        return [r for r in self.rows if r["role"] == "store-node"]

    def got_messages(self, topic: str) -> float:
        """The store-nodes' count of records read for ``topic`` (their /metrics)."""
        total = 0.0
        pattern = re.compile(
            rf'^{GET_MESSAGES}\{{[^}}]*messaging_destination_name="{topic}"[^}}]*\}} (\S+)$', re.M
        )
        for row in self.store_nodes():
            with urllib.request.urlopen(row["metrics"], timeout=10) as answer:
                total += sum(float(v) for v in pattern.findall(answer.read().decode()))
        return total


def message(topic: str, i: int) -> Message:
    return Message(
        topic=topic,
        body=b"m%d" % i,
        tags="TagA" if i % 2 else "TagB",
        keys=[f"k{i}", f"j{i}"],
        properties={"n": str(i)},
    )


async def send(endpoint: str, topic: str, numbers: range) -> None:
    async with Producer(endpoint, group="SparkSourceP") as producer:
        for i in numbers:
            assert (await producer.send(message(topic, i))).ok


async def create_topic(cluster: Cluster, *topics: str) -> None:
    """``topics`` with 2 queues on each store-node."""
    meta_config = MetaConfig(endpoints=(cluster.address("etcd"),), cluster=CLUSTER_NAME)
    async with MetaClient(meta_config) as meta:
        for topic in topics:
            await meta.create_topic(
                TopicConfig(
                    topic_name=topic, read_queue_nums=2, write_queue_nums=2, brokers=BROKERS
                )
            )


async def setup(cluster: Cluster) -> None:
    await create_topic(cluster, TOPIC, FILTERED, STREAMED)
    await send(cluster.endpoint, TOPIC, range(SENT))
    await send(cluster.endpoint, FILTERED, range(SENT))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, spark: Any) -> Iterator[Cluster]:
    """The module's cluster with TOPIC and FILTERED sent; ``basalt`` registered."""
    register(spark)
    with local_cluster(tmp_path_factory.mktemp("source") / "cluster") as rows:
        c = Cluster(rows)
        asyncio.run(setup(c))
        yield c


async def sdk_consume(endpoint: str, topic: str, count: int) -> list[MessageRecord]:
    consumer = LitePullConsumer(
        endpoint,
        config=LitePullConfig(
            consumer_group="SparkSourceSDK",
            consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
        ),
    )
    consumer.subscribe(topic)
    got: list[MessageRecord] = []
    async with consumer:
        while len(got) < count:
            got.extend(await consumer.poll(timeout_ms=1000))
    return got


def read(spark: Any, cluster: Cluster, **options: str) -> Any:
    return (
        spark.read.format("basalt").option("endpoint", cluster.endpoint).options(**options).load()
    )


def test_a_batch_read_equals_what_the_sdk_consumes(spark: Any, cluster: Cluster) -> None:
    df = read(spark, cluster, topic=TOPIC, minPartitions="6")
    assert df.rdd.getNumPartitions() >= 6  # 4 queues of ~10 offsets, split further
    rows = {r.msg_id: r for r in df.collect()}
    records = asyncio.run(sdk_consume(cluster.endpoint, TOPIC, SENT))
    assert len(rows) == SENT and {r.msg_id for r in records} == set(rows)
    for rec in records:
        row = rows[rec.msg_id]
        assert (row.topic, row.queue_id, row.queue_offset, row.commitlog_offset) == (
            rec.topic,
            rec.queue_id,
            rec.queue_offset,
            rec.commit_log_offset,
        )
        assert (bytes(row.body), row.tags, row.keys.split(" "), row.properties) == (
            rec.body,
            rec.tags,
            rec.keys,
            rec.properties,
        )
        assert (row.born_timestamp, row.store_timestamp) == (
            rec.born_timestamp_ms,
            rec.store_timestamp_ms,
        )
        assert row.broker in BROKERS
    # startingOffsets / endingOffsets JSON: one queue's range, -2 earliest.
    bounds = '{"%s": {"broker-a": {"0": %d}}}'
    part = read(
        spark,
        cluster,
        topic=TOPIC,
        startingOffsets=bounds % (TOPIC, -2),
        endingOffsets=bounds % (TOPIC, 3),
    ).collect()
    a0 = sorted(r.queue_offset for r in rows.values() if (r.broker, r.queue_id) == ("broker-a", 0))
    assert sorted(r.queue_offset for r in part if (r.broker, r.queue_id) == ("broker-a", 0)) == [
        o for o in a0 if o < 3
    ]
    assert len(part) == SENT - len([o for o in a0 if o >= 3])  # other queues read whole


def test_timestamp_bounds_are_search_offsets(spark: Any, cluster: Cluster) -> None:
    rows = read(spark, cluster, topic=TOPIC).collect()
    times = sorted(r.store_timestamp for r in rows)
    start_ms, end_ms = times[SENT // 4], times[3 * SENT // 4]
    got = read(
        spark, cluster, topic=TOPIC, startingTimestamp=str(start_ms), endingTimestamp=str(end_ms)
    ).collect()
    expected: set[tuple[str, int, int]] = set()
    for node in cluster.store_nodes():
        with grpc.insecure_channel(node["address"]) as ch:
            stub = sn_grpc.StoreNodeStub(ch)
            for q in (0, 1):
                lo, hi = (
                    stub.SearchOffset(
                        sn.SearchOffsetRequest(topic=TOPIC, queue_id=q, timestamp_ms=t)
                    ).offset
                    for t in (start_ms, end_ms)
                )
                expected |= {(node["name"], q, o) for o in range(lo, hi)}
    assert expected and len(expected) < SENT
    assert {(r.broker, r.queue_id, r.queue_offset) for r in got} == expected


def test_filters_are_applied_on_the_store_node(spark: Any, cluster: Cluster) -> None:
    before = cluster.got_messages(FILTERED)
    tagged = read(spark, cluster, topic=FILTERED, subscription="TagA").collect()
    assert sorted(bytes(r.body) for r in tagged) == sorted(b"m%d" % i for i in range(SENT) if i % 2)
    # The store-nodes read out only the matching records (and the driver's
    # subscription check read none).
    assert cluster.got_messages(FILTERED) - before == len(tagged)

    sql = read(
        spark,
        cluster,
        topic=FILTERED,
        subscription="n < 10 AND TAGS = 'TagB'",
        subscriptionType="SQL92",
    ).collect()
    assert sorted(bytes(r.body) for r in sql) == sorted(b"m%d" % i for i in range(0, 10, 2))
    assert cluster.got_messages(FILTERED) - before == len(tagged) + len(sql)


def test_a_partition_of_several_queues_reads_them_in_one_call_each_round(
    cluster: Cluster,
) -> None:
    """Executors read the store-node directly, several queues a GetMessages:
    a pack of one broker's queues yields every message of each range once,
    and a filtered pack still leaves the store-node only matching records."""
    queues = [q for q in _cluster.queues_of(cluster.endpoint, [TOPIC]) if q.broker == "broker-a"]
    assert len(queues) == 2
    parts = [
        BasaltPartition(q.topic, q.broker, q.queue_id, 0, _cluster.min_max(q)[1]) for q in queues
    ]
    options = SourceOptions.parse({"endpoint": cluster.endpoint, "topic": TOPIC})
    rows = pa.Table.from_batches(list(_read(options, BasaltQueues(tuple(parts))))).to_pylist()
    assert sorted((r["queue_id"], r["queue_offset"]) for r in rows) == sorted(
        (p.queue_id, o) for p in parts for o in range(p.start, p.end)
    )
    # a range's end cuts its queue alone: queue 0 up to offset 2, queue 1 whole
    cut = (BasaltPartition(TOPIC, "broker-a", 0, 0, 2), parts[1])
    rows = pa.Table.from_batches(list(_read(options, BasaltQueues(cut)))).to_pylist()
    assert len(rows) == 2 + parts[1].end and all(
        r["queue_offset"] < 2 for r in rows if r["queue_id"] == 0
    )
    before = cluster.got_messages(FILTERED)
    filtered = SourceOptions.parse(
        {"endpoint": cluster.endpoint, "topic": FILTERED, "subscription": "TagA"}
    )
    every = _cluster.queues_of(cluster.endpoint, [FILTERED])
    packs = [  # ranges past the queues' ends: each read stops at its queue's end
        BasaltQueues(tuple(BasaltPartition(FILTERED, b, q.queue_id, 0, 1 << 20) for q in mine))
        for b in BROKERS
        if (mine := [q for q in every if q.broker == b])
    ]
    tagged = [r for p in packs for b in _read(filtered, p) for r in b.to_pylist()]
    assert sorted(r["body"] for r in tagged) == sorted(b"m%d" % i for i in range(SENT) if i % 2)
    assert cluster.got_messages(FILTERED) - before == len(tagged)


def test_a_restarted_stream_reads_every_message_exactly_once(
    spark: Any,
    cluster: Cluster,
    tmp_path: Path,
) -> None:
    asyncio.run(send(cluster.endpoint, STREAMED, range(20)))

    def run_once() -> None:
        query = (
            spark.readStream.format("basalt")
            .option("endpoint", cluster.endpoint)
            .option("topic", STREAMED)
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", "7")
            .option("group", "SparkStream")
            .load()
            .writeStream.format("parquet")
            .option("path", str(tmp_path / "out"))
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(processingTime="100 milliseconds")
            .start()
        )
        try:
            query.processAllAvailable()
            assert len(query.recentProgress) >= 1
        finally:
            query.stop()

    run_once()  # 20 offsets at 7 a trigger: several micro-batches
    asyncio.run(send(cluster.endpoint, STREAMED, range(20, 35)))
    run_once()
    bodies = [bytes(r.body) for r in spark.read.parquet(str(tmp_path / "out")).collect()]
    assert sorted(bodies) == sorted(b"m%d" % i for i in range(35))
    # The group's progress trails Spark's commits, never leads them.
    committed = 0
    for node in cluster.store_nodes():
        with grpc.insecure_channel(node["address"]) as ch:
            stub = sn_grpc.StoreNodeStub(ch)
            for q in (0, 1):
                got = stub.QueryConsumerOffset(
                    sn.QueryConsumerOffsetRequest(group="SparkStream", topic=STREAMED, queue_id=q)
                )
                committed += max(got.offset, 0)
    assert 20 <= committed <= 35


#: A streaming driver in its own process (its own session: the JVM is its child):
#: ``ENDPOINT TOPIC OUT CHECKPOINT WAREHOUSE forever|drain``. ``forever`` runs
#: until killed; ``drain`` stops once everything sent so far is written.
DRIVER = """
import sys
from pathlib import Path

from basalt.pipeline import register
from tests.support.spark import start_spark

endpoint, topic, out, checkpoint, warehouse, mode = sys.argv[1:7]
spark = start_spark(Path(warehouse), app="basalt-driver")
register(spark)
query = (
    spark.readStream.format("basalt")
    .option("endpoint", endpoint)
    .option("topic", topic)
    .option("startingOffsets", "earliest")
    .option("maxOffsetsPerTrigger", "4")
    .load()
    .writeStream.format("parquet")
    .option("path", out)
    .option("checkpointLocation", checkpoint)
    .trigger(processingTime="200 milliseconds")
    .start()
)
if mode == "forever":
    query.awaitTermination()
query.processAllAvailable()
query.stop()
spark.stop()
"""


def test_a_killed_driver_restarted_from_its_checkpoint_writes_every_message_once(
    spark: Any, cluster: Cluster, tmp_path: Path
) -> None:
    topic = "SparkKilled"
    asyncio.run(create_topic(cluster, topic))
    asyncio.run(send(cluster.endpoint, topic, range(30)))
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    argv = [sys.executable, str(script), cluster.endpoint, topic, str(out), str(checkpoint)]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}

    def driver(mode: str) -> subprocess.Popen[bytes]:
        with (tmp_path / f"driver-{mode}.log").open("wb") as log:
            return subprocess.Popen(
                [*argv, str(tmp_path / f"warehouse-{mode}"), mode],
                env=env,
                cwd=REPO_ROOT,
                start_new_session=True,  # one process group: the driver and its JVM
                stdout=subprocess.DEVNULL,
                stderr=log,
            )

    first = driver("forever")
    try:
        # 30 offsets at 4 a trigger: killed after two batches, before the eighth.
        eventually_sync(
            lambda: len(list((checkpoint / "commits").glob("[0-9]*"))) >= 2,
            timeout_s=90,
            what="two committed micro-batches",
        )
    finally:
        os.killpg(first.pid, signal.SIGKILL)  # kill -9 of the driver and its JVM
        first.wait(timeout=SUBPROCESS_TIMEOUT_S)
    assert len(list((checkpoint / "commits").glob("[0-9]*"))) < 8
    asyncio.run(send(cluster.endpoint, topic, range(30, 40)))
    second = driver("drain")
    try:
        code = second.wait(timeout=SUBPROCESS_TIMEOUT_S)
        assert code == 0, (tmp_path / "driver-drain.log").read_text()[-3000:]
    finally:
        if second.poll() is None:
            os.killpg(second.pid, signal.SIGKILL)
    bodies = [bytes(r.body) for r in spark.read.parquet(str(out)).collect()]
    assert sorted(bodies) == sorted(b"m%d" % i for i in range(40))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"topic": "NoSuchTopic"}, "topic 'NoSuchTopic' does not exist"),
        ({"topic": TOPIC, "startingOffsets": "{oops"}, "is not 'earliest', 'latest' or JSON"),
        ({"topic": TOPIC, "endpoint": "127.0.0.1:1"}, "127.0.0.1:1 is unreachable"),
        ({"topic": TOPIC, "subscription": "a >", "subscriptionType": "SQL92"}, "is refused"),
    ],
)
def test_a_bad_option_fails_on_the_driver_with_a_clear_message(
    spark: Any,
    cluster: Cluster,
    options: dict[str, str],
    message: str,
) -> None:
    with pytest.raises(Exception, match=re.escape(message)):
        read(spark, cluster, **options)  # load() alone: planning, no job


# -- planning without a cluster ------------------------------------------------------------


def test_options_are_validated_without_the_network() -> None:
    parsed = SourceOptions.parse(
        {
            "endpoint": "h:1",
            "topic": "A, B",
            "startingOffsets": '{"A": {"broker-a": {"0": 12, "1": -2}}}',
            "subscription": "x > 1",
            "subscriptionType": "sql92",
        }
    )
    assert parsed.topics == ("A", "B") and parsed.ending == "latest"
    assert parsed.starting == {"A": {"broker-a": {"0": 12, "1": -2}}}
    assert parsed.subscription_pb() == pb.Subscription(
        type=pb.EXPRESSION_TYPE_SQL92, expression="x > 1"
    )
    for options, message in [
        ({"endpoint": " "}, "option endpoint is required"),
        ({"topic": ", "}, "option topic is required"),
        ({"startingOffsets": '{"C": {}}'}, "names topic 'C', not one of"),
        ({"startingOffsets": '{"A": {"b": {"0": -3}}}'}, "A/b/0: -3 is not a queue id"),
        ({"startingOffsets": '{"A": {"b": {"x": 1}}}'}, "A/b/x: 1 is not a queue id"),
        ({"startingOffsets": "[]"}, "must be a JSON object"),
        ({"startingOffsets": "0", "startingTimestamp": "5"}, "not both"),
        ({"maxOffsetsPerTrigger": "0"}, "maxOffsetsPerTrigger '0' is not an integer >= 1"),
        ({"subscriptionType": "regex"}, "is not TAG or SQL92"),
    ]:
        with pytest.raises(BasaltSourceError, match=re.escape(message)):
            SourceOptions.parse({"endpoint": "h:1", "topic": "A", **options})


def test_ranges_split_into_partitions() -> None:
    ranges = [("T", "b", 0, 0, 10), ("T", "b", 1, 5, 5), ("T", "b", 2, 3, 4)]
    assert _split(ranges, None) == [
        BasaltPartition("T", "b", 0, 0, 10),
        BasaltPartition("T", "b", 2, 3, 4),
    ]
    parts = _split(ranges, 4)  # 11 offsets: at most 3 a partition
    assert [(p.queue_id, p.start, p.end) for p in parts] == [
        (0, 0, 3),
        (0, 3, 6),
        (0, 6, 9),
        (0, 9, 10),
        (2, 3, 4),
    ]
    big = _split([("T", "b", 0, 0, 2 * MAX_PARTITION_OFFSETS + 1)], None)
    assert len(big) == 3 and big[-1].end == 2 * MAX_PARTITION_OFFSETS + 1


def test_many_ranges_pack_into_partitions_of_one_broker() -> None:
    ranges = [("T", b, q, 0, 10) for b in ("a", "b") for q in range(40)]
    few = _split(ranges[:16], None)
    assert _pack(few, 16) == few  # up to the target: one queue a partition
    packs = _pack(_split(ranges, None), 16)  # 80 queues: 5 a pack, by broker
    assert all(isinstance(p, BasaltQueues) for p in packs) and len(packs) == 16
    for p in packs:
        assert isinstance(p, BasaltQueues) and len({q.broker for q in p.parts}) == 1
        assert len({q.queue_id for q in p.parts}) == len(p.parts) <= QUEUES_PER_CALL
    # a queue split in pieces never lands twice in one pack (GetMessages refuses that)
    split = _split([("T", "a", 0, 0, 100), ("T", "a", 1, 0, 100)], 40)
    for p in _pack(split, 2):
        parts = p.parts if isinstance(p, BasaltQueues) else (p,)
        assert len({q.queue_id for q in parts}) == len(parts)


def _offsets(partition: object) -> list[tuple[str, int, int]]:
    """(broker, queue id, offset) of every offset a planned partition reads."""
    parts = partition.parts if isinstance(partition, BasaltQueues) else (partition,)
    assert len({q.queue_key for q in parts}) == len(parts)  # GetMessages refuses a queue twice
    assert len({q.broker for q in parts}) == 1  # one store-node a partition
    return [(q.broker, q.queue_id, o) for q in parts for o in range(q.start, q.end)]


def test_few_ranges_plan_as_many_partitions_each_reading_several_queues() -> None:
    # 2 brokers of 4 queues (the benchmark's layout): 8 partitions, as one a queue
    # would be, but each reads a quarter of its broker's 4 queues: 4 reads a call
    ranges = [("T", b, q, 100 * q, 100 * q + 1000 + q) for b in ("a", "b") for q in range(4)]
    plan = _plan(ranges, None)
    assert len(plan) == len(ranges)
    assert all(isinstance(p, BasaltQueues) and len(p.parts) == 4 for p in plan)
    assert [p.parts[0].broker for p in plan] == ["a", "b"] * 4  # store-nodes in turn
    read = [o for p in plan for o in _offsets(p)]
    want = [(b, q, o) for _, b, q, start, end in ranges for o in range(start, end)]
    assert sorted(read) == sorted(want)  # every offset once
    sizes = [len(_offsets(p)) for p in plan]
    assert max(sizes) - min(sizes) <= 4  # equal shares
    # minPartitions: as many partitions as _split makes (2 a queue), none over its share
    assert len(_split(ranges, 12)) == 16
    plan = _plan(ranges, 12)
    assert len(plan) == 16
    assert max(q.end - q.start for p in plan for q in _offsets_parts(p)) <= max(
        p.end - p.start for p in _split(ranges, 12)
    )
    assert sorted(o for p in plan for o in _offsets(p)) == sorted(want)
    # a store-node of more than QUEUES_PER_CALL queues: groups of at most that many
    many = [("T", "a", q, 0, 50) for q in range(QUEUES_PER_CALL + 4)]
    plan = _plan(many, None)
    assert len(plan) == len(many)
    assert all(len(_offsets_parts(p)) <= QUEUES_PER_CALL for p in plan)
    assert sorted(o for p in plan for o in _offsets(p)) == sorted(
        ("a", q, o) for q in range(QUEUES_PER_CALL + 4) for o in range(50)
    )
    # tiny ranges: slices may be empty, and then are no read
    tiny = _plan([("T", "a", 0, 0, 1), ("T", "a", 1, 5, 7)], None)
    assert sorted(o for p in tiny for o in _offsets(p)) == [("a", 0, 0), ("a", 1, 5), ("a", 1, 6)]


def _offsets_parts(partition: object) -> tuple[BasaltPartition, ...]:
    return partition.parts if isinstance(partition, BasaltQueues) else (partition,)  # type: ignore[return-value]


def test_max_offsets_per_trigger_shares_the_limit_over_queues() -> None:
    a, b, c = (QueueRef("T", "b", q, "h:1") for q in range(3))
    begin = {("T", "b", 0): 0, ("T", "b", 1): 10}  # queue 2 is new: from 0
    end = {a: 30, b: 20, c: 0}
    assert _cap(begin, end, 100) == end
    capped = _cap(begin, end, 8)  # waiting 30 and 10: shares 6 and 2
    assert capped == {a: 6, b: 12, c: 0}
    assert sum(capped[q] for q in (a, b)) - 10 == 8
    assert _cap(begin, {a: 30, b: 20}, 1) == {a: 1, b: 10}  # always moves


def test_a_get_messages_answer_is_read_in_place_as_protobuf_reads_it() -> None:
    answer = pb.PullBatchResponse(
        results=[
            pb.PullResponse(
                status=pb.PULL_STATUS_FOUND,
                next_begin_offset=900,
                max_offset=1 << 40,
                records=pb.Records(data=b"r" * 300, count=3),
                commit=pb.CommitResult(),
            ),
            pb.PullResponse(status=pb.PULL_STATUS_OFFSET_ILLEGAL, next_begin_offset=-1),
            pb.PullResponse(refused=pb.Refused(grpc_code=3, message="queue 7 is read twice")),
        ]
    ).SerializeToString()
    found, moved, refused = _cluster._pull_results(answer)
    assert (found.status, found.next_begin_offset, found.refused) == (
        pb.PULL_STATUS_FOUND, 900, None,
    )  # fmt: skip
    assert found.data is not None and found.data.obj is answer and bytes(found.data) == b"r" * 300
    assert (moved.status, moved.next_begin_offset, moved.data) == (
        pb.PULL_STATUS_OFFSET_ILLEGAL, -1, None,
    )  # fmt: skip
    assert refused.refused == "queue 7 is read twice"
