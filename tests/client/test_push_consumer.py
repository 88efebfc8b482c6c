"""client.PushConsumer against real etcd, store-nodes and pull-services: the
listener sees every message, the group shares the queues without overlap,
commits resume, RECONSUME_LATER retries, orderly keeps order, a reset by time
takes effect before its ack."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

from basalt.admin import ops
from basalt.client import (
    ConsumeFromWhere,
    ConsumeStatus,
    MessageQueue,
    Producer,
    PushConsumer,
    PushConsumerConfig,
    SyncProducer,
    SyncPushConsumer,
)
from basalt.common.message import Message, MessageRecord
from basalt.services.errors import StatusRefusal
from basalt.services.meta import MetaConfig
from basalt.v1 import common_pb2 as pb
from basalt.v1 import pull_service_pb2 as ps
from basalt.v1 import store_node_pb2 as sn
from tests.support.aio import async_test
from tests.support.consumers import (
    assert_committed_at_least,
    assert_one_jump_back,
    every_queue_jumped_back,
    producing,
    send_each,
)
from tests.support.nodes import TOPIC, cluster
from tests.support.polling import eventually, eventually_sync


def config(client_id: str, **kw: object) -> PushConsumerConfig:
    return PushConsumerConfig(
        consumer_group="PG",
        client_id=client_id,
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
        broker_suspend_max_time_ms=500,
        **kw,  # type: ignore[arg-type]
    )


@dataclass
class Log:
    """What the listeners saw: (client, queue, offset, body) and, per queue, the
    intervals each client spent in a call (for the no-overlap check)."""

    seen: list[tuple[str, MessageQueue, int, bytes]] = field(default_factory=list)
    calls: dict[MessageQueue, list[tuple[float, float, str]]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def listener(
        self, client_id: str, pause_s: float = 0.0
    ) -> Callable[[list[MessageRecord], MessageQueue], ConsumeStatus]:
        def listen(messages: list[MessageRecord], queue: MessageQueue) -> ConsumeStatus:
            start = time.monotonic()
            time.sleep(pause_s)
            with self.lock:
                self.seen += [(client_id, queue, m.queue_offset, m.body) for m in messages]
                self.calls.setdefault(queue, []).append((start, time.monotonic(), client_id))
            return ConsumeStatus.CONSUME_SUCCESS

        return listen

    def bodies(self) -> set[bytes]:
        with self.lock:
            return {b for _, _, _, b in self.seen}

    def overlaps(self) -> list[tuple[MessageQueue, str, str]]:
        """Calls of one queue by two clients that overlap in time."""
        out = []
        with self.lock:
            for queue, calls in self.calls.items():
                calls = sorted(calls)
                for (_, end, who), (start, _, other) in itertools.pairwise(calls):
                    if who != other and start < end:
                        out.append((queue, who, other))
        return out


def test_config_is_checked() -> None:
    with pytest.raises(ValueError, match="consumer_group"):
        PushConsumerConfig(consumer_group="")
    with pytest.raises(ValueError, match="pull_batch_size"):
        PushConsumerConfig(consumer_group="G", pull_batch_size=0)
    with pytest.raises(ValueError, match="consume_thread_nums"):
        PushConsumerConfig(consumer_group="G", consume_thread_nums=0)
    assert (
        PushConsumerConfig(consumer_group="G").client_id
        != PushConsumerConfig(consumer_group="G").client_id
    )


@async_test
async def test_a_group_shares_the_queues_without_overlap_and_every_message_is_consumed(
    tmp_path: Path, meta_config: MetaConfig
) -> None:
    async with cluster(tmp_path, meta_config, heartbeat_interval_ms=500) as h:
        address = h.services[0].address
        log = Log()
        async with Producer(address, group="P") as producer:
            bodies = {f"m{i}".encode() for i in range(200)}
            await producer.send_batch([Message(TOPIC, b) for b in sorted(bodies)][:100])
            a = PushConsumer(address, config=config("A"), listener=log.listener("A", 0.001))
            a.subscribe(TOPIC)
            await a.start()
            await eventually(lambda: len(a.assignment()) == 8)
            b = PushConsumer(address, config=config("B"), listener=log.listener("B", 0.001))
            b.subscribe(TOPIC)
            await b.start()
            # A gives half of the queues to B, each released before B takes it.
            await eventually(lambda: len(a.assignment()) == 4 and len(b.assignment()) == 4)
            assert not set(a.assignment()) & set(b.assignment())
            for body in sorted(bodies)[100:]:
                await producer.send(Message(TOPIC, body))
            await eventually(lambda: log.bodies() == bodies)
            await a.close()  # commits and unlocks first: B takes every queue
            await eventually(lambda: len(b.assignment()) == 8)
            await producer.send(Message(TOPIC, b"after"))
            await eventually(lambda: b"after" in log.bodies())
            await b.close()
        assert log.overlaps() == []
        # Everything consumed is committed: nothing is left for the group.
        lag = 0
        for stub in h.node_stubs.values():
            for qid in range(4):
                top = await stub.GetMinMaxOffset(
                    sn.GetMinMaxOffsetRequest(topic=TOPIC, queue_id=qid)
                )
                got = await stub.QueryConsumerOffset(
                    sn.QueryConsumerOffsetRequest(group="PG", topic=TOPIC, queue_id=qid)
                )
                lag += top.max_offset - got.offset
        assert lag == 0


@async_test
async def test_reconsume_later_runs_again_and_orderly_keeps_offset_order(
    tmp_path: Path, meta_config: MetaConfig
) -> None:
    async with cluster(tmp_path, meta_config, heartbeat_interval_ms=500) as h:
        address = h.services[0].address
        await send_each(address, TOPIC, (f"m{i}" for i in range(40)))
        tries: dict[bytes, int] = {}
        order: dict[MessageQueue, list[int]] = {}

        async def listener(messages: list[MessageRecord], queue: MessageQueue) -> ConsumeStatus:
            (m,) = messages
            tries[m.body] = tries.get(m.body, 0) + 1
            if m.body == b"m7" and tries[m.body] < 3:
                return ConsumeStatus.RECONSUME_LATER
            if m.body == b"m9" and tries[m.body] < 2:
                raise RuntimeError("a failing listener counts as RECONSUME_LATER")
            order.setdefault(queue, []).append(m.queue_offset)
            return ConsumeStatus.CONSUME_SUCCESS

        c = PushConsumer(
            address,
            config=config("O", orderly=True, suspend_current_queue_time_ms=10),
            listener=listener,
        )
        c.subscribe(TOPIC)
        async with c:
            await eventually(lambda: sum(len(v) for v in order.values()) == 40)
        assert tries[b"m7"] == 3 and tries[b"m9"] == 2
        for offsets in order.values():
            assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)


@async_test
async def test_reset_offset_command_takes_effect_before_the_ack(
    tmp_path: Path, meta_config: MetaConfig
) -> None:
    async with cluster(tmp_path, meta_config, heartbeat_interval_ms=500) as h:
        address = h.services[0].address
        log = Log()
        async with Producer(address, group="P") as producer:
            await producer.send_batch([Message(TOPIC, f"old{i}".encode()) for i in range(40)])
            consumers = []
            for name in ("R1", "R2", "R3"):
                c = PushConsumer(address, config=config(name), listener=log.listener(name))
                c.subscribe(TOPIC)
                await c.start()
                consumers.append(c)
            await eventually(lambda: sum(len(c.assignment()) for c in consumers) == 8)
            await eventually(lambda: len(log.bodies()) == 40)
            # Mark the point, send more (to every queue, round robin), and reset
            # the group to the point: by RocketMQ's rule the message nearest in
            # time, so the old ones are kept well before it.
            await asyncio.sleep(0.3)
            point_ms = int(time.time() * 1000)
            for i in range(40):
                await producer.send(Message(TOPIC, f"new{i}".encode()))
            await eventually(lambda: len(log.bodies()) == 80)
            with log.lock:
                log.seen.clear()
            outcome = await ops.reset_offset_by_time(h.meta, "PG", TOPIC, point_ms)
        assert outcome.failed == {}
        assert outcome.acks is not None
        assert sorted(a.client_id for a in outcome.acks) == ["R1", "R2", "R3"]
        assert all(a.outcome == ps.COMMAND_OUTCOME_OK for a in outcome.acks), outcome.acks
        reset_to = {MessageQueue.of(o.queue): o.offset for o in outcome.offsets}
        # Every queue is consumed again from exactly its reset point.
        await eventually(
            lambda: (
                {b for b in log.bodies() if b.startswith(b"new")}
                == {f"new{i}".encode() for i in range(40)}
            )
        )
        with log.lock:
            first: dict[MessageQueue, int] = {}
            for _, queue, offset, body in log.seen:
                first[queue] = min(first.get(queue, offset), offset)
                assert not body.startswith(b"old"), "a message from before the point came again"
        for queue, offset in first.items():
            assert offset == reset_to[queue]
        await asyncio.gather(*(c.close() for c in consumers))
        await assert_committed_at_least(h.node_stubs, "PG", reset_to)


@async_test
async def test_reset_under_continuous_production_resumes_every_queue_at_its_reset_point(
    tmp_path: Path, meta_config: MetaConfig
) -> None:
    """Orderly listeners, so each queue's calls are in offset order: after the
    reset each queue's sequence jumps back exactly once, to its reset point,
    which is what SearchOffset gives for the timestamp."""
    async with cluster(tmp_path, meta_config, heartbeat_interval_ms=500) as h:
        address = h.services[0].address
        seen: list[tuple[MessageQueue, int]] = []

        async def listener(messages: list[MessageRecord], queue: MessageQueue) -> ConsumeStatus:
            seen.extend((queue, m.queue_offset) for m in messages)
            return ConsumeStatus.CONSUME_SUCCESS

        consumers = []
        async with producing(address, TOPIC):
            for name in ("R1", "R2", "R3"):
                c = PushConsumer(address, config=config(name, orderly=True), listener=listener)
                c.subscribe(TOPIC)
                await c.start()
                consumers.append(c)
            await eventually(lambda: sum(len(c.assignment()) for c in consumers) == 8)
            await asyncio.sleep(0.6)
            point_ms = int(time.time() * 1000) - 300
            before = len(seen)
            outcome = await ops.reset_offset_by_time(h.meta, "PG", TOPIC, point_ms)
            assert outcome.failed == {} and outcome.acks is not None
            assert [a.outcome for a in outcome.acks] == [ps.COMMAND_OUTCOME_OK] * 3, outcome.acks
            reset_to = {MessageQueue.of(o.queue): o.offset for o in outcome.offsets}
            for queue, offset in reset_to.items():
                search = await h.node_stubs[queue.broker_name].SearchOffset(
                    sn.SearchOffsetRequest(
                        topic=TOPIC, queue_id=queue.queue_id, timestamp_ms=point_ms
                    )
                )
                assert offset == search.offset
            # Production and consumption go on, from the reset points.
            await eventually(lambda: every_queue_jumped_back(seen, reset_to))
        await asyncio.gather(*(c.close() for c in consumers))
        assert {q for q, _ in seen[before:]} == set(reset_to)
        assert_one_jump_back(seen, reset_to)
        await assert_committed_at_least(h.node_stubs, "PG", reset_to)


@async_test
async def test_sync_push_consumer_runs_without_an_event_loop_of_its_own(
    tmp_path: Path, meta_config: MetaConfig
) -> None:
    async with cluster(tmp_path, meta_config, heartbeat_interval_ms=500) as h:
        address = h.services[0].address
        log = Log()

        def blocking() -> None:
            with SyncProducer(address, group="P") as producer:
                producer.send_batch([Message(TOPIC, f"s{i}".encode()) for i in range(20)])
            consumer = SyncPushConsumer(address, config=config("S"), listener=log.listener("S"))
            consumer.subscribe(TOPIC, "*")
            with consumer:
                consumer.start()
                eventually_sync(lambda: len(log.bodies()) >= 20, timeout_s=30)
                assert len(consumer.assignment()) == 8

        await asyncio.to_thread(blocking)
        assert log.bodies() == {f"s{i}".encode() for i in range(20)}


@async_test
async def test_a_lost_session_drops_every_queue_and_the_consumer_comes_back(
    tmp_path: Path, meta_config: MetaConfig
) -> None:
    async with cluster(tmp_path, meta_config, heartbeat_interval_ms=500) as h:
        address = h.services[0].address
        log = Log()
        c = PushConsumer(address, config=config("L"), listener=log.listener("L"))
        c.subscribe(TOPIC)
        async with c, producing(address, TOPIC):
            await eventually(lambda: len(c.assignment()) == 8 and len(log.bodies()) > 20)
            # The service ends every session (as when it stops): the locks go
            # with the session's lease, so the consumer lets every queue go...
            before = list(c._queues.values())  # held: their ids stay unique
            await h.services[0].servicer.sessions.close_all(
                StatusRefusal(
                    grpc.StatusCode.UNAVAILABLE, pb.RESPONSE_CODE_SERVICE_NOT_AVAILABLE, "bye"
                ),
                5,
            )
            # ...then opens a new session, locks them again and goes on, each
            # queue in a new ProcessQueue.
            await eventually(
                lambda: (
                    len(c._queues) == 8
                    and not {id(pq) for pq in c._queues.values()} & {id(pq) for pq in before}
                )
            )
            seen = len(log.bodies())
            await eventually(lambda: len(log.bodies()) > seen + 20)
        owners = await h.meta.queue_lock_owners("PG")
        assert owners == {}  # closed: every lock released


def test_retry_delays_double_and_stay_capped_however_long_the_failures_go_on() -> None:
    c = PushConsumerConfig(consumer_group="G", pull_time_delay_ms_when_exception=100)
    assert [c.retry_delay_s(n) for n in (1, 2, 3, 4, 5, 6)] == [0.1, 0.2, 0.4, 0.8, 1.6, 3.0]
    assert c.retry_delay_s(10_000) == 3.0  # an hours-long outage: no float overflow
