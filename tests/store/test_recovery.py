"""Recovery on restart, RocketMQ's recoverNormally / recoverAbnormally.

Each test writes through a real store, shuts it down, damages files on disk
the way a crash or a bad disk would, optionally leaves the ``abort`` file
behind (abnormal recovery), reopens with ``MessageStore.open`` and checks
both the store's state and its ``recovery_report``.
"""

from __future__ import annotations

import os
import shutil
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from basalt.common.message import TRANSACTION_COMMIT_TYPE, TRANSACTION_PREPARED_TYPE
from basalt.common.record import HEADERS, RecordKind, check_record
from basalt.store import ManualClock, Message, MessageStore, MessageStoreConfig, PutMessageResult
from basalt.store.checkpoint import RECOVERY_MARGIN_MS
from basalt.store.config import CQ_STORE_UNIT_SIZE
from basalt.store.consistency import check_store
from basalt.store.errors import CorruptFileError
from basalt.store.mapped_file import file_name
from basalt.store.mapped_file_queue import TORN_WRITE_WINDOW_BYTES
from basalt.store.recovery import TAIL_TOMBSTONE_BYTES, RecoveryReport
from basalt.store.resync import DamagedSpan, is_tombstone
from tests.support.stores import SMALL_COMMITLOG_FILE, SMALL_CQ_FILE, ConfigFactory

#: Where the body starts in a record with IPv4 born and store hosts.
BODY_START = HEADERS[False, False].size
CQ_UNITS_PER_FILE = SMALL_CQ_FILE // CQ_STORE_UNIT_SIZE
TOPIC = "Recover"


class StoreRunner:
    """Starts and stops the store on one root, as a broker process would across restarts."""

    def __init__(self, config: MessageStoreConfig, clock: ManualClock) -> None:
        self.config = config
        self.clock = clock
        self.store: MessageStore | None = None

    def start(self, *, abnormal: bool = False, **overrides: Any) -> MessageStore:
        """Open the store; ``abnormal`` leaves an ``abort`` file as a crash would."""
        assert self.store is None
        if abnormal:
            self.config.abort_path.touch()
        config = replace(self.config, **overrides) if overrides else self.config
        self.store = MessageStore.open(config, clock=self.clock)
        return self.store

    def stop(self) -> None:
        if self.store is not None:
            self.store.shutdown()
            self.store = None
        assert not self.config.abort_path.exists()

    def restart(self, *, abnormal: bool = False, **overrides: Any) -> MessageStore:
        self.stop()
        return self.start(abnormal=abnormal, **overrides)


def _shut_down_after(runner: StoreRunner) -> Iterator[StoreRunner]:
    try:
        yield runner
    finally:
        if runner.store is not None:
            runner.store.shutdown()


@pytest.fixture
def runner(make_config: ConfigFactory, clock: ManualClock) -> Iterator[StoreRunner]:
    yield from _shut_down_after(StoreRunner(make_config(), clock))


@pytest.fixture
def big_file_runner(make_config: ConfigFactory, clock: ManualClock) -> Iterator[StoreRunner]:
    """1 MiB CommitLog files: room for a record with a long run of zero bytes."""
    config = make_config(mapped_file_size_commit_log=1 << 20)
    yield from _shut_down_after(StoreRunner(config, clock))


def report(store: MessageStore) -> RecoveryReport:
    assert store.recovery_report is not None
    return store.recovery_report


def commitlog_path(config: MessageStoreConfig, physical_offset: int) -> Path:
    size = config.mapped_file_size_commit_log
    return config.commitlog_dir / file_name(physical_offset - physical_offset % size)


def overwrite_commitlog(config: MessageStoreConfig, physical_offset: int, data: bytes) -> None:
    """Write ``data`` over the CommitLog at ``physical_offset`` behind the store's back."""
    path = commitlog_path(config, physical_offset)
    with open(path, "r+b") as f:
        f.seek(physical_offset % config.mapped_file_size_commit_log)
        f.write(data)


def read_commitlog(config: MessageStoreConfig, physical_offset: int, size: int) -> bytes:
    path = commitlog_path(config, physical_offset)
    with open(path, "rb") as f:
        f.seek(physical_offset % config.mapped_file_size_commit_log)
        return f.read(size)


def consume_queue_files(config: MessageStoreConfig) -> dict[Path, bytes]:
    directory = config.consume_queue_dir
    if not directory.exists():
        return {}
    return {p.relative_to(directory): p.read_bytes() for p in directory.rglob("*") if p.is_file()}


@dataclass(frozen=True)
class Sent:
    topic: str
    queue_id: int
    body: bytes
    result: PutMessageResult

    @property
    def physical_offset(self) -> int:
        return self.result.physical_offsets[0]

    @property
    def size(self) -> int:
        return self.result.sizes[0]

    @property
    def queue_offset(self) -> int:
        return self.result.queue_offsets[0]


