"""The SDK's exceptions: one class per family of RocketMQ response codes.

A call that fails for good (a send after its retries, a pull, a route) raises
a :class:`ClientError` carrying RocketMQ's response code (``.code``) and why
(``.message``); its class says which family of refusal it is, so callers
write ``except TopicNotFoundError`` rather than compare codes::

    class                     response codes                  when
    ------------------------  ------------------------------  ----------------------------------
    TopicNotFoundError        TOPIC_NOT_EXIST                 the topic has no configuration
    TopicExistsError          TOPIC_EXIST_ALREADY             a create-only write found it
    NoPermissionError         NO_PERMISSION                   the topic or broker forbids it
    IllegalMessageError       MESSAGE_ILLEGAL                 the store will not take the message
    InvalidArgumentError      INVALID_PARAMETER               a request's argument is out of range
    SubscriptionError         SUBSCRIPTION_PARSE_FAILED       the subscription does not parse
    MessageNotFoundError      QUERY_NOT_FOUND                 no message at that id
    ConsumerNotOnlineError    CONSUMER_NOT_ONLINE             no live consumer / session
    OffsetFencedError         STALE_RESET_EPOCH               a commit from before a reset
    ServiceUnavailableError   SERVICE_NOT_AVAILABLE, or no    a service is down, stopping or
                              code (the peer not reached)     unreachable: retry later
    WrongServiceError         no code, gRPC UNIMPLEMENTED     the address is another kind of
                              (a ServiceUnavailableError)     service (a store-node, etcd, ...)
    BrokerNotFoundError       BROKER_NOT_EXIST                the store-node is not registered
                              (a ServiceUnavailableError)
    NotMasterError            NOT_MASTER                      a slave of a broker group was
                              (a ServiceUnavailableError)     called; names the master
    NotEnoughReplicasError    IN_SYNC_REPLICAS_NOT_ENOUGH     the group's in-sync set is below
                              (a ServiceUnavailableError)     min_in_sync_replicas
    SystemBusyError           SYSTEM_BUSY                     flow control, or a send's deadline
    FlushTimeoutError         FLUSH_DISK_TIMEOUT,             a flush did not finish in time
                              FLUSH_SLAVE_TIMEOUT
    ServerError               SYSTEM_ERROR                    the server failed (see its log)
    ClientError               any other code

:meth:`ClientError.from_code` and :meth:`ClientError.from_rpc_error` make the
right class from a refusal; the SDK makes every ClientError through them.
The errors of arguments subclass ``ValueError`` and the not-founds
``LookupError``, so code that knows nothing of Basalt still catches them.
"""

from __future__ import annotations

import grpc

from basalt.common.status import master_address_of, response_code_of
from basalt.v1 import common_pb2 as pb

#: The response codes this protocol version knows (others keep their number).
_CODES = frozenset(pb.ResponseCode.values())

#: The gRPC service a client's calls go to: every SDK client talks to a pull-service.
PULL_SERVICE = "basalt.v1.PullService"
#: What a newcomer calls each Basalt gRPC service (WrongServiceError's message).
_KIND_OF_SERVICE = {
    PULL_SERVICE: "pull-service",
    "basalt.v1.StoreNode": "store-node",
    "basalt.v1.Admin": "admin service",
}


