"""One fixed-size, memory-mapped data file, named by its 20-digit start offset.

A MappedFile knows three positions, all relative to its start:
``wrote_position`` (bytes appended), ``flushed_position`` (bytes known to be
on disk) and ``file_size``. Appends are ``pwrite`` into the page cache that
the mapping reads from; flush is ``fdatasync`` on the file descriptor, which
Linux applies to pages dirtied through a shared mapping too, and which
releases the GIL.

Concurrency: one writer thread appends; any thread may read bytes below
``wrote_position``; flush may run on another thread.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import threading
from pathlib import Path

from basalt.store.errors import CorruptFileError
from basalt.store.files import file_created

FILE_NAME_DIGITS = 20
_ZERO_CHUNK = bytes(64 * 1024)


def pwrite_all(fd: int, data: bytes | bytearray | memoryview, pos: int) -> None:
    """Write all of ``data`` at ``pos``; a short write is retried, no progress raises
    ENOSPC. Positions move only after this returns, so a failed write is never counted.
    """
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, pos)
        if written <= 0:
            raise OSError(errno.ENOSPC, "short write: no space left on device")
        view = view[written:]
        pos += written


def fd_data_extents(fd: int, start: int, stop: int) -> list[tuple[int, int]]:
    """The ``[from, to)`` runs of ``[start, stop)`` of the file open as ``fd`` that may
    hold data (not holes), in order.

    Found with ``SEEK_DATA``/``SEEK_HOLE``, so a sparse file's unwritten
    megabytes are never read. A file system without them (EINVAL) reports the
    whole range as data, which is only slower.
    """
    extents: list[tuple[int, int]] = []
    pos = start
    while pos < stop:
        try:
            begin = os.lseek(fd, pos, os.SEEK_DATA)
        except OSError as e:
            if e.errno == errno.ENXIO:  # nothing but holes from pos on
                break
            if e.errno == errno.EINVAL:
                return [(pos, stop)]
            raise
        if begin >= stop:
            break
        end = min(os.lseek(fd, begin, os.SEEK_HOLE), stop)
        extents.append((begin, end))
        pos = end
    return extents


def data_extents(mf: MappedFile, start: int, end: int) -> list[tuple[int, int]]:
    """The parts of ``[start, end)`` of ``mf`` that hold data (:func:`fd_data_extents`).

    Holes of a sparse file read as zeros and hold no record. Only these parts
    may be read through the mapping: on tmpfs a read fault on a hole allocates a
    page, which is a SIGBUS when the file system is full.
    """
    return fd_data_extents(mf.fd, start, end)


def file_name(offset: int) -> str:
    """The file name for a file starting at ``offset``: 20 digits, zero-padded."""
    return f"{offset:0{FILE_NAME_DIGITS}d}"


def parse_file_name(path: Path) -> int | None:
    """The start offset a data file's name encodes, or None if it is not a data file."""
    return offset_in_name(path.name)


def offset_in_name(name: str) -> int | None:
    """:func:`parse_file_name` of a bare file name."""
    if len(name) == FILE_NAME_DIGITS and name.isdigit():
        return int(name)
    return None


def wrong_size(path: Path, actual: int, file_size: int) -> CorruptFileError:
    """The refusal of a data file longer than any this store writes (a shorter one
    is padded by recovery's repair): the configured size changed, or the file is
    not this store's; which bytes are valid cannot be told. It says what to do."""
    return CorruptFileError(
        path,
        f"size {actual} but data files are {file_size} bytes: start with the file size "
        f"the store was written with, or move the file out of the store root",
    )


