"""A small OTLP/gRPC receiver on loopback: what a collector gets from Basalt.

Built on the ``opentelemetry-proto`` service stubs: a ``grpc.aio`` server on
port 0 of 127.0.0.1 serving ``TraceService/Export`` (every span kept, with the
``service.name`` of its resource) and ``MetricsService/Export`` (answered and
counted, so that processes exporting both signals to one endpoint see no
errors). Processes reach it with ``OTEL_EXPORTER_OTLP_ENDPOINT=`` its
:attr:`OtlpReceiver.endpoint`. The end-to-end trace tests assert on what it
collected; ``benchmarks/otel_overhead.py`` exports to it.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2 as metrics_pb
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc as metrics_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as trace_pb
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as trace_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

_Context = grpc.aio.ServicerContext[Any, Any]

#: The cap on starting and stopping the receiver's server.
STOP_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class ReceivedSpan:
    """One exported span: ids as lower-case hex (W3C spelling), links as
    ``(trace_id, span_id)`` pairs, attributes with their values as strings."""

    service: str
    instance: str
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    links: tuple[tuple[str, str], ...]
    attributes: dict[str, str]


def _text(value: AnyValue) -> str:
    kind = value.WhichOneof("value")
    return "" if kind is None else str(getattr(value, kind))


def _attributes(pairs: Iterable[KeyValue]) -> dict[str, str]:
    return {kv.key: _text(kv.value) for kv in pairs}


class _Traces(trace_grpc.TraceServiceServicer):
    def __init__(self, into: list[ReceivedSpan]) -> None:
        self._into = into

    async def Export(
        self,
        request: trace_pb.ExportTraceServiceRequest,
        context: _Context,
    ) -> trace_pb.ExportTraceServiceResponse:
        for resource_spans in request.resource_spans:
            resource = _attributes(resource_spans.resource.attributes)
            service = resource.get("service.name", "")
            instance = resource.get("service.instance.id", "")
            for scope_spans in resource_spans.scope_spans:
                for s in scope_spans.spans:
                    self._into.append(
                        ReceivedSpan(
                            service=service,
                            instance=instance,
                            name=s.name,
                            trace_id=s.trace_id.hex(),
                            span_id=s.span_id.hex(),
                            parent_span_id=s.parent_span_id.hex(),
                            links=tuple((lk.trace_id.hex(), lk.span_id.hex()) for lk in s.links),
                            attributes=_attributes(s.attributes),
                        )
                    )
        return trace_pb.ExportTraceServiceResponse()


class _Metrics(metrics_grpc.MetricsServiceServicer):
    def __init__(self, receiver: OtlpReceiver) -> None:
        self._receiver = receiver

    async def Export(
        self,
        request: metrics_pb.ExportMetricsServiceRequest,
        context: _Context,
    ) -> metrics_pb.ExportMetricsServiceResponse:
        self._receiver.metric_exports += 1
        return metrics_pb.ExportMetricsServiceResponse()


class OtlpReceiver:
    """What :func:`otlp_receiver` serves. ``spans``: every span received so
    far, in arrival order (appended by the receiver's thread; a reader sees a
    prefix that only grows)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.spans: list[ReceivedSpan] = []
        self.metric_exports = 0

    @property
    def endpoint(self) -> str:
        """The URL for ``OTEL_EXPORTER_OTLP_ENDPOINT`` (plain-text gRPC)."""
        return f"http://127.0.0.1:{self.port}"

    def named(self, name: str) -> list[ReceivedSpan]:
        return [s for s in list(self.spans) if s.name == name]

    def in_trace(self, trace_id: str) -> list[ReceivedSpan]:
        return [s for s in list(self.spans) if s.trace_id == trace_id]


@contextlib.contextmanager
def otlp_receiver() -> Iterator[OtlpReceiver]:
    """Serve OTLP/gRPC on a free loopback port for the block's duration, from
    a thread with an event loop of its own: the receiver answers whatever the
    caller does meanwhile (blocks on a subprocess, runs its own loop)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="otlp-receiver", daemon=True)
    thread.start()

    async def start() -> tuple[grpc.aio.Server, OtlpReceiver]:
        # A plain grpc.aio server, without Basalt's interceptors: the receiver
        # is the collector, not a traced service.
        server = grpc.aio.server()
        receiver = OtlpReceiver(server.add_insecure_port("127.0.0.1:0"))
        trace_grpc.add_TraceServiceServicer_to_server(_Traces(receiver.spans), server)  # type: ignore[no-untyped-call]
        metrics_grpc.add_MetricsServiceServicer_to_server(_Metrics(receiver), server)  # type: ignore[no-untyped-call]
        await server.start()
        return server, receiver

    try:
        server, receiver = asyncio.run_coroutine_threadsafe(start(), loop).result(STOP_TIMEOUT_S)
        try:
            yield receiver
        finally:
            asyncio.run_coroutine_threadsafe(server.stop(grace=None), loop).result(STOP_TIMEOUT_S)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(STOP_TIMEOUT_S)
        loop.close()