class ClientError(Exception):
    """A call that failed for good (a send after its retries, a pull, a commit):
    RocketMQ's response code and why. ``str()`` is ``"<CODE NAME>: <message>"``."""

    def __init__(self, code: int, message: str) -> None:
        name = pb.ResponseCode.Name(pb.ResponseCode.ValueType(code)) if code in _CODES else code
        super().__init__(f"{name}: {message}")
        self.code = code
        self.message = message

    def __reduce__(self) -> tuple[type[ClientError], tuple[int, str]]:
        # Pickled (a worker process, a Spark task) as its constructor's arguments:
        # Exception's default would pass the formatted text as the code.
        return type(self), (self.code, self.message)

    @staticmethod
    def from_code(code: int, message: str) -> ClientError:
        """The error of a refusal with response code ``code``: its family's
        class (the module docstring's table), else a plain ClientError."""
        return _CLASS_OF_CODE.get(code, ClientError)(code, message)

    @staticmethod
    def from_rpc_error(
        error: grpc.aio.AioRpcError,
        *,
        address: str | None = None,
        service: str = PULL_SERVICE,
    ) -> ClientError:
        """The error of a failed call: by its ``basalt-response-code``, and
        SERVICE_NOT_AVAILABLE when it carries none (the peer was not reached, or
        is not Basalt); the message is the call's details.

        A call answered UNIMPLEMENTED with no code reached a server that does
        not serve ``service`` (the gRPC service the call belongs to): the
        client was pointed at the wrong kind of service, a store-node, the
        admin service or etcd. That is a :class:`WrongServiceError` saying so,
        naming ``address`` (the address called) when given."""
        code = response_code_of(error)
        if code is None and error.code() == grpc.StatusCode.UNIMPLEMENTED:
            return WrongServiceError.of(address, service, error.details() or "")
        return ClientError.from_code(
            pb.RESPONSE_CODE_SERVICE_NOT_AVAILABLE if code is None else code,
            error.details() or str(error.code()),
        )


class TopicNotFoundError(ClientError, LookupError):
    """The topic has no configuration (TOPIC_NOT_EXIST)."""


class TopicExistsError(ClientError):
    """A create-only write found the topic configured (TOPIC_EXIST_ALREADY)."""


class NoPermissionError(ClientError):
    """The topic's or the broker's perm forbids the send or pull, or the topic
    has no writable queue (NO_PERMISSION)."""


class IllegalMessageError(ClientError, ValueError):
    """The store will not take the message: a bad topic name, too large, bad
    properties, delayed delivery (MESSAGE_ILLEGAL)."""


class InvalidArgumentError(ClientError, ValueError):
    """An argument of the request is out of range: a queue id past the topic's
    queues, a negative offset, a bad group name (INVALID_PARAMETER)."""


class SubscriptionError(ClientError, ValueError):
    """The subscription expression does not parse; the message names the
    position (SUBSCRIPTION_PARSE_FAILED)."""


class MessageNotFoundError(ClientError, LookupError):
    """No message at the id or key asked for (QUERY_NOT_FOUND)."""


class ConsumerNotOnlineError(ClientError):
    """The consumer has no session on the pull-service, or the group has no live
    consumer (CONSUMER_NOT_ONLINE)."""


class OffsetFencedError(ClientError):
    """An offset commit carried a reset epoch older than the store-node's: a
    reset happened since the offsets were read, and nothing was stored
    (STALE_RESET_EPOCH). The SDK's consumers handle it themselves (they adopt
    the reset's offsets); code committing on its own reads the offsets again
    and commits under the new epoch."""


class ServiceUnavailableError(ClientError):
    """A service cannot serve now: down, stopping, unreachable, or etcd is away
    (SERVICE_NOT_AVAILABLE, and any failed call that carries no code). Retry
    later or elsewhere."""


class WrongServiceError(ServiceUnavailableError):
    """The address called serves gRPC but not the service the call belongs to:
    a store-node's, the admin service's or etcd's address where a
    pull-service's was wanted (SERVICE_NOT_AVAILABLE: nothing there will ever
    serve the call; the message says what to give instead)."""

    @staticmethod
    def of(address: str | None, service: str, details: str) -> WrongServiceError:
        """The error for ``address`` (None: unknown) not serving ``service``;
        ``details`` is what the server said."""
        kind = _KIND_OF_SERVICE.get(service, service)
        where = address or "the server"
        hint = (
            " - give a pull-service's host:port (`basalt cluster status` lists them; "
            "BASALT_ENDPOINTS, or --endpoints)"
            if service == PULL_SERVICE
            else ""
        )
        return WrongServiceError(
            pb.RESPONSE_CODE_SERVICE_NOT_AVAILABLE,
            f"{where} is not a {kind} (it does not serve {service}: {details or 'UNIMPLEMENTED'})"
            f"{hint}",
        )


