"""The store-node with etcd: sends keep flowing through an etcd outage for topics
it knows; what needs etcd (creating a topic) is refused clearly until it is back."""

from __future__ import annotations

import asyncio
from functools import partial
from pathlib import Path

import grpc
import pytest

from basalt.services.cluster.etcd import EtcdProcess
from basalt.services.meta import BrokerRegistration, MetaClient, MetaConfig, TopicConfig
from basalt.services.meta.model import Perm
from basalt.services.store_node.main import EtcdTopics, _registered_perm
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


@async_test
async def test_the_broker_permission_in_its_registration_gates_reads_and_sends(
    tmp_path: Path, private_etcd: EtcdProcess
) -> None:
    """RocketMQ's ``brokerPermission``, as the broker's registration in etcd says:
    the store-node checks it itself, since the SDK reads and sends there directly."""
    meta = MetaClient(MetaConfig(endpoints=(private_etcd.endpoint,), cluster=unique_cluster()))
    await meta.connect()
    topics, brokers = meta.topic_cache(), meta.broker_cache()
    await topics.start()
    await brokers.start()
    await meta.create_topic(TopicConfig(topic_name="T", brokers=("broker-a",)))
    assert await topics.wait_until(lambda c: c.get("T") is not None, 5)

    def registration(perm: Perm) -> BrokerRegistration:
        return BrokerRegistration(
            broker_name="broker-a",
            address="127.0.0.1:1",
            perm=perm,
            store_root_id=str(tmp_path),
            started_at_ms=1,
        )

    registered = await meta.register(registration(Perm.WRITE))
    running = await start_store_node(
        StoreNodeConfig(broker_name="broker-a"),
        node_store_config(tmp_path / "store"),
        EtcdTopics(meta, topics, 4),
        broker_perm=partial(_registered_perm, brokers, "broker-a", Perm.RW),
    )
    try:
        assert await brokers.wait_until(lambda c: c.get("broker-a") is not None, 5)
        async with grpc.aio.insecure_channel(running.address) as channel:
            stub = sn_grpc.StoreNodeStub(channel)
            send = sn.SendMessageRequest(message=pb.Message(topic="T", body=b"m"), queue_id=0)
            read = sn.GetMessagesRequest(
                reads=[sn.GetMessageRequest(group="g", topic="T", queue_id=0, max_msg_nums=8)]
            )
            # Write-only: sends go in, reads are refused with the pull-service's words.
            assert (await stub.SendMessage(send)).result.status == pb.SEND_STATUS_SEND_OK
            got = (await stub.GetMessages(read)).results[0]
            assert got.refused.code == pb.RESPONSE_CODE_NO_PERMISSION
            assert "broker 'broker-a' pulling message is forbidden (perm 2)" in got.refused.message

            await registered.close()
            registered = await meta.register(registration(Perm.READ))
            assert await brokers.wait_until(
                lambda c: (b := c.get("broker-a")) is not None and b.perm == Perm.READ, 5
            )
            # Read-only: what was sent reads back; a send is refused.
            got = (await stub.GetMessages(read)).results[0]
            assert not got.HasField("refused") and got.status == pb.PULL_STATUS_FOUND
            assert got.next_begin_offset == 1
            status, code, details = await refused(stub.SendMessage(send))
            assert code == pb.RESPONSE_CODE_NO_PERMISSION
            assert "broker 'broker-a' sending message is forbidden (perm 4)" in details
            assert status == grpc.StatusCode.PERMISSION_DENIED
    finally:
        await running.stop(grace_s=1)
        await registered.close()
        await brokers.close()
        await topics.close()
        await meta.close()
