"""Timers across crashes and damage (store.timer): a store not shut down cleanly,
a real kill -9 mid-delivery, a damaged or missing TimerLog / wheel / checkpoint
(rebuilt from the timer topic's ConsumeQueue), ``store check``, the file
units (wheel roll-over, TimerLog files), and a slave adopting its master's
progress."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

from basalt.common.message import PROPERTY_TIMER_DELIVER_MS
from basalt.store import ManualClock, MessageStore
from basalt.store.consistency import check_store
from basalt.store.timer.checkpoint import decode_progress, decode_state, encode_progress
from basalt.store.timer.files import (
    ENTRY_SIZE,
    MAGIC_DEFAULT,
    TimerLog,
    TimerWheel,
    encode_entry,
)
from tests.support.polling import eventually_sync
from tests.support.stores import ConfigFactory, small_store_config
from tests.support.system_topics import dispatched, real, step, timer_message
from tests.support.system_topics import open_timer_store as open_store


def crash(store: MessageStore) -> None:
    """Stop ``store`` as a crash would for the timer: its files closed without a
    last checkpoint (the rest of the store stops, then ``abort`` is left as a
    crash leaves it). The real kill -9 is test_a_kill_9_loses_no_timer_message."""
    store.timer.stop_thread()
    store.timer.close()  # no checkpoint: what happened since the last one is lost
    store.shutdown()
    store.config.abort_path.touch()


def uniq_keys(store: MessageStore, topic: str) -> list[str]:
    return [r.uniq_key or "" for r in real(store, topic)]


# -- units ------------------------------------------------------------------------------


def test_the_wheel_rolls_over_its_ring_without_mixing_turns(tmp_path: Path) -> None:
    wheel = TimerWheel(tmp_path / "wheel", 10)
    assert wheel.open()
    wheel.put(3, 100, 200, 2)
    wheel.put(17, 5, 5, 1)
    wheel.write_dirty([(t, *s) for t, s in wheel.dirty.items()])
    wheel.dirty.clear()
    assert wheel.get(3) == (100, 200, 2)
    assert wheel.get(13) is None  # the same index, the next turn: empty
    assert wheel.get(23) is None
    assert wheel.get(17) == (5, 5, 1)
    assert wheel.get(7) is None  # 17's index, an earlier turn
    # A range across the ring's end reads both sides.
    assert [t for t, *_ in wheel.occupied(15, 10)] == [17]
    assert [t for t, *_ in wheel.occupied(0, 10)] == [3]
    wheel.close()
    assert not TimerWheel(tmp_path / "wheel", 11).open()  # another ring: rebuild


def test_the_timer_log_spans_files_and_chains_entries(tmp_path: Path) -> None:
    file_size = ENTRY_SIZE * 3 + 10  # 3 entries a file, 10 bytes unused
    tlog = TimerLog(tmp_path / "log", file_size)
    tlog.load()
    prev = -1
    positions = []
    for i in range(7):
        prev = tlog.append(encode_entry(prev, 50, 5000 + i, i * 100, 90, MAGIC_DEFAULT, 7))
        positions.append(prev)
    tlog.sync()
    assert positions == [0, 48, 96, file_size, file_size + 48, file_size + 96, 2 * file_size]
    chain = tlog.chain(positions[-1])
    assert [e.deliver_ms for e in chain] == [5000 + i for i in range(7)]
    assert tlog.covers(tlog.end) is None
    tlog.truncate(positions[4])
    assert tlog.file_starts == [0, file_size]
    assert tlog.end == positions[4]
    assert tlog.read(positions[4]) is None
    tlog.delete_file(0)  # scanned past: the log starts later, still whole
    assert tlog.file_starts == [file_size]
    assert tlog.covers(positions[4]) is None
    os.truncate(tmp_path / "log" / f"{file_size:020d}", 10)
    assert "has 10 bytes" in (tlog.covers(positions[4]) or "")
    tlog.close()


def test_progress_bytes_round_trip_and_bad_ones_are_refused() -> None:
    assert decode_progress(encode_progress(1234, 56)) == (1234, 56)
    for bad in (b"", b"x" * 20, b"BTP1" + b"\xff" * 16):
        try:
            decode_progress(bad)
        except ValueError:
            continue
        raise AssertionError(f"{bad!r} was accepted")


# -- crashes ----------------------------------------------------------------------------


def test_a_store_not_shut_down_cleanly_delivers_every_timer(
    make_config: ConfigFactory, clock: ManualClock
) -> None:
    store = open_store(make_config, clock)
    t0 = clock.now_ms()
    for i in range(40):
        assert store.put_message(timer_message("T", b"%d" % i, t0 + 50 * (i + 1), f"U{i}")).ok
    step(store)
    store.timer.checkpoint()
    for i in range(40, 60):  # filed after the checkpoint: lost with the crash, filed again
        assert store.put_message(timer_message("T", b"%d" % i, t0 + 50 * (i + 1), f"U{i}")).ok
    clock.advance(1000)  # 20 delivered after the checkpoint: delivered again
    step(store)
    assert len(uniq_keys(store, "T")) == 20
    crash(store)

    store = open_store(make_config, clock)
    try:
        assert store.timer.rebuilt is None
        clock.advance(5000)
        step(store)
        copies = Counter(uniq_keys(store, "T"))
        assert set(copies) == {f"U{i}" for i in range(60)}
        assert max(copies.values()) <= 2
        assert store.timer_status().pending == 0
    finally:
        store.shutdown()


def test_a_damaged_timer_log_is_rebuilt_from_the_timer_topic(
    make_config: ConfigFactory, clock: ManualClock
) -> None:
    store = open_store(make_config, clock)
    t0 = clock.now_ms()
    for i in range(30):
        assert store.put_message(timer_message("T", b"%d" % i, t0 + 100 * (i + 1), f"U{i}")).ok
    step(store)
    clock.advance(1000)
    step(store)  # 10 delivered
    assert store.shutdown()
    root = store.config.store_path_root_dir
    [log_file] = list((root / "timerlog").iterdir())
    with open(log_file, "r+b") as f:
        f.seek(os.path.getsize(log_file) - 10)
        f.write(b"\xff" * 10)
    report = check_store(root)
    assert any(p.code == "timer-log" for p in report.problems), report.summary()

    store = open_store(make_config, clock)
    try:
        assert store.timer.rebuilt is not None and "damaged" in store.timer.rebuilt
        step(store)
        # Nothing delivered before the checkpoint is delivered again; the rest is.
        assert sorted(int(r.body) for r in real(store, "T")) == list(range(10))
        assert store.timer_status().pending == 20
        clock.advance(3000)
        step(store)
        assert sorted(int(r.body) for r in real(store, "T")) == list(range(30))
        assert check_store(root).ok
    finally:
        store.shutdown()
    assert check_store(root).ok


def test_a_lost_checkpoint_or_wheel_rebuilds_and_loses_nothing(
    make_config: ConfigFactory, clock: ManualClock
) -> None:
    store = open_store(make_config, clock)
    t0 = clock.now_ms()
    for i in range(10):
        assert store.put_message(timer_message("T", b"%d" % i, t0 + 1000, f"U{i}")).ok
    step(store)
    assert store.shutdown()
    root = store.config.store_path_root_dir
    (root / "timerwheel").write_bytes(b"short")
    assert not check_store(root).ok
    store = open_store(make_config, clock)
    assert store.timer.rebuilt is not None and "timerwheel" in store.timer.rebuilt
    step(store)
    assert store.shutdown()
    (root / "config" / "timercheck").unlink()
    assert any(p.code == "timer-checkpoint" for p in check_store(root).problems)
    store = open_store(make_config, clock)
    try:
        assert store.timer.rebuilt is not None
        clock.advance(1000)
        step(store)
        assert sorted(int(r.body) for r in real(store, "T")) == list(range(10))
    finally:
        store.shutdown()


def test_store_check_passes_a_store_with_timers_and_knows_the_checkpoint(
    make_config: ConfigFactory, clock: ManualClock
) -> None:
    store = open_store(make_config, clock)
    t0 = clock.now_ms()
    for i in range(5):
        assert store.put_message(timer_message("T", b"x", t0 + 10_000, f"U{i}")).ok
    step(store)
    assert store.shutdown()
    root = store.config.store_path_root_dir
    assert check_store(root).ok
    state = decode_state((root / "config" / "timercheck").read_bytes())
    assert state.enqueue_offset == 5 and state.log_end == 5 * ENTRY_SIZE
    assert state.counts == {"T": 5}
    (root / "config" / "timercheck").write_bytes(b"junk")
    assert any(p.code == "timer-checkpoint" for p in check_store(root).problems)


# -- controller mode --------------------------------------------------------------------


def test_a_slave_adopts_its_masters_progress_and_delivers_only_once_promoted(
    tmp_path: Path, clock: ManualClock
) -> None:
    """Two stores fed the same puts, as replication would: the master delivers;
    the slave files, adopts the master's progress, and after promotion delivers
    only what the master had not."""
    master = MessageStore.open(small_store_config(tmp_path / "m"), clock=clock)
    slave = MessageStore.open(small_store_config(tmp_path / "s"), clock=clock)
    for s in (master, slave):
        s.timer.stop_thread()
    slave.set_schedule_enabled(False)
    try:
        t0 = clock.now_ms()
        for i in range(10):
            m = timer_message("T", b"%d" % i, t0 + 100 * (i + 1), f"U{i}")
            assert master.put_message(m).ok and slave.put_message(m).ok
        clock.advance(500)
        for s in (master, slave):
            step(s)
        assert len(real(master, "T")) == 5
        assert real(slave, "T") == []
        assert slave.timer_status().pending == 10
        slave.adopt_timer_progress(master.timer_progress())
        assert slave.timer_status().scan_ms == master.timer_status().scan_ms
        assert slave.timer_status().pending == 5
        # Promoted: the slave delivers the rest, not what the master did.
        slave.set_schedule_enabled(True)
        clock.advance(1000)
        step(slave)
        assert sorted(int(r.body) for r in real(slave, "T")) == [5, 6, 7, 8, 9]
    finally:
        master.shutdown()
        slave.shutdown()


# -- kill -9 ----------------------------------------------------------------------------

_CHILD = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from basalt.common.message import Message, PROPERTY_UNIQ_KEY, PROPERTY_TIMER_DELAY_MS
    from basalt.store import MessageStore
    from tests.support.stores import small_store_config
    root, count = Path(sys.argv[1]), int(sys.argv[2])
    store = MessageStore.open(small_store_config(root, timer_flush_interval_ms=200))
    for i in range(0, count, 100):
        batch = [Message("Real", b"%d" % j, queue_id=j % 2,
                         properties={PROPERTY_UNIQ_KEY: "U%d" % j,
                                     PROPERTY_TIMER_DELAY_MS: str(1000 + j % 2000)})
                 for j in range(i, i + 100)]
        assert store.put_messages(batch).ok
    print("sent", flush=True)
    while True:
        time.sleep(0.05)
        print("delivered", store.timer.delivered, flush=True)
    """
)


def test_a_kill_9_loses_no_timer_message(tmp_path: Path) -> None:
    root = tmp_path / "store"
    count = 3000
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(root), str(count)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "sent"
        for line in child.stdout:  # kill mid-delivery: some delivered, not all
            if int(line.split()[1]) >= count // 3:
                break
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert (root / "abort").exists()
    store = MessageStore.open(small_store_config(root))
    try:

        def all_delivered() -> bool:
            dispatched(store)
            got = {r.uniq_key for q in (0, 1) for _, r in store.iter_queue("Real", q)}
            return got == {f"U{i}" for i in range(count)}

        eventually_sync(all_delivered, timeout_s=60, what="every timer delivered")
        copies = Counter(r.uniq_key for q in (0, 1) for _, r in store.iter_queue("Real", q))
        print(f"kill -9: {count} delivered, {sum(n - 1 for n in copies.values())} duplicates")
        for q in (0, 1):
            for _, r in store.iter_queue("Real", q):
                assert r.uniq_key is not None and int(r.body) % 2 == q
                assert r.store_timestamp_ms >= int(r.properties[PROPERTY_TIMER_DELIVER_MS])
    finally:
        store.shutdown()
