"""The pull path's read (``MessageStore.get_message``), offsets by time, look-ups.

The statuses and edge rules are RocketMQ 4.9's (DefaultMessageStore.getMessage
and its tests): pulls of 32/20/10 from 32 stored, the offset checks with their
corrected next offsets, the transfer caps, filtered scans that move the
consumer forward, and records whose CommitLog file is gone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pytest

from basalt.common.message import decode_properties
from basalt.store import ManualClock, Message, MessageStore, PutMessageResult
from basalt.store.get_message import GetStatus
from basalt.store.hashing import tags_code
from basalt.store.message_filter import build_filter
from tests.support.stores import ConfigFactory

TOPIC = "PullTopic"


@dataclass(frozen=True)
class TagSet:
    """A minimal filter for these tests: tag codes on the ConsumeQueue, and an
    optional exact tag check on the record's properties."""

    tags: Sequence[str]
    confirm: bool = True

    @property
    def tags_codes(self) -> tuple[int, ...] | None:
        return tuple(tags_code(t) for t in self.tags)

    @property
    def needs_commit_log_check(self) -> bool:
        return self.confirm

    def is_matched_by_consume_queue(self, tags_code: int) -> bool:
        return tags_code in (self.tags_codes or ())

    def is_matched_by_commit_log(self, properties: bytes) -> bool:
        return decode_properties(properties).get("TAGS") in self.tags


def put(
    store: MessageStore, count: int, *, queue_id: int = 0, tags: str = "TagA", size: int = 64
) -> list[PutMessageResult]:
    results = []
    for i in range(count):
        body = (b"%05d" % i).ljust(size, b".")
        result = store.put_message(Message(TOPIC, body, queue_id=queue_id, tags=tags))
        assert result.ok
        results.append(result)
    assert store.wait_dispatched()
    return results


@pytest.mark.parametrize(("max_nums", "expected"), [(32, 32), (20, 20), (10, 10)])
def test_pulls_of_32_20_and_10_from_32_stored(
    store: MessageStore, max_nums: int, expected: int
) -> None:
    put(store, 32)
    result = store.get_message("G", TOPIC, 0, 0, max_nums)
    assert result.status is GetStatus.FOUND
    assert result.message_count == expected
    assert result.next_begin_offset == expected
    assert (result.min_offset, result.max_offset) == (0, 32)
    records = result.decode()
    assert [r.queue_offset for r in records] == list(range(expected))
    assert [r.body[:5] for r in records] == [b"%05d" % i for i in range(expected)]


def test_records_are_returned_as_stored_bytes(store: MessageStore) -> None:
    results = put(store, 3)
    result = store.get_message("G", TOPIC, 0, 0, 3)
    stored = [store.commitlog.read(r.physical_offsets[0], r.sizes[0]) for r in results]
    assert result.records == b"".join(s for s in stored if s is not None)
    assert [bytes(v) for v in result.iter_records()] == stored
    assert result.buffer_total_size == sum(r.sizes[0] for r in results)


def test_offset_checks_and_their_corrected_next_offsets(store: MessageStore) -> None:
    unknown = store.get_message("G", "Nobody", 0, 5, 32)
    assert (unknown.status, unknown.next_begin_offset) == (GetStatus.NO_MATCHED_LOGIC_QUEUE, 0)
    put(store, 10)
    one = store.get_message("G", TOPIC, 0, 10, 32)
    assert (one.status, one.next_begin_offset) == (GetStatus.OFFSET_OVERFLOW_ONE, 10)
    badly = store.get_message("G", TOPIC, 0, 99, 32)
    # min offset 0: RocketMQ corrects to the min, not the max.
    assert (badly.status, badly.next_begin_offset) == (GetStatus.OFFSET_OVERFLOW_BADLY, 0)
    assert store.get_message("G", TOPIC, 0, 9, 32).message_count == 1


def test_empty_queue_is_no_message_in_queue(store: MessageStore) -> None:
    cq = store.consume_queues.find_or_create(TOPIC, 3)
    result = store.get_message("G", TOPIC, 3, 0, 32)
    assert cq.max_offset_in_queue == 0
    assert (result.status, result.next_begin_offset) == (GetStatus.NO_MESSAGE_IN_QUEUE, 0)


