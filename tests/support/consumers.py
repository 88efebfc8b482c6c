"""What the consumer tests share: the LitePullConsumer config they start from, a
producer that keeps sending, and the checks of a reset's effect on what
consumers saw and committed."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator, Hashable, Iterable, Mapping
from typing import Any, TypeVar

from basalt.client import ConsumeFromWhere, LitePullConfig, MessageQueue, Producer
from basalt.common.message import Message
from basalt.v1 import store_node_pb2 as sn
from basalt.v1 import store_node_pb2_grpc as sn_grpc

Q = TypeVar("Q", bound=Hashable)


def lite_pull_config(group: str = "LG", **kw: Any) -> LitePullConfig:
    """``group`` from the first offset; ``kw`` sets the rest."""
    return LitePullConfig(
        consumer_group=group, consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET, **kw
    )


@contextlib.asynccontextmanager
async def producing(
    address: str, topic: str, *, acked: set[str] | None = None, pause_s: float = 0.002
) -> AsyncIterator[None]:
    """Send ``m0``, ``m1``, ... to ``topic`` one at a time until the block ends
    (adding each acknowledged body to ``acked``); a send that fails fails the block."""
    stop = asyncio.Event()

    async def run() -> None:
        async with Producer(address, group="P") as producer:
            for i in itertools.count():
                if stop.is_set():
                    return
                await producer.send(Message(topic, f"m{i}".encode()))
                if acked is not None:
                    acked.add(f"m{i}")
                await asyncio.sleep(pause_s)

    task = asyncio.ensure_future(run())
    try:
        yield
    finally:
        stop.set()
        await task


async def send_each(address: str, topic: str, bodies: Iterable[str]) -> None:
    """Send each of ``bodies`` on its own (round robin over the writable queues)."""
    async with Producer(address, group="P") as producer:
        for body in bodies:
            await producer.send(Message(topic, body.encode()))


def _offsets_by_queue(calls: Iterable[tuple[Q, int]]) -> dict[Q, list[int]]:
    by_queue: dict[Q, list[int]] = {}
    for queue, offset in calls:
        by_queue.setdefault(queue, []).append(offset)
    return by_queue


def _jumps_back(offsets: list[int]) -> list[int]:
    """The offsets that are not above the one before them."""
    return [b for a, b in itertools.pairwise(offsets) if b <= a]


def every_queue_jumped_back(calls: Iterable[tuple[Q, int]], queues: Iterable[Q]) -> bool:
    """Whether each of ``queues`` went back at least once in ``calls``, (queue,
    offset) in call order: after a reset, whether consumption resumed from the
    reset points everywhere (what :func:`assert_one_jump_back` then checks)."""
    by_queue = _offsets_by_queue(calls)
    return all(_jumps_back(by_queue.get(queue, [])) for queue in queues)


def assert_one_jump_back(calls: Iterable[tuple[Q, int]], reset_to: Mapping[Q, int]) -> None:
    """``calls`` are (queue, offset) in call order, of orderly listeners: every
    queue's offsets only go up (a queue changes hands at its committed offset)
    except one jump back, the reset, to exactly the queue's reset point."""
    by_queue = _offsets_by_queue(calls)
    assert set(by_queue) == set(reset_to)
    for queue, offsets in by_queue.items():
        assert _jumps_back(offsets) == [reset_to[queue]], (queue, offsets)


async def assert_committed_at_least(
    stubs: Mapping[str, sn_grpc.StoreNodeAsyncStub],
    group: str,
    reset_to: Mapping[MessageQueue, int],
) -> None:
    """The epoch fence: no commit of ``group`` below its reset points landed."""
    for queue, offset in reset_to.items():
        got = await stubs[queue.broker_name].QueryConsumerOffset(
            sn.QueryConsumerOffsetRequest(group=group, topic=queue.topic, queue_id=queue.queue_id)
        )
        assert got.offset >= offset, queue