def send(
    store: MessageStore, count: int, *, queues: int = 2, body_size: int = 3000, sys_flag: int = 0
) -> list[Sent]:
    sent = []
    for i in range(count):
        queue_id = i % queues
        body = (f"{i:06d}-".encode() * body_size)[:body_size]
        result = store.put_message(
            Message(TOPIC, body, queue_id=queue_id, tags=f"tag{i % 3}", sys_flag=sys_flag)
        )
        assert result.ok, result.detail
        sent.append(Sent(TOPIC, queue_id, body, result))
    return sent


def assert_all_readable(store: MessageStore, sent: list[Sent]) -> None:
    """Every sent message is in the CommitLog and reachable through its ConsumeQueue."""
    for s in sent:
        record = store.get_message_by_queue_offset(s.topic, s.queue_id, s.queue_offset)
        assert record is not None, (s.queue_id, s.queue_offset)
        assert (record.commit_log_offset, record.body) == (s.physical_offset, s.body)


def read_queue(store: MessageStore, queue_id: int) -> list[tuple[int, bytes]]:
    """(queue offset, body) of every record a consumer reading the queue from 0 gets."""
    got: list[tuple[int, bytes]] = []
    offset = 0
    while offset < store.get_max_offset_in_queue(TOPIC, queue_id):
        result = store.get_message("g", TOPIC, queue_id, offset, 32)
        got += [(r.queue_offset, r.body) for r in result.decode()]
        assert result.next_begin_offset > offset, "the read must move on"
        offset = result.next_begin_offset
    return got


def expected_queue(sent: list[Sent], queue_id: int) -> list[tuple[int, bytes]]:
    return [(s.queue_offset, s.body) for s in sent if s.queue_id == queue_id]


def assert_set_aside(config: MessageStoreConfig, span: DamagedSpan, lost: Sent) -> None:
    """``span`` is ``lost``'s record, its bytes in quarantine, a tombstone in its place."""
    assert (span.offset, span.length) == (lost.physical_offset, lost.size)
    assert Path(span.quarantine).parent == config.quarantine_dir
    assert len(Path(span.quarantine).read_bytes()) <= lost.size
    info = check_record(read_commitlog(config, lost.physical_offset, lost.size), 0, lost.size,
                        check_crc=True, expected_offset=lost.physical_offset)  # fmt: skip
    assert info.kind is RecordKind.MESSAGE and is_tombstone(info.topic, info.sys_flag)


def queue_maxima(store: MessageStore, queues: int = 2) -> list[int]:
    """Each queue's max offset once everything sent so far is dispatched."""
    assert store.wait_dispatched()
    return [store.get_max_offset_in_queue(TOPIC, q) for q in range(queues)]


# -- a corrupt last message -------------------------------------------------------------

CORRUPTIONS = {
    # where 16 zero bytes land inside the last record, and why recovery stops there
    "size-and-magic": (0, "end of data"),
    "queue-and-physical-offset": (20, "PHYSICALOFFSET"),
    "body": (BODY_START + 100, "CRC"),
}


@pytest.mark.parametrize("abnormal", [False, True], ids=["normal", "abnormal"])
@pytest.mark.parametrize("region", list(CORRUPTIONS))
def test_a_corrupt_last_record_is_set_aside_and_its_queue_offset_kept(
    runner: StoreRunner, abnormal: bool, region: str
) -> None:
    store = runner.start()
    sent = send(store, 40)
    assert store.max_physical_offset > SMALL_COMMITLOG_FILE
    last = sent[-1]
    maxima = queue_maxima(store)
    assert maxima == [20, 20]
    runner.stop()
    position, reason = CORRUPTIONS[region]
    original = read_commitlog(runner.config, last.physical_offset, last.size)
    overwrite_commitlog(runner.config, last.physical_offset + position, bytes(16))

    store = runner.start(abnormal=abnormal)

    got = report(store)
    assert got.abnormal is abnormal
    # The log goes on after a tombstone marking where records were lost.
    end = last.physical_offset + TAIL_TOMBSTONE_BYTES
    assert got.last_valid_offset == store.max_physical_offset == end
    assert reason in got.stop_reason
    assert got.bytes_truncated == last.size
    assert got.consume_queue_entries_dropped == 1
    assert got.consume_queue_entries_rebuilt == 0
    assert got.consume_queues_destroyed == 0
    (span,) = got.damaged_spans
    assert (span.offset, span.length) == (last.physical_offset, last.size)
    damaged = original[:position] + bytes(16) + original[position + 16 :]
    assert Path(span.quarantine).read_bytes() == damaged
    # Its queue offset stays taken: a reader steps over it, no send gets it again.
    assert queue_maxima(store) == [20, 20]
    assert store.get_message_by_queue_offset(TOPIC, 1, 19) is None
    assert store.lookup_message_by_offset(last.physical_offset) is None
    assert_all_readable(store, sent[:-1])
    assert read_queue(store, 1) == expected_queue(sent[:-1], 1)
    file_size = runner.config.mapped_file_size_commit_log
    tail = file_size - end % file_size
    assert read_commitlog(runner.config, end, tail) == bytes(tail)
    marker = check_record(read_commitlog(runner.config, last.physical_offset, TAIL_TOMBSTONE_BYTES),
                          0, TAIL_TOMBSTONE_BYTES, check_crc=True)  # fmt: skip
    assert is_tombstone(marker.topic, marker.sys_flag)

    # The next send goes after the tombstone, and does not get the lost queue offset.
    again = store.put_message(Message(TOPIC, b"again", queue_id=1))
    assert again.physical_offsets == (end,)
    assert again.queue_offsets == (20,)
    runner.stop()
    store = runner.start()
    assert report(store).bytes_truncated == 0
    assert report(store).damaged_spans == ()
    assert queue_maxima(store) == [20, 21]


