"""SyncSetBook: the confirm offset, the in-sync set's changes and the sends
waiting on acks, on a manual clock (no store, no network)."""

from __future__ import annotations

import asyncio

import pytest

from basalt.services.store_node.ha.sync_set import SyncSetBook
from basalt.store import ManualClock
from tests.support.aio import async_test

MASTER = 1


def book(members: set[int], clock: ManualClock | None = None) -> SyncSetBook:
    return SyncSetBook(MASTER, frozenset(members), clock or ManualClock())


def test_the_set_must_hold_the_master() -> None:
    with pytest.raises(ValueError, match="must hold the master"):
        book({2, 3})


def test_confirm_is_the_lowest_ack_of_the_set_and_never_goes_back() -> None:
    b = book({1, 2, 3})
    assert b.compute_confirm(1000) == -1  # 2 and 3 never acked: held where it is
    b.acked(2, 400, 1000)
    b.acked(3, 700, 1000)
    assert b.compute_confirm(1000) == 400
    b.acked(4, 0, 1000)  # outside the set: not counted
    assert b.compute_confirm(1000) == 400
    b.reconnected(2)  # a new stream starts again below
    b.acked(2, 100, 1000)
    assert b.compute_confirm(1000) == 400
    assert b.compute_confirm(300) == 400  # a lower master offset neither


def test_a_master_alone_confirms_its_own_offset() -> None:
    b = book({1})
    assert b.compute_confirm(512) == 512


def test_pending_change_counts_old_and_new_sets() -> None:
    b = book({1, 2})
    b.acked(2, 900, 1000)
    b.acked(3, 500, 1000)
    b.begin_change(frozenset({1, 3}))
    assert b.counted() == {1, 2, 3}
    assert b.compute_confirm(1000) == 500  # 3 counts though not yet in the set
    with pytest.raises(RuntimeError):
        b.begin_change(frozenset({1}))
    b.end_change(committed=False)
    assert b.sync_state_set == {1, 2} and b.pending is None
    b.begin_change(frozenset({1, 3}))
    b.end_change(committed=True)
    assert b.sync_state_set == {1, 3}


def test_lagging_and_ready_to_join() -> None:
    clock = ManualClock()
    b = book({1, 2, 3}, clock)
    b.acked(2, 1000, 1000)  # caught up now
    clock.advance(500)
    b.sent(3, 2000)  # a frame while the master was at 2000
    clock.advance(500)
    b.acked(3, 2000, 3000)  # reached 2000: caught up as of 500 ms ago
    clock.advance(600)
    # 2 was caught up 1,600 ms ago; 3 as of 1,100 ms ago (when 2000 was the max)
    assert b.lagging(clock.now_ms(), 1000) == {2, 3}
    assert b.lagging(clock.now_ms(), 1200) == {2}
    assert b.lagging(clock.now_ms(), 1700) == frozenset()
    b.acked(2, 3000, 3000)
    assert b.lagging(clock.now_ms(), 1000) == {3}
    # 4 is outside; it joins once its ack reaches the confirm offset
    b.compute_confirm(3000)
    assert b.confirm_offset == 2000
    b.acked(4, 1999, 3000)
    assert b.ready_to_join() == frozenset()
    b.acked(4, 2000, 3000)
    assert b.ready_to_join() == {4}


def test_an_idle_group_keeps_its_caught_up_slaves() -> None:
    # No send, no frame, no ack: a slave that has the master's max offset is
    # caught up now, however long the group has been idle; one below it lags.
    clock = ManualClock()
    b = book({1, 2, 3}, clock)
    b.acked(2, 3000, 3000)
    b.acked(3, 2500, 3000)
    clock.advance(60_000)
    assert b.lagging(clock.now_ms(), 1000, master_max_offset=3000) == {3}
    clock.advance(60_000)
    assert b.lagging(clock.now_ms(), 1000, master_max_offset=3000) == {3}


def test_a_member_that_never_connects_lags_from_the_start() -> None:
    clock = ManualClock()
    b = book({1, 2}, clock)
    clock.advance(2000)
    assert b.lagging(clock.now_ms(), 1000) == {2}


def test_an_ack_going_back_is_refused() -> None:
    b = book({1, 2})
    b.acked(2, 100, 1000)
    with pytest.raises(ValueError, match="acked 50 after 100"):
        b.acked(2, 50, 1000)


@async_test
async def test_wait_acked_needs_every_counted_member() -> None:
    b = book({1, 2})
    waiting = asyncio.ensure_future(b.wait_acked(300, 5))
    await asyncio.sleep(0)
    b.acked(2, 200, 1000)
    await asyncio.sleep(0)
    assert not waiting.done()
    b.begin_change(frozenset({1, 2, 3}))  # 3 now counts too
    b.acked(2, 300, 1000)
    await asyncio.sleep(0)
    assert not waiting.done()
    b.acked(3, 300, 1000)
    assert await waiting
    assert not await b.wait_acked(400, 0.05)  # nobody acked 400: times out


@async_test
async def test_a_shrink_settles_the_waiters_and_close_releases_them() -> None:
    b = book({1, 2})
    waiting = asyncio.ensure_future(b.wait_acked(300, 5))
    await asyncio.sleep(0)
    b.begin_change(frozenset({1}))
    await asyncio.sleep(0)
    assert not waiting.done()  # 2 still counts while the shrink is pending
    b.end_change(committed=True)
    assert await waiting
    b2 = book({1, 2})
    held = asyncio.ensure_future(b2.wait_acked(300, 5))
    await asyncio.sleep(0)
    b2.release_all()
    assert await held is False
