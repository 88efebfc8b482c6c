"""services.errors: the one table from statuses and errors to (gRPC status,
RocketMQ response code, message), row by row."""

from __future__ import annotations

import logging
from pathlib import Path

import grpc
import pytest

from basalt.admin.errors import (
    AdminError,
    BrokerNotRegisteredError,
    PeerCallError,
    RevisionMismatchError,
)
from basalt.common.record import CorruptRecordError
from basalt.common.status import CodedError
from basalt.services.errors import (
    GRPC_STATUS,
    RESPONSE_CODE_KEY,
    Outcome,
    Refusal,
    StatusRefusal,
    as_refusal,
    commit_response,
    downstream_refusal,
    pull_outcome,
    put_refusal,
    refusal_of,
    refused,
)
from basalt.services.meta.errors import (
    MetaConflictError,
    MetaUnavailableError,
    MetaValidationError,
    TopicExistsError,
    TopicNotFoundError,
)
from basalt.store.consumer_offsets import CommitResult, CommitStatus, InvalidOffsetRequestError
from basalt.store.errors import CorruptFileError, StoreClosedError
from basalt.store.message_filter import UnknownFilterTypeError
from basalt.store.put_result import PutMessageResult, PutStatus
from basalt.store.sql92 import Sql92ParseError
from basalt.v1 import common_pb2 as pb

S = grpc.StatusCode


def answer(refusal: Refusal | None) -> tuple[grpc.StatusCode, int, str] | None:
    return None if refusal is None else (refusal.grpc_status, refusal.code, refusal.message)


@pytest.mark.parametrize(
    ("code", "status"),
    [
        (pb.RESPONSE_CODE_SYSTEM_ERROR, S.INTERNAL),
        (pb.RESPONSE_CODE_SYSTEM_BUSY, S.RESOURCE_EXHAUSTED),
        (pb.RESPONSE_CODE_MESSAGE_ILLEGAL, S.INVALID_ARGUMENT),
        (pb.RESPONSE_CODE_SERVICE_NOT_AVAILABLE, S.UNAVAILABLE),
        (pb.RESPONSE_CODE_VERSION_NOT_SUPPORTED, S.FAILED_PRECONDITION),
        (pb.RESPONSE_CODE_NO_PERMISSION, S.PERMISSION_DENIED),
        (pb.RESPONSE_CODE_TOPIC_NOT_EXIST, S.NOT_FOUND),
        (pb.RESPONSE_CODE_TOPIC_EXIST_ALREADY, S.ALREADY_EXISTS),
        (pb.RESPONSE_CODE_QUERY_NOT_FOUND, S.NOT_FOUND),
        (pb.RESPONSE_CODE_SUBSCRIPTION_PARSE_FAILED, S.INVALID_ARGUMENT),
        (pb.RESPONSE_CODE_SUBSCRIPTION_NOT_EXIST, S.NOT_FOUND),
        (pb.RESPONSE_CODE_SUBSCRIPTION_GROUP_NOT_EXIST, S.NOT_FOUND),
        (pb.RESPONSE_CODE_INVALID_PARAMETER, S.INVALID_ARGUMENT),
        (pb.RESPONSE_CODE_CONSUMER_NOT_ONLINE, S.NOT_FOUND),
        (pb.RESPONSE_CODE_BROKER_NOT_EXIST, S.UNAVAILABLE),
        (pb.RESPONSE_CODE_PULL_NOT_FOUND, S.INTERNAL),  # not a refusal's code
        (12345, S.INTERNAL),
    ],
)
def test_a_refusal_fails_with_its_codes_status(code: int, status: grpc.StatusCode) -> None:
    assert Refusal(code, "why").grpc_status == status
    assert GRPC_STATUS.get(code, S.INTERNAL) == status


@pytest.mark.parametrize(
    ("outcome", "status", "code"),
    [
        (
            Outcome.SESSION_OUT_OF_ORDER,
            S.FAILED_PRECONDITION,
            pb.RESPONSE_CODE_INVALID_PARAMETER,
        ),
        (Outcome.SESSION_SILENT, S.DEADLINE_EXCEEDED, pb.RESPONSE_CODE_CONSUMER_NOT_ONLINE),
        (Outcome.SESSION_REPLACED, S.ABORTED, pb.RESPONSE_CODE_CONSUMER_NOT_ONLINE),
        (Outcome.STALE_WRITE, S.ABORTED, pb.RESPONSE_CODE_SYSTEM_BUSY),
    ],
)
def test_an_outcome_names_a_status_its_code_does_not_have(
    outcome: Outcome, status: grpc.StatusCode, code: int
) -> None:
    assert answer(Refusal.of(outcome, "why")) == (status, code, "why")
    assert GRPC_STATUS.get(code) != status


