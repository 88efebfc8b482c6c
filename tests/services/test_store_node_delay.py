"""Delay levels through a store-node (a real grpc.aio server over a real store):
a delayed send is parked and delivered to its real queue when due; bad levels,
sends to SCHEDULE_TOPIC_XXXX and delayed record batches are refused with nothing
stored."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import grpc

from basalt.common.message import SCHEDULE_TOPIC, Message, MessageRecord
from basalt.common.record import EncodedMessage, decode_record, decode_records
from basalt.store.batch import EncodedBatch
from basalt.store.config import MessageStoreConfig
from basalt.v1 import common_pb2 as pb
from basalt.v1 import store_node_pb2 as sn
from tests.support.aio import run
from tests.support.nodes import NODE_TOPIC as TOPIC
from tests.support.nodes import node
from tests.support.polling import eventually
from tests.support.rpc import refused, wire
from tests.support.stores import node_store_config


def test_a_delayed_send_reaches_its_queue_after_its_delay(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with node(tmp_path) as (running, stub, _):
            started = time.time()
            sent = await stub.SendMessage(
                sn.SendMessageRequest(
                    message=wire(TOPIC, b"later", tags="TagA", keys=["k"], delay_level=1),
                    queue_id=3,
                )
            )
            assert sent.result.status == pb.SEND_STATUS_SEND_OK
            assert running.store.get_max_offset_in_queue(SCHEDULE_TOPIC, 0) == 1

            async def arrived() -> bool:
                got = await stub.GetMessage(
                    sn.GetMessageRequest(group="G", topic=TOPIC, queue_id=3, max_msg_nums=8)
                )
                return got.status == pb.GET_MESSAGE_STATUS_FOUND

            await eventually(arrived, timeout_s=15, what="the delayed message")
            got = await stub.GetMessage(
                sn.GetMessageRequest(group="G", topic=TOPIC, queue_id=3, max_msg_nums=8)
            )
            record = decode_record(got.records.data)
            assert (record.body, record.tags, record.keys) == (b"later", "TagA", ["k"])
            assert "DELAY" not in record.properties
            # Due one second after it was stored, on the store's own clock.
            assert record.store_timestamp_ms - sent.result.store_timestamp_ms >= 1000
            assert time.time() - started >= 1.0

    run(scenario)


#: 18 levels (RocketMQ's count) short enough for a test: 1 s and 2 s in turn.
EVERY_LEVEL = " ".join(("1s", "2s")[n % 2] for n in range(18))


def test_a_send_at_every_level_arrives_not_before_its_delay(tmp_path: Path) -> None:
    """One message per level (1..18) to one queue: each is parked in its level's
    queue of SCHEDULE_TOPIC_XXXX and re-put to the real queue no earlier than
    its level's delay after it was stored (store times, on the store's clock)."""
    delays_ms = [1000 if n % 2 == 0 else 2000 for n in range(18)]

    def config(root: Path) -> MessageStoreConfig:
        return dataclasses.replace(node_store_config(root), message_delay_level=EVERY_LEVEL)

    async def scenario() -> None:
        async with node(tmp_path, store_config=config) as (running, stub, _):
            stored: dict[bytes, int] = {}
            for level in range(1, 19):
                sent = await stub.SendMessage(
                    sn.SendMessageRequest(
                        message=wire(TOPIC, b"L%d" % level, delay_level=level), queue_id=2
                    )
                )
                assert sent.result.status == pb.SEND_STATUS_SEND_OK
                stored[b"L%d" % level] = sent.result.store_timestamp_ms
            for level in range(1, 19):
                assert running.store.get_max_offset_in_queue(SCHEDULE_TOPIC, level - 1) == 1

            async def delivered() -> list[MessageRecord]:
                got = await stub.GetMessage(
                    sn.GetMessageRequest(group="G", topic=TOPIC, queue_id=2, max_msg_nums=32)
                )
                return decode_records(got.records.data)

            async def all_arrived() -> bool:
                return len(await delivered()) == 18

            await eventually(all_arrived, timeout_s=30, what="every level's message")
            for record in await delivered():
                level = int(record.body[1:])
                assert record.store_timestamp_ms - stored[record.body] >= delays_ms[level - 1]
                assert "DELAY" not in record.properties

    run(scenario)


def test_bad_delays_and_system_topic_sends_are_refused_with_nothing_stored(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        async with node(tmp_path) as (running, stub, _):
            host = running.store.commitlog.store_host
            delayed_records = EncodedBatch.of_messages(
                [EncodedMessage(Message(TOPIC, b"e", properties={"DELAY": "2"}), store_host=host)]
            ).data
            before = running.store.max_physical_offset
            cases = [
                (
                    sn.SendMessageRequest(message=wire(TOPIC, b"x", delay_level=-1)),
                    pb.RESPONSE_CODE_INVALID_PARAMETER,
                    "1-18",
                ),
                (
                    sn.SendMessageRequest(message=wire(TOPIC, b"x", properties={"DELAY": "soon"})),
                    pb.RESPONSE_CODE_INVALID_PARAMETER,
                    "soon",
                ),
                (
                    sn.SendMessageRequest(message=wire(TOPIC, b"x", properties={"DELAY": "40"})),
                    pb.RESPONSE_CODE_INVALID_PARAMETER,
                    "0 (no delay) or 1-18",
                ),
                (
                    sn.SendMessageRequest(message=wire(SCHEDULE_TOPIC, b"x")),
                    pb.RESPONSE_CODE_NO_PERMISSION,
                    "system topic",
                ),
            ]
            for request, code, words in cases:
                _, got_code, details = await refused(stub.SendMessage(request))
                assert got_code == code, details
                assert words in details
            _, got_code, details = await refused(
                stub.SendBatch(
                    sn.SendBatchRequest(topic=TOPIC, queue_id=0, records=bytes(delayed_records))
                )
            )
            assert got_code == pb.RESPONSE_CODE_MESSAGE_ILLEGAL and "DELAY" in details
            assert running.store.max_physical_offset == before
            # A reader cannot see the schedule topic: it has no topic config.
            status, got_code, _ = await refused(
                stub.GetMessage(
                    sn.GetMessageRequest(group="G", topic=SCHEDULE_TOPIC, max_msg_nums=8)
                )
            )
            assert status == grpc.StatusCode.NOT_FOUND
            assert got_code == pb.RESPONSE_CODE_TOPIC_NOT_EXIST

    run(scenario)
