"""Timers through a store-node: a timer send is parked and delivered not before
its time with a recall handle in its SendResult; RecallMessage cancels it;
GetScheduleStatus shows it; bad input is refused with nothing stored; and
100,000 pending timers survive a kill -9 of a store-node process."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import grpc
import pytest

from basalt.common.message import (
    PROPERTY_TIMER_DELIVER_MS,
    PROPERTY_UNIQ_KEY,
    TIMER_TOPIC,
    Message,
)
from basalt.common.recall import RecallHandle
from basalt.common.record import EncodedMessage, decode_record, split_records
from basalt.services.cluster.etcd import EtcdProcess
from basalt.store import MessageStore, MessageStoreConfig
from basalt.store.batch import EncodedBatch
from basalt.v1 import common_pb2 as pb
from basalt.v1 import store_node_pb2 as sn
from basalt.v1 import store_node_pb2_grpc as sn_grpc
from tests.support.aio import async_test, run
from tests.support.etcd import unique_cluster
from tests.support.groups import TOPIC as GROUP_TOPIC
from tests.support.groups import ReplicaGroup, ha_flags
from tests.support.nodes import NODE_TOPIC as TOPIC
from tests.support.nodes import node
from tests.support.polling import eventually, eventually_sync
from tests.support.processes import store_node_process
from tests.support.rpc import refused, wire


def now_ms() -> int:
    return int(time.time() * 1000)


async def pull(stub: sn_grpc.StoreNodeStub, queue_id: int) -> list[object]:
    got = await stub.GetMessage(
        sn.GetMessageRequest(group="G", topic=TOPIC, queue_id=queue_id, max_msg_nums=32)
    )
    return [decode_record(r) for r in split_records(got.records.data)]


def test_a_timer_send_is_delivered_not_before_its_time_with_a_recall_handle(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        async with node(tmp_path) as (running, stub, _):
            due = now_ms() + 1500
            sent = await stub.SendMessage(
                sn.SendMessageRequest(
                    message=wire(TOPIC, b"later", tags="TagA", keys=["k"], deliver_time_ms=due),
                    queue_id=2,
                )
            )
            assert sent.result.status == pb.SEND_STATUS_SEND_OK
            [handle] = sent.result.recall_handles
            h = RecallHandle.decode(handle)
            assert (h.topic, h.broker_name, h.deliver_time_ms) == (TOPIC, "broker-a", due)
            assert running.store.get_max_offset_in_queue(TIMER_TOPIC, 0) == 1
            status = await stub.GetScheduleStatus(
                sn.GetScheduleStatusRequest(topic=TOPIC, max_next_due=5)
            )
            assert status.timer_pending in (0, 1)  # 0 while not yet filed

            async def filed() -> bool:
                s = await stub.GetScheduleStatus(sn.GetScheduleStatusRequest(max_next_due=5))
                return s.timer_pending == 1 and [t.topic for t in s.timer_topics] == [TOPIC]

            await eventually(filed, timeout_s=5, what="the timer filed")
            s = await stub.GetScheduleStatus(sn.GetScheduleStatusRequest(max_next_due=5))
            assert list(s.timer_topics[0].next_due_ms) == [due]
            assert len(s.levels) == 18 and s.levels[0].delay_ms == 1000

            async def arrived() -> bool:
                return bool(await pull(stub, 2))

            await eventually(arrived, timeout_s=15, what="the timer message")
            [record] = await pull(stub, 2)
            assert (record.body, record.tags, record.keys) == (b"later", "TagA", ["k"])  # type: ignore[attr-defined]
            assert record.uniq_key == h.message_id  # type: ignore[attr-defined]
            assert record.store_timestamp_ms >= due  # type: ignore[attr-defined]
            assert now_ms() >= due
            # Delivered: too late to recall.
            _, code, details = await refused(
                stub.RecallMessage(sn.RecallMessageRequest(topic=TOPIC, recall_handle=handle))
            )
            assert code == pb.RESPONSE_CODE_QUERY_NOT_FOUND and "already delivered" in details

    run(scenario)


def test_recall_cancels_one_timer_and_the_other_is_delivered(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with node(tmp_path) as (_, stub, _):
            due = now_ms() + 2500
            handles = []
            for body in (b"keep", b"drop"):
                sent = await stub.SendMessage(
                    sn.SendMessageRequest(
                        message=wire(TOPIC, body, properties={PROPERTY_TIMER_DELIVER_MS: str(due)}),
                        queue_id=1,
                    )
                )
                handles.append(sent.result.recall_handles[0])
            answer = await stub.RecallMessage(
                sn.RecallMessageRequest(topic=TOPIC, recall_handle=handles[1])
            )
            assert answer.message_id == RecallHandle.decode(handles[1]).message_id

            async def arrived() -> bool:
                return bool(await pull(stub, 1))

            await eventually(arrived, timeout_s=15, what="the kept timer")
            await asyncio.sleep(0.5)  # the same slot: the recalled one would be there now
            assert [r.body for r in await pull(stub, 1)] == [b"keep"]  # type: ignore[attr-defined]

    run(scenario)


def test_bad_timers_and_bad_recalls_are_refused_with_nothing_stored(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with node(tmp_path) as (running, stub, _):
            host = running.store.commitlog.store_host
            timer_records = EncodedBatch.of_messages(
                [
                    EncodedMessage(
                        Message(TOPIC, b"e", properties={"TIMER_DELAY_SEC": "5"}), store_host=host
                    )
                ]
            ).data
            max_ms = running.store.config.timer_max_delay_sec * 1000
            before = running.store.max_physical_offset
            cases = [
                (
                    wire(TOPIC, b"x", deliver_time_ms=now_ms() + max_ms + 60_000),
                    "timer_max_delay_sec",
                ),
                (
                    wire(TOPIC, b"x", properties={"TIMER_DELAY_SEC": "604900"}),
                    "timer_max_delay_sec",
                ),
                (wire(TOPIC, b"x", properties={"TIMER_DELAY_SEC": "soon"}), "not an integer"),
                (
                    wire(TOPIC, b"x", deliver_time_ms=now_ms() + 5000, delay_level=2),
                    "one or the other",
                ),
                (wire(TOPIC, b"x", deliver_time_ms=-5), "not a time"),
            ]
            for message, words in cases:
                _, code, details = await refused(
                    stub.SendMessage(sn.SendMessageRequest(message=message))
                )
                assert code == pb.RESPONSE_CODE_INVALID_PARAMETER, details
                assert words in details
            _, code, details = await refused(
                stub.SendMessage(sn.SendMessageRequest(message=wire(TIMER_TOPIC, b"x")))
            )
            assert code == pb.RESPONSE_CODE_NO_PERMISSION and "system topic" in details
            _, code, details = await refused(
                stub.SendBatch(
                    sn.SendBatchRequest(topic=TOPIC, queue_id=0, records=bytes(timer_records))
                )
            )
            assert code == pb.RESPONSE_CODE_MESSAGE_ILLEGAL and "delivery time" in details
            assert running.store.max_physical_offset == before
            # Recalls: not a handle, another topic, another broker, an unknown message.
            other = RecallHandle(TOPIC, "broker-z", now_ms() + 5000, "ABC").encode()
            unknown = RecallHandle(TOPIC, "broker-a", now_ms() + 5000, "ABC").encode()
            for topic, handle, code_wanted, words in (
                (TOPIC, "not-a-handle!", pb.RESPONSE_CODE_INVALID_PARAMETER, "recall_handle"),
                ("Other", unknown, pb.RESPONSE_CODE_INVALID_PARAMETER, "is for topic"),
                (TOPIC, other, pb.RESPONSE_CODE_INVALID_PARAMETER, "broker-z"),
                (TOPIC, unknown, pb.RESPONSE_CODE_QUERY_NOT_FOUND, "no pending timer"),
            ):
                status, code, details = await refused(
                    stub.RecallMessage(sn.RecallMessageRequest(topic=topic, recall_handle=handle))
                )
                assert code == code_wanted, details
                assert words in details
            assert status == grpc.StatusCode.NOT_FOUND
            assert running.store.max_physical_offset == before
            _, code, _ = await refused(
                stub.GetScheduleStatus(sn.GetScheduleStatusRequest(max_next_due=-1))
            )
            assert code == pb.RESPONSE_CODE_INVALID_PARAMETER

    run(scenario)


# -- kill -9 of a store-node process ----------------------------------------------------

PENDING = 100_000
BATCH = 500
KILL_TOPIC = "Timers"


async def send_timers(address: str, due: int) -> None:
    """PENDING timer messages due at ``due``, in MessageList batches."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = sn_grpc.StoreNodeStub(channel)
        for start in range(0, PENDING, BATCH):
            batch = [
                wire(
                    KILL_TOPIC,
                    b"%d" % i,
                    properties={PROPERTY_UNIQ_KEY: f"U{i}"},
                    deliver_time_ms=due,
                )
                for i in range(start, start + BATCH)
            ]
            r = await stub.SendBatch(
                sn.SendBatchRequest(
                    topic=KILL_TOPIC,
                    queue_id=start // BATCH % 2,
                    messages=pb.MessageList(messages=batch),
                )
            )
            assert r.result.status == pb.SEND_STATUS_SEND_OK
            assert len(r.result.recall_handles) == BATCH


