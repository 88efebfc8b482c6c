"""ConsumeQueueTable.flush: an fdatasync per queue when few are dirty, one syncfs
when many are, with the same bookkeeping (every written unit vouched for)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from basalt.store import consume_queue_table as table_module
from basalt.store.config import CQ_STORE_UNIT_SIZE
from basalt.store.consume_queue import UNIT
from basalt.store.consume_queue_table import SYNCFS_MIN_DIRTY_QUEUES, ConsumeQueueTable
from basalt.store.files import syncfs

FILE_BYTES = 1000 * CQ_STORE_UNIT_SIZE


def fill(table: ConsumeQueueTable, queues: int, first_offset: int = 0) -> None:
    """One unit at ``first_offset`` in each of ``queues`` queues (after its last)."""
    for q in range(queues):
        cq = table.find_or_create(f"T{q}", 0)
        phy = (first_offset * queues + q + 1) * 100
        cq.put_units(first_offset, 1, UNIT.pack(phy, 100, 0))


def unflushed(table: ConsumeQueueTable) -> int:
    return sum(cq.files.unflushed_bytes() for cq in table)


def counting(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    calls = {"syncfs": 0, "fdatasync": 0}
    real_fdatasync = os.fdatasync

    def fake_syncfs(path: Path) -> None:
        calls["syncfs"] += 1
        syncfs(path)

    def fake_fdatasync(fd: int) -> None:
        calls["fdatasync"] += 1
        real_fdatasync(fd)

    monkeypatch.setattr(table_module, "syncfs", fake_syncfs)
    monkeypatch.setattr(os, "fdatasync", fake_fdatasync)
    return calls


def test_many_dirty_queues_are_flushed_by_one_syncfs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = ConsumeQueueTable(tmp_path / "consumequeue", FILE_BYTES)
    queues = SYNCFS_MIN_DIRTY_QUEUES * 2
    fill(table, queues)
    assert unflushed(table) == queues * CQ_STORE_UNIT_SIZE
    calls = counting(monkeypatch)
    table.flush()
    assert calls == {"syncfs": 1, "fdatasync": 0}
    assert unflushed(table) == 0
    for cq in table:
        assert all(mf.flushed_position == mf.wrote_position for mf in cq.files.files)
    # Nothing dirty: the next flush syncs nothing at all.
    table.flush()
    assert calls == {"syncfs": 1, "fdatasync": 0}
    table.close()


def test_few_dirty_queues_among_many_are_flushed_one_by_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = ConsumeQueueTable(tmp_path / "consumequeue", FILE_BYTES)
    fill(table, SYNCFS_MIN_DIRTY_QUEUES * 2)
    table.flush()
    calls = counting(monkeypatch)
    for q in range(3):  # three queues get one more unit
        cq = table.find_or_create(f"T{q}", 0)
        cq.put_units(1, 1, UNIT.pack(10**9 + q * 100, 100, 0))
    table.flush()
    assert calls == {"syncfs": 0, "fdatasync": 3}
    assert unflushed(table) == 0
    table.close()


def test_a_file_created_after_the_marks_keeps_its_folder_sync_pending(tmp_path: Path) -> None:
    table = ConsumeQueueTable(tmp_path / "consumequeue", FILE_BYTES)
    fill(table, 1)
    cq = table.find_or_create("T0", 0)
    marks = cq.files.flush_marks()
    assert marks is not None and marks.dir_sync_pending
    # The queue rolls into a second file between the marks and the sync.
    units_per_file = FILE_BYTES // CQ_STORE_UNIT_SIZE
    run = b"".join(UNIT.pack(1000 + i * 100, 100, 0) for i in range(1, units_per_file + 1))
    cq.put_units(1, units_per_file, run)
    assert len(cq.files.files) == 2
    syncfs(table.directory)
    cq.files.mark_synced(marks)
    assert cq.files._dir_sync_pending  # the second file's name is not yet vouched for
    assert cq.files.flushed_where == marks.target < cq.files.max_offset
    cq.flush()
    assert not cq.files._dir_sync_pending and cq.files.unflushed_bytes() == 0
    table.close()