def test_a_refusal_reworded_keeps_its_status_and_code() -> None:
    stale = Refusal.of(Outcome.STALE_WRITE, "lost")
    assert answer(stale.with_message("again")) == (S.ABORTED, pb.RESPONSE_CODE_SYSTEM_BUSY, "again")
    plain = Refusal(pb.RESPONSE_CODE_TOPIC_NOT_EXIST, "gone")
    assert answer(plain.with_message("x")) == (S.NOT_FOUND, pb.RESPONSE_CODE_TOPIC_NOT_EXIST, "x")


def test_a_refused_entry_carries_the_status_code_and_message() -> None:
    entry = refused(StatusRefusal(S.ABORTED, pb.RESPONSE_CODE_CONSUMER_NOT_ONLINE, "newer"))
    assert (entry.grpc_code, entry.code, entry.message) == (
        S.ABORTED.value[0],
        pb.RESPONSE_CODE_CONSUMER_NOT_ONLINE,
        "newer",
    )


@pytest.mark.parametrize(
    ("error", "status", "code"),
    [
        (
            StoreClosedError("the store is shut down"),
            S.UNAVAILABLE,
            pb.RESPONSE_CODE_SERVICE_NOT_AVAILABLE,
        ),
        (
            MetaUnavailableError(["127.0.0.1:2379"], "get", TimeoutError()),
            S.UNAVAILABLE,
            pb.RESPONSE_CODE_SERVICE_NOT_AVAILABLE,
        ),
        (
            Sql92ParseError("a >", 3, "unexpected end"),
            S.INVALID_ARGUMENT,
            pb.RESPONSE_CODE_SUBSCRIPTION_PARSE_FAILED,
        ),
        (
            UnknownFilterTypeError("XPATH"),
            S.INVALID_ARGUMENT,
            pb.RESPONSE_CODE_SUBSCRIPTION_PARSE_FAILED,
        ),
        (
            InvalidOffsetRequestError("queue id -1 out of range"),
            S.INVALID_ARGUMENT,
            pb.RESPONSE_CODE_INVALID_PARAMETER,
        ),
        (TopicNotFoundError("T"), S.NOT_FOUND, pb.RESPONSE_CODE_TOPIC_NOT_EXIST),
        (TopicExistsError("T"), S.ALREADY_EXISTS, pb.RESPONSE_CODE_TOPIC_EXIST_ALREADY),
        (MetaConflictError("/basalt/c/topics/T", 5), S.ABORTED, pb.RESPONSE_CODE_SYSTEM_BUSY),
        (RevisionMismatchError("T", 7, 9), S.ABORTED, pb.RESPONSE_CODE_SYSTEM_BUSY),
        (RevisionMismatchError("T", 7, None), S.ABORTED, pb.RESPONSE_CODE_SYSTEM_BUSY),
        (BrokerNotRegisteredError(["broker-a"]), S.UNAVAILABLE, pb.RESPONSE_CODE_BROKER_NOT_EXIST),
        (BrokerNotRegisteredError([]), S.UNAVAILABLE, pb.RESPONSE_CODE_BROKER_NOT_EXIST),
        (AdminError("timestamp 'x' is not now"), S.INTERNAL, pb.RESPONSE_CODE_SYSTEM_ERROR),
        # A peer's answer passes through: its status, its code...
        (
            PeerCallError(
                "store-node 'b'", S.NOT_FOUND, pb.RESPONSE_CODE_TOPIC_NOT_EXIST, "no topic"
            ),
            S.NOT_FOUND,
            pb.RESPONSE_CODE_TOPIC_NOT_EXIST,
        ),
        (
            PeerCallError("store-node 'b'", S.ABORTED, pb.RESPONSE_CODE_SYSTEM_BUSY, "busy"),
            S.ABORTED,
            pb.RESPONSE_CODE_SYSTEM_BUSY,
        ),
        # ...and without a code, SERVICE_NOT_AVAILABLE if it was unreachable.
        (
            PeerCallError("pull-service", S.UNAVAILABLE, None, "down"),
            S.UNAVAILABLE,
            pb.RESPONSE_CODE_SERVICE_NOT_AVAILABLE,
        ),
        (
            PeerCallError.unreachable("pull-service", "none is registered"),
            S.UNAVAILABLE,
            pb.RESPONSE_CODE_SERVICE_NOT_AVAILABLE,
        ),
        (
            PeerCallError("pull-service", S.DEADLINE_EXCEEDED, None, ""),
            S.DEADLINE_EXCEEDED,
            pb.RESPONSE_CODE_SYSTEM_ERROR,
        ),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, Exception) else None,
)
def test_each_error_answers_its_row(error: Exception, status: grpc.StatusCode, code: int) -> None:
    assert answer(refusal_of(error)) == (status, code, str(error))
    assert answer(as_refusal(error, "Call")) == (status, code, str(error))


