"""Users and ACLs in RocketMQ 5's model (ACL 2.0), and the decision they give.

A :class:`User` is an access key (its name), a secret, a type (``Super``
users pass every check) and a status (a ``Disable`` user is refused as if
unknown). An :class:`Acl` belongs to a subject ``User:<name>`` and holds
:class:`Policy` entries: resource patterns (``Topic:orders``, ``Topic:orders-*``
a prefix, ``Group:*``, ``Cluster``, ``*`` anything), actions (``Pub``, ``Sub``,
``Create``, ``Update``, ``Delete``, ``Get``, ``List``, ``All``), a decision
(``Allow``/``Deny``) and optional source IP ranges (CIDR; none: any source).

:func:`decide`: a Deny entry that matches wins over any Allow; no matching
entry is a refusal (default deny). Values round-trip through JSON as stored in
etcd (the user's secret in its encrypted form, :mod:`.cipher`).
"""

from __future__ import annotations

import dataclasses
import enum
import ipaddress
import json
from collections.abc import Iterable, Mapping
from typing import Any


class AuthModelError(ValueError):
    """A user, ACL or resource that does not parse or breaks a rule."""


class UserType(enum.Enum):
    SUPER = "Super"
    NORMAL = "Normal"


class UserStatus(enum.Enum):
    ENABLE = "Enable"
    DISABLE = "Disable"


class Action(enum.Enum):
    PUB = "Pub"
    SUB = "Sub"
    CREATE = "Create"
    UPDATE = "Update"
    DELETE = "Delete"
    GET = "Get"
    LIST = "List"
    ALL = "All"


class Decision(enum.Enum):
    ALLOW = "Allow"
    DENY = "Deny"


class ResourceType(enum.Enum):
    TOPIC = "Topic"
    GROUP = "Group"
    CLUSTER = "Cluster"


@dataclasses.dataclass(frozen=True, slots=True)
class Resource:
    """A concrete resource a call touches: ``Topic:orders``, ``Cluster``."""

    type: ResourceType
    name: str = ""

    def __str__(self) -> str:
        return (
            self.type.value
            if self.type is ResourceType.CLUSTER
            else f"{self.type.value}:{self.name}"
        )


def parse_enum(kind: type[enum.Enum], text: object) -> Any:
    """The member of ``kind`` whose value is ``text``, any case; AuthModelError if none."""
    for member in kind:
        if isinstance(text, str) and member.value.lower() == text.lower():
            return member
    raise AuthModelError(f"{kind.__name__} must be one of {[m.value for m in kind]}, got {text!r}")


@dataclasses.dataclass(frozen=True, slots=True)
class ResourcePattern:
    """A resource an ACL entry names: ``*`` (any), ``Cluster``, ``Topic:*``,
    ``Topic:orders`` (exact) or ``Topic:orders-*`` (prefix)."""

    text: str

    def __post_init__(self) -> None:
        if self.text in ("*", ResourceType.CLUSTER.value):
            return
        kind, sep, name = self.text.partition(":")
        parse_enum(ResourceType, kind)
        if not sep or not name or "*" in name[:-1]:
            raise AuthModelError(
                f"resource must be *, Cluster, Topic:<name>, Group:<name>, "
                f"with one trailing * for a prefix; got {self.text!r}"
            )

    def matches(self, resource: Resource) -> bool:
        if self.text == "*":
            return True
        if self.text == ResourceType.CLUSTER.value:
            return resource.type is ResourceType.CLUSTER
        kind, _, name = self.text.partition(":")
        if parse_enum(ResourceType, kind) is not resource.type:
            return False
        if name.endswith("*"):
            return resource.name.startswith(name[:-1])
        return resource.name == name


