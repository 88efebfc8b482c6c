"""The store-node's pop-and-ack RPCs on a real grpc.aio server (port 0) over a real store.

PopMessages / AckMessages / ChangeInvisibleDuration as a v2 front uses them:
deliveries with attempts and handles, redelivery, stale and malformed handles,
long polling woken by an arrival, and every bad input refused clearly.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable
from functools import partial
from pathlib import Path
from typing import Any

import grpc
import pytest

from basalt.common.receipt import ReceiptHandle
from basalt.common.record import decode_record
from basalt.services.store_node.pop_batching import PopWork
from basalt.store import Message, MessageStore, MessageStoreConfig
from basalt.store.config import FlushDiskType
from basalt.v1 import common_pb2 as pb
from basalt.v1 import store_node_pb2 as sn
from basalt.v1 import store_node_pb2_grpc as sn_grpc
from tests.support.aio import run
from tests.support.nodes import NODE_TOPIC as TOPIC
from tests.support.nodes import node
from tests.support.rpc import refused, wire

GROUP = "pop-group"


async def send(stub: sn_grpc.StoreNodeStub, count: int, queue_id: int = 0, tags: str = "A") -> None:
    for i in range(count):
        await stub.SendMessage(
            sn.SendMessageRequest(message=wire(TOPIC, b"m%d" % i, tags=tags), queue_id=queue_id)
        )


def pop_request(**kw: Any) -> sn.PopMessagesRequest:
    values: dict[str, Any] = {
        "group": GROUP,
        "topic": TOPIC,
        "queue_ids": [0],
        "max_messages": 32,
        "invisible_duration_ms": 30_000,
    }
    values.update(kw)
    return sn.PopMessagesRequest(**values)


def test_pop_ack_and_redelivery_with_attempt_2(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with node(tmp_path) as (running, stub, _):
            await send(stub, 2, queue_id=0)
            await send(stub, 1, queue_id=1)
            got = await stub.PopMessages(pop_request(queue_ids=[1, 0], invisible_duration_ms=300))
            assert [(m.queue_id, m.queue_offset, m.delivery_attempt) for m in got.messages] == [
                (1, 0, 1),
                (0, 0, 1),
                (0, 1, 1),
            ]
            assert decode_record(got.messages[0].record).body == b"m0"
            handle = ReceiptHandle.decode(got.messages[2].receipt_handle)
            assert (handle.broker_name, handle.topic, handle.queue_id, handle.queue_offset) == (
                "broker-a",
                TOPIC,
                0,
                1,
            )
            assert handle.invisible_ms == 300
            acked = await stub.AckMessages(
                sn.AckMessagesRequest(
                    group=GROUP,
                    topic=TOPIC,
                    receipt_handles=[m.receipt_handle for m in got.messages[:2]],
                )
            )
            assert [r.status for r in acked.results] == [sn.POP_ACK_STATUS_OK] * 2
            again = await stub.PopMessages(
                pop_request(queue_ids=[0, 1], poll_timeout_ms=3_000, invisible_duration_ms=300)
            )
            assert [(m.queue_id, m.queue_offset, m.delivery_attempt) for m in again.messages] == [
                (0, 1, 2)
            ]
            stale = await stub.AckMessages(
                sn.AckMessagesRequest(
                    group=GROUP,
                    topic=TOPIC,
                    receipt_handles=[got.messages[2].receipt_handle, "garbage!"],
                )
            )
            assert [r.status for r in stale.results] == [
                sn.POP_ACK_STATUS_STALE_HANDLE,
                sn.POP_ACK_STATUS_MALFORMED_HANDLE,
            ]
            assert running.store.query_offset(GROUP, TOPIC, 0) == 1

    run(scenario)


def test_change_invisible_duration_answers_a_new_handle(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with node(tmp_path) as (_, stub, _):
            await send(stub, 1)
            (m,) = (await stub.PopMessages(pop_request())).messages
            changed = await stub.ChangeInvisibleDuration(
                sn.ChangeInvisibleDurationRequest(
                    group=GROUP, topic=TOPIC, receipt_handle=m.receipt_handle,
                    invisible_duration_ms=0,
                )
            )  # fmt: skip
            assert changed.status == sn.POP_ACK_STATUS_OK
            assert changed.receipt_handle != m.receipt_handle
            old = await stub.AckMessages(
                sn.AckMessagesRequest(group=GROUP, topic=TOPIC, receipt_handles=[m.receipt_handle])
            )
            assert old.results[0].status == sn.POP_ACK_STATUS_STALE_HANDLE
            (again,) = (await stub.PopMessages(pop_request())).messages
            assert again.delivery_attempt == 2
            stale = await stub.ChangeInvisibleDuration(
                sn.ChangeInvisibleDurationRequest(
                    group=GROUP, topic=TOPIC, receipt_handle=changed.receipt_handle,
                    invisible_duration_ms=10,
                )
            )  # fmt: skip
            assert stale.status == sn.POP_ACK_STATUS_STALE_HANDLE

    run(scenario)


def test_long_poll_is_woken_by_an_arrival_and_fifo_blocks(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with node(tmp_path) as (_, stub, _):
            started = time.monotonic()
            call = stub.PopMessages(
                pop_request(queue_ids=[2, 3], poll_timeout_ms=10_000, fifo=True)
            )
            await asyncio.sleep(0.3)
            await send(stub, 2, queue_id=3)
            got = await call
            assert time.monotonic() - started < 5
            assert [m.queue_id for m in got.messages] in ([3], [3, 3])
            # FIFO: queue 3 has a message in flight, so nothing more comes from it.
            more = await stub.PopMessages(
                pop_request(queue_ids=[3], poll_timeout_ms=200, fifo=True)
            )
            assert more.messages == []
            plain = await stub.PopMessages(pop_request(queue_ids=[3]))
            offsets = [m.queue_offset for m in [*got.messages, *plain.messages]]
            assert offsets == [0, 1]

    run(scenario)


def test_filter_skips_non_matching(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with node(tmp_path) as (_, stub, _):
            await send(stub, 2, tags="A")
            await send(stub, 1, tags="B")
            sub = pb.Subscription(type=pb.EXPRESSION_TYPE_TAG, expression="B")
            got = await stub.PopMessages(pop_request(subscription=sub))
            assert [m.queue_offset for m in got.messages] == [2]

    run(scenario)


def test_handles_for_another_broker_or_topic(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with node(tmp_path) as (_, stub, _):
            other = ReceiptHandle("broker-b", TOPIC, 0, 0, 0, 1, 0, 1).encode()
            topic = ReceiptHandle("broker-a", "Other", 0, 0, 0, 1, 0, 1).encode()
            acked = await stub.AckMessages(
                sn.AckMessagesRequest(group=GROUP, topic=TOPIC, receipt_handles=[other, topic])
            )
            assert [r.status for r in acked.results] == [
                sn.POP_ACK_STATUS_WRONG_BROKER,
                sn.POP_ACK_STATUS_MALFORMED_HANDLE,
            ]
            assert "broker-b" in acked.results[0].detail
            changed = await stub.ChangeInvisibleDuration(
                sn.ChangeInvisibleDurationRequest(
                    group=GROUP, topic=TOPIC, receipt_handle="%%%", invisible_duration_ms=5
                )
            )
            assert changed.status == sn.POP_ACK_STATUS_MALFORMED_HANDLE

    run(scenario)


def test_bad_input_is_refused_clearly(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with node(tmp_path) as (_, stub, _):
            bad = grpc.StatusCode.INVALID_ARGUMENT, pb.RESPONSE_CODE_INVALID_PARAMETER
            cases: list[tuple[Awaitable[Any], tuple[grpc.StatusCode, int], str]] = [
                (
                    stub.PopMessages(pop_request(topic="Nope")),
                    (grpc.StatusCode.NOT_FOUND, pb.RESPONSE_CODE_TOPIC_NOT_EXIST),
                    "does not exist",
                ),
                (stub.PopMessages(pop_request(group="")), bad, "group"),
                (stub.PopMessages(pop_request(queue_ids=[])), bad, "queue_ids"),
                (stub.PopMessages(pop_request(queue_ids=[1, 1])), bad, "distinct"),
                (stub.PopMessages(pop_request(queue_ids=[4])), bad, "4 read queues"),
                (stub.PopMessages(pop_request(max_messages=0)), bad, "max_messages"),
                (stub.PopMessages(pop_request(invisible_duration_ms=0)), bad, "invisible"),
                (stub.PopMessages(pop_request(invisible_duration_ms=-5)), bad, "invisible"),
                (stub.PopMessages(pop_request(poll_timeout_ms=-1)), bad, "poll_timeout_ms"),
                (
                    stub.PopMessages(
                        pop_request(
                            subscription=pb.Subscription(
                                type=pb.EXPRESSION_TYPE_SQL92, expression="a >"
                            )
                        )
                    ),
                    (grpc.StatusCode.INVALID_ARGUMENT, pb.RESPONSE_CODE_SUBSCRIPTION_PARSE_FAILED),
                    "",
                ),
                (
                    stub.AckMessages(sn.AckMessagesRequest(group=GROUP, topic="Nope")),
                    (grpc.StatusCode.NOT_FOUND, pb.RESPONSE_CODE_TOPIC_NOT_EXIST),
                    "does not exist",
                ),
                (
                    stub.ChangeInvisibleDuration(
                        sn.ChangeInvisibleDurationRequest(
                            group=GROUP, topic=TOPIC, receipt_handle="x", invisible_duration_ms=-1
                        )
                    ),
                    bad,
                    "negative",
                ),
            ]
            for call, (code, response_code), text in cases:
                status, got_code, message = await refused(call)
                assert (status, got_code) == (code, response_code), message
                assert text in message
            await send(stub, 1)
            assert len((await stub.PopMessages(pop_request())).messages) == 1

    run(scenario)


def test_a_held_pop_of_a_blocked_fifo_queue_waits_instead_of_spinning(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with node(tmp_path) as (running, stub, _):
            await send(stub, 2)
            first = await stub.PopMessages(pop_request(max_messages=1, fifo=True))
            assert [m.queue_offset for m in first.messages] == [0]
            pops = running.store.pop
            calls = 0
            real = pops.pop

            def counted(*args: Any, **kw: Any) -> Any:
                nonlocal calls
                calls += 1
                return real(*args, **kw)

            pops.pop = counted  # type: ignore[method-assign]
            started = time.monotonic()
            held = await stub.PopMessages(pop_request(fifo=True, poll_timeout_ms=600))
            assert held.messages == []
            assert time.monotonic() - started >= 0.5
            assert calls <= 3  # the first round, and one at the deadline

    run(scenario)


def test_a_held_pop_is_woken_by_an_ack_and_by_a_shorter_invisible_time(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with node(tmp_path) as (_, stub, _):
            await send(stub, 2)
            (m0,) = (await stub.PopMessages(pop_request(max_messages=1, fifo=True))).messages
            started = time.monotonic()
            held = stub.PopMessages(pop_request(fifo=True, poll_timeout_ms=10_000))
            await asyncio.sleep(0.3)
            await stub.AckMessages(
                sn.AckMessagesRequest(group=GROUP, topic=TOPIC, receipt_handles=[m0.receipt_handle])
            )
            (m1,) = (await held).messages  # the FIFO queue is unblocked by the ack
            assert m1.queue_offset == 1 and time.monotonic() - started < 5
            started = time.monotonic()
            held = stub.PopMessages(pop_request(poll_timeout_ms=10_000))
            await asyncio.sleep(0.3)
            await stub.ChangeInvisibleDuration(
                sn.ChangeInvisibleDurationRequest(
                    group=GROUP, topic=TOPIC, receipt_handle=m1.receipt_handle,
                    invisible_duration_ms=200,
                )
            )  # fmt: skip
            (again,) = (await held).messages  # due in 200 ms, not in 30 s
            assert (again.queue_offset, again.delivery_attempt) == (1, 2)
            assert time.monotonic() - started < 5

    run(scenario)


def test_reset_offset_clears_in_flight_messages(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with node(tmp_path) as (running, stub, _):
            await send(stub, 3)
            got = await stub.PopMessages(pop_request(invisible_duration_ms=100))
            assert len(got.messages) == 3
            reset = await stub.ResetOffset(
                sn.ResetOffsetRequest(topic=TOPIC, group=GROUP, timestamp_ms=-1, force=True)
            )
            assert reset.offsets[0] == 3
            acked = await stub.AckMessages(
                sn.AckMessagesRequest(
                    group=GROUP, topic=TOPIC, receipt_handles=[got.messages[0].receipt_handle]
                )
            )
            assert acked.results[0].status == sn.POP_ACK_STATUS_STALE_HANDLE
            again = await stub.PopMessages(pop_request(poll_timeout_ms=300))
            assert again.messages == []  # nothing redelivered after the invisible time
            assert running.store.query_offset(GROUP, TOPIC, 0) == 3

    run(scenario)


def test_the_store_work_of_concurrent_calls_is_one_batch(tmp_path: Path) -> None:
    """What arrives while a batch runs goes together in the next one: one
    thread hand-off and one journal write for all of it. (SYNC_FLUSH: every
    journal write fsyncs, so all the work goes to the thread.)"""
    config = MessageStoreConfig(
        store_path_root_dir=tmp_path / "store", flush_disk_type=FlushDiskType.SYNC_FLUSH
    )
    store = MessageStore.open(config)
    try:
        for i in range(4):
            store.put_message(Message(TOPIC, b"m%d" % i))
        assert store.wait_dispatched()
        work = PopWork(store.pop)
        release = threading.Event()

        def first() -> int:
            release.wait(10)
            return -1

        def pop_one(group: str) -> list[int]:
            got = store.pop.pop(group, TOPIC, 0, 1, 30_000, store.clock.now_ms())
            return [m.queue_offset for m in got]

        def failing() -> None:
            raise ValueError("refused")

        async def scenario() -> list[Any]:
            held = asyncio.ensure_future(work.run(first))
            await asyncio.sleep(0.05)  # the first batch runs (blocked) in its thread
            joined = [asyncio.ensure_future(work.run(partial(pop_one, f"g{i}"))) for i in range(3)]
            bad = asyncio.ensure_future(work.run(failing))
            gave_up = asyncio.ensure_future(work.run(partial(pop_one, "gone")))
            await asyncio.sleep(0)
            gave_up.cancel()
            size = store.pop.journal_bytes
            release.set()
            out = [await held, *[await j for j in joined]]
            with pytest.raises(ValueError, match="refused"):
                await bad
            assert store.pop.journal_bytes > size
            return out

        assert asyncio.run(scenario()) == [-1, [0], [0], [0]]
        assert (work.batches, work.works) == (2, 5)  # the cancelled one never ran
        assert store.pop.cursor("gone", TOPIC, 0) is None
    finally:
        store.shutdown()


def test_under_async_flush_pop_work_runs_on_the_loop_until_an_fsync_is_due(
    tmp_path: Path,
) -> None:
    config = MessageStoreConfig(
        store_path_root_dir=tmp_path / "store", flush_interval_commit_log_ms=60_000
    )
    store = MessageStore.open(config)
    try:
        for i in range(3):
            store.put_message(Message(TOPIC, b"m%d" % i))
        assert store.wait_dispatched()
        work = PopWork(store.pop)

        def pop_one() -> int:
            (m,) = store.pop.pop("g", TOPIC, 0, 1, 30_000, store.clock.now_ms())
            return m.queue_offset

        async def scenario() -> list[int]:
            # The first write fsyncs (none yet): a thread's; the next ones, with
            # no fsync due for a minute, are one os.write each, on the loop.
            return [await work.run(pop_one) for _ in range(3)]

        assert asyncio.run(scenario()) == [0, 1, 2]
        assert (work.batches, work.inline) == (1, 2)
        assert not store.pop.write_may_block()
    finally:
        store.shutdown()