class _NoTopicHere(CodedError):
    """A CodedError defined outside services, as admin's are: its code only."""

    code = pb.RESPONSE_CODE_TOPIC_NOT_EXIST


class _TryAgain(CodedError):
    """Its code and a gRPC status other than the code's."""

    code = pb.RESPONSE_CODE_SYSTEM_BUSY
    grpc_status = S.ABORTED


@pytest.mark.parametrize(
    ("error", "status", "code"),
    [
        (_NoTopicHere("T is gone"), S.NOT_FOUND, pb.RESPONSE_CODE_TOPIC_NOT_EXIST),
        (_TryAgain("lost a race"), S.ABORTED, pb.RESPONSE_CODE_SYSTEM_BUSY),
        (CodedError("bare"), S.INTERNAL, pb.RESPONSE_CODE_SYSTEM_ERROR),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, Exception) else None,
)
def test_a_coded_error_answers_what_it_carries(
    error: CodedError, status: grpc.StatusCode, code: int
) -> None:
    # The table knows no such class: it reads the attributes (how admin's
    # errors reach it without services importing admin).
    assert answer(refusal_of(error)) == (status, code, str(error))
    assert answer(as_refusal(error, "Call")) == (status, code, str(error))


def test_a_refusal_answers_itself() -> None:
    refusal = Refusal(pb.RESPONSE_CODE_NO_PERMISSION, "not writable")
    assert refusal_of(refusal) is refusal
    assert as_refusal(refusal, "Call") is refusal


