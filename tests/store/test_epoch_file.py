"""EpochFile: RocketMQ's EpochFileCacheTest cases, reload, truncation, damage."""

from __future__ import annotations

from pathlib import Path

import pytest

from basalt.store.epoch_file import (
    EpochEntry,
    EpochFile,
    EpochOrderError,
    check_epoch_file,
)
from basalt.store.errors import CorruptFileError


@pytest.fixture
def cache(tmp_path: Path) -> EpochFile:
    f = EpochFile(tmp_path / "epochFileCheckpoint")
    f.append(1, 100)
    f.append(2, 300)
    f.append(3, 500)
    return f


def test_entries_end_where_the_next_starts(cache: EpochFile) -> None:
    assert cache.entries() == [EpochEntry(1, 100, 300), EpochEntry(2, 300, 500), EpochEntry(3, 500)]
    assert cache.last_epoch() == 3
    assert cache.last_entry() == EpochEntry(3, 500, -1)
    assert cache.find_entry_by_offset(350) == EpochEntry(2, 300, 500)
    assert cache.find_entry_by_offset(50) is None


def test_reload_after_append(cache: EpochFile, tmp_path: Path) -> None:
    again = EpochFile(tmp_path / "epochFileCheckpoint")
    assert again.entries() == cache.entries()
    assert not (tmp_path / "epochFileCheckpoint.tmp").exists()


def test_empty(tmp_path: Path) -> None:
    f = EpochFile(tmp_path / "epochFileCheckpoint")
    assert f.entries() == [] and f.last_epoch() == 0 and f.last_entry() is None
    assert f.find_consistent_point([EpochEntry(1, 0)], 10, 10) == -1


def test_truncate(cache: EpochFile, tmp_path: Path) -> None:
    cache.truncate_from(150)
    assert cache.entries() == [EpochEntry(1, 100)]
    assert EpochFile(tmp_path / "epochFileCheckpoint").entries() == [EpochEntry(1, 100)]
    cache.truncate_from(100)
    assert cache.entries() == []


def test_append_refuses_going_backwards(cache: EpochFile) -> None:
    cache.append(3, 500)  # the same epoch again: a no-op
    cache.append(3, 900)
    assert cache.entries()[-1] == EpochEntry(3, 500)
    with pytest.raises(EpochOrderError):
        cache.append(2, 900)
    with pytest.raises(EpochOrderError):
        cache.append(4, 400)
    cache.append(4, 500)  # an empty term is allowed: same start
    assert cache.last_epoch() == 4


def test_consistent_point_slave_behind_in_last_epoch(cache: EpochFile, tmp_path: Path) -> None:
    # mine: 1@100 2@300 3@500; master: 1@100 2@300 3@450 -> 450
    master = EpochFile(tmp_path / "m")
    for e, s in ((1, 100), (2, 300), (3, 450)):
        master.append(e, s)
    # Epoch 3 starts differ, so epoch 2 is the newest in common: its ends are 500 and 450.
    assert cache.find_consistent_point(master.entries(), 600, 700) == 450


def test_consistent_point_same_epochs(cache: EpochFile, tmp_path: Path) -> None:
    # mine: ...3@500 (to 700); master: ...3@500 (to 600) -> 600
    master = EpochFile(tmp_path / "m")
    for e, s in ((1, 100), (2, 300), (3, 500)):
        master.append(e, s)
    assert cache.find_consistent_point(master.entries(), 700, 600) == 600
    assert cache.find_consistent_point(master.entries(), 550, 600) == 550


def test_consistent_point_no_common_epoch(cache: EpochFile, tmp_path: Path) -> None:
    master = EpochFile(tmp_path / "m")
    master.append(1, 200)
    master.append(2, 500)
    assert cache.find_consistent_point(master.entries(), 700, 700) == -1


def test_consistent_point_master_ahead_by_an_epoch(tmp_path: Path) -> None:
    # mine: 1@100 2@300 3@500 4@800; master: ...3@500 (to 700) -> 700 (RocketMQ's sample 4)
    mine = EpochFile(tmp_path / "s")
    for e, s in ((1, 100), (2, 300), (3, 500), (4, 800)):
        mine.append(e, s)
    master = [EpochEntry(1, 100, 300), EpochEntry(2, 300, 500), EpochEntry(3, 500, -1)]
    assert mine.find_consistent_point(master, 900, 700) == 700


def test_consistent_point_diverged(tmp_path: Path) -> None:
    # A deposed master wrote epoch 3 from 500; the new master's epoch 3 is not there,
    # its epoch 4 started at 450: the common epoch 2 ends at 450 on the master.
    mine = EpochFile(tmp_path / "s")
    for e, s in ((1, 0), (2, 300), (3, 500)):
        mine.append(e, s)
    master = [EpochEntry(1, 0, 300), EpochEntry(2, 300, 450), EpochEntry(4, 450, -1)]
    assert mine.find_consistent_point(master, 800, 1000) == 450


@pytest.mark.parametrize(
    "damage",
    [
        lambda b: b[:-1],
        lambda b: b[:10],
        lambda b: b[:14] + bytes([b[14] ^ 1]) + b[15:],
        lambda b: b"XXXX" + b[4:],
    ],
)
def test_damaged_file_is_an_error_naming_the_path(cache: EpochFile, damage: object) -> None:
    path = cache.path
    path.write_bytes(damage(path.read_bytes()))  # type: ignore[operator]
    with pytest.raises(CorruptFileError) as info:
        EpochFile(path)
    assert str(path) in str(info.value)
    assert check_epoch_file(path) is not None


def test_check_of_a_good_or_absent_file(cache: EpochFile, tmp_path: Path) -> None:
    assert check_epoch_file(cache.path) is None
    assert check_epoch_file(tmp_path / "absent") is None
