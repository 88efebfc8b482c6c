"""Transactional messages through a store-node (a real grpc.aio server over a real
store): a half is invisible until committed, then consumed once; a rollback is
never delivered; an unresolved half is checked back with a listener of its group
and resolved by the answer; past transaction_check_max it goes to
TRANS_CHECK_MAX_TIME_TOPIC; bad ends and sends are refused with nothing stored;
a restarted node remembers what was resolved."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc

from basalt.common.message import (
    TRANS_CHECK_MAX_TIME_TOPIC,
    TRANS_HALF_TOPIC,
    TRANS_OP_HALF_TOPIC,
    new_uniq_key,
)
from basalt.common.record import decode_record
from basalt.services.meta import TopicConfig
from basalt.services.store_node.server import RunningStoreNode, start_store_node
from basalt.services.store_node.service import StoreNodeConfig
from basalt.services.store_node.topics import LocalTopics
from basalt.v1 import common_pb2 as pb
from basalt.v1 import store_node_pb2 as sn
from basalt.v1 import store_node_pb2_grpc as sn_grpc
from tests.support.aio import run
from tests.support.polling import eventually
from tests.support.rpc import refused, wire
from tests.support.stores import node_store_config

TOPIC = "TxTopic"
GROUP = "TxGroup"
COMMIT = sn.TRANSACTION_RESOLUTION_COMMIT
ROLLBACK = sn.TRANSACTION_RESOLUTION_ROLLBACK


@asynccontextmanager
async def txn_node(
    tmp_path: Path, **settings: Any
) -> AsyncIterator[tuple[RunningStoreNode, sn_grpc.StoreNodeStub]]:
    """Store-node broker-a hosting TOPIC (4 queues), with short transaction settings
    unless told otherwise."""
    topics = LocalTopics()
    topics.put(
        TopicConfig(topic_name=TOPIC, read_queue_nums=4, write_queue_nums=4, brokers=("broker-a",))
    )
    config = StoreNodeConfig(
        broker_name="broker-a",
        **{
            "transaction_timeout_ms": 300,
            "transaction_check_interval_ms": 200,
            **settings,
        },
    )
    running = await start_store_node(config, node_store_config(tmp_path / "store"), topics)
    channel = grpc.aio.insecure_channel(running.address)
    try:
        yield running, sn_grpc.StoreNodeStub(channel)
    finally:
        await channel.close()
        await running.stop(grace_s=1)


async def send_half(
    stub: sn_grpc.StoreNodeStub, body: bytes, *, group: str = GROUP, queue_id: int = 1, **kw: Any
) -> tuple[str, str]:
    """A transactional send; returns (offset msg id of the half, transaction id)."""
    uniq = new_uniq_key()
    sent = await stub.SendMessage(
        sn.SendMessageRequest(
            message=wire(
                TOPIC,
                body,
                tags="TagT",
                keys=["order-1"],
                properties={"TRAN_MSG": "true", "PGROUP": group, "UNIQ_KEY": uniq, **kw},
            ),
            queue_id=queue_id,
        )
    )
    assert sent.result.status == pb.SEND_STATUS_SEND_OK
    assert sent.result.queue.topic == TOPIC
    return sent.result.offset_msg_ids[0], uniq


async def records(stub: sn_grpc.StoreNodeStub, queue_id: int = 1) -> list[Any]:
    got = await stub.GetMessage(
        sn.GetMessageRequest(group="C", topic=TOPIC, queue_id=queue_id, max_msg_nums=32)
    )
    if got.status != pb.GET_MESSAGE_STATUS_FOUND:
        return []
    out, data, pos = [], got.records.data, 0
    while pos < len(data):
        record = decode_record(data, pos)
        out.append(record)
        pos += record.store_size
    return out


def end(
    msg_id: str, uniq: str, resolution: int, *, group: str = GROUP, from_check: bool = False
) -> sn.EndTransactionRequest:
    return sn.EndTransactionRequest(
        producer_group=group,
        offset_msg_id=msg_id,
        transaction_id=uniq,
        resolution=resolution,  # type: ignore[arg-type]
        from_check=from_check,
    )


def test_a_committed_half_is_consumed_once_and_a_rolled_back_one_never(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with txn_node(tmp_path, transaction_check_interval_ms=60_000) as (running, stub):
            store = running.store
            committed_id, committed_tx = await send_half(stub, b"pay")
            rolled_id, rolled_tx = await send_half(stub, b"refund")
            assert store.get_max_offset_in_queue(TRANS_HALF_TOPIC, 0) == 2
            assert await records(stub) == []  # invisible while half
            answer = await stub.EndTransaction(end(committed_id, committed_tx, COMMIT))
            assert answer.result.queue.topic == TOPIC and answer.result.queue.queue_id == 1
            await stub.EndTransaction(end(rolled_id, rolled_tx, ROLLBACK))
            got = await records(stub)
            assert [(r.body, r.tags, r.keys, r.uniq_key) for r in got] == [
                (b"pay", "TagT", ["order-1"], committed_tx)
            ]
            assert "TRAN_MSG" not in got[0].properties and "REAL_TOPIC" not in got[0].properties
            assert got[0].msg_id == answer.result.offset_msg_ids[0]
            # The same end again: answered as done, nothing stored; the other way: refused.
            before = store.max_physical_offset
            again = await stub.EndTransaction(end(committed_id, committed_tx, COMMIT))
            assert again.result.offset_msg_ids == answer.result.offset_msg_ids
            await stub.EndTransaction(end(rolled_id, rolled_tx, ROLLBACK))
            _, code, details = await refused(stub.EndTransaction(end(rolled_id, rolled_tx, COMMIT)))
            assert code == pb.RESPONSE_CODE_INVALID_PARAMETER and "rollback" in details
            assert store.max_physical_offset == before
            assert [r.body for r in await records(stub)] == [b"pay"]
            assert store.get_max_offset_in_queue(TRANS_OP_HALF_TOPIC, 0) == 2

    run(scenario)


def test_an_unknown_transaction_is_resolved_by_check_back(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with txn_node(tmp_path) as (_running, stub):
            watch = stub.WatchTransactionChecks(
                sn.WatchTransactionChecksRequest(producer_group=GROUP, client_id="c1")
            )
            await watch.initial_metadata()
            msg_id, uniq = await send_half(stub, b"maybe")
            # UNKNOW: no end. The check-back comes with a copy of the half.
            check = await asyncio.wait_for(watch.read(), 30)
            assert check.transaction_id == uniq and check.check_times == 1
            assert check.offset_msg_id != msg_id
            half = decode_record(check.record)
            assert half.topic == TRANS_HALF_TOPIC and half.properties["REAL_TOPIC"] == TOPIC
            assert await records(stub) == []
            await stub.EndTransaction(end(check.offset_msg_id, uniq, COMMIT, from_check=True))
            # The producer's own late answer about the original: already done.
            late = await stub.EndTransaction(end(msg_id, uniq, COMMIT))
            assert late.result.queue.topic == TOPIC
            assert [r.body for r in await records(stub)] == [b"maybe"]
            watch.cancel()

            # Resolved: no further check comes for it.
            watch2 = stub.WatchTransactionChecks(
                sn.WatchTransactionChecksRequest(producer_group=GROUP, client_id="c2")
            )
            await watch2.initial_metadata()
            with_nothing = asyncio.ensure_future(watch2.read())
            await asyncio.sleep(1.5)
            assert not with_nothing.done()
            watch2.cancel()
            assert [r.body for r in await records(stub)] == [b"maybe"]

    run(scenario)


def test_checks_go_round_robin_and_past_check_max_to_the_check_max_topic(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        async with txn_node(tmp_path, transaction_check_max=3) as (running, stub):
            watches = [
                stub.WatchTransactionChecks(
                    sn.WatchTransactionChecksRequest(producer_group=GROUP, client_id=f"c{i}")
                )
                for i in range(2)
            ]
            for w in watches:
                await w.initial_metadata()
            _, uniq = await send_half(stub, b"never-answered")
            seen: list[tuple[int, int]] = []
            # Three checks, alternating between the listeners (round robin per group).
            reads = {i: asyncio.ensure_future(w.read()) for i, w in enumerate(watches)}
            while len(seen) < 3:
                done, _ = await asyncio.wait(
                    reads.values(), timeout=30, return_when=asyncio.FIRST_COMPLETED
                )
                assert done, "no check-back came"
                for i, fut in list(reads.items()):
                    if fut in done:
                        check = fut.result()
                        assert check.transaction_id == uniq
                        seen.append((i, check.check_times))
                        reads[i] = asyncio.ensure_future(watches[i].read())
            # Two checks can land in one wait: order them by their count, not by
            # which listener's read this loop looked at first.
            seen.sort(key=lambda s: s[1])
            assert [t for _, t in seen] == [1, 2, 3]
            assert {i for i, _ in seen} == {0, 1}
            store = running.store

            def moved() -> bool:
                return store.get_max_offset_in_queue(TRANS_CHECK_MAX_TIME_TOPIC, 0) == 1

            await eventually(moved, timeout_s=30, what="the half in TRANS_CHECK_MAX_TIME_TOPIC")
            parked = store.get_message_by_queue_offset(TRANS_CHECK_MAX_TIME_TOPIC, 0, 0)
            assert parked is not None and parked.body == b"never-answered"
            assert parked.properties["REAL_TOPIC"] == TOPIC
            # Rolled back with it, and forgotten once the walk passed it: a late
            # commit is answered as already resolved, nothing stored or delivered.
            half = store.get_message_by_queue_offset(TRANS_HALF_TOPIC, 0, 0)
            assert half is not None
            before = store.max_physical_offset
            late = await stub.EndTransaction(end(half.msg_id, uniq, COMMIT))
            assert not late.HasField("result")
            assert store.max_physical_offset == before
            assert await records(stub) == []
            for fut in reads.values():
                fut.cancel()
            for w in watches:
                w.cancel()

    run(scenario)


def test_bad_ends_and_sends_are_refused_with_nothing_stored(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with txn_node(tmp_path, transaction_check_interval_ms=60_000) as (running, stub):
            store = running.store
            msg_id, uniq = await send_half(stub, b"x")
            plain = await stub.SendMessage(sn.SendMessageRequest(message=wire(TOPIC, b"plain")))
            plain_id = plain.result.offset_msg_ids[0]
            before = store.max_physical_offset
            ends = [
                (end(msg_id, uniq, sn.TRANSACTION_RESOLUTION_UNSPECIFIED), 29, "resolution"),
                (end(msg_id, "NOT" + uniq, COMMIT), 29, "transaction id"),
                (end(msg_id, uniq, COMMIT, group="OtherGroup"), 29, "producer group"),
                (end(plain_id, uniq, COMMIT), 22, "no half message"),
                (end(msg_id[:-4] + "FFFF", uniq, COMMIT), 22, "no half message"),
                (end("not-hex", uniq, COMMIT), 29, "offset message id"),
            ]
            for request, code, words in ends:
                _, got, details = await refused(stub.EndTransaction(request))
                assert got == code, details
                assert words in details
            tx = {"TRAN_MSG": "true", "PGROUP": GROUP, "UNIQ_KEY": new_uniq_key()}
            sends = [
                (
                    sn.SendMessageRequest(message=wire(TOPIC, b"x", properties=tx, delay_level=2)),
                    pb.RESPONSE_CODE_INVALID_PARAMETER,
                    "delay",
                ),
                (
                    sn.SendMessageRequest(
                        message=wire(TOPIC, b"x", properties={**tx, "PGROUP": ""})
                    ),
                    pb.RESPONSE_CODE_INVALID_PARAMETER,
                    "PGROUP",
                ),
                (
                    sn.SendMessageRequest(message=wire(TRANS_HALF_TOPIC, b"x")),
                    pb.RESPONSE_CODE_NO_PERMISSION,
                    "system topic",
                ),
                (
                    sn.SendMessageRequest(message=wire(TRANS_OP_HALF_TOPIC, b"x")),
                    pb.RESPONSE_CODE_NO_PERMISSION,
                    "system topic",
                ),
                (
                    sn.SendMessageRequest(message=wire(TRANS_CHECK_MAX_TIME_TOPIC, b"x")),
                    pb.RESPONSE_CODE_NO_PERMISSION,
                    "system topic",
                ),
            ]
            for send, code, words in sends:
                _, got, details = await refused(stub.SendMessage(send))
                assert got == code, details
                assert words in details
            _, got, details = await refused(
                stub.SendBatch(
                    sn.SendBatchRequest(
                        topic=TOPIC,
                        messages=pb.MessageList(messages=[wire(TOPIC, b"a", properties=tx)]),
                    )
                )
            )
            assert got == pb.RESPONSE_CODE_INVALID_PARAMETER and "TRAN_MSG" in details
            assert store.max_physical_offset == before
            # The half is still there to commit.
            await stub.EndTransaction(end(msg_id, uniq, COMMIT))
            assert [r.body for r in await records(stub)] == [b"x"]
            # Nobody can read the system topics.
            _, code, _ = await refused(
                stub.GetMessage(
                    sn.GetMessageRequest(group="C", topic=TRANS_HALF_TOPIC, max_msg_nums=8)
                )
            )
            assert code == pb.RESPONSE_CODE_TOPIC_NOT_EXIST

    run(scenario)


def test_a_restarted_node_remembers_what_was_resolved(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with txn_node(tmp_path, transaction_check_interval_ms=60_000) as (_, stub):
            done_id, done_tx = await send_half(stub, b"done")
            open_id, open_tx = await send_half(stub, b"open")
            await stub.EndTransaction(end(done_id, done_tx, COMMIT))
        async with txn_node(tmp_path, transaction_check_interval_ms=60_000) as (_running, stub):
            again = await stub.EndTransaction(end(done_id, done_tx, COMMIT))
            assert not again.HasField("result")  # done before the restart: nothing stored
            _, code, details = await refused(stub.EndTransaction(end(done_id, done_tx, ROLLBACK)))
            assert code == pb.RESPONSE_CODE_INVALID_PARAMETER and "commit" in details
            await stub.EndTransaction(end(open_id, open_tx, COMMIT))
            assert [r.body for r in await records(stub)] == [b"done", b"open"]

    run(scenario)


def test_end_transaction_rides_the_send_stream(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with txn_node(tmp_path, transaction_check_interval_ms=60_000) as (_, stub):
            msg_id, uniq = await send_half(stub, b"streamed")
            call = stub.SendStream()
            await call.write(
                sn.SendStreamRequest(
                    items=[
                        sn.SendStreamItem(opaque=7, end_transaction=end(msg_id, uniq, COMMIT)),
                        sn.SendStreamItem(opaque=8, end_transaction=end(msg_id, "other", ROLLBACK)),
                    ]
                )
            )
            answers: dict[int, sn.SendStreamAnswer] = {}
            while len(answers) < 2:
                response = await call.read()
                answers.update((a.opaque, a) for a in response.answers)
            await call.done_writing()
            assert answers[7].result.queue.topic == TOPIC
            assert answers[8].refused.code == pb.RESPONSE_CODE_INVALID_PARAMETER
            assert "transaction id" in answers[8].refused.message
            assert [r.body for r in await records(stub)] == [b"streamed"]

    run(scenario)
