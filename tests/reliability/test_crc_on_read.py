"""Issue 28 point 1: a corrupt body never reaches a consumer.

A store whose CommitLog has one flipped body byte in a file older than the
last three a clean start scans (so the start does not see it) serves a real
store-node, a pull-service and the RocketMQ 5 front in this process, on a real
etcd. Every reader of the queue (the SDK's LitePullConsumer and PushConsumer,
the pull-service's decoded Pull and PullBatch, the front's ReceiveMessage and
PullMessage, the Spark source's read, ``basalt pipeline export``) never yields
the damaged record, reports its offset, and delivers every other record.
"""

from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import replace
from pathlib import Path

import grpc
import pytest

from basalt.client import (
    ConsumeStatus,
    LitePullConsumer,
    MessageQueue,
    PushConsumer,
    PushConsumerConfig,
)
from basalt.client.consumer_base import ConsumeFromWhere
from basalt.common.message import MessageRecord
from basalt.common.record import DamagedRecord
from basalt.rocketmq.v2 import definition_pb2 as v2
from basalt.rocketmq.v2 import service_pb2 as sv
from basalt.rocketmq.v2 import service_pb2_grpc as sv_grpc
from basalt.services.meta import MetaConfig, TopicConfig
from basalt.store import Message, MessageStore, MessageStoreConfig
from basalt.v1 import pull_service_pb2 as ps
from tests.support.aio import async_test
from tests.support.consumers import lite_pull_config
from tests.support.nodes import cluster
from tests.support.polling import eventually
from tests.support.stores import node_store_config

TOPIC = "Crc"
COUNT = 160
COMMITLOG_FILE = 16 * 1024


def store_config(root: Path) -> MessageStoreConfig:
    """The node's store: small CommitLog files, so the queue spans several."""
    return replace(node_store_config(root), mapped_file_size_commit_log=COMMITLOG_FILE)


def body(i: int) -> bytes:
    return b"body-%04d|" % i + bytes([65 + i % 26]) * 200


def damaged_root(root: Path) -> int:
    """Write COUNT records to queue 0 of TOPIC at ``root``, stop cleanly, flip one
    body byte of a record in the first CommitLog file (older than the last three
    a clean start scans); returns that record's queue offset."""
    with MessageStore(store_config(root)) as store:
        offsets = [
            store.put_message(Message(TOPIC, body(i))).physical_offsets[0] for i in range(COUNT)
        ]
        assert store.wait_dispatched()
    files = sorted((root / "commitlog").iterdir())
    assert len(files) >= 4, files  # the first is outside the last three
    victim = random.Random(28).randrange(5, len([o for o in offsets if o < COMMITLOG_FILE]))
    data = bytearray(files[0].read_bytes())
    at = data.index(body(victim)) + 50
    data[at] ^= 0x01
    files[0].write_bytes(bytes(data))
    return victim


EXPECTED = {body(i) for i in range(COUNT)}


@pytest.fixture
def damaged(tmp_path: Path) -> int:
    return damaged_root(tmp_path / "broker-a")


def reported(caplog: pytest.LogCaptureFixture, offset: int) -> bool:
    return any(
        r.levelno == logging.ERROR and f"queue 0 offset {offset} " in r.getMessage()
        for r in caplog.records
    )


