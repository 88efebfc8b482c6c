"""Where a trace travels besides gRPC metadata: message properties and command maps.

Uses only the OpenTelemetry API, so it costs nothing until a process installs
an SDK TracerProvider (``basalt.common.telemetry`` does; tests install their
own): the API's global proxies then bind to it.

Two carriers:

* **A message's properties** (RocketMQ's ``name\\x01value\\x02`` block): the
  producer's send span writes W3C ``traceparent`` (and ``tracestate`` when the
  context has one) as user properties; a consumer's process or receive span
  links to it. The names are lower case, as W3C spells them: RocketMQ's system
  properties are upper case (``TAGS``, ``KEYS``, ``UNIQ_KEY``, ``__CRC32#``), so
  the two never meet. Only the W3C trace-context propagator writes here, never
  the global one: baggage in every stored message would be a cost no one chose.
* **A session command's ``trace_context`` map**: a command travels on a
  long-lived Session stream, whose gRPC metadata is the stream opener's, not
  the command sender's; the pull-service copies its current context into the
  command (the global propagator: trace context and baggage) and the SDK
  handles the command in it.

Attribute names follow OpenTelemetry's messaging semantic conventions
(``messaging.system = "rocketmq"``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterable, Mapping, MutableMapping
from typing import Any, TypeVar

from opentelemetry import context, propagate, trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import AttributeValue

T = TypeVar("T")

#: The W3C header names, used as message property names.
PROPERTY_TRACEPARENT = "traceparent"
PROPERTY_TRACESTATE = "tracestate"

# OpenTelemetry messaging semantic conventions (the attribute names, spelled once).
MESSAGING_SYSTEM = "messaging.system"
MESSAGING_SYSTEM_ROCKETMQ = "rocketmq"
MESSAGING_OPERATION_NAME = "messaging.operation.name"
MESSAGING_OPERATION_TYPE = "messaging.operation.type"
MESSAGING_DESTINATION_NAME = "messaging.destination.name"
MESSAGING_DESTINATION_PARTITION_ID = "messaging.destination.partition.id"
MESSAGING_BATCH_MESSAGE_COUNT = "messaging.batch.message_count"
MESSAGING_MESSAGE_ID = "messaging.message.id"
MESSAGING_CONSUMER_GROUP_NAME = "messaging.consumer.group.name"
MESSAGING_CLIENT_ID = "messaging.client.id"
MESSAGING_ROCKETMQ_MESSAGE_TAG = "messaging.rocketmq.message.tag"
MESSAGING_ROCKETMQ_MESSAGE_KEYS = "messaging.rocketmq.message.keys"

_W3C = TraceContextTextMapPropagator()


def tracing_installed() -> bool:
    """Whether an OpenTelemetry SDK is installed (a tracer provider was set).

    With none, every span the API starts is a non-recording one that carries
    its parent's context and records nothing; the SDK's per-message paths (a
    send, a poll) skip starting it, a few microseconds each. Once an
    application installs a provider, the next call starts spans again."""
    return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


def message_trace_properties() -> dict[str, str]:
    """The properties that carry the current span to a message's consumers:
    ``traceparent`` (and ``tracestate``), or ``{}`` when the current span is
    not recording (no SDK installed, or sampled out), so an untraced send
    stores nothing extra."""
    if not trace.get_current_span().is_recording():
        return {}
    carrier: dict[str, str] = {}
    _W3C.inject(carrier)
    return carrier


def message_link(properties: Mapping[str, str]) -> trace.Link | None:
    """A link to the send span whose context ``properties`` carry; None for a
    message sent untraced (or by a client that does not trace). Never raises:
    a malformed ``traceparent`` is no link."""
    if PROPERTY_TRACEPARENT not in properties:
        return None
    span_context = trace.get_current_span(_W3C.extract(properties)).get_span_context()
    return trace.Link(span_context) if span_context.is_valid else None


def message_links(all_properties: Iterable[Mapping[str, str]]) -> list[trace.Link]:
    """One link per traced message, in order, the same send span linked once
    (a batch's messages all carry their batch's span)."""
    links: dict[tuple[int, int], trace.Link] = {}
    for properties in all_properties:
        link = message_link(properties)
        if link is not None:
            links.setdefault((link.context.trace_id, link.context.span_id), link)
    return list(links.values())


def commit_attributes(
    *, topic: str, queue_id: int, group: str, client_id: str
) -> dict[str, AttributeValue]:
    """A commit span's attributes (a consumer storing its offset of one queue:
    OpenTelemetry's "settle" operation type, named "commit")."""
    return {
        MESSAGING_SYSTEM: MESSAGING_SYSTEM_ROCKETMQ,
        MESSAGING_OPERATION_NAME: "commit",
        MESSAGING_OPERATION_TYPE: "settle",
        MESSAGING_CONSUMER_GROUP_NAME: group,
        MESSAGING_CLIENT_ID: client_id,
        MESSAGING_DESTINATION_NAME: topic,
        MESSAGING_DESTINATION_PARTITION_ID: str(queue_id),
    }