def test_caps_on_count_and_bytes_always_return_at_least_one(
    make_config: ConfigFactory, clock: ManualClock
) -> None:
    config = make_config(
        max_transfer_bytes_on_message_in_memory=1000,
        max_transfer_count_on_message_in_memory=5,
    )
    with MessageStore.open(config, clock=clock) as store:
        put(store, 20, size=20)  # ~130-byte records: 5 fit in 1000 bytes
        by_count = store.get_message("G", TOPIC, 0, 0, 32)
        assert by_count.message_count == 5
        assert by_count.next_begin_offset == 5
        put(store, 3, queue_id=1, size=300)  # ~410-byte records: the third would pass 1000
        by_bytes = store.get_message("G", TOPIC, 1, 0, 32)
        assert by_bytes.message_count == 2
        assert by_bytes.buffer_total_size <= 1000
        assert by_bytes.next_begin_offset == 2
        put(store, 2, queue_id=2, size=4000)  # one record bigger than the byte cap
        big = store.get_message("G", TOPIC, 2, 0, 32)
        assert (big.status, big.message_count, big.next_begin_offset) == (GetStatus.FOUND, 1, 1)


def test_records_far_behind_the_end_get_the_in_disk_caps(
    make_config: ConfigFactory, clock: ManualClock
) -> None:
    config = make_config(
        access_message_in_memory_max_ratio=0,  # every record counts as "in disk"
        max_transfer_count_on_message_in_disk=3,
    )
    with MessageStore.open(config, clock=clock) as store:
        put(store, 10)
        assert store.get_message("G", TOPIC, 0, 0, 32).message_count == 3


def test_tag_filter_skips_on_the_consume_queue_and_moves_the_consumer_forward(
    store: MessageStore,
) -> None:
    for i in range(30):
        tags = "hit" if i % 10 == 9 else "miss"
        assert store.put_message(Message(TOPIC, b"%d" % i, tags=tags)).ok
    assert store.wait_dispatched()
    result = store.get_message("G", TOPIC, 0, 0, 32, TagSet(["hit"]))
    assert result.status is GetStatus.FOUND
    assert [r.body for r in result.decode()] == [b"9", b"19", b"29"]
    assert result.next_begin_offset == 30
    nothing = store.get_message("G", TOPIC, 0, 0, 32, TagSet(["absent"]))
    assert nothing.status is GetStatus.NO_MATCHED_MESSAGE
    assert nothing.message_count == 0
    assert nothing.next_begin_offset == 30  # scanned past every unit


def test_a_tag_hash_collision_does_not_leak_when_the_record_is_checked(
    store: MessageStore,
) -> None:
    assert tags_code("Aa") == tags_code("BB")
    for i, tags in enumerate(["Aa", "BB", "Aa", "BB"]):
        assert store.put_message(Message(TOPIC, b"%d" % i, tags=tags)).ok
    assert store.wait_dispatched()
    unchecked = store.get_message("G", TOPIC, 0, 0, 32, TagSet(["Aa"], confirm=False))
    assert unchecked.message_count == 4  # the ConsumeQueue alone cannot tell them apart
    checked = store.get_message("G", TOPIC, 0, 0, 32, TagSet(["Aa"]))
    assert [r.body for r in checked.decode()] == [b"0", b"2"]
    assert checked.next_begin_offset == 4


def test_real_tag_and_sql92_filters_through_the_store(store: MessageStore) -> None:
    for i in range(40):
        props = {"a": str(i % 10), "region": "eu" if i % 2 else "us"}
        tags = ("Aa", "BB", "TagC", "TagD")[i % 4]  # Aa and BB share a Java hash
        assert store.put_message(Message(TOPIC, b"%d" % i, tags=tags, properties=props)).ok
    assert store.wait_dispatched()
    tag = store.get_message("G", TOPIC, 0, 0, 32, build_filter("TAG", "Aa || TagD"))
    assert [int(r.body) for r in tag.decode()] == [i for i in range(40) if i % 4 in (0, 3)]
    assert tag.next_begin_offset == 40
    sql = store.get_message(
        "G", TOPIC, 0, 0, 32, build_filter("SQL92", "a BETWEEN 3 AND 4 AND region = 'us'")
    )
    assert [int(r.body) for r in sql.decode()] == [4, 14, 24, 34]
    everything = store.get_message("G", TOPIC, 0, 0, 32, build_filter("TAG", "*"))
    assert everything.message_count == 32


def test_scan_limit_per_call_is_16000_consume_queue_bytes(
    make_config: ConfigFactory, clock: ManualClock
) -> None:
    with MessageStore.open(
        make_config(mapped_file_size_consume_queue=20 * 3000), clock=clock
    ) as store:
        put(store, 1000, tags="miss", size=8)
        result = store.get_message("G", TOPIC, 0, 0, 32, TagSet(["hit"]))
        assert result.status is GetStatus.NO_MATCHED_MESSAGE
        assert result.next_begin_offset == 800  # max(16000, 32 * 20) bytes of units
        rest = store.get_message("G", TOPIC, 0, 800, 32, TagSet(["hit"]))
        assert rest.next_begin_offset == 1000


