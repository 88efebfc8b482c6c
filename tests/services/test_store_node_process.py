"""A store-node as a real process with a real etcd: registration, kill -9, restart."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from basalt.services.cluster.etcd import EtcdProcess, free_port
from basalt.services.meta import MetaClient, MetaConfig
from basalt.store.get_message import split_records

from basalt.common.record import decode_record
from basalt.v1 import common_pb2 as pb
from basalt.v1 import store_node_pb2 as sn
from basalt.v1 import store_node_pb2_grpc as sn_grpc
from tests.services.conftest import unique_cluster

pytestmark = pytest.mark.slow


class NodeProcess:
    """``python -m basalt.services.store_node.main`` in a child process."""

    def __init__(self, data_dir: Path, etcd: EtcdProcess, cluster: str) -> None:
        self.data_dir = data_dir
        self.port = free_port()
        self.args = [
            sys.executable,
            "-m",
            "basalt.services.store_node.main",
            "--name",
            "broker-a",
            "--data-dir",
            str(data_dir),
            "--listen",
            f"127.0.0.1:{self.port}",
            "--etcd",
            etcd.endpoint,
            "--cluster",
            cluster,
            "--flush-disk-type",
            "SYNC_FLUSH",
            "--lease-ttl-s",
            "2",
        ]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            self.args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=os.getcwd()
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().decode()
        assert "serving on" in line, line

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self, sig: int = signal.SIGTERM) -> int:
        assert self.proc is not None
        self.proc.send_signal(sig)
        return self.proc.wait(timeout=30)


@pytest.fixture
def cluster() -> str:
    return unique_cluster()


@pytest.fixture
def node(tmp_path: Path, etcd: EtcdProcess, cluster: str) -> Iterator[NodeProcess]:
    n = NodeProcess(tmp_path / "broker-a", etcd, cluster)
    n.start()
    try:
        yield n
    finally:
        if n.proc is not None and n.proc.poll() is None:
            n.stop(signal.SIGKILL)


async def brokers(etcd: EtcdProcess, cluster: str) -> set[str]:
    async with MetaClient(MetaConfig(endpoints=(etcd.endpoint,), cluster=cluster)) as meta:
        return set(await meta.list_brokers())


async def send_all(address: str, count: int) -> list[int]:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = sn_grpc.StoreNodeStub(channel)
        offsets = []
        for i in range(count):
            r = await stub.SendMessage(
                sn.SendMessageRequest(message=pb.Message(topic="Durable", body=b"%d" % i))
            )
            offsets.append(r.result.queue_offsets[0])
        return offsets


async def pull_all(address: str) -> list[bytes]:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = sn_grpc.StoreNodeStub(channel)
        bodies: list[bytes] = []
        offset = 0
        while True:  # a pull returns at most 32 (max_transfer_count_on_message_in_memory)
            got = await stub.GetMessage(
                sn.GetMessageRequest(
                    group="G", topic="Durable", queue_id=0, offset=offset, max_msg_nums=1024
                )
            )
            bodies += [decode_record(r).body for r in split_records(got.records.data)]
            if got.next_begin_offset == offset:
                return bodies
            offset = got.next_begin_offset


def test_kill_9_under_sync_flush_then_restart_keeps_every_ack_and_re_registers(
    node: NodeProcess, etcd: EtcdProcess, cluster: str
) -> None:
    assert asyncio.run(brokers(etcd, cluster)) == {"broker-a"}
    acked = asyncio.run(send_all(node.address, 50))
    assert acked == list(range(50))
    node.stop(signal.SIGKILL)
    # The lease (2 s TTL) expires: the killed node disappears from etcd.
    deadline = time.monotonic() + 30  # generous: CI machines can be slow
    while asyncio.run(brokers(etcd, cluster)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert asyncio.run(brokers(etcd, cluster)) == set()
    assert (node.data_dir / "abort").exists()  # the crash left it
    node.start()
    assert asyncio.run(brokers(etcd, cluster)) == {"broker-a"} or _eventually(
        lambda: asyncio.run(brokers(etcd, cluster)) == {"broker-a"}, timeout_s=30
    )
    assert asyncio.run(pull_all(node.address)) == [b"%d" % i for i in range(50)]
    assert node.stop(signal.SIGTERM) == 0
    assert not (node.data_dir / "abort").exists()  # graceful stop: clean shutdown


def _eventually(check: object, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return True
        time.sleep(0.1)
    return False
