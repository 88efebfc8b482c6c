"""An ordered run of MappedFiles forming one logical, append-only address space.

Offsets are global: file ``00000000001073741824`` holds offsets
[1073741824, 2147483648). Used by the CommitLog and by every ConsumeQueue.

Concurrency: one writer thread appends and rolls; readers look files up under
the GIL (``files`` is replaced, never mutated in place, so a reader iterating a
snapshot is safe); truncation happens while nothing reads (recovery); expiry
deletes files from the front while readers run, each file waiting for the
readers that hold it (:meth:`MappedFile.hold`).
"""

from __future__ import annotations

import bisect
import contextlib
import errno
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from basalt.store.errors import CorruptFileError
from basalt.store.files import fsync_dir, set_aside
from basalt.store.mapped_file import MappedFile, file_name, offset_in_name, parse_file_name

#: How far past the last valid byte a torn append may have left bytes when the
#: scan ended on empty space: appends are contiguous, so beyond one append's
#: pages nothing can have been written since the last truncation zeroed it.
#: Larger than the largest record (4 MiB body + properties). Any non-zero byte
#: inside the window means damage, and then the whole rest of the file is cleared.
TORN_WRITE_WINDOW_BYTES = 8 * 1024 * 1024


class FileFactory(Protocol):
    """Makes the file object for (path, file size, read_only): MappedFile by
    default; ConsumeQueues pass one making unmapped QueueFiles
    (store/queue_file.py). ``actual_size`` is the file's size on disk when the
    caller has just read it (a load), so the factory need not stat it again;
    None for a file that may not exist yet."""

    def __call__(
        self, path: Path, file_size: int, read_only: bool, /, *, actual_size: int | None = None
    ) -> MappedFile: ...


@dataclass(frozen=True, slots=True)
class FlushMarks:
    """A :class:`MappedFileQueue`'s unflushed state, taken before a filesystem sync."""

    #: The queue's end when taken: what the sync vouches for.
    target: int
    #: Each file with unflushed bytes and its written position when taken.
    files: list[tuple[MappedFile, int]]
    #: Whether a new file's name was waiting for its folder's fsync.
    dir_sync_pending: bool
    #: The last file when taken (a later one is not covered).
    last_file: MappedFile | None