def test_abnormal_recovery_reads_on_past_a_corrupt_record_in_an_earlier_file(
    runner: StoreRunner,
) -> None:
    store = runner.start()
    sent = send(store, 80)
    end = store.max_physical_offset
    files_before = sorted(runner.config.commitlog_dir.iterdir())
    assert len(files_before) >= 4
    bad = sent[7]
    runner.stop()
    overwrite_commitlog(runner.config, bad.physical_offset + BODY_START, bytes(16))

    store = runner.start(abnormal=True)

    got = report(store)
    assert got.scan_start_offset == 0
    assert got.last_valid_offset == store.max_physical_offset == end
    assert got.consume_queue_entries_dropped == 1
    assert sorted(runner.config.commitlog_dir.iterdir()) == files_before
    (span,) = got.damaged_spans
    assert_set_aside(runner.config, span, bad)
    assert (span.topic, span.queue_id, span.queue_offset) == (TOPIC, 1, 3)
    assert "CRC" in span.reason
    kept = [s for s in sent if s is not bad]
    assert_all_readable(store, kept)
    assert store.get_message_by_queue_offset(TOPIC, 1, 3) is None
    assert read_queue(store, 1) == expected_queue(kept, 1)
    assert queue_maxima(store) == [40, 40]
    store = runner.restart()
    assert report(store).damaged_spans == ()
    assert store.put_message(Message(TOPIC, b"n", queue_id=1)).queue_offsets == (40,)


def test_clean_restart_changes_nothing(runner: StoreRunner) -> None:
    store = runner.start()
    sent = send(store, 60)
    # A tail no ConsumeQueue indexes: recovery must not count it as missing.
    send(store, 3, sys_flag=TRANSACTION_PREPARED_TYPE)
    end = store.max_physical_offset
    maxima = queue_maxima(store)
    runner.stop()
    queues_before = consume_queue_files(runner.config)
    commitlog_before = {p.name: p.read_bytes() for p in runner.config.commitlog_dir.iterdir()}

    for _ in range(2):
        store = runner.start()
        got = report(store)
        assert not got.abnormal
        assert got.last_valid_offset == store.max_physical_offset == end
        assert got.stop_reason == "end of data"
        assert (
            got.bytes_truncated,
            got.consume_queue_entries_dropped,
            got.consume_queue_entries_rebuilt,
            got.consume_queues_destroyed,
        ) == (0, 0, 0, 0)
        assert queue_maxima(store) == maxima
        assert_all_readable(store, sent)
        runner.stop()
        assert consume_queue_files(runner.config) == queues_before
        assert {
            p.name: p.read_bytes() for p in runner.config.commitlog_dir.iterdir()
        } == commitlog_before


# -- lost files -------------------------------------------------------------------------


def _delete_commitlog(config: MessageStoreConfig) -> None:
    shutil.rmtree(config.commitlog_dir)


def _zero_commitlog(config: MessageStoreConfig) -> None:
    for path in config.commitlog_dir.iterdir():
        path.write_bytes(bytes(config.mapped_file_size_commit_log))


def _restart_after(
    runner: StoreRunner, damage: Callable[[MessageStoreConfig], None], *, abnormal: bool
) -> MessageStore:
    """30 records over 3 queues, a clean stop, ``damage``, and a start."""
    store = runner.start()
    send(store, 30, queues=3)
    runner.stop()
    damage(runner.config)
    return runner.start(abnormal=abnormal)


