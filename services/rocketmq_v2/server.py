"""Serving the v2 front on its own listener, beside a pull-service.

RocketMQ's clients dial one access point and find everything there, while
Basalt's own clients dial the pull-service's: a second gRPC server in the
same process keeps the two protocols' ports, message limits and health
apart while sharing the pull-service's caches and channels (the front holds
nothing of its own).
"""

from __future__ import annotations

from typing import Any

import grpc
from google.protobuf.message_factory import GetMessageClass

from basalt.rocketmq.v2 import service_pb2 as sv
from basalt.services.process import add_health_and_reflection, grpc_server, set_serving
from basalt.services.pull_service.service import PullServiceServicer
from basalt.services.rocketmq_v2.service import MessagingServiceServicer, RocketMQv2Config

SERVICE = sv.DESCRIPTOR.services_by_name["MessagingService"]
#: The methods served so far; any other is UNIMPLEMENTED (gRPC's answer for a
#: method the server does not register).
SERVED = (
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
)
_HANDLERS: dict[tuple[bool, bool], Any] = {
    (False, False): grpc.unary_unary_rpc_method_handler,
    (False, True): grpc.unary_stream_rpc_method_handler,
    (True, False): grpc.stream_unary_rpc_method_handler,
    (True, True): grpc.stream_stream_rpc_method_handler,
}


def add_messaging_service(server: grpc.aio.Server, servicer: MessagingServiceServicer) -> None:
    """Register the :data:`SERVED` methods of ``servicer`` on ``server``."""
    handlers = {}
    for name in SERVED:
        method = SERVICE.methods_by_name[name]
        handlers[name] = _HANDLERS[method.client_streaming, method.server_streaming](
            getattr(servicer, name),
            request_deserializer=GetMessageClass(method.input_type).FromString,
            response_serializer=GetMessageClass(method.output_type).SerializeToString,
        )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(SERVICE.full_name, handlers),)
    )
    server.add_registered_method_handlers(SERVICE.full_name, handlers)


async def start_rocketmq_v2(
    config: RocketMQv2Config, pull: PullServiceServicer, listen: str
) -> tuple[grpc.aio.Server, int]:
    """Serve the front on ``listen`` (port 0: a free one) over ``pull``'s view;
    returns the started server and its bound port. The caller stops it."""
    server = grpc_server(pull.config.max_message_bytes)
    add_messaging_service(server, MessagingServiceServicer(config, pull))
    health = add_health_and_reflection(server, SERVICE.full_name)
    port = server.add_insecure_port(listen)
    await server.start()
    await set_serving(health, SERVICE.full_name, True)
    return server, port
