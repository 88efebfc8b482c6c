"""basalt.common.tracing: the carriers of a trace in message properties and in
command maps, on an SDK provider (:mod:`tests.support.telemetry`)."""

from __future__ import annotations

import subprocess
import sys

from opentelemetry import baggage, context, trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from basalt.common.message import decode_properties, encode_properties
from basalt.common.tracing import (
    PROPERTY_TRACEPARENT,
    PROPERTY_TRACESTATE,
    extracted_context,
    inject_context,
    message_link,
    message_links,
    message_trace_properties,
)
from tests.support.timeouts import SUBPROCESS_TIMEOUT_S

_tracer = trace.get_tracer("tests.common.test_tracing")


def test_a_recording_span_travels_in_properties_and_comes_back_as_a_link(
    spans: InMemorySpanExporter,
) -> None:
    state = trace.TraceState([("vendor", "v1")])
    parent = trace.NonRecordingSpan(
        trace.SpanContext(0xABC, 0xDEF, is_remote=True, trace_flags=trace.TraceFlags(1),
                          trace_state=state)
    )  # fmt: skip
    with trace.use_span(parent), _tracer.start_as_current_span("send") as span:
        carried = message_trace_properties()
    assert set(carried) == {PROPERTY_TRACEPARENT, PROPERTY_TRACESTATE}
    assert carried[PROPERTY_TRACESTATE] == "vendor=v1"
    # Through RocketMQ's properties block and back, beside system properties.
    stored = decode_properties(encode_properties({"TAGS": "a", "UNIQ_KEY": "U", **carried}))
    link = message_link(stored)
    assert link is not None
    assert link.context.trace_id == 0xABC == span.get_span_context().trace_id
    assert link.context.span_id == span.get_span_context().span_id
    assert link.context.trace_state == state
    # A batch's messages carry one span: one link; untraced messages none.
    assert [x.context for x in message_links([stored, stored, {"TAGS": "a"}])] == [link.context]


def test_no_recording_span_no_property_and_a_bad_traceparent_no_link(
    spans: InMemorySpanExporter,
) -> None:
    assert message_trace_properties() == {}  # no span at all
    unsampled = trace.NonRecordingSpan(
        trace.SpanContext(0x1, 0x2, is_remote=True, trace_flags=trace.TraceFlags(0))
    )
    with trace.use_span(unsampled), _tracer.start_as_current_span("send"):
        assert message_trace_properties() == {}
    for bad in ("", "junk", "00-" + "0" * 32 + "-" + "0" * 16 + "-01"):
        assert message_link({PROPERTY_TRACEPARENT: bad}) is None
    assert message_links([{}, {PROPERTY_TRACEPARENT: "junk"}]) == []


def test_a_command_map_carries_context_and_baggage(spans: InMemorySpanExporter) -> None:
    carrier: dict[str, str] = {}
    with _tracer.start_as_current_span("deliver") as span:
        token = context.attach(baggage.set_baggage("reset", "r1"))
        try:
            inject_context(carrier)
        finally:
            context.detach(token)
    got = extracted_context(carrier)
    assert trace.get_current_span(got).get_span_context().span_id == (
        span.get_span_context().span_id
    )
    assert baggage.get_baggage("reset", got) == "r1"
    # Nothing carried: the empty context, so a span in it is a root.
    empty = extracted_context({})
    assert not trace.get_current_span(empty).get_span_context().is_valid


def test_tracing_is_installed_once_an_application_sets_a_tracer_provider() -> None:
    # In a fresh interpreter: this test process may have installed its own already.
    script = (
        "from opentelemetry import trace\n"
        "from opentelemetry.sdk.trace import TracerProvider\n"
        "from basalt.common.tracing import tracing_installed\n"
        "before = tracing_installed()\n"
        "trace.set_tracer_provider(TracerProvider())\n"
        "print(before, tracing_installed())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
        check=True,
    )
    assert done.stdout.split() == ["False", "True"]
