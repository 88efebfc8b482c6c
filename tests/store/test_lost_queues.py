"""Lost queues and lost records: no queue offset is ever issued twice (issue 28
points 2 and 3).

Each test writes through a real store, stops it, deletes files behind its
back the way an operator or a bad disk does, and restarts: the queue
manifest (``config/consumeQueueManifest.json``) tells recovery which queues
existed and how far, so a queue whose directory is gone is rebuilt from the
CommitLog, and a queue whose records the CommitLog no longer holds keeps its
offsets (min = max = the offset listed). ``store check`` must pass after.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from basalt.store import ManualClock, Message, MessageStore, MessageStoreConfig
from basalt.store.config import CQ_STORE_UNIT_SIZE
from basalt.store.consistency import check_store
from basalt.store.queue_manifest import manifest_path
from basalt.store.queue_repair import KeptOffsets
from basalt.store.recovery import TAIL_TOMBSTONE_BYTES, RecoveryReport
from tests.support.damage import read_queue
from tests.support.stores import SMALL_COMMITLOG_FILE, ConfigFactory

TOPIC = "Lost"
OTHER = "Kept"


@pytest.fixture
def config(make_config: ConfigFactory) -> MessageStoreConfig:
    return make_config()


@pytest.fixture
def opened(config: MessageStoreConfig, clock: ManualClock) -> Iterator[list[MessageStore]]:
    """The stores a test opened: each is shut down at the end if it still runs."""
    stores: list[MessageStore] = []
    yield stores
    for store in stores:
        store.shutdown()


def start(
    config: MessageStoreConfig, clock: ManualClock, opened: list[MessageStore], *, abnormal: bool
) -> tuple[MessageStore, RecoveryReport]:
    if abnormal:
        config.abort_path.touch()
    store = MessageStore.open(config, clock=clock)
    opened.append(store)
    assert store.recovery_report is not None
    return store, store.recovery_report


def send(store: MessageStore, topic: str, queue_id: int, count: int, size: int = 100) -> None:
    """``count`` messages, each body naming its queue offset (see :func:`expected`)."""
    for _ in range(count):
        i = store.commitlog.topic_queue_table.get((topic, queue_id), 0)  # the next offset
        body = f"{topic}-{queue_id}-{i}-".encode().ljust(size, b".")
        assert store.put_message(Message(topic, body, queue_id=queue_id)).queue_offsets == (i,)
    assert store.wait_dispatched()


def bodies(store: MessageStore, topic: str, queue_id: int) -> list[tuple[int, bytes]]:
    """What a consumer reading the queue from 0 gets: (queue offset, body)."""
    got, problems = read_queue(
        store, topic, queue_id, store.get_max_offset_in_queue(topic, queue_id)
    )
    assert not problems
    return sorted(got.items())


def expected(topic: str, queue_id: int, offsets: range, size: int = 100) -> list[tuple[int, bytes]]:
    return [(i, f"{topic}-{queue_id}-{i}-".encode().ljust(size, b".")) for i in offsets]


def queue_dir(config: MessageStoreConfig, topic: str, queue_id: int) -> Path:
    return config.consume_queue_dir / topic / str(queue_id)


def stop_and_check(store: MessageStore, config: MessageStoreConfig) -> None:
    assert store.shutdown()
    check = check_store(config.store_path_root_dir)
    assert check.ok, check.summary()


@pytest.mark.parametrize("abnormal", [False, True], ids=["normal", "abnormal"])
def test_a_lost_queue_directory_is_rebuilt_from_the_commitlog(
    config: MessageStoreConfig, clock: ManualClock, opened: list[MessageStore], abnormal: bool
) -> None:
    """Issue 28 point 2: the queue came back empty and its next send got offset 0."""
    store, _ = start(config, clock, opened, abnormal=False)
    send(store, TOPIC, 1, 75)
    send(store, OTHER, 0, 20)
    send(store, TOPIC, 1, 5)  # the queue's records on both sides of another's
    store.shutdown()
    shutil.rmtree(queue_dir(config, TOPIC, 1))

    store, report = start(config, clock, opened, abnormal=abnormal)

    assert report.queue_dirs_missing == 1 and report.kept_offsets == ()
    (rebuilt,) = [q for q in report.rebuilt_queues if (q.topic, q.queue_id) == (TOPIC, 1)]
    assert rebuilt.reasons == ("its directory is missing (the manifest lists max offset 80)",)
    assert (rebuilt.kept_to, rebuilt.max_offset, rebuilt.redispatch_from) == (0, 80, 0)
    assert report.redispatch_from_offset == 0  # the whole CommitLog, for that queue
    assert bodies(store, TOPIC, 1) == expected(TOPIC, 1, range(80))
    assert bodies(store, OTHER, 0) == expected(OTHER, 0, range(20))
    assert store.put_message(Message(TOPIC, b"next", queue_id=1)).queue_offsets == (80,)
    stop_and_check(store, config)
    store, report = start(config, clock, opened, abnormal=False)
    assert (report.queue_dirs_missing, report.rebuilt_queues) == (0, ())


def test_a_lost_queue_whose_records_left_the_commitlog_keeps_its_offsets(
    config: MessageStoreConfig, clock: ManualClock, opened: list[MessageStore]
) -> None:
    """Its records are gone (the CommitLog's first files deleted, as expiry does),
    so nothing can be rebuilt: min = max = the manifest's offset."""
    store, _ = start(config, clock, opened, abnormal=False)
    send(store, TOPIC, 0, 30, size=3000)
    first_kept = store.max_physical_offset // SMALL_COMMITLOG_FILE + 1
    send(store, OTHER, 0, 40, size=3000)
    store.shutdown()
    for index in range(first_kept):
        (config.commitlog_dir / f"{index * SMALL_COMMITLOG_FILE:020d}").unlink()
    shutil.rmtree(queue_dir(config, TOPIC, 0))

    store, report = start(config, clock, opened, abnormal=False)

    assert report.queue_dirs_missing == 1
    assert report.kept_offsets == (KeptOffsets(TOPIC, 0, 0, 30, emptied=True),)
    assert store.get_min_offset_in_queue(TOPIC, 0) == store.get_max_offset_in_queue(TOPIC, 0)
    assert store.get_max_offset_in_queue(TOPIC, 0) == 30
    assert bodies(store, TOPIC, 0) == []
    assert store.put_message(Message(TOPIC, b"next", queue_id=0)).queue_offsets == (30,)
    assert store.wait_dispatched()
    assert bodies(store, TOPIC, 0) == [(30, b"next")]
    stop_and_check(store, config)


def test_a_lost_queue_is_rebuilt_from_the_records_the_commitlog_still_holds(
    config: MessageStoreConfig, clock: ManualClock, opened: list[MessageStore]
) -> None:
    """Its oldest records expired with the CommitLog's first file: the queue comes
    back from the first record left (blank units before it, as RocketMQ's
    fillPreBlank), every later one readable, its max the manifest's."""
    store, _ = start(config, clock, opened, abnormal=False)
    send(store, TOPIC, 0, 60, size=3000)
    store.shutdown()
    (config.commitlog_dir / f"{0:020d}").unlink()
    shutil.rmtree(queue_dir(config, TOPIC, 0))

    store, report = start(config, clock, opened, abnormal=False)

    first = store.get_min_offset_in_queue(TOPIC, 0)
    assert 0 < first < 60
    assert report.queue_dirs_missing == 1 and report.kept_offsets == ()
    assert store.get_max_offset_in_queue(TOPIC, 0) == 60
    assert bodies(store, TOPIC, 0) == expected(TOPIC, 0, range(first, 60), size=3000)
    assert store.put_message(Message(TOPIC, b"next", queue_id=0)).queue_offsets == (60,)
    stop_and_check(store, config)


def _zero_last_units(directory: Path, count: int) -> None:
    last = max(directory.iterdir())
    data = bytearray(last.read_bytes())
    written = len(data.rstrip(b"\0"))
    written += -written % CQ_STORE_UNIT_SIZE
    data[written - count * CQ_STORE_UNIT_SIZE : written] = bytes(count * CQ_STORE_UNIT_SIZE)
    last.write_bytes(bytes(data))


def test_a_queue_that_lost_its_last_units_is_refilled_from_the_commitlog(
    config: MessageStoreConfig, clock: ManualClock, opened: list[MessageStore]
) -> None:
    """The files alone say the queue is whole (units end cleanly); the manifest says
    it was longer, so it is re-dispatched from its own end."""
    store, _ = start(config, clock, opened, abnormal=False)
    send(store, TOPIC, 0, 10)
    send(store, OTHER, 0, 10)
    store.shutdown()
    _zero_last_units(queue_dir(config, TOPIC, 0), 3)

    store, report = start(config, clock, opened, abnormal=False)

    (rebuilt,) = report.rebuilt_queues
    assert rebuilt.reasons == ("it ends at queue offset 7 but the manifest lists max offset 10",)
    assert (rebuilt.kept_to, rebuilt.max_offset) == (7, 10)
    assert report.consume_queue_entries_rebuilt == 3
    assert bodies(store, TOPIC, 0) == expected(TOPIC, 0, range(10))
    stop_and_check(store, config)


@pytest.mark.parametrize("abnormal", [False, True], ids=["normal", "abnormal"])
def test_records_lost_with_their_units_keep_their_offsets(
    config: MessageStoreConfig, clock: ManualClock, opened: list[MessageStore], abnormal: bool
) -> None:
    """The end of the log and the queue's last units both lost (a power cut under
    ASYNC_FLUSH can do this): the offsets the manifest vouched for stay taken,
    and a tombstone at the log's end says the queue offsets jump across it."""
    store, _ = start(config, clock, opened, abnormal=False)
    send(store, OTHER, 0, 5)
    send(store, TOPIC, 0, 10)
    cut = store.get_message_by_queue_offset(TOPIC, 0, 7)
    assert cut is not None
    store.shutdown()
    last = max(config.commitlog_dir.iterdir())
    with last.open("r+b") as f:  # the last 3 records: zeros, as pages never written
        f.seek(cut.commit_log_offset % SMALL_COMMITLOG_FILE)
        f.write(bytes(SMALL_COMMITLOG_FILE - cut.commit_log_offset % SMALL_COMMITLOG_FILE))
    _zero_last_units(queue_dir(config, TOPIC, 0), 3)

    store, report = start(config, clock, opened, abnormal=abnormal)

    assert report.kept_offsets == (KeptOffsets(TOPIC, 0, 7, 10, emptied=False),)
    assert report.last_valid_offset == cut.commit_log_offset + TAIL_TOMBSTONE_BYTES
    assert bodies(store, TOPIC, 0) == expected(TOPIC, 0, range(7))
    assert store.put_message(Message(TOPIC, b"next", queue_id=0)).queue_offsets == (10,)
    assert store.put_message(Message(OTHER, b"next", queue_id=0)).queue_offsets == (5,)
    stop_and_check(store, config)


@pytest.mark.parametrize("abnormal", [False, True], ids=["normal", "abnormal"])
def test_with_the_commitlog_and_every_queue_gone_the_manifest_keeps_the_offsets(
    config: MessageStoreConfig, clock: ManualClock, opened: list[MessageStore], abnormal: bool
) -> None:
    store, _ = start(config, clock, opened, abnormal=False)
    send(store, TOPIC, 0, 12)
    send(store, TOPIC, 3, 4)
    store.commit_offset("g", TOPIC, 0, 9)
    store.shutdown()
    shutil.rmtree(config.commitlog_dir)
    shutil.rmtree(config.consume_queue_dir)

    store, report = start(config, clock, opened, abnormal=abnormal)

    assert report.commitlog_missing and report.queue_dirs_missing == 2
    assert report.kept_offsets == (
        KeptOffsets(TOPIC, 0, 0, 12, emptied=True),
        KeptOffsets(TOPIC, 3, 0, 4, emptied=True),
    )
    assert report.last_valid_offset == TAIL_TOMBSTONE_BYTES
    assert [store.get_min_offset_in_queue(TOPIC, q) for q in (0, 3)] == [12, 4]
    assert store.query_offset("g", TOPIC, 0) == 9  # a consumer there moves on to 12
    result = store.get_message("g", TOPIC, 0, 9, 8)
    assert (result.decode(), result.next_begin_offset) == ([], 12)
    assert store.put_message(Message(TOPIC, b"next", queue_id=0)).queue_offsets == (12,)
    assert store.put_message(Message(TOPIC, b"next", queue_id=3)).queue_offsets == (4,)
    stop_and_check(store, config)


def test_without_a_manifest_a_lost_directory_is_not_detected(
    config: MessageStoreConfig, clock: ManualClock, opened: list[MessageStore]
) -> None:
    """The limit, stated: a store written before manifests (or whose manifest was
    deleted too) cannot tell a lost queue from one never written."""
    store, _ = start(config, clock, opened, abnormal=False)
    send(store, TOPIC, 0, 5)
    send(store, OTHER, 0, 5)  # re-dispatch resumes after these: no queue is all gone
    store.shutdown()
    manifest_path(config.store_path_root_dir).unlink()
    shutil.rmtree(queue_dir(config, TOPIC, 0))

    store, report = start(config, clock, opened, abnormal=False)

    assert report.queue_manifest == "queue manifest: none"
    assert report.queue_dirs_missing == 0
    assert store.get_max_offset_in_queue(TOPIC, 0) == 0
