"""Verifying every call: the signature, then the ACL, before the servicer runs.

:class:`AuthGuard` holds what a decision needs (the users and ACLs cache,
the internal user, the skew window, a clock) and makes it; :class:`AuthInterceptor`
is the grpc.aio server interceptor that puts it in front of every handler a
server has. Refused calls never reach their servicer, so nothing they ask is
executed or stored:

- UNAUTHENTICATED: no or malformed ``authorization``, signed headers other
  than ``x-mq-date-time``, a date-time that does not parse or lies outside the
  skew window (an old signature replayed), an unknown or disabled user, a
  wrong signature. The reason names the access key at most, never a secret or
  the expected signature.
- PERMISSION_DENIED: the ACL does not allow the action on a resource the
  request names; the message says which (``Sub on Topic:orders``).

One ``basalt.audit`` log line per refusal. A stream is authenticated once,
when it opens; a client-streaming method's rule is checked on each message
(a SendStream may name a new topic in any message).

:func:`install` makes a process's servers use a guard
(basalt.services.process.grpc_server asks :func:`server_interceptors`).
"""

from __future__ import annotations

import asyncio
import hmac
import inspect
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

import grpc
from google.protobuf.message import Message

from basalt.common import auth as signing
from basalt.services import errors
from basalt.services.auth.model import User, UserStatus, UserType, decide, subject_of
from basalt.services.auth.rpc_table import RPC_TABLE, Rule, is_exempt
from basalt.services.auth.store import AuthCache
from basalt.services.decoding import is_unparsable
from basalt.services.meta import MetaUnavailableError
from basalt.v1 import common_pb2 as pb

log = logging.getLogger(__name__)
audit = logging.getLogger("basalt.audit")


class AuthRefusal(Exception):
    """A call refused: ``unauthenticated`` (else permission denied) and why."""

    def __init__(self, message: str, *, unauthenticated: bool) -> None:
        super().__init__(message)
        self.message = message
        self.unauthenticated = unauthenticated

    def refusal(self) -> errors.Refusal:
        if self.unauthenticated:
            return errors.Refusal.of(errors.Outcome.UNAUTHENTICATED, self.message)
        return errors.Refusal(pb.RESPONSE_CODE_NO_PERMISSION, self.message)


def _unauthenticated(message: str) -> AuthRefusal:
    return AuthRefusal(message, unauthenticated=True)


def peer_ip(peer: str) -> str | None:
    """The address of a gRPC peer string (``ipv4:1.2.3.4:5``, ``ipv6:[::1]:5``)."""
    kind, _, rest = peer.partition(":")
    if kind == "ipv4":
        return rest.rpartition(":")[0]
    if kind == "ipv6":
        return rest.rpartition(":")[0].strip("[]")
    return None


