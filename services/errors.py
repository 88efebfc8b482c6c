"""The one table of refusals (docs/architecture.md#errors): what every store status and
exception, metadata error and admin error answers a caller.

A refused request fails the call with a gRPC status code and a message that
says what was wrong; RocketMQ's response code travels in the trailing
metadata ``basalt-response-code`` (decimal), so a client can tell, say,
TOPIC_NOT_EXIST from SUBSCRIPTION_GROUP_NOT_EXIST without parsing text.
Expected outcomes (a pull that found nothing, a send whose fsync timed out)
are not refusals: they travel in the response.

Servicers and their checks raise: a :class:`Refusal` naming its response
code (the check decided why), the refusal of an :class:`Outcome`, an error
of the engine or the metadata layer, or a
:class:`~basalt.common.status.CodedError` (the admin operations' errors,
:mod:`basalt.admin.errors`), which carries its own answer: this module reads
its ``code`` and ``grpc_status`` and imports nothing of admin. None of them
picks a gRPC status or maps an error: this module does, by these tables.

A response code's gRPC status (:data:`GRPC_STATUS`; common.proto's table)::

    SYSTEM_ERROR                                  INTERNAL
    SYSTEM_BUSY                                   RESOURCE_EXHAUSTED
    MESSAGE_ILLEGAL, SUBSCRIPTION_PARSE_FAILED,   INVALID_ARGUMENT
    INVALID_PARAMETER
    SERVICE_NOT_AVAILABLE, BROKER_NOT_EXIST       UNAVAILABLE
    VERSION_NOT_SUPPORTED                         FAILED_PRECONDITION
    NO_PERMISSION                                 PERMISSION_DENIED
    TOPIC_NOT_EXIST, QUERY_NOT_FOUND,             NOT_FOUND
    SUBSCRIPTION_NOT_EXIST, CONSUMER_NOT_ONLINE,
    SUBSCRIPTION_GROUP_NOT_EXIST
    TOPIC_EXIST_ALREADY                           ALREADY_EXISTS
    any other                                     INTERNAL

The outcomes whose status is not their code's (:class:`Outcome`)::

    SESSION_OUT_OF_ORDER   FAILED_PRECONDITION   INVALID_PARAMETER
    SESSION_SILENT         DEADLINE_EXCEEDED     CONSUMER_NOT_ONLINE
    SESSION_REPLACED       ABORTED               CONSUMER_NOT_ONLINE
    STALE_WRITE            ABORTED               SYSTEM_BUSY

What a raised error answers (:func:`refusal_of`, :func:`as_refusal`); the
message is ``str(error)`` but in the last row::

    raised                       gRPC status         basalt-response-code
    ---------------------------  ------------------  ---------------------------------
    Refusal                      its own             its own (message: its own)
    an ExceptionGroup            its first known error's row
    StoreClosedError,            UNAVAILABLE         SERVICE_NOT_AVAILABLE
    MetaUnavailableError
    Sql92ParseError,             INVALID_ARGUMENT    SUBSCRIPTION_PARSE_FAILED
    UnknownFilterTypeError
    InvalidOffsetRequestError    INVALID_ARGUMENT    INVALID_PARAMETER
    TopicNotFoundError           NOT_FOUND           TOPIC_NOT_EXIST
    TopicExistsError             ALREADY_EXISTS      TOPIC_EXIST_ALREADY
    MetaConflictError            ABORTED             SYSTEM_BUSY (re-read, retry)
    CodedError: the admin        its grpc_status,    its code
    errors (admin/errors.py's    else its code's
    table)
    anything else                INTERNAL            SYSTEM_ERROR, message
                                                     "<class>: <error>", logged
                                                     with its traceback

"Anything else" is a bug, or what no request can cause: any other
StoreError (corruption, a bad configuration, a locked root), and a
MetaValidationError that got past the request's checks (those refuse a
request's own bad name as INVALID_PARAMETER or MESSAGE_ILLEGAL, where they
check it), which means a stored value is bad.

The store's statuses: a send's PutStatus (:func:`put_refusal`), a read's
GetMessageStatus (:func:`pull_outcome`), a commit's CommitStatus
(:func:`commit_response`). A failed call to another service:
:func:`downstream_refusal`.
"""

from __future__ import annotations

import enum
import logging

import grpc

