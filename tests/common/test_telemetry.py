"""common.telemetry: log lines that carry their span, exporters chosen by the
environment, the sampler, and the process metrics as Prometheus names them."""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import re
import subprocess
import sys
from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.trace.export import ConsoleSpanExporter
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from prometheus_client import CollectorRegistry, generate_latest

from basalt.common.telemetry import (
    TelemetryConfig,
    add_process_metrics,
    log_handler,
    otlp_metric_readers,
    root_draw_ratio,
    span_exporters,
    tracer_provider,
)
from basalt.services import process
from tests.support.timeouts import SUBPROCESS_TIMEOUT_S

ENDPOINT = "http://127.0.0.1:4317"


def logged(log_format: str) -> tuple[logging.Logger, io.StringIO]:
    """A logger of its own writing ``log_format`` lines to a buffer."""
    out = io.StringIO()
    logger = logging.getLogger(f"basalt.test.telemetry.{log_format}")
    logger.handlers[:] = [log_handler(log_format, out)]
    logger.propagate = False
    logger.setLevel(logging.INFO)
    return logger, out


def ids(span: trace.Span) -> tuple[str, str]:
    context = span.get_span_context()
    return trace.format_trace_id(context.trace_id), trace.format_span_id(context.span_id)


def test_a_text_line_inside_a_span_carries_its_ids_and_one_outside_does_not(
    spans: InMemorySpanExporter,
) -> None:
    logger, out = logged("text")
    logger.info("outside")
    with trace.get_tracer("test").start_as_current_span("work") as span:
        logger.info("inside")
    outside, inside = out.getvalue().splitlines()
    assert re.fullmatch(r"\S+ \S+ INFO basalt\.test\.telemetry\.text outside", outside)
    trace_id, span_id = ids(span)
    assert re.fullmatch(r"[0-9a-f]{32}", trace_id) and re.fullmatch(r"[0-9a-f]{16}", span_id)
    assert inside.endswith(f"INFO basalt.test.telemetry.text [{trace_id} {span_id}] inside")


def test_a_json_line_is_one_object_with_the_ids_inside_a_span(
    spans: InMemorySpanExporter,
) -> None:
    logger, out = logged("json")
    logger.info("outside %d", 1)
    with trace.get_tracer("test").start_as_current_span("work") as span:
        try:
            raise ValueError("boom")
        except ValueError:
            logger.exception("inside")
    outside, inside = (json.loads(line) for line in out.getvalue().splitlines())
    assert outside.keys() == {"time", "level", "logger", "message"}
    assert outside["message"] == "outside 1" and outside["level"] == "INFO"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", outside["time"])
    assert (inside["trace_id"], inside["span_id"]) == ids(span)
    assert inside["level"] == "ERROR" and "ValueError: boom" in inside["exc_info"]


def test_a_bad_log_format_or_port_is_refused() -> None:
    with pytest.raises(ValueError, match="log_format must be one of"):
        TelemetryConfig(service_name="s", log_format="xml")
    with pytest.raises(ValueError, match="metrics_port must be None or a port"):
        TelemetryConfig(service_name="s", metrics_port=70_000)
    with pytest.raises(ValueError):
        log_handler("xml")


@pytest.fixture
def no_otel_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """No ``OTEL_*`` variable from the caller's environment."""
    for name in [n for n in os.environ if n.startswith("OTEL_")]:
        monkeypatch.delenv(name)
    yield monkeypatch


def test_nothing_is_exported_unless_the_environment_names_an_otlp_endpoint(
    no_otel_env: pytest.MonkeyPatch,
) -> None:
    assert span_exporters() == []
    assert otlp_metric_readers() == []
    no_otel_env.setenv("OTEL_TRACES_EXPORTER", "otlp")  # the exporter, but nowhere to send
    assert span_exporters() == []
    no_otel_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", ENDPOINT)
    (exporter,) = span_exporters()
    assert isinstance(exporter, OTLPSpanExporter)
    exporter.shutdown()
    (reader,) = otlp_metric_readers()
    assert isinstance(reader, PeriodicExportingMetricReader)
    reader.shutdown()
    no_otel_env.setenv("OTEL_TRACES_EXPORTER", "none")
    no_otel_env.setenv("OTEL_METRICS_EXPORTER", "none")
    assert span_exporters() == [] and otlp_metric_readers() == []