class AuthGuard:
    """Decides calls. ``internal`` is the cluster's internal super user (from
    the credentials file, never stored in etcd: services reach each other even
    before any user exists); ``cache`` makes the watched users and ACLs (made
    and started on first use; None: only the internal user is known). Single
    event loop."""

    def __init__(
        self,
        cache: Callable[[], AuthCache] | None,
        internal: signing.Credentials,
        *,
        clock_skew_s: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        # Made on first use, on the loop that serves (its watchers belong to it).
        self._make_cache = cache
        self._cache: AuthCache | None = None
        self._internal = User(internal.access_key, internal.secret_key, UserType.SUPER)
        self._clock_skew_s = clock_skew_s
        self._clock = clock
        self._started: asyncio.Task[None] | None = None

    async def _ensure_started(self) -> None:
        if self._make_cache is None:
            return
        if self._started is None:
            self._cache = self._make_cache()
            self._started = asyncio.ensure_future(self._cache.start())
            self._started.add_done_callback(_log_start_failure)
        if not self._started.done():
            # Bounded by the etcd timeout; past it, unknown users are refused
            # (fail closed) while the watchers keep trying.
            await asyncio.wait((self._started,))

    def _user(self, access_key: str) -> User | None:
        if access_key == self._internal.username:
            return self._internal
        return None if self._cache is None else self._cache.user(access_key)

    async def authenticate(self, metadata: Iterable[tuple[str, Any]]) -> User:
        """The user who signed a call with ``metadata``; AuthRefusal if none did."""
        await self._ensure_started()
        values = {key.lower(): value for key, value in metadata if isinstance(value, str)}
        header = values.get(signing.AUTHORIZATION)
        if header is None:
            raise _unauthenticated("no authorization (sign with an access key)")
        try:
            parsed = signing.parse_authorization(header)
        except ValueError as e:
            raise _unauthenticated(str(e)) from None
        if parsed.signed_headers != signing.DATE_TIME:
            raise _unauthenticated(f"SignedHeaders must be {signing.DATE_TIME}")
        date_time = values.get(signing.DATE_TIME, "")
        try:
            signed_at = signing.parse_date_time(date_time)
        except ValueError:
            raise _unauthenticated(f"{signing.DATE_TIME} missing or malformed") from None
        if abs(self._clock() - signed_at) > self._clock_skew_s:
            raise _unauthenticated(
                f"{signing.DATE_TIME} {date_time} is outside the {self._clock_skew_s:g} s window"
            )
        user = self._user(parsed.access_key)
        if user is None or user.status is UserStatus.DISABLE:
            raise _unauthenticated(f"unknown access key {parsed.access_key}")
        expected = signing.sign(user.secret_key, date_time)
        if not hmac.compare_digest(expected, parsed.signature.lower()):
            raise _unauthenticated(f"signature does not match for access key {user.username}")
        return user

    def authorize(self, user: User, rule: Rule, request: Message, source_ip: str | None) -> None:
        """Raise AuthRefusal (permission denied) unless ``user`` may do what
        ``request`` asks under ``rule``."""
        if user.is_super:
            return
        if rule.super_only:
            raise AuthRefusal("only a super user may do this", unauthenticated=False)
        acl = None if self._cache is None else self._cache.acl(user.username)
        for need in rule.needs:
            for resource in need.resources(request):
                if not any(decide(acl, resource, a, source_ip) for a in need.actions):
                    actions = " or ".join(sorted(a.value for a in need.actions))
                    raise AuthRefusal(
                        f"{subject_of(user.username)} may not {actions} on {resource}",
                        unauthenticated=False,
                    )


#: The Admin service's methods: each one done is an audit line.
ADMIN_PREFIX = "/basalt.v1.Admin/"
#: Request fields an admin audit line shows (never a secret).
_AUDITED_FIELDS = ("topic", "group", "subject", "username")


def _named(request: Message) -> str:
    """What an admin request names, for its audit line."""
    shown = []
    for name in _AUDITED_FIELDS:
        if name in request.DESCRIPTOR.fields_by_name and getattr(request, name):
            shown.append(f"{name}={getattr(request, name)}")
    for name in ("config", "user"):
        if name in request.DESCRIPTOR.fields_by_name:
            inner = getattr(request, name)
            for field in ("topic", "username"):
                if field in inner.DESCRIPTOR.fields_by_name and getattr(inner, field):
                    shown.append(f"{field}={getattr(inner, field)}")
    return " ".join(shown) or "-"


def _log_start_failure(started: asyncio.Future[None]) -> None:
    """Say once that the users and ACLs were not loaded when first needed."""
    if started.cancelled():
        return
    error = started.exception()
    if isinstance(error, MetaUnavailableError):
        log.warning("auth: users and ACLs not loaded yet (etcd): %s; retrying", error)
    elif error is not None:
        log.error("auth: users and ACLs cannot be loaded: %r", error)


def _audit(method: str, peer: str, what: str) -> None:
    audit.warning("refused %s from %s: %s", method, peer, what)


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """Puts ``guard`` in front of every handler but health and reflection."""

    def __init__(self, guard: AuthGuard) -> None:
        self.guard = guard

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Any],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Any:
        handler = await continuation(handler_call_details)
        method: str = handler_call_details.method
        if handler is None or is_exempt(method):
            return handler
        return _Guarded(self.guard, method, RPC_TABLE.get(method)).wrap(handler)


