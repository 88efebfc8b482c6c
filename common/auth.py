"""Request signatures: RocketMQ 5's one credential scheme, for both protocols.

Every call carries two metadata entries (rocketmq-clients' ``docs/transport.md``)::

    x-mq-date-time: 20260309T195445Z
    authorization:  MQv2-HMAC-SHA1 Credential=<AK>, SignedHeaders=x-mq-date-time,
                    Signature=<hex HMAC-SHA1(SK, x-mq-date-time)>

The date-time is ``yyyyMMdd'T'HHmmss'Z'``. Node's client stamps UTC and hex in
upper case; the Python client stamps *local* time with a ``Z`` and lower-case
hex - so a verifier compares hex case-insensitively, and a Python client on a
host whose clock zone is not UTC falls outside the skew window (set TZ=UTC).

This module is pure (the SDK, the CLI and the services share it): signing,
parsing, and client interceptors (grpc.aio and blocking) that sign each call
when it starts (a stream is signed once, when it opens); every channel
Basalt makes carries them (:func:`basalt.common.dial.channel`). A service
process signs its own calls to other services with
:func:`use_process_credentials`; a CLI command finds the credentials it signs
with by :func:`basalt.common.local_cluster.discover_credentials`.
"""

from __future__ import annotations

import calendar
import dataclasses
import hashlib
import hmac
import json
import os
import re
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import grpc

AUTHORIZATION = "authorization"
DATE_TIME = "x-mq-date-time"
ALGORITHM = "MQv2-HMAC-SHA1"
DATE_TIME_FORMAT = "%Y%m%dT%H%M%SZ"

_AUTHORIZATION_RE = re.compile(
    r"^MQv2-HMAC-SHA1\s+Credential=(?P<ak>[^,\s]+),\s*SignedHeaders=(?P<headers>[^,\s]+),"
    r"\s*Signature=(?P<sig>[0-9A-Fa-f]+)$"
)


@dataclasses.dataclass(frozen=True, slots=True)
class Credentials:
    """An access key and its secret. ``repr`` never shows the secret."""

    access_key: str
    secret_key: str = dataclasses.field(repr=False)

    def __post_init__(self) -> None:
        if not self.access_key or not self.secret_key:
            raise ValueError("credentials need an access key and a secret key")

    @classmethod
    def from_file(cls, path: str | Path) -> Credentials:
        """Read ``{"accessKey": ..., "secretKey": ...}`` (the file ``basalt cluster
        up --auth`` writes). Raises OSError, ValueError for a malformed file."""
        try:
            raw = json.loads(Path(path).read_text())
            return cls(str(raw["accessKey"]), str(raw["secretKey"]))
        except (KeyError, TypeError, json.JSONDecodeError) as e:
            raise ValueError(f"{path}: not a credentials file ({type(e).__name__})") from None

    def to_file(self, path: str | Path) -> None:
        """Write the file :meth:`from_file` reads, readable by its owner only."""
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"accessKey": self.access_key, "secretKey": self.secret_key}, f)


@dataclasses.dataclass(frozen=True, slots=True)
class Authorization:
    """A parsed ``authorization`` value (the signature as sent, any case)."""

    access_key: str
    signed_headers: str
    signature: str


def sign(secret_key: str, date_time: str) -> str:
    """Lower-case hex HMAC-SHA1 of ``date_time`` keyed by ``secret_key``."""
    return hmac.new(secret_key.encode(), date_time.encode(), hashlib.sha1).hexdigest()


def format_date_time(now_s: float) -> str:
    """``now_s`` (Unix seconds) as the UTC ``x-mq-date-time`` value."""
    return time.strftime(DATE_TIME_FORMAT, time.gmtime(now_s))


def parse_date_time(text: str) -> float:
    """Unix seconds of an ``x-mq-date-time`` value, read as UTC. Raises ValueError."""
    return float(calendar.timegm(time.strptime(text, DATE_TIME_FORMAT)))


def parse_authorization(value: str) -> Authorization:
    """Parse an ``authorization`` value; ValueError (naming no secret) when it is
    not an MQv2-HMAC-SHA1 one."""
    match = _AUTHORIZATION_RE.match(value.strip())
    if match is None:
        raise ValueError(
            f"authorization is not '{ALGORITHM} Credential=<access key>, "
            f"SignedHeaders={DATE_TIME}, Signature=<hex>'"
        )
    return Authorization(match["ak"], match["headers"].lower(), match["sig"])


