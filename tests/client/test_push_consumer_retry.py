"""PushConsumer retries against real etcd, store-nodes (one-second delay levels)
and a pull-service: a failed message comes back from %RETRY%<group> with its
original topic and reconsume_times counting, then lands in %DLQ%<group>, while
its queue goes on; a send-back that fails is retried locally, holding only the
commit at its offset; orderly consumers retry in place, bounded, then
dead-letter."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import replace
from pathlib import Path

import grpc
import pytest

from basalt.client import (
    ConsumeFromWhere,
    ConsumeStatus,
    MessageQueue,
    PushConsumer,
    PushConsumerConfig,
)
from basalt.common.message import MessageRecord
from basalt.common.record import decode_records
from basalt.services.meta import MetaConfig
from basalt.store.config import MessageStoreConfig
from basalt.v1 import common_pb2 as pb
from basalt.v1 import store_node_pb2 as sn
from tests.support.aio import async_test
from tests.support.nodes import TOPIC, Harness, cluster
from tests.support.polling import eventually
from tests.support.stores import node_store_config

GROUP = "RG"
#: One-second levels: each retry (level 3, 4, ...) is due a second after it is stored.
FAST_LEVELS = "1s 1s 1s 1s 1s 1s"


def fast_store(root: Path) -> MessageStoreConfig:
    return replace(node_store_config(root), message_delay_level=FAST_LEVELS)


def config(group: str = GROUP, **kw: object) -> PushConsumerConfig:
    return PushConsumerConfig(
        consumer_group=group,
        client_id="C",
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
        broker_suspend_max_time_ms=500,
        suspend_current_queue_time_ms=50,
        persist_consumer_offset_interval_ms=100,
        **kw,  # type: ignore[arg-type]
    )


class Seen:
    """What the listener saw: (body, topic, reconsume_times), in call order."""

    def __init__(self) -> None:
        self.calls: list[tuple[bytes, str, int]] = []
        self.lock = threading.Lock()

    def add(self, messages: list[MessageRecord]) -> None:
        with self.lock:
            self.calls += [(m.body, m.topic, m.reconsume_times) for m in messages]

    def tries(self, body: bytes) -> list[tuple[str, int]]:
        with self.lock:
            return [(t, n) for b, t, n in self.calls if b == body]

    def bodies(self) -> set[bytes]:
        with self.lock:
            return {b for b, _, _ in self.calls}


async def committed(h: Harness, broker: str, group: str, queue_id: int) -> int:
    got = await h.node_stubs[broker].QueryConsumerOffset(
        sn.QueryConsumerOffsetRequest(group=group, topic=TOPIC, queue_id=queue_id)
    )
    return got.offset


async def dead_letters(h: Harness, group: str) -> list[MessageRecord]:
    """Every record of ``%DLQ%<group>`` on every store-node."""
    out: list[MessageRecord] = []
    for stub in h.node_stubs.values():
        try:
            got = await stub.GetMessage(
                sn.GetMessageRequest(
                    group="reader", topic=f"%DLQ%{group}", queue_id=0, max_msg_nums=32
                )
            )
        except grpc.aio.AioRpcError:
            continue  # not a topic of this store-node (yet)
        if got.status == pb.GET_MESSAGE_STATUS_FOUND:
            out += decode_records(got.records.data)
    return out


def test_max_reconsume_times_is_checked_and_minus_one_is_rocketmqs_default() -> None:
    with pytest.raises(ValueError, match="max_reconsume_times"):
        PushConsumerConfig(consumer_group="G", max_reconsume_times=-2)
    assert PushConsumerConfig(consumer_group="G").reconsume_limit() == 16
    assert PushConsumerConfig(consumer_group="G", max_reconsume_times=-1).reconsume_limit() == 16
    orderly = PushConsumerConfig(consumer_group="G", max_reconsume_times=-1, orderly=True)
    assert orderly.reconsume_limit() is None  # RocketMQ's orderly Integer.MAX_VALUE
    assert PushConsumerConfig(consumer_group="G", max_reconsume_times=0).reconsume_limit() == 0


@async_test
async def test_a_failed_message_comes_back_counting_then_goes_to_the_dlq_while_its_queue_goes_on(
    tmp_path: Path, meta_config: MetaConfig
) -> None:
    async with cluster(
        tmp_path, meta_config, heartbeat_interval_ms=500, store_config=fast_store
    ) as h:
        address = h.services[0].address
        rest = {f"r{i}".encode() for i in range(12)}
        for i in range(3):
            await h.send("broker-a", 1, f"r{i}".encode())
            await h.send("broker-b", 2, f"r{i + 3}".encode())
        poison = await h.send("broker-a", 1, b"poison", properties={"UNIQ_KEY": "POISON-ID"})
        bomb = await h.send("broker-b", 2, b"bomb")
        for i in range(6, 12):
            await h.send("broker-a" if i % 2 else "broker-b", 1 if i % 2 else 2, f"r{i}".encode())
        seen = Seen()
        last_try = threading.Event()

        def listener(messages: list[MessageRecord], queue: MessageQueue) -> ConsumeStatus:
            seen.add(messages)
            if messages[0].body == b"poison":
                if messages[0].reconsume_times == 2:
                    # Its last try waits: the rest must go on meanwhile.
                    last_try.wait(timeout=60)
                return ConsumeStatus.RECONSUME_LATER
            if messages[0].body == b"bomb":
                raise RuntimeError("an exception counts as RECONSUME_LATER")
            return ConsumeStatus.CONSUME_SUCCESS

        consumer = PushConsumer(address, config=config(max_reconsume_times=2), listener=listener)
        consumer.subscribe(TOPIC)
        async with consumer:
            # The rest of both queues is consumed, and their commits pass the failed ones.
            await eventually(lambda: rest <= seen.bodies(), what="the rest of the queues")

            async def commits_passed() -> bool:
                return (
                    await committed(h, "broker-a", GROUP, 1) > poison
                    and await committed(h, "broker-b", GROUP, 2) > bomb
                )

            await eventually(commits_passed, timeout_s=20, what="the commits moving on")
            await eventually(lambda: len(seen.tries(b"poison")) == 3, what="poison's last try")
            # Every other message consumed and committed while poison is still in
            # its last try, not yet in the DLQ.
            assert rest <= seen.bodies()
            assert b"poison" not in {r.body for r in await dead_letters(h, GROUP)}
            last_try.set()

            async def both_dead() -> bool:
                return len(await dead_letters(h, GROUP)) == 2

            await eventually(both_dead, timeout_s=60, what="both messages in %DLQ%RG")
            assert any(q.topic == "%RETRY%RG" for q in consumer.assignment())
        # Tried three times each (reconsumed 0, 1, 2 times), always shown with
        # the topic it was sent to, never again once dead-lettered.
        assert seen.tries(b"poison") == [(TOPIC, 0), (TOPIC, 1), (TOPIC, 2)]
        assert seen.tries(b"bomb") == [(TOPIC, 0), (TOPIC, 1), (TOPIC, 2)]
        letters = {r.body: r for r in await dead_letters(h, GROUP)}
        assert set(letters) == {b"poison", b"bomb"}
        for letter in letters.values():
            assert letter.reconsume_times == 3
            assert letter.properties["DLQ_ORIGIN_TOPIC"] == TOPIC
            assert letter.properties["RETRY_TOPIC"] == TOPIC
        assert letters[b"poison"].uniq_key == "POISON-ID"
        assert letters[b"poison"].properties["DLQ_ORIGIN_MESSAGE_ID"] == "POISON-ID"


@async_test
async def test_a_send_back_that_fails_is_retried_locally_holding_the_commit_at_its_offset(
    tmp_path: Path, meta_config: MetaConfig
) -> None:
    # A group whose retry topic name is too long to exist: every send-back is refused.
    group = "L" * 125
    async with cluster(
        tmp_path, meta_config, heartbeat_interval_ms=500, store_config=fast_store
    ) as h:
        address = h.services[0].address
        await h.send("broker-a", 0, b"before")
        stuck = await h.send("broker-a", 0, b"stuck")
        for i in range(5):
            await h.send("broker-a", 0, f"after{i}".encode())
        seen = Seen()
        release = asyncio.Event()

        async def listener(messages: list[MessageRecord], queue: MessageQueue) -> ConsumeStatus:
            seen.add(messages)
            if messages[0].body == b"stuck" and not release.is_set():
                return ConsumeStatus.RECONSUME_LATER
            return ConsumeStatus.CONSUME_SUCCESS

        consumer = PushConsumer(address, config=config(group), listener=listener)
        consumer.subscribe(TOPIC)
        async with consumer:
            after = {f"after{i}".encode() for i in range(5)}
            await eventually(lambda: after <= seen.bodies(), what="the rest of the queue")
            await eventually(lambda: len(seen.tries(b"stuck")) >= 3, what="local retries")

            async def held_at_stuck() -> bool:
                return await committed(h, "broker-a", group, 0) == stuck

            # Everything before it is committed, nothing past it while it waits here.
            await eventually(held_at_stuck, what="the commit at the waiting message")
            release.set()

            async def all_committed() -> bool:
                return await committed(h, "broker-a", group, 0) == stuck + 6

            await eventually(all_committed, what="the commit moving on")
        tries = seen.tries(b"stuck")
        # Counted here: each failed call one more reconsume.
        assert [n for _, n in tries] == list(range(len(tries)))
        assert await dead_letters(h, group) == []


@async_test
async def test_orderly_retries_in_place_bounded_then_dead_letters_and_the_queue_goes_on(
    tmp_path: Path, meta_config: MetaConfig
) -> None:
    async with cluster(
        tmp_path, meta_config, heartbeat_interval_ms=500, store_config=fast_store
    ) as h:
        address = h.services[0].address
        await h.send("broker-b", 3, b"first")
        poison = await h.send("broker-b", 3, b"poison")
        await h.send("broker-b", 3, b"last")
        seen = Seen()
        order: list[bytes] = []

        def listener(messages: list[MessageRecord], queue: MessageQueue) -> ConsumeStatus:
            seen.add(messages)
            if messages[0].body == b"poison":
                return ConsumeStatus.RECONSUME_LATER
            order.extend(m.body for m in messages)
            return ConsumeStatus.CONSUME_SUCCESS

        consumer = PushConsumer(
            address,
            config=config("OG", orderly=True, max_reconsume_times=3),
            listener=listener,
        )
        consumer.subscribe(TOPIC)
        async with consumer:
            await eventually(lambda: b"last" in order, timeout_s=20, what="the queue going on")

            async def committed_past() -> bool:
                return await committed(h, "broker-b", "OG", 3) == poison + 2

            await eventually(committed_past, what="the commit past the dead letter")
        # In place, in order: the message after it waited for its last try.
        assert order == [b"first", b"last"]
        assert seen.tries(b"poison") == [(TOPIC, n) for n in range(4)]
        (letter,) = await dead_letters(h, "OG")
        assert letter.body == b"poison" and letter.properties["DLQ_ORIGIN_TOPIC"] == TOPIC
