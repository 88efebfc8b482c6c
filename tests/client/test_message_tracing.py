"""A message carries its trace: the Producer's send span puts ``traceparent`` in
each message's properties, and a PushConsumer's listener call ("process") and
a LitePullConsumer's poll ("receive") link to it; untraced, nothing is added.
Real etcd, store-nodes and a pull-service; spans in memory
(:mod:`tests.support.telemetry`)."""

from __future__ import annotations

import threading
from pathlib import Path

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from basalt.client import (
    ConsumeFromWhere,
    ConsumeStatus,
    LitePullConsumer,
    MessageQueue,
    Producer,
    PushConsumer,
    PushConsumerConfig,
)
from basalt.common.message import Message, MessageRecord
from basalt.common.tracing import PROPERTY_TRACEPARENT, PROPERTY_TRACESTATE
from basalt.services.meta import MetaConfig
from tests.support.aio import async_test
from tests.support.consumers import lite_pull_config
from tests.support.nodes import TOPIC, cluster
from tests.support.polling import eventually
from tests.support.telemetry import named, span_id, trace_id

_test_tracer = trace.get_tracer("tests.client.test_message_tracing")


def _linked(span: ReadableSpan) -> set[tuple[int, int]]:
    """(trace id, span id) of each span ``span`` links to."""
    return {(link.context.trace_id, link.context.span_id) for link in span.links}


def _attribute(span: ReadableSpan, name: str) -> object:
    return (span.attributes or {}).get(name)


def _ids(span: ReadableSpan) -> tuple[int, int]:
    return trace_id(span), span_id(span)


@async_test
async def test_a_push_consumer_call_links_to_the_send_spans_of_its_messages(
    tmp_path: Path, meta_config: MetaConfig, spans: InMemorySpanExporter
) -> None:
    async with cluster(tmp_path, meta_config, heartbeat_interval_ms=500) as h:
        address = h.services[0].address
        seen: list[MessageRecord] = []
        listener_parents: list[int | None] = []
        lock = threading.Lock()

        def listen(messages: list[MessageRecord], queue: MessageQueue) -> ConsumeStatus:
            # Runs on a pool thread: its own span must still be the call's child.
            with _test_tracer.start_as_current_span("user work") as work:
                assert isinstance(work, ReadableSpan) and work.parent is not None
                with lock:
                    seen.extend(messages)
                    listener_parents.append(work.parent.span_id)
            return ConsumeStatus.CONSUME_SUCCESS

        async with Producer(address, group="P") as producer:
            one = await producer.send(Message(TOPIC, b"one", tags="A", keys=["k1"]))
            batch = await producer.send_batch([Message(TOPIC, b"b%d" % i) for i in range(3)])
        sends = named(spans.get_finished_spans(), f"send {TOPIC}")
        (send_one,) = [s for s in sends if _attribute(s, "messaging.message.id") == one.msg_id]
        (send_batch,) = [s for s in sends if _attribute(s, "messaging.batch.message_count") == 3]
        assert send_one.kind is trace.SpanKind.PRODUCER
        assert dict(send_one.attributes or {}) == {
            "messaging.system": "rocketmq",
            "messaging.destination.name": TOPIC,
            "messaging.operation.name": "send",
            "messaging.operation.type": "send",
            "messaging.rocketmq.message.tag": "A",
            "messaging.rocketmq.message.keys": ("k1",),
            "messaging.message.id": one.msg_id,
        }
        assert {r.msg_id for r in batch} and len(batch) == 3

        config = PushConsumerConfig(
            consumer_group="TG",
            client_id="C",
            consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
            broker_suspend_max_time_ms=500,
            consume_message_batch_max_size=4,
        )
        consumer = PushConsumer(address, config=config, listener=listen)
        consumer.subscribe(TOPIC)
        async with consumer:
            await eventually(lambda: len(seen) == 4, what="every message consumed")

    # Each message carries its send span's context, W3C-encoded, and nothing
    # called tracestate (the context has none).
    for record in seen:
        expected = send_one if record.body == b"one" else send_batch
        version, trace_hex, span_hex, flags = record.properties[PROPERTY_TRACEPARENT].split("-")
        assert (int(trace_hex, 16), int(span_hex, 16)) == _ids(expected)
        assert version == "00" and int(flags, 16) & 1  # sampled
        assert PROPERTY_TRACESTATE not in record.properties
        assert record.tags == ("A" if record.body == b"one" else None)
    # One process span per listener call, linked to its messages' send spans,
    # the parent of the listener's own span.
    process = named(spans.get_finished_spans(), f"process {TOPIC}")
    assert process and all(s.kind is trace.SpanKind.CONSUMER for s in process)
    assert set().union(*(_linked(s) for s in process)) == {_ids(send_one), _ids(send_batch)}
    assert sorted(listener_parents) == sorted(span_id(s) for s in process)
    for s in process:
        attributes = s.attributes or {}
        assert attributes["messaging.system"] == "rocketmq"
        assert attributes["messaging.consumer.group.name"] == "TG"
        assert attributes["messaging.destination.name"] == TOPIC
        assert attributes["messaging.batch.message_count"] >= 1  # type: ignore[operator]
        # A link points at the producer's trace; the process span is its own.
        assert all(link.context.trace_id != trace_id(s) for link in s.links)


