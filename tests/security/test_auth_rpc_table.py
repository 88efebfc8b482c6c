"""Every RPC of both protocols is mapped, and every mapping reads real fields."""

from __future__ import annotations

from pathlib import Path

import pytest
from google.protobuf.descriptor import Descriptor, ServiceDescriptor

from basalt.rocketmq.v2 import service_pb2 as v2
from basalt.services.auth.rpc_table import RPC_TABLE, is_exempt, render_markdown
from basalt.v1 import admin_pb2, pull_service_pb2, store_node_pb2

SERVICES: list[ServiceDescriptor] = [
    store_node_pb2.DESCRIPTOR.services_by_name["StoreNode"],
    pull_service_pb2.DESCRIPTOR.services_by_name["PullService"],
    admin_pb2.DESCRIPTOR.services_by_name["Admin"],
    v2.DESCRIPTOR.services_by_name["MessagingService"],
]
METHODS = {f"/{s.full_name}/{m.name}": m for s in SERVICES for m in s.methods}


def test_every_method_of_every_service_is_mapped() -> None:
    unmapped = sorted(set(METHODS) - set(RPC_TABLE))
    assert not unmapped, f"RPCs with no authorization rule: {unmapped}"


def test_the_table_names_no_method_that_does_not_exist() -> None:
    assert not sorted(set(RPC_TABLE) - set(METHODS))


def _resolves(message: Descriptor, path: str) -> bool:
    head, _, rest = path.partition(".")
    field = message.fields_by_name.get(head.removesuffix("[]"))
    if field is None or head.endswith("[]") != field.is_repeated:
        return False
    if not rest:
        return field.message_type is None
    return field.message_type is not None and _resolves(field.message_type, rest)


@pytest.mark.parametrize("method", sorted(RPC_TABLE))
def test_each_resource_path_is_a_string_field_of_the_request(method: str) -> None:
    request = METHODS[method].input_type
    for need in RPC_TABLE[method].needs:
        assert not need.path or _resolves(request, need.path), (method, need.path)


def test_health_and_reflection_stay_open_and_nothing_else_does() -> None:
    assert is_exempt("/grpc.health.v1.Health/Check")
    assert is_exempt("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo")
    assert not any(is_exempt(m) for m in METHODS)


def test_the_docs_render_the_table() -> None:
    doc = Path(__file__).resolve().parents[2] / "docs" / "security.md"
    assert render_markdown() in doc.read_text()
