"""The store's own puts in a broker group (MessageStore.put_internal answered by
GroupMember with notify_appended): a delivered timer or delayed message is
confirmed - readable by consumers - as soon as it is written (and, under SYNC,
once the in-sync slave has it), not at the master's next heartbeat or the
next client send."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from basalt.common.record import decode_record, split_records
from basalt.services.cluster.etcd import EtcdProcess
from basalt.v1 import common_pb2 as pb
from basalt.v1 import store_node_pb2 as sn
from tests.support.aio import async_test
from tests.support.etcd import unique_cluster
from tests.support.groups import TOPIC, ReplicaGroup, commitlog_bytes, ha_flags
from tests.support.polling import eventually

#: So long that no heartbeat comes during a test: only the sends and the
#: store's own puts move the confirm offset.
NO_HEARTBEAT = ("--ha-heartbeat-interval-ms", "600000")


def now_ms() -> int:
    return int(time.time() * 1000)


@pytest.mark.slow
@async_test(timeout_s=120)
async def test_a_delivered_timer_and_delayed_message_need_no_heartbeat_nor_send(
    tmp_path: Path, etcd: EtcdProcess
) -> None:
    async with ReplicaGroup(
        tmp_path,
        etcd.endpoint,
        unique_cluster(),
        replicas=1,
        flags=(*ha_flags(min_in_sync=1), *NO_HEARTBEAT),
    ) as group:
        await eventually(group.master_ready, timeout_s=30, what="the master")
        stub = group.stub(0)
        due = now_ms() + 1500
        for message, queue_id in (
            (pb.Message(topic=TOPIC, body=b"timer", deliver_time_ms=due), 0),
            (pb.Message(topic=TOPIC, body=b"delayed", delay_level=1), 1),
        ):
            sent = await stub.SendMessage(sn.SendMessageRequest(message=message, queue_id=queue_id))
            assert sent.result.status == pb.SEND_STATUS_SEND_OK
        # From here on no client sends: the delivered copies are the store's own puts.

        async def delivered() -> bool:
            bodies = [b for q in (0, 1) for _, b in await group.read_queue(0, q)]
            return b"timer" in bodies and b"delayed" in bodies

        await eventually(delivered, timeout_s=30, what="both copies readable")
        assert now_ms() >= due


@pytest.mark.slow
@async_test(timeout_s=180)
async def test_under_sync_a_delivered_copy_is_readable_only_once_the_slave_has_it(
    tmp_path: Path, etcd: EtcdProcess
) -> None:
    async with ReplicaGroup(
        tmp_path, etcd.endpoint, unique_cluster(), replicas=2, flags=ha_flags(min_in_sync=2)
    ) as group:
        await eventually(lambda: group.in_sync({0, 1}), timeout_s=60, what="both in sync")
        master = (await group.state()).master_id
        slave = 1 - master
        due = now_ms() + 1000
        sent = await group.stub(master).SendMessage(
            sn.SendMessageRequest(
                message=pb.Message(topic=TOPIC, body=b"copy", deliver_time_ms=due), queue_id=0
            )
        )
        assert sent.result.status == pb.SEND_STATUS_SEND_OK

        async def readable() -> bytes | None:
            got = await group.stub(master).GetMessage(
                sn.GetMessageRequest(group="G", topic=TOPIC, queue_id=0, max_msg_nums=8)
            )
            raws = list(split_records(got.records.data))
            return bytes(raws[0]) if raws else None

        await eventually(readable, timeout_s=30, what="the delivered copy on the master")
        raw = await readable()
        assert raw is not None
        # Readable at the master: the confirm offset passed it, so the in-sync
        # slave had it (its ack) - its CommitLog holds the same bytes now.
        record = decode_record(raw)
        assert record.body == b"copy"
        phy = record.commit_log_offset
        on_slave = commitlog_bytes(group.members[slave].commitlog())
        assert on_slave[phy : phy + len(raw)] == raw