def signed_metadata(credentials: Credentials, now_s: float) -> tuple[tuple[str, str], ...]:
    """The two entries that sign a call made at ``now_s``."""
    date_time = format_date_time(now_s)
    signature = sign(credentials.secret_key, date_time)
    authorization = (
        f"{ALGORITHM} Credential={credentials.access_key}, "
        f"SignedHeaders={DATE_TIME}, Signature={signature}"
    )
    return ((DATE_TIME, date_time), (AUTHORIZATION, authorization))


# -- client side ---------------------------------------------------------------------


_process_credentials: Credentials | None = None


def use_process_credentials(credentials: Credentials | None) -> None:
    """Sign every channel this process makes without credentials of its own
    (:func:`signing_interceptors` with None) with ``credentials``: a service's
    calls to other services, the CLI's calls. Set once, at the process edge."""
    global _process_credentials
    _process_credentials = credentials


def process_credentials() -> Credentials | None:
    """What :func:`use_process_credentials` set (None: calls go unsigned)."""
    return _process_credentials


class _Signing:
    """Adds a fresh signature to each call's metadata when the call starts."""

    def __init__(self, credentials: Credentials, clock: Callable[[], float]) -> None:
        self._credentials = credentials
        self._clock = clock

    def _signed(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        metadata = grpc.aio.Metadata(*(details.metadata or ()))
        for key, value in signed_metadata(self._credentials, self._clock()):
            metadata[key] = value
        return grpc.aio.ClientCallDetails(
            details.method, details.timeout, metadata, details.credentials, details.wait_for_ready
        )


class _UnaryUnarySigning(_Signing, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._signed(details), request)


class _UnaryStreamSigning(_Signing, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._signed(details), request)


class _StreamUnarySigning(_Signing, grpc.aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return await continuation(self._signed(details), requests)


def signing_interceptors(
    credentials: Credentials | None = None, *, clock: Callable[[], float] = time.time
) -> Sequence[grpc.aio.ClientInterceptor]:
    """Client interceptors that sign with ``credentials``, or with
    :func:`process_credentials` when None; none when neither is set. One per
    kind of call but the bidirectional one: a stream-stream interceptor makes
    grpc.aio route each write through a queue and a task, so those streams are
    signed as they open (:func:`basalt.common.dial.open_stream`, with
    :func:`signed_metadata`)."""
    chosen = credentials if credentials is not None else _process_credentials
    if chosen is None:
        return []
    return [
        _UnaryUnarySigning(chosen, clock),
        _UnaryStreamSigning(chosen, clock),
        _StreamUnarySigning(chosen, clock),
    ]


class _SyncCallDetails(grpc.ClientCallDetails):
    """The blocking API's call details are an interface only; this fills it."""

    def __init__(
        self, details: grpc.ClientCallDetails, metadata: tuple[tuple[str, str | bytes], ...]
    ) -> None:
        self.method = details.method
        self.timeout = details.timeout
        self.metadata = metadata
        self.credentials = details.credentials
        self.wait_for_ready = getattr(details, "wait_for_ready", None)
        self.compression = getattr(details, "compression", None)


class SyncSigning(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """:func:`signing_interceptors` for a blocking channel (``grpc.intercept_channel``):
    one interceptor serves every kind of call there."""

    def __init__(self, credentials: Credentials, clock: Callable[[], float] = time.time) -> None:
        self._credentials = credentials
        self._clock = clock

    def _signed(self, details: grpc.ClientCallDetails) -> grpc.ClientCallDetails:
        signed = signed_metadata(self._credentials, self._clock())
        names = {k for k, _ in signed}
        kept = tuple((k, v) for k, v in (details.metadata or ()) if k not in names)
        return _SyncCallDetails(details, (*kept, *signed))

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._signed(details), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._signed(details), request)

    def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self._signed(details), requests)

    def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self._signed(details), requests)


def sync_signing(credentials: Credentials | None = None) -> SyncSigning | None:
    """:class:`SyncSigning` with ``credentials``, or with :func:`process_credentials`
    when None; None when neither is set (calls go unsigned)."""
    chosen = credentials if credentials is not None else _process_credentials
    return None if chosen is None else SyncSigning(chosen)


#: The environment variable naming a credentials file for the CLI and for a
#: process without a command line of its own (:func:`credentials_from_env`).
CREDENTIALS_ENV = "BASALT_CREDENTIALS"


def credentials_from_env(environ: Mapping[str, str] | None = None) -> Credentials | None:
    """The credentials in the file ``BASALT_CREDENTIALS`` names (None: unset) - a
    process without a command line of its own (Spark's executors, which inherit
    the driver's environment, as they do ``BASALT_TLS_*``). Raises OSError or
    ValueError for a file that cannot be read."""
    environ = os.environ if environ is None else environ
    named = environ.get(CREDENTIALS_ENV, "").strip()
    return Credentials.from_file(named) if named else None