class MappedFileQueue:
    """The files of one directory, all ``mapped_file_size`` bytes long."""

    def __init__(
        self,
        directory: Path,
        mapped_file_size: int,
        *,
        read_only: bool = False,
        repair_unit: int = 0,
        fill_gaps: bool = False,
        new_file: FileFactory | None = None,
        defer_dir_sync: bool = False,
        quarantine: tuple[Path, str] | None = None,
    ) -> None:
        self.directory = directory
        self.mapped_file_size = mapped_file_size
        self.read_only = read_only
        #: When > 0, the files hold derived data (ConsumeQueue units of this many
        #: bytes) that recovery rebuilds: :meth:`load` repairs what it would refuse.
        self.repair_unit = 0 if read_only else repair_unit
        #: In repair mode, a gap between files is filled with empty files (the
        #: CommitLog: recovery reads on past them) instead of the files after it
        #: being deleted (derived data, rebuilt from its source).
        self.fill_gaps = fill_gaps
        #: In repair mode, ``(quarantine folder, name prefix)``: a file *longer* than
        #: ``mapped_file_size`` is set aside there as ``<prefix><file name>`` and
        #: the files after it deleted (derived data: rebuilt from its source)
        #: instead of refused. Without it such a file is refused (the CommitLog:
        #: which of its bytes are valid cannot be told).
        self.quarantine = quarantine
        self._new_file = new_file
        #: Derived files (ConsumeQueues, rebuilt from the CommitLog) fsync the new
        #: name with their first flush, not at creation: their bytes are not
        #: durable before that flush anyway, and creation stays one open+ftruncate.
        self.defer_dir_sync = defer_dir_sync
        self._dir_sync_pending = False
        #: What :meth:`load` repaired, one sentence per file (repair mode only).
        self.repaired: list[str] = []
        #: Replaced, never mutated, so readers can iterate a snapshot without a lock.
        self.files: list[MappedFile] = []
        self.flushed_where = 0
        #: Serializes replacing ``files`` from two threads: the writer adding a file
        #: at the end, expiry removing one at the front.
        self._files_lock = threading.Lock()

    def load(self) -> None:
        """Map every data file of the directory; positions are set by recovery.

        Raises CorruptFileError for a file of the wrong size or a gap between files
        - except in repair mode (``repair_unit``), where a short file is cut to
        whole units and zero-padded to full size, a longer one set aside to
        :attr:`quarantine` (when given), and the files after a gap (or a file
        set aside) are deleted; each repair is listed in :attr:`repaired`, and
        the caller rebuilds what went from its source (the CommitLog).
        """
        try:
            # Names, not Paths, until one is known to be a data file: a store over
            # 40,000 queues lists 40,000 folders at start.
            names = os.listdir(self.directory)
        except (FileNotFoundError, NotADirectoryError):
            return
        directory = self.directory
        paths = [directory / name for name in sorted(names) if offset_in_name(name) is not None]
        if self.repair_unit:
            sizes = self._repair(paths)
            paths = list(sizes)
        else:
            sizes = {}
        files: list[MappedFile] = []
        try:
            for path in paths:
                mf = self._open_file(path, read_only=self.read_only, actual_size=sizes.get(path))
                files.append(mf)
                if len(files) > 1 and mf.file_from_offset != files[-2].file_end_offset:
                    raise CorruptFileError(path, f"gap after {files[-2].path.name}")
                # Until recovery says otherwise, a loaded file counts as full.
                mf.wrote_position = mf.flushed_position = self.mapped_file_size
        except BaseException:
            for mf in files:
                mf.close()
            raise
        self.files = files

    def _repair(self, paths: list[Path]) -> dict[Path, int]:
        """Repair mode: pad short files, delete the files after a gap; the paths
        kept, in order, with their sizes now."""
        kept: dict[Path, int] = {}
        expected: int | None = None
        for path in paths:
            start = parse_file_name(path)
            if expected is not None and start is not None and start != expected:
                if self.fill_gaps and start > expected:
                    for missing in range(expected, start, self.mapped_file_size):
                        empty = self.directory / file_name(missing)
                        empty.touch()  # MappedFile gives it its size, sparse
                        kept[empty] = 0
                        self.repaired.append(f"{empty.name} was missing: created empty")
                else:
                    # Files after a gap hold units at positions the queue cannot reach.
                    path.unlink()
                    self.repaired.append(f"{path.name} deleted: it follows a gap")
                    continue
            size = os.stat(path).st_size
            if size > self.mapped_file_size and self.quarantine is not None:
                folder, prefix = self.quarantine
                target = set_aside(path, folder, prefix + path.name)
                self.repaired.append(
                    f"{path.name} was {size} bytes, longer than {self.mapped_file_size}: "
                    f"set aside as {target}"
                )
                # The files after it follow a gap now: deleted, rebuilt from the source.
                expected = start
                continue
            if 0 < size < self.mapped_file_size:
                whole = size - size % self.repair_unit
                # A torn last unit is cut; the zeros after the rest read as "not written".
                os.truncate(path, whole)
                os.truncate(path, self.mapped_file_size)
                self.repaired.append(
                    f"{path.name} was {size} bytes: cut to {whole} and padded to "
                    f"{self.mapped_file_size}"
                )
                size = self.mapped_file_size
            kept[path] = size
            expected = None if start is None else start + self.mapped_file_size
        return kept

    # -- lookup -------------------------------------------------------------------------

    @property
    def first_file(self) -> MappedFile | None:
        return self.files[0] if self.files else None

    @property
    def last_file(self) -> MappedFile | None:
        return self.files[-1] if self.files else None

    @property
    def min_offset(self) -> int:
        """Start of the first file; 0 when empty (RocketMQ returns -1, callers clamp)."""
        files = self.files
        return files[0].file_from_offset if files else 0

    @property
    def max_offset(self) -> int:
        """One past the last written byte."""
        files = self.files
        return files[-1].file_from_offset + files[-1].wrote_position if files else 0

    def find_by_offset(self, offset: int) -> MappedFile | None:
        """The file holding ``offset``, or None when no file does."""
        files = self.files
        if not files:
            return None
        index = (offset - files[0].file_from_offset) // self.mapped_file_size
        if 0 <= index < len(files):
            mf = files[index]
            if mf.file_from_offset <= offset < mf.file_end_offset:
                return mf
        # Files may have been deleted from the front concurrently: fall back to search.
        starts = [f.file_from_offset for f in files]
        i = bisect.bisect_right(starts, offset) - 1
        if i >= 0 and offset < files[i].file_end_offset:
            return files[i]
        return None

    def next_file(self, mf: MappedFile) -> MappedFile | None:
        return self.find_by_offset(mf.file_end_offset)

    # -- growth -------------------------------------------------------------------------

    def get_last_mapped_file(self, start_offset: int = 0) -> MappedFile:
        """The file to append to, creating one when there is none or the last is full.

        With no files, the new file starts at ``start_offset`` rounded down to a
        file boundary (ConsumeQueues of queues whose first offset is not 0).
        """
        last = self.last_file
        if last is not None and not last.is_full:
            return last
        if last is None:
            create_at = start_offset - start_offset % self.mapped_file_size
        else:
            create_at = last.file_end_offset
        return self._create(create_at, first=last is None)

    def _create(self, offset: int, *, first: bool) -> MappedFile:
        if self.read_only:
            raise CorruptFileError(self.directory / file_name(offset), "read-only queue")
        self.directory.mkdir(parents=True, exist_ok=True)
        mf = self._open_file(self.directory / file_name(offset), read_only=False)
        # The new name must survive a power loss as surely as the bytes fsynced into it.
        if self.defer_dir_sync:
            self._dir_sync_pending = True
        else:
            fsync_dir(self.directory)
        mf.first_create_in_queue = first
        with self._files_lock:
            self.files = [*self.files, mf]
        return mf

    def _open_file(
        self, path: Path, *, read_only: bool, actual_size: int | None = None
    ) -> MappedFile:
        if self._new_file is not None:
            return self._new_file(path, self.mapped_file_size, read_only, actual_size=actual_size)
        return MappedFile(path, self.mapped_file_size, read_only=read_only)

    # -- durability ---------------------------------------------------------------------

    def flush(self) -> int:
        """fsync every file with unflushed bytes (but one being deleted); returns the
        new ``flushed_where``.

        The end is read before the fsyncs: bytes appended while they run are not
        vouched for until the next flush.
        """
        target = self.max_offset
        for mf in self.files:
            if mf.flushed_position < mf.wrote_position:
                try:
                    mf.flush()
                except OSError as e:
                    # Expiry deleted the file (closing its fd) after the snapshot was
                    # taken: a file on its way out needs no flush. Not holding it
                    # here keeps the flush from delaying the deletion.
                    if not (e.errno == errno.EBADF and mf.closed):
                        raise
        if self._dir_sync_pending:
            fsync_dir(self.directory)
            # A new queue's folder is new in its topic's folder too.
            fsync_dir(self.directory.parent)
            self._dir_sync_pending = False
        self.flushed_where = max(self.flushed_where, target)
        return self.flushed_where

    def unflushed_bytes(self) -> int:
        return self.max_offset - self.flushed_where

    def flush_marks(self) -> FlushMarks | None:
        """What a flush now would vouch for, for a filesystem-wide sync to cover
        (:meth:`mark_synced`); None when nothing is unflushed. Read before the sync,
        as :meth:`flush` reads its end before the fsyncs."""
        target = self.max_offset
        files = [
            (mf, mf.wrote_position) for mf in self.files if mf.flushed_position < mf.wrote_position
        ]
        if not files and not self._dir_sync_pending and target <= self.flushed_where:
            return None
        last = self.files[-1] if self.files else None
        return FlushMarks(target, files, self._dir_sync_pending, last)

    def mark_synced(self, marks: FlushMarks) -> None:
        """Record that a ``syncfs`` issued after ``marks`` were taken made them durable
        (data, and the folder entries a pending dir sync was for)."""
        for mf, position in marks.files:
            mf.flushed_position = max(mf.flushed_position, position)
        # A file created after the marks (appended at the end) still needs its name
        # synced: only a pending sync for the files the marks saw is done.
        last = self.files[-1] if self.files else None
        if marks.dir_sync_pending and last is marks.last_file:
            self._dir_sync_pending = False
        self.flushed_where = max(self.flushed_where, marks.target)

    # -- shrinking ----------------------------------------------------------------------

    def set_written_to(self, offset: int) -> None:
        """Declare everything below ``offset`` written and flushed, nothing above it."""
        for mf in self.files:
            pos = min(max(offset - mf.file_from_offset, 0), self.mapped_file_size)
            mf.wrote_position = mf.flushed_position = pos
        self.flushed_where = offset

    def truncate_dirty_files(self, offset: int, *, dirty_end: int | None = None) -> int:
        """Drop everything at and above ``offset``; returns the dirty bytes removed.

        The file holding ``offset`` keeps its prefix and has its tail zeroed;
        files wholly above it are deleted. ``dirty_end`` bounds where non-zero
        bytes can be (the caller knows nothing was written past it), so a
        mostly unwritten 1 GiB file is not read end to end; None examines
        every byte.
        """
        removed = 0
        keep: list[MappedFile] = []
        for mf in self.files:
            limit = None if dirty_end is None else dirty_end - mf.file_from_offset
            if mf.file_end_offset <= offset:
                keep.append(mf)
            elif mf.file_from_offset <= offset:
                pos = offset - mf.file_from_offset
                cleared = mf.zero_tail(pos, limit)
                if cleared and limit is not None:
                    # Bytes where nothing should be: the "empty" end was damage, and
                    # anything may lie further on. Clear the whole rest of the file.
                    cleared = max(cleared, mf.zero_tail(pos + cleared))
                removed += cleared
                mf.wrote_position = mf.flushed_position = pos
                keep.append(mf)
            else:
                removed += mf.dirty_bytes_from(0, limit) if limit is None or limit > 0 else 0
                mf.destroy()
        self.files = keep
        self.set_written_to(offset)
        return removed

    def delete_first_files_below(self, offset: int) -> int:
        """Delete files that end at or below ``offset``; returns how many."""
        doomed = [mf for mf in self.files if mf.file_end_offset <= offset]
        if not doomed:
            return 0
        self.files = self.files[len(doomed) :]
        for mf in doomed:
            mf.destroy()
        return len(doomed)

    def delete_expired_file(
        self,
        is_expired: Callable[[MappedFile], bool],
        now_ms: int,
        forcibly_after_ms: int,
    ) -> MappedFile | None:
        """Delete the oldest file if ``is_expired`` says so; never the last file.

        Returns the deleted file, or None: nothing expired, or the oldest file
        is still held by a reader (it is retried on a later call and deleted
        anyway ``forcibly_after_ms`` after the first try; see
        :meth:`MappedFile.try_destroy`). Files go strictly from the front, so
        the queue never has a hole.
        """
        files = self.files
        if len(files) < 2 or not is_expired(files[0]):
            return None
        oldest = files[0]
        if not oldest.try_destroy(now_ms, forcibly_after_ms):
            return None
        with self._files_lock:
            self.files = [mf for mf in self.files if mf is not oldest]
        return oldest

    def close(self) -> None:
        for mf in self.files:
            mf.close()

    def destroy(self) -> None:
        """Delete every file (and the directory if it ends up empty)."""
        for mf in self.files:
            mf.destroy()
        self.files = []
        self.flushed_where = 0
        with contextlib.suppress(OSError):
            self.directory.rmdir()
