"""basalt.common.telemetry.ServerSpans: a SERVER span per call, of every handler
kind, with the call's status; in the trace the caller's metadata names."""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from basalt.common import dial, telemetry
from tests.support.aio import async_test
from tests.support.telemetry import named


def _identity(data: bytes) -> bytes:
    return data


async def _ok(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
    return request


async def _fail(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
    await context.abort(grpc.StatusCode.NOT_FOUND, "no such thing")
    raise AssertionError("abort returns never")


async def _write_back(requests: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
    # As SendStream and Session: a coroutine that writes, not an async generator.
    async for request in requests:
        await context.write(request)


async def _yield_back(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
    for _ in range(2):
        yield request


@async_test
async def test_every_kind_of_call_is_a_server_span_with_its_status(
    spans: InMemorySpanExporter,
) -> None:
    handlers = {
        "Ok": grpc.unary_unary_rpc_method_handler(_ok, _identity, _identity),
        "Fail": grpc.unary_unary_rpc_method_handler(_fail, _identity, _identity),
        "Echo": grpc.stream_stream_rpc_method_handler(_write_back, _identity, _identity),
        "Twice": grpc.unary_stream_rpc_method_handler(_yield_back, _identity, _identity),
    }
    server = grpc.aio.server(interceptors=telemetry.server_interceptors())
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("t.T", handlers),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with dial.channel(f"127.0.0.1:{port}") as channel:
            with trace.get_tracer("test").start_as_current_span("caller") as caller:
                assert await channel.unary_unary("/t.T/Ok")(b"x") == b"x"
                try:
                    await channel.unary_unary("/t.T/Fail")(b"x")
                except grpc.aio.AioRpcError as e:
                    assert e.code() is grpc.StatusCode.NOT_FOUND
                else:
                    raise AssertionError("Fail answered")
                echo = dial.open_stream(channel, "/t.T/Echo", None, None)
                await echo.write(b"a")
                assert await echo.read() == b"a"
                await echo.done_writing()
                assert [a async for a in channel.unary_stream("/t.T/Twice")(b"y")] == [b"y", b"y"]
    finally:
        await server.stop(None)
    finished = spans.get_finished_spans()
    the_trace = caller.get_span_context().trace_id
    servers = {
        s.name: s for s in finished if s.kind is trace.SpanKind.SERVER and s.name.startswith("/t.T")
    }
    assert set(servers) == {"/t.T/Ok", "/t.T/Fail", "/t.T/Echo", "/t.T/Twice"}
    for name, span in servers.items():
        assert span.context is not None and span.context.trace_id == the_trace, name
        attributes = span.attributes or {}
        assert attributes["rpc.system"] == "grpc" and attributes["rpc.service"] == "t.T"
        assert attributes["rpc.method"] == name.rsplit("/", 1)[1]
    assert (servers["/t.T/Ok"].attributes or {})["rpc.grpc.status_code"] == 0
    failed = servers["/t.T/Fail"]
    assert (failed.attributes or {})["rpc.grpc.status_code"] == grpc.StatusCode.NOT_FOUND.value[0]
    assert failed.status.status_code is trace.StatusCode.ERROR
    # Each server span is the remote child of the caller's client span of that call.
    (client_ok,) = [s for s in named(finished, "/t.T/Ok") if s.kind is trace.SpanKind.CLIENT]
    assert servers["/t.T/Ok"].parent is not None and client_ok.context is not None
    assert servers["/t.T/Ok"].parent.span_id == client_ok.context.span_id
    # A stream opened by dial.open_stream has its client span too, the server's parent.
    (client_echo,) = [s for s in named(finished, "/t.T/Echo") if s.kind is trace.SpanKind.CLIENT]
    assert servers["/t.T/Echo"].parent is not None and client_echo.context is not None
    assert servers["/t.T/Echo"].parent.span_id == client_echo.context.span_id


@async_test
async def test_a_root_draw_that_fails_costs_no_span_and_a_traced_call_keeps_its_own(
    spans: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a service's root ratio (here 0: no draw passes), a call from outside any
    trace makes neither a client nor a server span; a call in a trace makes both."""
    monkeypatch.setattr(telemetry, "_root_ratio", 0.0)
    handlers = {"Ok": grpc.unary_unary_rpc_method_handler(_ok, _identity, _identity)}
    server = grpc.aio.server(interceptors=telemetry.server_interceptors())
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("t.T", handlers),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with dial.channel(f"127.0.0.1:{port}") as channel:
            ok = channel.unary_unary("/t.T/Ok")
            assert await ok(b"untraced") == b"untraced"
            assert named(spans.get_finished_spans(), "/t.T/Ok") == []
            with trace.get_tracer("test").start_as_current_span("caller"):
                assert await ok(b"traced") == b"traced"
    finally:
        await server.stop(None)
    kinds = sorted(s.kind.name for s in named(spans.get_finished_spans(), "/t.T/Ok"))
    assert kinds == ["CLIENT", "SERVER"]
