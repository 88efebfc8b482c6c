"""store.mapped_file: one fixed-size mapped data file named by its start offset."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from basalt.store.errors import CorruptFileError
from basalt.store.files import watch_file_creation
from basalt.store.mapped_file import FILE_NAME_DIGITS, MappedFile, file_name, parse_file_name

SIZE = 4096


@pytest.fixture
def mapped(tmp_path: Path) -> Iterator[MappedFile]:
    mf = MappedFile(tmp_path / file_name(SIZE), SIZE)
    yield mf
    mf.close()


def test_file_names_are_20_digit_zero_padded_offsets() -> None:
    assert FILE_NAME_DIGITS == 20
    assert file_name(0) == "00000000000000000000"
    assert file_name(1073741824) == "00000000001073741824"
    assert file_name(6_000_000) == "00000000000006000000"


def test_parse_file_name_accepts_only_20_digit_names(tmp_path: Path) -> None:
    assert parse_file_name(tmp_path / "00000000001073741824") == 1073741824
    assert parse_file_name(tmp_path / file_name(123 * SIZE)) == 123 * SIZE
    for name in ("0000000000107374182", "000000000010737418240", "0000000000107374182x", "abc"):
        assert parse_file_name(tmp_path / name) is None
    assert parse_file_name(tmp_path / "00000000000000000000.tmp") is None


def test_new_file_has_the_full_size_on_disk_and_reads_as_zeroes(
    tmp_path: Path, mapped: MappedFile
) -> None:
    path = tmp_path / "00000000000000004096"
    assert mapped.path == path
    assert path.stat().st_size == SIZE
    assert path.read_bytes() == bytes(SIZE)
    assert (mapped.file_from_offset, mapped.file_end_offset) == (SIZE, 2 * SIZE)
    assert (mapped.wrote_position, mapped.flushed_position, mapped.remaining) == (0, 0, SIZE)
    assert not mapped.is_full


def test_a_name_that_is_not_an_offset_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(CorruptFileError, match="20-digit"):
        MappedFile(tmp_path / "commitlog.dat", SIZE)
    assert not (tmp_path / "commitlog.dat").exists()


def test_a_start_offset_off_the_file_grid_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(CorruptFileError, match="multiple"):
        MappedFile(tmp_path / file_name(SIZE + 20), SIZE)


@pytest.mark.parametrize("actual", [1, SIZE - 1, SIZE + 1, 2 * SIZE])
@pytest.mark.parametrize("read_only", [False, True])
def test_an_existing_file_of_the_wrong_size_is_rejected(
    tmp_path: Path, actual: int, read_only: bool
) -> None:
    path = tmp_path / file_name(0)
    path.write_bytes(b"\x01" * actual)
    with pytest.raises(CorruptFileError, match="size") as excinfo:
        MappedFile(path, SIZE, read_only=read_only)
    assert excinfo.value.path == path
    # The file is left alone for someone to look at.
    assert path.read_bytes() == b"\x01" * actual


def test_append_advances_wrote_position_and_read_returns_the_bytes(mapped: MappedFile) -> None:
    mapped.append(b"hello")
    mapped.append(b" world")
    assert mapped.wrote_position == 11
    assert mapped.remaining == SIZE - 11
    assert mapped.flushed_position == 0
    assert mapped.read(0, 11) == b"hello world"
    assert mapped.read(6, 5) == b"world"
    assert mapped.buffer[0:5] == b"hello"


def test_flush_moves_flushed_position_to_wrote_position_and_bytes_are_on_disk(
    mapped: MappedFile,
) -> None:
    assert mapped.flush() == 0
    mapped.append(b"abc")
    assert mapped.flush() == 3
    assert mapped.flushed_position == 3
    with open(mapped.path, "rb") as f:
        assert f.read(4) == b"abc\x00"
    mapped.append(b"de")
    assert mapped.flushed_position == 3
    assert mapped.flush() == 5


def test_append_past_the_end_is_refused_and_changes_nothing(mapped: MappedFile) -> None:
    mapped.append(b"x" * (SIZE - 2))
    with pytest.raises(ValueError, match="past the end"):
        mapped.append(b"123")
    assert mapped.wrote_position == SIZE - 2
    assert mapped.read(SIZE - 2, 2) == b"\x00\x00"
    mapped.append(b"12")
    assert mapped.is_full
    assert mapped.remaining == 0


def test_write_at_overwrites_without_moving_positions(mapped: MappedFile) -> None:
    mapped.append(b"aaaaaa")
    mapped.write_at(2, b"BB")
    assert mapped.read(0, 6) == b"aaBBaa"
    assert (mapped.wrote_position, mapped.flushed_position) == (6, 0)


def test_bytes_appended_survive_reopening(tmp_path: Path) -> None:
    path = tmp_path / file_name(0)
    mf = MappedFile(path, SIZE)
    mf.append(b"persist me")
    mf.flush()
    mf.close()
    again = MappedFile(path, SIZE)
    try:
        assert again.read(0, 10) == b"persist me"
        assert again.wrote_position == 0  # positions are recovery's business
    finally:
        again.close()


def test_zero_tail_clears_everything_after_the_position(mapped: MappedFile) -> None:
    mapped.append(b"\x07" * 1000)
    cleared = mapped.zero_tail(400)
    assert cleared == 600
    data = mapped.path.read_bytes()
    assert data[:400] == b"\x07" * 400
    assert data[400:] == bytes(SIZE - 400)


def test_dirty_bytes_from_counts_up_to_the_last_written_byte_without_clearing(
    mapped: MappedFile,
) -> None:
    mapped.append(b"\x07" * 1000)
    assert mapped.dirty_bytes_from(0) == 1000
    assert mapped.dirty_bytes_from(250) == 750
    assert mapped.dirty_bytes_from(1000) == 0
    assert mapped.read(0, 1000) == b"\x07" * 1000


def test_zero_tail_clears_data_beyond_a_long_run_of_zero_bytes(tmp_path: Path) -> None:
    # A record whose body is 128 KiB of zeroes is ordinary data: the records after
    # it are still dirty and must be cleared, or a later recovery may revive them.
    size = 512 * 1024
    mf = MappedFile(tmp_path / file_name(0), size)
    try:
        mf.append(b"\x01" * 100 + bytes(128 * 1024) + b"\x02" * 100)
        end = mf.wrote_position
        cleared = mf.zero_tail(50)
        assert cleared == end - 50
        assert (tmp_path / file_name(0)).read_bytes()[50:] == bytes(size - 50)
    finally:
        mf.close()


def test_read_only_mapping_cannot_be_written(tmp_path: Path) -> None:
    path = tmp_path / file_name(0)
    writer = MappedFile(path, SIZE)
    writer.append(b"data")
    writer.close()

    ro = MappedFile(path, SIZE, read_only=True)
    try:
        assert ro.read(0, 4) == b"data"
        with pytest.raises(TypeError):
            ro.buffer[0:4] = b"XXXX"
        with pytest.raises(OSError):
            ro.append(b"XXXX")
        with pytest.raises(OSError):
            ro.write_at(0, b"XXXX")
    finally:
        ro.close()
    assert path.read_bytes()[:4] == b"data"


def test_read_only_does_not_create_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        MappedFile(tmp_path / file_name(0), SIZE, read_only=True)
    assert not (tmp_path / file_name(0)).exists()


def test_destroy_deletes_the_file_and_close_is_idempotent(tmp_path: Path) -> None:
    mf = MappedFile(tmp_path / file_name(0), SIZE)
    mf.close()
    mf.close()
    mf2 = MappedFile(tmp_path / file_name(0), SIZE)
    mf2.destroy()
    assert not (tmp_path / file_name(0)).exists()


# -- sparse files: reads stay in the data extents ----------------------------------------

BIG = 1024 * 1024


def test_a_sparse_file_reads_only_its_data_extents(tmp_path: Path) -> None:
    mf = MappedFile(tmp_path / file_name(0), BIG)
    try:
        mf.append(b"\x01" * 100)
        mf.write_at(BIG // 2, b"\x02" * 10)  # data after a hole
        assert mf.readable_end(0) >= 100  # the first extent (a block at least)
        assert mf.readable_end(0) < BIG // 2
        assert mf.readable_end(BIG // 4) == BIG // 4  # a hole: nothing to read
        assert mf.data_end() > BIG // 2 and mf.data_end() < BIG
        # The tail scan steps over the hole and still finds the later data...
        assert mf.dirty_bytes_from(100) == BIG // 2 + 10 - 100
        assert mf.zero_tail(100) == BIG // 2 + 10 - 100
        # ...and clears it by pwrite, leaving nothing behind.
        assert mf.dirty_bytes_from(100) == 0
        assert mf.read(0, 100) == b"\x01" * 100
    finally:
        mf.close()


def test_creating_a_data_file_tells_the_root_watcher_and_reopening_does_not(
    tmp_path: Path,
) -> None:
    created: list[Path] = []
    stop = watch_file_creation(tmp_path, created.append)
    try:
        MappedFile(tmp_path / file_name(0), SIZE).close()
        MappedFile(tmp_path / file_name(0), SIZE).close()
        assert [p.name for p in created] == [file_name(0)]
    finally:
        stop()
    MappedFile(tmp_path / file_name(SIZE), SIZE).close()
    assert len(created) == 1  # stopped: not told any more


@pytest.mark.parametrize("spelling", ["as given", "through a symlink", "relative"])
def test_a_created_file_reaches_its_roots_watcher_however_the_path_is_spelled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spelling: str
) -> None:
    """The watcher matches a path's text against its root as given and as resolved,
    and resolves only a path spelled another way: each store hears its own files
    and never another root's."""
    root, other = tmp_path / "root", tmp_path / "other"
    root.mkdir()
    other.mkdir()
    (tmp_path / "link").symlink_to(root)
    mine: list[Path] = []
    theirs: list[Path] = []
    stops = [watch_file_creation(root, mine.append), watch_file_creation(other, theirs.append)]
    try:
        if spelling == "through a symlink":
            where = tmp_path / "link"
        elif spelling == "relative":
            monkeypatch.chdir(tmp_path)
            where = Path("root")
        else:
            where = root
        MappedFile(where / file_name(0), SIZE).close()
        assert [p.name for p in mine] == [file_name(0)]
        assert theirs == []
    finally:
        for stop in stops:
            stop()
