"""store.index_file: RocketMQ's IndexFile, against golden bytes and a dict reference model."""

from __future__ import annotations

import shutil
import struct
import tempfile
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from basalt.store.errors import CorruptFileError
from basalt.store.hashing import java_string_hash
from basalt.store.index_file import (
    ENTRY,
    HEADER,
    SLOT,
    IndexFile,
    IndexHeader,
    index_file_name,
    index_file_size,
    index_key_hash,
    is_index_file_name,
    next_index_file_name,
)

T0 = 1_700_000_000_000
MakeFile = Callable[..., IndexFile]
#: A store time so far after T0 that the timeDiff no longer fits an int.
T_FAR = T0 + 2**31 * 1000 + 20_000

# Produced by RocketMQ 4.9.8's own IndexFile.java and IndexHeader.java (compiled
# unmodified against a stub MappedFile that maps the file READ_WRITE), running
# GOLDEN_SCRIPT: the whole file, hex.
GOLDEN_SLOTS, GOLDEN_NUM = 7, 6
GOLDEN_F0 = (
    "0000018bcfe568000000018bcfe573b8000000000000006400000000000001f4000000020000000600000004"
    "000000000000000000000000000000050000000000000000000000000000000000000000000000000000000062"
    "b4514c000000000000006400000000000000000029e1c200000000000000c800000001000000000029e1c20000"
    "00000000012c0000000200000002000000000000000000000190000000000000000362b4514c00000000000001"
    "f40000000300000001"
)
GOLDEN_F1 = (
    "0000018bcfe58f100000037fcfe5b620000000000000025800000000000002bc000000020000000300000000"
    "000000000000000000000002000000010000000000000000000000000000000000000000000000000000000062"
    "b4514c0000000000000258000000070000000062b4514b00000000000002bc7fffffff00000000000000000000"
    "000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000"
    "000000000000000000"
)


@pytest.fixture
def make_file(tmp_path: Path) -> Iterator[MakeFile]:
    opened: list[IndexFile] = []

    def make(name: str = "f", slots: int = 7, num: int = 32, **kw: int) -> IndexFile:
        f = IndexFile.create(tmp_path / name, slots, num, **kw)
        opened.append(f)
        return f

    yield make
    for f in opened:
        f.close()


# -- hashing and names -------------------------------------------------------------------


def test_key_hash_is_the_absolute_java_hash_with_min_value_as_zero() -> None:
    # "TopicTest#key1".hashCode() == -1655984460 on OpenJDK 17.
    assert java_string_hash("TopicTest#key1") == -1655984460
    assert index_key_hash("TopicTest#key1") == 1655984460
    assert java_string_hash("polygenelubricants") == -(2**31)
    assert index_key_hash("polygenelubricants") == 0  # Math.abs(MIN_VALUE) < 0 -> 0
    assert index_key_hash("TopicTest#Aa") == index_key_hash("TopicTest#BB") == 2744770


