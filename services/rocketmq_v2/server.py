"""Serving the v2 front on its own listener, beside a pull-service or a store-node.

RocketMQ's clients dial one access point and find everything there, while
Basalt's own clients dial the pull-service's or the store-node's: a second
gRPC server in the same process keeps the two protocols' ports and health
apart while sharing the process's caches and channels (the front holds
nothing of its own: :class:`~basalt.services.rocketmq_v2.host.FrontHost`).
Its server is made by :func:`basalt.services.process.grpc_server`, so the
process's interceptors (telemetry, auth) apply to it as to its own service.
The listener's settings are :class:`RocketMQv2Listener`, a section of both
processes' settings.
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc
from grpc_health.v1 import health

from basalt.common.tls import TlsConfig
from basalt.rocketmq.v2 import service_pb2 as sv
from basalt.services.process import (
    add_health_and_reflection,
    add_port,
    add_servicer,
    grpc_server,
    set_serving,
)
from basalt.services.rocketmq_v2.host import FrontHost
from basalt.services.rocketmq_v2.service import MessagingServiceServicer, RocketMQv2Config

SERVICE = sv.DESCRIPTOR.services_by_name["MessagingService"]
#: The methods served so far; any other is UNIMPLEMENTED (gRPC's answer for a
#: method the server does not register).
SERVED = frozenset(
    {
        "QueryRoute",
        "Heartbeat",
        "NotifyClientTermination",
        "Telemetry",
        "SendMessage",
        "QueryOffset",
        "GetOffset",
        "UpdateOffset",
        "EndTransaction",
        "RecallMessage",
        "ReceiveMessage",
        "AckMessage",
        "ChangeInvisibleDuration",
        "ForwardMessageToDeadLetterQueue",
        "QueryAssignment",
        "PullMessage",
    }
)


@dataclass(slots=True)
class RunningFront:
    """A started v2 front; :meth:`stop` it once (the process serving it does)."""

    server: grpc.aio.Server
    port: int
    health: health.aio.HealthServicer
    servicer: MessagingServiceServicer

    async def stop(self, grace_s: float | None) -> None:
        """NOT_SERVING, then calls in flight get ``grace_s`` to finish."""
        await set_serving(self.health, SERVICE.full_name, False)
        await self.server.stop(grace_s)
        await self.servicer.close()


async def start_rocketmq_v2(
    config: RocketMQv2Config,
    host: FrontHost,
    listen: str,
    *,
    tls: TlsConfig | None = None,
) -> RunningFront:
    """Serve the front on ``listen`` (port 0: a free one; TLS when ``tls`` is
    enabled, as the official clients dial it with ``tls_enable``) over
    ``host``, SERVING once started. Raises what binding raises (the address in
    use)."""
    server = grpc_server(host.max_message_bytes)
    servicer = MessagingServiceServicer(config, host)
    add_servicer(server, servicer, SERVICE, only=SERVED)
    health_servicer = add_health_and_reflection(server, SERVICE.full_name)
    port = add_port(server, listen, tls)
    await server.start()
    await set_serving(health_servicer, SERVICE.full_name, True)
    return RunningFront(server, port, health_servicer, servicer)
