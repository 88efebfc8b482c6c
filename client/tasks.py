"""The SDK's background tasks, owned: :class:`TaskOwner`, and :func:`gather_all`.

asyncio's loop keeps only weak references to tasks. A task the SDK starts
and then forgets (a broken SendStream's reader, dropped with its stream) is
garbage once nothing else refers to it, and asyncio logs "Task was destroyed
but it is pending!"; one that failed and is never awaited logs "Task
exception was never retrieved". Every task a client starts goes through its
owner, which keeps it until it ends, retrieves its outcome, and on close
cancels whatever still runs and waits for it to end (trio's nursery,
asyncio.TaskGroup without its fail-all rule: a failed background task is the
owner's to report, not a reason to cancel the others). Futures the SDK does
not start as tasks (a listener's call on a thread pool) are adopted the same
way.

``asyncio.gather`` without ``return_exceptions`` returns at the first failure
and leaves the other awaitables running, owned by no one: :func:`gather_all`
waits for all of them first.

Concurrency: one event loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Coroutine
from typing import Any, TypeVar

from basalt.common.tracing import untraced_task

log = logging.getLogger(__name__)

T = TypeVar("T")
F = TypeVar("F", bound="asyncio.Future[Any]")


class TaskOwner:
    """Starts, keeps and, on :meth:`close`, ends a client's background tasks."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Future[Any]] = set()

    def spawn(
        self, coro: Coroutine[Any, Any, T], *, name: str | None = None, untraced: bool = False
    ) -> asyncio.Task[T]:
        """``coro`` as a task this owner keeps until it ends; its exception, if
        any, is retrieved (logged at DEBUG: whoever awaits it still gets it).
        ``untraced``: the task starts in an empty OpenTelemetry context
        (:func:`basalt.common.tracing.untraced_task`: long-lived loops)."""
        if untraced:
            task = untraced_task(coro, name=name)
        else:
            task = asyncio.get_running_loop().create_task(coro, name=name)
        return self.adopt(task)

    def adopt(self, future: F) -> F:
        """Keep ``future`` (a task started elsewhere, an executor's future) as if
        :meth:`spawn` had started it."""
        self._tasks.add(future)
        future.add_done_callback(self._ended)
        return future

    def _ended(self, task: asyncio.Future[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (e := task.exception()) is not None:
            name = task.get_name() if isinstance(task, asyncio.Task) else repr(task)
            log.debug("background task %s failed: %r", name, e)

    def __len__(self) -> int:
        """Tasks still running."""
        return len(self._tasks)

    def running(self) -> list[asyncio.Future[Any]]:
        """The tasks still running."""
        return list(self._tasks)

    def cancel(self) -> None:
        """Cancel every task still running, without waiting (:meth:`close` waits)."""
        for task in list(self._tasks):
            task.cancel()

    async def close(self) -> None:
        """Cancel every task still running and wait until all have ended
        (including ones they start meanwhile). Idempotent."""
        while self._tasks:
            tasks = list(self._tasks)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


async def gather_all(*aws: Awaitable[T]) -> list[T]:
    """``asyncio.gather(*aws)``, but every awaitable has ended before this
    returns or raises: the first exception (in argument order) is raised once
    all are done. Cancelled, it cancels them all and waits for them too."""
    results: list[T] = []
    for outcome in await asyncio.gather(*aws, return_exceptions=True):
        if isinstance(outcome, BaseException):
            raise outcome
        results.append(outcome)
    return results
