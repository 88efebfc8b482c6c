"""store.mapped_file_queue: an ordered run of MappedFiles as one address space."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from basalt.store.errors import CorruptFileError
from basalt.store.mapped_file import MappedFile, file_name
from basalt.store.mapped_file_queue import MappedFileQueue

SIZE = 4096


@pytest.fixture
def queue(tmp_path: Path) -> Iterator[MappedFileQueue]:
    q = MappedFileQueue(tmp_path / "q", SIZE)
    yield q
    q.close()


def fill(q: MappedFileQueue, total: int, byte: int = 0xAB) -> None:
    """Append ``total`` bytes of ``byte``, rolling to new files as each fills up."""
    while total:
        mf = q.get_last_mapped_file()
        n = min(total, mf.remaining)
        mf.append(bytes([byte]) * n)
        total -= n


def names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_empty_queue_has_no_files_and_zero_offsets(queue: MappedFileQueue) -> None:
    assert queue.files == []
    assert (queue.first_file, queue.last_file) == (None, None)
    assert (queue.min_offset, queue.max_offset) == (0, 0)
    assert queue.find_by_offset(0) is None
    assert not queue.directory.exists()


def test_get_last_mapped_file_creates_the_first_file_at_zero(queue: MappedFileQueue) -> None:
    mf = queue.get_last_mapped_file()
    assert mf.path.name == "00000000000000000000"
    assert mf.first_create_in_queue
    assert queue.get_last_mapped_file() is mf  # not full: no new file


def test_get_last_mapped_file_rounds_a_start_offset_down_to_a_file_boundary(
    queue: MappedFileQueue,
) -> None:
    mf = queue.get_last_mapped_file(3 * SIZE + 100)
    assert mf.file_from_offset == 3 * SIZE
    assert mf.path.name == file_name(3 * SIZE) == "00000000000000012288"
    assert (queue.min_offset, queue.max_offset) == (3 * SIZE, 3 * SIZE)


def test_get_last_mapped_file_rolls_when_the_last_file_is_full(queue: MappedFileQueue) -> None:
    first = queue.get_last_mapped_file()
    first.append(b"x" * SIZE)
    second = queue.get_last_mapped_file()
    assert second is not first
    assert second.file_from_offset == SIZE
    assert not second.first_create_in_queue
    assert names(queue.directory) == [file_name(0), file_name(SIZE)]
    assert queue.next_file(first) is second
    assert queue.next_file(second) is None


def test_max_offset_follows_appends_across_files(queue: MappedFileQueue) -> None:
    fill(queue, 2 * SIZE + 123)
    assert len(queue.files) == 3
    assert queue.min_offset == 0
    assert queue.max_offset == 2 * SIZE + 123
    assert [mf.file_from_offset for mf in queue.files] == [0, SIZE, 2 * SIZE]


def test_find_by_offset_across_files(queue: MappedFileQueue) -> None:
    fill(queue, 3 * SIZE)
    for offset, index in ((0, 0), (SIZE - 1, 0), (SIZE, 1), (2 * SIZE + 5, 2), (3 * SIZE - 1, 2)):
        assert queue.find_by_offset(offset) is queue.files[index], offset
    assert queue.find_by_offset(3 * SIZE) is None
    assert queue.find_by_offset(-1) is None


def test_find_by_offset_after_deleting_first_files(queue: MappedFileQueue) -> None:
    fill(queue, 4 * SIZE)
    assert queue.delete_first_files_below(2 * SIZE) == 2
    assert queue.find_by_offset(SIZE) is None
    assert queue.find_by_offset(0) is None
    found = queue.find_by_offset(2 * SIZE + 7)
    assert found is not None and found.file_from_offset == 2 * SIZE
    found = queue.find_by_offset(3 * SIZE + 7)
    assert found is not None and found.file_from_offset == 3 * SIZE


def test_flush_makes_every_file_flushed(queue: MappedFileQueue) -> None:
    fill(queue, SIZE + 10)
    assert queue.unflushed_bytes() == SIZE + 10
    assert queue.flush() == SIZE + 10
    assert queue.flushed_where == SIZE + 10
    assert queue.unflushed_bytes() == 0
    assert [mf.flushed_position for mf in queue.files] == [SIZE, 10]


def test_flush_steps_over_a_file_expiry_deleted_under_it(queue: MappedFileQueue) -> None:
    """The flush thread walks a snapshot of the files; expiry may delete one (closing
    its fd) meanwhile. That file needs no flush, and the failure channel must not hear
    of an EBADF (it stopped a store's sends under disk pressure)."""
    fill(queue, SIZE + 10)
    first, second = queue.files
    first.destroy()  # as expiry does, before the snapshot drops it
    queue.flush()
    assert second.flushed_position == 10


def test_truncate_dirty_files_keeps_the_prefix_zeroes_the_tail_and_deletes_later_files(
    queue: MappedFileQueue,
) -> None:
    fill(queue, 3 * SIZE)
    cut = SIZE + 1000

    removed = queue.truncate_dirty_files(cut)

    assert removed == 3 * SIZE - cut
    assert names(queue.directory) == [file_name(0), file_name(SIZE)]
    assert queue.max_offset == cut
    assert queue.flushed_where == cut
    assert [mf.wrote_position for mf in queue.files] == [SIZE, 1000]
    assert (queue.directory / file_name(0)).read_bytes() == b"\xab" * SIZE
    second = (queue.directory / file_name(SIZE)).read_bytes()
    assert second[:1000] == b"\xab" * 1000
    assert second[1000:] == bytes(SIZE - 1000)


def test_truncate_dirty_files_at_a_file_boundary_keeps_an_empty_file(
    queue: MappedFileQueue,
) -> None:
    # Like RocketMQ's truncateDirtyFiles: the file starting at the offset stays, empty.
    fill(queue, 2 * SIZE + 50)
    removed = queue.truncate_dirty_files(SIZE)
    assert removed == SIZE + 50
    assert [mf.file_from_offset for mf in queue.files] == [0, SIZE]
    assert [mf.wrote_position for mf in queue.files] == [SIZE, 0]
    assert (queue.directory / file_name(SIZE)).read_bytes() == bytes(SIZE)
    assert not (queue.directory / file_name(2 * SIZE)).exists()
    assert queue.max_offset == SIZE


def test_truncate_dirty_files_counts_only_bytes_that_were_written(
    queue: MappedFileQueue,
) -> None:
    fill(queue, SIZE + 300)
    assert queue.truncate_dirty_files(100) == SIZE + 300 - 100
    assert queue.max_offset == 100


def test_truncate_dirty_files_past_the_end_drops_nothing(queue: MappedFileQueue) -> None:
    fill(queue, 1000)
    assert queue.truncate_dirty_files(1000) == 0
    assert queue.max_offset == 1000
    assert queue.files[0].read(0, 1000) == b"\xab" * 1000


def test_truncated_queue_appends_from_the_cut(queue: MappedFileQueue) -> None:
    fill(queue, 2 * SIZE)
    queue.truncate_dirty_files(SIZE - 10)
    fill(queue, 20, byte=0xCD)
    assert queue.max_offset == SIZE + 10
    assert queue.files[0].read(SIZE - 12, 12) == b"\xab\xab" + b"\xcd" * 10
    assert queue.files[1].read(0, 12) == b"\xcd" * 10 + b"\x00\x00"


def test_truncate_dirty_files_zeroes_data_beyond_a_long_zero_run(tmp_path: Path) -> None:
    # Bytes past the cut must all be zero afterwards, even when the dirty region
    # contains a long run of zeroes (a record with a zero-filled body).
    size = 512 * 1024
    q = MappedFileQueue(tmp_path / "q", size)
    try:
        mf = q.get_last_mapped_file()
        mf.append(b"\x01" * 100 + bytes(200 * 1024) + b"\x02" * 100)
        end = mf.wrote_position
        removed = q.truncate_dirty_files(50)
        assert (tmp_path / "q" / file_name(0)).read_bytes()[50:] == bytes(size - 50)
        assert removed == end - 50
    finally:
        q.close()


def test_delete_first_files_below_deletes_only_files_wholly_below(
    queue: MappedFileQueue,
) -> None:
    fill(queue, 3 * SIZE + 1)
    assert queue.delete_first_files_below(SIZE - 1) == 0
    assert queue.delete_first_files_below(SIZE + 10) == 1
    assert names(queue.directory) == [file_name(SIZE), file_name(2 * SIZE), file_name(3 * SIZE)]
    assert queue.min_offset == SIZE
    assert queue.delete_first_files_below(3 * SIZE) == 2
    assert names(queue.directory) == [file_name(3 * SIZE)]
    assert (queue.min_offset, queue.max_offset) == (3 * SIZE, 3 * SIZE + 1)


def test_load_maps_every_data_file_as_full_and_ignores_other_names(tmp_path: Path) -> None:
    q = MappedFileQueue(tmp_path / "q", SIZE)
    fill(q, 2 * SIZE + 10)
    q.close()
    (tmp_path / "q" / "notes.txt").write_text("not a data file")
    (tmp_path / "q" / (file_name(0) + ".tmp")).write_bytes(b"x")

    loaded = MappedFileQueue(tmp_path / "q", SIZE)
    loaded.load()
    try:
        assert [mf.file_from_offset for mf in loaded.files] == [0, SIZE, 2 * SIZE]
        assert all(mf.wrote_position == SIZE for mf in loaded.files)
        assert loaded.max_offset == 3 * SIZE
        loaded.set_written_to(2 * SIZE + 10)
        assert loaded.max_offset == 2 * SIZE + 10
        assert [mf.wrote_position for mf in loaded.files] == [SIZE, SIZE, 10]
        assert loaded.files[2].read(0, 10) == b"\xab" * 10
    finally:
        loaded.close()


def test_load_of_a_missing_directory_is_an_empty_queue(tmp_path: Path) -> None:
    q = MappedFileQueue(tmp_path / "nowhere", SIZE)
    q.load()
    assert q.files == []
    assert not (tmp_path / "nowhere").exists()


def test_load_detects_a_gap_between_files(tmp_path: Path) -> None:
    directory = tmp_path / "q"
    directory.mkdir()
    for offset in (0, SIZE, 3 * SIZE):
        (directory / file_name(offset)).write_bytes(bytes(SIZE))
    q = MappedFileQueue(directory, SIZE)
    with pytest.raises(CorruptFileError, match="gap") as excinfo:
        q.load()
    assert excinfo.value.path == directory / file_name(3 * SIZE)
    assert q.files == []


def test_load_detects_a_file_of_the_wrong_size(tmp_path: Path) -> None:
    directory = tmp_path / "q"
    directory.mkdir()
    (directory / file_name(0)).write_bytes(bytes(SIZE))
    (directory / file_name(SIZE)).write_bytes(bytes(SIZE // 2))
    q = MappedFileQueue(directory, SIZE)
    with pytest.raises(CorruptFileError, match="size"):
        q.load()
    assert q.files == []
    assert (directory / file_name(SIZE)).stat().st_size == SIZE // 2


def test_read_only_queue_maps_files_but_cannot_create_or_write(tmp_path: Path) -> None:
    q = MappedFileQueue(tmp_path / "q", SIZE)
    fill(q, SIZE)
    q.close()

    ro = MappedFileQueue(tmp_path / "q", SIZE, read_only=True)
    ro.load()
    try:
        assert ro.files[0].read(0, 3) == b"\xab\xab\xab"
        with pytest.raises(CorruptFileError, match="read-only"):
            ro.get_last_mapped_file()  # the only file is full: would need a new one
        with pytest.raises(TypeError):
            ro.files[0].buffer[0:1] = b"\x00"
        assert names(tmp_path / "q") == [file_name(0)]
    finally:
        ro.close()


def test_destroy_removes_every_file_and_the_directory(queue: MappedFileQueue) -> None:
    fill(queue, 2 * SIZE + 1)
    queue.destroy()
    assert queue.files == []
    assert not queue.directory.exists()
    assert queue.max_offset == 0


def test_files_are_mapped_files_of_the_queue_size(queue: MappedFileQueue) -> None:
    fill(queue, SIZE + 1)
    assert all(isinstance(mf, MappedFile) and mf.file_size == SIZE for mf in queue.files)
    assert all(mf.path.stat().st_size == SIZE for mf in queue.files)
