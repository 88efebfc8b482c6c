"""How to reach etcd, and where Basalt's keys live in it (docs/architecture.md#etcd-keys).

Key layout, all under ``/basalt/<cluster>/`` (values: basalt.services.meta.model):

=================================  ============================  ============================
key                                value (JSON)                  lifetime
=================================  ============================  ============================
``topics/<topic>``                 TopicConfig                   durable, CAS on mod_revision
``brokers/<broker_name>``          BrokerRegistration            the store-node's lease
``pull-services/<id>``             PullServiceRegistration       the pull-service's lease
``consumers/<group>/<client_id>``  ConsumerRegistration          its pull-service's lease
``groups/<broker>/state``          GroupState                    durable, CAS only
``groups/<broker>/members/<id>``   MemberRegistration            the member's lease
=================================  ============================  ============================

``brokers/<broker_name>`` of a replicated group is the master's route, under
the master's member lease (basalt.services.meta.groups, docs/replication.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from basalt.common.settings import (
    Check,
    at_least,
    config_dataclass,
    from_validator,
    positive,
    setting,
    validate,
)
from basalt.services.meta.errors import MetaValidationError
from basalt.services.meta.fields import (
    MAX_NAME_LENGTH,
    NAME_CHARS,
    check_address,
    check_broker_id,
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


def name_rule(what: str) -> Check:
    """:func:`check_name`'s rule (one etcd key segment) as a setting's check."""
    return from_validator(
        f"a {what}: 1-{MAX_NAME_LENGTH} characters of {NAME_CHARS}", lambda v: check_name(v, what)
    )


def _check_endpoints(endpoints: tuple[str, ...]) -> None:
    if not endpoints:
        raise MetaValidationError("no etcd endpoint")
    for endpoint in endpoints:
        check_address(endpoint, "etcd endpoint")


@config_dataclass
class MetaConfig:
    """Connection and behaviour of the metadata client. Validated at construction:
    MetaValidationError names the first bad field."""

    endpoints: tuple[str, ...] = setting(
        default=("127.0.0.1:2379",),
        check=from_validator(
            "one or more etcd endpoints (each etcd endpoint must be host:port)", _check_endpoints
        ),
        doc=(
            "etcd client endpoints as host:port (one 'h1:2379,h2:2379' string is taken "
            "too); tried in order, failing over on connection errors."
        ),
    )
    cluster: str = setting(
        default="DefaultCluster",
        check=name_rule("cluster name"),
        doc=(
            "The cluster's name: every key lives under /basalt/<cluster>/ "
            "(RocketMQ's brokerClusterName default)."
        ),
    )
    lease_ttl_s: int = setting(
        default=10,
        check=at_least(MIN_LEASE_TTL_S),
        doc=(
            "TTL of registration leases: a killed process's keys vanish this long after "
            "its last keepalive (which it sends every third of it); etcd's minimum is 2."
        ),
    )
    op_timeout_s: float = setting(
        default=3.0,
        check=positive,
        doc="Deadline of one etcd request; past it the endpoint counts as unreachable.",
    )
    max_cas_attempts: int = setting(
        default=16,
        check=positive,
        doc="Read-modify-write attempts before a compare-and-swap gives up.",
    )
    reconnect_backoff_max_s: float = setting(
        default=1.0,
        check=positive,
        doc="Longest pause between reconnection attempts of watchers and registrations.",
    )

    def __post_init__(self) -> None:
        given: object = self.endpoints
        # A single "h1:2379,h2:2379" string (a flag or env value) is accepted too.
        endpoints = parse_endpoints(given) if isinstance(given, str) else tuple(self.endpoints)
        object.__setattr__(self, "endpoints", endpoints)
        validate(self, MetaValidationError)


#: The key families basalt.services.auth keeps under the cluster's root.
AUTH_KINDS = ("users", "acls")


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
    def rocketmq_v2_fronts(self) -> str:
        """Prefix of the store-nodes' own RocketMQ 5 fronts (``<broker>/<id>`` each)."""
        return self.root + "rocketmq-v2/"

    @property
    def consumers(self) -> str:
        return self.root + "consumers/"

    def consumer_group(self, group: str) -> str:
        """Prefix of one group's consumers (ends with ``/``)."""
        return f"{self.consumers}{check_group_name(group)}/"

    def consumer(self, group: str, client_id: str) -> str:
        return self.consumer_group(group) + check_name(client_id, "client id")

    @property
    def groups(self) -> str:
        return self.root + "groups/"

    def group(self, broker_name: str) -> str:
        """Prefix of one broker group's keys (ends with ``/``): its state and members."""
        return f"{self.groups}{check_name(broker_name, 'broker name')}/"

    def group_state(self, broker_name: str) -> str:
        """The group's state (:class:`basalt.services.meta.model.GroupState`), CAS only."""
        return self.group(broker_name) + "state"

    def group_members(self, broker_name: str) -> str:
        """Prefix of the group's live members (ends with ``/``)."""
        return self.group(broker_name) + "members/"

    def group_member(self, broker_name: str, broker_id: int) -> str:
        """One member's registration, under its lease."""
        return self.group_members(broker_name) + str(check_broker_id(broker_id))

    def auth(self, kind: str) -> str:
        """Prefix of the users (``users/``) or the ACLs (``acls/``, by username)."""
        if kind not in AUTH_KINDS:
            raise MetaValidationError(f"auth kind must be one of {AUTH_KINDS}, got {kind!r}")
        return f"{self.root}{kind}/"

    def auth_entry(self, kind: str, username: str) -> str:
        return self.auth(kind) + check_name(username, "username")

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
