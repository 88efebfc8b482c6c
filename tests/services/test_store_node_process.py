"""A store-node as a real process with a real etcd: registration, kill -9, restart."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from basalt.common.record import decode_record, split_records
from basalt.services.cluster.etcd import EtcdProcess
from basalt.services.meta import MetaClient, MetaConfig
from basalt.v1 import common_pb2 as pb
from basalt.v1 import store_node_pb2 as sn
from basalt.v1 import store_node_pb2_grpc as sn_grpc
from tests.support.etcd import unique_cluster
from tests.support.polling import eventually_sync
from tests.support.processes import ServiceProcess, store_node_process

pytestmark = pytest.mark.slow


@pytest.fixture
def cluster() -> str:
    return unique_cluster()


@pytest.fixture
def node(tmp_path: Path, etcd: EtcdProcess, cluster: str) -> Iterator[ServiceProcess]:
    """``broker-a`` as a store-node process with its data in ``tmp_path / "broker-a"``."""
    n = store_node_process(
        tmp_path,
        "broker-a",
        "--etcd",
        etcd.endpoint,
        "--cluster",
        cluster,
        "--flush-disk-type",
        "SYNC_FLUSH",
        "--lease-ttl-s",
        "2",
    )
    try:
        n.wait_serving()
        yield n
    finally:
        if n.proc.poll() is None:
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
    node: ServiceProcess, etcd: EtcdProcess, cluster: str, tmp_path: Path
) -> None:
    data_dir = tmp_path / "broker-a"
    # The node registers in the background: it says it serves before etcd has it.
    eventually_sync(
        lambda: asyncio.run(brokers(etcd, cluster)) == {"broker-a"}, timeout_s=30, interval_s=0.1
    )
    acked = asyncio.run(send_all(node.address, 50))
    assert acked == list(range(50))
    node.stop(signal.SIGKILL)
    # The lease (2 s TTL) expires: the killed node disappears from etcd.
    eventually_sync(
        lambda: asyncio.run(brokers(etcd, cluster)) == set(), timeout_s=30, interval_s=0.2
    )
    assert (data_dir / "abort").exists()  # the crash left it
    node.start()
    node.wait_serving()
    # Generous: recovery on a loaded 2-core machine took longer than 10 s.
    eventually_sync(
        lambda: asyncio.run(brokers(etcd, cluster)) == {"broker-a"}, timeout_s=30, interval_s=0.1
    )
    assert asyncio.run(pull_all(node.address)) == [b"%d" % i for i in range(50)]
    assert node.stop(signal.SIGTERM) == 0
    assert not (data_dir / "abort").exists()  # graceful stop: clean shutdown


def test_a_node_set_up_by_file_and_env_registers_its_client_address(
    tmp_path: Path, etcd: EtcdProcess, cluster: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = tmp_path / "broker.conf"
    conf.write_text(
        f"brokerClusterName={cluster}\nbrokerId=0\nnamesrvAddr={etcd.endpoint}\n"
        f"etcd={etcd.endpoint}\nstorePathRootDir={tmp_path / 'broker-b'}\n"
    )
    monkeypatch.setenv("BASALT_CLIENT_ADDRESS", "broker-b.example.com:30911")
    n = ServiceProcess(
        tmp_path / "broker-b.log",
        "basalt.services.store_node.main",
        "--name",
        "broker-b",
        "--config",
        str(conf),
    )
    try:
        n.wait_serving()

        async def registered() -> tuple[str, str] | None:
            async with MetaClient(MetaConfig(endpoints=(etcd.endpoint,), cluster=cluster)) as m:
                b = (await m.list_brokers()).get("broker-b")
                return None if b is None else (b.address, b.client_address)

        # The cluster came from the file, the client address from the env.
        eventually_sync(
            lambda: asyncio.run(registered()) == (n.address, "broker-b.example.com:30911"),
            what="broker-b registered with its client address",
        )
        assert (tmp_path / "broker-b" / "checkpoint").exists()
    finally:
        n.stop(signal.SIGTERM if n.proc.poll() is None else signal.SIGKILL)
    log = n.log.read_text()
    assert "namesrvAddr" in log and "is ignored" in log and "brokerId" not in log
