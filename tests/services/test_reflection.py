"""Server reflection, v1 and v1alpha, on Basalt's servers (services/process.py
add_health_and_reflection): grpcio-reflection's own client, the descriptor
database tools build on, asked under each service name."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
from google.protobuf.descriptor_pool import DescriptorPool
from grpc_reflection.v1alpha import reflection_pb2
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from basalt.services.meta import MetaConfig
from basalt.services.process import REFLECTION_V1_SERVICE
from tests.support.aio import async_test
from tests.support.nodes import cluster

V1ALPHA = "grpc.reflection.v1alpha.ServerReflection"


def describe(address: str, reflection_service: str, service: str) -> tuple[list[str], list[str]]:
    """The services listed by ``reflection_service`` at ``address``, and the
    methods of ``service`` as its reflected descriptors say (blocking: run it in
    a thread)."""
    with grpc.insecure_channel(address) as channel:
        db = ProtoReflectionDescriptorDatabase(channel)
        # The client speaks v1alpha; v1's messages are the same on the wire, so
        # pointing its one method at v1's name makes it a v1 client.
        db._stub.ServerReflectionInfo = channel.stream_stream(  # type: ignore[method-assign]
            f"/{reflection_service}/ServerReflectionInfo",
            request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
            response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
        )
        listed = list(db.get_services())
        pool = DescriptorPool(db)
        methods = [m.name for m in pool.FindServiceByName(service).methods]
        return listed, methods


@async_test
async def test_every_server_answers_reflection_v1_and_v1alpha(
    tmp_path: Path, meta_config: MetaConfig
) -> None:
    async with cluster(tmp_path, meta_config, brokers=("broker-a",)) as h:
        servers = (
            (h.services[0].address, "basalt.v1.PullService", "QueryOffset"),
            (h.nodes["broker-a"].address, "basalt.v1.StoreNode", "GetMessages"),
        )
        for address, service, method in servers:
            for name in (REFLECTION_V1_SERVICE, V1ALPHA):
                listed, methods = await asyncio.to_thread(describe, address, name, service)
                assert {service, "grpc.health.v1.Health", REFLECTION_V1_SERVICE, V1ALPHA} <= set(
                    listed
                ), (address, name)
                assert method in methods
                # The v1 service it lists is described too (as v1, not v1alpha).
                _, reflection_methods = await asyncio.to_thread(
                    describe, address, name, REFLECTION_V1_SERVICE
                )
                assert reflection_methods == ["ServerReflectionInfo"]
