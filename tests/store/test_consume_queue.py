"""store.consume_queue: 20-byte units per queue offset, checked against a plain list."""

from __future__ import annotations

import shutil
import struct
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from basalt.store.config import CQ_STORE_UNIT_SIZE
from basalt.store.consume_queue import BLANK_UNIT, BLANK_UNIT_SIZE, UNIT, ConsumeQueue, CqEntry
from basalt.store.mapped_file import file_name

UNITS_PER_FILE = 8
CQ_FILE_SIZE = UNITS_PER_FILE * CQ_STORE_UNIT_SIZE
TOPIC = "TopicTest"
INT64 = st.integers(-(2**63), 2**63 - 1)

Unit = tuple[int, int, int]  # (physical offset, size, tagsCode)


def open_queue(root: Path, queue_id: int = 0) -> ConsumeQueue:
    cq = ConsumeQueue(TOPIC, queue_id, root, CQ_FILE_SIZE)
    cq.load()
    cq.recover()
    return cq


@pytest.fixture
def cq(tmp_path: Path) -> Iterator[ConsumeQueue]:
    q = ConsumeQueue(TOPIC, 0, tmp_path, CQ_FILE_SIZE)
    yield q
    q.close()


def entries_from(queue_offset: int, phy: int, count: int, size: int = 100) -> list[CqEntry]:
    """``count`` consecutive entries of ``size``-byte records laid end to end from ``phy``."""
    return [(queue_offset + i, phy + i * size, size, i) for i in range(count)]


# -- layout ------------------------------------------------------------------------------


def test_unit_layout_is_big_endian_long_int_long(cq: ConsumeQueue, tmp_path: Path) -> None:
    assert UNIT.format in (">qiq", ">" + "q" + "i" + "q")
    assert UNIT.size == CQ_STORE_UNIT_SIZE == 20
    assert cq.put_entries([(0, 0x0102030405060708, 0x11223344, -2)]) == 1
    on_disk = (tmp_path / TOPIC / "0" / file_name(0)).read_bytes()
    assert len(on_disk) == CQ_FILE_SIZE
    assert on_disk[:20] == (
        bytes.fromhex("0102030405060708") + bytes.fromhex("11223344") + b"\xff" * 7 + b"\xfe"
    )
    assert on_disk[:20] == struct.pack(">qiq", 0x0102030405060708, 0x11223344, -2)
    assert on_disk[20:] == bytes(CQ_FILE_SIZE - 20)


def test_queue_lives_in_topic_and_queue_id_folders(tmp_path: Path) -> None:
    q = ConsumeQueue("T%RETRY|x", 7, tmp_path, CQ_FILE_SIZE)
    try:
        q.put_entries(entries_from(0, 0, 9))
        assert sorted(p.name for p in (tmp_path / "T%RETRY|x" / "7").iterdir()) == [
            file_name(0),
            file_name(CQ_FILE_SIZE),
        ]
    finally:
        q.close()


def test_blank_unit_is_zero_max_int_zero() -> None:
    assert BLANK_UNIT_SIZE == 0x7FFFFFFF
    assert struct.pack(">qiq", 0, 0x7FFFFFFF, 0) == BLANK_UNIT


# -- writing -----------------------------------------------------------------------------


def test_empty_queue(cq: ConsumeQueue) -> None:
    assert (cq.min_offset_in_queue, cq.max_offset_in_queue, cq.max_physic_offset) == (0, 0, -1)
    assert cq.get_unit(0) is None
    assert cq.read_units(0, 10) == b""
    assert list(cq.iter_units()) == []
    assert cq.put_entries([]) == 0
    assert cq.truncate_dirty(0) == 0


def test_put_entries_then_read_back(cq: ConsumeQueue) -> None:
    entries = entries_from(0, 1000, 20)
    assert cq.put_entries(entries) == 20
    assert cq.max_offset_in_queue == 20
    assert cq.max_physic_offset == 1000 + 20 * 100
    assert cq.get_unit(13) == (1000 + 1300, 100, 13)
    assert list(cq.iter_units()) == entries
    assert list(cq.iter_units(18)) == entries[18:]


