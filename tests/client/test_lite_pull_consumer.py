"""client.LitePullConsumer (assign mode) against real etcd, store-nodes and a
pull-service, fed by client.Producer."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from basalt.admin import ops
from basalt.client import (
    ClientError,
    LitePullConfig,
    LitePullConsumer,
    MessageQueue,
    Producer,
    SubscriptionError,
    SyncLitePullConsumer,
    SyncProducer,
    TopicNotFoundError,
)
from basalt.common.message import Message
from basalt.services.meta import MetaConfig
from basalt.v1 import common_pb2 as pb
from basalt.v1 import pull_service_pb2 as ps
from basalt.v1 import store_node_pb2 as sn
from tests.support.aio import async_test
from tests.support.consumers import lite_pull_config as config
from tests.support.consumers import send_each
from tests.support.nodes import TOPIC, cluster
from tests.support.polling import eventually


def test_config_is_checked() -> None:
    with pytest.raises(ValueError, match="consumer_group"):
        LitePullConfig(consumer_group="")
    with pytest.raises(ValueError, match="pull_batch_size"):
        LitePullConfig(consumer_group="G", pull_batch_size=0)


@async_test
async def test_poll_reads_every_assigned_queue_commit_resumes_seek_and_filters(
    tmp_path: Path, meta_config: MetaConfig
) -> None:
    async with cluster(tmp_path, meta_config) as h:
        address = h.services[0].address
        async with Producer(address, group="P") as producer:
            sent = [
                await producer.send(Message(TOPIC, f"m{i}".encode(), tags="A" if i % 2 else "B"))
                for i in range(40)
            ]
        async with LitePullConsumer(address, config=config(pull_batch_size=4)) as consumer:
            queues = await consumer.queues_of(TOPIC)
            assert len(queues) == 8 and queues[0] == MessageQueue(TOPIC, "broker-a", 0)
            await consumer.assign(queues[:6])  # not the last two queues of broker-b
            got: list[bytes] = []
            while polled := await consumer.poll(timeout_ms=200):
                got += [r.body for r in polled]
            mine = {(q.broker_name, q.queue_id) for q in queues[:6]}
            expected = [r for r in sent if (r.broker_name, r.queue_id) in mine]
            assert sorted(got) == sorted(
                f"m{i}".encode() for i, r in enumerate(sent) if r in expected
            )
            # Offsets are committed at close.
        async with LitePullConsumer(address, config=config()) as again:
            await again.assign(queues[:6])
            assert await again.poll(timeout_ms=100) == []  # resumes where the first stopped
            again.seek(queues[0], 0)
            replay = await again.poll(timeout_ms=100)
            assert [r.queue_id for r in replay] == [0] * len(replay) and replay
            committed = await h.node_stubs["broker-a"].QueryConsumerOffset(
                sn.QueryConsumerOffsetRequest(group="LG", topic=TOPIC, queue_id=1)
            )
            assert committed.offset == 5  # 40 sends over 8 queues
        tagged = LitePullConsumer(address, config=config(subscription="A"))
        async with tagged:
            await tagged.assign(await tagged.queues_of(TOPIC))
            bodies = [r.body for r in await tagged.poll(timeout_ms=100)]
            assert bodies and all(int(b[1:]) % 2 == 1 for b in bodies)
        bad = LitePullConsumer(address, config=config(subscription="a >", sql92=True))
        async with bad:
            with pytest.raises(ClientError, match="SUBSCRIPTION_PARSE_FAILED"):
                await bad.assign(await bad.queues_of(TOPIC))
                await bad.poll(timeout_ms=10_000)  # the first fetch's refusal
            with pytest.raises(ClientError, match="TOPIC_NOT_EXIST"):
                await bad.queues_of("NoSuchTopic")


@async_test
async def test_poll_waits_for_a_message_that_arrives(
    tmp_path: Path, meta_config: MetaConfig
) -> None:
    async with cluster(tmp_path, meta_config) as h:
        address = h.services[0].address
        async with LitePullConsumer(address, config=config()) as consumer:
            await consumer.assign(await consumer.queues_of(TOPIC))
            polling = asyncio.ensure_future(consumer.poll(timeout_ms=20_000))
            await asyncio.sleep(0.3)
            assert not polling.done()
            await h.send("broker-b", 2, b"late")
            got = await asyncio.wait_for(polling, 10)
            assert [r.body for r in got] == [b"late"]


@async_test
async def test_the_blocking_wrappers_send_and_poll_from_plain_threads(
    tmp_path: Path, meta_config: MetaConfig
) -> None:
    async with cluster(tmp_path, meta_config) as h:
        address = h.services[0].address

        def blocking() -> tuple[list[int], list[bytes]]:
            with SyncProducer(address, group="P") as producer:
                offsets = [producer.send(Message(TOPIC, b"s%d" % i)).queue_offset for i in range(4)]
                batch = producer.send_batch([Message(TOPIC, b"b"), Message(TOPIC, b"c")])
                offsets += [r.queue_offset for r in batch]
                assert producer.send_async(Message(TOPIC, b"f")).result(10).ok
            with SyncLitePullConsumer(address, config=config()) as consumer:
                consumer.assign(consumer.queues_of(TOPIC))
                bodies: list[bytes] = []
                while records := consumer.poll(timeout_ms=200):
                    bodies += [r.body for r in records]
            return offsets, bodies

        # The cluster serves on this loop: the blocking code runs on a thread.
        offsets, bodies = await asyncio.to_thread(blocking)
        assert len(offsets) == 6
        assert sorted(bodies) == sorted([b"s0", b"s1", b"s2", b"s3", b"b", b"c", b"f"])


@async_test
async def test_a_cancelled_session_call_is_opened_again_and_close_still_ends_cleanly(
    tmp_path: Path, meta_config: MetaConfig
) -> None:
    """grpc.aio raises CancelledError (not an RpcError) from a read on a cancelled
    call: the session must come back, not end the member's session task."""
    async with cluster(tmp_path, meta_config, heartbeat_interval_ms=500) as h:
        address = h.services[0].address
        consumer = LitePullConsumer(address, config=config(client_id="A"))
        consumer.subscribe(TOPIC)
        async with consumer:
            member = consumer._member
            assert member is not None

            async def owns_all() -> bool:
                return len(consumer.assignment()) == 8

            await eventually(owns_all)
            first = member._call
            assert first is not None
            first.cancel()

            async def reopened() -> bool:
                return member.session_up.is_set() and member._call is not first

            await eventually(reopened)
            assert member._session_task is not None and not member._session_task.done()
            await send_each(address, TOPIC, ["after"])
            await eventually(owns_all)
            got: list[bytes] = []
            for _ in range(20):
                got += [r.body for r in await consumer.poll(timeout_ms=50)]
                if got:
                    break
            assert got == [b"after"]
        assert member._session_task.done() and not member._session_task.cancelled()


