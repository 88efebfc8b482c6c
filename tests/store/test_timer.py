"""Timers (store.timer): parking in rmq_sys_wheel_timer, filing in the wheel,
delivery at the time and not before, rolls, recall, status, clean restarts.

Most tests stop the timer's thread and drive it by hand (``run_once``) with a
ManualClock, so what is delivered when is deterministic.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from basalt.common.message import (
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_START_DELIVER_TIME,
    PROPERTY_TIMER_DELAY_SEC,
    PROPERTY_TIMER_DELIVER_MS,
    PROPERTY_TIMER_OUT_MS,
    PROPERTY_TIMER_ROLL_TIMES,
    PROPERTY_UNIQ_KEY,
    TIMER_TOPIC,
    Message,
)
from basalt.store import ManualClock, MessageStore
from basalt.store.errors import StoreConfigError
from basalt.store.put_result import PutStatus
from basalt.store.timer.park import tick_of
from tests.support.polling import eventually_sync
from tests.support.stores import ConfigFactory, small_store_config
from tests.support.system_topics import dispatched, real, step, timer_message
from tests.support.system_topics import open_timer_store as open_store

DAY_MS = 86_400_000


def test_timer_settings_are_validated(tmp_path: Path) -> None:
    cfg = small_store_config(tmp_path)
    assert (cfg.timer_precision_ms, cfg.timer_max_delay_sec) == (100, 604_800)
    for field, bad in (
        ("timer_precision_ms", 5),
        ("timer_precision_ms", 2000),
        ("timer_max_delay_sec", 0),
        ("timer_roll_window_sec", 10),
    ):
        with pytest.raises(StoreConfigError, match=field):
            small_store_config(tmp_path, **{field: bad})


def test_a_timer_put_is_parked_with_real_topic_and_its_time(
    make_config: ConfigFactory, clock: ManualClock
) -> None:
    store = open_store(make_config, clock)
    try:
        now = clock.now_ms()
        m = Message(
            "Orders",
            b"later",
            queue_id=2,
            tags="TagA",
            properties={PROPERTY_TIMER_DELAY_SEC: "30", PROPERTY_UNIQ_KEY: "U1"},
        )
        result = store.put_message(m)
        assert result.ok
        [parked] = real(store, TIMER_TOPIC, 0)
        assert parked.properties[PROPERTY_REAL_TOPIC] == "Orders"
        assert parked.properties[PROPERTY_REAL_QUEUE_ID] == "2"
        # Resolved to an absolute time at put: a restart does not move it.
        assert parked.properties[PROPERTY_TIMER_DELIVER_MS] == str(now + 30_000)
        assert parked.properties[PROPERTY_TIMER_OUT_MS] == str(now + 30_000)
        assert PROPERTY_TIMER_DELAY_SEC not in parked.properties
        assert real(store, "Orders", 2) == []
    finally:
        store.shutdown()


def test_a_due_or_past_time_is_stored_directly(
    make_config: ConfigFactory, clock: ManualClock
) -> None:
    store = open_store(make_config, clock)
    try:
        now = clock.now_ms()
        for i, when in enumerate((now, now - 5000)):
            props = {PROPERTY_START_DELIVER_TIME: str(when), PROPERTY_UNIQ_KEY: f"P{i}"}
            assert store.put_message(Message("Orders", b"now", properties=props)).ok
        assert [r.uniq_key for r in real(store, "Orders")] == ["P0", "P1"]
        assert real(store, TIMER_TOPIC) == []
    finally:
        store.shutdown()


def test_bad_timer_values_and_times_past_the_max_are_refused(
    make_config: ConfigFactory, clock: ManualClock
) -> None:
    store = open_store(make_config, clock, timer_max_delay_sec=3600)
    try:
        now = clock.now_ms()
        for props, why in (
            ({PROPERTY_TIMER_DELIVER_MS: "soon"}, "not an integer"),
            ({PROPERTY_TIMER_DELAY_SEC: "1.5"}, "not an integer"),
            ({PROPERTY_TIMER_DELIVER_MS: str(now + 3_600_001)}, "timer_max_delay_sec"),
            ({PROPERTY_TIMER_DELAY_SEC: "3601"}, "timer_max_delay_sec"),
        ):
            result = store.put_message(Message("Orders", b"x", properties=props))
            assert result.status is PutStatus.MESSAGE_ILLEGAL
            assert why in result.detail
        # Right at the max is taken.
        ok = {PROPERTY_TIMER_DELIVER_MS: str(now + 3_600_000)}
        assert store.put_message(Message("Orders", b"x", properties=ok)).ok
        assert store.max_physical_offset > 0
        assert len(real(store, TIMER_TOPIC)) == 1
    finally:
        store.shutdown()


def test_timers_are_refused_when_the_wheel_is_off(
    make_config: ConfigFactory, clock: ManualClock
) -> None:
    store = open_store(make_config, clock, timer_wheel_enable=False)
    try:
        props = {PROPERTY_TIMER_DELAY_SEC: "5"}
        result = store.put_message(Message("Orders", b"x", properties=props))
        assert result.status is PutStatus.MESSAGE_ILLEGAL
        assert "timer_wheel_enable" in result.detail
    finally:
        store.shutdown()


def test_each_timer_is_delivered_at_its_time_not_before(
    make_config: ConfigFactory, clock: ManualClock
) -> None:
    store = open_store(make_config, clock)
    try:
        t0 = clock.now_ms()
        # Out of order, two in one slot, one between two ticks.
        offsets = {"A": 1000, "B": 250, "C": 1000, "D": 1_234}
        for uniq, delay in offsets.items():
            m = timer_message(
                "Orders",
                uniq.encode(),
                t0 + delay,
                uniq,
                queue_id=1,
                tags=f"tag{uniq}",
                keys=(f"key{uniq}",),
                born_timestamp_ms=42,
                born_host="10.0.0.9:77",
            )
            assert store.put_message(m).ok
        step(store)
        assert store.timer_status().pending == 4
        seen: list[str] = []
        for now in range(t0, t0 + 1_400, 50):
            clock.set(now)
            step(store)
            got = real(store, "Orders", 1)
            for r in got[len(seen) :]:
                # Never before its time.
                assert now >= t0 + offsets[r.uniq_key or ""], (r.uniq_key, now)
            seen = [r.uniq_key or "" for r in got]
        assert sorted(seen) == ["A", "B", "C", "D"]
        assert seen[0] == "B" and seen[-1] == "D"
        for r in real(store, "Orders", 1):
            u = r.uniq_key or ""
            assert r.body == u.encode() and r.tags == f"tag{u}" and r.keys == [f"key{u}"]
            assert (r.born_timestamp_ms, r.born_host) == (42, "10.0.0.9:77")
            assert r.properties[PROPERTY_TIMER_DELIVER_MS] == str(t0 + offsets[u])
            assert PROPERTY_REAL_TOPIC not in r.properties
        assert store.timer_status().pending == 0
        assert store.timer.delivered == 4
        # Delivered once: looking again changes nothing.
        clock.advance(5000)
        step(store)
        assert len(real(store, "Orders", 1)) == 4
    finally:
        store.shutdown()


def test_a_timer_filed_after_the_scan_passed_it_is_delivered_at_once(
    make_config: ConfigFactory, clock: ManualClock
) -> None:
    store = open_store(make_config, clock)
    try:
        t0 = clock.now_ms()
        assert store.put_message(timer_message("T", b"x", t0 + 500, "LATE")).ok
        dispatched(store)
        clock.advance(2000)  # the scan moves past it before it is enqueued
        store.timer.scan_due()
        assert store.timer.state.scan_tick > tick_of(t0 + 500, 100)
        step(store)
        assert [r.uniq_key for r in real(store, "T")] == ["LATE"]
    finally:
        store.shutdown()


def test_status_lists_pending_per_topic_with_next_due_times(
    make_config: ConfigFactory, clock: ManualClock
) -> None:
    store = open_store(make_config, clock)
    try:
        t0 = clock.now_ms()
        for i in range(5):
            assert store.put_message(timer_message("A", b"a", t0 + 1000 * (5 - i), f"A{i}")).ok
        assert store.put_message(timer_message("B", b"b", t0 + 3 * DAY_MS, "B0")).ok
        step(store)
        status = store.timer_status(max_next_due=3)
        assert status.pending == 6
        assert [(t.topic, t.pending) for t in status.topics] == [("A", 5), ("B", 1)]
        assert status.topics[0].next_due_ms == (t0 + 1000, t0 + 2000, t0 + 3000)
        # B waits in a roll slot (3 days > the 2-day roll window): its real time shows.
        assert status.topics[1].next_due_ms == (t0 + 3 * DAY_MS,)
        only_b = store.timer_status("B", 1)
        assert [(t.topic, t.pending) for t in only_b.topics] == [("B", 1)]
        assert store.timer_status("nope").topics[0].pending == 0
        assert status.enqueue_offset == status.queue_max_offset == 6
        assert status.scan_ms <= t0 + 100
    finally:
        store.shutdown()


def test_a_delay_longer_than_the_roll_window_rolls_and_arrives_on_time(
    make_config: ConfigFactory, clock: ManualClock
) -> None:
    store = open_store(
        make_config, clock, timer_roll_window_sec=3600, timer_max_delay_sec=7 * 24 * 3600
    )
    try:
        t0 = clock.now_ms()
        due = t0 + 7 * DAY_MS  # right at the max
        assert store.put_message(timer_message("Far", b"week", due, "W")).ok
        step(store)
        while clock.now_ms() < due + 1000:
            clock.advance(1_800_000)  # half an hour
            if clock.now_ms() >= due:
                clock.set(due)
            step(store)
            got = real(store, "Far")
            if got:
                break
            assert store.timer_status("Far").topics[0].pending == 1
        got = real(store, "Far")
        assert [r.uniq_key for r in got] == ["W"]
        assert clock.now_ms() >= due
        # Re-written to the timer topic about once per roll window (an hour; here
        # every hour and a half: it is filed again at the next half-hour step).
        parked = real(store, TIMER_TOPIC)
        rolls = max(int(r.properties.get(PROPERTY_TIMER_ROLL_TIMES, "0")) for r in parked)
        assert 7 * 24 // 2 <= rolls <= 7 * 24
        assert PROPERTY_TIMER_ROLL_TIMES not in got[0].properties
    finally:
        store.shutdown()


def test_recall_cancels_a_pending_timer_and_not_a_delivered_one(
    make_config: ConfigFactory, clock: ManualClock
) -> None:
    store = open_store(make_config, clock)
    try:
        t0 = clock.now_ms()
        for uniq in ("KEEP", "DROP"):
            assert store.put_message(timer_message("R", uniq.encode(), t0 + 1000, uniq)).ok
        assert store.put_message(timer_message("R", b"early", t0 + 100, "EARLY")).ok
        step(store)
        assert store.recall_timer("R", t0 + 1000, "DROP")
        # Another topic, another time, an unknown id: nothing to cancel.
        assert not store.recall_timer("Other", t0 + 1000, "KEEP")
        assert not store.recall_timer("R", t0 + 2000, "KEEP")
        assert not store.recall_timer("R", t0 + 1000, "NOBODY")
        clock.advance(200)
        step(store)
        assert not store.recall_timer("R", t0 + 100, "EARLY")  # delivered already
        clock.advance(1000)
        step(store)
        assert sorted(r.uniq_key or "" for r in real(store, "R")) == ["EARLY", "KEEP"]
        assert store.timer.cancelled == 1
        assert store.timer_status().pending == 0
    finally:
        store.shutdown()


def test_a_recall_made_before_its_marker_is_filed_still_cancels(
    make_config: ConfigFactory, clock: ManualClock
) -> None:
    store = open_store(make_config, clock)
    try:
        t0 = clock.now_ms()
        assert store.put_message(timer_message("R", b"x", t0 + 300, "U")).ok
        step(store)
        assert store.recall_timer("R", t0 + 300, "U")
        clock.advance(300)
        store.timer.scan_due()  # before the marker is enqueued
        step(store)
        assert real(store, "R") == []
    finally:
        store.shutdown()


def test_a_clean_restart_keeps_every_pending_timer(
    make_config: ConfigFactory, clock: ManualClock
) -> None:
    store = open_store(make_config, clock)
    t0 = clock.now_ms()
    for i in range(20):
        assert store.put_message(timer_message("T", b"%d" % i, t0 + 100 * (i + 1), f"U{i}")).ok
    step(store)
    clock.advance(500)
    step(store)
    assert len(real(store, "T")) == 5
    assert store.shutdown()
    assert store.config.timer_checkpoint_path.exists()

    store = open_store(make_config, clock)
    try:
        assert store.timer.rebuilt is None
        assert store.timer_status().pending == 15
        clock.advance(2000)
        step(store)
        assert sorted(int(r.body) for r in real(store, "T")) == list(range(20))
    finally:
        store.shutdown()


def test_the_service_thread_delivers_on_its_own(make_config: ConfigFactory) -> None:
    store = MessageStore.open(make_config())
    try:
        import time

        due = int(time.time() * 1000) + 300
        assert store.put_message(timer_message("T", b"x", due, "SELF")).ok
        eventually_sync(lambda: len(real(store, "T")) == 1, what="the delivery")
        assert int(time.time() * 1000) >= due
    finally:
        assert store.shutdown()


def test_a_disabled_timer_delivers_nothing_until_enabled(
    make_config: ConfigFactory, clock: ManualClock
) -> None:
    store = open_store(make_config, clock)
    try:
        store.set_schedule_enabled(False)
        t0 = clock.now_ms()
        assert store.put_message(timer_message("T", b"x", t0 + 100, "D")).ok
        clock.advance(1000)
        step(store)
        assert real(store, "T") == []
        assert not store.timer_status().enabled
        store.set_schedule_enabled(True)
        step(store)
        assert len(real(store, "T")) == 1
    finally:
        store.shutdown()


def test_a_recalled_message_past_the_roll_window_is_not_delivered_even_after_a_restart(
    make_config: ConfigFactory, clock: ManualClock
) -> None:
    """The message waits in a roll slot, its marker in another: the recall holds
    while it rolls, and across a restart (the marker is durable)."""
    overrides = {"timer_roll_window_sec": 3600}
    store = open_store(make_config, clock, **overrides)
    t0 = clock.now_ms()
    due = t0 + 3 * 3_600_000
    assert store.put_message(timer_message("Far", b"gone", due, "GONE")).ok
    assert store.put_message(timer_message("Far", b"kept", due, "KEPT")).ok
    step(store)
    assert store.recall_timer("Far", due, "GONE")
    clock.advance(1_800_000)
    step(store)
    assert store.shutdown()
    store = open_store(make_config, clock, **overrides)  # the in-memory recall is gone
    try:
        while clock.now_ms() < due:
            clock.advance(600_000)
            step(store)
        clock.advance(1000)
        step(store)
        assert [r.uniq_key for r in real(store, "Far")] == ["KEPT"]
        assert store.timer_status().pending == 0
    finally:
        store.shutdown()
