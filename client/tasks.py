"""The SDK's background tasks, owned: :class:`TaskOwner`.

asyncio's loop keeps only weak references to tasks. A task the SDK starts
and then forgets (a broken SendStream's reader, dropped with its stream) is
garbage once nothing else refers to it, and asyncio logs "Task was destroyed
but it is pending!"; one that failed and is never awaited logs "Task
exception was never retrieved". Every task a client starts goes through its
owner, which keeps it until it ends, retrieves its outcome, and on close
cancels whatever still runs and waits for it to end (trio's nursery,
asyncio.TaskGroup without its fail-all rule: a failed background task is the
owner's to report, not a reason to cancel the others).

Concurrency: one event loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


class TaskOwner:
    """Starts, keeps and, on :meth:`close`, ends a client's background tasks."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, T], *, name: str | None = None) -> asyncio.Task[T]:
        """``coro`` as a task this owner keeps until it ends; its exception, if
        any, is retrieved (logged at DEBUG: whoever awaits it still gets it)."""
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._ended)
        return task

    def _ended(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (e := task.exception()) is not None:
            log.debug("background task %s failed: %r", task.get_name(), e)

    def __len__(self) -> int:
        """Tasks still running."""
        return len(self._tasks)

    async def close(self) -> None:
        """Cancel every task still running and wait until all have ended
        (including ones they start meanwhile). Idempotent."""
        while self._tasks:
            tasks = list(self._tasks)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
