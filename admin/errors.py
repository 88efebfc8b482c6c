"""What the operator's operations raise when they cannot be done.

:class:`AdminError` is the base; the subclasses carry typed fields so that the
admin service can answer each with its own gRPC status and RocketMQ code
(by the one table, :mod:`basalt.services.errors`) while the CLI prints any of
them as one line. This module imports nothing of Basalt's, so that table can
import it. The
metadata layer's own errors pass through unchanged:
``basalt.services.meta.TopicNotFoundError`` (an unknown topic),
``TopicExistsError`` (a create-only write found one),
``MetaConflictError`` (compare-and-swap kept losing) and
``MetaUnavailableError`` (etcd did not answer).
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc


class AdminError(Exception):
    """An operation that cannot be done, and why."""


class BrokerNotRegisteredError(AdminError, LookupError):
    """Store-nodes named by the operation (or hosting its topic) are not
    registered in etcd: down, or never started. ``brokers`` is empty when the
    operation needed some store-node and none is registered."""

    def __init__(self, brokers: Sequence[str], message: str | None = None) -> None:
        self.brokers = tuple(brokers)
        if message is None:
            message = (
                f"no registered store-node named {', '.join(self.brokers)}"
                if self.brokers
                else "no store-node is registered"
            )
        super().__init__(message)


class PeerCallError(AdminError):
    """A call to a store-node or a pull-service failed: ``peer`` names it
    (``store-node 'broker-a'``, ``pull-service at host:port``), ``status`` and
    ``response_code`` are what it answered (``response_code`` None when it
    carried none, e.g. it was not reached)."""

    def __init__(
        self, peer: str, status: grpc.StatusCode, response_code: int | None, details: str
    ) -> None:
        self.peer = peer
        self.status = status
        self.response_code = response_code
        self.details = details
        super().__init__(f"{peer}: {status.name}: {details}")

    @classmethod
    def unreachable(cls, peer: str, details: str) -> PeerCallError:
        """``peer`` could not be called at all (none is registered, say): what a
        call that did not reach it fails with, UNAVAILABLE and no code."""
        return cls(peer, grpc.StatusCode.UNAVAILABLE, None, details)


class RevisionMismatchError(AdminError):
    """A compare-and-swap on a topic's etcd key found it elsewhere than the
    caller expected: ``actual`` is its mod revision now (None: the topic is
    gone). Nothing was written."""

    def __init__(self, topic: str, expected: int, actual: int | None) -> None:
        self.topic = topic
        self.expected = expected
        self.actual = actual
        now = "deleted" if actual is None else f"at mod revision {actual}"
        super().__init__(
            f"topic {topic!r} is {now}, not at mod revision {expected}: "
            "nothing was written; read it again and retry"
        )