def test_re_putting_written_entries_is_a_no_op(cq: ConsumeQueue, tmp_path: Path) -> None:
    entries = entries_from(0, 0, 12)
    cq.put_entries(entries)
    before = [p.read_bytes() for p in sorted((tmp_path / TOPIC / "0").iterdir())]
    assert cq.put_entries(entries) == 0
    assert cq.put_entries(entries[3:7]) == 0
    for entry in entries:
        assert cq.put_entries([entry]) == 0
    assert [p.read_bytes() for p in sorted((tmp_path / TOPIC / "0").iterdir())] == before
    assert cq.max_offset_in_queue == 12


def test_a_batch_overlapping_the_end_writes_only_the_new_entries(cq: ConsumeQueue) -> None:
    entries = entries_from(0, 0, 10)
    cq.put_entries(entries[:6])
    assert cq.put_entries(entries[4:]) == 4
    assert [u[0] for u in cq.iter_units()] == list(range(10))
    assert cq.max_offset_in_queue == 10


def test_first_put_past_zero_fills_blank_units_before_it(cq: ConsumeQueue, tmp_path: Path) -> None:
    assert cq.put_entries([(13, 5000, 77, 3)]) == 1

    # The first file starts at the file boundary below queue offset 13 (8 units per file).
    directory = tmp_path / TOPIC / "0"
    assert sorted(p.name for p in directory.iterdir()) == [file_name(8 * 20)]
    data = (directory / file_name(8 * 20)).read_bytes()
    for unit in range(8, 13):
        pos = (unit - 8) * 20
        assert UNIT.unpack_from(data, pos) == (0, 0x7FFFFFFF, 0), unit
    assert UNIT.unpack_from(data, 5 * 20) == (5000, 77, 3)
    assert data[6 * 20 :] == bytes(2 * 20)

    assert cq.min_offset_in_queue == 13
    assert cq.max_offset_in_queue == 14
    assert cq.get_unit(12) is None
    assert cq.get_unit(13) == (5000, 77, 3)
    assert list(cq.iter_units()) == [(13, 5000, 77, 3)]
    assert cq.read_units(10, 10) == b""


def test_first_put_past_zero_survives_a_reload(tmp_path: Path) -> None:
    q = ConsumeQueue(TOPIC, 0, tmp_path, CQ_FILE_SIZE)
    q.put_entries(entries_from(13, 5000, 5))
    q.close()
    again = open_queue(tmp_path)
    try:
        assert (again.min_offset_in_queue, again.max_offset_in_queue) == (13, 18)
        assert again.max_physic_offset == 5000 + 5 * 100
        assert [u[0] for u in again.iter_units()] == [13, 14, 15, 16, 17]
    finally:
        again.close()


def test_read_units_never_crosses_a_file_end(cq: ConsumeQueue) -> None:
    entries = entries_from(0, 0, 20)
    cq.put_entries(entries)
    data = cq.read_units(5, 100)
    assert len(data) == 3 * 20  # units 5, 6, 7: the rest of the first file
    assert [UNIT.unpack_from(data, i * 20) for i in range(3)] == [e[1:] for e in entries[5:8]]
    assert len(cq.read_units(8, 100)) == 8 * 20
    assert len(cq.read_units(16, 100)) == 4 * 20
    assert len(cq.read_units(16, 2)) == 2 * 20
    assert cq.read_units(20, 100) == b""
    assert cq.read_units(-1, 100) == b""


# -- truncation, min offset, recovery -----------------------------------------------------


def test_truncate_dirty_drops_units_whose_record_ends_past_the_cut(cq: ConsumeQueue) -> None:
    cq.put_entries(entries_from(0, 0, 20))  # records [100 i, 100 i + 100)
    assert cq.truncate_dirty(1050) == 10  # record 10 ends at 1100 > 1050
    assert cq.max_offset_in_queue == 10
    assert cq.max_physic_offset == 1000
    assert cq.get_unit(10) is None
    assert cq.truncate_dirty(1000) == 0
    assert cq.truncate_dirty(999) == 1
    assert cq.max_offset_in_queue == 9


def test_truncate_dirty_after_emptying_the_last_file(cq: ConsumeQueue) -> None:
    # Units 0..7 fill the first file; unit 8 opens the second one.
    cq.put_entries(entries_from(0, 0, 9))
    assert cq.truncate_dirty(800) == 1  # drops unit 8: the second file is now empty
    assert cq.max_offset_in_queue == 8
    # A later, deeper truncation must still reach the units in the first file.
    assert cq.truncate_dirty(500) == 3
    assert cq.max_offset_in_queue == 5
    assert cq.max_physic_offset == 500


