"""Authentication and authorization of every RPC (docs/security.md).

Users and ACLs in RocketMQ 5's model (``model``), their secrets sealed at
rest (``cipher``), stored and watched on etcd (``store``), every RPC mapped
to what it needs (``rpc_table``), checked by a server interceptor
(``interceptor``); the signature itself is basalt.common.auth, shared with
the SDK. :func:`setup_process` turns it on for a service process.
"""

from __future__ import annotations

from collections.abc import Callable

from basalt.common import auth as signing
from basalt.common.tls import TlsConfig
from basalt.services.auth.cipher import SecretCipher
from basalt.services.auth.config import AuthConfig
from basalt.services.auth.interceptor import AuthGuard, install
from basalt.services.auth.store import AuthCache
from basalt.services.meta import MetaClient, MetaConfig

__all__ = ["AuthConfig", "process_cipher", "setup_process"]

_cipher: SecretCipher | None = None


def process_cipher() -> SecretCipher | None:
    """The cluster key's cipher :func:`setup_process` read (None: no key file)."""
    return _cipher


def setup_process(
    config: AuthConfig, meta: MetaConfig | None, tls: TlsConfig | None = None
) -> None:
    """With auth on: sign this process's outgoing calls as the internal user and
    verify every call its servers take (users and ACLs watched from ``meta``'s
    etcd, dialed with ``tls``; without etcd only the internal user is known).
    Off: nothing changes.
    Raises OSError or ValueError for an unreadable credentials or key file."""
    global _cipher
    # The key is read even with auth off: an admin service can then manage
    # users before the cluster turns verification on.
    cipher = _cipher = (
        SecretCipher.from_file(config.auth_cluster_key_file)
        if config.auth_cluster_key_file
        else None
    )
    if not config.auth_enabled or cipher is None:
        return
    internal = signing.Credentials.from_file(config.auth_credentials_file)
    cache: Callable[[], AuthCache] | None = None
    if meta is not None:
        watched = meta

        def cache() -> AuthCache:
            return AuthCache(MetaClient(watched, tls=tls), cipher)

    signing.use_process_credentials(internal)
    install(AuthGuard(cache, internal, clock_skew_s=config.auth_clock_skew_s))
