"""The store-node's metrics and hot-path spans, read from an in-memory reader.

A real store-node on port 0 (:func:`tests.support.nodes.node`); the SDK
providers are the process's one pair (:func:`tests.support.telemetry.telemetry`),
so every test uses topics of its own and the node's own broker attribute.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from basalt.admin.topics import delete_topic
from basalt.services.histograms import DURATION_BUCKETS_S
from basalt.services.meta import MetaConfig, TopicConfig
from basalt.v1 import common_pb2 as pb
from basalt.v1 import store_node_pb2 as sn
from tests.support.aio import run
from tests.support.nodes import NODE_TOPIC, cluster, node
from tests.support.polling import eventually
from tests.support.rpc import wire
from tests.support.telemetry import metric_reader

TOPIC = "messaging.destination.name"


def _topic() -> str:
    return f"Metrics{uuid.uuid4().hex[:12]}"


def test_put_and_get_counts_lag_and_one_span_per_send_stream_batch(
    tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    t = metric_reader()
    topic = _topic()
    broker = {"basalt.broker.name": "broker-a"}

    def histogram(name: str) -> tuple[int, float]:
        """(count, sum) of broker-a's ``name`` so far (other tests' nodes add to it)."""
        points = t.points(name, **broker)
        return (points[0][1].count, points[0][1].sum) if points else (0, 0.0)

    async def scenario() -> None:
        async with node(tmp_path) as (running, stub, _):
            durations, batches = (
                histogram("basalt.store.put.duration"),
                histogram("basalt.store.put.batch.messages"),
            )
            for i in range(3):
                await stub.SendMessage(
                    sn.SendMessageRequest(message=wire(topic, b"m%d" % i), queue_id=0)
                )
            call = stub.SendStream()
            batch = sn.SendBatchRequest(
                topic=topic,
                queue_id=0,
                messages=pb.MessageList(messages=[wire("", b"b%d" % i) for i in range(4)]),
            )
            await call.write(sn.SendStreamRequest(items=[sn.SendStreamItem(opaque=1, batch=batch)]))
            await call.done_writing()
            answers = [a async for r in call for a in r.answers]
            assert [a.result.status for a in answers] == [pb.SEND_STATUS_SEND_OK]
            assert await asyncio.to_thread(running.store.wait_dispatched)
            got = await stub.GetMessage(
                sn.GetMessageRequest(group="G1", topic=topic, queue_id=0, offset=0, max_msg_nums=32)
            )
            assert got.records.count == 7
            for group, offset in (("G1", 7), ("G2", 2)):
                await stub.UpdateConsumerOffset(
                    sn.UpdateConsumerOffsetRequest(
                        group=group, topic=topic, queue_id=0, offset=offset
                    )
                )
            where = {TOPIC: topic}
            assert t.value("basalt.store.put.messages", **where) == 7
            assert t.value("basalt.store.get.messages", **where) == 7
            put_bytes = t.value("basalt.store.put.bytes", **where)
            assert put_bytes is not None and put_bytes > 0
            assert t.value("basalt.store.get.bytes", **where) == put_bytes
            # Three sends and one batch of four: four durations, sizes 1, 1, 1 and 4.
            assert histogram("basalt.store.put.duration")[0] == durations[0] + 4
            count, total = histogram("basalt.store.put.batch.messages")
            assert (count - batches[0], total - batches[1]) == (4, 7)
            lag = {"messaging.consumer.group.name": "G1", TOPIC: topic, "basalt.queue.id": 0}
            assert t.value("basalt.consumer.lag", **lag) == 0
            lag["messaging.consumer.group.name"] = "G2"
            assert t.value("basalt.consumer.lag", **lag) == 5
            end = t.value("basalt.store.commitlog.max_offset", **broker)
            assert end == running.store.max_physical_offset
            assert t.value("basalt.store.dispatch.behind", **broker) == 0

        streams = [
            s
            for s in spans.get_finished_spans()
            if s.name == "SendStream" and (s.attributes or {}).get(TOPIC) == topic
        ]
        assert len(streams) == 1
        assert (streams[0].attributes or {})["messaging.batch.message_count"] == 4
        gets = [
            s
            for s in spans.get_finished_spans()
            if s.name == "GetMessage"
            and (s.attributes or {}).get("messaging.batch.message_count") == 7
        ]
        assert gets

    run(scenario)


def test_held_polls_gauge_rises_while_a_pull_is_held(tmp_path: Path) -> None:
    t = metric_reader()
    broker = {"basalt.broker.name": "broker-a"}

    async def scenario() -> None:
        async with node(tmp_path) as (_, stub, _):
            assert t.value("basalt.store.long_polls.held", **broker) == 0
            held = asyncio.ensure_future(
                stub.GetMessage(
                    sn.GetMessageRequest(
                        group="G",
                        topic=NODE_TOPIC,
                        queue_id=3,
                        offset=0,
                        max_msg_nums=8,
                        suspend_timeout_ms=10_000,
                    )
                )
            )
            await eventually(
                lambda: t.value("basalt.store.long_polls.held", **broker) == 1, what="held"
            )
            await stub.SendMessage(
                sn.SendMessageRequest(message=wire(NODE_TOPIC, b"wake"), queue_id=3)
            )
            assert (await held).records.count == 1
            await eventually(
                lambda: t.value("basalt.store.long_polls.held", **broker) == 0, what="released"
            )

    run(scenario)


def test_health_gauge_goes_to_zero_for_a_failed_service(tmp_path: Path) -> None:
    t = metric_reader()

    async def scenario() -> None:
        async with node(tmp_path) as (running, _, _):
            store = running.store
            name = "flush-consumequeue"
            assert name in store.service_names
            where = {"basalt.broker.name": "broker-a", "basalt.service": name}
            assert t.value("basalt.store.service.healthy", **where) == 1
            store.failures.record(name, OSError(5, "injected"))
            assert t.value("basalt.store.service.healthy", **where) == 0
            others = t.points("basalt.store.service.healthy", **{"basalt.broker.name": "broker-a"})
            assert {a["basalt.service"] for a, p in others if p.value == 1} == set(
                store.service_names
            ) - {name}

    run(scenario)


def test_durations_are_bucketed_in_seconds(tmp_path: Path) -> None:
    """An fsync of 0.23 ms lands in the (0.1 ms, 0.25 ms] bucket, not in OpenTelemetry's
    default first bucket (0, 5] meant for milliseconds; every duration histogram
    has the same seconds buckets."""
    t = metric_reader()
    broker = {"basalt.broker.name": "broker-a"}

    def buckets(name: str) -> tuple[tuple[float, ...], list[int]]:
        """(bounds, per-bucket counts) summed over broker-a's points of ``name``."""
        points = t.points(name, **broker)
        if not points:
            return DURATION_BUCKETS_S, [0] * (len(DURATION_BUCKETS_S) + 1)
        (bounds,) = {tuple(p.explicit_bounds) for _, p in points}
        return bounds, [sum(c) for c in zip(*(p.bucket_counts for _, p in points), strict=True)]

    async def scenario() -> None:
        async with node(tmp_path) as (running, stub, _):
            before = buckets("basalt.store.flush.duration")[1]
            # What the CommitLog's flush thread hands its listeners after an fsync.
            for listener in running.store.commitlog.flush_listeners:
                listener(0.00023)
            bounds, after = buckets("basalt.store.flush.duration")
            assert bounds == DURATION_BUCKETS_S
            grew = [i for i, (a, b) in enumerate(zip(before, after, strict=True)) if a != b]
            assert [(bounds[i - 1], bounds[i]) for i in grew] == [(0.0001, 0.00025)]
            assert after[grew[0]] - before[grew[0]] == 1

            # A put and a read: their histograms carry the same buckets.
            await stub.SendMessage(
                sn.SendMessageRequest(message=wire(NODE_TOPIC, b"m"), queue_id=0)
            )
            await stub.GetMessage(
                sn.GetMessageRequest(
                    group="G", topic=NODE_TOPIC, queue_id=0, offset=0, max_msg_nums=1
                )
            )
            for name in ("basalt.store.put.duration", "basalt.store.get.duration"):
                assert buckets(name)[0] == DURATION_BUCKETS_S, name

    run(scenario)