class _Guarded:
    """One call's checks around one handler's behaviour."""

    def __init__(self, guard: AuthGuard, method: str, rule: Rule | None) -> None:
        self.guard = guard
        self.method = method
        self.rule = rule

    async def _refuse(self, context: Any, refusal: AuthRefusal, who: str) -> None:
        _audit(self.method, context.peer(), f"{who}{refusal.message}")
        await errors.abort(context, refusal.refusal())

    async def admit(self, context: Any) -> User:
        """Authenticate the call (abort it when that fails)."""
        try:
            return await self.guard.authenticate(context.invocation_metadata() or ())
        except AuthRefusal as e:
            await self._refuse(context, e, "")
            raise AssertionError("abort returned") from None

    async def check(self, context: Any, user: User, request: Message) -> None:
        """Authorize one request message (abort the call when refused). A
        request that does not parse names nothing to authorize: the servicer's
        decoding layer refuses it (basalt.services.decoding)."""
        if is_unparsable(request):
            return
        try:
            if self.rule is None:
                raise AuthRefusal(f"{self.method} has no authorization rule", unauthenticated=False)
            self.guard.authorize(user, self.rule, request, peer_ip(context.peer()))
        except AuthRefusal as e:
            await self._refuse(context, e, f"{user.username}: ")

    def wrap(self, handler: grpc.RpcMethodHandler[Any, Any]) -> grpc.RpcMethodHandler[Any, Any]:
        replace = {
            (False, False): (grpc.unary_unary_rpc_method_handler, "unary_unary"),
            (False, True): (grpc.unary_stream_rpc_method_handler, "unary_stream"),
            (True, False): (grpc.stream_unary_rpc_method_handler, "stream_unary"),
            (True, True): (grpc.stream_stream_rpc_method_handler, "stream_stream"),
        }
        make, attribute = replace[handler.request_streaming, handler.response_streaming]
        inner = getattr(handler, attribute)
        behavior = (
            self._streaming_requests(inner)
            if handler.request_streaming
            else self._unary_request(inner)
        )
        return make(  # type: ignore[no-any-return,operator]
            behavior,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )

    def _unary_request(self, inner: Any) -> Any:
        if inspect.isasyncgenfunction(inner):

            async def generate(request: Any, context: Any) -> AsyncIterator[Any]:
                await self.check(context, await self.admit(context), request)
                async for answer in inner(request, context):
                    yield answer

            return generate

        async def call(request: Any, context: Any) -> Any:
            user = await self.admit(context)
            await self.check(context, user, request)
            answer = await inner(request, context)
            if self.method.startswith(ADMIN_PREFIX):
                audit.info(
                    "admin %s by %s from %s: %s",
                    self.method.rpartition("/")[2],
                    user.username,
                    context.peer(),
                    _named(request),
                )
            return answer

        return call

    def _streaming_requests(self, inner: Any) -> Any:
        def checked(requests: Any, context: Any, user: User) -> tuple[Any, Any]:
            async def each() -> AsyncIterator[Any]:
                async for request in requests:
                    await self.check(context, user, request)
                    yield request

            return each(), _CheckedReads(context, lambda r: self.check(context, user, r))

        if inspect.isasyncgenfunction(inner):

            async def generate(requests: Any, context: Any) -> AsyncIterator[Any]:
                iterator, guarded = checked(requests, context, await self.admit(context))
                async for answer in inner(iterator, guarded):
                    yield answer

            return generate

        async def call(requests: Any, context: Any) -> Any:
            iterator, guarded = checked(requests, context, await self.admit(context))
            return await inner(iterator, guarded)

        return call


class _CheckedReads:
    """A servicer context whose ``read()`` checks each message it returns;
    everything else is the call's own context."""

    def __init__(self, context: Any, check: Callable[[Any], Any]) -> None:
        self._context = context
        self._check = check

    async def read(self) -> Any:
        request = await self._context.read()
        if request is not grpc.aio.EOF:
            await self._check(request)
        return request

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)


_installed: AuthInterceptor | None = None


def install(guard: AuthGuard | None) -> None:
    """Have every server this process makes from now on verify with ``guard``
    (None: no verification)."""
    global _installed
    _installed = None if guard is None else AuthInterceptor(guard)


def server_interceptors() -> list[grpc.aio.ServerInterceptor]:
    """The installed verifier, or none (auth off)."""
    return [] if _installed is None else [_installed]
