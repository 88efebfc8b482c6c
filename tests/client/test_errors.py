"""client.errors: a refusal's response code becomes its family's typed ClientError."""

from __future__ import annotations

import pickle

import grpc
import pytest

import basalt.client
from basalt.client import ClientError, errors
from basalt.services import errors as server_errors
from basalt.v1 import common_pb2 as pb

#: The SDK's table (client/errors.py's docstring), spelled out.
CLASS_OF_CODE: list[tuple[int, type[ClientError]]] = [
    (pb.RESPONSE_CODE_TOPIC_NOT_EXIST, errors.TopicNotFoundError),
    (pb.RESPONSE_CODE_TOPIC_EXIST_ALREADY, errors.TopicExistsError),
    (pb.RESPONSE_CODE_NO_PERMISSION, errors.NoPermissionError),
    (pb.RESPONSE_CODE_MESSAGE_ILLEGAL, errors.IllegalMessageError),
    (pb.RESPONSE_CODE_INVALID_PARAMETER, errors.InvalidArgumentError),
    (pb.RESPONSE_CODE_SUBSCRIPTION_PARSE_FAILED, errors.SubscriptionError),
    (pb.RESPONSE_CODE_QUERY_NOT_FOUND, errors.MessageNotFoundError),
    (pb.RESPONSE_CODE_CONSUMER_NOT_ONLINE, errors.ConsumerNotOnlineError),
    (pb.RESPONSE_CODE_STALE_RESET_EPOCH, errors.OffsetFencedError),
    (pb.RESPONSE_CODE_SERVICE_NOT_AVAILABLE, errors.ServiceUnavailableError),
    (pb.RESPONSE_CODE_BROKER_NOT_EXIST, errors.BrokerNotFoundError),
    (pb.RESPONSE_CODE_SYSTEM_BUSY, errors.SystemBusyError),
    (pb.RESPONSE_CODE_FLUSH_DISK_TIMEOUT, errors.FlushTimeoutError),
    (pb.RESPONSE_CODE_FLUSH_SLAVE_TIMEOUT, errors.FlushTimeoutError),
    (pb.RESPONSE_CODE_SYSTEM_ERROR, errors.ServerError),
]


@pytest.mark.parametrize(
    ("code", "cls"), CLASS_OF_CODE, ids=[pb.ResponseCode.Name(c) for c, _ in CLASS_OF_CODE]
)
def test_each_code_makes_its_familys_class(code: int, cls: type[ClientError]) -> None:
    error = ClientError.from_code(code, "why")
    assert type(error) is cls
    assert isinstance(error, ClientError)
    assert (error.code, error.message) == (code, "why")
    assert str(error) == f"{pb.ResponseCode.Name(pb.ResponseCode.ValueType(code))}: why"


@pytest.mark.parametrize(
    "code",
    [
        pb.RESPONSE_CODE_SUCCESS,
        pb.RESPONSE_CODE_VERSION_NOT_SUPPORTED,
        pb.RESPONSE_CODE_SUBSCRIPTION_GROUP_NOT_EXIST,
        pb.RESPONSE_CODE_PULL_NOT_FOUND,
        4242,
    ],
)
def test_a_code_of_no_family_is_a_plain_client_error(code: int) -> None:
    error = ClientError.from_code(code, "why")
    assert type(error) is ClientError and error.code == code


def test_the_constructor_callers_use_keeps_working() -> None:
    error = ClientError(pb.RESPONSE_CODE_TOPIC_NOT_EXIST, "topic 'T' does not exist")
    assert (error.code, error.message) == (17, "topic 'T' does not exist")
    assert str(error) == "RESPONSE_CODE_TOPIC_NOT_EXIST: topic 'T' does not exist"
    assert str(ClientError(4242, "odd")) == "4242: odd"


def test_errors_of_arguments_and_not_founds_are_the_builtins_too() -> None:
    for cls in (
        errors.IllegalMessageError,
        errors.InvalidArgumentError,
        errors.SubscriptionError,
    ):
        assert issubclass(cls, ValueError)
    for cls in (errors.TopicNotFoundError, errors.MessageNotFoundError):
        assert issubclass(cls, LookupError)
    assert issubclass(errors.BrokerNotFoundError, errors.ServiceUnavailableError)