def test_truncate_dirty_after_reload_with_an_empty_last_file(tmp_path: Path) -> None:
    q = ConsumeQueue(TOPIC, 0, tmp_path, CQ_FILE_SIZE)
    q.put_entries(entries_from(0, 0, 8))
    q.files.get_last_mapped_file()  # the next file exists but holds no unit yet
    q.close()
    again = open_queue(tmp_path)
    try:
        assert again.max_offset_in_queue == 8
        assert again.truncate_dirty(500) == 3
        assert again.max_offset_in_queue == 5
    finally:
        again.close()


def test_correct_min_offset_skips_units_below_the_commitlog_min(cq: ConsumeQueue) -> None:
    cq.put_entries(entries_from(0, 0, 20))
    cq.correct_min_offset(1000)
    assert cq.min_offset_in_queue == 10
    assert cq.get_unit(9) is None
    assert cq.get_unit(10) == (1000, 100, 10)
    assert [u[0] for u in cq.iter_units()][:1] == [10]
    cq.correct_min_offset(1001)
    assert cq.min_offset_in_queue == 11
    cq.correct_min_offset(0)
    assert cq.min_offset_in_queue == 0
    cq.correct_min_offset(10**9)
    assert cq.min_offset_in_queue == cq.max_offset_in_queue == 20
    assert list(cq.iter_units()) == []


def test_recover_stops_at_the_first_all_zero_unit(tmp_path: Path) -> None:
    q = ConsumeQueue(TOPIC, 0, tmp_path, CQ_FILE_SIZE)
    q.put_entries(entries_from(0, 0, 11))
    q.close()
    # A crash left a unit zeroed in the middle of the second file: units after it are dropped.
    path = tmp_path / TOPIC / "0" / file_name(CQ_FILE_SIZE)
    data = bytearray(path.read_bytes())
    data[20:40] = bytes(20)
    path.write_bytes(bytes(data))
    again = open_queue(tmp_path)
    try:
        assert again.max_offset_in_queue == 9
        assert again.max_physic_offset == 900
        assert path.read_bytes()[20:] == bytes(CQ_FILE_SIZE - 20)
    finally:
        again.close()


def test_destroy_removes_the_queue_folders(tmp_path: Path) -> None:
    q = ConsumeQueue(TOPIC, 3, tmp_path, CQ_FILE_SIZE)
    q.put_entries(entries_from(0, 0, 10))
    q.destroy()
    assert not (tmp_path / TOPIC).exists()
    assert (q.max_offset_in_queue, q.max_physic_offset) == (0, -1)


# -- reference model ---------------------------------------------------------------------


