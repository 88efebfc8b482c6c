"""Spans across real gRPC servers: a call's context travels in its metadata.

A consumer's Pull reaches the pull-service, which calls the store-node's
GetMessage: four spans (client and server at each hop), one trace.
"""

from __future__ import annotations

from pathlib import Path

from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from basalt.common import dial
from basalt.services.meta import MetaConfig
from basalt.v1 import common_pb2 as pb
from basalt.v1 import pull_service_pb2_grpc as ps_grpc
from tests.support.aio import async_test
from tests.support.nodes import cluster
from tests.support.rpc import bodies, pull_request


@async_test
async def test_a_pull_through_the_pull_service_is_one_trace_of_client_and_server_spans(
    tmp_path: Path, meta_config: MetaConfig, spans: InMemorySpanExporter
) -> None:
    async with cluster(tmp_path, meta_config) as h:
        await h.send("broker-a", 0, b"traced")
        spans.clear()  # the set-up's own calls
        async with dial.channel(h.services[0].address) as channel:
            with trace.get_tracer("test").start_as_current_span("consume") as root:
                r = await ps_grpc.PullServiceStub(channel).Pull(pull_request("broker-a", 0))
        assert r.status == pb.PULL_STATUS_FOUND and bodies(r) == [b"traced"]
    trace_id = root.get_span_context().trace_id
    ours = [s for s in spans.get_finished_spans() if s.context.trace_id == trace_id]
    kinds = {(s.name, s.kind) for s in ours}
    assert {
        ("/basalt.v1.PullService/Pull", SpanKind.CLIENT),
        ("/basalt.v1.PullService/Pull", SpanKind.SERVER),
        ("/basalt.v1.StoreNode/GetMessage", SpanKind.CLIENT),
        ("/basalt.v1.StoreNode/GetMessage", SpanKind.SERVER),
    } <= kinds, kinds
    # Each hop's server span is the child of its client span.
    by_id = {s.context.span_id: s for s in ours}
    for s in ours:
        if s.kind == SpanKind.SERVER:
            assert s.parent is not None and s.parent.is_remote
            parent = by_id[s.parent.span_id]
            assert (parent.name, parent.kind) == (s.name, SpanKind.CLIENT)
