"""The servicer-side wrapper every Basalt RPC method goes through.

:func:`rpc_method` fails a call whose method raised with what the error
answers by :mod:`basalt.services.errors`' table (status, message and
``basalt-response-code``, via :func:`basalt.services.errors.abort`); anything
the table does not know is logged there with its traceback and answered
SYSTEM_ERROR with a one-line message (a client never sees a stack trace).
Shared by the store-node, the pull-service and the admin service.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc

from basalt.services.errors import abort, as_refusal

R = TypeVar("R")


def rpc_method(
    method: Callable[[Any, Any, grpc.aio.ServicerContext[Any, Any]], Awaitable[R]],
) -> Callable[[Any, Any, grpc.aio.ServicerContext[Any, Any]], Awaitable[R]]:
    """Wrap a servicer coroutine ``(self, request, context)`` so that its refusals
    and errors fail the call cleanly; cancellation and aborts pass through.

    Works for unary methods and for streaming ones written with
    ``context.read()``/``context.write()`` (``request`` is then the iterator).
    """

    @functools.wraps(method)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> R:
        try:
            return await method(self, request, context)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            if isinstance(e, grpc.aio.AbortError):
                raise
            await abort(context, as_refusal(e, method.__name__))
        raise AssertionError("unreachable: abort raises")

    return wrapper
