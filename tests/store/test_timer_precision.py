"""Timers (store.timer.slot): each message of a tick delivered at its own time,
not at the tick's end - and never before it; recalls and restarts while the
scan is inside a tick.

The timer's thread is stopped and driven by hand with a ManualClock (as in
test_timer.py), so what is delivered at which time is deterministic.
"""

from __future__ import annotations

import zlib

from basalt.common.message import Message
from basalt.store import ManualClock, MessageStore
from basalt.store.timer.checkpoint import TimerState, decode_state, encode_state
from basalt.store.timer.park import tick_of
from tests.support.polling import eventually_sync
from tests.support.stores import ConfigFactory
from tests.support.system_topics import open_timer_store as open_store
from tests.support.system_topics import real, step, timer_message


def tick_start(clock: ManualClock) -> int:
    """A time at which a tick of 100 ms begins (its slot holds (t, t + 100])."""
    now = clock.now_ms()
    return now - now % 100 + 1000


def keys(store: MessageStore, topic: str) -> list[str]:
    return [r.uniq_key or "" for r in real(store, topic)]


def test_messages_of_one_tick_are_delivered_each_at_its_time(
    make_config: ConfigFactory, clock: ManualClock
) -> None:
    store = open_store(make_config, clock)
    try:
        t = tick_start(clock)
        dues = {"C": t + 90, "A": t + 10, "B": t + 50, "D": t + 100}
        for uniq, due in dues.items():
            assert store.put_message(timer_message("T", uniq.encode(), due, uniq)).ok
        assert len({tick_of(d, 100) for d in dues.values()}) == 1  # one slot
        step(store)
        for now, expected in (
            (t, []),
            (t + 9, []),
            (t + 10, ["A"]),
            (t + 49, ["A"]),
            (t + 50, ["A", "B"]),  # before the tick's end: held no longer than its time
            (t + 89, ["A", "B"]),
            (t + 90, ["A", "B", "C"]),
            (t + 99, ["A", "B", "C"]),
            (t + 100, ["A", "B", "C", "D"]),
            (t + 300, ["A", "B", "C", "D"]),
        ):
            clock.set(now)
            step(store)
            assert keys(store, "T") == expected, now
            held = store.timer_status("T", 10).topics[0]
            assert held.pending == 4 - len(expected)
            assert held.next_due_ms == tuple(sorted(dues[k] for k in dues if k not in expected))
        assert store.timer.delivered == 4
    finally:
        store.shutdown()


def test_the_scan_waits_for_the_next_message_of_its_tick_not_for_the_tick(
    make_config: ConfigFactory, clock: ManualClock
) -> None:
    store = open_store(make_config, clock)
    try:
        t = tick_start(clock)
        for uniq, due in (("A", t + 20), ("B", t + 70), ("C", t + 75)):
            assert store.put_message(timer_message("T", uniq.encode(), due, uniq)).ok
        step(store)
        clock.set(t + 20)
        step(store)
        # The next thing due is B, 50 ms on.
        assert store.timer.scan_due() == 0.05
        clock.set(t + 70)
        step(store)
        assert keys(store, "T") == ["A", "B"]
        # C is due 5 ms on, but the scan waits a step (precision / 5) at least:
        # what comes due meanwhile goes in one put.
        assert store.timer.step_ms == 20
        assert store.timer.scan_due() == 0.02
        clock.set(t + 90)
        assert store.timer.scan_due() == 0.01  # the tick's end
        assert keys(store, "T") == ["A", "B", "C"]
    finally:
        store.shutdown()


def test_a_message_filed_into_the_open_tick_waits_for_its_time(
    make_config: ConfigFactory, clock: ManualClock
) -> None:
    store = open_store(make_config, clock)
    try:
        t = tick_start(clock)
        assert store.put_message(timer_message("T", b"a", t + 10, "A")).ok
        step(store)
        clock.set(t + 30)
        step(store)
        assert keys(store, "T") == ["A"]
        # Sent while the scan is in the tick: filed there, held until its time.
        assert store.put_message(timer_message("T", b"b", t + 60, "B")).ok
        step(store)
        clock.set(t + 59)
        step(store)
        assert keys(store, "T") == ["A"]
        clock.set(t + 60)
        step(store)
        assert keys(store, "T") == ["A", "B"]
    finally:
        store.shutdown()