def test_file_names_are_creation_time_yyyymmddhhmmsssss() -> None:
    assert index_file_name(0, UTC) == "19700101000000000"
    assert index_file_name(T0 + 123, UTC) == "20231114221320123"
    local = datetime.fromtimestamp(T0 // 1000)
    assert index_file_name(T0 + 7) == local.strftime("%Y%m%d%H%M%S") + "007"
    assert is_index_file_name("20231114221320123")
    assert not is_index_file_name("20231114221320123.tmp")
    assert next_index_file_name("20231114221320123") == "20231114221320124"
    assert next_index_file_name("20231231235959999") == "20240101000000000"


# -- byte layout -------------------------------------------------------------------------


def test_layout_sizes_come_from_the_structs() -> None:
    assert (HEADER.size, SLOT.size, ENTRY.size) == (40, 4, 20)
    assert HEADER.format == ">qqqqii"
    assert ENTRY.format == ">iqii"
    assert index_file_size(5_000_000, 20_000_000) == 420_000_040


def test_golden_bytes_match_rocketmq_4_9_8(tmp_path: Path) -> None:
    f0 = IndexFile.create(tmp_path / "f0", GOLDEN_SLOTS, GOLDEN_NUM)
    assert f0.put_key("TopicTest#key1", 100, T0)
    assert f0.put_key("TopicTest#Aa", 200, T0 + 1500)
    assert f0.put_key("TopicTest#BB", 300, T0 + 2999)
    assert f0.put_key("polygenelubricants", 400, T0 - 5000)  # before begin: timeDiff 0
    assert f0.put_key("TopicTest#key1", 500, T0 + 3000)
    assert not f0.put_key("TopicTest#key2", 550, T0 + 3000)  # 6 entries, entry 0 unused
    f0.flush()
    f1 = IndexFile.create(
        tmp_path / "f1",
        GOLDEN_SLOTS,
        GOLDEN_NUM,
        end_phy_offset=f0.end_phy_offset,
        end_timestamp_ms=f0.end_timestamp_ms,
    )
    f1.flush()
    assert f1.put_key("TopicTest#key1", 600, T0 + 10_000)
    assert f1.put_key("TopicTest#key2", 700, T_FAR)  # timeDiff clamped to Integer.MAX_VALUE

    # Chain walks RocketMQ returned for the same file.
    everything = (0, 9_999_999_999_999)
    assert f0.select_phy_offsets("TopicTest#key1", 10, *everything) == [500, 100]
    assert f0.select_phy_offsets("TopicTest#Aa", 10, *everything) == [300, 200]
    assert f0.select_phy_offsets("TopicTest#key1", 10, T0 + 1000, everything[1]) == [500]
    assert f1.select_phy_offsets("TopicTest#key1", 10, *everything) == [600]
    assert f1.select_phy_offsets("TopicTest#key2", 10, 0, 99_999_999_999_999_999) == [700]
    f0.close()
    f1.close()
    assert (tmp_path / "f0").read_bytes().hex() == GOLDEN_F0
    assert (tmp_path / "f1").read_bytes().hex() == GOLDEN_F1


def test_header_slot_and_entry_positions_for_a_known_key(make_file: MakeFile) -> None:
    slots, num = 11, 8
    f = make_file(slots=slots, num=num)
    raw = f.path.read_bytes()
    assert len(raw) == 40 + slots * 4 + num * 20
    assert raw == bytes(len(raw))  # indexCount is 1 in memory, 0 on disk until written
    assert f.index_count == 1

    key, key_hash = "TopicTest#key1", 1655984460
    slot = key_hash % slots
    assert f.put_key(key, 0x0102030405060708, T0)
    assert f.put_key(key, 4242, T0 + 2500)
    raw = f.path.read_bytes()
    assert struct.unpack_from(">q", raw, 0) == (T0,)  # beginTimestamp
    assert struct.unpack_from(">q", raw, 8) == (T0 + 2500,)  # endTimestamp
    assert struct.unpack_from(">q", raw, 16) == (0x0102030405060708,)  # beginPhyOffset
    assert struct.unpack_from(">q", raw, 24) == (4242,)  # endPhyOffset
    assert struct.unpack_from(">i", raw, 32) == (1,)  # hashSlotCount
    assert struct.unpack_from(">i", raw, 36) == (3,)  # indexCount: next entry is 3
    slot_pos = 40 + slot * 4
    assert struct.unpack_from(">i", raw, slot_pos) == (2,)  # newest entry of the slot
    entries = 40 + slots * 4
    assert raw[entries : entries + 20] == bytes(20)  # entry 0 is never written
    assert struct.unpack_from(">iqii", raw, entries + 20) == (key_hash, 0x0102030405060708, 0, 0)
    assert struct.unpack_from(">iqii", raw, entries + 40) == (key_hash, 4242, 2, 1)
    assert f.header == IndexHeader(T0, T0 + 2500, 0x0102030405060708, 4242, 1, 3)


def test_a_file_after_a_full_one_starts_at_its_end(make_file: MakeFile) -> None:
    f = make_file(end_phy_offset=1234, end_timestamp_ms=T0)
    assert f.header == IndexHeader(T0, T0, 1234, 1234, 0, 1)
    raw = f.path.read_bytes()
    assert struct.unpack_from(">qqqqii", raw, 0) == (T0, T0, 1234, 1234, 0, 0)
    # The first entry's timeDiff is taken against the inherited begin, then begin resets.
    assert f.put_key("k", 2000, T0 + 9_999)
    assert f.begin_timestamp_ms == T0 + 9_999
    (_, _, diff, _) = ENTRY.unpack_from(f.path.read_bytes(), 40 + 7 * 4 + 20)
    assert diff == 9


def test_flush_writes_the_in_memory_index_count_of_an_empty_file(make_file: MakeFile) -> None:
    f = make_file()
    assert f.flush() == IndexHeader(0, 0, 0, 0, 0, 1)
    assert struct.unpack_from(">i", f.path.read_bytes(), 36) == (1,)


# -- time ---------------------------------------------------------------------------------


def test_time_diff_is_truncated_seconds_clamped_to_an_int(make_file: MakeFile) -> None:
    f = make_file(num=8)
    stamps = [T0, T0 + 999, T0 + 1000, T0 - 1, T0 - 1_000_000, T_FAR]
    for i, ts in enumerate(stamps):
        assert f.put_key("k", i, ts)
    raw = f.path.read_bytes()
    diffs = [ENTRY.unpack_from(raw, 40 + 7 * 4 + 20 * (i + 1))[2] for i in range(len(stamps))]
    assert diffs == [0, 0, 1, 0, 0, 2**31 - 1]


def test_time_range_filters_and_the_walk_stops_at_the_first_older_entry(
    make_file: MakeFile,
) -> None:
    f = make_file(slots=1)  # one slot: every key shares one chain
    for i in range(6):
        f.put_key("a" if i % 2 == 0 else "b", 100 + i, T0 + i * 10_000)
    every = (0, 2**62)
    assert f.select_phy_offsets("a", 10, *every) == [104, 102, 100]
    assert f.select_phy_offsets("b", 10, *every) == [105, 103, 101]
    assert f.select_phy_offsets("a", 10, T0 + 20_000, T0 + 40_000) == [104, 102]
    assert f.select_phy_offsets("a", 10, T0 + 20_000, T0 + 39_999) == [102]
    assert f.select_phy_offsets("b", 10, T0 + 60_000, 2**62) == []


def test_max_num_bounds_the_result_and_counts_what_the_caller_passed(
    make_file: MakeFile,
) -> None:
    f = make_file()
    for i in range(5):
        f.put_key("k", i, T0 + i)
    assert f.select_phy_offsets("k", 2, 0, 2**62) == [4, 3]
    assert f.select_phy_offsets("k", 0, 0, 2**62) == []
    acc = [99]
    assert f.select_phy_offsets("k", 3, 0, 2**62, phy_offsets=acc) == [99, 4, 3]
    assert acc == [99, 4, 3]


def test_is_time_matched_follows_rocketmq(make_file: MakeFile) -> None:
    f = make_file()
    f.put_key("k", 1, 1000)
    f.put_key("k", 2, 5000)
    assert f.is_time_matched(0, 10_000)  # covers the span
    assert f.is_time_matched(2000, 3000)  # inside
    assert f.is_time_matched(5000, 9000)  # begins at the end
    assert f.is_time_matched(0, 1000)  # ends at the start
    assert not f.is_time_matched(0, 999)
    assert not f.is_time_matched(5001, 9000)
    assert not f.is_time_matched(1000 - 1, 1000 - 2)  # empty range before the span


# -- capacity, collisions -----------------------------------------------------------------


def test_a_full_file_refuses_the_entry_past_its_capacity(make_file: MakeFile) -> None:
    f = make_file(num=4)
    assert [f.put_key(f"k{i}", i, T0) for i in range(4)] == [True, True, True, False]
    assert f.is_write_full
    assert f.index_count == 4
    assert f.select_phy_offsets("k3", 10, 0, 2**62) == []


def test_keys_with_the_same_java_hash_return_both_offsets(make_file: MakeFile) -> None:
    f = make_file(slots=1_000_003)
    f.put_key("TopicTest#Aa", 10, T0)
    f.put_key("TopicTest#BB", 20, T0)
    f.put_key("TopicTest#key1", 30, T0)
    # Same hash: the index cannot tell them apart; the caller re-checks the record's keys.
    assert f.select_phy_offsets("TopicTest#Aa", 10, 0, 2**62) == [20, 10]
    assert f.select_phy_offsets("TopicTest#BB", 10, 0, 2**62) == [20, 10]
    assert f.select_phy_offsets("TopicTest#key1", 10, 0, 2**62) == [30]
    assert f.hash_slot_count == 2


def test_a_slot_naming_an_entry_past_index_count_reads_as_empty(make_file: MakeFile) -> None:
    f = make_file(slots=1)
    f.put_key("k", 7, T0)
    f.close()
    # A torn write: the slot was written, the header (indexCount) was not.
    with open(f.path, "r+b") as raw:
        raw.seek(40)
        raw.write(struct.pack(">i", 5))
    g = IndexFile.open(f.path, 1, 32)
    try:
        assert g.select_phy_offsets("k", 10, 0, 2**62) == []
        assert g.put_key("k", 8, T0)  # the bad slot value is not chained
        assert g.select_phy_offsets("k", 10, 0, 2**62) == [8]
    finally:
        g.close()


def test_a_looping_chain_ends(make_file: MakeFile) -> None:
    f = make_file(slots=1)
    for i in range(3):
        f.put_key("k", i, T0)
    entries = 40 + 4
    # Damage: entry 1 points forward to entry 3 (RocketMQ only stops on a self-loop).
    struct.pack_into(">i", f._mm, entries + 20 + 16, 3)
    assert f.select_phy_offsets("k", 100, 0, 2**62) == [2, 1, 0]


# -- open, close ----------------------------------------------------------------------------


def test_open_reads_the_header_back(make_file: MakeFile, tmp_path: Path) -> None:
    f = make_file(name="a")
    for i in range(3):
        f.put_key(f"k{i % 2}", 10 * i, T0 + 1000 * i)
    f.shutdown()
    g = IndexFile.open(tmp_path / "a", 7, 32)
    try:
        assert g.header == IndexHeader(T0, T0 + 2000, 0, 20, 2, 4)
        assert g.select_phy_offsets("k0", 10, 0, 2**62) == [20, 0]
    finally:
        g.close()
    # A never-written file reads indexCount 0 as 1.
    make_file(name="b").close()
    h = IndexFile.open(tmp_path / "b", 7, 32)
    assert h.index_count == 1
    h.close()


def test_open_refuses_a_file_of_the_wrong_size(make_file: MakeFile, tmp_path: Path) -> None:
    make_file(name="a", slots=7, num=32).close()
    with pytest.raises(CorruptFileError, match="size"):
        IndexFile.open(tmp_path / "a", 7, 33)


def test_create_refuses_an_existing_file_and_destroy_removes_it(
    make_file: MakeFile, tmp_path: Path
) -> None:
    f = make_file(name="a")
    with pytest.raises(FileExistsError):
        IndexFile.create(tmp_path / "a", 7, 32)
    f.destroy()
    assert not (tmp_path / "a").exists()
    assert f.flush() is None
    f.close()  # idempotent


# -- reference model --------------------------------------------------------------------------

Put = tuple[str, int, int]  # key, phy offset, store time


def model_select(
    puts: list[Put], key: str, max_num: int, begin: int, end: int, num: int
) -> list[int]:
    """What the file must return: the key's accepted entries at second resolution, newest
    first, in range. Store times never decrease here, so an older entry never matches
    after a newer one is found to be out of range: the early stop changes nothing."""
    accepted = puts[: num - 1]
    if not accepted:
        return []
    t_begin = accepted[0][2]
    found = [
        phy
        for k, phy, ts in reversed(accepted)
        if index_key_hash(k) == index_key_hash(key)
        and begin <= t_begin + (ts - t_begin) // 1000 * 1000 <= end
    ]
    return found[:max_num]


KEYS = st.sampled_from(["TopicTest#Aa", "TopicTest#BB", "k1", "k2", "k3", "polygenelubricants"])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    slots=st.integers(1, 5),
    num=st.integers(2, 12),
    steps=st.lists(st.tuples(KEYS, st.integers(0, 3000)), max_size=15),
    queries=st.lists(
        st.tuples(KEYS, st.integers(0, 20), st.integers(-2000, 40_000), st.integers(0, 40_000)),
        min_size=1,
        max_size=6,
    ),
)
def test_round_trip_against_a_dict_model(
    slots: int,
    num: int,
    steps: list[tuple[str, int]],
    queries: list[tuple[str, int, int, int]],
) -> None:
    tmp = Path(tempfile.mkdtemp())
    try:
        f = IndexFile.create(tmp / "f", slots, num)
        model: dict[str, list[tuple[int, int]]] = {}
        puts: list[Put] = []
        ts, phy = T0, 0
        for key, delta in steps:
            ts += delta
            phy += 100
            ok = f.put_key(key, phy, ts)
            assert ok == (len(puts) < num - 1)
            if ok:
                model.setdefault(key, []).append((phy, ts))
            puts.append((key, phy, ts))
        f.shutdown()
        f = IndexFile.open(tmp / "f", slots, num)
        try:
            assert f.index_count == 1 + sum(len(v) for v in model.values())
            for key, max_num, lo, span in queries:
                begin, end = T0 + lo, T0 + lo + span
                got = f.select_phy_offsets(key, max_num, begin, end)
                assert got == model_select(puts, key, max_num, begin, end, num)
                everything = f.select_phy_offsets(key, 100, 0, 2**62)
                colliding = [
                    p
                    for k, entries in model.items()
                    if index_key_hash(k) == index_key_hash(key)
                    for p, _ in entries
                ]
                assert sorted(everything) == sorted(colliding)
                assert everything == sorted(everything, reverse=True)
        finally:
            f.close()
    finally:
        shutil.rmtree(tmp)