@dataclasses.dataclass(frozen=True, slots=True)
class Policy:
    """One ACL entry: resources x actions -> decision, from ``source_ips``."""

    resources: tuple[ResourcePattern, ...]
    actions: frozenset[Action]
    decision: Decision = Decision.ALLOW
    source_ips: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.resources or not self.actions:
            raise AuthModelError("an ACL entry needs at least one resource and one action")
        for cidr in self.source_ips:
            try:
                ipaddress.ip_network(cidr, strict=False)
            except ValueError:
                raise AuthModelError(
                    f"source IP must be an address or CIDR, got {cidr!r}"
                ) from None

    def applies(self, resource: Resource, action: Action, source_ip: str | None) -> bool:
        """Whether this entry speaks about ``action`` on ``resource`` from ``source_ip``."""
        if Action.ALL not in self.actions and action not in self.actions:
            return False
        if not any(p.matches(resource) for p in self.resources):
            return False
        return not self.source_ips or _ip_in(source_ip, self.source_ips)

    def to_dict(self) -> dict[str, Any]:
        return {
            "resources": [p.text for p in self.resources],
            "actions": sorted(a.value for a in self.actions),
            "decision": self.decision.value,
            "sourceIps": list(self.source_ips),
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Policy:
        try:
            return cls(
                resources=tuple(ResourcePattern(str(r)) for r in raw["resources"]),
                actions=frozenset(parse_enum(Action, a) for a in raw["actions"]),
                decision=parse_enum(Decision, raw.get("decision", "Allow")),
                source_ips=tuple(str(ip) for ip in raw.get("sourceIps", ())),
            )
        except (KeyError, TypeError) as e:
            raise AuthModelError(f"malformed ACL entry: {type(e).__name__} {e}") from None


def _ip_in(source_ip: str | None, cidrs: Iterable[str]) -> bool:
    if not source_ip:
        return False
    try:
        address = ipaddress.ip_address(source_ip)
    except ValueError:
        return False
    return any(address in ipaddress.ip_network(c, strict=False) for c in cidrs)


#: A username (access key; it names an etcd key) and a secret key's bounds
#: (basalt.services.validation's table).
MAX_USERNAME_LENGTH = 64
MIN_SECRET_KEY_LENGTH = 6
MAX_SECRET_KEY_LENGTH = 1024


def check_username(username: str) -> None:
    """AuthModelError unless ``username`` is 1-64 ASCII letters, digits, - or _."""
    if (
        not username
        or len(username) > MAX_USERNAME_LENGTH
        or not username.isascii()
        or not username.replace("-", "").replace("_", "").isalnum()
    ):
        raise AuthModelError(
            f"username must be 1-{MAX_USERNAME_LENGTH} letters, digits, - or _, "
            f"got {username[:80]!r}"
        )


@dataclasses.dataclass(frozen=True, slots=True)
class User:
    """A user: ``username`` is the access key; ``secret_key`` in clear (in
    memory only: etcd holds it encrypted)."""

    username: str
    secret_key: str = dataclasses.field(repr=False)
    user_type: UserType = UserType.NORMAL
    status: UserStatus = UserStatus.ENABLE

    def __post_init__(self) -> None:
        check_username(self.username)
        if not MIN_SECRET_KEY_LENGTH <= len(self.secret_key) <= MAX_SECRET_KEY_LENGTH:
            raise AuthModelError(
                f"secret key must be {MIN_SECRET_KEY_LENGTH}-{MAX_SECRET_KEY_LENGTH} "
                f"characters, got {len(self.secret_key)}"
            )

    @property
    def is_super(self) -> bool:
        return self.user_type is UserType.SUPER

    def to_json(self, sealed_secret: str) -> bytes:
        """The stored form, its secret replaced by ``sealed_secret``."""
        return json.dumps(
            {
                "username": self.username,
                "secretKey": sealed_secret,
                "userType": self.user_type.value,
                "userStatus": self.status.value,
            }
        ).encode()

    @staticmethod
    def sealed_secret(raw: bytes) -> str:
        """The encrypted secret of a stored user. Raises AuthModelError."""
        try:
            return str(json.loads(raw)["secretKey"])
        except (KeyError, TypeError, ValueError) as e:
            raise AuthModelError(f"malformed user: {type(e).__name__}") from None

    @classmethod
    def from_json(cls, raw: bytes, secret_key: str) -> User:
        try:
            value = json.loads(raw)
            return cls(
                username=str(value["username"]),
                secret_key=secret_key,
                user_type=parse_enum(UserType, value.get("userType", "Normal")),
                status=parse_enum(UserStatus, value.get("userStatus", "Enable")),
            )
        except (KeyError, TypeError, ValueError) as e:
            if isinstance(e, AuthModelError):
                raise
            raise AuthModelError(f"malformed user: {type(e).__name__}") from None


@dataclasses.dataclass(frozen=True, slots=True)
class Acl:
    """Every entry of one subject (``User:<name>``)."""

    subject: str
    policies: tuple[Policy, ...]

    def __post_init__(self) -> None:
        kind, sep, name = self.subject.partition(":")
        if kind != "User" or not sep or not name:
            raise AuthModelError(f"subject must be User:<name>, got {self.subject[:80]!r}")
        check_username(name)

    def to_json(self) -> bytes:
        return json.dumps(
            {"subject": self.subject, "policies": [p.to_dict() for p in self.policies]}
        ).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> Acl:
        try:
            value = json.loads(raw)
            return cls(str(value["subject"]), tuple(Policy.from_dict(p) for p in value["policies"]))
        except (KeyError, TypeError, json.JSONDecodeError) as e:
            raise AuthModelError(f"malformed ACL: {type(e).__name__}") from None


def subject_of(username: str) -> str:
    return f"User:{username}"


def decide(acl: Acl | None, resource: Resource, action: Action, source_ip: str | None) -> bool:
    """Whether ``acl`` allows ``action`` on ``resource`` from ``source_ip``: some
    entry allows it and none denies it (Deny wins; nothing said: refused)."""
    if acl is None:
        return False
    allowed = False
    for policy in acl.policies:
        if policy.applies(resource, action, source_ip):
            if policy.decision is Decision.DENY:
                return False
            allowed = True
    return allowed
