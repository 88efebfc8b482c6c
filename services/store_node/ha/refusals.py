"""What the replication stream refuses, and how (replication.proto's table).

Every refusal fails the call with FAILED_PRECONDITION: the stream's peer is
another member of the group, and what it must do differs by the code in
``basalt-response-code`` (NOT_MASTER: find the master again; anything else:
its configuration or its store root is wrong). :class:`ReplicationRefused`
is a :class:`~basalt.common.status.CodedError`, so the services' one table
(:func:`basalt.services.errors.refusal_of`) answers it as it says.
"""

from __future__ import annotations

import grpc

from basalt.common.status import CodedError
from basalt.v1 import common_pb2 as pb


class ReplicationRefused(CodedError):
    """A stream the master will not serve; ``code`` says why."""

    grpc_status = grpc.StatusCode.FAILED_PRECONDITION

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def not_master(message: str) -> ReplicationRefused:
    """The member reached does not (or no longer) lead the group."""
    return ReplicationRefused(pb.RESPONSE_CODE_NOT_MASTER, message)


def bad_stream(message: str) -> ReplicationRefused:
    """The slave's hello or acks are wrong for this group or this log."""
    return ReplicationRefused(pb.RESPONSE_CODE_INVALID_PARAMETER, message)
