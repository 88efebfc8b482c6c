"""How a refused call carries RocketMQ's response code.

A service fails a refused call with a gRPC status and a message, and puts the
RocketMQ response code (common.proto's ``ResponseCode``) in the trailing
metadata :data:`RESPONSE_CODE_KEY`, in decimal, so a client can tell, say,
TOPIC_NOT_EXIST from SUBSCRIPTION_GROUP_NOT_EXIST without parsing text. The
services write it (:func:`basalt.services.errors.abort`); the SDK, the admin
tools and the pull-service read it with :func:`response_code_of`.

An error raised by code the services call but do not own (the admin
operations) says what it answers by subclassing :class:`CodedError`: the
services' one table (:func:`basalt.services.errors.refusal_of`) reads its
``code`` and ``grpc_status`` without importing the module that defines it.
"""

from __future__ import annotations

import grpc

#: Trailing metadata key carrying the RocketMQ response code of a refusal.
RESPONSE_CODE_KEY = "basalt-response-code"


def response_code_of(error: grpc.aio.AioRpcError) -> int | None:
    """The RocketMQ code a failed call carried in ``basalt-response-code``; None
    when it carries none (the peer was not reached, or is not Basalt)."""
    raw = dict(error.trailing_metadata() or ()).get(RESPONSE_CODE_KEY)
    if isinstance(raw, str) and raw.lstrip("-").isdigit():
        return int(raw)
    return None


class CodedError(Exception):
    """An error that carries what a service answers when it escapes a call:
    RocketMQ's response code :attr:`code` (common.proto's ``ResponseCode``) and
    the gRPC status :attr:`grpc_status` (None: the code's own, by
    :data:`basalt.services.errors.GRPC_STATUS`). Subclasses set both as class
    attributes, or per instance when the answer depends on the error (a peer's
    refusal passed on); the message is ``str(error)``."""

    #: SYSTEM_ERROR (common.proto), until a subclass says otherwise.
    code: int = 1
    grpc_status: grpc.StatusCode | None = None


#: How a NOT_MASTER refusal names the master (docs/replication.md#election-and-fencing):
#: the text ends with this marker and the master's client address, so a client
#: re-routes from the message alone - a refusal inside a SendStream answer has no
#: trailing metadata.
_MASTER_MARKER = "; master at "


def not_master_message(broker_name: str, master_id: int | None, master_address: str | None) -> str:
    """The message of a NOT_MASTER refusal by a member of ``broker_name``'s group;
    ``master_address`` None while no master is known (an election is on)."""
    if master_address is None or master_id is None:
        return f"this member of {broker_name} is not its master, and no master is known now"
    return (
        f"this member of {broker_name} is not its master (broker id {master_id})"
        f"{_MASTER_MARKER}{master_address}"
    )


def master_address_of(message: str) -> str | None:
    """The master's client address a NOT_MASTER message names (None: none known)."""
    _, marker, address = message.rpartition(_MASTER_MARKER)
    return address or None if marker else None