async def schedule_status(address: str) -> sn.GetScheduleStatusResponse:
    async with grpc.aio.insecure_channel(address) as channel:
        return await sn_grpc.StoreNodeStub(channel).GetScheduleStatus(sn.GetScheduleStatusRequest())


@pytest.mark.slow
def test_100k_pending_timers_survive_kill_9_of_the_store_node(
    tmp_path: Path, etcd: EtcdProcess
) -> None:
    args = (
        "--etcd",
        etcd.endpoint,
        "--cluster",
        unique_cluster(),
        "--flush-disk-type",
        "SYNC_FLUSH",
    )
    n = store_node_process(tmp_path, "broker-a", *args)
    try:
        n.wait_serving()
        # Due after the kill: every one is pending when the node dies.
        latest = now_ms() + 15_000
        asyncio.run(send_timers(n.address, latest))
        assert now_ms() < latest, "sending took longer than the timers wait"
        before = asyncio.run(schedule_status(n.address))
        print(f"at the kill: {before.timer_pending} filed of {PENDING}")
        n.stop(signal.SIGKILL)
        assert (tmp_path / "broker-a" / "abort").exists()
        n.start()
        n.wait_serving()

        def all_delivered() -> bool:
            s = asyncio.run(schedule_status(n.address))
            return s.timer_pending == 0 and s.timer_read_ms > latest

        eventually_sync(all_delivered, timeout_s=120, interval_s=0.5)
        assert n.stop() == 0
    finally:
        if n.proc.poll() is None:
            n.stop(signal.SIGKILL)
    store = MessageStore.open(MessageStoreConfig(store_path_root_dir=tmp_path / "broker-a"))
    try:
        seen: dict[str, int] = {}
        for queue_id in range(8):
            for _, r in store.iter_queue(KILL_TOPIC, queue_id):
                assert r.uniq_key is not None
                assert r.store_timestamp_ms >= int(r.properties[PROPERTY_TIMER_DELIVER_MS])
                seen[r.uniq_key] = seen.get(r.uniq_key, 0) + 1
        missing = {f"U{i}" for i in range(PENDING)} - set(seen)
        assert not missing, f"{len(missing)} lost, e.g. {sorted(missing)[:5]}"
        print(f"kill -9: {PENDING} delivered, {sum(seen.values()) - PENDING} duplicates")
    finally:
        store.shutdown()


