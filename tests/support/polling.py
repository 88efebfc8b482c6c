"""The one way a test waits for something to become true: :func:`eventually`.

A test that must see a state reached by another thread, task or process polls
a check until it holds, and fails with an ``AssertionError`` naming what it
waited for if it never does. The timeout only bounds a hang: it asserts
nothing about speed, so it is generous. (Where a test *does* assert on time,
it measures it itself; :func:`eventually` returns the seconds it waited.)

Two forms of the same loop:

* ``await eventually(check)`` in async code: ``check()`` may return a bool or
  an awaitable of one (an ``async def`` check), and the wait yields to the
  event loop between tries;
* ``eventually_sync(check)`` in plain threads: blocks between tries.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable

#: How long a wait may take before the test fails: a bound on a hang, not a speed
#: requirement (a loaded 2-core CI machine is slow).
DEFAULT_TIMEOUT_S = 20.0
#: Pause between tries: short against the waits being measured, long enough not
#: to starve the threads and tasks being waited for.
DEFAULT_INTERVAL_S = 0.02


class _Deadline:
    """When a wait started and when it gives up; the failure it then raises."""

    def __init__(self, timeout_s: float, what: str) -> None:
        self.started = time.monotonic()
        self.timeout_s = timeout_s
        self.what = what

    def elapsed_s(self) -> float:
        return time.monotonic() - self.started

    def check_not_passed(self) -> None:
        """Raise ``AssertionError`` once the timeout has passed."""
        if self.elapsed_s() > self.timeout_s:
            raise AssertionError(f"{self.what}: not true within {self.timeout_s} s")


async def eventually(
    check: Callable[[], bool | Awaitable[bool]],
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    interval_s: float = DEFAULT_INTERVAL_S,
    what: str = "the condition",
) -> float:
    """Call ``check()`` (awaiting its result if it is awaitable) until it is truthy.

    Returns the seconds it took. Raises ``AssertionError`` naming ``what`` if it
    is still false after ``timeout_s``; an exception ``check`` raises propagates
    at once. Sleeps ``interval_s`` on the event loop between tries.
    """
    deadline = _Deadline(timeout_s, what)
    while True:
        result = check()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return deadline.elapsed_s()
        deadline.check_not_passed()
        await asyncio.sleep(interval_s)


def eventually_sync(
    check: Callable[[], bool],
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    interval_s: float = DEFAULT_INTERVAL_S,
    what: str = "the condition",
) -> float:
    """:func:`eventually` for plain threads: blocks between tries of ``check()``.

    Returns the seconds it took; raises ``AssertionError`` naming ``what`` if
    ``check()`` is still false after ``timeout_s``.
    """
    deadline = _Deadline(timeout_s, what)
    while not check():
        deadline.check_not_passed()
        time.sleep(interval_s)
    return deadline.elapsed_s()
