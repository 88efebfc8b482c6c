"""One process's telemetry: traces, metrics and logs, set up once at its edge.

A process (a service's ``main``, the ``basalt`` command line) calls
:func:`setup_telemetry` once, first thing; everything else in Basalt uses
only the OpenTelemetry *API* (``opentelemetry.trace.get_tracer``,
``opentelemetry.metrics.get_meter``), whose global proxies forward to the
providers installed here. The SDK (``basalt.client``) never calls it: a
library does not install providers, the application does; its channels
still carry the client interceptors (:func:`client_interceptors`, put on every
channel by :func:`basalt.common.dial.channel`), so an
application that installs OpenTelemetry gets spans and propagation.

What :func:`setup_telemetry` installs:

======================  ==========================================================
traces                  an SDK ``TracerProvider``: resource ``service.name`` /
                        ``service.instance.id``; the sampler from
                        ``OTEL_TRACES_SAMPLER`` / ``OTEL_TRACES_SAMPLER_ARG`` (the
                        SDK reads them; ``parentbased_always_on`` when unset);
                        exporters from ``OTEL_TRACES_EXPORTER`` (:func:`span_exporters`:
                        OTLP only when an OTLP endpoint is set; nothing by default)
metrics                 an SDK ``MeterProvider`` when there is a reader: Prometheus
                        text over HTTP on ``metrics_port`` - over HTTPS with
                        the process's certificate when its TLS is on, a client
                        certificate signed by its ``tls_ca_file`` required
                        (:func:`setup_telemetry`) - (served by
                        prometheus_client's daemon thread, so a scrape and the
                        observable callbacks it runs never touch a service's event
                        loop), and OTLP (:func:`metric_readers`); the process's CPU
                        time, resident memory and open descriptors
logs                    the root logger on stderr, ``text`` or ``json``
                        (:func:`configure_logging`); a line logged inside a span
                        carries its ``trace_id`` and ``span_id``
======================  ==========================================================

gRPC spans come from interceptors passed explicitly where servers and
channels are made: Basalt's own :class:`ServerSpans` on servers
(:func:`server_interceptors`; the instrumentation's server interceptor cost
~100 µs a call), Basalt's client interceptors on channels
(:func:`client_interceptors`, which :func:`basalt.common.dial.channel` puts on
every channel): W3C tracecontext travels in gRPC metadata.
``OTEL_SDK_DISABLED=true`` turns the SDK's providers into no-ops (the logs
stay configured).

The OpenTelemetry SDK and exporters are imported by :func:`setup_telemetry`
only: a process that never sets up (an SDK application) imports the API alone.
"""

from __future__ import annotations

import asyncio
import datetime
import inspect
import json
import logging
import os
import random
import sys
import threading
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import grpc
from opentelemetry import context as otel_context
from opentelemetry import metrics, propagate, trace

from basalt.common.settings import (
    between,
    check,
    config_dataclass,
    instance_of,
    non_empty,
    one_of,
    positive,
    setting,
    validate,
)
from basalt.common.tls import TlsConfig
from basalt.common.tls import enabled as tls_enabled

#: A call :meth:`ClientSpans.stream` opens.
C = TypeVar("C")

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import MetricReader
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter

#: The log formats: ``text`` for people, ``json`` (one object per line) for machines.
LOG_FORMATS = ("text", "json")
#: The levels :class:`TelemetryConfig` accepts, as ``logging`` names them.
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
#: One text line: ``time level logger [trace_id span_id] message`` (the ids only
#: inside a span: ``%(trace)s`` is empty otherwise).
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s%(trace)s %(message)s"

#: The meter of the process metrics.
PROCESS_METER = "basalt.process"


def _port_or_none(value: object) -> bool:
    return value is None or (
        isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 65535
    )


