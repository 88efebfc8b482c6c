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
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc

from basalt.common import auth
from basalt.common.telemetry import client_interceptors
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
        return grpc.aio.insecure_channel(address, options=options, interceptors=interceptors)
    assert tls is not None
    return grpc.aio.secure_channel(
        address,
        channel_credentials(tls),
        options=channel_options(tls, options),
        interceptors=interceptors,
    )


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
