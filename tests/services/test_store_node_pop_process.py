"""Pop-and-ack across kill -9: a real store-node process on a real etcd.

Messages are popped, half acked, the process killed with SIGKILL and started
again: the un-acked ones come again (attempt 2), the acked ones never, a
pre-crash handle still acks its delivery, and nothing is lost.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from basalt.services.cluster.etcd import EtcdProcess
from basalt.v1 import common_pb2 as pb
from basalt.v1 import store_node_pb2 as sn
from basalt.v1 import store_node_pb2_grpc as sn_grpc
from tests.support.etcd import unique_cluster
from tests.support.polling import eventually_sync
from tests.support.processes import ServiceProcess, store_node_process

pytestmark = pytest.mark.slow

TOPIC = "PopDurable"
GROUP = "pop-durable"
INVISIBLE_MS = 2_000


@pytest.fixture
def node(tmp_path: Path, etcd: EtcdProcess) -> Iterator[ServiceProcess]:
    """``broker-a`` with its data in ``tmp_path / "broker-a"``, ASYNC flush (the default)."""
    n = store_node_process(tmp_path, "broker-a", "--etcd", etcd.endpoint, "--cluster",
                           unique_cluster())  # fmt: skip
    try:
        n.wait_serving()
        yield n
    finally:
        if n.proc.poll() is None:
            n.stop(signal.SIGKILL)


async def send(address: str, count: int, first: int = 0) -> None:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = sn_grpc.StoreNodeStub(channel)
        for i in range(first, first + count):
            await stub.SendMessage(
                sn.SendMessageRequest(message=pb.Message(topic=TOPIC, body=b"%d" % i))
            )


async def pop(address: str, max_messages: int, poll_ms: int = 0) -> list[sn.PoppedMessage]:
    async with grpc.aio.insecure_channel(address) as channel:
        got = await sn_grpc.StoreNodeStub(channel).PopMessages(
            sn.PopMessagesRequest(
                group=GROUP, topic=TOPIC, queue_ids=[0], max_messages=max_messages,
                invisible_duration_ms=INVISIBLE_MS, poll_timeout_ms=poll_ms,
            )
        )  # fmt: skip
        return list(got.messages)


async def ack(address: str, handles: list[str]) -> list[int]:
    async with grpc.aio.insecure_channel(address) as channel:
        got = await sn_grpc.StoreNodeStub(channel).AckMessages(
            sn.AckMessagesRequest(group=GROUP, topic=TOPIC, receipt_handles=handles)
        )
        return [r.status for r in got.results]


def test_kill_9_redelivers_every_unacked_message_and_no_acked_one(node: ServiceProcess) -> None:
    asyncio.run(send(node.address, 20))
    first = asyncio.run(pop(node.address, 32))
    assert [m.queue_offset for m in first] == list(range(20))
    assert (
        asyncio.run(ack(node.address, [m.receipt_handle for m in first[:10]]))
        == [sn.POP_ACK_STATUS_OK] * 10
    )
    node.stop(signal.SIGKILL)
    node.start()
    node.wait_serving()
    # The topic comes back from etcd's watched cache; until then: TOPIC_NOT_EXIST.
    eventually_sync(lambda: _topic_known(node.address), timeout_s=30, interval_s=0.2)
    # A handle from before the crash still acks its delivery: the journal kept it.
    assert asyncio.run(ack(node.address, [first[10].receipt_handle])) == [sn.POP_ACK_STATUS_OK]
    asyncio.run(send(node.address, 1, first=20))
    seen: list[sn.PoppedMessage] = []
    while len(seen) < 10:
        got = asyncio.run(pop(node.address, 32, poll_ms=INVISIBLE_MS * 2))
        assert got, "nothing delivered within twice the invisible time"
        seen += got
    assert sorted(m.queue_offset for m in seen) == list(range(11, 21))
    attempts = {m.queue_offset: m.delivery_attempt for m in seen}
    assert attempts == {**{o: 2 for o in range(11, 20)}, 20: 1}
    statuses = asyncio.run(ack(node.address, [m.receipt_handle for m in seen]))
    assert statuses == [sn.POP_ACK_STATUS_OK] * 10
    assert asyncio.run(pop(node.address, 32, poll_ms=INVISIBLE_MS + 500)) == []
    assert node.stop(signal.SIGTERM) == 0


def _topic_known(address: str) -> bool:
    try:
        asyncio.run(ack(address, []))  # no pop: that would redeliver
    except grpc.aio.AioRpcError as e:
        assert e.code() == grpc.StatusCode.NOT_FOUND, e
        return False
    return True
