"""Expired file deletion (RocketMQ's CleanCommitLogService / CleanConsumeQueueService).

A manual clock and an injected disk-use probe drive every decision: nothing
here waits for time to pass or fills a disk.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from basalt.store import ManualClock, Message, MessageStore, PutStatus
from basalt.store import expiry as expiry_module
from basalt.store.expiry import disk_used_percent
from basalt.store.get_message import GetStatus
from tests.support.polling import eventually_sync
from tests.support.stores import ConfigFactory, wait_indexed

TOPIC = "Expiring"
HOUR_MS = 3_600_000


def at_hour(hour: int, after_ms: int) -> int:
    """The first whole local hour ``hour`` at or after ``after_ms``."""
    t = after_ms - after_ms % HOUR_MS
    while time.localtime(t / 1000).tm_hour != hour:
        t += HOUR_MS
    return t


@pytest.fixture
def expiring(make_config: ConfigFactory, clock: ManualClock) -> Iterator[MessageStore]:
    """A store with 64 KiB CommitLog files, reserved 72 h, deleted at 04:00."""
    config = make_config(
        disk_max_used_space_ratio=75,
        disk_space_clean_forcibly_ratio=85,
        disk_space_warning_level_ratio=90,
        delete_commit_log_files_interval_ms=0,
        # The tests run expiry themselves: a timed run racing one would take its files.
        clean_resource_interval_ms=3_600_000,
    )
    clock.set(at_hour(10, 1_700_000_000_000))
    store = MessageStore.open(config, clock=clock)
    assert store.expiry is not None
    store.expiry.disk_usage = lambda path: 50.0
    try:
        yield store
    finally:
        store.shutdown()


def fill(store: MessageStore, files: int, queues: int = 2) -> int:
    """Write until the CommitLog has ``files`` files; returns how many messages."""
    n = 0
    while len(store.commitlog.files.files) < files:
        assert store.put_message(Message(TOPIC, b"x" * 900, queue_id=n % queues)).ok
        n += 1
    wait_indexed(store)  # expiry never deletes what the index has not read yet
    return n


def commitlog_files(store: MessageStore) -> list[int]:
    return [mf.file_from_offset for mf in store.commitlog.files.files]


def test_young_files_are_kept_even_at_the_delete_hour_or_on_request(
    expiring: MessageStore, clock: ManualClock
) -> None:
    fill(expiring, 4)
    before = commitlog_files(expiring)
    clock.set(at_hour(4, clock.now_ms() + 60 * HOUR_MS))  # 66 h later
    assert expiring.expiry is not None
    report = expiring.expiry.run_once()
    assert report.commitlog_files == []
    assert expiring.delete_expired_files().commitlog_files == []
    assert commitlog_files(expiring) == before


def test_old_files_are_deleted_only_at_the_delete_hour(
    expiring: MessageStore, clock: ManualClock
) -> None:
    fill(expiring, 4)
    before = commitlog_files(expiring)
    assert expiring.expiry is not None
    clock.set(at_hour(11, clock.now_ms() + 73 * HOUR_MS))  # old, but not 04:00
    assert expiring.expiry.run_once().commitlog_files == []
    clock.set(at_hour(4, clock.now_ms()))
    report = expiring.expiry.run_once()
    # Every file but the one being written goes, oldest first.
    assert [int(name) for name in report.commitlog_files] == before[:-1]
    assert commitlog_files(expiring) == before[-1:]
    assert expiring.min_physical_offset == before[-1]


def test_a_manual_request_deletes_expired_files_at_any_hour(
    expiring: MessageStore, clock: ManualClock
) -> None:
    fill(expiring, 3)
    clock.set(at_hour(15, clock.now_ms() + 80 * HOUR_MS))
    assert len(expiring.delete_expired_files().commitlog_files) == 2


def test_disk_pressure_deletes_old_files_then_young_ones_then_refuses_sends(
    expiring: MessageStore, clock: ManualClock
) -> None:
    fill(expiring, 3)
    expiry = expiring.expiry
    assert expiry is not None
    expiry.disk_usage = lambda path: 80.0  # over 75 %: expired files only, any hour
    assert expiry.run_once().commitlog_files == []
    clock.advance(73 * HOUR_MS)
    clock.set(at_hour(13, clock.now_ms()))
    assert len(expiry.run_once().commitlog_files) == 2
    fill(expiring, 3)  # young files
    expiry.disk_usage = lambda path: 87.0  # over 85 %: young files go too
    report = expiry.run_once()
    assert report.commitlog_files
    assert "disk 87.0% used" in report.reasons
    assert not expiry.disk_full
    expiry.disk_usage = lambda path: 95.0  # over 90 %: sends refused
    expiry.run_once()
    refused = expiring.put_message(Message(TOPIC, b"no room"))
    assert refused.status is PutStatus.SERVICE_NOT_AVAILABLE
    assert "disk_space_warning_level_ratio" in refused.detail
    expiry.disk_usage = lambda path: 60.0
    expiry.run_once()
    assert expiring.put_message(Message(TOPIC, b"room again")).ok


def test_files_the_dispatcher_has_not_finished_are_never_deleted(
    expiring: MessageStore, clock: ManualClock
) -> None:
    fill(expiring, 2)
    expiring.dispatcher.shutdown(drain=False)
    reput = expiring.dispatcher.reput_from_offset
    size = expiring.config.mapped_file_size_commit_log
    while expiring.max_physical_offset < reput + 3 * size:
        assert expiring.put_message(Message(TOPIC, b"y" * 900)).ok
    assert expiring.expiry is not None
    expiring.expiry.disk_usage = lambda path: 88.0  # clean at once
    expiring.expiry.run_once()
    assert expiring.min_physical_offset <= reput
    assert expiring.min_physical_offset == reput - reput % size


def test_consume_queue_files_follow_and_a_pull_below_the_min_is_too_small(
    expiring: MessageStore, clock: ManualClock
) -> None:
    n = fill(expiring, 6, queues=1)
    cq = expiring.get_consume_queue(TOPIC, 0)
    assert cq is not None
    cq_files_before = len(cq.files.files)
    clock.set(at_hour(4, clock.now_ms() + 73 * HOUR_MS))
    assert expiring.expiry is not None
    report = expiring.expiry.run_once()
    assert report.consume_queue_files > 0
    assert len(cq.files.files) == cq_files_before - report.consume_queue_files
    new_min = expiring.get_min_offset_in_queue(TOPIC, 0)
    assert new_min > 0
    # The min is the first unit whose record is still in the CommitLog.
    first = expiring.get_message_by_queue_offset(TOPIC, 0, new_min)
    assert first is not None
    assert first.commit_log_offset >= expiring.min_physical_offset
    too_small = expiring.get_message("G", TOPIC, 0, 0, 32)
    assert too_small.status is GetStatus.OFFSET_TOO_SMALL
    assert too_small.next_begin_offset == new_min
    rest = expiring.get_message("G", TOPIC, 0, new_min, 32)
    assert rest.status is GetStatus.FOUND
    assert rest.decode()[0].queue_offset == new_min
    assert expiring.get_max_offset_in_queue(TOPIC, 0) == n


def test_a_file_held_by_a_reader_waits_until_released_or_forced(
    make_config: ConfigFactory, clock: ManualClock
) -> None:
    config = make_config(
        delete_commit_log_files_interval_ms=0, destroy_mapped_file_interval_forcibly_ms=60_000
    )
    with MessageStore.open(config, clock=clock) as store:
        fill(store, 4)
        f0, f1, f2, _ = store.commitlog.files.files
        assert f1.hold()  # a reader on the second file
        clock.set(at_hour(4, clock.now_ms() + 73 * HOUR_MS))
        assert store.expiry is not None
        # The first file goes; the held one stops the run (files go from the front only).
        assert store.expiry.run_once().commitlog_files == [f0.path.name]
        assert not f1.closed  # the reader can still read
        assert not f1.hold()  # but no new reader gets it
        f1.release()
        assert store.expiry.run_once().commitlog_files == [f1.path.name, f2.path.name]
        assert not f1.path.exists()
        fill(store, 7)
        stuck = store.commitlog.files.files[0]
        assert stuck.hold()  # a reader that never lets go
        clock.advance(73 * HOUR_MS)
        assert store.delete_expired_files().commitlog_files == []
        clock.advance(60_000)  # destroy_mapped_file_interval_forcibly_ms later
        assert store.delete_expired_files().commitlog_files[0] == stuck.path.name
        assert stuck.closed


def test_reopened_store_ages_files_by_the_next_files_first_record(
    make_config: ConfigFactory, clock: ManualClock
) -> None:
    config = make_config(delete_commit_log_files_interval_ms=0)
    with MessageStore.open(config, clock=clock) as store:
        fill(store, 2)
        clock.advance(10 * HOUR_MS)
        fill(store, 4)
    with MessageStore.open(config, clock=clock) as store:
        assert store.expiry is not None
        files = commitlog_files(store)
        # 73 h after the first file's writes but not after the others': one file goes.
        clock.set(at_hour(4, clock.now_ms() - 10 * HOUR_MS + 73 * HOUR_MS))
        assert [int(f) for f in store.delete_expired_files().commitlog_files] == files[:1]


def test_bad_delete_when_is_refused(make_config: ConfigFactory) -> None:
    from basalt.store.errors import StoreConfigError

    with pytest.raises(StoreConfigError, match="delete_when"):
        make_config(delete_when="4am")
    assert make_config(delete_when="04;16").delete_hours == frozenset({4, 16})


# -- the space guard: measured as df does, when a file is created ------------------------


def test_disk_use_is_measured_as_df_shows_it(tmp_path: Path) -> None:
    df = subprocess.run(
        ["df", "--output=used,avail", "-B1", str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
    )
    used, avail = (int(v) for v in df.stdout.split()[-2:])
    # Root's reserve is neither used nor available; others write meanwhile.
    assert disk_used_percent(tmp_path) == pytest.approx(100 * used / (used + avail), abs=0.5)


def test_a_new_file_measures_disk_use_before_the_timer_or_the_next_send_would(
    expiring: MessageStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    expiry = expiring.expiry
    assert expiry is not None
    assert expiring.put_message(Message(TOPIC, b"measured at 50 %")).ok
    # Neither age nor CommitLog growth makes a send measure again in this test.
    monkeypatch.setattr(expiry_module, "SPACE_RECHECK_S", 3600.0)
    expiry.disk_usage = lambda path: 95.0
    assert expiring.put_message(Message(TOPIC, b"not measured: accepted")).ok
    # A new topic's first message: the dispatcher creates its ConsumeQueue file.
    assert expiring.put_message(Message("NewTopic", b"creates a file")).ok
    eventually_sync(lambda: expiry.disk_full, what="the guard run by the file's creation")
    refused = expiring.put_message(Message(TOPIC, b"refused"))
    assert refused.status is PutStatus.SERVICE_NOT_AVAILABLE
    assert "disk_space_warning_level_ratio" in refused.detail
