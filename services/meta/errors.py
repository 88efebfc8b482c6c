"""The etcd metadata layer's exceptions.

Every class subclasses a builtin, so a caller that knows nothing of Basalt can
still catch it sensibly; the one module in ``services/`` that maps errors to
gRPC status codes, :mod:`basalt.services.errors`, maps these (UNAVAILABLE,
ABORTED, ALREADY_EXISTS, NOT_FOUND; a MetaValidationError is refused
INVALID_ARGUMENT by the request check that catches it). This module imports
nothing of Basalt's, so that table can import it. Reads from a watch cache
never raise.
"""

from __future__ import annotations

from collections.abc import Sequence


class MetaError(Exception):
    """Base of every error the metadata layer raises."""


class MetaValidationError(MetaError, ValueError):
    """A configuration or registration value is malformed or out of range."""


class MetaUnavailableError(MetaError, ConnectionError):
    """No etcd endpoint answered within the operation timeout."""

    def __init__(self, endpoints: Sequence[str], operation: str, cause: BaseException) -> None:
        self.endpoints = tuple(endpoints)
        self.operation = operation
        self.cause = cause
        detail = str(cause) or type(cause).__name__
        super().__init__(
            f"etcd at {', '.join(self.endpoints)} unreachable: {operation} failed ({detail})"
        )


class MetaConflictError(MetaError, RuntimeError):
    """A compare-and-swap kept losing to concurrent writers of the same key."""

    def __init__(self, key: str, attempts: int) -> None:
        self.key = key
        self.attempts = attempts
        super().__init__(
            f"{key} was modified concurrently on each of {attempts} attempts; "
            "nothing was written, retry later"
        )


class TopicExistsError(MetaError, FileExistsError):
    """``create_topic`` found the topic already configured."""

    def __init__(self, topic: str) -> None:
        self.topic = topic
        super().__init__(f"topic {topic!r} already exists")


class TopicNotFoundError(MetaError, LookupError):
    """The topic has no configuration in etcd."""

    def __init__(self, topic: str) -> None:
        self.topic = topic
        super().__init__(f"topic {topic!r} does not exist")


class GroupNotFoundError(MetaError, LookupError):
    """The broker group has no state in etcd (no member ever bootstrapped it)."""

    def __init__(self, broker_name: str) -> None:
        self.broker_name = broker_name
        super().__init__(
            f"broker group {broker_name!r} has no state: it is not a replicated group, "
            "or none of its members has started"
        )


class ElectionRefusedError(MetaError, RuntimeError):
    """An election or campaign the group's rules forbid (docs/replication.md):
    the target is not registered, or not in the in-sync set without unclean."""

    def __init__(self, broker_name: str, broker_id: int, reason: str) -> None:
        self.broker_name = broker_name
        self.broker_id = broker_id
        self.reason = reason
        super().__init__(f"{broker_name}: member {broker_id} cannot become master: {reason}")