@pytest.mark.parametrize("abnormal", [False, True], ids=["normal", "abnormal"])
def test_without_a_commitlog_every_queue_keeps_its_offsets(
    runner: StoreRunner, abnormal: bool
) -> None:
    """Issue 28 point 3: every record is gone, but no queue offset is issued again
    (it was: "queues destroyed 3", the next send got offset 0)."""
    store = _restart_after(runner, _delete_commitlog, abnormal=abnormal)

    got = report(store)
    assert got.commitlog_missing
    assert got.consume_queues_destroyed == 0
    assert got.consume_queue_entries_dropped == 30
    assert "CommitLog's end" in got.damaged_spans[-1].reason
    # The log starts again at 0, after a tombstone saying the offsets jump across it.
    assert got.last_valid_offset == store.max_physical_offset == TAIL_TOMBSTONE_BYTES
    assert queue_maxima(store, 3) == [10, 10, 10]
    assert [store.get_min_offset_in_queue(TOPIC, q) for q in range(3)] == [10, 10, 10]
    assert read_queue(store, 0) == []
    result = store.put_message(Message(TOPIC, b"fresh", queue_id=2))
    assert (result.physical_offsets, result.queue_offsets) == ((TAIL_TOMBSTONE_BYTES,), (10,))
    assert store.wait_dispatched()
    assert read_queue(store, 2) == [(10, b"fresh")]
    runner.stop()
    assert check_store(runner.config.store_path_root_dir).ok
    store = runner.start()
    assert not report(store).commitlog_missing and report(store).damaged_spans == ()
    assert queue_maxima(store, 3) == [10, 10, 11]


def test_without_a_commitlog_queues_that_indexed_nothing_are_dropped(
    runner: StoreRunner,
) -> None:
    """No CommitLog and nothing indexed is a new store, as in RocketMQ: its empty
    queue folders go, and the store starts empty."""
    (runner.config.consume_queue_dir / TOPIC / "0").mkdir(parents=True)
    store = runner.start()

    got = report(store)
    assert (got.stop_reason, got.consume_queues_destroyed) == ("no commitlog", 1)
    assert not got.commitlog_missing
    assert store.get_consume_queue(TOPIC, 0) is None
    result = store.put_message(Message(TOPIC, b"first", queue_id=0))
    assert (result.physical_offsets, result.queue_offsets) == ((0,), (0,))


@pytest.mark.parametrize("abnormal", [False, True], ids=["normal", "abnormal"])
def test_a_zeroed_commitlog_keeps_every_queue_offset_taken(
    runner: StoreRunner, abnormal: bool
) -> None:
    store = _restart_after(runner, _zero_commitlog, abnormal=abnormal)

    got = report(store)
    assert got.consume_queues_destroyed == 0
    assert got.consume_queue_entries_dropped == 30
    assert queue_maxima(store, 3) == [10, 10, 10]
    assert read_queue(store, 0) == []
    result = store.put_message(Message(TOPIC, b"fresh", queue_id=2))
    assert result.queue_offsets == (10,)
    assert store.wait_dispatched()
    assert read_queue(store, 2) == [(10, b"fresh")]


