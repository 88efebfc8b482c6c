"""The slot the timer's scan is in: its entries held until each one's own time.

A slot of the wheel holds the messages due within one tick of
``timer_precision_ms``: tick ``T`` those due in ``((T - 1) * precision, T *
precision]`` (:func:`~basalt.store.timer.park.tick_of`). The scan opens the
slot as soon as the tick's first millisecond comes and delivers each message
when its own ``deliver_ms`` (the TimerLog entry's) comes, in time order - so
a message is late by the scan's reaction, not by up to one tick - and leaves
the slot once the tick's time is all past and every entry is handled. Until
then the enqueue may still file entries in it (a message due later in the
tick, a recall's delete marker): :meth:`DueSlot.refresh` reads what was
appended to its list since the last look.

Only the open slot is kept in memory (its entries not yet delivered, and the
keys of its delete markers); a crash forgets it, and the restart scans the
slot again from its checkpointed tick, skipping the entries the checkpoint
lists as handled (what was delivered after it is delivered again: at least
once, as before).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable
from typing import TypeVar

from basalt.common.message import PROPERTY_TIMER_DEL_UNIQKEY, MessageRecord
from basalt.store.timer.files import TimerEntry, TimerLog

_T = TypeVar("_T")


def _order(entry: TimerEntry) -> tuple[int, int]:
    """When an entry is handled: a ROLL entry at once (it is written to the timer
    topic again, its time is a later window's), a message at its time; ties in
    the order filed."""
    return (-1 if entry.is_roll else entry.deliver_ms, entry.pos)


class DueSlot:
    """The open slot ``tick``: ``held`` its entries not handled yet, in the order
    they come due; ``handled`` the positions of those handled (what a
    checkpoint records, so a restart does not deliver them again); ``deletes``
    the keys its delete markers name. ``skip``: positions handled before a
    restart (the checkpoint's). Not thread-safe: the timer service's lock
    guards it."""

    def __init__(self, tick: int, skip: Iterable[int] = ()) -> None:
        self.tick = tick
        #: The last TimerLog entry read of the slot's list (-1: none yet).
        self.last = -1
        self.held: list[TimerEntry] = []
        self._keys: list[tuple[int, int]] = []
        self.handled: list[int] = []
        self.deletes: set[str] = set()
        self._skip = set(skip)

    def refresh(
        self,
        log: TimerLog,
        last: int,
        read_record: Callable[[int, int], MessageRecord | None],
    ) -> None:
        """Read the entries filed in the slot since the last look (its list now
        ends at ``last``): messages join ``held`` in order, delete markers
        their keys to ``deletes``."""
        if last == self.last:
            return
        for entry in log.chain(last, stop=self.last):
            if entry.is_delete:
                record = read_record(entry.phy, entry.size)
                if record is not None:
                    self.deletes.add(record.properties.get(PROPERTY_TIMER_DEL_UNIQKEY, ""))
                continue
            if entry.pos in self._skip:
                self.handled.append(entry.pos)
                continue
            key = _order(entry)
            i = bisect.bisect_right(self._keys, key)
            self._keys.insert(i, key)
            self.held.insert(i, entry)
        self.last = last

    def due_count(self, now_ms: int) -> int:
        """How many of ``held`` (a prefix) are due at ``now_ms``."""
        return bisect.bisect_right(self._keys, (now_ms, 1 << 62))

    def next_due_ms(self) -> int | None:
        """The earliest time an entry still held comes due (None: none held)."""
        return self._keys[0][0] if self._keys else None

    def handle(
        self,
        count: int,
        prepare: Callable[[TimerEntry, set[str]], _T | None],
        put: Callable[[list[_T]], int],
        batch_size: int,
    ) -> bool:
        """Handle the first ``count`` of ``held``: ``prepare`` makes what an entry
        puts (None: skipped), ``put`` puts up to ``batch_size`` of them at a time
        and says how many went. False when a put fell short (the store refused
        for now): what was not handled stays held, in order."""
        batch: list[_T] = []
        done = 0  # a prefix of ``held``, whatever fails
        for e in self.held[:count]:
            item = prepare(e, self.deletes)
            if item is not None:
                batch.append(item)
                if len(batch) < batch_size:
                    continue
            # Skipped or a full batch: what is batched goes first, so ``done``
            # stays a prefix.
            if batch:
                went = put(batch)
                done += went
                if went < len(batch):
                    self._drop(done)
                    return False
                batch = []
            if item is None:
                done += 1
        if batch:
            went = put(batch)
            done += went
            if went < len(batch):
                self._drop(done)
                return False
        self._drop(done)
        return True

    def _drop(self, count: int) -> None:
        self.handled += [e.pos for e in self.held[:count]]
        del self.held[:count]
        del self._keys[:count]

    def held_positions(self) -> set[int]:
        """The TimerLog positions of the entries still to be handled."""
        return {e.pos for e in self.held}


__all__ = ["DueSlot"]
