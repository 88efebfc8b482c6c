"""Transport security: TLS and mutual TLS for every gRPC server and channel.

One :class:`TlsConfig` per process says which PEM files it presents and
trusts. A service serves with it (:func:`server_credentials`, through
``basalt.services.process.add_port``) and dials with it - other services,
etcd - (:func:`basalt.common.dial.channel` takes a :class:`TlsConfig`);
the SDK and the CLI dial with it. In one cluster
one CA signs every certificate, so a service's certificate is both its
server certificate and its client certificate (``basalt cluster up --tls``
makes them so: basalt.services.cluster.certs).

Rotation: a server re-reads its three files when one of them changed (size
or modification time), checked before a new connection's handshake
(``grpc.dynamic_ssl_server_credentials`` calls its fetcher then; at most every
``tls_reload_interval_ms``, so a burst of connections does not stat the files
for each): a renewed
certificate is served to the next connection without a restart; connections
already open keep the certificate they began with. A channel reads the files
when it is made. Replace files by renaming a complete file over the old one:
a key and a certificate that do not match (one written, not yet the other)
fail that connection's handshake, and the next connection reads them again.

Client authentication is all or nothing (gRPC Python's choice):
``REQUIRE`` asks every client for a certificate signed by ``tls_ca_file``
and refuses the handshake without one; ``NONE`` asks for none.
"""

from __future__ import annotations

import enum
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import grpc

from basalt.common.settings import (
    boolean,
    check,
    config_dataclass,
    describe,
    instance_of,
    integer,
    non_negative,
    one_of,
    setting,
    validate,
)

log = logging.getLogger(__name__)

#: The env vars :func:`from_env` reads: a service's own settings' names
#: (``--tls-ca-file`` is ``BASALT_TLS_CA_FILE``), so one environment serves both.
ENV_PREFIX = "BASALT_"


class ClientAuth(enum.Enum):
    """Whether a server requires clients to present a certificate (mutual TLS)."""

    NONE = "none"
    REQUIRE = "require"


def _path_or_none(value: object) -> bool:
    return value is None or isinstance(value, Path)


_optional_path = check("a path or none", _path_or_none)


@config_dataclass
class TlsConfig:
    """The PEM files one process presents and trusts, server and client side.

    A server needs ``tls_cert_file`` and ``tls_key_file`` (and
    ``tls_ca_file`` to require client certificates); a client needs
    ``tls_ca_file`` (else the system's roots) and, towards a server that
    requires one, a certificate and key of its own. Raises ValueError for a
    certificate without its key (or the reverse), or client authentication
    required with no CA to check it by."""

    tls_enable: bool = setting(
        default=False,
        check=boolean,
        doc="Serve and dial with TLS (RocketMQ's tlsEnable); every other tls_* setting "
        "applies only when it is true.",
    )
    tls_cert_file: Path | None = setting(
        default=None,
        check=_optional_path,
        doc="PEM certificate chain this process presents (server side, and client side "
        "to a server that requires one); re-read when it changes.",
    )
    tls_key_file: Path | None = setting(
        default=None,
        check=_optional_path,
        doc="PEM private key of tls_cert_file; re-read when it changes.",
    )
    tls_ca_file: Path | None = setting(
        default=None,
        check=_optional_path,
        doc="PEM CA certificates trusted for peers: the servers this process dials and, "
        "with tls_client_auth REQUIRE, its clients; none: the system's roots (client side).",
    )
    tls_client_auth: ClientAuth = setting(
        default=ClientAuth.NONE,
        check=one_of(*ClientAuth),
        doc="REQUIRE: a client must present a certificate signed by tls_ca_file "
        "(mutual TLS); NONE: no client certificate is asked for.",
    )
    tls_server_name: str = setting(
        default="",
        check=instance_of(str, "a string"),
        doc="Client side: the name a server's certificate must carry, when it differs "
        "from the host dialed (an IP address, a load balancer); empty: the host dialed.",
    )

    tls_reload_interval_ms: int = setting(
        default=1_000,
        check=non_negative & integer,
        doc="Server side: how often, at most, a new connection checks whether the "
        "certificate files changed (0: every connection); a rotated certificate is "
        "served from the first connection after the check sees it.",
    )

    def __post_init__(self) -> None:
        for name in ("tls_cert_file", "tls_key_file", "tls_ca_file"):
            value = getattr(self, name)
            if isinstance(value, str):
                object.__setattr__(self, name, Path(value) if value else None)
        if isinstance(self.tls_client_auth, str):
            object.__setattr__(self, "tls_client_auth", ClientAuth[self.tls_client_auth.upper()])
        validate(self, ValueError)
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("tls_cert_file and tls_key_file must be given together")
        if self.tls_enable and self.tls_client_auth is ClientAuth.REQUIRE and not self.tls_ca_file:
            raise ValueError(
                "tls_client_auth REQUIRE needs tls_ca_file (the CA clients are checked by)"
            )

    @property
    def files(self) -> tuple[Path, ...]:
        """The files given, in the order cert, key, CA."""
        given = (self.tls_cert_file, self.tls_key_file, self.tls_ca_file)
        return tuple(p for p in given if p is not None)


