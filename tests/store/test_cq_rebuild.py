"""ConsumeQueues are derived data: damaged, short, missing or inconsistent ones are
rebuilt from the CommitLog at start, and no queue offset is ever issued twice.

Each test writes through a real store on ``tmp_path``, stops it (cleanly, or
leaving the ``abort`` file a crash leaves), damages one ConsumeQueue behind the
store's back, starts it again and checks that every message reads back at its
original queue offset and that the next send continues where the queue really
ended.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from basalt.store import ManualClock, Message, MessageStore, MessageStoreConfig, queue_repair
from basalt.store.config import CQ_STORE_UNIT_SIZE
from basalt.store.consume_queue import UNIT
from basalt.store.mapped_file import file_name
from basalt.store.mapped_file_queue import MappedFileQueue
from basalt.store.recovery import QueueRebuild, RecoveryReport
from tests.support.stores import SMALL_CQ_FILE, ConfigFactory

TOPIC = "Rebuild"
OTHER = "Other"
QUEUES = 3
#: Messages per queue: three ConsumeQueue files of 64 units (64, 64, 22).
N = 150
UNITS_PER_FILE = SMALL_CQ_FILE // CQ_STORE_UNIT_SIZE
DAMAGED = 1

Sent = dict[tuple[str, int, int], tuple[int, bytes]]


def _cq_dir(config: MessageStoreConfig, topic: str, queue_id: int) -> Path:
    return config.consume_queue_dir / topic / str(queue_id)


def _unit_file(config: MessageStoreConfig, topic: str, queue_id: int, offset: int) -> Path:
    start = offset * CQ_STORE_UNIT_SIZE // SMALL_CQ_FILE * SMALL_CQ_FILE
    return _cq_dir(config, topic, queue_id) / file_name(start)


def _read_unit(config: MessageStoreConfig, topic: str, queue_id: int, offset: int) -> bytes:
    with open(_unit_file(config, topic, queue_id, offset), "rb") as f:
        f.seek(offset * CQ_STORE_UNIT_SIZE % SMALL_CQ_FILE)
        return f.read(CQ_STORE_UNIT_SIZE)


def _write_unit(
    config: MessageStoreConfig, topic: str, queue_id: int, offset: int, unit: bytes
) -> None:
    with open(_unit_file(config, topic, queue_id, offset), "r+b") as f:
        f.seek(offset * CQ_STORE_UNIT_SIZE % SMALL_CQ_FILE)
        f.write(unit)


def _flip(config: MessageStoreConfig, offset: int, byte: int) -> None:
    unit = bytearray(_read_unit(config, TOPIC, DAMAGED, offset))
    unit[byte] ^= 0x01
    _write_unit(config, TOPIC, DAMAGED, offset, bytes(unit))


def _truncate(config: MessageStoreConfig, offset: int) -> None:
    """Cut the file holding queue offset ``offset`` at that offset's byte."""
    path = _unit_file(config, TOPIC, DAMAGED, offset)
    os.truncate(path, offset * CQ_STORE_UNIT_SIZE % SMALL_CQ_FILE)


def _delete_files(config: MessageStoreConfig, *, last_only: bool) -> None:
    files = sorted(_cq_dir(config, TOPIC, DAMAGED).iterdir())
    for path in files[-1:] if last_only else files:
        path.unlink()


