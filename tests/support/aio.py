"""Running ``async`` tests without pytest-asyncio: each on a fresh event loop, capped."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar, overload

from tests.support.timeouts import ASYNC_TEST_TIMEOUT_S

T = TypeVar("T")
AsyncTest = Callable[..., Coroutine[Any, Any, None]]


@overload
def async_test(fn: AsyncTest) -> Callable[..., None]: ...


@overload
def async_test(*, timeout_s: float) -> Callable[[AsyncTest], Callable[..., None]]: ...


def async_test(
    fn: AsyncTest | None = None, *, timeout_s: float = ASYNC_TEST_TIMEOUT_S
) -> Callable[..., None] | Callable[[AsyncTest], Callable[..., None]]:
    """Run an ``async def`` test on a fresh event loop; fixtures pass through.

    ``@async_test`` caps the test at ``ASYNC_TEST_TIMEOUT_S``;
    ``@async_test(timeout_s=...)`` at another cap (tests that run CLI
    subprocesses take :data:`~tests.support.timeouts.SUBPROCESS_TEST_TIMEOUT_S`).
    Past the cap the test fails with ``TimeoutError``.
    """

    def decorate(test: AsyncTest) -> Callable[..., None]:
        @functools.wraps(test)
        def wrapper(*args: Any, **kwargs: Any) -> None:
            asyncio.run(asyncio.wait_for(test(*args, **kwargs), timeout_s))

        return wrapper

    return decorate if fn is None else decorate(fn)


def run(coro_fn: Callable[[], Awaitable[T]]) -> T:
    """``asyncio.run(coro_fn())``: a sync test's async scenario on a fresh loop."""
    return asyncio.run(coro_fn())  # type: ignore[arg-type]