def test_a_scan_stops_at_the_end_of_a_consume_queue_file(store: MessageStore) -> None:
    units_per_file = store.config.mapped_file_size_consume_queue // 20
    put(store, units_per_file + 5, size=8)
    first = store.get_message("G", TOPIC, 0, units_per_file - 2, 32)
    assert first.message_count == 2
    assert first.next_begin_offset == units_per_file
    second = store.get_message("G", TOPIC, 0, units_per_file, 32)
    assert second.message_count == 5


def test_records_across_commitlog_files_are_read(store: MessageStore) -> None:
    results = put(store, 200, size=900)  # 64 KiB files: several rolls
    files = {r.physical_offsets[0] // store.config.mapped_file_size_commit_log for r in results}
    assert len(files) > 2
    offset = 0
    bodies = []
    while offset < 200:
        got = store.get_message("G", TOPIC, 0, offset, 32)
        assert got.status is GetStatus.FOUND
        bodies += [r.body[:5] for r in got.decode()]
        offset = got.next_begin_offset
    assert bodies == [b"%05d" % i for i in range(200)]


def test_units_whose_commitlog_file_is_gone_are_skipped_to_the_next_file(
    make_config: ConfigFactory, clock: ManualClock
) -> None:
    with MessageStore.open(
        make_config(mapped_file_size_consume_queue=20 * 1000), clock=clock
    ) as store:
        results = put(store, 200, size=900)
        file_size = store.config.mapped_file_size_commit_log
        # Drop the first CommitLog file, as expiry does, but leave the ConsumeQueue.
        assert store.commitlog.files.delete_first_files_below(file_size) == 1
        first_kept = sum(1 for r in results if r.physical_offsets[0] < file_size)
        result = store.get_message("G", TOPIC, 0, 0, 4)
        # Gone records are skipped; the pull returns what follows them.
        assert result.status is GetStatus.FOUND
        assert [r.queue_offset for r in result.decode()] == list(range(first_kept, first_kept + 4))
        assert result.next_begin_offset == first_kept + 4


def test_a_scan_of_gone_records_only_is_message_was_removing(store: MessageStore) -> None:
    """The ConsumeQueue file (64 units here) ends before the first kept record."""
    results = put(store, 200, size=600)
    file_size = store.config.mapped_file_size_commit_log
    first_kept = sum(1 for r in results if r.physical_offsets[0] < file_size)
    units_per_file = store.config.mapped_file_size_consume_queue // 20
    assert first_kept > units_per_file
    store.commitlog.files.delete_first_files_below(file_size)
    result = store.get_message("G", TOPIC, 0, 0, 4)
    assert result.status is GetStatus.MESSAGE_WAS_REMOVING
    assert (result.message_count, result.next_begin_offset) == (0, units_per_file)
    after = store.get_message("G", TOPIC, 0, result.next_begin_offset, 32)
    assert after.decode()[0].queue_offset == first_kept


def test_bad_arguments_and_a_stopped_store(store: MessageStore) -> None:
    with pytest.raises(ValueError, match="max_msg_nums"):
        store.get_message("G", TOPIC, 0, 0, 0)
    store.shutdown()
    with pytest.raises(Exception, match="not running"):
        store.get_message("G", TOPIC, 0, 0, 1)


# -- offsets and times ------------------------------------------------------------------


def put_at(
    store: MessageStore, clock: ManualClock, times: Sequence[int], queue_id: int = 0
) -> None:
    for i, t in enumerate(times):
        clock.set(t)
        assert store.put_message(Message(TOPIC, b"%d" % i, queue_id=queue_id)).ok
    assert store.wait_dispatched()


def test_offset_by_time_exact_between_after_and_before(
    store: MessageStore, clock: ManualClock
) -> None:
    base = 1_700_000_000_000
    times = [base + 10 * i for i in range(50)]
    put_at(store, clock, times)
    by_time = store.get_offset_in_queue_by_time
    assert by_time(TOPIC, 0, times[17]) == 17  # exact
    assert by_time(TOPIC, 0, times[17] + 2) == 17  # nearer to the left
    assert by_time(TOPIC, 0, times[17] + 8) == 18  # nearer to the right
    assert by_time(TOPIC, 0, times[17] + 5) == 17  # a tie: the earlier one
    assert by_time(TOPIC, 0, times[-1] + 20_000) == 49  # after the last: the last
    assert by_time(TOPIC, 0, base - 20_000) == 0  # before the first: the first
    assert by_time("Unknown", 0, base) == 0


def test_offset_by_time_exact_hit_on_equal_times_is_the_first_of_them(
    store: MessageStore, clock: ManualClock
) -> None:
    base = 1_700_000_000_000
    put_at(store, clock, [base] * 3 + [base + 5] * 40 + [base + 9] * 3)
    assert store.get_offset_in_queue_by_time(TOPIC, 0, base + 5) == 3


def test_offset_by_time_across_consume_queue_files(store: MessageStore, clock: ManualClock) -> None:
    base = 1_700_000_000_000
    units_per_file = store.config.mapped_file_size_consume_queue // 20
    count = units_per_file * 3 + 7
    put_at(store, clock, [base + i for i in range(count)])
    for i in (0, units_per_file - 1, units_per_file, 2 * units_per_file + 3, count - 1):
        assert store.get_offset_in_queue_by_time(TOPIC, 0, base + i) == i


def test_store_timestamps_and_look_ups_by_offset(store: MessageStore, clock: ManualClock) -> None:
    base = 1_700_000_000_000
    put_at(store, clock, [base, base + 1, base + 2])
    assert store.get_message_store_timestamp(TOPIC, 0, 1) == base + 1
    assert store.get_message_store_timestamp(TOPIC, 0, 3) == -1
    assert store.get_message_store_timestamp("Unknown", 0, 0) == -1
    first = store.min_physical_offset
    cq = store.get_consume_queue(TOPIC, 0)
    unit = cq.get_unit(2) if cq is not None else None
    assert unit is not None
    last = unit[0]
    assert store.get_store_time(first) == base
    assert store.get_store_time(last) == base + 2
    assert store.get_store_time(store.max_physical_offset) == -1
    assert store.lookup_message_by_offset(first).body == b"0"  # type: ignore[union-attr]
    assert store.lookup_message_by_offset(last).body == b"2"  # type: ignore[union-attr]
    assert store.lookup_message_by_offset(store.max_physical_offset) is None
    assert store.get_min_offset_in_queue(TOPIC, 0) == 0
    assert store.get_max_offset_in_queue(TOPIC, 0) == 3


def test_look_ups_below_the_commitlog_min_are_unknown(
    store: MessageStore, clock: ManualClock
) -> None:
    put_at(store, clock, [1_700_000_000_000 + i for i in range(200)])
    file_size = store.config.mapped_file_size_commit_log
    store.commitlog.files.delete_first_files_below(file_size)
    assert store.get_store_time(0) == -1
    assert store.lookup_message_by_offset(0) is None
    assert store.get_message_store_timestamp(TOPIC, 0, 0) == -1


def test_filler_units_in_a_padded_hole_are_skipped_not_spun_on(store: MessageStore) -> None:
    """A ConsumeQueue hole is padded with filler units (0, 0x7FFFFFFF, 0): a pull
    steps over them, with or without a filter, and loses no record after them."""
    store.dispatcher.shutdown(drain=False)
    cq = store.consume_queues.find_or_create(TOPIC, 0)
    first = store.put_message(Message(TOPIC, b"a", tags="t"))
    later = store.put_message(Message(TOPIC, b"b", tags="t"))
    store.commitlog.handoff.clear()
    assert cq.put_entries([(0, first.physical_offsets[0], first.sizes[0], tags_code("t"))]) == 1
    # Queue offset 3 while the queue ends at 1: offsets 1 and 2 become fillers.
    assert cq.put_entries([(3, later.physical_offsets[0], later.sizes[0], tags_code("t"))]) == 1
    for flt in (None, build_filter("SQL92", "a = 'nope'"), build_filter("TAG", "t")):
        got = store.get_message("G", TOPIC, 0, 0, 32, flt)
        assert got.next_begin_offset == 4
        if flt is None or "TAG" in repr(flt) or hasattr(flt, "tags"):
            assert [r.body for r in got.decode()] == [b"a", b"b"]
    from_hole = store.get_message("G", TOPIC, 0, 1, 32)
    assert [r.body for r in from_hole.decode()] == [b"b"]


def test_store_time_where_no_record_starts_is_unknown(store: MessageStore) -> None:
    assert store.put_message(Message(TOPIC, b"x" * 50)).ok
    assert store.get_store_time(0) > 0
    assert store.get_store_time(1) == -1
    assert store.get_store_time(7) == -1
