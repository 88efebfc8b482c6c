"""The one place where outcomes become gRPC statuses (ARCHITECTURE §6).

A refused request fails the call with a gRPC status code and a message that
says what was wrong; RocketMQ's response code travels in the trailing
metadata ``basalt-response-code`` (decimal), so a client can tell, say,
TOPIC_NOT_EXIST from SUBSCRIPTION_GROUP_NOT_EXIST without parsing text. The
table is common.proto's. Expected outcomes (a pull that found nothing, a
send whose fsync timed out) are not refusals: they travel in the response.
"""

from __future__ import annotations

import grpc
from basalt.store.put_result import PutMessageResult, PutStatus

from basalt.common.status import RESPONSE_CODE_KEY
from basalt.v1 import common_pb2 as pb

#: ResponseCode -> the gRPC status a refusal with that code fails the call with.
GRPC_STATUS: dict[int, grpc.StatusCode] = {
    pb.RESPONSE_CODE_SYSTEM_ERROR: grpc.StatusCode.INTERNAL,
    pb.RESPONSE_CODE_SYSTEM_BUSY: grpc.StatusCode.RESOURCE_EXHAUSTED,
    pb.RESPONSE_CODE_MESSAGE_ILLEGAL: grpc.StatusCode.INVALID_ARGUMENT,
    pb.RESPONSE_CODE_SERVICE_NOT_AVAILABLE: grpc.StatusCode.UNAVAILABLE,
    pb.RESPONSE_CODE_VERSION_NOT_SUPPORTED: grpc.StatusCode.FAILED_PRECONDITION,
    pb.RESPONSE_CODE_NO_PERMISSION: grpc.StatusCode.PERMISSION_DENIED,
    pb.RESPONSE_CODE_TOPIC_NOT_EXIST: grpc.StatusCode.NOT_FOUND,
    pb.RESPONSE_CODE_TOPIC_EXIST_ALREADY: grpc.StatusCode.ALREADY_EXISTS,
    pb.RESPONSE_CODE_QUERY_NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    pb.RESPONSE_CODE_SUBSCRIPTION_PARSE_FAILED: grpc.StatusCode.INVALID_ARGUMENT,
    pb.RESPONSE_CODE_SUBSCRIPTION_NOT_EXIST: grpc.StatusCode.NOT_FOUND,
    pb.RESPONSE_CODE_SUBSCRIPTION_GROUP_NOT_EXIST: grpc.StatusCode.NOT_FOUND,
    pb.RESPONSE_CODE_INVALID_PARAMETER: grpc.StatusCode.INVALID_ARGUMENT,
    pb.RESPONSE_CODE_CONSUMER_NOT_ONLINE: grpc.StatusCode.NOT_FOUND,
    pb.RESPONSE_CODE_BROKER_NOT_EXIST: grpc.StatusCode.UNAVAILABLE,
}


class Refusal(Exception):
    """A request the service will not serve: a response code and why."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    @property
    def grpc_status(self) -> grpc.StatusCode:
        return GRPC_STATUS.get(self.code, grpc.StatusCode.INTERNAL)


class StatusRefusal(Refusal):
    """A refusal whose gRPC status is given, not looked up from its code: the
    statuses the table above never gives (FAILED_PRECONDITION for a session
    stream's protocol, DEADLINE_EXCEEDED, ABORTED for a lost compare-and-swap),
    with the closest RocketMQ code."""

    def __init__(self, status: grpc.StatusCode, code: int, message: str) -> None:
        super().__init__(code, message)
        self.status = status

    @property
    def grpc_status(self) -> grpc.StatusCode:
        return self.status


def invalid(message: str) -> Refusal:
    return Refusal(pb.RESPONSE_CODE_INVALID_PARAMETER, message)


def refused(refusal: Refusal) -> pb.Refused:
    """One refused entry of a batched call: what it alone would have failed with."""
    return pb.Refused(
        grpc_code=refusal.grpc_status.value[0],
        code=pb.ResponseCode.ValueType(refusal.code),
        message=refusal.message,
    )


async def abort(context: grpc.aio.ServicerContext[object, object], refusal: Refusal) -> None:
    """Fail the call: the gRPC status of the refusal's code, its message, and the
    code in the trailing metadata. Never returns (``context.abort`` raises)."""
    context.set_trailing_metadata(((RESPONSE_CODE_KEY, str(refusal.code)),))
    await context.abort(refusal.grpc_status, refusal.message)


def put_refusal(result: PutMessageResult) -> Refusal | None:
    """The refusal a send's store status means; None when it was written (PUT_OK,
    or FLUSH_DISK_TIMEOUT: written, fsync late - reported in the response)."""
    status = result.status
    if status in (PutStatus.PUT_OK, PutStatus.FLUSH_DISK_TIMEOUT):
        return None
    code = {
        PutStatus.MESSAGE_ILLEGAL: pb.RESPONSE_CODE_MESSAGE_ILLEGAL,
        PutStatus.PROPERTIES_SIZE_EXCEEDED: pb.RESPONSE_CODE_MESSAGE_ILLEGAL,
        PutStatus.SERVICE_NOT_AVAILABLE: pb.RESPONSE_CODE_SERVICE_NOT_AVAILABLE,
        PutStatus.OS_PAGECACHE_BUSY: pb.RESPONSE_CODE_SYSTEM_BUSY,
    }.get(status, pb.RESPONSE_CODE_SYSTEM_ERROR)
    return Refusal(code, f"{status.name}: {result.detail}" if result.detail else status.name)