def _written_units(data: bytes | bytearray) -> int:
    """Units before the zero tail (rounded up: a tagsCode may end in zero bytes)."""
    return -(-len(data.rstrip(b"\x00")) // CQ_STORE_UNIT_SIZE)


def _units_in(path: Path) -> int:
    return _written_units(path.read_bytes())


def _zero_last_units(queue_dir: Path, count: int) -> int:
    last = max(queue_dir.iterdir())
    data = bytearray(last.read_bytes())
    written = _written_units(data) * CQ_STORE_UNIT_SIZE
    data[written - count * CQ_STORE_UNIT_SIZE : written] = bytes(count * CQ_STORE_UNIT_SIZE)
    last.write_bytes(bytes(data))
    return count


def _delete_last_file(queue_dir: Path) -> int:
    last = max(queue_dir.iterdir())
    units = _units_in(last)
    last.unlink()
    return units


def _empty_last_file(queue_dir: Path) -> int:
    """Truncate to 0 bytes, as a crash right after the file's creation could leave it."""
    last = max(queue_dir.iterdir())
    units = _units_in(last)
    os.truncate(last, 0)
    return units


@pytest.mark.parametrize(
    "lose_tail",
    [lambda d: _zero_last_units(d, 10), _delete_last_file, _empty_last_file],
    ids=["zeroed-units", "deleted-last-file", "emptied-last-file"],
)
def test_abnormal_recovery_rebuilds_a_lost_consume_queue_tail(
    runner: StoreRunner, lose_tail: Callable[[Path], int]
) -> None:
    store = runner.start()
    sent = send(store, 150, queues=1, body_size=500)
    sent += send(store, 30, queues=1, body_size=500, sys_flag=TRANSACTION_COMMIT_TYPE)
    # An intact queue indexing later records: only abnormal recovery looks further back.
    intact = store.put_message(Message("Intact", b"later"))
    assert store.max_physical_offset > SMALL_COMMITLOG_FILE
    runner.stop()
    queues_before = consume_queue_files(runner.config)
    assert len(queues_before) == 4  # 180 units, 64 per file, and the intact queue's file
    lost = lose_tail(runner.config.consume_queue_dir / TOPIC / "0")
    assert lost > 0

    store = runner.start(abnormal=True)

    got = report(store)
    assert got.abnormal
    assert got.consume_queue_entries_rebuilt == lost
    assert got.consume_queue_entries_dropped == 0
    assert got.bytes_truncated == 0
    assert store.get_max_offset_in_queue(TOPIC, 0) == 180
    assert_all_readable(store, sent)
    assert store.get_message_by_queue_offset("Intact", 0, 0) is not None
    assert store.put_message(Message(TOPIC, b"next")).queue_offsets == (180,)
    runner.stop()
    after = consume_queue_files(runner.config)
    # Identical units, plus the one for "next".
    for path, data in queues_before.items():
        written = _written_units(data) * CQ_STORE_UNIT_SIZE
        assert after[path][:written] == data[:written]
    assert sum(_units_in(runner.config.consume_queue_dir / path) for path in after) == 182
    assert intact.ok


# -- where the scan starts --------------------------------------------------------------


def _send_across_files(store: MessageStore, clock: ManualClock, files: int) -> list[Sent]:
    """Records a second apart until the CommitLog has ``files`` files."""
    sent: list[Sent] = []
    while store.max_physical_offset < (files - 1) * SMALL_COMMITLOG_FILE + 1:
        clock.advance(1000)
        sent += send(store, 1, body_size=6000)
    return sent


def _write_checkpoint(config: MessageStoreConfig, physic_ms: int, logics_ms: int) -> None:
    with open(config.checkpoint_path, "r+b") as f:
        f.write(struct.pack(">qq", physic_ms, logics_ms))


FAR_FUTURE = 1 << 50

CHECKPOINT_CASES: dict[str, tuple[Callable[[int], tuple[int, int]], int]] = {
    # name: (physicMsgTimestamp, logicsMsgTimestamp) from file 2's first store time, file index
    "zero checkpoint: first file": (lambda t: (0, 0), 0),
    "exactly min - 3 s: that file": (lambda t: (t + 3000, t + 3000), 2),
    "logics is the minimum": (lambda t: (FAR_FUTURE, t + 3000), 2),
    "physic is the minimum": (lambda t: (t + 3000, FAR_FUTURE), 2),
    "one ms short: the file before": (lambda t: (t + 2999, t + 2999), 1),
    "far future: last file": (lambda t: (FAR_FUTURE, FAR_FUTURE), 4),
}


@pytest.mark.parametrize("case", list(CHECKPOINT_CASES))
def test_abnormal_recovery_starts_from_the_file_the_checkpoint_vouches_for(
    runner: StoreRunner, clock: ManualClock, case: str
) -> None:
    assert RECOVERY_MARGIN_MS == 3000
    store = runner.start()
    sent = _send_across_files(store, clock, files=5)
    first_ts = []
    for index in range(5):
        first = store.lookup_message_by_offset(index * SMALL_COMMITLOG_FILE)
        assert first is not None
        first_ts.append(first.store_timestamp_ms)
    assert first_ts == sorted(set(first_ts))
    end = store.max_physical_offset
    runner.stop()
    timestamps, expected_index = CHECKPOINT_CASES[case]
    _write_checkpoint(runner.config, *timestamps(first_ts[2]))

    store = runner.start(abnormal=True)

    got = report(store)
    assert got.abnormal
    assert got.commitlog_files == 5
    assert got.scan_start_offset == expected_index * SMALL_COMMITLOG_FILE
    assert got.files_scanned == 5 - expected_index
    assert got.last_valid_offset == store.max_physical_offset == end
    assert (got.bytes_truncated, got.consume_queue_entries_dropped) == (0, 0)
    assert got.consume_queue_entries_rebuilt == 0  # re-dispatch skipped every present unit
    assert_all_readable(store, sent)


def test_normal_recovery_scans_the_last_three_files(
    runner: StoreRunner, clock: ManualClock
) -> None:
    store = runner.start()
    _send_across_files(store, clock, files=5)
    runner.stop()

    store = runner.start()

    got = report(store)
    assert not got.abnormal
    assert (got.commitlog_files, got.files_scanned) == (5, 3)
    assert got.scan_start_offset == 2 * SMALL_COMMITLOG_FILE


# -- CRC ------------------------------------------------------------------------------


@pytest.mark.parametrize("abnormal", [False, True], ids=["normal", "abnormal"])
@pytest.mark.parametrize("check_crc", [True, False], ids=["crc-checked", "crc-unchecked"])
def test_body_crc_is_checked_only_with_check_crc_on_recover(
    runner: StoreRunner, abnormal: bool, check_crc: bool
) -> None:
    store = runner.start()
    sent = send(store, 10)
    last = sent[-1]
    end = store.max_physical_offset
    runner.stop()
    flipped_at = last.physical_offset + BODY_START + 5
    (original,) = read_commitlog(runner.config, flipped_at, 1)
    overwrite_commitlog(runner.config, flipped_at, bytes([original ^ 0xFF]))

    store = runner.start(abnormal=abnormal, check_crc_on_recover=check_crc)

    got = report(store)
    if check_crc:
        end = last.physical_offset + TAIL_TOMBSTONE_BYTES  # a tombstone where it was
        assert got.last_valid_offset == store.max_physical_offset == end
        assert "CRC" in got.stop_reason
        assert got.consume_queue_entries_dropped == 1
        assert queue_maxima(store) == [5, 5]
        assert store.get_message_by_queue_offset(TOPIC, 1, 4) is None
    else:
        assert got.last_valid_offset == store.max_physical_offset == end
        assert got.stop_reason == "end of data"
        assert got.consume_queue_entries_dropped == 0
        assert queue_maxima(store) == [5, 5]
        record = store.get_message_by_queue_offset(TOPIC, 1, 4)
        assert record is not None
        assert record.body != last.body
        assert record.body[5] == original ^ 0xFF


# -- the table of next queue offsets ----------------------------------------------------


@pytest.mark.parametrize("abnormal", [False, True], ids=["normal", "abnormal"])
def test_next_put_continues_queue_offsets_after_restart(
    runner: StoreRunner, abnormal: bool
) -> None:
    store = runner.start()
    send(store, 25, queues=3)
    send(store, 4, queues=3, sys_flag=TRANSACTION_PREPARED_TYPE)
    prepared_only = store.put_message(
        Message("OnlyPrepared", b"p", sys_flag=TRANSACTION_PREPARED_TYPE)
    )
    assert prepared_only.ok
    maxima = queue_maxima(store, 3)
    assert maxima == [9, 8, 8]

    store = runner.restart(abnormal=abnormal)

    assert report(store).abnormal is abnormal
    for queue_id, expected in enumerate(maxima):
        result = store.put_message(Message(TOPIC, b"after", queue_id=queue_id))
        assert result.queue_offsets == (expected,)
    assert store.put_message(Message("OnlyPrepared", b"c")).queue_offsets == (0,)
    assert store.put_message(Message("BrandNew", b"n", queue_id=5)).queue_offsets == (0,)


# -- reading on past damage ------------------------------------------------------------


def _corrupt_before_a_long_zero_run(runner: StoreRunner) -> tuple[list[Sent], int]:
    """Send a record, the one to corrupt, one with a 200 KB zero body and one more;
    corrupt the second and restart. Returns what was sent and the end before the restart.
    """
    store = runner.start()
    sent = send(store, 2, queues=1, body_size=100)
    result = store.put_message(Message(TOPIC, bytes(200_000), tags="zeros"))
    assert result.ok
    sent.append(Sent(TOPIC, 0, bytes(200_000), result))
    sent += send(store, 1, queues=1, body_size=100)
    end = store.max_physical_offset
    runner.stop()
    overwrite_commitlog(runner.config, sent[1].physical_offset + BODY_START, bytes(16))
    runner.start()
    return sent, end


def test_recovery_reads_on_past_a_corrupt_record_and_a_long_zero_run(
    big_file_runner: StoreRunner,
) -> None:
    sent, end = _corrupt_before_a_long_zero_run(big_file_runner)

    store = big_file_runner.store
    assert store is not None
    got = report(store)
    assert got.last_valid_offset == end
    assert got.bytes_truncated == 0
    (span,) = got.damaged_spans
    assert_set_aside(big_file_runner.config, span, sent[1])
    kept = [sent[0], *sent[2:]]
    assert_all_readable(store, kept)
    assert read_queue(store, 0) == expected_queue(kept, 0)


def test_a_set_aside_record_never_comes_back(big_file_runner: StoreRunner) -> None:
    sent, end = _corrupt_before_a_long_zero_run(big_file_runner)
    store = big_file_runner.store
    assert store is not None
    assert store.get_max_offset_in_queue(TOPIC, 0) == 4
    again = send(store, 1, queues=1, body_size=100)
    assert (again[0].physical_offset, again[0].queue_offset) == (end, 4)

    store = big_file_runner.restart(abnormal=True)

    got = report(store)
    assert got.last_valid_offset == store.max_physical_offset == end + again[0].size
    assert got.damaged_spans == ()
    assert store.get_message_by_queue_offset(TOPIC, 0, 1) is None
    kept = [sent[0], *sent[2:], *again]
    assert read_queue(store, 0) == expected_queue(kept, 0)


def test_recovery_finds_records_far_past_the_torn_write_window(
    make_config: ConfigFactory, clock: ManualClock
) -> None:
    """The next valid record may lie further than a torn write reaches: it is found."""
    file_size = 3 * TORN_WRITE_WINDOW_BYTES
    config = make_config(mapped_file_size_commit_log=file_size, max_message_size=file_size)
    runner = StoreRunner(config, clock)
    store = runner.start()
    try:
        first = store.put_message(Message(TOPIC, b"a" * 100, tags="a"))
        bad = store.put_message(Message(TOPIC, b"b" * 100, tags="b"))
        big = store.put_message(Message(TOPIC, b"c" * (TORN_WRITE_WINDOW_BYTES + 4096)))
        last = store.put_message(Message(TOPIC, b"d" * 100, tags="d"))
        assert first.ok and bad.ok and big.ok and last.ok
        end = store.max_physical_offset
        runner.stop()
        # Zeros over the bad record and the start of the next: its magic code is gone too.
        overwrite_commitlog(config, bad.physical_offsets[0], bytes(bad.sizes[0] + 16))

        store = runner.start()

        got = report(store)
        assert got.last_valid_offset == end
        (span,) = got.damaged_spans
        assert span.offset == bad.physical_offsets[0]
        assert span.length == bad.sizes[0] + big.sizes[0]
        assert "zeros" in span.reason
        assert store.get_max_offset_in_queue(TOPIC, 0) == 4
        got_bodies = [body for _, body in read_queue(store, 0)]
        assert got_bodies == [b"a" * 100, b"d" * 100]
    finally:
        runner.stop()


def test_a_record_with_a_zeroed_header_loses_only_that_record(
    make_config: ConfigFactory, clock: ManualClock
) -> None:
    """Zeroes where a record should start look like the end of data; the records
    after them are found, and new records go after the last of them."""
    file_size = 2 * TORN_WRITE_WINDOW_BYTES
    config = make_config(mapped_file_size_commit_log=file_size)
    runner = StoreRunner(config, clock)
    store = runner.start()
    try:
        body = b"x" * 4000
        sent = [store.put_message(Message(TOPIC, body)) for _ in range(3000)]
        assert all(r.ok for r in sent)
        end = store.max_physical_offset
        runner.stop()
        cut = sent[10].physical_offsets[0]
        overwrite_commitlog(config, cut, bytes(8))

        store = runner.start()
        got = report(store)
        assert got.last_valid_offset == end
        (span,) = got.damaged_spans
        assert (span.offset, span.length) == (cut, sent[10].sizes[0])
        assert span.topic is None  # the header went with the zeros
        assert store.get_max_offset_in_queue(TOPIC, 0) == 3000
        assert store.get_message_by_queue_offset(TOPIC, 0, 10) is None
        assert store.get_message_by_queue_offset(TOPIC, 0, 11) is not None

        resent = [store.put_message(Message(TOPIC, b"y" * 4000)) for _ in range(10)]
        assert [r.queue_offsets[0] for r in resent] == list(range(3000, 3010))
        end = store.max_physical_offset
        store = runner.restart()
        assert store.max_physical_offset == report(store).last_valid_offset == end
        assert store.get_max_offset_in_queue(TOPIC, 0) == 3010
    finally:
        runner.stop()


# -- damaged and missing CommitLog files --------------------------------------------------


def _checked_after_a_clean_stop(runner: StoreRunner) -> None:
    runner.stop()
    checked = check_store(runner.config.store_path_root_dir)
    assert checked.ok, checked.problems


def test_a_flipped_total_size_in_the_first_record_loses_only_that_record(
    runner: StoreRunner,
) -> None:
    store = runner.start()
    sent = send(store, 30)
    runner.stop()
    (high,) = read_commitlog(runner.config, 0, 1)
    overwrite_commitlog(runner.config, 0, bytes([high ^ 0x40]))

    store = runner.start()

    (span,) = report(store).damaged_spans
    assert_set_aside(runner.config, span, sent[0])
    assert "TOTALSIZE" in span.reason
    assert read_queue(store, 0) == expected_queue(sent[1:], 0)
    assert read_queue(store, 1) == expected_queue(sent, 1)
    assert queue_maxima(store) == [15, 15]
    _checked_after_a_clean_stop(runner)


def _sixty_over_three_files(runner: StoreRunner) -> tuple[list[Sent], list[Path]]:
    """60 records over at least three CommitLog files, stopped cleanly: (sent, files)."""
    store = runner.start()
    sent = send(store, 60)
    files = sorted(runner.config.commitlog_dir.iterdir())
    assert len(files) >= 3
    runner.stop()
    return sent, files


def test_a_short_commitlog_file_is_padded_and_the_files_after_it_kept(
    runner: StoreRunner,
) -> None:
    sent, files = _sixty_over_three_files(runner)
    file_size = runner.config.mapped_file_size_commit_log
    os.truncate(files[1], file_size // 2)
    lost = [
        s for s in sent if file_size * 3 // 2 <= s.physical_offset + s.size
        and s.physical_offset < 2 * file_size
    ]  # fmt: skip
    assert lost

    store = runner.start()

    got = report(store)
    (span,) = got.damaged_spans
    assert span.offset == lost[0].physical_offset
    assert span.end == 2 * file_size
    assert os.path.getsize(files[1]) == file_size
    kept = [s for s in sent if s not in lost]
    assert_all_readable(store, kept)
    for queue_id in (0, 1):
        assert read_queue(store, queue_id) == expected_queue(kept, queue_id)
    assert queue_maxima(store) == [30, 30]
    _checked_after_a_clean_stop(runner)


def test_a_missing_middle_commitlog_file_is_recreated_and_the_rest_kept(
    runner: StoreRunner,
) -> None:
    sent, files = _sixty_over_three_files(runner)
    files[1].unlink()
    file_size = runner.config.mapped_file_size_commit_log
    lost = [s for s in sent if file_size <= s.physical_offset < 2 * file_size]

    store = runner.start()

    (span,) = report(store).damaged_spans
    assert (span.offset, span.length, span.quarantine) == (file_size, file_size, "")
    assert sorted(runner.config.commitlog_dir.iterdir()) == files
    kept = [s for s in sent if s not in lost]
    assert_all_readable(store, kept)
    assert read_queue(store, 0) == expected_queue(kept, 0)
    assert queue_maxima(store) == [30, 30]
    assert store.put_message(Message(TOPIC, b"n", queue_id=0)).queue_offsets == (30,)
    _checked_after_a_clean_stop(runner)


def test_garbage_past_the_end_is_quarantined_and_cleared(runner: StoreRunner) -> None:
    store = runner.start()
    sent = send(store, 10)
    end = store.max_physical_offset
    runner.stop()
    garbage = bytes(range(256)) * 4
    overwrite_commitlog(runner.config, end + 4096, garbage)

    store = runner.start()

    got = report(store)
    assert got.last_valid_offset == end
    (span,) = got.damaged_spans
    assert span.offset == end
    assert Path(span.quarantine).read_bytes().endswith(garbage)
    assert read_commitlog(runner.config, end + 4096, len(garbage)) == bytes(len(garbage))
    assert_all_readable(store, sent)
    _checked_after_a_clean_stop(runner)


def test_a_lost_records_queue_offset_stays_taken_when_only_its_header_names_it(
    runner: StoreRunner,
) -> None:
    """The ConsumeQueue had not indexed the lost record (a crash): its header, still
    readable, keeps its queue offset from being issued again."""
    store = runner.start()
    sent = send(store, 10)
    runner.stop()
    last = sent[-1]
    # The queue loses its last unit (as if the crash came before dispatch) ...
    cq_file = runner.config.consume_queue_dir / TOPIC / "1" / file_name(0)
    data = bytearray(cq_file.read_bytes())
    at = last.queue_offset * CQ_STORE_UNIT_SIZE
    data[at : at + CQ_STORE_UNIT_SIZE] = bytes(CQ_STORE_UNIT_SIZE)
    cq_file.write_bytes(bytes(data))
    # ... and the record a flipped body byte; a record of queue 0 follows it.
    overwrite_commitlog(runner.config, last.physical_offset + BODY_START, b"\xff")
    store = runner.start(abnormal=True)
    (span,) = report(store).damaged_spans
    assert (span.topic, span.queue_id, span.queue_offset) == (TOPIC, 1, 4)
    assert queue_maxima(store) == [5, 5]
    after = store.put_message(Message(TOPIC, b"after", queue_id=1))
    assert after.queue_offsets == (5,)


def test_damage_before_the_scan_found_through_a_queue_is_set_aside_too(
    runner: StoreRunner, clock: ManualClock
) -> None:
    """A clean restart scans the last three files, but a ConsumeQueue unit pointing at
    damage further back sends re-dispatch there: that stretch is read for damage
    first, and the damaged record set aside like any other."""
    store = runner.start()
    sent = _send_across_files(store, clock, files=5)
    runner.stop()
    bad = sent[2]
    overwrite_commitlog(runner.config, bad.physical_offset, bytes(8))

    store = runner.start()

    got = report(store)
    assert got.scan_start_offset == 2 * SMALL_COMMITLOG_FILE > bad.physical_offset
    (span,) = got.damaged_spans
    assert_set_aside(runner.config, span, bad)
    kept = [s for s in sent if s is not bad]
    for queue_id in (0, 1):
        assert read_queue(store, queue_id) == expected_queue(kept, queue_id)
    _checked_after_a_clean_stop(runner)


def test_a_read_skips_a_unit_whose_record_is_not_there(runner: StoreRunner) -> None:
    """Bytes overwritten under a running store: a read checks each unit's record
    (size, magic, position) and steps over one that is not there, rather than
    return other bytes."""
    store = runner.start()
    sent = send(store, 10)
    assert store.wait_dispatched()
    bad = sent[4]
    overwrite_commitlog(runner.config, bad.physical_offset + 4, bytes(4))  # the magic code

    kept = [s for s in sent if s is not bad]
    for queue_id in (0, 1):
        assert read_queue(store, queue_id) == expected_queue(kept, queue_id)


def test_a_commitlog_file_longer_than_the_configured_size_refuses_start_and_says_why(
    runner: StoreRunner,
) -> None:
    """Which bytes of an over-long file are valid cannot be told: the one refusal,
    and it says what to do."""
    store = runner.start()
    send(store, 5)
    runner.stop()
    (path,) = runner.config.commitlog_dir.iterdir()
    os.truncate(path, runner.config.mapped_file_size_commit_log * 2)

    with pytest.raises(CorruptFileError, match="start with the file size") as refused:
        runner.start()
    assert refused.value.path == path
    assert runner.store is None  # open() failed: nothing to stop
