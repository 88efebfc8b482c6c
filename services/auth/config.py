"""The authentication settings every service process takes (``--auth-*``)."""

from __future__ import annotations

from basalt.common.settings import (
    boolean,
    config_dataclass,
    instance_of,
    positive,
    setting,
    validate,
)


@config_dataclass
class AuthConfig:
    """Off by default (the local quickstart). On, every call but health and
    reflection must be signed (docs/security.md)."""

    auth_enabled: bool = setting(
        default=False,
        check=boolean,
        doc="Verify request signatures and ACLs on every RPC of this service.",
    )
    auth_credentials_file: str = setting(
        default="",
        check=instance_of(str, "a path or empty"),
        doc="JSON {accessKey, secretKey} of the cluster's internal super user: this "
        "service signs its calls to other services with it and accepts it. Required "
        "when auth is on.",
    )
    auth_cluster_key_file: str = setting(
        default="",
        check=instance_of(str, "a path or empty"),
        doc="The Fernet key that seals users' secret keys in etcd. Required when auth is on.",
    )
    auth_clock_skew_s: float = setting(
        default=300.0,
        check=positive,
        doc="How far a request's x-mq-date-time may be from this host's clock.",
    )

    def __post_init__(self) -> None:
        validate(self, ValueError)
        if self.auth_enabled and not (self.auth_credentials_file and self.auth_cluster_key_file):
            raise ValueError("auth_enabled needs auth_credentials_file and auth_cluster_key_file")