@async_test
async def test_subscribe_mode_shares_the_queues_with_the_group_and_follows_a_reset(
    tmp_path: Path, meta_config: MetaConfig
) -> None:
    async with cluster(tmp_path, meta_config, heartbeat_interval_ms=500) as h:
        address = h.services[0].address
        await send_each(address, TOPIC, (f"m{i}" for i in range(40)))
        a = LitePullConsumer(address, config=config(client_id="A"))
        a.subscribe(TOPIC)
        b = LitePullConsumer(address, config=config(client_id="B"))
        b.subscribe(TOPIC)
        with pytest.raises(RuntimeError, match="subscribing"):
            await b.assign([MessageQueue(TOPIC, "broker-a", 0)])
        got: dict[str, list[bytes]] = {"A": [], "B": []}
        async with a, b:

            async def shared() -> bool:
                return len(a.assignment()) == len(b.assignment()) == 4

            await eventually(shared)
            assert not set(a.assignment()) & set(b.assignment())
            for _ in range(20):
                got["A"] += [r.body for r in await a.poll(timeout_ms=50)]
                got["B"] += [r.body for r in await b.poll(timeout_ms=50)]
            assert sorted(got["A"] + got["B"]) == sorted(f"m{i}".encode() for i in range(40))
            assert got["A"] and got["B"]
            # A reset to the start reaches both through their sessions.
            outcome = await ops.reset_offset_by_time(h.meta, "LG", TOPIC, 0)
            assert [x.outcome for x in outcome.acks or []] == [ps.COMMAND_OUTCOME_OK] * 2
            again = [r.body for r in await a.poll(timeout_ms=200)]
            again += [r.body for r in await b.poll(timeout_ms=200)]
            assert again
        # Both left; their last positions were committed as they gave the queues up.
        async with LitePullConsumer(address, config=config(client_id="C")) as c:
            await c.assign(await c.queues_of(TOPIC))
            left = await c.poll(timeout_ms=100)
        assert len(left) == 40 - len(again)


@async_test
async def test_refusals_reach_the_user_as_their_typed_errors(
    tmp_path: Path, meta_config: MetaConfig
) -> None:
    async with cluster(tmp_path, meta_config) as h:
        bad = LitePullConsumer(h.services[0].address, config=config(subscription="a >", sql92=True))
        async with bad:
            # QueryRoute's refusal, read from its basalt-response-code trailer.
            with pytest.raises(TopicNotFoundError) as unknown:
                await bad.queues_of("NoSuchTopic")
            assert unknown.value.code == pb.RESPONSE_CODE_TOPIC_NOT_EXIST
            assert isinstance(unknown.value, LookupError)
            # A PullBatch entry the pull-service refused, raised by the next poll.
            await bad.assign(await bad.queues_of(TOPIC))
            with pytest.raises(SubscriptionError, match="position") as unparsed:
                await bad.poll(timeout_ms=10_000)
            assert unparsed.value.code == pb.RESPONSE_CODE_SUBSCRIPTION_PARSE_FAILED
