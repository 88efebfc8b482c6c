"""``basalt.pipeline._ahead.ahead``: a generator run in a thread ahead of its consumer."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from basalt.pipeline._ahead import ahead


def test_items_come_in_order_and_the_generator_runs_in_another_thread() -> None:
    threads: list[int] = []

    def make() -> Iterator[int]:
        threads.append(threading.get_ident())
        yield from range(100)

    assert list(ahead(make, 2)) == list(range(100))
    assert threads and threads[0] != threading.get_ident()


def test_it_runs_at_most_depth_items_ahead() -> None:
    made: list[int] = []
    step = threading.Event()

    def make() -> Iterator[int]:
        for i in range(10):
            made.append(i)
            step.set()
            yield i

    items = ahead(make, 2)
    assert next(items) == 0
    deadline = time.monotonic() + 5
    # 0 taken, 1 and 2 waiting, 3 made and blocked on the full queue: never 5
    while len(made) < 4 and time.monotonic() < deadline:
        step.wait(0.05)
    time.sleep(0.2)
    assert len(made) == 4
    assert list(items) == list(range(1, 10))


def test_an_error_is_raised_after_the_items_before_it() -> None:
    def make() -> Iterator[int]:
        yield 1
        yield 2
        raise KeyError("the read failed")

    got: list[int] = []
    with pytest.raises(KeyError, match="the read failed"):
        for item in ahead(make, 1):
            got.append(item)
    assert got == [1, 2]


def test_an_error_making_the_generator_is_raised() -> None:
    def make() -> Iterator[int]:
        raise OSError("no route")

    with pytest.raises(OSError, match="no route"):
        next(ahead(make, 2))


def test_closing_the_consumer_stops_and_closes_the_generator() -> None:
    closed = threading.Event()
    made: list[int] = []

    def make() -> Iterator[int]:
        try:
            for i in range(1_000_000):
                made.append(i)
                yield i
        finally:
            closed.set()

    items = ahead(make, 2)
    assert [next(items), next(items)] == [0, 1]
    items.close()
    assert closed.wait(5)
    assert len(made) < 10


def test_depth_must_be_positive() -> None:
    with pytest.raises(ValueError, match="depth"):
        next(ahead(lambda: iter([1]), 0))