class MappedFile:
    """A data file of exactly ``file_size`` bytes mapped into memory."""

    __slots__ = (
        "_fd",
        "_mm",
        "_ref_lock",
        "_refs",
        "_shutdown_at_ms",
        "file_from_offset",
        "file_size",
        "first_create_in_queue",
        "flushed_position",
        "path",
        "read_only",
        "store_timestamp_ms",
        "wrote_position",
    )

    def __init__(self, path: Path, file_size: int, *, read_only: bool = False) -> None:
        self._init_state(path, file_size, read_only=read_only)
        flags = os.O_RDONLY if read_only else os.O_RDWR | os.O_CREAT
        self._fd = os.open(path, flags, 0o644)
        actual = -1
        try:
            actual = os.fstat(self._fd).st_size
            if actual == 0 and not read_only:
                # A sparse file, as RocketMQ's default (no warm-up): measured here,
                # pwrite into delayed-allocation pages runs at ~2.5 GB/s against
                # 0.4-1.5 GB/s into fallocate'd (unwritten) extents, which ext4
                # converts on every write. ext4 reserves blocks at write time, so
                # a full disk still fails the pwrite, not a later writeback.
                os.ftruncate(self._fd, file_size)
            elif actual != file_size:
                raise wrong_size(path, actual, file_size)
            access = mmap.ACCESS_READ if read_only else mmap.ACCESS_WRITE
            self._mm = mmap.mmap(self._fd, file_size, access=access)
        except BaseException:
            os.close(self._fd)
            if not read_only and actual == 0:
                # Never leave a half-made file behind: the next load would refuse it.
                path.unlink(missing_ok=True)
            raise
        if not read_only and actual == 0:
            file_created(path)

    def _init_state(self, path: Path, file_size: int, *, read_only: bool) -> None:
        """Every field but the descriptor and the mapping, from a checked file name
        (subclasses without a mapping call this instead of ``__init__``)."""
        offset = parse_file_name(path)
        if offset is None:
            raise CorruptFileError(path, "data file names are 20-digit offsets")
        if offset % file_size:
            raise CorruptFileError(path, f"start offset is not a multiple of {file_size}")
        self.path = path
        self.file_size = file_size
        self.file_from_offset = offset
        self.read_only = read_only
        self.wrote_position = 0
        self.flushed_position = 0
        self.store_timestamp_ms = 0
        self.first_create_in_queue = False
        #: Readers holding the file (see hold); -1 in _shutdown_at_ms while available.
        self._refs = 0
        self._shutdown_at_ms = -1
        self._ref_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"MappedFile({self.path.name}, wrote={self.wrote_position})"

    @property
    def file_end_offset(self) -> int:
        return self.file_from_offset + self.file_size

    @property
    def remaining(self) -> int:
        return self.file_size - self.wrote_position

    @property
    def is_full(self) -> bool:
        return self.wrote_position >= self.file_size

    @property
    def fd(self) -> int:
        """The file descriptor, for positioned reads (valid until close())."""
        return self._fd

    @property
    def closed(self) -> bool:
        return self._mm.closed

    @property
    def buffer(self) -> mmap.mmap:
        """The whole mapping, for zero-copy parsing; do not keep views past close()."""
        return self._mm

    def append(self, data: bytes | bytearray) -> None:
        """Copy ``data`` at ``wrote_position`` and advance it. Single writer."""
        pos = self.wrote_position
        end = pos + len(data)
        if end > self.file_size:
            raise ValueError(f"{self.path.name}: append of {len(data)} bytes past the end")
        # pwrite rather than a store through the mapping: the bytes land in the same
        # page cache the mapping reads, without a page fault per fresh 4 KiB page,
        # and a full disk is an error rather than a SIGBUS.
        try:
            pwrite_all(self._fd, data, pos)
        except OSError:
            # A failed append must leave no complete records behind it: a restart
            # would otherwise recover records whose send was reported as failed.
            with contextlib.suppress(OSError):
                pwrite_all(self._fd, bytes(len(data)), pos)
            raise
        self.wrote_position = end

    def write_at(self, pos: int, data: bytes) -> None:
        """Overwrite bytes at ``pos`` without moving positions (recovery, fills)."""
        pwrite_all(self._fd, data, pos)

    # -- references (RocketMQ's ReferenceResource) -----------------------------------

    def hold(self) -> bool:
        """Pin the file for a read; False once it is being deleted (treat it as gone).

        Every successful hold must be paired with :meth:`release`.
        """
        with self._ref_lock:
            if self._shutdown_at_ms >= 0:
                return False
            self._refs += 1
            return True

    def release(self) -> None:
        with self._ref_lock:
            self._refs -= 1

    def try_destroy(self, now_ms: int, forcibly_after_ms: int) -> bool:
        """Delete the file unless a reader holds it; returns whether it is gone.

        The first call stops new holds. A file still held is deleted anyway by a
        call ``forcibly_after_ms`` after the first (RocketMQ's
        destroyMapedFileIntervalForcibly): a reader that never releases must not
        pin a file forever; it then sees the mapping closed (ValueError).
        """
        with self._ref_lock:
            if self._shutdown_at_ms < 0:
                self._shutdown_at_ms = max(now_ms, 0)
            if self._refs > 0 and now_ms - self._shutdown_at_ms < forcibly_after_ms:
                return False
        self.destroy()
        return True

    def read(self, pos: int, size: int) -> bytes:
        """Copy ``size`` bytes from ``pos``; callers stay below ``wrote_position``."""
        return self._mm[pos : pos + size]

    def flush(self) -> int:
        """Make everything written so far durable; returns the new flushed position."""
        target = self.wrote_position
        if target > self.flushed_position:
            os.fdatasync(self._fd)
            self.flushed_position = target
        return self.flushed_position

    def zero_tail(self, pos: int, end: int | None = None) -> int:
        """Zero every non-zero byte in ``[pos, end)`` (default: to the end of the file);
        returns how many bytes that region spans up to its last non-zero byte.

        Records may hold long runs of zeroes, so the whole region is examined,
        not just up to the first zero run. Clearing a dirty tail keeps a stale
        record from looking valid to a later recovery.
        """
        return self._scan_tail(pos, end, clear=True)

    def dirty_bytes_from(self, pos: int, end: int | None = None) -> int:
        """Bytes from ``pos`` to the last non-zero byte before ``end``."""
        return self._scan_tail(pos, end, clear=False)

    def readable_end(self, pos: int, limit: int | None = None) -> int:
        """The end (at most ``limit``, default the file's end) of the data extent
        holding ``pos``; ``pos`` itself when it lies in a hole.

        Bytes in ``[pos, readable_end(pos))`` may be read through :attr:`buffer`
        without faulting a page that has no space behind it (see
        :func:`data_extents`); past it, the file reads as zeros.
        """
        stop = self.file_size if limit is None else min(limit, self.file_size)
        for data, hole in data_extents(self, pos, stop):
            return hole if data == pos else pos
        return pos

    def data_end(self) -> int:
        """The end of the file's last data extent: everything after it is a hole."""
        last = 0
        for _, hole in data_extents(self, 0, self.file_size):
            last = hole
        return last

    def _scan_tail(self, start: int, end: int | None, *, clear: bool) -> int:
        # pread, and only of data extents: the tail of a sparse file is mostly
        # hole, which reads as zeros, and a read fault there (tmpfs) would
        # allocate a page - a SIGBUS on a full file system.
        stop = self.file_size if end is None else min(end, self.file_size)
        data_end = start
        step = len(_ZERO_CHUNK)
        for extent_start, extent_end in data_extents(self, start, stop):
            for pos in range(extent_start, extent_end, step):
                chunk_end = min(pos + step, extent_end)
                chunk = os.pread(self._fd, chunk_end - pos, pos)
                if chunk == _ZERO_CHUNK[: len(chunk)]:
                    continue
                if clear:
                    pwrite_all(self._fd, _ZERO_CHUNK[: len(chunk)], pos)
                data_end = pos + len(chunk.rstrip(b"\x00"))
        return data_end - start

    def close(self) -> None:
        if not self._mm.closed:
            self._mm.close()
            os.close(self._fd)

    def destroy(self) -> None:
        """Unmap and delete the file."""
        self.close()
        self.path.unlink(missing_ok=True)