class BrokerNotFoundError(ServiceUnavailableError):
    """The store-node named is not registered: down, or never started
    (BROKER_NOT_EXIST)."""


class NotMasterError(ServiceUnavailableError):
    """The store-node is a member of its broker group but not the master
    (NOT_MASTER): :attr:`master_address` is the master's, None while an election
    is on. The producer re-sends there at once (docs/replication.md)."""

    @property
    def master_address(self) -> str | None:
        return master_address_of(self.message)


class NotEnoughReplicasError(ServiceUnavailableError):
    """The broker group has fewer in-sync members than its
    ``min_in_sync_replicas``: the send was refused before anything was written
    (IN_SYNC_REPLICAS_NOT_ENOUGH). Retried on another broker."""


class SystemBusyError(ClientError):
    """The service is shedding load, or the send's deadline passed before any
    attempt succeeded (SYSTEM_BUSY). Retry later."""


class FlushTimeoutError(ClientError):
    """A flush to disk (or to a replica) did not finish in time
    (FLUSH_DISK_TIMEOUT, FLUSH_SLAVE_TIMEOUT). A Basalt store-node that stored a
    message but fsynced it late says so in ``SendResult.status`` instead: the
    message is written, so the send does not fail."""


class ServerError(ClientError):
    """The service failed serving the request; its log has the traceback
    (SYSTEM_ERROR)."""


#: Response code -> its family's class (the module docstring's table).
_CLASS_OF_CODE: dict[int, type[ClientError]] = {
    pb.RESPONSE_CODE_TOPIC_NOT_EXIST: TopicNotFoundError,
    pb.RESPONSE_CODE_TOPIC_EXIST_ALREADY: TopicExistsError,
    pb.RESPONSE_CODE_NO_PERMISSION: NoPermissionError,
    pb.RESPONSE_CODE_MESSAGE_ILLEGAL: IllegalMessageError,
    pb.RESPONSE_CODE_INVALID_PARAMETER: InvalidArgumentError,
    pb.RESPONSE_CODE_SUBSCRIPTION_PARSE_FAILED: SubscriptionError,
    pb.RESPONSE_CODE_QUERY_NOT_FOUND: MessageNotFoundError,
    pb.RESPONSE_CODE_CONSUMER_NOT_ONLINE: ConsumerNotOnlineError,
    pb.RESPONSE_CODE_STALE_RESET_EPOCH: OffsetFencedError,
    pb.RESPONSE_CODE_SERVICE_NOT_AVAILABLE: ServiceUnavailableError,
    pb.RESPONSE_CODE_BROKER_NOT_EXIST: BrokerNotFoundError,
    pb.RESPONSE_CODE_NOT_MASTER: NotMasterError,
    pb.RESPONSE_CODE_IN_SYNC_REPLICAS_NOT_ENOUGH: NotEnoughReplicasError,
    pb.RESPONSE_CODE_SYSTEM_BUSY: SystemBusyError,
    pb.RESPONSE_CODE_FLUSH_DISK_TIMEOUT: FlushTimeoutError,
    pb.RESPONSE_CODE_FLUSH_SLAVE_TIMEOUT: FlushTimeoutError,
    pb.RESPONSE_CODE_SYSTEM_ERROR: ServerError,
}


__all__ = [
    "BrokerNotFoundError",
    "ClientError",
    "ConsumerNotOnlineError",
    "FlushTimeoutError",
    "IllegalMessageError",
    "InvalidArgumentError",
    "MessageNotFoundError",
    "NoPermissionError",
    "NotEnoughReplicasError",
    "NotMasterError",
    "OffsetFencedError",
    "ServerError",
    "ServiceUnavailableError",
    "SubscriptionError",
    "SystemBusyError",
    "TopicExistsError",
    "TopicNotFoundError",
    "WrongServiceError",
]


def describe_failure(error: Exception) -> str:
    """Why a call or a stream failed, in one line: a gRPC status as ``CODE:
    details`` (an AioRpcError's own text spans lines), else the exception."""
    if isinstance(error, grpc.aio.AioRpcError):
        return f"{error.code().name}: {error.details() or 'no details'}"
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
