"""Long polling (PullRequestHoldService) against a real store and real threads."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

from basalt.services.store_node.long_polling import HeldRead, PullRequestHoldService
from basalt.store import Message, MessageStore
from basalt.store.get_message import GetMessageResult, GetStatus
from basalt.store.message_filter import build_filter
from tests.support.polling import eventually

TOPIC = "Held"


def pull_of(store: MessageStore, tags: str = "*"):  # type: ignore[no-untyped-def]
    flt = build_filter("TAG", tags)

    def pull(offset: int) -> GetMessageResult:
        return store.get_message("G", TOPIC, 0, offset, 32, flt)

    return pull


async def held_pull(
    store: MessageStore,
    service: PullRequestHoldService,
    offset: int,
    timeout_s: float,
    tags: str = "*",
) -> GetMessageResult:
    (result,) = await service.hold([read(store, 0, offset, pull_of(store, tags))], timeout_s)
    return result


def read(
    store: MessageStore, queue_id: int, offset: int, pull: Callable[[int], GetMessageResult]
) -> HeldRead[GetMessageResult]:
    """A held read of ``queue_id`` answering once it found something."""
    return HeldRead(
        topic=TOPIC,
        queue_id=queue_id,
        offset=offset,
        pull=pull,
        found=lambda r: r.status is GetStatus.FOUND,
        next_offset=lambda r: r.next_begin_offset,
        max_offset=lambda: store.get_max_offset_in_queue(TOPIC, queue_id),
    )


def test_a_held_pull_returns_the_message_sent_after_it(store: MessageStore) -> None:
    async def scenario() -> tuple[GetMessageResult, float, int]:
        loop = asyncio.get_running_loop()
        service = PullRequestHoldService(loop)
        store.add_arrival_listener(service.notify_arrival)
        started = loop.time()
        pending = asyncio.ensure_future(held_pull(store, service, 0, 30.0))
        await eventually(lambda: service.held == 1)
        # Sent from another thread, as a store-node's writer would.
        sender = threading.Thread(
            target=lambda: store.put_message(Message(TOPIC, b"late", tags="t"))
        )
        sender.start()
        result = await pending
        sender.join()
        return result, loop.time() - started, service.held

    result, _, held_after = asyncio.run(scenario())
    assert result.status is GetStatus.FOUND
    assert [r.body for r in result.decode()] == [b"late"]
    assert held_after == 0


def test_a_pull_with_no_arrival_returns_empty_at_its_timeout(store: MessageStore) -> None:
    async def scenario() -> tuple[GetMessageResult, float]:
        loop = asyncio.get_running_loop()
        service = PullRequestHoldService(loop)
        store.add_arrival_listener(service.notify_arrival)
        started = loop.time()
        result = await held_pull(store, service, 0, 0.3)
        return result, loop.time() - started

    result, waited = asyncio.run(scenario())
    assert result.message_count == 0
    assert result.status in (GetStatus.NO_MATCHED_LOGIC_QUEUE, GetStatus.NO_MESSAGE_IN_QUEUE)
    assert waited >= 0.3  # it really was held (a lower bound, not a timing assertion)


def test_an_arrival_that_does_not_match_the_filter_keeps_the_pull_held(
    store: MessageStore,
) -> None:
    async def scenario() -> GetMessageResult:
        loop = asyncio.get_running_loop()
        service = PullRequestHoldService(loop)
        store.add_arrival_listener(service.notify_arrival)
        pending = asyncio.ensure_future(held_pull(store, service, 0, 30.0, tags="wanted"))
        await eventually(lambda: service.held == 1)
        await loop.run_in_executor(None, store.put_message, Message(TOPIC, b"no", tags="other"))
        await asyncio.sleep(0.1)
        assert not pending.done()
        assert service.held == 1
        await loop.run_in_executor(None, store.put_message, Message(TOPIC, b"yes", tags="wanted"))
        return await pending

    result = asyncio.run(scenario())
    assert [r.body for r in result.decode()] == [b"yes"]
    assert result.next_begin_offset == 2


def test_an_arrival_just_before_parking_is_not_missed(store: MessageStore) -> None:
    """The queue grows between the pull and the park: no wake-up is sent (nothing
    was held yet), and the pull must still return at once, not at its timeout."""

    async def scenario() -> GetMessageResult:
        loop = asyncio.get_running_loop()
        service = PullRequestHoldService(loop)
        store.add_arrival_listener(service.notify_arrival)
        sent = False

        def pull(offset: int) -> GetMessageResult:
            nonlocal sent
            result = store.get_message("G", TOPIC, 0, offset, 32)
            if not sent:
                sent = True
                assert store.put_message(Message(TOPIC, b"racing")).ok
            return result

        (result,) = await asyncio.wait_for(service.hold([read(store, 0, 0, pull)], 60.0), 10.0)
        return result

    result = asyncio.run(scenario())
    assert [r.body for r in result.decode()] == [b"racing"]


def test_many_held_pulls_on_many_queues_wake_only_where_messages_arrive(
    store: MessageStore,
) -> None:
    async def scenario() -> tuple[list[int], int]:
        loop = asyncio.get_running_loop()
        service = PullRequestHoldService(loop)
        store.add_arrival_listener(service.notify_arrival)

        async def one(queue_id: int) -> int:
            (result,) = await service.hold(
                [
                    read(
                        store,
                        queue_id,
                        0,
                        lambda off: store.get_message("G", TOPIC, queue_id, off, 32),
                    )
                ],
                1.0,
            )
            return result.message_count

        tasks = [asyncio.ensure_future(one(q)) for q in range(50)]
        await eventually(lambda: service.held == 50)
        for q in range(0, 50, 10):
            await loop.run_in_executor(None, store.put_message, Message(TOPIC, b"x", queue_id=q))
        counts = await asyncio.gather(*tasks)
        return list(counts), service.woken_by_arrival

    counts, woken = asyncio.run(scenario())
    assert counts == [1 if q % 10 == 0 else 0 for q in range(50)]
    assert woken == 5


def test_one_call_held_on_several_queues_wakes_on_an_arrival_on_any(store: MessageStore) -> None:
    async def scenario() -> tuple[list[int], int, int]:
        loop = asyncio.get_running_loop()
        service = PullRequestHoldService(loop)
        store.add_arrival_listener(service.notify_arrival)
        reads = [
            read(store, q, 0, lambda off, q=q: store.get_message("G", TOPIC, q, off, 32))
            for q in (0, 1, 2)
        ]
        pending = asyncio.ensure_future(service.hold(reads, 30.0))
        await eventually(lambda: service.held >= 1)
        held = service.held  # one call, parked under three queues
        await loop.run_in_executor(None, store.put_message, Message(TOPIC, b"x", queue_id=1))
        results = await asyncio.wait_for(pending, 10.0)
        return [r.message_count for r in results], held, service.held

    counts, held, after = asyncio.run(scenario())
    assert counts == [0, 1, 0]
    assert (held, after) == (1, 0)