from basalt.common.status import RESPONSE_CODE_KEY, CodedError, response_code_of
from basalt.services.meta.errors import (
    MetaConflictError,
    MetaUnavailableError,
    TopicExistsError,
    TopicNotFoundError,
)
from basalt.store.consumer_offsets import CommitResult, CommitStatus, InvalidOffsetRequestError
from basalt.store.errors import StoreClosedError
from basalt.store.message_filter import UnknownFilterTypeError
from basalt.store.put_result import PutMessageResult, PutStatus
from basalt.store.sql92 import Sql92ParseError
from basalt.v1 import common_pb2 as pb

log = logging.getLogger(__name__)

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
    pb.RESPONSE_CODE_NOT_MASTER: grpc.StatusCode.FAILED_PRECONDITION,
    pb.RESPONSE_CODE_IN_SYNC_REPLICAS_NOT_ENOUGH: grpc.StatusCode.UNAVAILABLE,
}


class Outcome(enum.Enum):
    """The refusals whose gRPC status is not their response code's: each names
    its case, its value is (gRPC status, response code)."""

    #: A Session stream's frames break its protocol (the first is not ``open``,
    #: or an ``open`` comes again): the stream, not an argument, is wrong.
    SESSION_OUT_OF_ORDER = (grpc.StatusCode.FAILED_PRECONDITION, pb.RESPONSE_CODE_INVALID_PARAMETER)
    #: No frame from the consumer within the session timeout: its session ends.
    SESSION_SILENT = (grpc.StatusCode.DEADLINE_EXCEEDED, pb.RESPONSE_CODE_CONSUMER_NOT_ONLINE)
    #: The consumer opened a newer session (here or on another pull-service).
    SESSION_REPLACED = (grpc.StatusCode.ABORTED, pb.RESPONSE_CODE_CONSUMER_NOT_ONLINE)
    #: A compare-and-swap lost to another writer: gRPC's ABORTED is "retry the
    #: read-modify-write"; RocketMQ has no code for it, and SYSTEM_BUSY is its
    #: "try again" (admin.proto says so).
    STALE_WRITE = (grpc.StatusCode.ABORTED, pb.RESPONSE_CODE_SYSTEM_BUSY)
    #: A call with no, a malformed or a wrong signature, an unknown user or a
    #: date-time outside the skew window (basalt.services.auth): RocketMQ
    #: answers NO_PERMISSION to both refusals; gRPC tells them apart.
    UNAUTHENTICATED = (grpc.StatusCode.UNAUTHENTICATED, pb.RESPONSE_CODE_NO_PERMISSION)
    #: Creating a user or ACL entry that exists, changing one that does not.
    AUTH_ENTRY_EXISTS = (grpc.StatusCode.ALREADY_EXISTS, pb.RESPONSE_CODE_INVALID_PARAMETER)
    AUTH_ENTRY_MISSING = (grpc.StatusCode.NOT_FOUND, pb.RESPONSE_CODE_INVALID_PARAMETER)
    #: User and ACL verbs on an admin service run without a cluster key.
    AUTH_NOT_CONFIGURED = (grpc.StatusCode.FAILED_PRECONDITION, pb.RESPONSE_CODE_SYSTEM_ERROR)

    @property
    def grpc_status(self) -> grpc.StatusCode:
        status: grpc.StatusCode = self.value[0]
        return status

    @property
    def code(self) -> int:
        code: int = self.value[1]
        return code


class Refusal(Exception):
    """A request the service will not serve: a response code and why; the gRPC
    status is the code's (:data:`GRPC_STATUS`). :meth:`of` makes the refusal
    of an :class:`Outcome`."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    @property
    def grpc_status(self) -> grpc.StatusCode:
        return GRPC_STATUS.get(self.code, grpc.StatusCode.INTERNAL)

    @staticmethod
    def of(outcome: Outcome, message: str) -> Refusal:
        """The refusal of ``outcome``, saying ``message``."""
        return StatusRefusal(outcome.grpc_status, outcome.code, message)

    def with_message(self, message: str) -> Refusal:
        """A new refusal with this one's status and code, saying ``message``."""
        return StatusRefusal(self.grpc_status, self.code, message)


class StatusRefusal(Refusal):
    """A refusal whose gRPC status is given, not looked up from its code: an
    :class:`Outcome`'s, or a peer's passed through. Made by this module (and by
    tests); a servicer names an Outcome instead."""

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


