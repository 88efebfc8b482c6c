"""How to reach etcd, and where Basalt's keys live in it (ARCHITECTURE §3).

Key layout, all under ``/basalt/<cluster>/`` (values: basalt.services.meta.model):

=================================  ============================  ============================
key                                value (JSON)                  lifetime
=================================  ============================  ============================
``topics/<topic>``                 TopicConfig                   durable, CAS on mod_revision
``brokers/<broker_name>``          BrokerRegistration            the store-node's lease
``pull-services/<id>``             PullServiceRegistration       the pull-service's lease
``consumers/<group>/<client_id>``  ConsumerRegistration          its pull-service's lease
=================================  ============================  ============================
"""

from __future__ import annotations

from dataclasses import dataclass

from basalt.services.meta.errors import MetaValidationError
from basalt.services.meta.fields import (
    check_address,
    check_group_name,
    check_name,
    check_topic_name,
)

#: etcd's smallest lease TTL with its default heartbeat/election settings (1.5 s, rounded up).
MIN_LEASE_TTL_S = 2


def parse_endpoints(text: str) -> tuple[str, ...]:
    """``"h1:2379,h2:2379"`` (also with ``http://``) as a tuple of ``host:port``."""
    endpoints = []
    for part in text.split(","):
        part = part.strip()
        for scheme in ("http://", "https://"):
            part = part.removeprefix(scheme)
        if part:
            endpoints.append(part.rstrip("/"))
    return tuple(endpoints)


@dataclass(frozen=True, slots=True, kw_only=True)
class MetaConfig:
    """Connection and behaviour of the metadata client. Validated at construction."""

    #: etcd client endpoints as ``host:port``; tried in order, failing over on
    #: connection errors.
    endpoints: tuple[str, ...] = ("127.0.0.1:2379",)
    #: The cluster's name: every key lives under ``/basalt/<cluster>/``
    #: (RocketMQ's brokerClusterName default).
    cluster: str = "DefaultCluster"
    #: TTL of registration leases: a killed process's keys vanish this long after
    #: its last keepalive (which it sends every third of it).
    lease_ttl_s: int = 10
    #: Deadline of one etcd request; past it the endpoint counts as unreachable.
    op_timeout_s: float = 3.0
    #: Read-modify-write attempts before a compare-and-swap gives up.
    max_cas_attempts: int = 16
    #: Longest pause between reconnection attempts of watchers and registrations.
    reconnect_backoff_max_s: float = 1.0

    def __post_init__(self) -> None:
        given: object = self.endpoints
        # A single "h1:2379,h2:2379" string (a flag or env value) is accepted too.
        endpoints = parse_endpoints(given) if isinstance(given, str) else tuple(self.endpoints)
        if not endpoints:
            raise MetaValidationError("endpoints must name at least one etcd host:port")
        for e in endpoints:
            check_address(e, "etcd endpoint")
        object.__setattr__(self, "endpoints", endpoints)
        check_name(self.cluster, "cluster name")
        if self.lease_ttl_s < MIN_LEASE_TTL_S:
            raise MetaValidationError(
                f"lease_ttl_s must be at least {MIN_LEASE_TTL_S} (etcd's minimum), "
                f"got {self.lease_ttl_s}"
            )
        if self.op_timeout_s <= 0:
            raise MetaValidationError(f"op_timeout_s must be positive, got {self.op_timeout_s}")
        if self.max_cas_attempts < 1:
            raise MetaValidationError(
                f"max_cas_attempts must be at least 1, got {self.max_cas_attempts}"
            )
        if self.reconnect_backoff_max_s <= 0:
            raise MetaValidationError("reconnect_backoff_max_s must be positive")


@dataclass(frozen=True, slots=True)
class MetaKeys:
    """The key layout of one cluster. Names are validated before they become keys,
    so a ``/`` in a name can never reach into another prefix."""

    cluster: str

    def __post_init__(self) -> None:
        check_name(self.cluster, "cluster name")

    @property
    def root(self) -> str:
        return f"/basalt/{self.cluster}/"

    def of(self, key_suffix: str) -> str:
        """The full key of a value's ``key_suffix()``."""
        return self.root + key_suffix

    @property
    def topics(self) -> str:
        return self.root + "topics/"

    def topic(self, topic: str) -> str:
        return self.topics + check_topic_name(topic)

    @property
    def brokers(self) -> str:
        return self.root + "brokers/"

    def broker(self, broker_name: str) -> str:
        return self.brokers + check_name(broker_name, "broker name")

    @property
    def pull_services(self) -> str:
        return self.root + "pull-services/"

    def pull_service(self, pull_service_id: str) -> str:
        return self.pull_services + check_name(pull_service_id, "pull-service id")

    @property
    def consumers(self) -> str:
        return self.root + "consumers/"

    def consumer_group(self, group: str) -> str:
        """Prefix of one group's consumers (ends with ``/``)."""
        return f"{self.consumers}{check_group_name(group)}/"

    def consumer(self, group: str, client_id: str) -> str:
        return self.consumer_group(group) + check_name(client_id, "client id")

    def queue_locks(self, group: str) -> str:
        """Prefix of one group's queue locks (ends with ``/``)."""
        return f"{self.root}locks/{check_group_name(group)}/"

    def queue_lock(self, group: str, topic: str, broker_name: str, queue_id: int) -> str:
        """The lock of one queue for one group (held by a consumer's client id)."""
        if queue_id < 0:
            raise MetaValidationError(f"queue id {queue_id} is negative")
        return (
            f"{self.queue_locks(group)}{check_topic_name(topic)}/"
            f"{check_name(broker_name, 'broker name')}/{queue_id}"
        )