@pytest.mark.parametrize(
    "error",
    [
        CorruptRecordError(4096, "bad magic"),
        CorruptFileError(Path("/root/commitlog/0"), "wrong size"),
        MetaValidationError("a stored value is bad"),
        KeyError("a bug"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_what_the_table_does_not_know_is_logged_and_a_system_error(
    error: Exception, caplog: pytest.LogCaptureFixture
) -> None:
    assert refusal_of(error) is None
    with caplog.at_level(logging.ERROR, logger="basalt.services.errors"):
        refusal = as_refusal(error, "GetMessage")
    assert answer(refusal) == (
        S.INTERNAL,
        pb.RESPONSE_CODE_SYSTEM_ERROR,
        f"{type(error).__name__}: {error}",
    )
    assert [r.getMessage() for r in caplog.records] == ["GetMessage failed"]
    assert caplog.records[0].exc_info is not None  # with its traceback


#: Each PutStatus -> (gRPC status, code) of its refusal, None when it is no refusal.
PUT_ROWS: list[tuple[PutStatus, tuple[grpc.StatusCode, int] | None]] = [
    (PutStatus.PUT_OK, None),
    (PutStatus.FLUSH_DISK_TIMEOUT, None),  # written; the response says fsync was late
    (PutStatus.MESSAGE_ILLEGAL, (S.INVALID_ARGUMENT, pb.RESPONSE_CODE_MESSAGE_ILLEGAL)),
    (
        PutStatus.PROPERTIES_SIZE_EXCEEDED,
        (S.INVALID_ARGUMENT, pb.RESPONSE_CODE_MESSAGE_ILLEGAL),
    ),
    (PutStatus.SERVICE_NOT_AVAILABLE, (S.UNAVAILABLE, pb.RESPONSE_CODE_SERVICE_NOT_AVAILABLE)),
    (PutStatus.OS_PAGECACHE_BUSY, (S.RESOURCE_EXHAUSTED, pb.RESPONSE_CODE_SYSTEM_BUSY)),
    (PutStatus.CREATE_MAPPED_FILE_FAILED, (S.INTERNAL, pb.RESPONSE_CODE_SYSTEM_ERROR)),
    (PutStatus.FLUSH_SLAVE_TIMEOUT, None),  # written; the in-sync replicas were late
    (PutStatus.SLAVE_NOT_AVAILABLE, (S.INTERNAL, pb.RESPONSE_CODE_SYSTEM_ERROR)),
    (PutStatus.UNKNOWN_ERROR, (S.INTERNAL, pb.RESPONSE_CODE_SYSTEM_ERROR)),
]


@pytest.mark.parametrize(("status", "expected"), PUT_ROWS)
def test_each_put_status_answers_its_row(
    status: PutStatus, expected: tuple[grpc.StatusCode, int] | None
) -> None:
    refusal = put_refusal(PutMessageResult(status))
    assert (None if refusal is None else (refusal.grpc_status, refusal.code)) == expected
    if refusal is not None:
        assert refusal.message == status.name
        detailed = put_refusal(PutMessageResult(status, detail="4194305 bytes"))
        assert detailed is not None and detailed.message == f"{status.name}: 4194305 bytes"


def test_every_put_status_has_a_row() -> None:
    assert sorted(s.name for s, _ in PUT_ROWS) == sorted(s.name for s in PutStatus)


@pytest.mark.parametrize(
    ("status", "code"),
    [
        (CommitStatus.OK, pb.RESPONSE_CODE_SUCCESS),
        (CommitStatus.STALE_RESET_EPOCH, pb.RESPONSE_CODE_STALE_RESET_EPOCH),
    ],
)
def test_a_commit_answers_its_code_and_the_current_epoch(status: CommitStatus, code: int) -> None:
    assert commit_response(CommitResult(status, 3)) == pb.CommitResult(code=code, reset_epoch=3)


@pytest.mark.parametrize(
    "status",
    [CommitStatus.INVALID_NAME, CommitStatus.INVALID_QUEUE_ID, CommitStatus.INVALID_OFFSET],
)
def test_a_malformed_commit_is_refused_invalid_parameter(status: CommitStatus) -> None:
    with pytest.raises(Refusal) as with_detail:
        commit_response(CommitResult(status, 0, "queue id -1 out of range"))
    assert answer(with_detail.value) == (
        S.INVALID_ARGUMENT,
        pb.RESPONSE_CODE_INVALID_PARAMETER,
        "queue id -1 out of range",
    )
    with pytest.raises(Refusal, match=status.name):  # no detail: the status names it
        commit_response(CommitResult(status, 0))


def test_every_get_message_status_has_a_pull_outcome_at_any_offset() -> None:
    known = [s for s in pb.GetMessageStatus.values() if s != pb.GET_MESSAGE_STATUS_UNSPECIFIED]
    for status in known:
        for offset in (0, 5):
            code, pull_status = pull_outcome(status, offset)
            assert code in {
                pb.RESPONSE_CODE_SUCCESS,
                pb.RESPONSE_CODE_PULL_NOT_FOUND,
                pb.RESPONSE_CODE_PULL_RETRY_IMMEDIATELY,
                pb.RESPONSE_CODE_PULL_OFFSET_MOVED,
            }
            assert pull_status != pb.PULL_STATUS_UNSPECIFIED
    with pytest.raises(Refusal) as unknown:
        pull_outcome(pb.GetMessageStatus.ValueType(99), 0)
    assert answer(unknown.value) == (
        S.INTERNAL,
        pb.RESPONSE_CODE_SYSTEM_ERROR,
        "the store-node answered status 99",
    )


def rpc_error(
    status: grpc.StatusCode, details: str, code: int | None = None
) -> grpc.aio.AioRpcError:
    trailing = grpc.aio.Metadata()
    if code is not None:
        trailing.add(RESPONSE_CODE_KEY, str(code))
    return grpc.aio.AioRpcError(status, grpc.aio.Metadata(), trailing, details)


PEER = "store-node 'broker-a' at 127.0.0.1:10911"


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (
            rpc_error(S.NOT_FOUND, "topic 'T' does not exist", pb.RESPONSE_CODE_TOPIC_NOT_EXIST),
            (S.NOT_FOUND, pb.RESPONSE_CODE_TOPIC_NOT_EXIST, f"{PEER}: topic 'T' does not exist"),
        ),
        (
            rpc_error(S.UNAVAILABLE, "connection refused"),
            (
                S.UNAVAILABLE,
                pb.RESPONSE_CODE_SERVICE_NOT_AVAILABLE,
                f"{PEER} is unreachable: connection refused",
            ),
        ),
        (
            rpc_error(S.CANCELLED, ""),
            (S.UNAVAILABLE, pb.RESPONSE_CODE_SERVICE_NOT_AVAILABLE, f"{PEER} cancelled the call"),
        ),
        (
            rpc_error(S.DEADLINE_EXCEEDED, "Deadline Exceeded"),
            (
                S.UNAVAILABLE,
                pb.RESPONSE_CODE_SERVICE_NOT_AVAILABLE,
                f"{PEER} did not answer within 1500 ms",
            ),
        ),
        (
            rpc_error(S.UNIMPLEMENTED, "Method not found!"),
            (
                S.INTERNAL,
                pb.RESPONSE_CODE_SYSTEM_ERROR,
                f"{PEER} failed: UNIMPLEMENTED: Method not found!",
            ),
        ),
    ],
    ids=["refused", "unreachable", "cancelled", "deadline", "other"],
)
def test_a_failed_downstream_call_names_its_peer(
    error: grpc.aio.AioRpcError, expected: tuple[grpc.StatusCode, int, str]
) -> None:
    assert answer(downstream_refusal(error, PEER, 1.5)) == expected