def test_a_deleted_topic_reports_no_consumer_lag(tmp_path: Path, meta_config: MetaConfig) -> None:
    """deleteTopic removes the topic's config; the committed offsets stay on the
    store-node (as its files do), but no lag is reported for it any more."""
    t = metric_reader()
    topic = _topic()

    async def scenario() -> None:
        config = TopicConfig(
            topic_name=topic, read_queue_nums=1, write_queue_nums=1, brokers=("broker-a",)
        )
        async with cluster(tmp_path, meta_config, brokers=("broker-a",), topic=config) as h:
            stub = h.node_stubs["broker-a"]
            for i in range(3):
                await h.send("broker-a", 0, b"m%d" % i, topic=topic)
            await stub.UpdateConsumerOffset(
                sn.UpdateConsumerOffsetRequest(group="G", topic=topic, queue_id=0, offset=1)
            )
            lag = {"messaging.consumer.group.name": "G", TOPIC: topic, "basalt.queue.id": 0}
            assert t.value("basalt.consumer.lag", **lag) == 2

            await delete_topic(h.meta, topic)
            node_topics = h.nodes["broker-a"].servicer.topics
            await eventually(lambda: node_topics.topic(topic) is None, what="the delete seen")
            assert t.points("basalt.consumer.lag", **lag) == []
            # Its committed offset stays on the node, as its files do until they
            # expire: a topic of that name created again reports it again.
            offsets = h.nodes["broker-a"].store.consumer_offsets.all_offsets()
            assert ("G", topic, 0, 1) in offsets

    run(scenario)
