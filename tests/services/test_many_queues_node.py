"""20,000 queues on one store-node (issue 15): a message in each through gRPC,
then the node's descriptors and memory stay within a per-queue budget, every
queue reads back, and a restart comes up with all of them.

The node runs in this process (``start_store_node``, a real gRPC server on
port 0) over RocketMQ's default ConsumeQueue file size, so what is measured is
the file layer a production node has: a queue holding one message costs one
4 KiB block and no mapping, and ConsumeQueue descriptors are bounded by
``max_open_consume_queue_files``, not by the number of queues.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TypeVar

import grpc
import pytest

from basalt.services.meta import TopicConfig
from basalt.services.store_node.server import RunningStoreNode, start_store_node
from basalt.services.store_node.service import StoreNodeConfig
from basalt.services.store_node.topics import LocalTopics
from basalt.store import MessageStoreConfig
from basalt.store.config import CQ_STORE_UNIT_SIZE, DEFAULT_CQ_UNITS_PER_FILE
from basalt.v1 import common_pb2 as pb
from basalt.v1 import store_node_pb2 as sn
from basalt.v1 import store_node_pb2_grpc as sn_grpc
from tests.support.aio import run
from tests.support.resources import open_fds, rss_bytes
from tests.support.rpc import wire
from tests.support.stores import small_store_config

pytestmark = pytest.mark.slow

TOPICS = 5_000
QUEUES_PER_TOPIC = 4
QUEUES = TOPICS * QUEUES_PER_TOPIC
MAX_OPEN = 256
#: Descriptors besides the ConsumeQueues': the CommitLog, index, lock, checkpoint,
#: gRPC's sockets and epoll, directory fsyncs.
FD_SLACK = 64
PER_QUEUE_BUDGET = 64 * 1024
#: RPCs in flight at once.
WIDTH = 200

T = TypeVar("T")


def topics() -> LocalTopics:
    directory = LocalTopics()
    for t in range(TOPICS):
        directory.put(
            TopicConfig(
                topic_name=f"T{t}",
                read_queue_nums=QUEUES_PER_TOPIC,
                write_queue_nums=QUEUES_PER_TOPIC,
                brokers=("broker-a",),
            )
        )
    return directory


def store_config(root: Path) -> MessageStoreConfig:
    return small_store_config(
        root,
        mapped_file_size_consume_queue=DEFAULT_CQ_UNITS_PER_FILE * CQ_STORE_UNIT_SIZE,
        mapped_file_size_commit_log=16 << 20,
        max_open_consume_queue_files=MAX_OPEN,
    )


def queues() -> list[tuple[str, int]]:
    return [(f"T{t}", q) for t in range(TOPICS) for q in range(QUEUES_PER_TOPIC)]


async def in_waves(calls: Sequence[Callable[[], Awaitable[T]]]) -> list[T]:
    """Run the calls WIDTH at a time, in order; their results."""
    out: list[T] = []
    for start in range(0, len(calls), WIDTH):
        out += await asyncio.gather(*(call() for call in calls[start : start + WIDTH]))
    return out


async def read_all(stub: sn_grpc.StoreNodeStub) -> list[int]:
    """How many records each queue gives from offset 0."""

    def read(topic: str, qid: int) -> Callable[[], Awaitable[int]]:
        async def call() -> int:
            got = await stub.GetMessage(
                sn.GetMessageRequest(group="g", topic=topic, queue_id=qid, offset=0, max_msg_nums=4)
            )
            return int(got.records.count)

        return call

    return await in_waves([read(topic, qid) for topic, qid in queues()])


async def started(root: Path, directory: LocalTopics) -> RunningStoreNode:
    return await start_store_node(
        StoreNodeConfig(broker_name="broker-a"), store_config(root), directory
    )


def test_twenty_thousand_queues_on_one_store_node(tmp_path: Path) -> None:
    root = tmp_path / "store"
    directory = topics()

    async def scenario() -> None:
        fds_before, rss_before = open_fds(), rss_bytes()
        running = await started(root, directory)
        channel = grpc.aio.insecure_channel(running.address)
        stub = sn_grpc.StoreNodeStub(channel)
        try:

            def send(topic: str, qid: int) -> Callable[[], Awaitable[int]]:
                async def call() -> int:
                    reply = await stub.SendMessage(
                        sn.SendMessageRequest(message=wire(topic, b"m"), queue_id=qid)
                    )
                    return int(reply.result.status)

                return call

            statuses = await in_waves([send(topic, qid) for topic, qid in queues()])
            assert set(statuses) == {pb.SEND_STATUS_SEND_OK}
            assert await asyncio.to_thread(running.store.wait_dispatched)
            assert open_fds() - fds_before <= MAX_OPEN + FD_SLACK
            grown = rss_bytes() - rss_before
            assert grown / QUEUES <= PER_QUEUE_BUDGET, f"{grown / QUEUES:.0f} B of RSS a queue"
            assert await read_all(stub) == [1] * QUEUES
        finally:
            await channel.close()
            assert await running.stop(grace_s=1)

        blocks = [p.stat().st_blocks * 512 for p in (root / "consumequeue").glob("*/*/*")]
        assert len(blocks) == QUEUES
        assert max(blocks) <= PER_QUEUE_BUDGET

        fds_before = open_fds()
        running = await started(root, directory)
        channel = grpc.aio.insecure_channel(running.address)
        try:
            assert open_fds() - fds_before <= MAX_OPEN + FD_SLACK
            assert await read_all(sn_grpc.StoreNodeStub(channel)) == [1] * QUEUES
            assert open_fds() - fds_before <= MAX_OPEN + FD_SLACK
        finally:
            await channel.close()
            assert await running.stop(grace_s=1)

    run(scenario)