def test_the_signal_endpoint_and_the_console_exporter_are_honoured(
    no_otel_env: pytest.MonkeyPatch,
) -> None:
    no_otel_env.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", ENDPOINT)
    no_otel_env.setenv("OTEL_TRACES_EXPORTER", "console,otlp")
    console, otlp = span_exporters()
    assert isinstance(console, ConsoleSpanExporter) and isinstance(otlp, OTLPSpanExporter)
    otlp.shutdown()
    assert otlp_metric_readers() == []  # a traces endpoint is not a metrics one
    no_otel_env.setenv("OTEL_TRACES_EXPORTER", "zipkin")
    with pytest.raises(ValueError, match="zipkin"):
        span_exporters()


def test_the_sampler_comes_from_the_environment_parent_based_always_on_by_default(
    no_otel_env: pytest.MonkeyPatch,
) -> None:
    config = TelemetryConfig(service_name="basalt-test", service_instance_id="broker-a")
    provider = tracer_provider(config)
    assert isinstance(provider.sampler, ParentBased)
    assert "AlwaysOnSampler" in provider.sampler.get_description()
    assert provider.resource.attributes["service.name"] == "basalt-test"
    assert provider.resource.attributes["service.instance.id"] == "broker-a"
    no_otel_env.setenv("OTEL_TRACES_SAMPLER", "traceidratio")
    no_otel_env.setenv("OTEL_TRACES_SAMPLER_ARG", "0.25")
    sampled = tracer_provider(config).sampler
    assert isinstance(sampled, TraceIdRatioBased) and sampled.rate == 0.25


def test_a_service_samples_one_percent_of_the_traces_it_starts_unless_the_env_says(
    no_otel_env: pytest.MonkeyPatch,
) -> None:
    parser = argparse.ArgumentParser()
    process.add_common_arguments(parser, "basalt-store-node")
    config = process.telemetry_config(parser.parse_args([]))
    assert config.root_sampling_ratio == process.SERVICE_ROOT_SAMPLING_RATIO == 0.01
    assert root_draw_ratio(config) == 0.01
    # Parent-based: a call arriving sampled is recorded; the roots were drawn at
    # the ratio where the call entered (the interceptors), so the sampler keeps them.
    sampler = tracer_provider(config).sampler
    assert isinstance(sampler, ParentBased)
    assert "AlwaysOnSampler" in sampler.get_description()
    no_otel_env.setenv("OTEL_TRACES_SAMPLER", "traceidratio")
    assert root_draw_ratio(config) is None  # the environment's sampler decides alone
    assert isinstance(tracer_provider(config).sampler, TraceIdRatioBased)
    with pytest.raises(ValueError, match="root_sampling_ratio"):
        TelemetryConfig(service_name="s", root_sampling_ratio=1.5)


def test_the_process_metrics_render_under_their_prometheus_names() -> None:
    registry = CollectorRegistry()
    provider = MeterProvider(metric_readers=[PrometheusMetricReader(registry=registry)])
    add_process_metrics(provider)
    try:
        text = generate_latest(registry).decode()
    finally:
        provider.shutdown()
    samples = {
        m.group(1): float(m.group(2))
        for m in re.finditer(r"^(\w+)\{[^}]*\} (\S+)$", text, re.MULTILINE)
    }
    assert samples["process_cpu_time_seconds_total"] > 0
    assert samples["process_memory_usage_bytes"] > 1024 * 1024
    assert samples["process_open_file_descriptor_count"] >= 3
    assert 'cpu_mode="user"' in text and 'cpu_mode="system"' in text


def test_setup_is_once_per_process_and_a_second_equal_call_is_a_no_op() -> None:
    # In a child: the set-up owns the process's providers and root logger.
    code = (
        "from basalt.common.telemetry import TelemetryConfig, setup_telemetry\n"
        "config = TelemetryConfig(service_name='basalt-test', metrics_port=0)\n"
        "first = setup_telemetry(config)\n"
        "assert setup_telemetry(TelemetryConfig(service_name='basalt-test', metrics_port=0))"
        " is first\n"
        "try:\n"
        "    setup_telemetry(TelemetryConfig(service_name='other'))\n"
        "except RuntimeError as e:\n"
        "    print('refused', e)\n"
        "print(first.metrics_port > 0, first.metrics_url.startswith('http://127.0.0.1:'))\n"
        "first.shutdown()\n"
        "first.shutdown()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    refused, bound = done.stdout.splitlines()
    assert refused.startswith("refused telemetry is already set up")
    assert bound == "True True"
