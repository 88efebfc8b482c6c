"""Spans made in the test's own process, kept in memory.

OpenTelemetry takes one global tracer provider per process, so the
:func:`spans` fixture installs one the first time a test asks and keeps it
for the session; it records only while a test holds the fixture (spans ended
at other times are dropped, so other tests' spans neither pile up nor leak
into a test's list).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter


class _WhileHeld(SimpleSpanProcessor):
    """Exports an ended span only while :attr:`recording` is set."""

    recording = False

    def on_end(self, span: ReadableSpan) -> None:
        if self.recording:
            super().on_end(span)


_EXPORTER = InMemorySpanExporter()
_PROCESSOR = _WhileHeld(_EXPORTER)
_installed = False


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """The spans ended during the test (``spans.get_finished_spans()``), through
    the process's global tracer provider (an SDK one, installed once)."""
    global _installed
    if not _installed:
        provider = TracerProvider()
        provider.add_span_processor(_PROCESSOR)
        trace.set_tracer_provider(provider)
        _installed = True
    _EXPORTER.clear()
    _PROCESSOR.recording = True
    try:
        yield _EXPORTER
    finally:
        _PROCESSOR.recording = False
        _EXPORTER.clear()