@pytest.mark.parametrize(("code", "cls"), CLASS_OF_CODE[:3])
def test_an_error_pickles_as_itself(code: int, cls: type[ClientError]) -> None:
    again = pickle.loads(pickle.dumps(ClientError.from_code(code, "why")))
    assert type(again) is cls and (again.code, again.message) == (code, "why")


def rpc_error(status: grpc.StatusCode, details: str, code: str | None) -> grpc.aio.AioRpcError:
    trailing = grpc.aio.Metadata()
    if code is not None:
        trailing.add(server_errors.RESPONSE_CODE_KEY, code)
    return grpc.aio.AioRpcError(status, grpc.aio.Metadata(), trailing, details)


def test_a_failed_call_is_read_by_its_response_code() -> None:
    refused = rpc_error(grpc.StatusCode.NOT_FOUND, "topic 'T' does not exist", "17")
    error = ClientError.from_rpc_error(refused)
    assert type(error) is errors.TopicNotFoundError
    assert (error.code, error.message) == (17, "topic 'T' does not exist")
    # No code (the peer was not reached, or is not Basalt): SERVICE_NOT_AVAILABLE.
    for unreached in (
        rpc_error(grpc.StatusCode.UNAVAILABLE, "connection refused", None),
        rpc_error(grpc.StatusCode.UNAVAILABLE, "odd", "not a number"),
    ):
        error = ClientError.from_rpc_error(unreached)
        assert type(error) is errors.ServiceUnavailableError
        assert error.message == unreached.details()
    silent = ClientError.from_rpc_error(rpc_error(grpc.StatusCode.INTERNAL, "", None))
    assert silent.message == "StatusCode.INTERNAL"


def test_the_sdk_reads_the_trailer_the_services_write() -> None:
    # rpc_error writes the trailer under the key the services' table uses.
    error = rpc_error(grpc.StatusCode.ABORTED, "x", "206")
    assert ClientError.from_rpc_error(error).code == server_errors.response_code_of(error) == 206


def server_codes() -> set[int]:
    """Every response code the services' table can refuse with."""
    tables = server_errors
    codes = {
        answer if isinstance(answer, int) else answer.code for _, answer in tables._ANSWER_OF_ERROR
    }
    codes |= {outcome.code for outcome in tables.Outcome}
    codes |= set(tables._CODE_OF_PUT_STATUS.values())
    codes |= {pb.RESPONSE_CODE_SYSTEM_ERROR, pb.RESPONSE_CODE_STALE_RESET_EPOCH}
    return codes


def test_every_code_the_services_refuse_with_has_a_class() -> None:
    typed = {code for code, _ in CLASS_OF_CODE}
    assert server_codes() <= typed


def test_every_class_is_exported_from_basalt_client() -> None:
    for _, cls in CLASS_OF_CODE:
        assert getattr(basalt.client, cls.__name__) is cls
        assert cls.__name__ in basalt.client.__all__
    assert basalt.client.ClientError is ClientError


def test_a_server_that_does_not_serve_the_call_is_the_wrong_kind_of_service() -> None:
    # What grpc answers a method its server does not have (a store-node, the admin service).
    unimplemented = rpc_error(grpc.StatusCode.UNIMPLEMENTED, "Method not found!", None)
    error = ClientError.from_rpc_error(unimplemented, address="127.0.0.1:10911")
    assert type(error) is errors.WrongServiceError
    assert isinstance(error, errors.ServiceUnavailableError)
    assert error.code == pb.RESPONSE_CODE_SERVICE_NOT_AVAILABLE
    assert error.message.startswith(
        "127.0.0.1:10911 is not a pull-service (it does not serve basalt.v1.PullService: "
        "Method not found!) - give a pull-service's host:port"
    )
    store_node = ClientError.from_rpc_error(unimplemented, service="basalt.v1.StoreNode")
    assert store_node.message.startswith("the server is not a store-node")
    assert "pull-service's host:port" not in store_node.message
    # A Basalt refusal that happens to be UNIMPLEMENTED keeps its code.
    coded = ClientError.from_rpc_error(rpc_error(grpc.StatusCode.UNIMPLEMENTED, "x", "17"))
    assert type(coded) is errors.TopicNotFoundError
    assert "WrongServiceError" in basalt.client.__all__