# -- raised errors ----------------------------------------------------------------------

#: Error classes -> the response code or Outcome they answer, first match wins
#: (the module docstring's table; a CodedError answers what it carries).
_ANSWER_OF_ERROR: tuple[tuple[tuple[type[Exception], ...], int | Outcome], ...] = (
    ((StoreClosedError, MetaUnavailableError), pb.RESPONSE_CODE_SERVICE_NOT_AVAILABLE),
    ((Sql92ParseError, UnknownFilterTypeError), pb.RESPONSE_CODE_SUBSCRIPTION_PARSE_FAILED),
    ((InvalidOffsetRequestError,), pb.RESPONSE_CODE_INVALID_PARAMETER),
    ((TopicNotFoundError,), pb.RESPONSE_CODE_TOPIC_NOT_EXIST),
    ((TopicExistsError,), pb.RESPONSE_CODE_TOPIC_EXIST_ALREADY),
    ((MetaConflictError,), Outcome.STALE_WRITE),
)


def refusal_of(error: BaseException) -> Refusal | None:
    """What ``error`` answers by the module docstring's table; None for what the
    table does not know (a bug, or what no request can cause)."""
    if isinstance(error, Refusal):
        return error
    if isinstance(error, BaseExceptionGroup):
        # A task group's failure (a SendStream's reader and writer): what its
        # first known error answers.
        for inner in error.exceptions:
            refusal = refusal_of(inner)
            if refusal is not None:
                return refusal
        return None
    if isinstance(error, CodedError):
        if error.grpc_status is None:
            return Refusal(error.code, str(error))
        return StatusRefusal(error.grpc_status, error.code, str(error))
    for kinds, answer in _ANSWER_OF_ERROR:
        if isinstance(error, kinds):
            if isinstance(answer, Outcome):
                return Refusal.of(answer, str(error))
            return Refusal(answer, str(error))
    return None


def as_refusal(error: Exception, where: str) -> Refusal:
    """What ``error``, raised serving a request in ``where``, answers: its row of
    the table; anything the table does not know is logged with its traceback
    and answered SYSTEM_ERROR with one line (a client never sees a stack
    trace). Used by :func:`basalt.services.rpc.rpc_method` and for each entry
    of a batched call."""
    refusal = refusal_of(error)
    if refusal is not None:
        return refusal
    log.error("%s failed", where, exc_info=error)
    return Refusal(pb.RESPONSE_CODE_SYSTEM_ERROR, f"{type(error).__name__}: {error}")


def downstream_refusal(error: grpc.aio.AioRpcError, peer: str, timeout_s: float) -> Refusal:
    """What a failed call to ``peer`` (e.g. "store-node 'broker-a' at host:port")
    means upstream: never the caller's own error passed through, but one that
    names the peer, so a client reading "store-node 'broker-a' at
    127.0.0.1:10911 is unreachable" knows the service it called is fine.

    A refusal by the peer (it sent a ``basalt-response-code``) keeps its code
    and message, prefixed with the peer; a peer that cannot be reached or did
    not answer within ``timeout_s`` or cancelled the call (it is stopping) is
    SERVICE_NOT_AVAILABLE (UNAVAILABLE);
    anything else is SYSTEM_ERROR.
    """
    code = response_code_of(error)
    details = error.details() or error.code().name
    if code is not None:
        return Refusal(code, f"{peer}: {details}")
    status = error.code()
    if status is grpc.StatusCode.UNAVAILABLE:
        return Refusal(pb.RESPONSE_CODE_SERVICE_NOT_AVAILABLE, f"{peer} is unreachable: {details}")
    if status is grpc.StatusCode.CANCELLED:
        # Our own cancellations surface as CancelledError, not here: the peer
        # cancelled the call, which a server does when it stops.
        return Refusal(pb.RESPONSE_CODE_SERVICE_NOT_AVAILABLE, f"{peer} cancelled the call")
    if status is grpc.StatusCode.DEADLINE_EXCEEDED:
        return Refusal(
            pb.RESPONSE_CODE_SERVICE_NOT_AVAILABLE,
            f"{peer} did not answer within {timeout_s * 1000:.0f} ms",
        )
    return Refusal(pb.RESPONSE_CODE_SYSTEM_ERROR, f"{peer} failed: {status.name}: {details}")


