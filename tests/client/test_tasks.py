"""TaskOwner: a client's background tasks are kept, their failures retrieved,
and all ended by close (issue 28, item 7)."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

from basalt.client.tasks import TaskOwner


def test_close_cancels_and_awaits_every_task_and_no_failure_goes_unretrieved() -> None:
    reported: list[dict[str, Any]] = []

    async def scenario() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda _, c: reported.append(c))
        owner = TaskOwner()

        async def fail() -> None:
            raise RuntimeError("boom")

        async def forever() -> None:
            await asyncio.Event().wait()

        owner.spawn(fail())  # nobody awaits it
        hung = [owner.spawn(forever()) for _ in range(3)]
        for _ in range(3):  # the failed task ends, then its done callback runs
            await asyncio.sleep(0)
        assert len(owner) == 3
        await owner.close()
        assert all(t.cancelled() for t in hung)
        assert len(owner) == 0
        assert asyncio.all_tasks() == {asyncio.current_task()}
        del hung
        gc.collect()
        await asyncio.sleep(0)

    asyncio.run(scenario())
    gc.collect()
    assert reported == []
