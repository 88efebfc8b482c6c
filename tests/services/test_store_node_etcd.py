"""The store-node with etcd: sends keep flowing through an etcd outage for topics
it knows; what needs etcd (creating a topic) is refused clearly until it is back."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest

from basalt.services.cluster.etcd import EtcdProcess
from basalt.services.meta import MetaClient, MetaConfig
from basalt.services.store_node.main import EtcdTopics
from basalt.services.store_node.server import start_store_node
from basalt.services.store_node.service import StoreNodeConfig
from basalt.v1 import common_pb2 as pb
from basalt.v1 import store_node_pb2 as sn
from basalt.v1 import store_node_pb2_grpc as sn_grpc
from tests.support.aio import async_test
from tests.support.etcd import unique_cluster
from tests.support.polling import eventually
from tests.support.rpc import refused
from tests.support.stores import node_store_config

pytestmark = pytest.mark.slow


@async_test
async def test_sends_continue_through_an_etcd_outage_and_auto_create_waits_for_it(
    tmp_path: Path, private_etcd: EtcdProcess
) -> None:
    meta = MetaClient(
        MetaConfig(endpoints=(private_etcd.endpoint,), cluster=unique_cluster(), op_timeout_s=1.0)
    )
    await meta.connect()
    cache = meta.topic_cache()
    await cache.start()
    running = await start_store_node(
        StoreNodeConfig(broker_name="broker-a"),
        node_store_config(tmp_path / "store"),
        EtcdTopics(meta, cache, 4),
    )
    try:
        async with grpc.aio.insecure_channel(running.address) as channel:
            stub = sn_grpc.StoreNodeStub(channel)

            async def send(topic: str, body: bytes) -> sn.SendMessageResponse:
                return await stub.SendMessage(  # type: ignore[no-any-return]
                    sn.SendMessageRequest(message=pb.Message(topic=topic, body=body))
                )

            assert (await send("Known", b"before")).result.status == pb.SEND_STATUS_SEND_OK
            assert await cache.wait_until(lambda c: c.get("Known") is not None, 5)
            await asyncio.to_thread(private_etcd.stop)
            for i in range(20):  # etcd is down: the cached topic keeps taking sends
                r = await send("Known", b"during %d" % i)
                assert r.result.status == pb.SEND_STATUS_SEND_OK
            status, code, details = await refused(send("Unknown", b"needs etcd"))
            assert status == grpc.StatusCode.UNAVAILABLE
            assert code == pb.RESPONSE_CODE_SERVICE_NOT_AVAILABLE
            assert "unreachable" in details
            await asyncio.to_thread(private_etcd.start)

            async def sent_again() -> bool:  # reconnection is automatic
                nonlocal r
                try:
                    r = await send("Unknown", b"after")
                except grpc.aio.AioRpcError:
                    return False
                return True

            await eventually(sent_again, interval_s=0.1)
            assert r.result.status == pb.SEND_STATUS_SEND_OK
            got = await stub.GetMinMaxOffset(sn.GetMinMaxOffsetRequest(topic="Known"))
            assert got.max_offset == 21
    finally:
        await running.stop(grace_s=1)
        await cache.close()
        await meta.close()