def consume_attributes(
    operation: str,
    *,
    topic: str | None,
    group: str,
    client_id: str,
    message_count: int,
    queue_id: int | None = None,
) -> dict[str, AttributeValue]:
    """A consumer span's attributes: ``operation`` is ``"process"`` (a listener
    call) or ``"receive"`` (a poll); ``topic`` None when the messages come
    from several topics; ``queue_id`` the queue when there is one."""
    attributes: dict[str, AttributeValue] = {
        MESSAGING_SYSTEM: MESSAGING_SYSTEM_ROCKETMQ,
        MESSAGING_OPERATION_NAME: operation,
        MESSAGING_OPERATION_TYPE: operation,
        MESSAGING_CONSUMER_GROUP_NAME: group,
        MESSAGING_CLIENT_ID: client_id,
        MESSAGING_BATCH_MESSAGE_COUNT: message_count,
    }
    if topic is not None:
        attributes[MESSAGING_DESTINATION_NAME] = topic
    if queue_id is not None:
        attributes[MESSAGING_DESTINATION_PARTITION_ID] = str(queue_id)
    return attributes


def inject_context(carrier: MutableMapping[str, str]) -> None:
    """Write the current context into ``carrier`` (a command's ``trace_context``)
    with the global propagator; nothing when there is nothing to carry."""
    propagate.inject(carrier)


def extracted_context(carrier: Mapping[str, str]) -> context.Context:
    """The context ``carrier`` holds (see :func:`inject_context`); the empty
    context when it holds none, so a span started in it is a root."""
    return propagate.extract(carrier, context=context.Context())


__all__ = [
    "MESSAGING_BATCH_MESSAGE_COUNT",
    "MESSAGING_CLIENT_ID",
    "MESSAGING_CONSUMER_GROUP_NAME",
    "MESSAGING_DESTINATION_NAME",
    "MESSAGING_DESTINATION_PARTITION_ID",
    "MESSAGING_MESSAGE_ID",
    "MESSAGING_OPERATION_NAME",
    "MESSAGING_OPERATION_TYPE",
    "MESSAGING_ROCKETMQ_MESSAGE_KEYS",
    "MESSAGING_ROCKETMQ_MESSAGE_TAG",
    "MESSAGING_SYSTEM",
    "MESSAGING_SYSTEM_ROCKETMQ",
    "PROPERTY_TRACEPARENT",
    "PROPERTY_TRACESTATE",
    "consume_attributes",
    "extracted_context",
    "inject_context",
    "message_link",
    "message_links",
]


def untraced_task(work: Coroutine[Any, Any, T], *, name: str | None = None) -> asyncio.Task[T]:
    """``work`` as a task of the running loop whose OpenTelemetry context is empty.

    A task copies its creator's context: a consumer's pull loop started while
    handling a reset (inside that command's span) would otherwise make every
    later pull a span of the reset's trace. Long-lived loops start untraced;
    each call they make starts (or not) a trace of its own."""
    token = context.attach(context.Context())
    try:
        return asyncio.get_running_loop().create_task(work, name=name)
    finally:
        context.detach(token)