# -- the store's statuses ---------------------------------------------------------------

#: A send's PutStatus -> the code of its refusal (common.proto's PutMessageStatus
#: table); PUT_OK and FLUSH_DISK_TIMEOUT are not refusals, any other is SYSTEM_ERROR.
_CODE_OF_PUT_STATUS: dict[PutStatus, int] = {
    PutStatus.MESSAGE_ILLEGAL: pb.RESPONSE_CODE_MESSAGE_ILLEGAL,
    PutStatus.PROPERTIES_SIZE_EXCEEDED: pb.RESPONSE_CODE_MESSAGE_ILLEGAL,
    PutStatus.SERVICE_NOT_AVAILABLE: pb.RESPONSE_CODE_SERVICE_NOT_AVAILABLE,
    PutStatus.OS_PAGECACHE_BUSY: pb.RESPONSE_CODE_SYSTEM_BUSY,
}


def put_refusal(result: PutMessageResult) -> Refusal | None:
    """The refusal a send's store status means; None when it was written (PUT_OK,
    FLUSH_DISK_TIMEOUT or FLUSH_SLAVE_TIMEOUT: written, fsync or replicas late -
    reported in the response)."""
    status = result.status
    if status in (PutStatus.PUT_OK, PutStatus.FLUSH_DISK_TIMEOUT, PutStatus.FLUSH_SLAVE_TIMEOUT):
        return None
    code = _CODE_OF_PUT_STATUS.get(status, pb.RESPONSE_CODE_SYSTEM_ERROR)
    return Refusal(code, f"{status.name}: {result.detail}" if result.detail else status.name)


#: A commit's CommitStatus -> CommitResult.code; the others (a bad name, queue id
#: or offset) refuse the request INVALID_PARAMETER.
_CODE_OF_COMMIT_STATUS: dict[CommitStatus, pb.ResponseCode.ValueType] = {
    CommitStatus.OK: pb.RESPONSE_CODE_SUCCESS,
    CommitStatus.STALE_RESET_EPOCH: pb.RESPONSE_CODE_STALE_RESET_EPOCH,
}


def commit_response(result: CommitResult) -> pb.CommitResult:
    """A commit's outcome on the wire: SUCCESS, or STALE_RESET_EPOCH (nothing
    stored; ``reset_epoch`` is the current one). Raises an INVALID_PARAMETER
    Refusal for the statuses that mean the request was malformed."""
    code = _CODE_OF_COMMIT_STATUS.get(result.status)
    if code is None:
        raise invalid(result.detail or result.status.name)
    return pb.CommitResult(code=code, reset_epoch=result.reset_epoch)


# A read's GetMessageStatus becomes the client's ResponseCode and PullStatus by
# RocketMQ's PullMessageProcessor and MQClientAPIImpl tables (common.proto); the
# pull-service applies it to a store-node's GetMessage, the store-node to each
# entry of GetMessages, which answers in the client's terms:
#
#     GetMessageStatus           ResponseCode            PullStatus
#     FOUND                      SUCCESS                 FOUND
#     NO_MATCHED_MESSAGE         PULL_RETRY_IMMEDIATELY  NO_MATCHED_MSG
#     MESSAGE_WAS_REMOVING       PULL_RETRY_IMMEDIATELY  NO_MATCHED_MSG
#     OFFSET_FOUND_NULL          PULL_NOT_FOUND          NO_NEW_MSG
#     OFFSET_OVERFLOW_ONE        PULL_NOT_FOUND          NO_NEW_MSG
#     OFFSET_OVERFLOW_BADLY      PULL_OFFSET_MOVED       OFFSET_ILLEGAL
#     OFFSET_TOO_SMALL           PULL_OFFSET_MOVED       OFFSET_ILLEGAL
#     NO_MATCHED_LOGIC_QUEUE     offset 0: PULL_NOT_FOUND / NO_NEW_MSG,
#     NO_MESSAGE_IN_QUEUE        else PULL_OFFSET_MOVED / OFFSET_ILLEGAL
#     anything else              refused: INTERNAL, SYSTEM_ERROR

