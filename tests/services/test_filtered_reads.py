"""Filtered reads on a store-node (issue 14): SQL92 reads run in a worker thread,
so a long one never holds the event loop; TAG and unfiltered reads stay on it.

What is checked is what a read returns (exactly the matching messages, the
right next offsets, GetMessage and GetMessages, SQL92 and TAG), where it runs,
and ordering: a health Check is answered while a filtered read is in progress.
No timing is asserted (benchmarks/filter_latency.py measures it).
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from basalt.services.store_node.long_polling import HeldRead, PullRequestHoldService
from basalt.services.store_node.service import checks_every_record
from basalt.store import Message, MessageStore
from basalt.store.get_message import GetMessageResult
from basalt.store.message_filter import build_filter
from basalt.v1 import common_pb2 as pb
from basalt.v1 import store_node_pb2 as sn
from tests.support.aio import run
from tests.support.nodes import NODE_TOPIC as TOPIC
from tests.support.nodes import node
from tests.support.rpc import bodies

SQL92 = pb.EXPRESSION_TYPE_SQL92
TAG = pb.EXPRESSION_TYPE_TAG
#: Record i of a queue: body b"q<queue>-<i>", tag "even"/"odd", property n = i % 3.
PER_QUEUE = 30


def fill(store: MessageStore, queues: int = 2) -> None:
    for q in range(queues):
        store.put_messages(
            [
                Message(
                    TOPIC,
                    b"q%d-%d" % (q, i),
                    queue_id=q,
                    tags="even" if i % 2 == 0 else "odd",
                    properties={"n": str(i % 3)},
                )
                for i in range(PER_QUEUE)
            ]
        )
    assert store.wait_dispatched()


def get(
    queue_id: int, kind: int, expression: str, offset: int = 0, max_nums: int = 32
) -> sn.GetMessageRequest:
    return sn.GetMessageRequest(
        group="G",
        topic=TOPIC,
        queue_id=queue_id,
        offset=offset,
        max_msg_nums=max_nums,
        subscription=pb.Subscription(type=kind, expression=expression),
    )


def expected(queue_id: int, keep: Any) -> list[bytes]:
    return [b"q%d-%d" % (queue_id, i) for i in range(PER_QUEUE) if keep(i)]


def test_which_reads_leave_the_loop() -> None:
    assert checks_every_record(build_filter("SQL92", "n = '1'"))
    assert not checks_every_record(build_filter("TAG", "even || odd"))
    assert not checks_every_record(build_filter("TAG", "*"))


def test_get_message_returns_exactly_the_matches_and_the_next_offsets(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with node(tmp_path) as (running, stub, _):
            await asyncio.to_thread(fill, running.store)
            cases = [
                (SQL92, "n = '1'", lambda i: i % 3 == 1),
                (SQL92, "n = '0' AND TAGS = 'even'", lambda i: i % 6 == 0),
                (TAG, "odd", lambda i: i % 2 == 1),
            ]
            for kind, expression, keep in cases:
                whole = await stub.GetMessage(get(0, kind, expression))
                assert whole.status == pb.GET_MESSAGE_STATUS_FOUND
                assert bodies(whole) == expected(0, keep)
                assert whole.next_begin_offset == PER_QUEUE  # scanned to the end
                # Two at a time: each pull ends past its last match, none lost.
                got: list[bytes] = []
                offset = 0
                while offset < PER_QUEUE:
                    part = await stub.GetMessage(get(0, kind, expression, offset, max_nums=2))
                    got += bodies(part)
                    if part.records.count == 2:  # full: it ends just past its last match
                        last = int(bodies(part)[-1].split(b"-")[1])
                        assert part.next_begin_offset == last + 1
                    else:  # not full: it scanned to the queue's end
                        assert part.next_begin_offset == PER_QUEUE
                    offset = part.next_begin_offset
                assert got == expected(0, keep)
            # Nothing matches: no records, and the offset still moves to the end.
            none = await stub.GetMessage(get(1, SQL92, "n = '7'"))
            assert none.status == pb.GET_MESSAGE_STATUS_NO_MATCHED_MESSAGE
            assert none.records.count == 0
            assert none.next_begin_offset == PER_QUEUE

    run(scenario)


def test_get_messages_mixes_sql92_and_tag_reads_each_exact(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with node(tmp_path) as (running, stub, _):
            await asyncio.to_thread(fill, running.store, 3)
            got = await stub.GetMessages(
                sn.GetMessagesRequest(
                    reads=[
                        get(0, SQL92, "n = '2'"),
                        get(1, TAG, "even"),
                        get(2, SQL92, "n IN ('0', '1')", offset=10, max_nums=4),
                    ]
                )
            )
            sql, tag, window = got.results
            assert bodies(sql) == expected(0, lambda i: i % 3 == 2)
            assert sql.next_begin_offset == PER_QUEUE
            assert bodies(tag) == expected(1, lambda i: i % 2 == 0)
            assert tag.next_begin_offset == PER_QUEUE
            # From offset 10, four matches: 10, 12, 13, 15 (14 has n = 2).
            assert bodies(window) == [b"q2-10", b"q2-12", b"q2-13", b"q2-15"]
            assert window.next_begin_offset == 16

    run(scenario)


def test_sql92_reads_run_off_the_loop_and_tag_reads_on_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def scenario() -> None:
        async with node(tmp_path) as (running, stub, _):
            await asyncio.to_thread(fill, running.store)
            store = running.store
            original = store.get_message
            threads: list[threading.Thread] = []

            def recording(*args: Any, **kw: Any) -> GetMessageResult:
                threads.append(threading.current_thread())
                return original(*args, **kw)

            monkeypatch.setattr(store, "get_message", recording)
            loop_thread = threading.current_thread()  # the server shares the test's loop
            await stub.GetMessage(get(0, TAG, "even"))
            await stub.GetMessage(get(0, TAG, "*"))
            assert threads == [loop_thread, loop_thread]
            threads.clear()
            await stub.GetMessage(get(0, SQL92, "n = '1'"))
            # A GetMessages with one SQL92 entry: the whole batch in one hop.
            await stub.GetMessages(
                sn.GetMessagesRequest(reads=[get(0, TAG, "odd"), get(1, SQL92, "n = '1'")])
            )
            assert len(threads) == 3
            assert all(t is not loop_thread for t in threads)

    run(scenario)


def test_a_health_check_is_answered_while_a_filtered_read_is_in_progress(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The read is held in progress until the Check has been answered. Were it on
    the event loop (which this in-process server shares with the test), nothing
    could answer the Check: the read would give up waiting first, and complete
    before the Check does."""

    async def scenario() -> None:
        async with node(tmp_path) as (running, stub, _):
            await asyncio.to_thread(fill, running.store, 4)
            store = running.store
            original = store.get_message
            started, checked = threading.Event(), threading.Event()

            def in_progress(*args: Any, **kw: Any) -> GetMessageResult:
                result = original(*args, **kw)
                started.set()
                checked.wait(10)
                return result

            monkeypatch.setattr(store, "get_message", in_progress)
            order: list[str] = []
            request = sn.GetMessagesRequest(
                reads=[get(q, SQL92, "n = '5' OR TAGS = 'none'") for q in range(4)]
            )

            async def read() -> sn.GetMessagesResponse:
                response = await stub.GetMessages(request)
                order.append("read")
                return response

            reading = asyncio.ensure_future(read())
            assert await asyncio.to_thread(started.wait, 10)
            async with grpc.aio.insecure_channel(running.address) as channel:
                health = health_pb2_grpc.HealthStub(channel)
                reply = await health.Check(health_pb2.HealthCheckRequest(), timeout=30)
            order.append("check")
            checked.set()
            response = await reading
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
            assert order == ["check", "read"]
            assert [r.records.count for r in response.results] == [0, 0, 0, 0]
            assert [r.next_begin_offset for r in response.results] == [PER_QUEUE] * 4

    run(scenario)


def test_drain_waits_for_a_slow_read_left_running_by_a_cancelled_call() -> None:
    """A stop cancels calls still running at the end of its grace period, but a
    read in a worker thread runs on: drain waits for it, so the store is not shut
    down under it."""

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        hold = PullRequestHoldService(loop, ThreadPoolExecutor(1))
        entered, finish = threading.Event(), threading.Event()
        finished: list[int] = []

        def pull(offset: int) -> int:
            entered.set()
            finish.wait(10)
            finished.append(offset)
            return offset

        read = HeldRead(
            topic=TOPIC,
            queue_id=0,
            offset=3,
            pull=pull,
            found=lambda _: True,
            next_offset=lambda r: r,
            max_offset=lambda: 0,
            slow=True,
        )
        call = asyncio.ensure_future(hold.hold([read], 0.0))
        assert await asyncio.to_thread(entered.wait, 10)
        call.cancel()
        draining = asyncio.ensure_future(hold.drain())
        await asyncio.sleep(0.05)
        assert not draining.done() and finished == []
        finish.set()
        await draining
        assert finished == [3]

    run(scenario)
