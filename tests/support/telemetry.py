"""Finished spans in memory, for tests of what Basalt traces.

OpenTelemetry's global TracerProvider can be set once per process: the first
test that asks for :func:`spans` sets an SDK provider with an
:class:`InMemorySpanExporter`, and every test that asks gets that exporter
emptied. Basalt's code uses only the API, whose global proxies bind to this
provider. Its sampler samples (parent-based, always on) only during a test
that asked for :func:`spans`: the provider outlives that test, and the tests
after it must see Basalt untraced (no ``traceparent`` in their messages, no
``trace_context`` in their commands), as without any provider.

Servers made by ``basalt.services.process.grpc_server`` and channels made by
``basalt.common.dial.channel`` carry OpenTelemetry's gRPC
interceptors always, so W3C trace context rides gRPC metadata between the
in-process services as it does between processes.

Metrics likewise: :func:`metric_reader` installs one SDK MeterProvider with an
:class:`InMemoryMetricReader` the first time it is called and returns that
reader ever after. Tests never assert on absolute totals another test could
bump: they use topics of their own, or compare before and after.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pytest
from opentelemetry import metrics, trace
from opentelemetry.context import Context
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    ParentBased,
    Sampler,
    SamplingResult,
)
from opentelemetry.trace import Link, SpanKind
from opentelemetry.trace.span import TraceState
from opentelemetry.util.types import Attributes


class _Switch(Sampler):
    """Parent-based always-on while :attr:`on`, else always off."""

    def __init__(self) -> None:
        self.on = False
        self._sampling = ParentBased(ALWAYS_ON)

    def should_sample(
        self,
        parent_context: Context | None,
        trace_id: int,
        name: str,
        kind: SpanKind | None = None,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        trace_state: TraceState | None = None,
    ) -> SamplingResult:
        sampler = self._sampling if self.on else ALWAYS_OFF
        return sampler.should_sample(
            parent_context, trace_id, name, kind, attributes, links, trace_state
        )

    def get_description(self) -> str:
        return "TestSwitch"


_switch = _Switch()
_exporter: InMemorySpanExporter | None = None


def _installed_exporter() -> InMemorySpanExporter:
    """The exporter of the provider this module installed (installing it the
    first time). Fails if another provider was installed first: spans would
    go there and every assertion here would see none."""
    global _exporter
    if _exporter is None:
        exporter = InMemorySpanExporter()
        provider = TracerProvider(sampler=_switch)
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
        assert trace.get_tracer_provider() is provider, "another TracerProvider was set first"
        _exporter = exporter
    return _exporter


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """The in-memory exporter, empty at the start of the test."""
    exporter = _installed_exporter()
    exporter.clear()
    _switch.on = True
    try:
        yield exporter
    finally:
        _switch.on = False
        exporter.clear()


def named(finished: Sequence[ReadableSpan], name: str) -> list[ReadableSpan]:
    """The spans called ``name``, in the order they ended."""
    return [s for s in finished if s.name == name]


def trace_id(span: ReadableSpan) -> int:
    """``span``'s trace id (a finished span always has a context)."""
    assert span.context is not None
    return span.context.trace_id


def span_id(span: ReadableSpan) -> int:
    """``span``'s span id."""
    assert span.context is not None
    return span.context.span_id


class Metrics:
    """The process's in-memory metric reader, read by metric name and attributes."""

    def __init__(self, reader: InMemoryMetricReader) -> None:
        self.reader = reader

    def points(self, name: str, **where: Any) -> list[tuple[Mapping[str, Any], Any]]:
        """(attributes, data point) of metric ``name`` whose attributes include
        ``where`` (dotted keys passed as ``**{"messaging.destination.name": t}``),
        collected now."""
        data = self.reader.get_metrics_data()
        out: list[tuple[Mapping[str, Any], Any]] = []
        if data is None:
            return out
        for rm in data.resource_metrics:
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    if metric.name != name:
                        continue
                    for point in metric.data.data_points:
                        attrs = dict(point.attributes or {})
                        if all(attrs.get(k) == v for k, v in where.items()):
                            out.append((attrs, point))
        return out

    def value(self, name: str, **where: Any) -> float | None:
        """The one matching point's value (a sum or gauge), or None if none matches."""
        points = self.points(name, **where)
        assert len(points) <= 1, points
        return points[0][1].value if points else None


@functools.cache
def metric_reader() -> Metrics:
    """Install the SDK MeterProvider (once per process) and return its reader.
    Fails if another provider was installed first."""
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    metrics.set_meter_provider(provider)
    assert metrics.get_meter_provider() is provider, "another MeterProvider was set first"
    return Metrics(reader)
