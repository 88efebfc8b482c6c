"""The store's side of replication: transfer reads, replicated appends, and dispatch
bounded by the confirm offset (controller mode), across a kill -9 too."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from basalt.store import ManualClock, Message, MessageStore
from basalt.store.config import FlushDiskType
from basalt.store.consistency import check_store
from basalt.store.replica_log import ReplicaDataError, ReplicaOffsetError
from tests.support.polling import eventually_sync
from tests.support.processes import REPO_ROOT
from tests.support.stores import ConfigFactory, fill_store, small_store_config
from tests.support.timeouts import SUBPROCESS_TIMEOUT_S

#: Tiny CommitLog files: a transfer crosses many rolls.
TINY = 16 * 1024


def _pair(tmp_path: Path, clock: ManualClock) -> tuple[MessageStore, MessageStore]:
    master = MessageStore.open(
        small_store_config(tmp_path / "master", mapped_file_size_commit_log=TINY), clock=clock
    )
    slave = MessageStore.open(
        small_store_config(tmp_path / "slave", mapped_file_size_commit_log=TINY), clock=clock
    )
    return master, slave


def _copy(master: MessageStore, slave: MessageStore, frame_sizes: list[int]) -> int:
    """Transfer everything the master has; returns the number of frames."""
    frames = 0
    while slave.max_offset < master.max_offset:
        offset = slave.max_offset
        data = master.read_for_transfer(offset, frame_sizes[frames % len(frame_sizes)], -1)
        assert data, offset
        assert slave.append_replicated(offset, data) == offset + len(data) or len(data) == 8
        frames += 1
    return frames


def _queues(store: MessageStore) -> dict[tuple[str, int], list[tuple[int, int, int, int]]]:
    return {(cq.topic, cq.queue_id): list(cq.iter_units()) for cq in store.consume_queues}


def test_transfer_is_byte_identical_across_rolls(tmp_path: Path, clock: ManualClock) -> None:
    master, slave = _pair(tmp_path, clock)
    try:
        fill_store(master, clock, rounds=20)
        assert master.commitlog.files.files[-1].file_from_offset >= 5 * TINY
        frames = _copy(master, slave, [1, 700, 5000, TINY])
        assert frames > 10
        # More after a first catch-up: the slave continues from where it is.
        master.put_messages([Message("TopicA", b"late" * 100, queue_id=1)] * 5)
        _copy(master, slave, [3000])
        assert master.wait_dispatched() and slave.wait_dispatched()
        assert _queues(slave) == _queues(master)
        assert slave.commitlog.topic_queue_table == master.commitlog.topic_queue_table
        record = slave.get_message("g", "TopicA", 1, 0, 1).decode()[0]
        assert record.topic == "TopicA" and record.queue_offset == 0
    finally:
        master.shutdown()
        slave.shutdown()
    m_files = sorted((tmp_path / "master" / "commitlog").iterdir())
    s_files = sorted((tmp_path / "slave" / "commitlog").iterdir())
    assert [f.name for f in m_files] == [f.name for f in s_files]
    for m, s in zip(m_files, s_files, strict=True):
        assert m.read_bytes() == s.read_bytes(), m.name
    # The slave's copy recovers as its own store would.
    again = MessageStore.open(
        small_store_config(tmp_path / "slave", mapped_file_size_commit_log=TINY), clock=clock
    )
    try:
        assert again.recovery_report is not None
        assert not again.recovery_report.damaged_spans
        assert again.get_max_offset_in_queue("TopicA", 1) > 0
    finally:
        again.shutdown()


def test_append_replicated_refuses_bad_frames(tmp_path: Path, clock: ManualClock) -> None:
    master, slave = _pair(tmp_path, clock)
    try:
        for i in range(4):
            master.put_message(Message("T", b"x" * (100 + i), queue_id=0))
        data = master.read_for_transfer(0, 1 << 20, -1)
        sizes = [master.commitlog.record_size_at(0)]
        assert sizes[0] is not None and len(data) > sizes[0]
        with pytest.raises(ReplicaOffsetError):
            slave.append_replicated(100, data)  # an empty log starts at a file boundary
        damaged = bytearray(data)
        damaged[sizes[0] - 5] ^= 0xFF  # a byte of the first record's body or properties
        with pytest.raises(ReplicaDataError):
            slave.append_replicated(0, bytes(damaged))
        with pytest.raises(ReplicaDataError):
            slave.append_replicated(0, data[:-1])  # the last record cut short
        assert slave.max_offset == 0
        assert slave.append_replicated(0, data[: sizes[0]]) == sizes[0]
        with pytest.raises(ReplicaOffsetError):
            slave.append_replicated(0, data[: sizes[0]])  # not the max offset any more
        # The second record has its own PHYSICALOFFSET: sent for the wrong place, refused.
        with pytest.raises(ReplicaOffsetError):
            slave.append_replicated(sizes[0] + 1, data[sizes[0] :])
        assert slave.append_replicated(sizes[0], data[sizes[0] :]) == len(data)
    finally:
        master.shutdown()
        slave.shutdown()


def test_read_for_transfer_bounds(tmp_path: Path, clock: ManualClock) -> None:
    master, slave = _pair(tmp_path, clock)
    try:
        result = master.put_messages([Message("T", b"y" * 200, queue_id=0)] * 3)
        first, second = result.physical_offsets[0], result.physical_offsets[1]
        assert master.read_for_transfer(0, 1, -1) == master.commitlog.read(0, result.sizes[0])
        # Never past end_offset: the record that would cross it is not sent.
        assert len(master.read_for_transfer(0, 1 << 20, second + 1)) == second - first
        assert master.read_for_transfer(0, 1 << 20, 10) == b""
        assert master.read_for_transfer(master.max_offset, 100, -1) == b""
        with pytest.raises(ReplicaOffsetError):
            master.read_for_transfer(1, 100, -1)
        with pytest.raises(ReplicaOffsetError):
            master.read_for_transfer(-1, 100, -1)
    finally:
        master.shutdown()
        slave.shutdown()


def test_controller_mode_dispatches_up_to_the_confirm_offset(
    make_config: ConfigFactory, clock: ManualClock
) -> None:
    store = MessageStore.open(make_config(enable_controller_mode=True), clock=clock)
    arrived: list[tuple[str, int, int]] = []
    store.add_arrival_listener(lambda t, q, m: arrived.append((t, q, m)))
    try:
        result = store.put_messages([Message("T", b"z" * 50, queue_id=0)] * 6)
        assert store.confirm_offset == 0
        assert store.wait_dispatched(1.0)  # "dispatched" means up to the confirm offset
        assert store.get_max_offset_in_queue("T", 0) == 0 and not arrived
        # Inside the fourth record: dispatch stops at its start, no stall.
        store.set_confirm_offset(result.physical_offsets[3] + 1)
        assert store.dispatcher.wait_until_dispatched(result.physical_offsets[3])
        assert store.get_max_offset_in_queue("T", 0) == 3
        assert store.dispatcher.stalled_reason is None
        assert arrived and arrived[-1] == ("T", 0, 3)
        store.set_confirm_offset(10)  # never backwards
        assert store.confirm_offset == result.physical_offsets[3] + 1
        store.set_confirm_offset(1 << 40)  # clamped to the max offset
        assert store.confirm_offset == store.max_offset
        assert store.wait_dispatched()
        assert store.get_max_offset_in_queue("T", 0) == 6
    finally:
        assert store.shutdown()


def test_controller_mode_off_confirm_is_the_max_offset(store: MessageStore) -> None:
    store.put_message(Message("T", b"a", queue_id=0))
    store.set_confirm_offset(0)
    assert store.confirm_offset == store.max_offset
    assert store.wait_dispatched() and store.get_max_offset_in_queue("T", 0) == 1


def test_flush_to_async(make_config: ConfigFactory, clock: ManualClock) -> None:
    for kind in (FlushDiskType.SYNC_FLUSH, FlushDiskType.ASYNC_FLUSH):
        store = MessageStore.open(
            make_config(flush_disk_type=kind, flush_interval_commit_log_ms=60_000), clock=clock
        )
        try:
            store.put_message(Message("T", b"f" * 10, queue_id=0))
            flushed = asyncio.run(store.flush_to_async(store.max_offset))
            assert flushed >= store.max_offset
            assert store.flushed_offset >= store.max_offset
        finally:
            store.shutdown()


_CRASH_CHILD = textwrap.dedent(
    """
    import json, os, signal, sys
    from basalt.store import Message, MessageStore, MessageStoreConfig

    config = MessageStoreConfig(
        store_path_root_dir=sys.argv[1],
        mapped_file_size_commit_log=64 * 1024,
        mapped_file_size_consume_queue=20 * 64,
        enable_controller_mode=True,
        max_hash_slot_num=512,
        max_index_num=2048,
        disk_max_used_space_ratio=100,
        disk_space_clean_forcibly_ratio=100,
        disk_space_warning_level_ratio=100,
    )
    store = MessageStore.open(config)
    result = store.put_messages([Message("T", b"c" * 100, queue_id=0)] * 20)
    confirm = result.physical_offsets[10]
    store.set_confirm_offset(confirm)
    assert store.dispatcher.wait_until_dispatched(confirm)
    store._flush_cq.flush_now()  # the checkpoint holds the confirm offset now
    print(json.dumps({"confirm": confirm, "phys": list(result.physical_offsets)}), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


def test_restart_above_the_confirm_offset_keeps_queue_offsets(tmp_path: Path) -> None:
    root = tmp_path / "store"
    child = subprocess.run(
        [sys.executable, "-c", _CRASH_CHILD, str(root)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
        check=False,
    )
    assert child.returncode == -9, child.stderr
    sent = json.loads(child.stdout)
    config = small_store_config(
        root, mapped_file_size_commit_log=64 * 1024, enable_controller_mode=True
    )
    store = MessageStore.open(config)
    try:
        assert store.recovery_report is not None and store.recovery_report.abnormal
        assert store.confirm_offset == sent["confirm"]
        assert store.get_max_offset_in_queue("T", 0) == 10
        # A new record takes the next offset after the undispatched ones (#7689).
        late = store.put_message(Message("T", b"late", queue_id=0))
        assert late.queue_offsets == (20,)
        store.set_confirm_offset(store.max_offset)
        assert store.wait_dispatched()
        assert store.get_max_offset_in_queue("T", 0) == 21
        records = store.get_message("g", "T", 0, 0, 64).decode()
        assert [r.queue_offset for r in records] == list(range(21))
        assert [r.commit_log_offset for r in records[:20]] == sent["phys"]
    finally:
        assert store.shutdown()


def test_replica_state_round_trip_with_pops_in_flight(tmp_path: Path, clock: ManualClock) -> None:
    master, slave = _pair(tmp_path, clock)
    try:
        master.put_messages([Message("T", b"p" * 20, queue_id=0)] * 6)
        assert master.wait_dispatched()
        master.commit_offset("plain", "T", 0, 4)
        now = clock.now_ms()
        popped = master.pop.pop("G", "T", 0, 4, 30_000, now)
        assert [p.queue_offset for p in popped] == [0, 1, 2, 3]
        assert master.pop.ack("G", "T", 0, 1, popped[1].nonce).name == "OK"
        _copy(master, slave, [1 << 20])
        assert slave.wait_dispatched()
        state = master.replica_state()
        slave.install_replica_state(state)
        assert slave.query_offset("plain", "T", 0) == 4
        assert slave.query_offset("G", "T", 0) == master.query_offset("G", "T", 0) == 0
        assert slave.pop.in_flight("G", "T", 0) == master.pop.in_flight("G", "T", 0)
        assert sorted(slave.pop.in_flight("G", "T", 0)) == [0, 2, 3]
        # The slave, master after a failover, answers as the master would: an ack of a
        # delivery in flight is OK, the already acked one is stale, and new pops go on
        # from the cursor; the in-flight ones come back only after their invisible time.
        assert slave.pop.ack("G", "T", 0, 2, popped[2].nonce).name == "OK"
        assert slave.pop.ack("G", "T", 0, 1, popped[1].nonce).name == "STALE"
        again = slave.pop.pop("G", "T", 0, 8, 60_000, now + 1)
        assert [p.queue_offset for p in again] == [4, 5]
        later = slave.pop.pop("G", "T", 0, 8, 30_000, now + 31_000)
        assert [p.queue_offset for p in later] == [0, 3]
        with pytest.raises(ReplicaDataError):
            slave.install_replica_state(state[:-1] + bytes([state[-1] ^ 1]))
    finally:
        master.shutdown()
        slave.shutdown()
    # Persisted: the slave's offsets and pop state survive its restart.
    again_store = MessageStore.open(
        small_store_config(tmp_path / "slave", mapped_file_size_commit_log=TINY), clock=clock
    )
    try:
        assert again_store.query_offset("plain", "T", 0) == 4
        assert sorted(again_store.pop.in_flight("G", "T", 0)) == [0, 3, 4, 5]
    finally:
        again_store.shutdown()


def test_store_check_of_a_controller_mode_store_stopped_above_its_confirm_offset(
    make_config: ConfigFactory, clock: ManualClock
) -> None:
    config = make_config(enable_controller_mode=True)
    store = MessageStore.open(config, clock=clock)
    result = store.put_messages([Message("T", b"c" * 30, queue_id=0)] * 4)
    store.set_confirm_offset(result.physical_offsets[2])
    assert store.wait_dispatched()
    assert store.shutdown()  # clean: the records above wait for the confirm offset
    report = check_store(config.store_path_root_dir)
    assert report.ok, report.summary()
    store = MessageStore.open(config, clock=clock)
    try:
        assert store.confirm_offset == result.physical_offsets[2]
        assert store.get_max_offset_in_queue("T", 0) == 2
    finally:
        store.shutdown()


def test_the_delay_and_timer_progress_reaches_a_slave_and_survives_its_restart(
    tmp_path: Path, clock: ManualClock
) -> None:
    """A slave takes its master's delayOffset.json with the replica state (and
    keeps it across a restart): promoted, it does not deliver again what the
    master delivered. A delivering store ignores an adopted progress."""
    master, slave = _pair(tmp_path, clock)
    try:
        slave.set_schedule_enabled(False)
        for level in (1, 2):
            assert master.put_message(Message("T", b"d%d" % level, delay_time_level=level)).ok
        assert master.wait_dispatched()
        clock.advance(1_000)
        master.schedule.deliver_due()
        assert master.schedule.offsets == {1: 1, 2: 0}
        _copy(master, slave, [1 << 20])
        assert slave.wait_dispatched()
        # The timers' scan position travels too (store.timer.api.adopt's rules).
        eventually_sync(
            lambda: master.timer_status().scan_ms >= clock.now_ms(), what="the master's scan"
        )
        assert slave.timer_status().scan_ms < master.timer_status().scan_ms  # not scanning
        slave.install_replica_state(master.replica_state())
        assert slave.schedule.offsets == {1: 1, 2: 0}
        assert slave.timer_status().scan_ms == master.timer_status().scan_ms
        master.schedule.adopt(b'{"offsetTable": {}}')
        assert master.schedule.offsets == {1: 1, 2: 0}  # the master's own is the truth
    finally:
        master.shutdown()
        slave.shutdown()
    again = MessageStore.open(
        small_store_config(tmp_path / "slave", mapped_file_size_commit_log=TINY), clock=clock
    )
    try:
        assert again.schedule.offsets == {1: 1, 2: 0}
        clock.advance(4_000)
        again.schedule.deliver_due()  # promoted: only level 2's message is due and new
        again.wait_dispatched()
        bodies = sorted(r.body for q in range(4) for _, r in again.iter_queue("T", q))
        assert bodies == [b"d1", b"d2"]
    finally:
        again.shutdown()