class ConsumeQueueMachine(RuleBasedStateMachine):
    """A ConsumeQueue against a list of units, through puts, re-puts, truncations, reloads."""

    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="cq-model-"))
        self.cq = ConsumeQueue(TOPIC, 1, self.root, CQ_FILE_SIZE)
        self.first_offset = 0  # where the first put will start (chosen by choose_start)
        self.base: int | None = None  # queue offset of the first put; None before it
        self.units: list[Unit] = []  # units[i] is queue offset base + i
        self.next_phy = 0

    @initialize(base=st.integers(0, 3 * UNITS_PER_FILE), first_phy=st.integers(0, 10**6))
    def choose_start(self, base: int, first_phy: int) -> None:
        self.first_offset = base
        self.next_phy = first_phy

    @property
    def end_offset(self) -> int:
        return self.first_offset if self.base is None else self.base + len(self.units)

    # -- rules --------------------------------------------------------------------------

    @rule(
        records=st.lists(
            st.tuples(st.integers(0, 500), st.integers(1, 300), INT64), min_size=1, max_size=20
        ),
        overlap=st.integers(0, 5),
    )
    def put_batch(self, records: list[tuple[int, int, int]], overlap: int) -> None:
        start = self.end_offset
        overlap = min(overlap, len(self.units))
        old: list[CqEntry] = [
            (start - overlap + i, *self.units[len(self.units) - overlap + i])
            for i in range(overlap)
        ]
        new: list[CqEntry] = []
        for i, (gap, size, tags) in enumerate(records):
            phy = self.next_phy + gap
            new.append((start + i, phy, size, tags))
            self.next_phy = phy + size

        assert self.cq.put_entries(old + new) == len(new)

        if self.base is None:
            self.base = start
        self.units.extend((phy, size, tags) for _, phy, size, tags in new)

    @precondition(lambda self: self.units)
    @rule(data=st.data())
    def re_put_written_entries(self, data: st.DataObject) -> None:
        assert self.base is not None
        i = data.draw(st.integers(0, len(self.units) - 1))
        j = data.draw(st.integers(i + 1, len(self.units)))
        entries: list[CqEntry] = [(self.base + k, *self.units[k]) for k in range(i, j)]
        assert self.cq.put_entries(entries) == 0

    @rule(data=st.data())
    def truncate_dirty(self, data: st.DataObject) -> None:
        near_a_unit = bool(self.units) and data.draw(st.booleans())
        if near_a_unit:
            unit_phy, unit_size, _ = data.draw(st.sampled_from(self.units))
            cut = data.draw(st.integers(unit_phy, unit_phy + unit_size))
        else:
            cut = data.draw(st.integers(0, self.next_phy + 10))
        expected_dropped = sum(1 for phy, size, _ in self.units if phy + size > cut)

        assert self.cq.truncate_dirty(cut) == expected_dropped

        self.units = [u for u in self.units if u[0] + u[1] <= cut]
        self.next_phy = min(self.next_phy, cut)

    @rule()
    def reload(self) -> None:
        before = (self.cq.max_physic_offset, self.cq.max_offset_in_queue)
        self.cq.flush()
        self.cq.close()
        self.cq = open_queue(self.root, queue_id=1)
        assert (self.cq.max_physic_offset, self.cq.max_offset_in_queue) == before

    # -- invariants ---------------------------------------------------------------------

    @invariant()
    def offsets_agree(self) -> None:
        if self.base is None:
            assert (self.cq.min_offset_in_queue, self.cq.max_offset_in_queue) == (0, 0)
        else:
            assert self.cq.min_offset_in_queue == self.base
            assert self.cq.max_offset_in_queue == self.base + len(self.units)
        expected_max_phy = self.units[-1][0] + self.units[-1][1] if self.units else -1
        assert self.cq.max_physic_offset == expected_max_phy

    @invariant()
    def units_agree(self) -> None:
        base = self.first_offset if self.base is None else self.base
        for q in range(max(0, base - 2), base + len(self.units) + 2):
            expected = self.units[q - base] if 0 <= q - base < len(self.units) else None
            assert self.cq.get_unit(q) == expected, q
        assert list(self.cq.iter_units()) == [(base + i, *u) for i, u in enumerate(self.units)]

    @invariant()
    def raw_reads_agree(self) -> None:
        base = self.first_offset if self.base is None else self.base
        end = base + len(self.units)
        for q in range(base, end + 1):
            file_end = (q // UNITS_PER_FILE + 1) * UNITS_PER_FILE
            count = min(3, file_end - q, end - q)
            expected = b"".join(UNIT.pack(*u) for u in self.units[q - base : q - base + count])
            assert self.cq.read_units(q, 3) == expected, q

    def teardown(self) -> None:
        self.cq.close()
        shutil.rmtree(self.root, ignore_errors=True)


ConsumeQueueMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=30, deadline=None
)
test_consume_queue_matches_a_list_model = ConsumeQueueMachine.TestCase


def test_a_queue_offset_far_past_the_end_is_not_padded_to(tmp_path: Path) -> None:
    """A damaged QUEUEOFFSET (10**12) must not make the queue write blank units to it."""
    cq = ConsumeQueue("T", 0, tmp_path, 20 * 100)
    cq.load()
    cq.recover()
    assert cq.put_entries([(0, 0, 100, 0)]) == 1
    assert cq.put_entries([(10**12, 100, 100, 0)]) == 0
    assert cq.max_offset_in_queue == 1
    assert cq.put_entries([(3, 200, 100, 0)]) == 1  # a small hole is padded
    assert cq.max_offset_in_queue == 4
    assert cq.get_unit(1) == (0, BLANK_UNIT_SIZE, 0)
    assert len(list((tmp_path / "T" / "0").iterdir())) == 1
    cq.close()
