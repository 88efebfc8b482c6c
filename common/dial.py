"""Basalt's one channel factory: every gRPC channel the SDK, the CLI and the
services open comes from :func:`channel` (``grpc.aio``) or :func:`sync_channel`
(blocking: the health probe, Spark's executors).

A channel is the three concerns of :mod:`basalt.common` put together, which is
why it lives above all three and none of them imports it:

- transport security from :mod:`basalt.common.tls` (its ``TlsConfig``'s
  credentials and target-name override; plaintext when TLS is off),
- request signatures from :mod:`basalt.common.auth` (the credentials given,
  else the process's, else none),
- the client spans and trace propagation of :mod:`basalt.common.telemetry`
  (grpc.aio channels only: its interceptors are grpc.aio ones).

Bidirectional streams are opened by :func:`open_stream`, not through the
channel's interceptors: grpc.aio routes every write of an intercepted stream
call through a queue and a task of its own (one more loop turn a write: half
a one-in-flight send's client time, BENCHMARKS.md). :func:`open_stream` signs
the call and gives it its span at the start, as the interceptors would, and
writes then go straight to the call. The channel keeps the interceptors of
the three other kinds.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import grpc
from google.protobuf.descriptor import MethodDescriptor

from basalt.common import auth
from basalt.common.telemetry import client_interceptors, stream_spans
from basalt.common.tls import TlsConfig, channel_credentials, channel_options, enabled


def channel(
    address: str,
    tls: TlsConfig | None = None,
    *,
    options: Sequence[tuple[str, Any]] = (),
    credentials: auth.Credentials | None = None,
    signed: bool = True,
) -> grpc.aio.Channel:
    """A ``grpc.aio`` channel to ``address`` with the telemetry interceptors
    (:func:`basalt.common.telemetry.client_interceptors`) and each call signed
    with ``credentials``, or the process's
    (:func:`basalt.common.auth.use_process_credentials`; neither: unsigned) -
    secure with :func:`basalt.common.tls.channel_credentials` when ``tls`` is
    enabled, plaintext otherwise. ``signed=False`` for a peer that is not
    Basalt: etcd reads an ``authorization`` entry as its own auth token and
    refuses the call."""
    signing = auth.signing_interceptors(credentials) if signed else []
    interceptors = [*client_interceptors(), *signing]
    if not enabled(tls):
        made = grpc.aio.insecure_channel(address, options=options, interceptors=interceptors)
    else:
        assert tls is not None
        made = grpc.aio.secure_channel(
            address,
            channel_credentials(tls),
            options=channel_options(tls, options),
            interceptors=interceptors,
        )
    if signed:
        chosen = credentials if credentials is not None else auth.process_credentials()
        if chosen is not None:
            _stream_signers[made] = chosen
    return made


#: The credentials :func:`open_stream` signs a channel's streams with (the
#: channel's signing interceptors'); a channel absent signs nothing.
_stream_signers: weakref.WeakKeyDictionary[grpc.aio.Channel, auth.Credentials] = (
    weakref.WeakKeyDictionary()
)


def rpc_path(method: MethodDescriptor) -> str:
    """``method``'s path on the wire: ``/<package>.<Service>/<Method>``."""
    return f"/{method.containing_service.full_name}/{method.name}"


def open_stream(
    channel: grpc.aio.Channel,
    path: str,
    request_serializer: Callable[[Any], bytes] | None,
    response_deserializer: Callable[[bytes], Any] | None,
) -> grpc.aio.StreamStreamCall[Any, Any]:
    """Open the bidirectional stream at ``path`` (:func:`rpc_path`) on
    ``channel`` (one of :func:`channel`'s): signed as the channel's other calls
    are, in a client span that ends with the call, its trace context in the
    metadata. A serializer None passes bytes through."""
    credentials = _stream_signers.get(channel)
    signature = () if credentials is None else auth.signed_metadata(credentials, time.time())
    call = channel.stream_stream(
        path, request_serializer=request_serializer, response_deserializer=response_deserializer
    )
    return stream_spans.stream(path, lambda context: call(metadata=(*signature, *context)))


def sync_channel(
    address: str,
    tls: TlsConfig | None = None,
    *,
    options: Sequence[tuple[str, Any]] = (),
    credentials: auth.Credentials | None = None,
) -> grpc.Channel:
    """:func:`channel`'s blocking twin (the health probe, Spark's executors):
    TLS as ``tls`` says, calls signed as :func:`channel`'s are (no spans: the
    telemetry interceptors are grpc.aio ones)."""
    if not enabled(tls):
        made = grpc.insecure_channel(address, options=options)
    else:
        assert tls is not None
        made = grpc.secure_channel(
            address, channel_credentials(tls), options=channel_options(tls, options)
        )
    signing = auth.sync_signing(credentials)
    return made if signing is None else grpc.intercept_channel(made, signing)
