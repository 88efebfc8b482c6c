"""The values stored in etcd: topic configs and registrations, with their JSON.

Every value is a frozen dataclass validated at construction, encoded as one
JSON object (sorted keys, no spaces) and decoded strictly: wrong types and
out-of-range values raise :class:`MetaValidationError` naming the key and the
field; unknown fields are ignored so newer writers do not break older readers.
Each value carries its own identity (topic name, broker name, ...) as well as
being named by its key; a decoder given the key's name checks they agree.

JSON shapes (``/basalt/<cluster>/`` + key):

``topics/<topic>``::

    {"filter": "SINGLE_TAG", "order": false, "perm": 6, "read_queue_nums": 8,
     "brokers": ["broker-a", "broker-b"], "topic_name": "T", "write_queue_nums": 8}

``brokers/<broker_name>``::

    {"address": "127.0.0.1:10911", "broker_name": "broker-a", "perm": 6,
     "started_at_ms": 1700000000000, "store_root_id": "5f0c..."}

``groups/<broker>/state`` (CAS only; docs/replication.md)::

    {"epoch": 3, "master_id": 1, "sync_state_set": [1, 2], "version": 7}

``groups/<broker>/members/<id>``::

    {"address": "10.0.0.2:10911", "broker_id": 1, "broker_name": "broker-a",
     "client_address": "", "confirm_offset": 4096, "epoch": 3, "max_offset": 8192,
     "role": "SLAVE", "store_root_id": "5f0c..."}

A broker of a replicated group adds its ``broker_id`` and ``epoch`` to
``brokers/<broker_name>`` (left out while 0, the shape single-node store-nodes
always wrote).

``pull-services/<id>``::

    {"address": "127.0.0.1:8081", "pull_service_id": "pull-1", "started_at_ms": 1700000000000}

``rocketmq-v2/<broker_name>/<broker_id>`` (a store-node's own RocketMQ 5 front)::

    {"address": "127.0.0.1:10911", "broker_id": 0, "broker_name": "broker-a",
     "endpoint": "127.0.0.1:8081"}

``consumers/<group>/<client_id>``::

    {"client_id": "10.0.0.5@4242", "client_version": "basalt-py/0.1.0",
     "connected_since_ms": 1700000000000, "group": "G", "pull_service_id": "pull-1",
     "subscriptions": [{"expression": "a || b", "expression_type": "TAG", "topic": "T"}]}

The group values (GroupState, MemberRegistration) are defined in
``group_model`` and importable from here.

``perm`` is RocketMQ's PermName bit set as a number, so values written by or
for RocketMQ tools mean the same here: 6 = read+write, 4 = read only,
2 = write only, 0 = deny (8 PRIORITY and 1 INHERIT are kept but unused).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace
from typing import Protocol

from basalt.common.settings import (
    between,
    boolean,
    config_dataclass,
    from_validator,
    instance_of,
    integer,
    one_of,
    setting,
    validate,
)
from basalt.services.meta.errors import MetaValidationError
from basalt.services.meta.fields import (
    check_address,
    check_broker_id,
    check_group_name,
    check_millis,
    check_name,
    check_non_negative,
    check_topic_name,
    decode_object,
    dumps,
    get_bool,
    get_identity,
    get_int,
    get_list,
    get_names,
    get_str,
    prefixed,
)
from basalt.services.meta.group_model import GroupState, MemberRegistration, MemberRole

#: RocketMQ's defaultTopicQueueNums: queues of an automatically created topic.
DEFAULT_TOPIC_QUEUE_NUMS = 4
#: RocketMQ's TopicConfig defaults (defaultReadQueueNums / defaultWriteQueueNums).
DEFAULT_QUEUE_NUMS = 16
#: Upper bound on read/write queue counts (RocketMQ tools cap a topic well below this).
MAX_QUEUE_NUMS = 1024


__all__ = [
    "DEFAULT_QUEUE_NUMS",
    "DEFAULT_TOPIC_QUEUE_NUMS",
    "MAX_QUEUE_NUMS",
    "BrokerRegistration",
    "ConsumerRegistration",
    "ExpressionType",
    "GroupState",
    "MemberRegistration",
    "MemberRole",
    "Perm",
    "PullServiceRegistration",
    "Registrable",
    "Subscription",
    "TopicConfig",
    "TopicFilterType",
]


class Perm(enum.IntFlag):
    """RocketMQ's PermName bits; the JSON holds the number."""

    DENY = 0
    INHERIT = 1
    WRITE = 2
    READ = 4
    PRIORITY = 8
    RW = READ | WRITE

    @classmethod
    def parse(cls, value: int | str) -> Perm:
        """A Perm from a number (0..15, also as digits) or "RW"/"R"/"W"/"DENY".

        Raises MetaValidationError on anything else.
        """
        if isinstance(value, str):
            text = value.strip().upper()
            named = {"RW": cls.RW, "WR": cls.RW, "R": cls.READ, "W": cls.WRITE, "DENY": cls.DENY}
            if text in named:
                return named[text]
            if not text.isdigit():
                raise MetaValidationError(f"perm must be RW, R, W, DENY or 0..15, got {value!r}")
            value = int(text)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 15:
            raise MetaValidationError(f"perm must be RocketMQ PermName bits 0..15, got {value!r}")
        return cls(value)

    @property
    def readable(self) -> bool:
        return bool(self & Perm.READ)

    @property
    def writable(self) -> bool:
        return bool(self & Perm.WRITE)


