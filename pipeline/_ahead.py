"""A generator run in a thread of its own, a few items ahead of its consumer.

Spark's Python worker reads a partition in one thread: it asks the source for
a batch, then writes that batch to the JVM, then asks for the next. The
``basalt`` source's batches come from the network (``GetMessages``, waiting
on a store-node) and from C (``arrow_columns``); the write to the JVM is a
socket. Neither holds the GIL for long, so with the reading in a thread of its
own the next batch is fetched and built while the previous one is written,
and the store-node, the worker and the JVM work at once instead of in turn.

:func:`ahead` is that thread: it runs the generator, keeps at most ``depth``
finished items waiting, re-raises the generator's exception in the consumer
(where Spark reports it), and stops the generator when the consumer is closed
early (a ``limit`` that needs no more rows) or collected.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from typing import TypeVar

__all__ = ["ahead"]

T = TypeVar("T")

#: How often a producer blocked on a full queue looks whether the consumer left, s.
_POLL_S = 0.1


class _End:
    """The producer's last item: the generator finished, or raised ``error``."""

    def __init__(self, error: BaseException | None) -> None:
        self.error = error


def ahead(make: Callable[[], Iterator[T]], depth: int) -> Iterator[T]:
    """The items of ``make()``, produced in a daemon thread up to ``depth`` ahead.

    ``make`` is called in that thread (so even its first step overlaps the
    consumer). An exception of the generator is raised here after the items
    it produced before it. Closing this generator (or dropping it) stops the
    thread at its next item, and closes the inner generator there."""
    if depth < 1:
        raise ValueError(f"depth must be >= 1: {depth}")
    items: queue.Queue[T | _End] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item: T | _End) -> bool:
        """Queue ``item``; False when the consumer has gone."""
        while not stop.is_set():
            try:
                items.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        error: BaseException | None = None
        try:
            source = make()
            try:
                for item in source:
                    if not put(item):
                        return
            finally:
                close = getattr(source, "close", None)
                if close is not None:
                    close()
        except BaseException as e:  # handed to the consumer, which raises it
            error = e
        put(_End(error))

    thread = threading.Thread(target=produce, name="basalt-read-ahead", daemon=True)
    thread.start()
    try:
        while True:
            item = items.get()
            if isinstance(item, _End):
                if item.error is not None:
                    raise item.error
                return
            yield item
    finally:
        stop.set()