#: GetMessageStatus -> ResponseCode, for the statuses that do not depend on the offset.
_CODE_OF_GET_STATUS: dict[int, pb.ResponseCode.ValueType] = {
    pb.GET_MESSAGE_STATUS_FOUND: pb.RESPONSE_CODE_SUCCESS,
    pb.GET_MESSAGE_STATUS_NO_MATCHED_MESSAGE: pb.RESPONSE_CODE_PULL_RETRY_IMMEDIATELY,
    pb.GET_MESSAGE_STATUS_MESSAGE_WAS_REMOVING: pb.RESPONSE_CODE_PULL_RETRY_IMMEDIATELY,
    pb.GET_MESSAGE_STATUS_OFFSET_FOUND_NULL: pb.RESPONSE_CODE_PULL_NOT_FOUND,
    pb.GET_MESSAGE_STATUS_OFFSET_OVERFLOW_ONE: pb.RESPONSE_CODE_PULL_NOT_FOUND,
    pb.GET_MESSAGE_STATUS_OFFSET_OVERFLOW_BADLY: pb.RESPONSE_CODE_PULL_OFFSET_MOVED,
    pb.GET_MESSAGE_STATUS_OFFSET_TOO_SMALL: pb.RESPONSE_CODE_PULL_OFFSET_MOVED,
}
#: Statuses of a queue with nothing in it: "nothing new" at offset 0, "moved" elsewhere.
_EMPTY_QUEUE_STATUSES = frozenset(
    {pb.GET_MESSAGE_STATUS_NO_MATCHED_LOGIC_QUEUE, pb.GET_MESSAGE_STATUS_NO_MESSAGE_IN_QUEUE}
)
#: ResponseCode -> the client's PullStatus (RocketMQ's MQClientAPIImpl.processPullResponse).
_PULL_STATUS_OF_CODE: dict[int, pb.PullStatus.ValueType] = {
    pb.RESPONSE_CODE_SUCCESS: pb.PULL_STATUS_FOUND,
    pb.RESPONSE_CODE_PULL_NOT_FOUND: pb.PULL_STATUS_NO_NEW_MSG,
    pb.RESPONSE_CODE_PULL_RETRY_IMMEDIATELY: pb.PULL_STATUS_NO_MATCHED_MSG,
    pb.RESPONSE_CODE_PULL_OFFSET_MOVED: pb.PULL_STATUS_OFFSET_ILLEGAL,
}


def pull_outcome(
    store_status: pb.GetMessageStatus.ValueType, offset: int
) -> tuple[pb.ResponseCode.ValueType, pb.PullStatus.ValueType]:
    """``(ResponseCode, PullStatus)`` of a read that answered ``store_status`` for a
    pull at ``offset`` (the table above). Raises a SYSTEM_ERROR Refusal for a
    status the table does not know (a newer store-node, or UNSPECIFIED)."""
    code = _CODE_OF_GET_STATUS.get(store_status)
    if code is None and store_status in _EMPTY_QUEUE_STATUSES:
        code = (
            pb.RESPONSE_CODE_PULL_NOT_FOUND if offset == 0 else pb.RESPONSE_CODE_PULL_OFFSET_MOVED
        )
    if code is None:
        try:
            name = pb.GetMessageStatus.Name(store_status)
        except ValueError:
            name = str(store_status)
        raise Refusal(pb.RESPONSE_CODE_SYSTEM_ERROR, f"the store-node answered status {name}")
    return code, _PULL_STATUS_OF_CODE[code]


def pull_response(
    store_status: pb.GetMessageStatus.ValueType,
    offset: int,
    *,
    next_begin_offset: int,
    min_offset: int,
    max_offset: int,
    records: pb.Records | None,
    commit: pb.CommitResult | None,
) -> pb.PullResponse:
    """A store-node read of one queue from ``offset`` as the client sees it: code
    and PullStatus by :func:`basalt.services.errors.pull_outcome` (a
    SYSTEM_ERROR Refusal for a status it does not know). Built by the
    pull-service for Pull, and by the store-node itself for each entry of
    GetMessages (``records`` None: it writes them into the answer itself,
    basalt.services.store_node.wire)."""
    code, status = pull_outcome(store_status, offset)
    return pb.PullResponse(
        code=code,
        status=status,
        store_status=store_status,
        next_begin_offset=next_begin_offset,
        min_offset=min_offset,
        max_offset=max_offset,
        records=records,
        commit=commit,
    )