@async_test(timeout_s=120)
async def test_no_reader_yields_the_damaged_body(
    tmp_path: Path, meta_config: MetaConfig, damaged: int, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR)
    wanted = EXPECTED - {body(damaged)}
    topic = TopicConfig(
        topic_name=TOPIC, read_queue_nums=1, write_queue_nums=1, brokers=("broker-a",)
    )
    async with cluster(
        tmp_path, meta_config, brokers=("broker-a",), topic=topic,
        store_config=store_config, rocketmq_v2_listen="127.0.0.1:0",
    ) as h:  # fmt: skip
        address = h.services[0].address
        queue = MessageQueue(TOPIC, "broker-a", 0)

        # The SDK's LitePullConsumer: every other body, the damaged one reported.
        seen: list[tuple[MessageQueue, DamagedRecord]] = []
        async with LitePullConsumer(address, config=lite_pull_config("LG")) as lite:
            lite.on_damaged_record = lambda q, d: seen.append((q, d))
            await lite.assign([queue])
            got: list[bytes] = []
            while polled := await lite.poll(timeout_ms=300):
                got += [r.body for r in polled]
            assert sorted(got) == sorted(wanted)
            assert lite.damaged_records == 1
            assert [(q, d.queue_offset, d.reason) for q, d in seen] == [
                (queue, damaged, "body CRC mismatch")
            ]
        assert reported(caplog, damaged)
        caplog.clear()

        # The PushConsumer: its listener never sees it, and the group's offset
        # passes it (nothing waits on it).
        heard: list[bytes] = []

        def listen(messages: list[MessageRecord], q: MessageQueue) -> ConsumeStatus:
            heard.extend(m.body for m in messages)
            return ConsumeStatus.CONSUME_SUCCESS

        push = PushConsumer(
            address,
            config=PushConsumerConfig(
                consumer_group="PG",
                consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
                broker_suspend_max_time_ms=200,
            ),
            listener=listen,
        )
        push.subscribe(TOPIC)
        async with push:
            await eventually(lambda: len(heard) >= len(wanted))
            await eventually(lambda: push.damaged_records == 1)
        assert sorted(heard) == sorted(wanted)
        assert reported(caplog, damaged)
        caplog.clear()

        # The pull-service's decoded Pull and PullBatch.
        bodies: list[bytes] = []
        offset = 0
        while offset < COUNT:
            answer = await h.stub.Pull(
                ps.PullRequest(
                    group="PullG", queue=queue.to_proto(), offset=offset, max_nums=32, decode=True
                )
            )
            bodies += [m.body for m in answer.messages]
            offset = answer.next_begin_offset
        assert sorted(bodies) == sorted(wanted)
        batch = await h.stub.PullBatch(
            ps.PullBatchRequest(
                group="PullG",
                pulls=[ps.PullRequest(queue=queue.to_proto(), offset=damaged, max_nums=3)],
                decode=True,
            )
        )
        [entry] = batch.results
        assert [m.queue_offset for m in entry.messages] == [damaged + 1, damaged + 2]
        assert reported(caplog, damaged)
        caplog.clear()

        # The RocketMQ 5 front: PullMessage by offset, then ReceiveMessage (pop).
        async with grpc.aio.insecure_channel(h.services[0].rocketmq_v2_address) as channel:
            stub = sv_grpc.MessagingServiceStub(channel)
            pulled: list[bytes] = []
            async for r in stub.PullMessage(
                sv.PullMessageRequest(
                    group=v2.Resource(name="V2Pull"),
                    message_queue=v2.MessageQueue(
                        topic=v2.Resource(name=TOPIC), id=0, broker=v2.Broker(name="broker-a")
                    ),
                    offset=damaged - 2,
                    batch_size=5,
                ),
                timeout=10,
            ):
                if r.WhichOneof("content") == "message":
                    pulled.append(r.message.body)
            assert pulled == [body(i) for i in (damaged - 2, damaged - 1, damaged + 1, damaged + 2)]
            assert reported(caplog, damaged)
            caplog.clear()

            received: list[bytes] = []
            for _ in range(40):
                async for r in stub.ReceiveMessage(
                    sv.ReceiveMessageRequest(
                        group=v2.Resource(name="V2Pop"),
                        message_queue=v2.MessageQueue(topic=v2.Resource(name=TOPIC)),
                        batch_size=32,
                        invisible_duration={"seconds": 60},
                    ),
                    timeout=10,
                ):
                    if r.WhichOneof("content") == "message":
                        received.append(r.message.body)
                if len(received) >= len(wanted):
                    break
            assert sorted(received) == sorted(wanted)
            assert reported(caplog, damaged)

        # The Spark source's read of the queue (the executor's code, no JVM).
        from basalt.pipeline.source import BasaltPartition, SourceOptions, _read

        caplog.clear()
        options = SourceOptions.parse({"endpoint": address, "topic": TOPIC})
        part = BasaltPartition(TOPIC, "broker-a", 0, 0, COUNT)
        batches = await asyncio.to_thread(lambda: list(_read(options, part)))
        rows = [b for batch in batches for b in batch.column("body").to_pylist()]
        assert sorted(rows) == sorted(wanted)
        assert reported(caplog, damaged)


def test_export_leaves_the_damaged_record_out_and_reports_it(
    tmp_path: Path, damaged: int, caplog: pytest.LogCaptureFixture
) -> None:
    from basalt.pipeline._store_read import FileScan, commitlog_files, export_batches

    root = tmp_path / "broker-a"
    scan = FileScan()
    rows: list[bytes] = []
    for spec in commitlog_files(root):
        for batch in export_batches(spec, scan, broker="broker-a"):
            rows += batch.column("body").to_pylist()
    assert sorted(rows) == sorted(EXPECTED - {body(damaged)})
    assert scan.bad_records == 1 and scan.first_bad_reason == "body CRC mismatch"
