"""PullService.LockQueues / UnlockQueues: queue locks bound to the consumer
session's lease, against real etcd and a real pull-service; and the
RebalanceCommand a membership change pushes to the group's other sessions."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest

from basalt.common.status import response_code_of
from basalt.services.meta import MetaConfig
from basalt.v1 import common_pb2 as pb
from basalt.v1 import pull_service_pb2 as ps
from tests.support.aio import async_test
from tests.support.nodes import TOPIC, cluster
from tests.support.polling import eventually
from tests.support.sessions import Consumer


def q(queue_id: int, broker: str = "broker-a") -> pb.MessageQueue:
    return pb.MessageQueue(topic=TOPIC, broker_name=broker, queue_id=queue_id)


def ids(queues: object) -> list[int]:
    return [m.queue_id for m in queues]  # type: ignore[attr-defined]


@async_test
async def test_locks_are_exclusive_released_by_owner_and_freed_with_the_session(
    tmp_path: Path, meta_config: MetaConfig
) -> None:
    async with cluster(tmp_path, meta_config) as h:
        a, b = Consumer(h.stub, "A"), Consumer(h.stub, "B")
        await a.open()
        await b.open()

        async def lock(who: str, *queues: pb.MessageQueue) -> list[int]:
            got = await h.stub.LockQueues(
                ps.LockQueuesRequest(group="G", client_id=who, queues=queues)
            )
            return ids(got.locked)

        assert await lock("A", q(0), q(1)) == [0, 1]
        assert await lock("B", q(1), q(2)) == [2]  # 1 is A's
        assert await lock("A", q(0), q(2)) == [0]  # again: still A's; 2 is B's
        owners = await h.meta.queue_lock_owners("G")
        assert owners == {(TOPIC, "broker-a", 0): "A", (TOPIC, "broker-a", 1): "A",
                          (TOPIC, "broker-a", 2): "B"}  # fmt: skip

        # Only the owner releases; an unlocked queue is left as it is.
        got = await h.stub.UnlockQueues(
            ps.UnlockQueuesRequest(group="G", client_id="B", queues=[q(0), q(2), q(3)])
        )
        assert ids(got.unlocked) == [2]
        assert await lock("B", q(2)) == [2]

        # A's session vanishes (a killed consumer): its locks go with its lease.
        await a.cancel()

        async def a_freed() -> bool:
            return set((await h.meta.queue_lock_owners("G")).values()) == {"B"}

        await eventually(a_freed)
        assert await lock("B", q(0), q(1)) == [0, 1]
        await b.close()


@async_test
async def test_bad_lock_requests_are_refused_and_the_service_keeps_serving(
    tmp_path: Path, meta_config: MetaConfig
) -> None:
    async with cluster(tmp_path, meta_config) as h:

        async def refused(request: ps.LockQueuesRequest) -> tuple[grpc.StatusCode, int | None]:
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await h.stub.LockQueues(request)
            return e.value.code(), response_code_of(e.value)

        # No session here: the lock would have no lease to live under.
        assert await refused(ps.LockQueuesRequest(group="G", client_id="X", queues=[q(0)])) == (
            grpc.StatusCode.NOT_FOUND,
            pb.RESPONSE_CODE_CONSUMER_NOT_ONLINE,
        )
        c = Consumer(h.stub, "C")
        await c.open()
        for bad in (
            ps.LockQueuesRequest(group="", client_id="C", queues=[q(0)]),
            ps.LockQueuesRequest(group="G", client_id="C", queues=[q(-1)]),
            ps.LockQueuesRequest(group="G", client_id="C", queues=[q(0, broker="a/b")]),
            ps.LockQueuesRequest(
                group="G",
                client_id="C",
                queues=[pb.MessageQueue(topic="bad topic!", broker_name="b", queue_id=0)],
            ),
            ps.LockQueuesRequest(group="G", client_id="C", queues=[q(i) for i in range(1025)]),
        ):
            assert await refused(bad) == (
                grpc.StatusCode.INVALID_ARGUMENT,
                pb.RESPONSE_CODE_INVALID_PARAMETER,
            ), bad
        got = await h.stub.LockQueues(ps.LockQueuesRequest(group="G", client_id="C", queues=[q(0)]))
        assert ids(got.locked) == [0]
        await c.close()


@async_test
async def test_a_member_joining_or_leaving_makes_the_others_rebalance(
    tmp_path: Path, meta_config: MetaConfig
) -> None:
    async with cluster(tmp_path, meta_config, pull_services=("ps-1", "ps-2")) as h:
        a = Consumer(h.stubs[0], "A")
        await a.open()
        b = Consumer(h.stubs[1], "B")  # on the other pull-service: seen through etcd
        await b.open()

        def rebalances(c: Consumer) -> int:
            return sum(1 for m in c.rebalances if m.WhichOneof("body") == "rebalance")

        async def a_told(n: int) -> bool:
            return rebalances(a) >= n

        await eventually(lambda: a_told(1))
        await b.cancel()
        await eventually(lambda: a_told(2))
        assert rebalances(b) == 0  # its own arrival is not news to it
        # A topic whose read queues change makes its subscribers rebalance.
        sub = Consumer(h.stubs[0], "S")
        await sub.open(pb.TopicSubscription(topic=TOPIC, subscription=pb.Subscription()))
        await h.update_topic(TOPIC, read_queue_nums=2)

        async def sub_told() -> bool:
            return any(list(m.rebalance.topics) == [TOPIC] for m in sub.rebalances)

        await eventually(sub_told)
        await asyncio.gather(a.close(), sub.close())