class TopicFilterType(enum.StrEnum):
    """RocketMQ's topicFilterType: whether a message carries one tag or several."""

    SINGLE_TAG = "SINGLE_TAG"
    MULTI_TAG = "MULTI_TAG"


class ExpressionType(enum.StrEnum):
    """RocketMQ's ExpressionType of a subscription."""

    TAG = "TAG"
    SQL92 = "SQL92"


# -- values -------------------------------------------------------------------------


class Registrable(Protocol):
    """A value that lives under a lease: it knows its key suffix and its JSON."""

    def key_suffix(self) -> str:
        """The key below ``/basalt/<cluster>/``, e.g. ``brokers/broker-a``."""
        ...

    def to_json(self) -> bytes: ...


def _broker_names(brokers: object, where: str = "topic") -> tuple[str, ...]:
    """A topic's ``brokers`` as a tuple: any iterable of broker names but a
    string, none twice. Raises MetaValidationError naming ``where``."""
    if isinstance(brokers, str) or not isinstance(brokers, Iterable):
        raise MetaValidationError(f"{where}: brokers must be a list of names, got {brokers!r}")
    names = tuple(brokers)
    for name in names:
        check_name(name, f"{where}: broker name")
    if len(set(names)) != len(names):
        raise MetaValidationError(f"{where}: brokers lists a name twice: {list(names)}")
    return names


