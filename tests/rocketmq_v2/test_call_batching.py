"""basalt.services.rocketmq_v2.call_batching: concurrent submits of a key join one call."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from basalt.services.rocketmq_v2 import call_batching
from basalt.services.rocketmq_v2.call_batching import Coalescer


class Recorder:
    """A call that records what it was given and answers each item doubled,
    held until ``release`` is set."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[int], Any]] = []
        self.release = asyncio.Event()
        self.fail: Exception | None = None

    async def __call__(self, key: str, items: list[int], context: Any) -> list[int]:
        self.calls.append((key, items, context))
        await self.release.wait()
        if self.fail is not None:
            raise self.fail
        return [2 * i for i in items]


def test_an_idle_key_calls_at_once_and_waiting_submits_go_together() -> None:
    async def main() -> None:
        call = Recorder()
        joiner: Coalescer[str, int, int] = Coalescer(call)
        first = asyncio.create_task(joiner.submit("q", [1], "ctx-1"))
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert call.calls == [("q", [1], "ctx-1")]  # no wait for company
        later = [asyncio.create_task(joiner.submit("q", [n, n + 1], f"ctx-{n}")) for n in (10, 20)]
        other = asyncio.create_task(joiner.submit("r", [7], "ctx-r"))
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        call.release.set()
        assert await first == [2]
        assert [await t for t in later] == [[20, 22], [40, 42]]
        assert await other == [14]
        # The two that waited were one call, with the first waiter's context.
        assert ("q", [10, 11, 20, 21], "ctx-10") in call.calls
        assert len(call.calls) == 3

    asyncio.run(main())


def test_a_failed_call_fails_every_caller_in_it_and_the_key_recovers() -> None:
    async def main() -> None:
        call = Recorder()
        call.fail = RuntimeError("refused")
        joiner: Coalescer[str, int, int] = Coalescer(call)
        first = asyncio.create_task(joiner.submit("q", [1], None))
        await asyncio.sleep(0)
        second = asyncio.create_task(joiner.submit("q", [2], None))
        await asyncio.sleep(0)
        call.release.set()
        for task in (first, second):
            with pytest.raises(RuntimeError, match="refused"):
                await task
        call.fail = None
        assert await joiner.submit("q", [3], None) == [6]

    asyncio.run(main())


def test_joined_calls_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(call_batching, "MAX_JOINED", 3)

    async def main() -> None:
        call = Recorder()
        joiner: Coalescer[str, int, int] = Coalescer(call)
        tasks = [asyncio.create_task(joiner.submit("q", [n], None)) for n in range(7)]
        await asyncio.sleep(0)
        call.release.set()
        assert [await t for t in tasks] == [[2 * n] for n in range(7)]
        assert [items for _, items, _ in call.calls] == [[0, 1, 2], [3, 4, 5], [6]]

    asyncio.run(main())
