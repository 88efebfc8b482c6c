"""The servicer-side wrapper every Basalt RPC method goes through.

:func:`rpc_method` is the one place where a servicer's exceptions become gRPC
statuses: a :class:`basalt.services.errors.Refusal` fails the call with its status,
message and ``basalt-response-code`` (via :func:`basalt.services.errors.abort`); a
store that is shut down, or an etcd write that cannot reach etcd, is
SERVICE_NOT_AVAILABLE; anything unexpected is
logged with its traceback and answered SYSTEM_ERROR with a one-line message
(a client never sees a stack trace). Shared by the store-node and the
pull-service.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc
from basalt.services.errors import Refusal, abort
from basalt.services.meta.errors import MetaUnavailableError
from basalt.store import StoreClosedError

from basalt.v1 import common_pb2 as pb

log = logging.getLogger(__name__)

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


def as_refusal(error: Exception, where: str) -> Refusal:
    """What ``error``, raised serving a request in ``where``, answers: a Refusal
    as is; a store shut down, or an etcd write that cannot reach etcd (a
    topic's auto-creation), SERVICE_NOT_AVAILABLE (retry later, elsewhere);
    anything else is logged with its traceback and answered SYSTEM_ERROR with
    one line. Also used for each entry of a batched call."""
    if isinstance(error, Refusal):
        return error
    if isinstance(error, (StoreClosedError, MetaUnavailableError)):
        return Refusal(pb.RESPONSE_CODE_SERVICE_NOT_AVAILABLE, str(error))
    log.error("%s failed", where, exc_info=error)
    return Refusal(pb.RESPONSE_CODE_SYSTEM_ERROR, f"{type(error).__name__}: {error}")
