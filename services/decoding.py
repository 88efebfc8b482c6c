"""The decoding layer in front of every servicer: a request that does not parse
is refused INVALID_ARGUMENT, saying so, by every service of both protocols.

gRPC decodes a request with its method handler's ``request_deserializer``
before the servicer runs; a deserializer that raises makes grpc.aio answer
UNKNOWN with the exception's text. :func:`decoding` wraps a servicer method
and its request class (basalt.services.process.add_servicer does, for every
method it registers) so that it never does:

* a unary request that does not parse is decoded as :class:`Unparsable`,
  and the wrapped method fails the call with :func:`unparsable_refusal`
  instead of running (an interceptor in front, the auth guard, lets it pass:
  :func:`is_unparsable`);
* a streamed request that does not parse raises :class:`UnparsableRequest`
  (a :class:`~basalt.services.errors.Refusal`) where it is read: a method
  reading with ``context.read()`` under :func:`basalt.services.rpc.rpc_method`
  fails the call with it; a method iterating its requests gets an iterator
  that fails the call with it.

The answer: INVALID_ARGUMENT, ``basalt-response-code`` INVALID_PARAMETER,
"<Service>/<Method> request does not parse: <reason>" (the reason is the
protobuf decoder's one line).
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import DecodeError, Message

from basalt.services.errors import Refusal, abort
from basalt.v1 import common_pb2 as pb


class UnparsableRequest(Refusal):
    """A request message that does not decode as its method's request type."""

    def __init__(self, method: str, reason: str) -> None:
        super().__init__(
            pb.RESPONSE_CODE_INVALID_PARAMETER, f"{method} request does not parse: {reason}"
        )


@dataclass(frozen=True, slots=True)
class Unparsable:
    """What a unary request that does not parse decodes to: its refusal."""

    refusal: UnparsableRequest


def is_unparsable(request: object) -> bool:
    """Whether ``request`` is a request that did not parse (its method refuses it)."""
    return isinstance(request, Unparsable)


def _reason(error: Exception) -> str:
    # DecodeError's text is one line ("Error parsing message with type ...");
    # anything else the decoder raises is named by its class only.
    text = str(error) if isinstance(error, DecodeError) else type(error).__name__
    return text.splitlines()[0][:200] if text else type(error).__name__


def _parser(method: str, request_class: type[Message], *, streamed: bool) -> Callable[[bytes], Any]:
    def parse(raw: bytes) -> Any:
        try:
            return request_class.FromString(raw)
        except Exception as e:  # the decoder's DecodeError, or a RuntimeWarning turned error
            refusal = UnparsableRequest(method, _reason(e))
            if streamed:
                raise refusal from None
            return Unparsable(refusal)

    return parse


def _checked_requests(
    requests: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]
) -> AsyncIterator[Any]:
    async def each() -> AsyncIterator[Any]:
        try:
            async for request in requests:
                yield request
        except UnparsableRequest as e:
            await abort(context, e)

    return each()


def decoding(
    method: str,
    behavior: Callable[..., Any],
    request_class: type[Message],
    *,
    request_streaming: bool,
) -> tuple[Callable[..., Any], Callable[[bytes], Any]]:
    """``(behavior, request_deserializer)`` for the handler of ``method``
    ("Service/Method"): the servicer's ``behavior`` and a decoder of
    ``request_class``, wrapped as the module docstring says."""
    parse = _parser(method, request_class, streamed=request_streaming)
    if request_streaming:
        if inspect.isasyncgenfunction(behavior):

            async def stream_generate(requests: Any, context: Any) -> AsyncIterator[Any]:
                async for answer in behavior(_checked_requests(requests, context), context):
                    yield answer

            return stream_generate, parse

        async def stream_call(requests: Any, context: Any) -> Any:
            return await behavior(_checked_requests(requests, context), context)

        return stream_call, parse

    if inspect.isasyncgenfunction(behavior):

        async def generate(request: Any, context: Any) -> AsyncIterator[Any]:
            if isinstance(request, Unparsable):
                await abort(context, request.refusal)
                return
            async for answer in behavior(request, context):
                yield answer

        return generate, parse

    async def call(request: Any, context: Any) -> Any:
        if isinstance(request, Unparsable):
            await abort(context, request.refusal)
        return await behavior(request, context)

    return call, parse