@async_test
async def test_a_lite_pull_poll_is_a_receive_span_linked_to_the_sends(
    tmp_path: Path, meta_config: MetaConfig, spans: InMemorySpanExporter
) -> None:
    async with cluster(tmp_path, meta_config) as h:
        address = h.services[0].address
        async with Producer(address, group="P") as producer:
            await producer.send_batch([Message(TOPIC, b"m%d" % i) for i in range(5)])
        (send,) = named(spans.get_finished_spans(), f"send {TOPIC}")
        # A message from a client that does not trace: no link, no failure.
        await h.send("broker-a", 0, b"untraced")
        spans.clear()
        async with LitePullConsumer(address, config=lite_pull_config()) as consumer:
            await consumer.assign(await consumer.queues_of(TOPIC))
            got: list[MessageRecord] = []
            while len(got) < 6:
                got += await consumer.poll(timeout_ms=500)
            assert await consumer.poll(timeout_ms=0) == []
    receive = named(spans.get_finished_spans(), f"receive {TOPIC}")
    assert receive and all(s.kind is trace.SpanKind.CONSUMER for s in receive)
    assert set().union(*(_linked(s) for s in receive)) == {_ids(send)}
    assert (
        sum(
            (s.attributes or {})["messaging.batch.message_count"]  # type: ignore[misc]
            for s in receive
        )
        == 6
    )
    # The empty poll made none (its RPCs made gRPC's and the services' spans).
    consumer_spans = [s for s in spans.get_finished_spans() if s.kind is trace.SpanKind.CONSUMER]
    assert consumer_spans == receive


@async_test
async def test_an_untraced_send_adds_no_property_and_makes_no_span(
    tmp_path: Path, meta_config: MetaConfig, spans: InMemorySpanExporter
) -> None:
    """Sampled out (a parent that is not sampled: the parent-based sampler
    follows it): the send span does not record, so nothing is injected."""
    unsampled = trace.NonRecordingSpan(
        trace.SpanContext(
            trace_id=0x1234, span_id=0x5678, is_remote=True, trace_flags=trace.TraceFlags(0)
        )
    )
    async with cluster(tmp_path, meta_config) as h:
        address = h.services[0].address
        async with Producer(address, group="P") as producer:
            with trace.use_span(unsampled):
                await producer.send(Message(TOPIC, b"quiet", properties={"mine": "1"}))
                await producer.send_batch([Message(TOPIC, b"q%d" % i) for i in range(2)])
        assert spans.get_finished_spans() == ()
        async with LitePullConsumer(address, config=lite_pull_config()) as consumer:
            await consumer.assign(await consumer.queues_of(TOPIC))
            got: list[MessageRecord] = []
            while len(got) < 3:
                got += await consumer.poll(timeout_ms=500)
    assert [r.properties.get("mine") for r in got if r.body == b"quiet"] == ["1"]
    assert all(PROPERTY_TRACEPARENT not in r.properties for r in got)
    # The consumer still traces its poll, with nothing to link to.
    receive = named(spans.get_finished_spans(), f"receive {TOPIC}")
    assert receive and all(not s.links for s in receive)
