"""Pop-and-ack consumer state (:mod:`basalt.store.pop`) on a real store.

Delivery, redelivery with attempt 2, acks by nonce, change of invisible time,
FIFO blocking, filters, the committed offset in the consumer offsets, reset,
and the journal: replay after reopen, a torn tail, compaction.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from basalt.common.record import decode_record
from basalt.store import ManualClock, Message, MessageStore
from basalt.store.consumer_offsets import consumer_offset_path
from basalt.store.get_message import GetMessageResult, GetStatus
from basalt.store.message_filter import MessageFilter, build_filter
from basalt.store.pop import AckStatus, PopStore
from basalt.store.pop_journal import JOURNAL_NAME, Kind, decode_records, encode_record
from tests.support.stores import ConfigFactory

TOPIC = "PopTopic"
GROUP = "pop-group"
INVISIBLE_MS = 30_000


def put(store: MessageStore, count: int, *, queue_id: int = 0, tags: str = "TagA") -> None:
    for i in range(count):
        store.put_message(Message(TOPIC, f"m{i}".encode(), queue_id=queue_id, tags=tags))
    assert store.wait_dispatched()


def pop(
    store: MessageStore,
    clock: ManualClock,
    count: int,
    *,
    fifo: bool = False,
    message_filter: MessageFilter | None = None,
) -> list[int]:
    got = store.pop.pop(
        GROUP,
        TOPIC,
        0,
        count,
        INVISIBLE_MS,
        clock.now_ms(),
        fifo=fifo,
        message_filter=message_filter,
    )
    return [m.queue_offset for m in got]


def test_pop_delivers_new_messages_as_stored_records(
    store: MessageStore, clock: ManualClock
) -> None:
    put(store, 5)
    got = store.pop.pop(GROUP, TOPIC, 0, 3, INVISIBLE_MS, clock.now_ms())
    assert [m.queue_offset for m in got] == [0, 1, 2]
    assert [m.attempt for m in got] == [1, 1, 1]
    assert [decode_record(m.record).body for m in got] == [b"m0", b"m1", b"m2"]
    assert all(m.visible_at_ms == clock.now_ms() + INVISIBLE_MS for m in got)
    assert len({m.nonce for m in got}) == 3
    assert got[1].commit_log_offset == decode_record(got[1].record).commit_log_offset
    assert pop(store, clock, 10) == [3, 4]
    assert pop(store, clock, 10) == []


def test_unacked_message_comes_again_after_its_invisible_time_with_attempt_2(
    store: MessageStore, clock: ManualClock
) -> None:
    put(store, 3)
    first = store.pop.pop(GROUP, TOPIC, 0, 3, INVISIBLE_MS, clock.now_ms())
    assert store.pop.ack(GROUP, TOPIC, 0, 0, first[0].nonce) is AckStatus.OK
    assert store.pop.ack(GROUP, TOPIC, 0, 2, first[2].nonce) is AckStatus.OK
    clock.advance(INVISIBLE_MS - 1)
    assert pop(store, clock, 10) == []
    clock.advance(1)
    again = store.pop.pop(GROUP, TOPIC, 0, 10, INVISIBLE_MS, clock.now_ms())
    assert [(m.queue_offset, m.attempt) for m in again] == [(1, 2)]
    # The first delivery's handle is stale now; the second's acks.
    assert store.pop.ack(GROUP, TOPIC, 0, 1, first[1].nonce) is AckStatus.STALE
    assert store.pop.ack(GROUP, TOPIC, 0, 1, again[0].nonce) is AckStatus.OK


def test_ack_twice_unknown_offset_and_unknown_group_are_stale(
    store: MessageStore, clock: ManualClock
) -> None:
    put(store, 1)
    (m,) = store.pop.pop(GROUP, TOPIC, 0, 1, INVISIBLE_MS, clock.now_ms())
    assert store.pop.ack(GROUP, TOPIC, 0, 0, m.nonce) is AckStatus.OK
    assert store.pop.ack(GROUP, TOPIC, 0, 0, m.nonce) is AckStatus.STALE
    assert store.pop.ack(GROUP, TOPIC, 0, 7, m.nonce) is AckStatus.STALE
    assert store.pop.ack("other", TOPIC, 0, 0, m.nonce) is AckStatus.STALE


def test_change_invisible_gives_a_new_nonce_and_moves_the_redelivery(
    store: MessageStore, clock: ManualClock
) -> None:
    put(store, 1)
    (m,) = store.pop.pop(GROUP, TOPIC, 0, 1, INVISIBLE_MS, clock.now_ms())
    changed = store.pop.change_invisible(GROUP, TOPIC, 0, 0, m.nonce, 1_000, clock.now_ms())
    assert changed.status is AckStatus.OK and changed.nonce != m.nonce
    assert changed.visible_at_ms == clock.now_ms() + 1_000
    assert store.pop.change_invisible(GROUP, TOPIC, 0, 0, m.nonce, 5, 0).status is AckStatus.STALE
    clock.advance(1_000)
    again = store.pop.pop(GROUP, TOPIC, 0, 1, INVISIBLE_MS, clock.now_ms())
    assert [(x.queue_offset, x.attempt) for x in again] == [(0, 2)]
    with pytest.raises(ValueError):
        store.pop.change_invisible(GROUP, TOPIC, 0, 0, again[0].nonce, -1, 0)


def test_fifo_queue_delivers_nothing_new_while_a_message_is_in_flight(
    store: MessageStore, clock: ManualClock
) -> None:
    put(store, 4)
    first = store.pop.pop(GROUP, TOPIC, 0, 2, INVISIBLE_MS, clock.now_ms(), fifo=True)
    assert [m.queue_offset for m in first] == [0, 1]
    assert pop(store, clock, 10, fifo=True) == []
    assert store.pop.ack(GROUP, TOPIC, 0, 0, first[0].nonce) is AckStatus.OK
    assert pop(store, clock, 10, fifo=True) == []  # 1 is still in flight
    clock.advance(INVISIBLE_MS)
    assert pop(store, clock, 10, fifo=True) == [1]  # redelivered, still blocking
    nonce = store.pop.in_flight(GROUP, TOPIC, 0)[1][2]
    assert store.pop.ack(GROUP, TOPIC, 0, 1, nonce) is AckStatus.OK
    assert pop(store, clock, 10, fifo=True) == [2, 3]


def test_filter_skips_non_matching_messages_for_good(
    store: MessageStore, clock: ManualClock
) -> None:
    for tags in ("A", "B", "A", "B", "B"):
        put(store, 1, tags=tags)
    assert pop(store, clock, 10, message_filter=build_filter("TAG", "B")) == [1, 3, 4]
    in_flight = store.pop.in_flight(GROUP, TOPIC, 0)
    for offset, (_, _, nonce) in in_flight.items():
        assert store.pop.ack(GROUP, TOPIC, 0, offset, nonce) is AckStatus.OK
    # The skipped As count as consumed: the group is done with the queue.
    assert store.query_offset(GROUP, TOPIC, 0) == 5
    assert pop(store, clock, 10) == []
    sql = build_filter("SQL92", "TAGS = 'A'")
    put(store, 1, tags="B")
    put(store, 1, tags="A")
    assert pop(store, clock, 10, message_filter=sql) == [6]


def test_committed_offset_is_the_lowest_unacked(store: MessageStore, clock: ManualClock) -> None:
    put(store, 4)
    got = store.pop.pop(GROUP, TOPIC, 0, 4, INVISIBLE_MS, clock.now_ms())
    assert store.query_offset(GROUP, TOPIC, 0) == 0
    for i in (1, 2):
        store.pop.ack(GROUP, TOPIC, 0, i, got[i].nonce)
    assert store.query_offset(GROUP, TOPIC, 0) == 0
    store.pop.ack(GROUP, TOPIC, 0, 0, got[0].nonce)
    assert store.query_offset(GROUP, TOPIC, 0) == 3
    store.pop.ack(GROUP, TOPIC, 0, 3, got[3].nonce)
    assert store.query_offset(GROUP, TOPIC, 0) == 4


def test_a_new_pop_group_starts_at_its_committed_offset(
    store: MessageStore, clock: ManualClock
) -> None:
    put(store, 5)
    assert store.commit_offset(GROUP, TOPIC, 0, 3).ok
    assert pop(store, clock, 10) == [3, 4]


def test_reset_by_time_clears_the_tables_and_moves_the_cursor(
    store: MessageStore, clock: ManualClock
) -> None:
    put(store, 5)
    assert pop(store, clock, 3) == [0, 1, 2]
    table, _ = store.reset_offset_by_time(GROUP, TOPIC, [0], -1, force=True)
    assert table == {0: 5}
    assert store.pop.in_flight(GROUP, TOPIC, 0) == {}
    clock.advance(INVISIBLE_MS)
    assert pop(store, clock, 10) == []  # nothing redelivered, nothing new
    put(store, 1)
    assert pop(store, clock, 10) == [5]
    store.reset_offset_by_time(GROUP, TOPIC, [0], 0, force=True)
    assert pop(store, clock, 2) == [0, 1]


class _Bounds:
    """The store's reads with a queue's min offset raised, as CommitLog expiry
    does, or its max lowered, as a CommitLog that lost its tail does."""

    def __init__(self, store: MessageStore, min_offset: int, max_offset: int = 2**62) -> None:
        self.store, self.min_offset, self.max_offset = store, min_offset, max_offset

    def get_message(
        self,
        group: str,
        topic: str,
        queue_id: int,
        offset: int,
        max_msg_nums: int,
        message_filter: MessageFilter | None = None,
    ) -> GetMessageResult:
        offset = max(offset, self.min_offset)
        high = self.get_max_offset_in_queue(topic, queue_id)
        if offset >= high:
            return GetMessageResult(GetStatus.OFFSET_OVERFLOW_ONE, offset, self.min_offset, high)
        max_msg_nums = min(max_msg_nums, high - offset)
        return self.store.get_message(group, topic, queue_id, offset, max_msg_nums, message_filter)

    def get_min_offset_in_queue(self, topic: str, queue_id: int) -> int:
        return self.min_offset

    def get_max_offset_in_queue(self, topic: str, queue_id: int) -> int:
        return min(self.max_offset, self.store.get_max_offset_in_queue(topic, queue_id))


def test_expired_messages_are_skipped_to_the_min_offset(
    store: MessageStore, clock: ManualClock, tmp_path: Path
) -> None:
    put(store, 6)
    reads = _Bounds(store, 0)
    pops = PopStore(tmp_path / "pop", reads, store.consumer_offsets)
    pops.load()
    assert [m.queue_offset for m in pops.pop(GROUP, TOPIC, 0, 2, 10, clock.now_ms())] == [0, 1]
    reads.min_offset = 4
    clock.advance(10)
    got = pops.pop(GROUP, TOPIC, 0, 10, 10, clock.now_ms())
    assert [(m.queue_offset, m.attempt) for m in got] == [(4, 1), (5, 1)]
    assert set(pops.in_flight(GROUP, TOPIC, 0)) == {4, 5}
    pops.close()


def test_a_queue_that_lost_its_tail_moves_the_cursor_back(
    store: MessageStore, clock: ManualClock, tmp_path: Path
) -> None:
    put(store, 6)
    reads = _Bounds(store, 0)
    pops = PopStore(tmp_path / "pop", reads, store.consumer_offsets)
    pops.load()
    assert len(pops.pop(GROUP, TOPIC, 0, 10, INVISIBLE_MS, clock.now_ms())) == 6
    reads.max_offset = 4  # offsets 4 and 5 are gone; the next sends will take them
    assert pops.pop(GROUP, TOPIC, 0, 10, INVISIBLE_MS, clock.now_ms()) == []
    assert set(pops.in_flight(GROUP, TOPIC, 0)) == {0, 1, 2, 3}
    assert pops.cursor(GROUP, TOPIC, 0) == 4
    reads.max_offset = 5
    got = pops.pop(GROUP, TOPIC, 0, 10, INVISIBLE_MS, clock.now_ms())
    assert [(m.queue_offset, m.attempt) for m in got] == [(4, 1)]
    pops.close()


def test_journal_replays_after_reopen(make_config: ConfigFactory, clock: ManualClock) -> None:
    store = MessageStore.open(make_config(), clock=clock)
    put(store, 5)
    got = store.pop.pop(GROUP, TOPIC, 0, 3, INVISIBLE_MS, clock.now_ms())
    store.pop.ack(GROUP, TOPIC, 0, 1, got[1].nonce)
    changed = store.pop.change_invisible(GROUP, TOPIC, 0, 2, got[2].nonce, 5, clock.now_ms())
    before = store.pop.in_flight(GROUP, TOPIC, 0)
    store.shutdown()
    # As if the crash came before the offsets file was saved: the journal has them.
    for path in consumer_offset_path(make_config().store_path_root_dir).parent.iterdir():
        path.unlink()
    store = MessageStore.open(make_config(), clock=clock)
    try:
        assert store.pop_load_report is not None and store.pop_load_report.in_flight == 2
        assert store.query_offset(GROUP, TOPIC, 0) == 0
        assert store.pop.in_flight(GROUP, TOPIC, 0) == before
        assert store.pop.cursor(GROUP, TOPIC, 0) == 3
        assert store.pop.ack(GROUP, TOPIC, 0, 2, changed.nonce) is AckStatus.OK
        clock.advance(INVISIBLE_MS)
        again = store.pop.pop(GROUP, TOPIC, 0, 10, INVISIBLE_MS, clock.now_ms())
        assert [(m.queue_offset, m.attempt) for m in again] == [(0, 2), (3, 1), (4, 1)]
    finally:
        store.shutdown()


def test_a_torn_journal_tail_is_cut_and_only_moves_state_back(
    make_config: ConfigFactory, clock: ManualClock
) -> None:
    store = MessageStore.open(make_config(), clock=clock)
    put(store, 2)
    got = store.pop.pop(GROUP, TOPIC, 0, 2, INVISIBLE_MS, clock.now_ms())
    store.pop.ack(GROUP, TOPIC, 0, 1, got[1].nonce)
    journal = store.pop.path
    store.shutdown()
    data = journal.read_bytes()
    journal.write_bytes(data[:-3])  # the ACK half written
    store = MessageStore.open(make_config(), clock=clock)
    try:
        report = store.pop_load_report
        assert report is not None and report.truncated_bytes > 0
        assert set(store.pop.in_flight(GROUP, TOPIC, 0)) == {0, 1}  # 1 will come again
        assert journal.stat().st_size == len(data) - report.truncated_bytes - 3
    finally:
        store.shutdown()


def _folder_is_a_file(folder: Path) -> str:
    shutil.rmtree(folder)
    folder.write_bytes(b"not a folder")
    return "pop-folder"


def _folder_is_a_dangling_link(folder: Path) -> str:
    shutil.rmtree(folder)
    folder.symlink_to(folder.parent / "nowhere")
    return "pop-folder"


def _journal_is_a_folder(folder: Path) -> str:
    (folder / JOURNAL_NAME).unlink()
    (folder / JOURNAL_NAME).mkdir()
    return "pop-journal"


@pytest.mark.parametrize(
    "damage", [_folder_is_a_file, _folder_is_a_dangling_link, _journal_is_a_folder]
)
def test_a_journal_that_is_not_one_is_set_aside_and_in_flight_messages_come_again(
    make_config: ConfigFactory,
    clock: ManualClock,
    caplog: pytest.LogCaptureFixture,
    damage: Callable[[Path], str],
) -> None:
    """Issue 28 point 4: the store used to refuse to start (the store-node exited 2).
    What is in the journal's place goes to quarantine/ and the pop state starts
    empty, as after a lost journal."""
    config = make_config()
    store = MessageStore.open(config, clock=clock)
    put(store, 6)
    got = store.pop.pop(GROUP, TOPIC, 0, 4, INVISIBLE_MS, clock.now_ms())
    store.pop.ack(GROUP, TOPIC, 0, 0, got[0].nonce)
    folder = store.pop.directory
    store.shutdown()
    name = damage(folder)
    with caplog.at_level(logging.ERROR, logger="basalt.store.pop"):
        store = MessageStore.open(config, clock=clock)
    try:
        report = store.pop_load_report
        assert report is not None and report.records == 0 and len(report.set_aside) == 1
        (moved,) = report.set_aside
        assert Path(moved).parent == config.quarantine_dir
        assert Path(moved).name == name
        assert os.path.lexists(moved)
        assert "pop state starts empty" in caplog.text
        assert store.pop.path.is_file()
        # The committed offset (1: offset 0 was acked) survived in consumerOffset.json:
        # the messages that were in flight come again, nothing is skipped.
        again = store.pop.pop(GROUP, TOPIC, 0, 10, INVISIBLE_MS, clock.now_ms())
        assert [(m.queue_offset, m.attempt) for m in again] == [(o, 1) for o in range(1, 6)]
    finally:
        store.shutdown()
    store = MessageStore.open(config, clock=clock)
    try:
        assert store.pop_load_report is not None and store.pop_load_report.set_aside == ()
        assert sorted(store.pop.in_flight(GROUP, TOPIC, 0)) == [1, 2, 3, 4, 5]
    finally:
        store.shutdown()


def test_records_round_trip_and_a_flipped_byte_stops_replay() -> None:
    a = encode_record(Kind.INFLIGHT, "g", "t", 3, 17, 99, 2, 12345)
    b = encode_record(Kind.ACK, "g", "主题", 3, 17)
    decoded = [rec for _, rec in decode_records(a + b)]
    assert decoded == [
        (Kind.INFLIGHT, "g", "t", 3, 17, 99, 2, 12345),
        (Kind.ACK, "g", "主题", 3, 17, 0, 0, 0),
    ]
    damaged = bytearray(a + b)
    damaged[len(a) + 12] ^= 1
    assert [rec[0] for _, rec in decode_records(bytes(damaged))] == [Kind.INFLIGHT]


def test_compaction_keeps_the_live_state(
    store: MessageStore, clock: ManualClock, tmp_path: Path
) -> None:
    put(store, 50)
    pops = PopStore(tmp_path / "pop", store, store.consumer_offsets, compact_bytes=4096)
    pops.load()
    for _ in range(25):
        for m in pops.pop(GROUP, TOPIC, 0, 2, INVISIBLE_MS, clock.now_ms()):
            if m.queue_offset % 10:
                assert pops.ack(GROUP, TOPIC, 0, m.queue_offset, m.nonce) is AckStatus.OK
    assert pops.compactions >= 1
    assert pops.journal_bytes <= 4096
    live = pops.in_flight(GROUP, TOPIC, 0)
    assert set(live) == {0, 10, 20, 30, 40}
    pops.close()
    again = PopStore(tmp_path / "pop", store, store.consumer_offsets)
    again.load()
    assert again.in_flight(GROUP, TOPIC, 0) == live
    assert again.cursor(GROUP, TOPIC, 0) == 50
    assert (tmp_path / "pop" / JOURNAL_NAME).stat().st_size == again.journal_bytes
    again.close()


def test_a_batch_writes_its_operations_records_once_at_its_end_and_they_replay(
    make_config: ConfigFactory, clock: ManualClock
) -> None:
    store = MessageStore.open(make_config(), clock=clock)
    put(store, 6)
    journal = store.pop.path
    sizes: list[int] = []

    def work() -> list[AckStatus]:
        got = store.pop.pop(GROUP, TOPIC, 0, 4, INVISIBLE_MS, clock.now_ms())
        sizes.append(journal.stat().st_size)
        acked = store.pop.ack_many(
            GROUP,
            TOPIC,
            [(0, 0, got[0].nonce), (0, 1, got[0].nonce), (0, 2, got[2].nonce)],  # 1: stale
        )
        store.pop.change_invisible(GROUP, TOPIC, 0, 3, got[3].nonce, 5, clock.now_ms())
        sizes.append(journal.stat().st_size)
        return acked

    before = journal.stat().st_size
    acked = store.pop.batch(work)
    assert acked == [AckStatus.OK, AckStatus.STALE, AckStatus.OK]
    # Nothing reached the journal inside the batch; all of it by its end.
    assert sizes == [before, before]
    assert journal.stat().st_size > before
    in_flight = store.pop.in_flight(GROUP, TOPIC, 0)
    assert sorted(in_flight) == [1, 3]
    store.shutdown()
    store = MessageStore.open(make_config(), clock=clock)
    try:
        assert store.pop.in_flight(GROUP, TOPIC, 0) == in_flight
        assert store.pop.cursor(GROUP, TOPIC, 0) == 4
        assert store.query_offset(GROUP, TOPIC, 0) == 1
    finally:
        store.shutdown()


def test_a_batch_that_raises_still_writes_what_it_did(
    make_config: ConfigFactory, clock: ManualClock
) -> None:
    store = MessageStore.open(make_config(), clock=clock)
    put(store, 2)

    def work() -> None:
        store.pop.pop(GROUP, TOPIC, 0, 2, INVISIBLE_MS, clock.now_ms())
        raise RuntimeError("after the pop")

    with pytest.raises(RuntimeError):
        store.pop.batch(work)
    store.shutdown()
    store = MessageStore.open(make_config(), clock=clock)
    try:  # the delivery is journaled: the messages are in flight, not lost or new
        assert sorted(store.pop.in_flight(GROUP, TOPIC, 0)) == [0, 1]
        assert pop(store, clock, 10) == []
    finally:
        store.shutdown()