# -- a replicated group -----------------------------------------------------------------


@pytest.mark.slow
@async_test(timeout_s=180)
async def test_in_a_group_only_the_master_delivers_and_recalls(
    tmp_path: Path, etcd: EtcdProcess
) -> None:
    """Two members: a timer sent to the master is delivered once - the slave
    replicates the delivered copy and delivers nothing itself (its log would
    fork) - and a recall sent to the slave is refused NOT_MASTER."""
    async with ReplicaGroup(
        tmp_path, etcd.endpoint, unique_cluster(), replicas=2, flags=ha_flags(min_in_sync=2)
    ) as group:
        await eventually(lambda: group.in_sync({0, 1}), timeout_s=60, what="both in sync")
        master = (await group.state()).master_id
        slave = 1 - master
        due = now_ms() + 1500
        sent = await group.stub(master).SendMessage(
            sn.SendMessageRequest(
                message=pb.Message(topic=GROUP_TOPIC, body=b"once", deliver_time_ms=due),
                queue_id=0,
            )
        )
        [handle] = sent.result.recall_handles
        _, code, details = await refused(
            group.stub(slave).RecallMessage(
                sn.RecallMessageRequest(topic=GROUP_TOPIC, recall_handle=handle)
            )
        )
        assert code == pb.RESPONSE_CODE_NOT_MASTER, details

        async def on_both() -> bool:
            counts = [len(await group.read_queue(m, 0)) for m in (master, slave)]
            return counts == [1, 1]

        await eventually(on_both, timeout_s=30, what="the delivered copy on both members")
        await asyncio.sleep(1.0)  # a slave that delivered too would show a second copy
        for member in (master, slave):
            assert [body for _, body in await group.read_queue(member, 0)] == [b"once"]
        assert now_ms() >= due
