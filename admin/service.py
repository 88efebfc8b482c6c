"""The Admin gRPC service (``proto/basalt/v1/admin.proto``): the operator's
API, a thin adapter over :mod:`basalt.admin.topics` and :mod:`basalt.admin.ops`.

Each method validates its request as admin.proto states (refusals before any
etcd or store-node call), runs the operation, and encodes the answer. What
the operations raise (basalt.admin.errors, the metadata layer's errors) is
answered by :mod:`basalt.services.errors`' table, through
:func:`basalt.services.rpc.rpc_method` (status, message,
``basalt-response-code``): an unknown topic NOT_FOUND / TOPIC_NOT_EXIST, a
lost compare-and-swap ABORTED / SYSTEM_BUSY, a store-node that failed its
status and code, and so on.

The service holds nothing but a connected MetaClient: every call reads etcd
afresh (config writes never trust a cache), so one etcd outage fails the
calls made during it and nothing after. :func:`start_admin_service` serves
it with health and reflection; :meth:`RunningAdminService.stop` is the
SIGTERM path.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import grpc
from grpc_health.v1 import health

from basalt.admin import ops, topics
from basalt.admin.auth_service import AuthAdminServicer
from basalt.services import auth
from basalt.services.auth.cipher import SecretCipher
from basalt.services.checks import check_group, check_topic
from basalt.services.errors import Refusal, as_refusal, invalid
from basalt.services.meta import MetaClient, MetaValidationError, Perm
from basalt.services.process import (
    add_health_and_reflection,
    add_port,
    add_servicer,
    grpc_server,
    set_serving,
)
from basalt.services.rpc import rpc_method
from basalt.v1 import admin_pb2 as adm
from basalt.v1 import common_pb2 as pb

log = logging.getLogger(__name__)

ADMIN_SERVICE = adm.DESCRIPTOR.services_by_name["Admin"].full_name
#: Answers are small (a topic list is the largest); this leaves room for many topics.
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
#: ResetOffsetByTimeRequest.ack_timeout_ms: 0 means this, more than the max is refused.
DEFAULT_ACK_TIMEOUT_MS = 5000
MAX_ACK_TIMEOUT_MS = 60_000


def topic_change(config: pb.TopicConfig) -> topics.TopicChange:
    """UpdateTopicRequest.config as the change to write: every field as given,
    ``brokers`` empty = keep (or every registered store-node for a new topic).
    MESSAGE_ILLEGAL for a bad topic name, INVALID_PARAMETER for a queue count,
    perm or broker name out of range."""
    check_topic(config.topic)
    if not 0 <= config.perm <= 7:
        raise invalid(f"perm {config.perm}: RocketMQ's PermName bits, 0..7 (6 = read and write)")
    change = topics.TopicChange(
        read_queue_nums=config.read_queue_nums,
        write_queue_nums=config.write_queue_nums,
        perm=Perm(config.perm),
        brokers=tuple(config.brokers),
        order=config.order,
    )
    try:
        change.new_topic(config.topic)  # the stored config's own checks, on every field
    except MetaValidationError as e:
        raise invalid(str(e)) from None
    return change


class AdminServicer(AuthAdminServicer):
    """The Admin service's methods over one connected MetaClient; any number of
    calls may run at once on the server's event loop (each reads etcd afresh).
    ``cipher`` seals users' secrets (None: the user and ACL verbs are refused)."""

    def __init__(self, meta: MetaClient, cipher: SecretCipher | None = None) -> None:
        self.meta = meta
        self.cipher = cipher

    @rpc_method
    async def UpdateTopic(
        self, request: adm.UpdateTopicRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> adm.UpdateTopicResponse:
        change = topic_change(request.config)
        expected = (
            request.expected_mod_revision if request.HasField("expected_mod_revision") else None
        )
        if expected is not None and expected < 0:
            raise invalid(f"expected_mod_revision {expected}: 0 (create only) or a mod revision")
        write = await topics.update_topic(
            self.meta, request.config.topic, change, expected_mod_revision=expected
        )
        return adm.UpdateTopicResponse(
            config=topics.topic_config_pb(write.config), mod_revision=write.mod_revision
        )

    @rpc_method
    async def DeleteTopic(
        self, request: adm.DeleteTopicRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> adm.DeleteTopicResponse:
        check_topic(request.topic)
        await topics.delete_topic(self.meta, request.topic)
        return adm.DeleteTopicResponse()

    @rpc_method
    async def TopicList(
        self, request: adm.TopicListRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> adm.TopicListResponse:
        return adm.TopicListResponse(topics=await topics.topic_names(self.meta))

    @rpc_method
    async def GetTopic(
        self, request: adm.GetTopicRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> adm.GetTopicResponse:
        check_topic(request.topic)
        got = await topics.get_topic(self.meta, request.topic)
        return adm.GetTopicResponse(
            config=topics.topic_config_pb(got.config), mod_revision=got.mod_revision
        )

    @rpc_method
    async def ResetOffsetByTime(
        self, request: adm.ResetOffsetByTimeRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> adm.ResetOffsetByTimeResponse:
        check_group(request.group)
        check_topic(request.topic)
        if request.timestamp_ms < -1:
            raise invalid(f"timestamp_ms {request.timestamp_ms}: a time in ms, or -1 for the max")
        if not 0 <= request.ack_timeout_ms <= MAX_ACK_TIMEOUT_MS:
            raise invalid(
                f"ack_timeout_ms {request.ack_timeout_ms}: 0 (the default, "
                f"{DEFAULT_ACK_TIMEOUT_MS}) to {MAX_ACK_TIMEOUT_MS}"
            )
        outcome = await ops.reset_offset_by_time(
            self.meta,
            request.group,
            request.topic,
            request.timestamp_ms,
            force=request.force,
            ack_timeout_ms=request.ack_timeout_ms or DEFAULT_ACK_TIMEOUT_MS,
        )
        if outcome.failed:
            raise reset_failure(outcome)
        return adm.ResetOffsetByTimeResponse(
            offsets=outcome.offsets, consumer_acks=outcome.acks or ()
        )


def reset_failure(outcome: ops.ResetOutcome) -> Refusal:
    """The refusal of a reset some store-node failed: the status and code of the
    first failure by name, a message naming every failed store-node and the ones
    whose reset was done (it stays; no consumer was told)."""
    failed = sorted(outcome.failed.items())
    refusal = as_refusal(failed[0][1], "ResetOffsetByTime")
    done = sorted({o.queue.broker_name for o in outcome.offsets})
    message = "; ".join(str(e) for _, e in failed) + (
        f". Reset done on {', '.join(done)} (it stays; no consumer was told; retrying is safe)"
        if done
        else ". Nothing was reset"
    )
    return refusal.with_message(message)


@dataclass(slots=True)
class RunningAdminService:
    """A started admin service; :meth:`stop` it exactly once."""

    server: grpc.aio.Server
    port: int
    address: str
    health: health.aio.HealthServicer

    async def stop(self, grace_s: float = 5.0) -> None:
        """Graceful stop: NOT_SERVING, no new calls, in-flight ones finish (up to
        ``grace_s``: a reset waiting for its consumers' acks may take that long).
        The MetaClient belongs to the caller, who closes it afterwards."""
        await set_serving(self.health, ADMIN_SERVICE, False)
        await self.server.stop(grace_s)
        log.info("admin service stopped")


async def start_admin_service(
    meta: MetaClient,
    *,
    listen: str = "127.0.0.1:0",
    advertise_host: str = "127.0.0.1",
    cipher: SecretCipher | None = None,
) -> RunningAdminService:
    """Serve Admin, ``grpc.health.v1`` (SERVING once started) and reflection on
    ``listen`` (port 0 picks a free port); ``meta`` must be connected. The
    service serves, and dials store-nodes and pull-services, with ``meta.tls``
    (TLS when it is enabled), the transport of the cluster ``meta`` reaches.
    ``cipher`` (default: the process's cluster key, basalt.services.auth) seals
    secrets."""
    server = grpc_server(MAX_MESSAGE_BYTES)
    servicer = AdminServicer(meta, cipher if cipher is not None else auth.process_cipher())
    add_servicer(server, servicer, adm.DESCRIPTOR.services_by_name["Admin"])
    health_servicer = add_health_and_reflection(server, ADMIN_SERVICE)
    port = add_port(server, listen, meta.tls)
    await server.start()
    await set_serving(health_servicer, ADMIN_SERVICE, True)
    address = f"{advertise_host}:{port}"
    log.info("admin service serving on %s", address)
    return RunningAdminService(server, port, address, health_servicer)
