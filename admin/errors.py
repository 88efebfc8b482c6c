"""What the operator's operations raise when they cannot be done.

:class:`AdminError` is the base; the subclasses carry typed fields, and each
class carries what the admin service answers it with: RocketMQ's response
code (``code``) and, when it is not the code's own, the gRPC status
(``grpc_status``) - :class:`basalt.common.status.CodedError`'s attributes,
which the services' one table (:mod:`basalt.services.errors`) reads without
importing this module. The CLI prints any of them as one line; the admin
service answers them so::

    error                     gRPC status         basalt-response-code
    ------------------------  ------------------  -----------------------------
    AdminError                INTERNAL            SYSTEM_ERROR
    BrokerNotRegisteredError  UNAVAILABLE         BROKER_NOT_EXIST
    RevisionMismatchError     ABORTED             SYSTEM_BUSY (re-read, retry)
    PeerCallError             the peer's status   the peer's code; none:
                                                  SERVICE_NOT_AVAILABLE when
                                                  UNAVAILABLE, else SYSTEM_ERROR

The metadata layer's own errors pass through unchanged:
``basalt.services.meta.TopicNotFoundError`` (an unknown topic),
``TopicExistsError`` (a create-only write found one),
``MetaConflictError`` (compare-and-swap kept losing) and
``MetaUnavailableError`` (etcd did not answer).
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc

from basalt.common.status import CodedError
from basalt.v1 import common_pb2 as pb


class AdminError(CodedError):
    """An operation that cannot be done, and why: SYSTEM_ERROR unless a
    subclass says otherwise."""

    code: int = pb.RESPONSE_CODE_SYSTEM_ERROR


class BrokerNotRegisteredError(AdminError, LookupError):
    """Store-nodes named by the operation (or hosting its topic) are not
    registered in etcd: down, or never started. ``brokers`` is empty when the
    operation needed some store-node and none is registered."""

    code = pb.RESPONSE_CODE_BROKER_NOT_EXIST

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
    carried none, e.g. it was not reached). It answers with the peer's status
    and code; without a code, SERVICE_NOT_AVAILABLE when the peer was
    UNAVAILABLE, else SYSTEM_ERROR."""

    def __init__(
        self, peer: str, status: grpc.StatusCode, response_code: int | None, details: str
    ) -> None:
        self.peer = peer
        self.status = status
        self.response_code = response_code
        self.details = details
        self.grpc_status = status
        if response_code is not None:
            self.code = response_code
        elif status == grpc.StatusCode.UNAVAILABLE:  # the peer was not reached
            self.code = pb.RESPONSE_CODE_SERVICE_NOT_AVAILABLE
        else:
            self.code = pb.RESPONSE_CODE_SYSTEM_ERROR
        super().__init__(f"{peer}: {status.name}: {details}")

    @classmethod
    def unreachable(cls, peer: str, details: str) -> PeerCallError:
        """``peer`` could not be called at all (none is registered, say): what a
        call that did not reach it fails with, UNAVAILABLE and no code."""
        return cls(peer, grpc.StatusCode.UNAVAILABLE, None, details)


class RevisionMismatchError(AdminError):
    """A compare-and-swap on a topic's etcd key found it elsewhere than the
    caller expected: ``actual`` is its mod revision now (None: the topic is
    gone). Nothing was written. Answered as a lost compare-and-swap is: ABORTED,
    "retry the read-modify-write", and SYSTEM_BUSY, RocketMQ's "try again"
    (basalt.services.errors.Outcome.STALE_WRITE)."""

    code = pb.RESPONSE_CODE_SYSTEM_BUSY
    grpc_status = grpc.StatusCode.ABORTED

    def __init__(self, topic: str, expected: int, actual: int | None) -> None:
        self.topic = topic
        self.expected = expected
        self.actual = actual
        now = "deleted" if actual is None else f"at mod revision {actual}"
        super().__init__(
            f"topic {topic!r} is {now}, not at mod revision {expected}: "
            "nothing was written; read it again and retry"
        )
