"""Wall-clock time as a seam: every time the store stamps or compares comes from a :class:`Clock`.

Store timestamps, born timestamps filled in by the store, expiry ages, the
consumer-offset file's change time and IndexFile names all read
:meth:`Clock.now_ms` of the clock the store was built with, so tests drive
them with a :class:`ManualClock`. Two uses of time deliberately bypass it:
the seconds field of a producer-side message id (UNIQ_KEY, made with the
message by ``time.time()``, as RocketMQ's MessageClientIDSetter does), and
durations and waits (flush intervals, recovery's duration, the background
threads' pauses), which use ``time.monotonic``/``time.perf_counter`` or
sleeps because a wall clock that jumps must not stretch or shorten them.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """A source of wall-clock milliseconds since the epoch."""

    def now_ms(self) -> int: ...


class SystemClock:
    """The real wall clock."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000


class ManualClock:
    """A clock that moves only when told to; for tests and replays."""

    def __init__(self, start_ms: int = 1_700_000_000_000) -> None:
        self._now_ms = start_ms

    def now_ms(self) -> int:
        return self._now_ms

    def advance(self, delta_ms: int) -> None:
        self._now_ms += delta_ms

    def set(self, now_ms: int) -> None:
        self._now_ms = now_ms
