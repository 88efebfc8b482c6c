"""One resetOffsetByTime is one trace: the operator's call → the admin service →
each store-node's ResetOffset → the pull-service's delivery → the consumer's
handling of the command and its ack, over real etcd, store-nodes, a
pull-service, the admin service and a PushConsumer, with gRPC aio interceptors
carrying the context in metadata and the session command carrying it on."""

from __future__ import annotations

from pathlib import Path

from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from basalt.client import (
    ConsumeFromWhere,
    ConsumeStatus,
    MessageQueue,
    PushConsumer,
    PushConsumerConfig,
)
from basalt.common import dial
from basalt.common.message import MessageRecord
from basalt.services.meta import MetaConfig
from basalt.v1 import admin_pb2 as adm
from basalt.v1 import admin_pb2_grpc as adm_grpc
from basalt.v1 import pull_service_pb2 as ps
from tests.support.aio import async_test
from tests.support.nodes import TOPIC, admin_server, cluster
from tests.support.polling import eventually
from tests.support.telemetry import named, span_id, trace_id

_operator = trace.get_tracer("tests.admin.test_reset_trace")


def _consume(messages: list[MessageRecord], queue: MessageQueue) -> ConsumeStatus:
    return ConsumeStatus.CONSUME_SUCCESS


@async_test
async def test_a_reset_by_time_is_one_trace_from_admin_to_each_consumer_ack(
    tmp_path: Path, meta_config: MetaConfig, spans: InMemorySpanExporter
) -> None:
    async with (
        cluster(tmp_path, meta_config, heartbeat_interval_ms=500) as h,
        admin_server(meta_config) as admin_address,
        dial.channel(admin_address) as channel,
    ):
        for q in range(4):
            await h.send("broker-a", q, b"m")
        config = PushConsumerConfig(
            consumer_group="RG",
            client_id="C1",
            consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
            broker_suspend_max_time_ms=500,
        )
        consumer = PushConsumer(h.services[0].address, config=config, listener=_consume)
        consumer.subscribe(TOPIC)
        async with consumer:
            await eventually(lambda: len(consumer.assignment()) == 8, what="all queues owned")
            with _operator.start_as_current_span("operator: resetOffsetByTime") as root:
                reply = await adm_grpc.AdminStub(channel).ResetOffsetByTime(
                    adm.ResetOffsetByTimeRequest(
                        group="RG", topic=TOPIC, timestamp_ms=0, force=True
                    )
                )
            assert [(a.client_id, a.outcome) for a in reply.consumer_acks] == [
                ("C1", ps.COMMAND_OUTCOME_OK)
            ]
            # The consumer's span ends once its ack is written, which may be
            # just after the pull-service read it.
            await eventually(
                lambda: named(spans.get_finished_spans(), "handle reset_offset"),
                what="the consumer's handling span",
            )

    the_trace = root.get_span_context().trace_id
    finished = [s for s in spans.get_finished_spans() if trace_id(s) == the_trace]
    by_id = {span_id(s): s for s in finished}

    def only(name: str) -> int:
        (span,) = named(finished, name)
        return span_id(span)

    def parent(child: int) -> int:
        span = by_id[child]
        assert span.parent is not None, span.name
        return span.parent.span_id

    def ancestors(child: int) -> list[str]:
        """Names from ``child`` up to the trace's root, all in the trace."""
        names = [by_id[child].name]
        while by_id[child].parent is not None:
            child = parent(child)
            names.append(by_id[child].name)
        return names

    # The admin's own span, under its RPC's server span, under the operator's.
    reset = only("resetOffsetByTime")
    assert ancestors(reset) == [
        "resetOffsetByTime",
        "/basalt.v1.Admin/ResetOffsetByTime",  # the admin's server span
        "/basalt.v1.Admin/ResetOffsetByTime",  # the operator's client span
        "operator: resetOffsetByTime",
    ]
    # One child per store-node, each reaching that store-node's RPC and store work.
    for broker in ("broker-a", "broker-b"):
        call = only(f"ResetOffset {broker}")
        assert parent(call) == reset
    store_work = named(finished, "reset offsets by time")
    assert len(store_work) == 2
    for work in store_work:
        path = ancestors(span_id(work))
        assert path[:3] == [
            "reset offsets by time",
            "/basalt.v1.StoreNode/ResetOffset",
            "/basalt.v1.StoreNode/ResetOffset",
        ]
        assert path[3] in ("ResetOffset broker-a", "ResetOffset broker-b")
    # The notification: admin → pull-service → delivery → the consumer's handling.
    handle = only("handle reset_offset")
    assert by_id[handle].kind is trace.SpanKind.CONSUMER
    assert ancestors(handle)[:6] == [
        "handle reset_offset",
        "deliver reset_offset",
        "/basalt.v1.PullService/NotifyConsumers",
        "/basalt.v1.PullService/NotifyConsumers",
        "NotifyConsumers RG",
        "resetOffsetByTime",
    ]
    assert (by_id[handle].attributes or {})["messaging.client.id"] == "C1"
    # The pulls the reset restarted run untraced, not as spans of the reset's trace.
    assert not [s for s in finished if s.name.startswith("/basalt.v1.PullService/Pull")]
