"""client.LitePullConsumer's commits carried by its next fetch (a GetMessages
on its GetMessagesStream, ``commit_offset``): one message at a time, a poll and
a commit cost one round trip, and the carried commit keeps every promise of UpdateConsumerOffset
(exact offsets, a reset never undone, no wait on a long poll). Real etcd,
store-nodes and a pull-service; the calls seen as the store-node's server spans
(:mod:`tests.support.telemetry`)."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from basalt.admin import ops
from basalt.client import LitePullConsumer, MessageQueue
from basalt.services.meta import MetaConfig
from basalt.v1 import store_node_pb2 as sn
from tests.support.aio import async_test
from tests.support.consumers import lite_pull_config as config
from tests.support.nodes import TOPIC, Harness, cluster
from tests.support.polling import eventually
from tests.support.telemetry import named

UPDATE = "/basalt.v1.StoreNode/UpdateConsumerOffset"
GET_MESSAGES = "/basalt.v1.StoreNode/GetMessages"
FETCH_STREAM = "/basalt.v1.StoreNode/GetMessagesStream"
#: The store-node's span of each fetch on a recorded stream.
FETCH = "GetMessages"
SERVER = SpanKind.SERVER


async def committed(h: Harness, queue: MessageQueue) -> int:
    got = await h.node_stubs[queue.broker_name].QueryConsumerOffset(
        sn.QueryConsumerOffsetRequest(group="LG", topic=queue.topic, queue_id=queue.queue_id)
    )
    return got.offset


@async_test
async def test_one_at_a_time_each_commit_rides_on_the_next_fetch_and_is_exact(
    tmp_path: Path, meta_config: MetaConfig, spans: InMemorySpanExporter
) -> None:
    async with cluster(tmp_path, meta_config) as h:
        q = MessageQueue(TOPIC, "broker-a", 0)
        for i in range(6):
            await h.send(q.broker_name, q.queue_id, b"m%d" % i)
        consumer = LitePullConsumer(
            h.services[0].address,
            # A long poll longer than the test's patience: a commit that waited
            # for a held call would time out below.
            config=config(
                pull_batch_size=1, pull_threshold_for_queue=1, broker_suspend_max_time_ms=60_000
            ),
        )
        async with consumer:
            await consumer.assign([q])
            spans.clear()
            for i in range(6):
                got = await consumer.poll(timeout_ms=10_000, max_records=1)
                assert [r.queue_offset for r in got] == [i]
                # The last one's fetch finds the queue caught up: not held. (A
                # timeout scope, not wait_for: its task would let the fetcher
                # send before commit() runs, and the commit would go on its own.)
                # The first commit is made in a caller's trace, the others outside any.
                with contextlib.ExitStack() as scope:
                    if i == 0:
                        caller = scope.enter_context(
                            trace.get_tracer("test").start_as_current_span("caller")
                        )
                    async with asyncio.timeout(20):
                        await consumer.commit()
                assert await committed(h, q) == i + 1 == consumer.position(q)
            # Every fetch went on one stream, each with a span of its own under
            # the stream's; no unary read, no UpdateConsumerOffset.
            finished = spans.get_finished_spans()
            fetches = named(finished, FETCH)
            assert len(fetches) >= 6
            (parent,) = {f.parent.span_id if f.parent else None for f in fetches}
            assert not named(finished, GET_MESSAGES) and not named(finished, UPDATE)
            # The carried commit shows in the caller's trace, as its call did.
            (commit,) = named(finished, f"commit {TOPIC}")
            assert commit.kind is SpanKind.CLIENT and commit.parent is not None
            assert commit.parent.span_id == caller.get_span_context().span_id
            assert (commit.attributes or {})["messaging.operation.type"] == "settle"
            # Caught up, the next fetch is held and an arrival still wakes it.
            await h.send(q.broker_name, q.queue_id, b"late")
            got = await consumer.poll(timeout_ms=10_000)
            assert [(r.body, r.queue_offset) for r in got] == [(b"late", 6)]
        assert await committed(h, q) == 7  # close committed the last one
        # The stream's span ended with it, at close.
        (stream,) = [s for s in named(spans.get_finished_spans(), FETCH_STREAM) if s.kind is SERVER]
        assert stream.context is not None and stream.context.span_id == parent


@async_test
async def test_a_carried_commit_refused_as_stale_adopts_the_reset(
    tmp_path: Path, meta_config: MetaConfig, spans: InMemorySpanExporter
) -> None:
    async with cluster(tmp_path, meta_config) as h:
        q = MessageQueue(TOPIC, "broker-b", 1)
        for i in range(5):
            await h.send(q.broker_name, q.queue_id, b"m%d" % i)
        consumer = LitePullConsumer(
            h.services[0].address, config=config(pull_batch_size=1, pull_threshold_for_queue=1)
        )
        async with consumer:
            await consumer.assign([q])
            assert [r.queue_offset for r in await consumer.poll(timeout_ms=10_000)] == [0]
            await consumer.commit()
            # To the end of the queue (-1: its max offset), after the consumer
            # learned its epoch; offset 1 was fetched before it. Assign mode: no
            # session, so no consumer is told (the offline path).
            outcome = await ops.reset_offset_by_time(h.meta, "LG", TOPIC, -1)
            assert not outcome.failed and outcome.acks is None
            assert {(o.queue.broker_name, o.queue.queue_id, o.offset) for o in outcome.offsets} >= {
                (q.broker_name, q.queue_id, 5)
            }
            assert [r.queue_offset for r in await consumer.poll(timeout_ms=10_000)] == [1]
            spans.clear()
            await consumer.commit()  # carried, refused as stale: the reset is adopted
            assert not named(spans.get_finished_spans(), UPDATE)
            assert consumer.position(q) == 5 and await committed(h, q) == 5
            assert await consumer.poll(timeout_ms=300) == []
            await h.send(q.broker_name, q.queue_id, b"late")
            got = await consumer.poll(timeout_ms=10_000)
            assert [(r.body, r.queue_offset) for r in got] == [(b"late", 5)]
        assert await committed(h, q) == 6


@async_test
async def test_a_commit_whose_read_is_sought_before_its_fetch_goes_is_stored_on_its_own(
    tmp_path: Path, meta_config: MetaConfig, spans: InMemorySpanExporter
) -> None:
    async with cluster(tmp_path, meta_config) as h:
        q = MessageQueue(TOPIC, "broker-a", 2)
        for i in range(4):
            await h.send(q.broker_name, q.queue_id, b"m%d" % i)
        consumer = LitePullConsumer(
            h.services[0].address, config=config(pull_batch_size=1, pull_threshold_for_queue=1)
        )
        async with consumer:
            await consumer.assign([q])
            assert [r.queue_offset for r in await consumer.poll(timeout_ms=10_000)] == [0]

            async def next_one_buffered() -> bool:
                return consumer._reads[q].count == 1

            await eventually(next_one_buffered)
            spans.clear()
            # Runs at the first turn the test yields, before the fetcher's.
            asyncio.get_running_loop().call_soon(consumer.seek, q, 0)
            # Buffered: the poll returns without yielding, and the commit hands its
            # offset to the next fetch, which does not go (the read is a new one).
            assert [r.queue_offset for r in await consumer.poll(timeout_ms=0)] == [1]
            await consumer.commit()
            assert await committed(h, q) == 2  # what poll had returned at commit()
            # Stored on its own: one UpdateConsumerOffset served.
            served = [s for s in named(spans.get_finished_spans(), UPDATE) if s.kind is SERVER]
            assert len(served) == 1
            assert [r.queue_offset for r in await consumer.poll(timeout_ms=10_000)] == [0]
