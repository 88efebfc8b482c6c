"""client.LitePullConsumer's prefetch (RocketMQ's consumeRequestCache) against real
etcd, store-nodes and a pull-service: what is buffered is never what poll
returned, commits store only the latter, and a seek or a reset drops the former."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from basalt.admin import ops
from basalt.client import ClientError, LitePullConsumer, MessageQueue
from basalt.common.message import MessageRecord
from basalt.common.record import decode_records
from basalt.services.meta import MetaConfig
from basalt.v1 import common_pb2 as pb
from basalt.v1 import pull_service_pb2 as ps
from basalt.v1 import store_node_pb2 as sn
from tests.support.aio import async_test
from tests.support.consumers import lite_pull_config as config
from tests.support.nodes import TOPIC, Harness, cluster
from tests.support.polling import eventually


def buffered(consumer: LitePullConsumer) -> dict[MessageQueue, list[int]]:
    """The offsets fetched and not yet returned, by queue (the consumer's insides:
    records decoded, then pulls not yet decoded)."""
    return {
        q: [r.queue_offset for r in read.records]
        + [r.queue_offset for data, _, _ in read.chunks for r in decode_records(data)]
        for q, read in consumer._reads.items()
    }


def offsets(records: list[MessageRecord]) -> dict[int, list[int]]:
    by_queue: dict[int, list[int]] = {}
    for r in records:
        by_queue.setdefault(r.queue_id, []).append(r.queue_offset)
    return by_queue


async def fill(h: Harness, broker: str, queue_ids: range, n: int) -> None:
    """``n`` messages on each of ``broker``'s ``queue_ids``, bodies ``<queue>-<i>``."""
    for q in queue_ids:
        for i in range(n):
            await h.send(broker, q, f"{q}-{i}".encode())


async def committed(h: Harness, queue: MessageQueue) -> int:
    got = await h.node_stubs[queue.broker_name].QueryConsumerOffset(
        sn.QueryConsumerOffsetRequest(group="LG", topic=queue.topic, queue_id=queue.queue_id)
    )
    return got.offset


@async_test
async def test_commit_and_close_store_what_poll_returned_not_what_was_prefetched(
    tmp_path: Path, meta_config: MetaConfig
) -> None:
    async with cluster(tmp_path, meta_config) as h:
        address = h.services[0].address
        await fill(h, "broker-a", range(4), 5)
        queues = [MessageQueue(TOPIC, "broker-a", q) for q in range(4)]
        consumer = LitePullConsumer(address, config=config(pull_batch_size=4))
        async with consumer:
            await consumer.assign(queues)

            async def all_fetched() -> bool:
                return sum(map(len, buffered(consumer).values())) == 20

            await eventually(all_fetched)
            returned = await consumer.poll(timeout_ms=1000, max_records=7)
            assert len(returned) == 7
            for q in queues:  # each queue's returned records: a prefix, in order
                mine = offsets(returned).get(q.queue_id, [])
                assert mine == list(range(len(mine)))
                assert consumer.position(q) == len(mine)
                assert buffered(consumer)[q] == list(range(len(mine), 5))
            await consumer.commit()
            for q in queues:
                assert await committed(h, q) == consumer.position(q)
            returned += await consumer.poll(timeout_ms=1000, max_records=3)
            assert len(returned) == 10
            # Closing commits the 10 returned, not the 10 still buffered.
        for q in queues:
            assert await committed(h, q) == len(offsets(returned).get(q.queue_id, []))
        async with LitePullConsumer(address, config=config()) as again:
            await again.assign(queues)
            rest: list[MessageRecord] = []
            while polled := await again.poll(timeout_ms=300):
                rest += polled
        bodies = sorted(r.body for r in returned + rest)
        assert bodies == sorted(f"{q}-{i}".encode() for q in range(4) for i in range(5))


@async_test
async def test_seek_drops_what_was_buffered(tmp_path: Path, meta_config: MetaConfig) -> None:
    async with cluster(tmp_path, meta_config) as h:
        await fill(h, "broker-b", range(1, 2), 5)
        q = MessageQueue(TOPIC, "broker-b", 1)
        async with LitePullConsumer(h.services[0].address, config=config()) as consumer:
            await consumer.assign([q])

            async def fetched() -> bool:
                return buffered(consumer)[q] == [0, 1, 2, 3, 4]

            await eventually(fetched)
            consumer.seek(q, 3)  # forward, past buffered records
            assert consumer.position(q) == 3 and buffered(consumer)[q] == []
            assert [r.queue_offset for r in await consumer.poll(timeout_ms=5000)] == [3, 4]
            consumer.seek(q, 1)  # back, to records poll returned before
            assert [r.queue_offset for r in await consumer.poll(timeout_ms=5000)] == [1, 2, 3, 4]
            # From a plain thread (SyncLitePullConsumer's way): applied on the loop.
            await asyncio.to_thread(consumer.seek, q, 2)
            assert [r.queue_offset for r in await consumer.poll(timeout_ms=5000)] == [2, 3, 4]