def test_recalls_inside_the_open_tick(make_config: ConfigFactory, clock: ManualClock) -> None:
    store = open_store(make_config, clock)
    try:
        t = tick_start(clock)
        for uniq, due in (("A", t + 10), ("B", t + 60), ("C", t + 80)):
            assert store.put_message(timer_message("R", uniq.encode(), due, uniq)).ok
        step(store)
        clock.set(t + 40)
        step(store)
        assert keys(store, "R") == ["A"]
        assert not store.recall_timer("R", t + 10, "A")  # delivered already
        assert store.recall_timer("R", t + 60, "B")  # held: its marker joins the slot
        clock.set(t + 80)
        assert not store.recall_timer("R", t + 80, "C")  # its time has come
        step(store)
        clock.set(t + 200)
        step(store)
        assert keys(store, "R") == ["A", "C"]
        assert store.timer.cancelled == 1
        assert store.timer_status().pending == 0
    finally:
        store.shutdown()


def test_a_restart_inside_a_tick_delivers_its_held_messages_and_not_the_others_again(
    make_config: ConfigFactory, clock: ManualClock
) -> None:
    store = open_store(make_config, clock)
    t = tick_start(clock)
    for uniq, due in (("A", t + 10), ("B", t + 20), ("C", t + 70)):
        assert store.put_message(timer_message("T", uniq.encode(), due, uniq)).ok
    step(store)
    clock.set(t + 50)
    step(store)
    assert keys(store, "T") == ["A", "B"]
    assert store.shutdown()
    saved = decode_state(store.config.timer_checkpoint_path.read_bytes())
    assert saved.scan_tick == tick_of(t + 10, 100) and len(saved.open_done) == 2

    store = open_store(make_config, clock)
    try:
        assert store.timer.rebuilt is None
        assert store.timer_status().pending == 1
        step(store)
        assert keys(store, "T") == ["A", "B"]
        clock.set(t + 70)
        step(store)
        assert keys(store, "T") == ["A", "B", "C"]
    finally:
        store.shutdown()


def test_a_version_1_checkpoint_still_reads() -> None:
    state = TimerState(100, 3000, enqueue_offset=7, scan_tick=42, counts={"T": 3})
    v2 = encode_state(state)
    # Version 1: the same without the open slot's list (its count, 0, last).
    body = v2[:4] + (1).to_bytes(2, "big") + v2[6:-8]
    v1 = body + zlib.crc32(body).to_bytes(4, "big")
    for data in (v1, v2):
        back = decode_state(data)
        assert (back.enqueue_offset, back.scan_tick, back.counts, back.open_done) == (
            7,
            42,
            {"T": 3},
            [],
        )
    with_open = TimerState(100, 3000, scan_tick=42, open_done=[0, 96])
    assert decode_state(encode_state(with_open)).open_done == [0, 96]


def test_the_stores_own_puts_call_the_internal_put_listeners(
    make_config: ConfigFactory, clock: ManualClock
) -> None:
    """MessageStore.put_internal's hook (a store-node's group member moves its
    confirm offset with it): called after each delivery's append, never for a
    caller's put, and no more once removed."""
    store = open_store(make_config, clock)
    calls: list[int] = []

    def listener() -> None:
        calls.append(store.max_offset)

    store.add_internal_put_listener(listener)
    try:
        t = tick_start(clock)
        assert store.put_message(timer_message("T", b"a", t + 10, "A")).ok
        assert store.put_message(timer_message("T", b"b", t + 50, "B")).ok
        step(store)
        assert calls == []  # a caller's put: the caller answers for it
        clock.set(t + 10)
        step(store)
        assert calls == [store.max_offset]  # after the delivery's append
        assert store.put_message(Message("D", b"d", delay_time_level=1)).ok
        clock.advance(1000)
        store.schedule.deliver_due()
        eventually_sync(lambda: len(calls) == 2, what="the delay level's delivery")
        assert [r.body for r in real(store, "D")] == [b"d"]
        store.remove_internal_put_listener(listener)
        step(store)
        assert keys(store, "T") == ["A", "B"]
        assert len(calls) == 2
    finally:
        store.shutdown()