@config_dataclass
class TelemetryConfig:
    """How one process reports itself; built at the process edge from its flags."""

    service_name: str = setting(
        check=non_empty,
        doc="The resource's service.name, e.g. basalt-store-node (OTEL_SERVICE_NAME wins).",
    )
    service_instance_id: str = setting(
        default="",
        check=instance_of(str),
        doc="The resource's service.instance.id (a broker or pull-service name); empty: none.",
    )
    metrics_port: int | None = setting(
        default=None,
        check=check("None or a port (0..65535; 0: any free port)", _port_or_none),
        doc="Serve Prometheus text on this port; None: no metrics endpoint.",
    )
    metrics_host: str = setting(
        default="127.0.0.1", check=non_empty, doc="The address the metrics endpoint binds."
    )
    log_format: str = setting(
        default="text", check=one_of(*LOG_FORMATS), doc="text (readable) or json (a line each)."
    )
    log_level: str = setting(
        default="INFO", check=one_of(*LOG_LEVELS), doc="The root logger's level."
    )
    root_sampling_ratio: float = setting(
        default=1.0,
        check=between(0.0, 1.0),
        unit="fraction",  # 0..1, not the percent RocketMQ's *_ratio names carry
        doc="When OTEL_TRACES_SAMPLER is unset: the share of traces this process starts "
        "(a span with no parent) that are sampled; a span whose parent arrives is sampled "
        "as its parent was (parent-based). 1.0 is the SDK's own default "
        "(parentbased_always_on); services start traces at every call, so they sample "
        "fewer (SERVICE_ROOT_SAMPLING_RATIO).",
    )
    flush_timeout_ms: int = setting(
        default=5_000,
        check=positive,
        doc="How long a shutdown waits for spans and metrics to be exported "
        "(an unreachable collector must not hold a service's stop).",
    )

    def __post_init__(self) -> None:
        validate(self, ValueError)


# -- logs ----------------------------------------------------------------------------------


class TraceContextFilter(logging.Filter):
    """Puts the current span's ids on every record it sees, as ``trace_id`` and
    ``span_id`` (lowercase hex, W3C's widths), or ``""`` outside a span. On a
    handler it sees every record the handler emits; it never drops one."""

    def filter(self, record: logging.LogRecord) -> bool:
        context = trace.get_current_span().get_span_context()
        if context.is_valid:
            record.trace_id = trace.format_trace_id(context.trace_id)
            record.span_id = trace.format_span_id(context.span_id)
        else:
            record.trace_id = record.span_id = ""
        return True