@async_test
async def test_a_queues_buffer_holds_at_most_pull_threshold_for_queue_records(
    tmp_path: Path, meta_config: MetaConfig
) -> None:
    async with cluster(tmp_path, meta_config) as h:
        await fill(h, "broker-a", range(1), 10)
        q = MessageQueue(TOPIC, "broker-a", 0)
        settings = config(pull_batch_size=4, pull_threshold_for_queue=3)
        async with LitePullConsumer(h.services[0].address, config=settings) as consumer:
            await consumer.assign([q])

            async def full_and_left_out() -> bool:
                read = consumer._reads[q]
                return buffered(consumer)[q] == [0, 1, 2] and not read.in_flight

            # A fetch asks for no more than the room left (3 of the 4), then the
            # queue is left out of the fetches until poll drains it.
            await eventually(full_and_left_out)
            assert [r.queue_offset for r in await consumer.poll(max_records=2)] == [0, 1]
            # [2] left: no room for a fetch of 3 yet, so still no fetch.
            assert buffered(consumer)[q] == [2] and not consumer._reads[q].in_flight
            assert [r.queue_offset for r in await consumer.poll(timeout_ms=0)] == [2]
            got = [0, 1, 2]
            while len(got) < 10:
                records = await consumer.poll(timeout_ms=5000, max_records=2)
                assert records and len(buffered(consumer)[q]) <= 3
                got += [r.queue_offset for r in records]
            assert got == list(range(10))


@async_test
async def test_after_a_reset_poll_returns_nothing_fetched_before_it(
    tmp_path: Path, meta_config: MetaConfig
) -> None:
    async with cluster(tmp_path, meta_config, heartbeat_interval_ms=500) as h:
        await fill(h, "broker-a", range(4), 5)
        await fill(h, "broker-b", range(4), 5)
        consumer = LitePullConsumer(h.services[0].address, config=config(client_id="A"))
        consumer.subscribe(TOPIC)
        async with consumer:

            async def owns_all() -> bool:
                return len(consumer.assignment()) == 8

            await eventually(owns_all)
            returned = await consumer.poll(timeout_ms=5000, max_records=4)

            async def all_fetched() -> bool:
                return sum(map(len, buffered(consumer).values())) + len(returned) == 40

            await eventually(all_fetched)
            # To the end of every queue (-1: the max offsets): the 36 buffered predate it.
            outcome = await ops.reset_offset_by_time(h.meta, "LG", TOPIC, -1)
            assert [x.outcome for x in outcome.acks or []] == [ps.COMMAND_OUTCOME_OK]
            assert not any(buffered(consumer).values())
            assert await consumer.poll(timeout_ms=300) == []
            await h.send("broker-b", 2, b"late")
            late = await consumer.poll(timeout_ms=10_000)
            assert [(r.body, r.queue_offset) for r in late] == [(b"late", 5)]
        # Leaving, it committed the reset's offsets and what came after.
        for broker in ("broker-a", "broker-b"):
            for queue_id in range(4):
                queue = MessageQueue(TOPIC, broker, queue_id)
                expected = 6 if (broker, queue_id) == ("broker-b", 2) else 5
                assert await committed(h, queue) == expected


@async_test
async def test_assign_mode_a_refused_queue_fails_one_poll_and_the_others_go_on(
    tmp_path: Path, meta_config: MetaConfig
) -> None:
    async with cluster(tmp_path, meta_config) as h:
        good, gone = MessageQueue(TOPIC, "broker-a", 0), MessageQueue(TOPIC, "broker-a", 3)
        # A long pause after the refusal: the gone queue is not asked again here.
        settings = config(pull_time_delay_ms_when_exception=60_000)
        async with LitePullConsumer(h.services[0].address, config=settings) as consumer:
            await consumer.assign([good, gone])
            await h.update_topic(TOPIC, read_queue_nums=2)  # queue 3 is no longer readable
            await h.seen(lambda s: s.servicer.view.topics.get(TOPIC).read_queue_nums == 2)
            # The consumer reads the store-node directly: its cache decides the refusal.
            topics = h.nodes["broker-a"].servicer.topics
            await eventually(
                lambda: topics.topic(TOPIC).read_queue_nums == 2, what="the node sees 2 queues"
            )
            await fill(h, "broker-a", range(1), 3)  # ends the long poll in flight
            got: list[tuple[int, int]] = []
            errors: list[ClientError] = []
            for _ in range(10):
                try:
                    got += [(r.queue_id, r.queue_offset) for r in await consumer.poll(10_000)]
                except ClientError as e:
                    errors.append(e)
                if len(got) == 3 and errors:
                    break
            assert len(errors) == 1 and errors[0].code == pb.RESPONSE_CODE_INVALID_PARAMETER
            assert errors[0].message.startswith(f"{gone}: queue id 3 is out of range")
            assert got == [(0, 0), (0, 1), (0, 2)]  # the other queue's records: not lost
            await consumer.assign([good])  # (the store-node refuses a commit of queue 3)


def test_the_prefetch_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="pull_threshold_for_queue"):
        config(pull_threshold_for_queue=0)
    with pytest.raises(ValueError, match="broker_suspend_max_time_ms"):
        config(broker_suspend_max_time_ms=-1)
