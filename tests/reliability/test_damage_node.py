"""Issue 28's damage on a real store-node process, as it was reported.

A store-node (no etcd: a topic exists once a send created it, so after each
restart a send to queue 1 comes first) takes sends, is stopped with SIGTERM,
has its root damaged while stopped, and is started again on the same root and
port:

* its ``consumequeue/<topic>/<queue>/`` deleted: the node served, the
  queue's messages were unreachable and the next send got queue offset 0;
  now every message reads back and the next send continues;
* its CommitLog deleted: every queue restarted at offset 0; now the messages
  are gone but their offsets stay taken;
* a ConsumeQueue file written past its configured size: the node refused to
  start; now the file is set aside in ``quarantine/`` and the queue rebuilt;
* its pop journal folder replaced by a file: the node exited 2; now it
  serves, the folder is in ``quarantine/`` and the messages that were in
  flight are delivered again.

The same damage at the store's level, with every other record checked, is
tests/reliability/test_damage.py's catalogue.
"""

from __future__ import annotations

import asyncio
import shutil
import signal
from pathlib import Path

import grpc
import pytest

from basalt.common.record import decode_record
from basalt.store.get_message import split_records
from basalt.v1 import common_pb2 as pb
from basalt.v1 import store_node_pb2 as sn
from basalt.v1 import store_node_pb2_grpc as sn_grpc
from tests.support.processes import ServiceProcess, store_node_process

TOPIC = "Damaged"
COUNT = 120
GROUP = "pop-g"


@pytest.fixture
def node(tmp_path: Path, processes: list[ServiceProcess]) -> ServiceProcess:
    """``broker-a`` with its data in ``tmp_path / "broker-a"``, serving."""
    n = store_node_process(tmp_path)
    processes.append(n)
    n.wait_serving()
    return n


async def send(address: str, count: int, queue_id: int = 0) -> list[int]:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = sn_grpc.StoreNodeStub(channel)
        offsets = []
        for i in range(count):
            r = await stub.SendMessage(
                sn.SendMessageRequest(
                    message=pb.Message(topic=TOPIC, body=b"m%d" % i), queue_id=queue_id
                )
            )
            offsets.append(r.result.queue_offsets[0])
        return offsets