class TextFormatter(logging.Formatter):
    """:data:`TEXT_FORMAT`: the ids (from :class:`TraceContextFilter`) in brackets
    after the logger's name when the line was logged inside a span."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        trace_id = getattr(record, "trace_id", "")
        record.trace = f" [{trace_id} {getattr(record, 'span_id', '')}]" if trace_id else ""
        return super().format(record)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``time`` (UTC, ISO 8601, milliseconds), ``level``,
    ``logger``, ``message``; ``trace_id`` and ``span_id`` inside a span;
    ``exc_info`` and ``stack_info`` (formatted text) when the record has them."""

    def format(self, record: logging.LogRecord) -> str:
        when = datetime.datetime.fromtimestamp(record.created, datetime.UTC)
        line: dict[str, str] = {
            "time": when.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        trace_id = getattr(record, "trace_id", "")
        if trace_id:
            line["trace_id"] = trace_id
            line["span_id"] = getattr(record, "span_id", "")
        if record.exc_info:
            line["exc_info"] = self.formatException(record.exc_info)
        if record.stack_info:
            line["stack_info"] = self.formatStack(record.stack_info)
        return json.dumps(line, ensure_ascii=False)


def log_handler(log_format: str, stream: Any = None) -> logging.Handler:
    """A handler on ``stream`` (default: stderr) writing ``log_format``
    (:data:`LOG_FORMATS`) lines, each with the trace ids of its span."""
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log_format must be one of {LOG_FORMATS}, got {log_format!r}")
    handler = logging.StreamHandler(sys.stderr if stream is None else stream)
    handler.addFilter(TraceContextFilter())
    handler.setFormatter(TextFormatter() if log_format == "text" else JsonFormatter())
    return handler


def configure_logging(log_format: str = "text", level: str = "INFO") -> None:
    """The process's one logging set-up: the root logger at ``level`` with one
    :func:`log_handler` on stderr, replacing the root's handlers. For a
    process's edge only (it owns the root logger)."""
    logging.basicConfig(level=level, handlers=[log_handler(log_format)], force=True)


# -- gRPC ----------------------------------------------------------------------------------


_TRACE_KEYS = frozenset({"traceparent", "tracestate"})

#: Set by :func:`setup_telemetry` when the process samples the traces it starts
#: at a ratio below 1 (a service's default): a call that arrives with no trace
#: context, and a call made outside any trace, get no span at all unless a draw
#: at this ratio keeps it (the sampler would drop it anyway: what is saved is
#: making the unsampled span, ~30 µs of a ~600 µs call). None: every call gets
#: its span and the sampler decides.
_root_ratio: float | None = None


def _untraced_root() -> bool:
    """Whether a call starting a trace here is left without a span (see _root_ratio)."""
    ratio = _root_ratio
    return ratio is not None and random.random() >= ratio


#: A method handler's four kinds: (its behavior's attribute, the factory that
#: makes one, whether its answers are streamed).
_HANDLER_KINDS = (
    ("unary_unary", grpc.unary_unary_rpc_method_handler, False),
    ("unary_stream", grpc.unary_stream_rpc_method_handler, True),
    ("stream_unary", grpc.stream_unary_rpc_method_handler, False),
    ("stream_stream", grpc.stream_stream_rpc_method_handler, True),
)


class ServerSpans(grpc.aio.ServerInterceptor):
    """A SERVER span per call, in the trace the caller's ``traceparent`` metadata
    names (a root span, sampled as the sampler says, when it names none): the
    span opentelemetry-instrumentation-grpc's aio interceptor makes (name the
    full method, ``rpc.system``, ``rpc.service``, ``rpc.method``,
    ``rpc.grpc.status_code``), for about a tenth of its cost.

    The instrumentation's interceptor took ~100 µs of a unary call's ~600 µs
    round trip on loopback even when the span was not sampled (it wraps the
    servicer context in a proxy object and parses the peer for every call); a
    store-node's first put into a new queue is one such call. Here an
    unsampled call costs a non-recording span and a context switch, and the
    attributes are built only for a recorded span. A handler of streamed
    answers may be an async generator or a coroutine writing to its context
    (``SendStream``, ``Session``): both are wrapped, the span held until the
    handler returns.
    """

    def __init__(self) -> None:
        # The global proxy tracer: spans reach whatever provider is installed later.
        self._tracer = trace.get_tracer(
            "opentelemetry.instrumentation.grpc",
            schema_url="https://opentelemetry.io/schemas/1.11.0",
        )

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        method: str = handler_call_details.method  # type: ignore[attr-defined]
        carrier = {
            key: value
            for key, value in handler_call_details.invocation_metadata or ()  # type: ignore[attr-defined]
            if key in _TRACE_KEYS
        }
        parent = propagate.extract(carrier) if carrier else None
        if parent is None and _untraced_root():
            return handler  # no span, as the sampler would have it
        for kind, make, streamed_answers in _HANDLER_KINDS:
            behavior = getattr(handler, kind)
            if behavior is not None:
                wrap = self._stream if streamed_answers else self._call
                return make(
                    wrap(behavior, method, parent),
                    request_deserializer=handler.request_deserializer,
                    response_serializer=handler.response_serializer,
                )
        return handler

    def _call(self, behavior: Any, method: str, parent: Any) -> Any:
        tracer = self._tracer

        async def call(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            # start_span and attach rather than start_as_current_span: its context
            # manager alone cost ~20 µs a call.
            span = tracer.start_span(method, context=parent, kind=trace.SpanKind.SERVER)
            token = otel_context.attach(trace.set_span_in_context(span, parent))
            error: BaseException | None = None
            try:
                return await behavior(request, context)
            except BaseException as e:
                error = e
                raise
            finally:
                otel_context.detach(token)
                _end_rpc_span(span, method, context, error)

        return call

    def _stream(self, behavior: Any, method: str, parent: Any) -> Any:
        if not inspect.isasyncgenfunction(behavior):
            return self._call(behavior, method, parent)
        tracer = self._tracer

        async def answers(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            span = tracer.start_span(method, context=parent, kind=trace.SpanKind.SERVER)
            error: BaseException | None = None
            try:
                with trace.use_span(span, end_on_exit=False, record_exception=False):
                    async for answer in behavior(request, context):
                        yield answer
            except BaseException as e:
                error = e
                raise
            finally:
                _end_rpc_span(span, method, context, error)

        return answers


def _end_rpc_span(
    span: trace.Span,
    method: str,
    context: grpc.aio.ServicerContext[Any, Any],
    error: BaseException | None,
) -> None:
    """End a call's span: with the ``rpc.*`` attributes and the status (``error``:
    what the handler raised, if anything) when it is recorded."""
    if not span.is_recording():
        span.end()
        return
    service, _, name = method.lstrip("/").partition("/")
    span.set_attribute("rpc.system", "grpc")
    span.set_attribute("rpc.service", service)
    span.set_attribute("rpc.method", name)
    code = context.code()
    if error is not None and not isinstance(error, asyncio.CancelledError):
        span.record_exception(error)
        if code is None or code == grpc.StatusCode.OK:
            code = grpc.StatusCode.UNKNOWN
    status = grpc.StatusCode.OK if code is None else code
    if isinstance(status, grpc.StatusCode):
        span.set_attribute("rpc.grpc.status_code", status.value[0])
        if status is not grpc.StatusCode.OK:
            span.set_status(trace.Status(trace.StatusCode.ERROR, str(context.details() or "")))
    span.end()


def server_interceptors() -> list[grpc.aio.ServerInterceptor]:
    """The interceptors every grpc.aio server takes: a server span per call
    (:class:`ServerSpans`)."""
    return [ServerSpans()]


class ClientSpans:
    """A CLIENT span per call, its context sent in the call's metadata (W3C
    ``traceparent``): the span opentelemetry-instrumentation-grpc's aio client
    interceptors make (name the full method, ``rpc.*`` attributes when
    recorded), for a fraction of their ~100 µs a call. Nothing is added to a
    call made outside any trace with no SDK installed (the span is invalid)."""

    def __init__(self) -> None:
        self._tracer = trace.get_tracer(
            "opentelemetry.instrumentation.grpc",
            schema_url="https://opentelemetry.io/schemas/1.11.0",
        )

    def _untraced(self) -> bool:
        """A call made outside any trace that the root draw leaves untraced."""
        return not trace.get_current_span().get_span_context().is_valid and _untraced_root()

    def _span(self, name: str) -> tuple[trace.Span, dict[str, str]]:
        """A CLIENT span called ``name``, started, and the metadata carrying its context."""
        span = self._tracer.start_span(name, kind=trace.SpanKind.CLIENT)
        carrier: dict[str, str] = {}
        propagate.inject(carrier, context=trace.set_span_in_context(span))
        return span, carrier

    def _start(self, details: grpc.aio.ClientCallDetails) -> tuple[trace.Span, Any]:
        method: Any = details.method  # str here; bytes in some grpcio versions
        span, carrier = self._span(method.decode() if isinstance(method, bytes) else str(method))
        if not carrier:
            return span, details
        metadata = grpc.aio.Metadata()
        for key, value in details.metadata or ():
            metadata.add(key, value)
        for key, value in carrier.items():
            metadata.add(key, value)
        return span, grpc.aio.ClientCallDetails(
            details.method, details.timeout, metadata, details.credentials, details.wait_for_ready
        )

    async def _unary_answer(self, continuation: Any, details: Any, request: Any) -> Any:
        if self._untraced():
            return await continuation(details, request)
        span, details = self._start(details)
        try:
            call = await continuation(details, request)
            await call  # the answer (or its error) ends the span
        except grpc.aio.AioRpcError as e:
            _end_client_span(span, details.method, e.code(), e.details() or "")
            raise
        except BaseException:
            _end_client_span(span, details.method, grpc.StatusCode.CANCELLED, "")
            raise
        _end_client_span(span, details.method, grpc.StatusCode.OK, "")
        return call

    async def _streamed_answers(self, continuation: Any, details: Any, request: Any) -> Any:
        if self._untraced():
            return await continuation(details, request)
        span, details = self._start(details)
        try:
            call = await continuation(details, request)
        except BaseException:
            _end_client_span(span, details.method, grpc.StatusCode.UNKNOWN, "")
            raise
        _end_span_with(span, details.method, call)
        return call

    def stream(self, method: str, open_call: Callable[[Sequence[tuple[str, str]]], C]) -> C:
        """``open_call(metadata)``, a bidirectional stream, in a CLIENT span of its
        own (ended with the call) whose context ``metadata`` carries: what the
        stream-stream interceptor would do, without grpc.aio routing each write
        through the queue and task an intercepted stream call adds."""
        if self._untraced():
            return open_call(())
        span, carrier = self._span(method)
        try:
            call = open_call(tuple(carrier.items()))
        except BaseException:
            _end_client_span(span, method, grpc.StatusCode.UNKNOWN, "")
            raise
        _end_span_with(span, method, call)
        return call


def _end_span_with(span: trace.Span, method: Any, call: Any) -> None:
    """End ``span`` when ``call`` (a grpc.aio call) ends, with its status."""

    def done(finished: Any) -> None:
        if not span.is_recording():
            span.end()
            return
        # aio's code() is a coroutine, already resolved once the call is done.
        task = asyncio.ensure_future(finished.code())
        task.add_done_callback(
            lambda t: _end_client_span(
                span,
                method,
                grpc.StatusCode.CANCELLED if t.cancelled() or t.exception() else t.result(),
                "",
            )
        )

    call.add_done_callback(done)


# grpc.aio files a channel's interceptor under the first of the four kinds it is
# an instance of: one subclass per kind.
class _UnaryUnarySpans(ClientSpans, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await self._unary_answer(continuation, details, request)


class _StreamUnarySpans(ClientSpans, grpc.aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return await self._unary_answer(continuation, details, requests)


class _UnaryStreamSpans(ClientSpans, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await self._streamed_answers(continuation, details, request)


def _end_client_span(span: trace.Span, method: Any, code: grpc.StatusCode, details: str) -> None:
    """End a client span, with the ``rpc.*`` attributes and status when recorded."""
    if span.is_recording():
        name = method.decode() if isinstance(method, bytes) else str(method)
        service, _, rpc_method = name.lstrip("/").partition("/")
        span.set_attribute("rpc.system", "grpc")
        span.set_attribute("rpc.service", service)
        span.set_attribute("rpc.method", rpc_method)
        span.set_attribute("rpc.grpc.status_code", code.value[0])
        if code is not grpc.StatusCode.OK:
            span.set_status(trace.Status(trace.StatusCode.ERROR, details or code.name))
    span.end()


def client_interceptors() -> list[grpc.aio.ClientInterceptor]:
    """The interceptors every grpc.aio channel takes (:class:`ClientSpans`, one
    per kind of call but the bidirectional one: a stream-stream interceptor
    makes grpc.aio route each write through a queue and a task, so
    :meth:`ClientSpans.stream` gives those calls their span as they open)."""
    return [_UnaryUnarySpans(), _StreamUnarySpans(), _UnaryStreamSpans()]


#: The spans of the bidirectional streams :func:`basalt.common.dial.open_stream` opens.
stream_spans = ClientSpans()


# -- providers -----------------------------------------------------------------------------


def _otlp_endpoint_set(environ: Mapping[str, str], signal: str) -> bool:
    """Whether ``environ`` names where to send ``signal`` (TRACES, METRICS) by OTLP."""
    return bool(
        environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or environ.get(f"OTEL_EXPORTER_OTLP_{signal}_ENDPOINT")
    )


def _exporter_names(environ: Mapping[str, str], variable: str) -> list[str]:
    # The spec's default is "otlp"; an OTLP exporter without an endpoint would
    # dial localhost:4317 forever, so "otlp" below also needs an endpoint.
    names = [n.strip().lower() for n in environ.get(variable, "otlp").split(",") if n.strip()]
    return [] if "none" in names else names


def span_exporters(environ: Mapping[str, str] | None = None) -> list[SpanExporter]:
    """The span exporters ``environ`` (default ``os.environ``) asks for.

    ``OTEL_TRACES_EXPORTER`` (comma-separated; default ``otlp``): ``none``,
    ``otlp`` - the OTLP gRPC exporter, only when ``OTEL_EXPORTER_OTLP_ENDPOINT``
    or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is set (it reads them and the
    other ``OTEL_EXPORTER_OTLP_*`` settings itself) - and ``console`` (spans as
    JSON on stderr: stdout belongs to the process's own output). Raises
    ValueError for another name."""
    environ = os.environ if environ is None else environ
    exporters: list[SpanExporter] = []
    for name in _exporter_names(environ, "OTEL_TRACES_EXPORTER"):
        if name == "otlp":
            if _otlp_endpoint_set(environ, "TRACES"):
                from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
                    OTLPSpanExporter,
                )

                exporters.append(OTLPSpanExporter())
        elif name == "console":
            from opentelemetry.sdk.trace.export import ConsoleSpanExporter

            exporters.append(ConsoleSpanExporter(out=sys.stderr))
        else:
            raise ValueError(f"OTEL_TRACES_EXPORTER: {name!r} is not none, otlp or console")
    return exporters


def otlp_metric_readers(environ: Mapping[str, str] | None = None) -> list[MetricReader]:
    """The OTLP metric reader ``environ`` (default ``os.environ``) asks for:
    ``OTEL_METRICS_EXPORTER`` (default ``otlp``) names ``otlp`` and
    ``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``..._METRICS_ENDPOINT`` is set; the
    export interval is ``OTEL_METRIC_EXPORT_INTERVAL`` (the SDK reads it).
    ``none`` and ``prometheus`` (served on ``--metrics-port`` instead) add
    nothing; another name raises ValueError."""
    environ = os.environ if environ is None else environ
    readers: list[MetricReader] = []
    for name in _exporter_names(environ, "OTEL_METRICS_EXPORTER"):
        if name == "otlp":
            if _otlp_endpoint_set(environ, "METRICS"):
                from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (
                    OTLPMetricExporter,
                )
                from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

                readers.append(PeriodicExportingMetricReader(OTLPMetricExporter()))
        elif name != "prometheus":
            raise ValueError(f"OTEL_METRICS_EXPORTER: {name!r} is not none, otlp or prometheus")
    return readers


def _resource(config: TelemetryConfig) -> Resource:
    from opentelemetry.sdk.resources import Resource

    attributes = {"service.name": os.environ.get("OTEL_SERVICE_NAME") or config.service_name}
    if config.service_instance_id:
        attributes["service.instance.id"] = config.service_instance_id
    # create() adds the SDK's own attributes and OTEL_RESOURCE_ATTRIBUTES.
    return Resource.create(attributes)


def root_draw_ratio(config: TelemetryConfig) -> float | None:
    """The ratio at which calls that start a trace get a span (``_root_ratio``):
    ``config.root_sampling_ratio`` when ``OTEL_TRACES_SAMPLER`` names no sampler
    and it is below 1; None otherwise (every call gets a span, the sampler
    decides). Drawn per call where the call enters (:class:`ServerSpans`,
    :class:`ClientSpans`), so an unsampled call costs no span at all; a span
    started elsewhere with no parent (a rebalance nudge's delivery) is sampled."""
    if os.environ.get("OTEL_TRACES_SAMPLER") or config.root_sampling_ratio >= 1.0:
        return None
    return config.root_sampling_ratio


def tracer_provider(
    config: TelemetryConfig, exporters: Iterable[SpanExporter] = ()
) -> TracerProvider:
    """An SDK tracer provider for ``config``'s resource, a BatchSpanProcessor per
    exporter; the sampler from the environment (the SDK's own reading of
    ``OTEL_TRACES_SAMPLER``/``_ARG``), or when it names none and
    ``config.root_sampling_ratio`` is below 1, parent-based with the roots
    drawn at that ratio by the gRPC interceptors (:func:`root_draw_ratio`).
    Not installed: see :func:`setup_telemetry`."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased, Sampler

    sampler: Sampler | None = None  # None: the SDK reads the environment
    if root_draw_ratio(config) is not None:
        # The root draw is the interceptors' (_untraced_root): what reaches the
        # sampler without a parent was drawn already.
        sampler = ParentBased(ALWAYS_ON)
    provider = TracerProvider(resource=_resource(config), sampler=sampler)
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


def _rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _open_fds() -> int | None:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return None


def add_process_metrics(provider: metrics.MeterProvider) -> None:
    """Observable instruments of this process, by OpenTelemetry's semantic
    conventions (Prometheus names in brackets): ``process.cpu.time`` seconds by
    ``cpu.mode`` user/system (``process_cpu_time_seconds_total``),
    ``process.memory.usage`` resident bytes (``process_memory_usage_bytes``) and
    ``process.open_file_descriptor.count`` (``process_open_file_descriptor_count``).
    Memory and descriptors are read from /proc; where it is missing they report
    nothing. Read when collected (a scrape's thread)."""
    meter = provider.get_meter(PROCESS_METER)

    def cpu(_: metrics.CallbackOptions) -> Iterable[metrics.Observation]:
        times = os.times()
        yield metrics.Observation(times.user, {"cpu.mode": "user"})
        yield metrics.Observation(times.system, {"cpu.mode": "system"})

    def memory(_: metrics.CallbackOptions) -> Iterable[metrics.Observation]:
        rss = _rss_bytes()
        if rss is not None:
            yield metrics.Observation(rss)

    def fds(_: metrics.CallbackOptions) -> Iterable[metrics.Observation]:
        count = _open_fds()
        if count is not None:
            yield metrics.Observation(count)

    meter.create_observable_counter(
        "process.cpu.time", [cpu], unit="s", description="CPU seconds used by the process."
    )
    meter.create_observable_up_down_counter(
        "process.memory.usage",
        [memory],
        unit="By",
        description="The process's resident set size.",
    )
    meter.create_observable_up_down_counter(
        "process.open_file_descriptor.count",
        [fds],
        unit="{file_descriptor}",
        description="File descriptors the process holds open.",
    )


class Telemetry:
    """What :func:`setup_telemetry` installed: its config, the providers, and the
    bound metrics port (``None``: no endpoint)."""

    def __init__(
        self,
        config: TelemetryConfig,
        tracer_provider: TracerProvider,
        meter_provider: MeterProvider | None,
        metrics_server: WSGIServer | None,
        tls: TlsConfig | None = None,
    ) -> None:
        self.config = config
        self.tls = tls
        self.tracer_provider = tracer_provider
        self.meter_provider = meter_provider
        self._metrics_server = metrics_server
        self._shut = False

    @property
    def metrics_port(self) -> int | None:
        """The port the Prometheus endpoint is bound to (the real one for port 0)."""
        return None if self._metrics_server is None else self._metrics_server.server_port

    @property
    def metrics_url(self) -> str | None:
        """``http://host:port/metrics`` (``https`` when served over TLS), or None
        without an endpoint."""
        port = self.metrics_port
        if port is None:
            return None
        scheme = "https" if tls_enabled(self.tls) else "http"
        return f"{scheme}://{self.config.metrics_host}:{port}/metrics"

    def shutdown(self) -> None:
        """Flush and stop the span and metric processors; call it on a clean stop,
        before the process exits. Idempotent; the flushes wait up to
        ``flush_timeout_ms`` each. The metrics endpoint's daemon thread is left
        to end with the process: stopping it waits out its poll (up to 0.5 s),
        counted in every restart; scrapes meanwhile get what the stopped reader
        has (nothing)."""
        if self._shut:
            return
        self._shut = True
        timeout_ms = self.config.flush_timeout_ms
        # The processors' shutdown waits for an export as long as the exporter's
        # own timeout (30 s by default); a bounded flush first leaves it nothing.
        self.tracer_provider.force_flush(timeout_ms)
        self.tracer_provider.shutdown()
        if self.meter_provider is not None:
            self.meter_provider.shutdown(timeout_millis=timeout_ms)


_lock = threading.Lock()
_installed: Telemetry | None = None


def setup_telemetry(config: TelemetryConfig, tls: TlsConfig | None = None) -> Telemetry:
    """Set up this process's traces, metrics and logs (see the module docstring)
    and return what was installed.

    With ``tls`` enabled the metrics endpoint serves HTTPS with its
    ``tls_cert_file`` / ``tls_key_file`` (read once, at start) and, when it
    names a ``tls_ca_file``, requires a client certificate signed by it (as
    Prometheus presents with ``tls_config.cert_file``): the endpoint names the
    cluster's topics and groups, so what gRPC keeps from strangers it keeps too.

    Once per process: a second call with an equal ``config`` returns the first
    call's :class:`Telemetry`; with another config it raises RuntimeError
    (OpenTelemetry's global providers cannot be replaced). Raises ValueError for
    an ``OTEL_*_EXPORTER`` it does not know and OSError when the metrics port
    cannot be bound."""
    global _installed
    with _lock:
        if _installed is not None:
            if _installed.config != config or _installed.tls != tls:
                raise RuntimeError(
                    f"telemetry is already set up as {_installed.config}, not {config}"
                )
            return _installed
        configure_logging(config.log_format, config.log_level)
        tracer = tracer_provider(config, span_exporters())
        global _root_ratio
        _root_ratio = root_draw_ratio(config)
        readers = otlp_metric_readers()
        registry = None
        port = config.metrics_port
        if port is not None:
            from opentelemetry.exporter.prometheus import PrometheusMetricReader
            from prometheus_client import CollectorRegistry

            # A registry of our own: prometheus_client's default one carries its
            # own process collector, which would repeat the process metrics.
            registry = CollectorRegistry(auto_describe=True)
            readers.append(PrometheusMetricReader(registry=registry))
        meter = None
        if readers:
            from opentelemetry.sdk.metrics import MeterProvider

            meter = MeterProvider(metric_readers=readers, resource=_resource(config))
            add_process_metrics(meter)
            metrics.set_meter_provider(meter)
        server = None
        if registry is not None and port is not None:
            from prometheus_client import start_http_server

            # Serves from a daemon thread: a scrape, and the observable callbacks
            # it runs, never wait for (or hold) a service's event loop.
            secure: dict[str, Any] = {}
            if tls_enabled(tls):
                assert tls is not None
                if tls.tls_cert_file is None or tls.tls_key_file is None:
                    raise ValueError(
                        "serving metrics over TLS needs tls_cert_file and tls_key_file"
                    )
                secure = {
                    "certfile": str(tls.tls_cert_file),
                    "keyfile": str(tls.tls_key_file),
                    "client_cafile": None if tls.tls_ca_file is None else str(tls.tls_ca_file),
                    "client_auth_required": tls.tls_ca_file is not None,
                }
            server, _ = start_http_server(
                port, addr=config.metrics_host, registry=registry, **secure
            )
        trace.set_tracer_provider(tracer)
        _installed = Telemetry(config, tracer, meter, server, tls)
        return _installed