@config_dataclass
class TopicConfig:
    """One topic's configuration (RocketMQ's TopicConfig), key ``topics/<topic_name>``.

    Queues ``0 <= q < write_queue_nums`` take sends and ``0 <= q < read_queue_nums``
    serve pulls on every broker in ``brokers``; lowering write before read lets
    the removed queues drain (RocketMQ's way to shrink a topic).
    """

    topic_name: str = setting(
        check=from_validator("a topic name: 1-127 characters of [%|a-zA-Z0-9_-]", check_topic_name),
        doc="The topic (its topics/<topic_name> key).",
    )
    read_queue_nums: int = setting(
        default=DEFAULT_QUEUE_NUMS,
        check=integer & between(1, MAX_QUEUE_NUMS),
        doc="Queues 0 <= q < read_queue_nums serve pulls.",
    )
    write_queue_nums: int = setting(
        default=DEFAULT_QUEUE_NUMS,
        check=integer & between(1, MAX_QUEUE_NUMS),
        doc="Queues 0 <= q < write_queue_nums take sends.",
    )
    perm: Perm = setting(
        default=Perm.RW,
        check=instance_of(Perm, "RocketMQ PermName bits 0..15"),
        doc="RocketMQ's PermName bits (a number, or RW, R, W, DENY).",
    )
    brokers: tuple[str, ...] = setting(
        default=(),
        check=from_validator("broker names, none listed twice", _broker_names),
        doc="Names of the store-nodes hosting the topic (their brokers/<name> keys).",
    )
    order: bool = setting(default=False, check=boolean, doc="RocketMQ's order flag.")
    filter: TopicFilterType = setting(
        default=TopicFilterType.SINGLE_TAG,
        check=one_of(*TopicFilterType),
        doc="Whether a message carries one tag or several (RocketMQ's topicFilterType).",
    )

    def __post_init__(self) -> None:
        # The identity and the broker names first, by the services' name rules,
        # whose messages name the value ("broker name 'a/b' is not ..."; admin
        # clients see them), so that every later message can name the topic.
        check_topic_name(self.topic_name)
        where = f"topic {self.topic_name!r}"
        # The other forms the fields are given in: perm as a number or "RW", the
        # filter as its value, brokers as any iterable of names.
        try:
            object.__setattr__(self, "perm", Perm.parse(self.perm))
            object.__setattr__(self, "filter", TopicFilterType(self.filter))
        except (MetaValidationError, ValueError) as e:
            raise MetaValidationError(f"{where}: {e}") from None
        object.__setattr__(self, "brokers", _broker_names(self.brokers, where))
        validate(self, MetaValidationError, where=where)

    @property
    def readable(self) -> bool:
        return self.perm.readable

    @property
    def writable(self) -> bool:
        return self.perm.writable

    def with_broker(self, broker: str) -> TopicConfig:
        """This config with ``broker`` appended to ``brokers`` (itself if already there)."""
        return self if broker in self.brokers else replace(self, brokers=(*self.brokers, broker))

    def key_suffix(self) -> str:
        return f"topics/{self.topic_name}"

    def to_json(self) -> bytes:
        return dumps(
            {
                "topic_name": self.topic_name,
                "read_queue_nums": self.read_queue_nums,
                "write_queue_nums": self.write_queue_nums,
                "perm": int(self.perm),
                "brokers": list(self.brokers),
                "order": self.order,
                "filter": self.filter.value,
            }
        )

    @classmethod
    def from_json(cls, raw: bytes | str, *, topic_name: str | None = None) -> TopicConfig:
        """Decode a ``topics/<topic_name>`` value; raises MetaValidationError."""
        where = f"topics/{topic_name}" if topic_name is not None else "topic config"
        return decode_object(
            raw,
            where,
            lambda data: cls(
                topic_name=get_identity(data, "topic_name", topic_name, where),
                read_queue_nums=get_int(data, "read_queue_nums", where),
                write_queue_nums=get_int(data, "write_queue_nums", where),
                perm=Perm.parse(get_int(data, "perm", where)),
                brokers=tuple(get_names(get_list(data, "brokers", where, []), "brokers", where)),
                order=get_bool(data, "order", where, False),
                filter=TopicFilterType(get_str(data, "filter", where, TopicFilterType.SINGLE_TAG)),
            ),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class BrokerRegistration:
    """A live store-node, key ``brokers/<broker_name>``, bound to its lease."""

    broker_name: str
    #: The store-node's gRPC address, ``host:port``: what services dial.
    address: str
    #: Identifies the store root it serves (survives restarts of the same root).
    store_root_id: str
    started_at_ms: int
    perm: Perm = Perm.RW
    #: The address clients are given in routes (``--client-address``, Kafka's
    #: external listener); empty: ``address``. Records written before it
    #: existed load with it empty.
    client_address: str = ""
    #: The master's epoch when a replicated group's master published this route
    #: (docs/replication.md); 0: a store-node outside any group.
    epoch: int = 0
    #: The publishing member's id within its group (0 outside any group).
    broker_id: int = 0

    def __post_init__(self) -> None:
        check_name(self.broker_name, "broker name")
        where = f"broker {self.broker_name!r}"
        try:
            check_address(self.address, "address")
            if self.client_address:
                check_address(self.client_address, "client_address")
            object.__setattr__(self, "perm", Perm.parse(self.perm))
            check_non_negative(self.epoch, "epoch")
            check_broker_id(self.broker_id)
        except MetaValidationError as e:
            raise prefixed(where, e) from None
        if not isinstance(self.store_root_id, str) or not self.store_root_id:
            raise MetaValidationError(f"{where}: store_root_id must be a non-empty string")
        check_millis(self.started_at_ms, "started_at_ms", where)

    def key_suffix(self) -> str:
        return f"brokers/{self.broker_name}"

    def to_json(self) -> bytes:
        data = {**asdict(self), "perm": int(self.perm)}
        for unset in ("client_address", "epoch", "broker_id"):
            if not data[unset]:  # absent when unset: the shape older readers know
                del data[unset]
        return dumps(data)

    @classmethod
    def from_json(cls, raw: bytes | str, *, broker_name: str | None = None) -> BrokerRegistration:
        where = f"brokers/{broker_name}" if broker_name is not None else "broker registration"
        return decode_object(
            raw,
            where,
            lambda data: cls(
                broker_name=get_identity(data, "broker_name", broker_name, where),
                address=get_str(data, "address", where),
                store_root_id=get_str(data, "store_root_id", where),
                started_at_ms=get_int(data, "started_at_ms", where),
                perm=Perm.parse(get_int(data, "perm", where, int(Perm.RW))),
                client_address=get_str(data, "client_address", where, ""),
                epoch=get_int(data, "epoch", where, 0),
                broker_id=get_int(data, "broker_id", where, 0),
            ),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class FrontRegistration:
    """A store-node's own RocketMQ 5 front (RocketMQ 5's "local" proxy mode),
    key ``rocketmq-v2/<broker_name>/<broker_id>``, bound to the store-node's lease.

    Routes given by a store-node's front name, for each broker, the front of
    the member that is its master now: the registration whose ``address`` is
    the broker's (``brokers/<name>``), so the official clients send and receive
    where the data is (docs/rocketmq-v2.md)."""

    broker_name: str
    broker_id: int = 0
    #: The store-node's gRPC address (what ``brokers/<name>`` names while it is master).
    address: str
    #: ``host:port`` the official clients dial for this node's queues.
    endpoint: str

    def __post_init__(self) -> None:
        check_name(self.broker_name, "broker name")
        where = f"RocketMQ 5 front of broker {self.broker_name!r}"
        try:
            check_broker_id(self.broker_id)
            check_address(self.address, "address")
            check_address(self.endpoint, "endpoint")
        except MetaValidationError as e:
            raise prefixed(where, e) from None

    def key_suffix(self) -> str:
        return f"rocketmq-v2/{self.broker_name}/{self.broker_id}"

    def to_json(self) -> bytes:
        return dumps(asdict(self))

    @classmethod
    def from_json(cls, raw: bytes | str, *, name: str | None = None) -> FrontRegistration:
        """Decode the value; ``name`` (``<broker_name>/<broker_id>``, the key below
        ``rocketmq-v2/``) must agree with it when given."""
        where = f"rocketmq-v2/{name}" if name is not None else "RocketMQ 5 front"
        broker, _, broker_id = (name or "").partition("/")
        made = decode_object(
            raw,
            where,
            lambda data: cls(
                broker_name=get_identity(data, "broker_name", broker or None, where),
                broker_id=get_int(data, "broker_id", where, 0),
                address=get_str(data, "address", where),
                endpoint=get_str(data, "endpoint", where),
            ),
        )
        if name is not None and broker_id != str(made.broker_id):
            raise MetaValidationError(f"{where}: broker_id {made.broker_id} is not the key's")
        return made


@dataclass(frozen=True, slots=True, kw_only=True)
class PullServiceRegistration:
    """A live pull-service, key ``pull-services/<pull_service_id>``, bound to its lease."""

    pull_service_id: str
    #: What other pull-services dial (a consumer's session owner).
    address: str
    started_at_ms: int = 0
    #: The address clients are given (``--client-address``); empty: ``address``.
    client_address: str = ""

    def __post_init__(self) -> None:
        check_name(self.pull_service_id, "pull-service id")
        where = f"pull-service {self.pull_service_id!r}"
        try:
            check_address(self.address, "address")
            if self.client_address:
                check_address(self.client_address, "client_address")
        except MetaValidationError as e:
            raise prefixed(where, e) from None
        check_millis(self.started_at_ms, "started_at_ms", where)

    def key_suffix(self) -> str:
        return f"pull-services/{self.pull_service_id}"

    def to_json(self) -> bytes:
        data = asdict(self)
        if not self.client_address:  # absent when unset: the shape older readers know
            del data["client_address"]
        return dumps(data)

    @classmethod
    def from_json(
        cls, raw: bytes | str, *, pull_service_id: str | None = None
    ) -> PullServiceRegistration:
        where = (
            f"pull-services/{pull_service_id}" if pull_service_id is not None else "pull-service"
        )
        return decode_object(
            raw,
            where,
            lambda data: cls(
                pull_service_id=get_identity(data, "pull_service_id", pull_service_id, where),
                address=get_str(data, "address", where),
                started_at_ms=get_int(data, "started_at_ms", where, 0),
                client_address=get_str(data, "client_address", where, ""),
            ),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Subscription:
    """One topic a consumer subscribes to (RocketMQ's SubscriptionData, minus the parsed tags)."""

    topic: str
    expression_type: ExpressionType = ExpressionType.TAG
    #: TAG: ``*`` or ``a || b``; SQL92: a boolean expression over properties.
    expression: str = "*"

    def __post_init__(self) -> None:
        check_topic_name(self.topic)
        try:
            object.__setattr__(self, "expression_type", ExpressionType(self.expression_type))
        except ValueError:
            raise MetaValidationError(
                f"subscription to {self.topic!r}: expression_type must be TAG or SQL92, "
                f"got {self.expression_type!r}"
            ) from None
        if not isinstance(self.expression, str):
            raise MetaValidationError(
                f"subscription to {self.topic!r}: expression must be a string"
            )

    def to_dict(self) -> dict[str, object]:
        return {
            "topic": self.topic,
            "expression_type": self.expression_type.value,
            "expression": self.expression,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerRegistration:
    """A live consumer session, key ``consumers/<group>/<client_id>``, under the
    lease of the pull-service holding the session."""

    group: str
    client_id: str
    pull_service_id: str
    subscriptions: tuple[Subscription, ...] = field(default=())
    client_version: str = ""
    #: When the session opened, epoch millis (ListConsumers shows it wherever the
    #: session is); 0: unknown (a registration from before the field existed).
    connected_since_ms: int = 0

    def __post_init__(self) -> None:
        check_group_name(self.group)
        check_name(self.client_id, "client id")
        where = f"consumer {self.group}/{self.client_id}"
        try:
            check_name(self.pull_service_id, "pull-service id")
        except MetaValidationError as e:
            raise prefixed(where, e) from None
        subs = tuple(self.subscriptions)
        if not all(isinstance(s, Subscription) for s in subs):
            raise MetaValidationError(f"{where}: subscriptions must be Subscription values")
        if len({s.topic for s in subs}) != len(subs):
            raise MetaValidationError(f"{where}: a topic is subscribed twice")
        object.__setattr__(self, "subscriptions", subs)
        if not isinstance(self.client_version, str):
            raise MetaValidationError(f"{where}: client_version must be a string")
        check_millis(self.connected_since_ms, "connected_since_ms", where)

    def key_suffix(self) -> str:
        return f"consumers/{self.group}/{self.client_id}"

    def to_json(self) -> bytes:
        return dumps(
            {
                "group": self.group,
                "client_id": self.client_id,
                "pull_service_id": self.pull_service_id,
                "subscriptions": [s.to_dict() for s in self.subscriptions],
                "client_version": self.client_version,
                "connected_since_ms": self.connected_since_ms,
            }
        )

    @classmethod
    def from_json(
        cls, raw: bytes | str, *, group: str | None = None, client_id: str | None = None
    ) -> ConsumerRegistration:
        where = f"consumers/{group}/{client_id}" if group is not None else "consumer registration"

        def subscriptions(items: Iterable[object]) -> tuple[Subscription, ...]:
            subs = []
            for item in items:
                if not isinstance(item, dict):
                    raise MetaValidationError(f"{where}: a subscription must be an object")
                subs.append(
                    Subscription(
                        topic=get_str(item, "topic", where),
                        expression_type=ExpressionType(
                            get_str(item, "expression_type", where, ExpressionType.TAG)
                        ),
                        expression=get_str(item, "expression", where, "*"),
                    )
                )
            return tuple(subs)

        return decode_object(
            raw,
            where,
            lambda data: cls(
                group=get_identity(data, "group", group, where),
                client_id=get_identity(data, "client_id", client_id, where),
                pull_service_id=get_str(data, "pull_service_id", where),
                subscriptions=subscriptions(get_list(data, "subscriptions", where, [])),
                client_version=get_str(data, "client_version", where, ""),
                connected_since_ms=get_int(data, "connected_since_ms", where, 0),
            ),
        )