#: TLS off: what a process without TLS settings uses.
PLAINTEXT = TlsConfig()


def enabled(tls: TlsConfig | None) -> bool:
    """Whether ``tls`` asks for TLS (None: plaintext)."""
    return tls is not None and tls.tls_enable


def from_env(environ: Mapping[str, str] | None = None) -> TlsConfig:
    """A client's TlsConfig from the ``BASALT_TLS_*`` variables (the CLI, a Spark
    executor): ``BASALT_TLS_ENABLE=true``, ``BASALT_TLS_CA_FILE`` ... . Unset:
    :data:`PLAINTEXT`. Raises ValueError for a bad value."""
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for field in describe(TlsConfig):
        variable = ENV_PREFIX + field.name.upper()
        text = environ.get(variable, "").strip()
        if not text:
            continue
        if field.type is bool:
            if text.lower() not in ("true", "false"):
                raise ValueError(f"{variable} must be true or false, got {text!r}")
            values[field.name] = text.lower() == "true"
        elif field.type is int:
            try:
                values[field.name] = int(text)
            except ValueError:
                raise ValueError(f"{variable} must be an integer, got {text!r}") from None
        else:
            values[field.name] = text  # paths and the enum: TlsConfig converts them
    return TlsConfig(**values)


def _read(path: Path | None) -> bytes | None:
    return None if path is None else path.read_bytes()


# -- server side ------------------------------------------------------------------------


def _stamp(paths: Sequence[Path]) -> tuple[tuple[int, int], ...]:
    stamps = []
    for path in paths:
        stat = path.stat()
        stamps.append((stat.st_mtime_ns, stat.st_size))
    return tuple(stamps)


def _certificate_configuration(tls: TlsConfig) -> Any:
    if tls.tls_cert_file is None or tls.tls_key_file is None:
        raise ValueError("serving TLS needs tls_cert_file and tls_key_file")
    key, chain = tls.tls_key_file.read_bytes(), tls.tls_cert_file.read_bytes()
    return grpc.ssl_server_certificate_configuration([(key, chain)], _read(tls.tls_ca_file))


def certificate_fetcher(
    tls: TlsConfig, *, clock: Callable[[], float] = time.monotonic
) -> Callable[[], Any]:
    """What :func:`server_credentials` gives gRPC to call before each new
    connection's handshake: a new certificate configuration when a file of
    ``tls`` changed since the last read, else None (keep the current one).
    The files are looked at once per ``tls_reload_interval_ms`` of ``clock``
    (seconds) at most; calls in between answer None.
    A file that cannot be read now (being replaced) keeps the current one,
    logged at WARNING; it is tried again at the next connection."""
    last = _stamp(tls.files)
    interval_s = tls.tls_reload_interval_ms / 1000
    checked = clock()

    def fetch() -> Any:
        nonlocal last, checked
        now = clock()
        if now - checked < interval_s:
            return None
        checked = now
        try:
            stamp = _stamp(tls.files)
            if stamp == last:
                return None
            configuration = _certificate_configuration(tls)
        except (OSError, ValueError) as e:
            log.warning("TLS files unreadable, serving the previous certificate: %s", e)
            return None
        last = stamp
        log.info("TLS certificate re-read from %s", tls.tls_cert_file)
        return configuration

    return fetch


def server_credentials(tls: TlsConfig) -> grpc.ServerCredentials:
    """Server credentials from ``tls``'s files, re-read when they change
    (:func:`certificate_fetcher`), client certificates required when
    ``tls_client_auth`` is REQUIRE. Raises ValueError without a certificate
    and key, OSError for a file that cannot be read now."""
    return grpc.dynamic_ssl_server_credentials(
        _certificate_configuration(tls),
        certificate_fetcher(tls),
        require_client_authentication=tls.tls_client_auth is ClientAuth.REQUIRE,
    )


# -- client side ------------------------------------------------------------------------


def channel_credentials(tls: TlsConfig) -> grpc.ChannelCredentials:
    """Channel credentials from ``tls``'s files as they are now: trust
    ``tls_ca_file`` (none: the system's roots), present the certificate and
    key when given. Raises OSError for a file that cannot be read."""
    return grpc.ssl_channel_credentials(
        root_certificates=_read(tls.tls_ca_file),
        private_key=_read(tls.tls_key_file),
        certificate_chain=_read(tls.tls_cert_file),
    )


def channel_options(
    tls: TlsConfig | None, options: Sequence[tuple[str, Any]] = ()
) -> tuple[tuple[str, Any], ...]:
    """``options``, plus the name a server's certificate is checked against
    when ``tls_server_name`` is given."""
    if enabled(tls) and tls is not None and tls.tls_server_name:
        return (*options, ("grpc.ssl_target_name_override", tls.tls_server_name))
    return tuple(options)