async def read_all(address: str, queue_id: int = 0) -> tuple[list[bytes], int]:
    """Every body a consumer reading the queue from 0 gets, and where it ends."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = sn_grpc.StoreNodeStub(channel)
        bodies: list[bytes] = []
        offset = 0
        while True:
            got = await stub.GetMessage(
                sn.GetMessageRequest(
                    group="G", topic=TOPIC, queue_id=queue_id, offset=offset, max_msg_nums=1024
                )
            )
            bodies += [decode_record(r).body for r in split_records(got.records.data)]
            if got.next_begin_offset == offset:
                return bodies, offset
            offset = got.next_begin_offset


async def pop(address: str, max_messages: int) -> list[sn.PoppedMessage]:
    async with grpc.aio.insecure_channel(address) as channel:
        got = await sn_grpc.StoreNodeStub(channel).PopMessages(
            sn.PopMessagesRequest(
                group=GROUP, topic=TOPIC, queue_ids=[0], max_messages=max_messages,
                invisible_duration_ms=3_600_000,
            )
        )  # fmt: skip
        return list(got.messages)


async def ack(address: str, handles: list[str]) -> None:
    async with grpc.aio.insecure_channel(address) as channel:
        got = await sn_grpc.StoreNodeStub(channel).AckMessages(
            sn.AckMessagesRequest(group=GROUP, topic=TOPIC, receipt_handles=handles)
        )
        assert [r.status for r in got.results] == [sn.POP_ACK_STATUS_OK] * len(handles)


def stop_damage_start(node: ServiceProcess, tmp_path: Path, damage: str) -> str:
    """A clean stop, ``damage`` to the stopped root, a start on the same root and
    port; returns what the node logged from that start on."""
    root = tmp_path / "broker-a"
    assert node.stop(signal.SIGTERM) == 0
    log_before = node.log.stat().st_size
    if damage == "queue-directory":
        shutil.rmtree(root / "consumequeue" / TOPIC / "0")
    elif damage == "commitlog":
        shutil.rmtree(root / "commitlog")
    elif damage == "cq-past-its-size":
        (first, *_) = sorted((root / "consumequeue" / TOPIC / "0").iterdir())
        with open(first, "ab") as f:
            f.write(b"\0" * 4096)  # written past the configured size
    elif damage == "pop-folder":
        shutil.rmtree(root / "pop")
        (root / "pop").write_bytes(b"a file where the pop journal's folder was")
    node.start()
    node.wait_serving()
    assert node.proc.poll() is None
    return node.log.read_bytes()[log_before:].decode(errors="replace")


def test_a_lost_queue_directory_is_rebuilt(node: ServiceProcess, tmp_path: Path) -> None:
    assert asyncio.run(send(node.address, COUNT)) == list(range(COUNT))
    asyncio.run(send(node.address, 10, queue_id=1))

    logged = stop_damage_start(node, tmp_path, "queue-directory")

    assert f"consumequeue {TOPIC}/0 rebuilt from the commitlog: its directory is missing" in logged
    assert asyncio.run(send(node.address, 1, queue_id=1)) == [10]
    bodies, end = asyncio.run(read_all(node.address))
    assert (bodies, end) == ([b"m%d" % i for i in range(COUNT)], COUNT)
    assert asyncio.run(send(node.address, 1)) == [COUNT]
    assert node.stop(signal.SIGTERM) == 0


def test_a_consume_queue_file_past_its_size_is_set_aside_and_rebuilt(
    node: ServiceProcess, tmp_path: Path
) -> None:
    assert asyncio.run(send(node.address, COUNT)) == list(range(COUNT))
    asyncio.run(send(node.address, 10, queue_id=1))

    logged = stop_damage_start(node, tmp_path, "cq-past-its-size")

    assert "longer than" in logged and "set aside as" in logged, logged
    quarantined = list((tmp_path / "broker-a" / "quarantine").glob(f"consumequeue-{TOPIC}-0-*"))
    assert len(quarantined) == 1
    assert asyncio.run(send(node.address, 1, queue_id=1)) == [10]
    bodies, end = asyncio.run(read_all(node.address))
    assert (bodies, end) == ([b"m%d" % i for i in range(COUNT)], COUNT)
    assert asyncio.run(send(node.address, 1)) == [COUNT]
    assert node.stop(signal.SIGTERM) == 0


def test_a_lost_commitlog_keeps_every_queue_offset(node: ServiceProcess, tmp_path: Path) -> None:
    assert asyncio.run(send(node.address, COUNT)) == list(range(COUNT))
    assert asyncio.run(send(node.address, 10, queue_id=1)) == list(range(10))

    logged = stop_damage_start(node, tmp_path, "commitlog")

    assert "commitlog MISSING" in logged and "queues destroyed 0" in logged
    assert asyncio.run(send(node.address, 1, queue_id=1)) == [10]
    # The records are gone; a consumer reading from 0 is moved on to the end.
    assert asyncio.run(read_all(node.address)) == ([], COUNT)
    assert asyncio.run(send(node.address, 1)) == [COUNT]
    assert node.stop(signal.SIGTERM) == 0


def test_a_pop_folder_replaced_by_a_file_is_set_aside(node: ServiceProcess, tmp_path: Path) -> None:
    asyncio.run(send(node.address, 12))
    popped = asyncio.run(pop(node.address, 8))
    assert [m.queue_offset for m in popped] == list(range(8))
    asyncio.run(ack(node.address, [m.receipt_handle for m in popped[:3]]))

    logged = stop_damage_start(node, tmp_path, "pop-folder")

    assert "is not a folder: set aside as" in logged
    assert (tmp_path / "broker-a" / "quarantine" / "pop-folder").is_file()
    asyncio.run(send(node.address, 1, queue_id=1))
    # The pop state started empty: from the committed offset (3), the messages that
    # were in flight come again (as a first delivery), then the rest.
    again = asyncio.run(pop(node.address, 32))
    assert [(m.queue_offset, m.delivery_attempt) for m in again] == [(o, 1) for o in range(3, 12)]
    assert node.stop(signal.SIGTERM) == 0