#: name -> how the damaged queue is damaged.
DAMAGE: dict[str, Callable[[MessageStoreConfig], None]] = {
    "flip-a-physical-offset-byte": lambda c: _flip(c, 70, 7),
    "flip-a-high-physical-offset-byte": lambda c: _flip(c, 70, 2),
    "flip-a-size-byte": lambda c: _flip(c, 5, 11),
    # The records have no tag: tagsCode 0. A flipped one would hide it from TAG filters.
    "flip-a-tags-code-byte": lambda c: _flip(c, 40, 19),
    "truncate-mid-unit": lambda c: _truncate_mid_unit(c, 140),
    "truncate-to-half": lambda c: _truncate(c, UNITS_PER_FILE // 2),
    "delete-the-last-file": lambda c: _delete_files(c, last_only=True),
    "delete-every-file": lambda c: _delete_files(c, last_only=False),
    "delete-a-middle-file": lambda c: _unit_file(c, TOPIC, DAMAGED, UNITS_PER_FILE).unlink(),
    # Offset 10's unit says offset 5's record: a consumer would read 5 twice, never 10.
    "unit-of-another-offset": lambda c: _write_unit(
        c, TOPIC, DAMAGED, 10, _read_unit(c, TOPIC, DAMAGED, 5)
    ),
    "unit-of-another-queue": lambda c: _write_unit(
        c, TOPIC, DAMAGED, 20, _read_unit(c, TOPIC, DAMAGED + 1, 20)
    ),
    # Same queue id, same queue offset: only the record's topic tells them apart.
    "unit-of-another-topic": lambda c: _write_unit(
        c, TOPIC, DAMAGED, 30, _read_unit(c, OTHER, DAMAGED, 30)
    ),
}


def _truncate_mid_unit(config: MessageStoreConfig, offset: int) -> None:
    path = _unit_file(config, TOPIC, DAMAGED, offset)
    os.truncate(path, offset * CQ_STORE_UNIT_SIZE % SMALL_CQ_FILE + 7)


@pytest.fixture
def config(make_config: ConfigFactory) -> MessageStoreConfig:
    return make_config()


@pytest.fixture
def stores(config: MessageStoreConfig, clock: ManualClock) -> Iterator[list[MessageStore]]:
    """Stores opened by a test, shut down at its end if it did not."""
    opened: list[MessageStore] = []
    yield opened
    for store in opened:
        store.shutdown()  # a no-op for a store already shut down


def _open(
    config: MessageStoreConfig, clock: ManualClock, opened: list[MessageStore], *, abnormal: bool
) -> MessageStore:
    if abnormal:
        config.abort_path.touch()  # as a crash leaves it
    store = MessageStore.open(config, clock=clock)
    opened.append(store)
    return store


def _fill(store: MessageStore) -> Sent:
    """N messages on each queue of TOPIC, interleaved with OTHER's, all dispatched."""
    sent: Sent = {}
    for i in range(N):
        for topic in (TOPIC, OTHER):
            for queue_id in range(QUEUES):
                body = f"{topic}-{queue_id}-{i}".encode() * 3
                result = store.put_message(Message(topic, body, queue_id=queue_id))
                assert result.ok, result.detail
                assert result.queue_offsets == (i,)
                sent[topic, queue_id, i] = (result.physical_offsets[0], body)
    assert store.wait_dispatched()
    return sent


def _assert_intact(store: MessageStore, sent: Sent) -> None:
    for (topic, queue_id, offset), (physical_offset, body) in sent.items():
        record = store.get_message_by_queue_offset(topic, queue_id, offset)
        assert record is not None, (topic, queue_id, offset)
        assert (record.commit_log_offset, record.body) == (physical_offset, body)
    for topic in (TOPIC, OTHER):
        for queue_id in range(QUEUES):
            assert store.get_max_offset_in_queue(topic, queue_id) == N
            assert store.get_message_by_queue_offset(topic, queue_id, N) is None


def _report(store: MessageStore) -> RecoveryReport:
    assert store.recovery_report is not None
    return store.recovery_report


@pytest.mark.parametrize("abnormal", [False, True], ids=["clean-stop", "crash"])
@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_consume_queue_is_rebuilt_and_no_offset_is_reissued(
    config: MessageStoreConfig,
    clock: ManualClock,
    stores: list[MessageStore],
    damage: str,
    abnormal: bool,
) -> None:
    store = _open(config, clock, stores, abnormal=False)
    sent = _fill(store)
    store.shutdown()
    DAMAGE[damage](config)

    store = _open(config, clock, stores, abnormal=abnormal)

    _assert_intact(store, sent)
    got = _report(store)
    assert got.abnormal is abnormal
    (rebuilt,) = got.rebuilt_queues
    assert isinstance(rebuilt, QueueRebuild)
    assert (rebuilt.topic, rebuilt.queue_id, rebuilt.max_offset) == (TOPIC, DAMAGED, N)
    assert rebuilt.kept_to < N
    assert rebuilt.reasons
    assert got.redispatch_from_offset <= rebuilt.redispatch_from
    assert got.consume_queue_entries_rebuilt == N - rebuilt.kept_to
    assert "damaged queues rebuilt 1" in got.summary()

    # The next send continues after the last offset the CommitLog holds.
    again = store.put_message(Message(TOPIC, b"again", queue_id=DAMAGED))
    assert again.queue_offsets == (N,)
    assert store.wait_dispatched()
    record = store.get_message_by_queue_offset(TOPIC, DAMAGED, N)
    assert record is not None and record.body == b"again"

    # The repair is durable: the next clean start finds nothing to rebuild.
    store.shutdown()
    store = _open(config, clock, stores, abnormal=False)
    assert _report(store).rebuilt_queues == ()
    assert _report(store).consume_queue_entries_rebuilt == 0
    assert store.get_max_offset_in_queue(TOPIC, DAMAGED) == N + 1
    _assert_readable(store, sent)


def _assert_readable(store: MessageStore, sent: Sent) -> None:
    for (topic, queue_id, offset), (physical_offset, body) in sent.items():
        record = store.get_message_by_queue_offset(topic, queue_id, offset)
        assert record is not None
        assert (record.commit_log_offset, record.body) == (physical_offset, body)


def test_a_clean_restart_rebuilds_nothing(
    config: MessageStoreConfig, clock: ManualClock, stores: list[MessageStore]
) -> None:
    store = _open(config, clock, stores, abnormal=False)
    sent = _fill(store)
    # One queue ending exactly at a file's end: re-dispatched from there, nothing missing.
    for i in range(N, 2 * UNITS_PER_FILE * 2):
        assert store.put_message(Message(TOPIC, b"x", queue_id=0)).queue_offsets == (i,)
    assert store.get_max_offset_in_queue(TOPIC, 0) % UNITS_PER_FILE == 0
    store.shutdown()
    before = {p: p.read_bytes() for p in config.consume_queue_dir.rglob("*") if p.is_file()}

    store = _open(config, clock, stores, abnormal=False)

    got = _report(store)
    assert got.rebuilt_queues == ()
    assert (got.consume_queue_entries_dropped, got.consume_queue_entries_rebuilt) == (0, 0)
    assert _report(store).consume_queue_entries_rebuilt == 0
    _assert_readable(store, sent)
    store.shutdown()
    after = {p: p.read_bytes() for p in config.consume_queue_dir.rglob("*") if p.is_file()}
    assert after == before


def test_a_short_consume_queue_file_no_longer_refuses_start(
    config: MessageStoreConfig, clock: ManualClock, stores: list[MessageStore]
) -> None:
    store = _open(config, clock, stores, abnormal=False)
    sent = _fill(store)
    store.shutdown()
    last = sorted(_cq_dir(config, TOPIC, DAMAGED).iterdir())[-1]
    os.truncate(last, 123)  # "size 123 but data files are 1280 bytes" refused start before

    store = _open(config, clock, stores, abnormal=False)

    assert last.stat().st_size == SMALL_CQ_FILE
    _assert_intact(store, sent)
    (rebuilt,) = _report(store).rebuilt_queues
    assert any("was 123 bytes" in reason for reason in rebuilt.reasons)


# -- MappedFileQueue's repair mode --------------------------------------------------------

SIZE = 4 * CQ_STORE_UNIT_SIZE


def test_repair_mode_pads_a_short_file_to_whole_units(tmp_path: Path) -> None:
    directory = tmp_path / "q"
    directory.mkdir()
    (directory / file_name(0)).write_bytes(UNIT.pack(1, 2, 3) * 4)
    (directory / file_name(SIZE)).write_bytes(UNIT.pack(4, 5, 6) + b"\x07" * 7)
    q = MappedFileQueue(directory, SIZE, repair_unit=CQ_STORE_UNIT_SIZE)
    q.load()
    try:
        assert [mf.file_from_offset for mf in q.files] == [0, SIZE]
        assert (directory / file_name(SIZE)).read_bytes() == UNIT.pack(4, 5, 6) + bytes(
            SIZE - CQ_STORE_UNIT_SIZE
        )
        assert q.repaired == [f"{file_name(SIZE)} was 27 bytes: cut to 20 and padded to {SIZE}"]
    finally:
        q.close()


def test_repair_mode_deletes_the_files_after_a_gap(tmp_path: Path) -> None:
    directory = tmp_path / "q"
    directory.mkdir()
    for offset in (0, SIZE, 3 * SIZE, 4 * SIZE):
        (directory / file_name(offset)).write_bytes(bytes(SIZE))
    q = MappedFileQueue(directory, SIZE, repair_unit=CQ_STORE_UNIT_SIZE)
    q.load()
    try:
        assert [mf.file_from_offset for mf in q.files] == [0, SIZE]
        assert sorted(p.name for p in directory.iterdir()) == [file_name(0), file_name(SIZE)]
        assert len(q.repaired) == 2
    finally:
        q.close()


def test_units_behind_the_validated_tail_are_sampled(
    config: MessageStoreConfig,
    clock: ManualClock,
    stores: list[MessageStore],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = _open(config, clock, stores, abnormal=False)
    sent = _fill(store)
    store.shutdown()
    # No fully validated tail: only sampled units are checked, each file's first among them.
    monkeypatch.setattr(queue_repair, "VALIDATE_FULL_BYTES", 0)
    _write_unit(config, TOPIC, DAMAGED, UNITS_PER_FILE, _read_unit(config, TOPIC, DAMAGED, 3))

    store = _open(config, clock, stores, abnormal=False)

    _assert_intact(store, sent)
    (rebuilt,) = _report(store).rebuilt_queues
    assert rebuilt.kept_to == UNITS_PER_FILE
