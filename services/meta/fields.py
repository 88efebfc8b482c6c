"""Name rules and strict JSON field readers shared by the metadata values.

Everything raises :class:`MetaValidationError` with a message naming where the
value came from (``topics/T``, ``broker 'b'``) and what was wrong.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import TypeVar

from basalt.common.record import MAX_TOPIC_LENGTH, TOPIC_PATTERN
from basalt.services.meta.errors import MetaValidationError

T = TypeVar("T")

#: RocketMQ's CHARACTER_MAX_LENGTH for group names.
MAX_GROUP_LENGTH = 255
#: Names used as one etcd key segment (broker, pull-service, client id, cluster):
#: no '/' (it would change the key's depth) and no whitespace.
NAME_PATTERN = re.compile(r"[A-Za-z0-9_.:@#%|\[\]-]+")
MAX_NAME_LENGTH = 255
#: NAME_PATTERN in words, for messages and settings' rules.
NAME_CHARS = "[A-Za-z0-9_.:@#%|[]-] (no '/', no spaces)"


# -- name rules -------------------------------------------------------------------


def _check_pattern(
    value: object, what: str, pattern: re.Pattern[str], max_length: int, chars: str
) -> str:
    if not isinstance(value, str) or len(value) > max_length or not pattern.fullmatch(value):
        raise MetaValidationError(
            f"{what} {str(value)[:300]!r} is not 1-{max_length} characters of {chars}"
        )
    return value


def check_topic_name(topic: object) -> str:
    """The store's topic rule (basalt.common.record's TOPIC_PATTERN): 1-127
    characters of [%|a-zA-Z0-9_-]."""
    return _check_pattern(topic, "topic", TOPIC_PATTERN, MAX_TOPIC_LENGTH, "[%|a-zA-Z0-9_-]")


def check_group_name(group: object) -> str:
    """RocketMQ's group rule: the topic characters, at most 255 of them."""
    return _check_pattern(group, "group", TOPIC_PATTERN, MAX_GROUP_LENGTH, "[%|a-zA-Z0-9_-]")


def check_name(name: object, what: str) -> str:
    """A broker name, pull-service id, client id or cluster name: one key segment."""
    return _check_pattern(name, what, NAME_PATTERN, MAX_NAME_LENGTH, NAME_CHARS)


def check_address(address: object, what: str) -> str:
    """``host:port`` with a port in 1..65535 (IPv6 hosts in brackets)."""
    if isinstance(address, str):
        host, sep, port = address.rpartition(":")
        if sep and host and port.isdigit() and 0 < int(port) < 65536 and " " not in host:
            return address
    raise MetaValidationError(f"{what} must be host:port, got {address!r}")


#: Largest broker id, offset or epoch a value holds (etcd's and protobuf's int64).
MAX_INT64 = 2**63 - 1


def check_non_negative(value: object, what: str) -> int:
    """An int (not a bool) in 0..2**63-1: a broker id, an offset, an epoch, a version."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_INT64:
        raise MetaValidationError(f"{what} must be an integer >= 0, got {value!r}")
    return value


def check_broker_id(broker_id: object) -> int:
    """A member's id within its broker group (RocketMQ's brokerId): an int >= 0."""
    return check_non_negative(broker_id, "broker id")


# -- JSON helpers -------------------------------------------------------------------


def dumps(value: dict[str, object]) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def load_object(raw: bytes | str, where: str) -> dict[str, object]:
    try:
        data = json.loads(raw)
    except ValueError as e:  # also UnicodeDecodeError
        raise MetaValidationError(f"{where}: value is not JSON ({e})") from None
    if not isinstance(data, dict):
        raise MetaValidationError(
            f"{where}: value must be a JSON object, got {type(data).__name__}"
        )
    return data


MISSING = object()


def get_field(data: dict[str, object], name: str, where: str, default: object = MISSING) -> object:
    if name in data:
        return data[name]
    if default is MISSING:
        raise MetaValidationError(f"{where}: field {name!r} is missing")
    return default


def get_int(data: dict[str, object], name: str, where: str, default: object = MISSING) -> int:
    value = get_field(data, name, where, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise MetaValidationError(f"{where}: field {name!r} must be an integer, got {value!r}")
    return value


def get_str(data: dict[str, object], name: str, where: str, default: object = MISSING) -> str:
    value = get_field(data, name, where, default)
    if not isinstance(value, str):
        raise MetaValidationError(f"{where}: field {name!r} must be a string, got {value!r}")
    return value


def get_bool(data: dict[str, object], name: str, where: str, default: object = MISSING) -> bool:
    value = get_field(data, name, where, default)
    if not isinstance(value, bool):
        raise MetaValidationError(f"{where}: field {name!r} must be true or false, got {value!r}")
    return value


def get_list(
    data: dict[str, object], name: str, where: str, default: object = MISSING
) -> list[object]:
    value = get_field(data, name, where, default)
    if not isinstance(value, list):
        raise MetaValidationError(f"{where}: field {name!r} must be a list, got {value!r}")
    return value


def get_names(items: list[object], name: str, where: str) -> list[str]:
    if not all(isinstance(i, str) for i in items):
        raise MetaValidationError(f"{where}: field {name!r} must be a list of strings")
    return [str(i) for i in items]


def get_identity(data: dict[str, object], name: str, expected: str | None, where: str) -> str:
    """The identity field, which must agree with the key's name when one is given."""
    value = get_str(data, name, where, expected if expected is not None else MISSING)
    if expected is not None and value != expected:
        raise MetaValidationError(
            f"{where}: field {name!r} is {value!r} but the key says {expected!r}"
        )
    return value


def prefixed(where: str, error: MetaValidationError) -> MetaValidationError:
    return MetaValidationError(f"{where}: {error}")


def check_millis(value: object, name: str, where: str) -> None:
    """Field ``name`` holds epoch milliseconds: an int >= 0 (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise MetaValidationError(f"{where}: {name} must be epoch millis >= 0, got {value!r}")


def decode_object(raw: bytes | str, where: str, make: Callable[[dict[str, object]], T]) -> T:
    """Parse ``raw`` as a JSON object and build a value from it with ``make``,
    prefixing every validation error with ``where`` (the key it came from)."""
    data = load_object(raw, where)
    try:
        return make(data)
    except ValueError as e:
        if isinstance(e, MetaValidationError) and str(e).startswith(where):
            raise
        raise MetaValidationError(f"{where}: {e}") from None
