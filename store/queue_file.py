"""A ConsumeQueue file without a mapping: sparse, written with ``pwrite``, read with ``pread``.

A store with tens of thousands of queues cannot afford what a CommitLog file
gets (blocks reserved and pages populated at creation, a mapping and two file
descriptors for as long as the store runs): that is 5.72 MiB of disk and of
memory and two fds per queue. A :class:`QueueFile` is instead

- **sparse**: created by ``open(O_CREAT)`` + ``ftruncate`` to the configured
  size (RocketMQ's 6,000,000 bytes by default, so files stay byte-compatible),
  O(1) whatever the number of queues; a queue with a few units costs one
  4 KiB block of disk;
- **written with pwrite**: a full disk (ENOSPC) or a missing descriptor
  (EMFILE) is an ``OSError`` from the call, never a SIGBUS from a store into a
  mapping of a page with no block behind it;
- **read with pread**: one call for a run of units; what is read sits in the
  page cache, which is not the process's RSS;
- **opened on demand**: the descriptor comes from an :class:`OpenFiles` LRU
  shared by every queue of a store, which closes the least recently used idle
  file past its bound, so the store's fds do not grow with its queues.

Concurrency: the dispatcher writes while pull handlers read on other threads.
:meth:`OpenFiles.acquire` pins a file's descriptor until the matching
:meth:`OpenFiles.release`, so eviction never closes a descriptor in use, and
:meth:`QueueFile.close` of a pinned file defers the ``close(2)`` to the last
release (a reused fd number must never be read as this file).
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from basalt.store.files import file_created
from basalt.store.mapped_file import MappedFile, fd_data_extents, pwrite_all, wrong_size

if TYPE_CHECKING:
    import mmap

    from basalt.store.mapped_file_queue import FileFactory

#: RocketMQ-style default bound on open ConsumeQueue files (see the config field).
DEFAULT_MAX_OPEN_FILES = 4096
_PAGE = 4096
#: The most bytes :meth:`OpenFiles.caching_reads` keeps of one file (a queue of
#: up to 3,276 units is read once at start) and of all files together (past it,
#: reads go to the files as outside the block).
READ_CACHE_FILE_BYTES = 64 * 1024
READ_CACHE_TOTAL_BYTES = 64 * 1024 * 1024
_ZERO_CHUNK = bytes(64 * 1024)


class OpenFiles:
    """An LRU of open :class:`QueueFile` descriptors, at most ``capacity`` idle ones.

    ``acquire`` opens the file if needed and pins its descriptor; past
    ``capacity`` the least recently used unpinned files are closed. When every
    open file is pinned the bound is exceeded rather than a caller blocked
    (pins last one system call). Thread-safe; the lock is held for the
    open/close bookkeeping only, never across a read or write.
    """

    def __init__(self, capacity: int = DEFAULT_MAX_OPEN_FILES) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, not {capacity}")
        self.capacity = capacity
        self._lock = threading.Lock()
        self._open: OrderedDict[QueueFile, None] = OrderedDict()
        #: Descriptors opened and closed by eviction so far (for tests and figures).
        self.opens = 0
        self.evictions = 0
        #: While recovery runs (:meth:`caching_reads`): each file's first bytes as
        #: last read from its start, so the passes over every queue read a small
        #: queue's units once and open its file once (see the method).
        self.read_cache: dict[QueueFile, bytes] | None = None
        self.read_cache_bytes = 0

    @contextlib.contextmanager
    def caching_reads(self) -> Iterator[None]:
        """Keep what reads from a file's start return (up to :data:`READ_CACHE_BYTES`)
        and answer later reads within it from memory, until the block ends.

        For a store's start only, when one thread reads and writes every queue:
        recovery's passes (the written end, the last and first real units, then
        validation against the recovered CommitLog and the queue's min offset)
        read each queue several times, and with more queues than the LRU holds,
        each pass reopened every file: at 40,000 queues, 80,000 opens and 240,000
        reads. Every write to a file drops its entry. Never with concurrent
        readers and writers: a read racing a write could keep stale bytes.
        """
        self.read_cache = {}
        self.read_cache_bytes = 0
        try:
            yield
        finally:
            self.read_cache = None
            self.read_cache_bytes = 0

    def __len__(self) -> int:
        return len(self._open)

    def acquire(self, qf: QueueFile) -> int:
        """``qf``'s descriptor, pinned until :meth:`release`; raises ValueError once
        the file is closed for good, OSError (EMFILE, ENOENT) if it cannot be opened."""
        with self._lock:
            if qf.closed_for_good:
                raise ValueError(f"{qf.path.name}: file is closed")
            fd = qf.open_fd
            if fd < 0:
                self._make_room()  # close first: the fds never exceed the bound by one
                fd = qf.open_fd = os.open(qf.path, qf.open_flags)
                self.opens += 1
                self._open[qf] = None
            else:
                self._open.move_to_end(qf)
            qf.pins += 1
            return fd

    def release(self, qf: QueueFile) -> None:
        with self._lock:
            qf.pins -= 1
            if qf.pins == 0 and qf.closed_for_good:
                self._close_fd(qf)

    def adopt(self, qf: QueueFile, fd: int) -> None:
        """Take ``fd`` (just opened by ``qf`` itself) into the LRU as its most recent."""
        with self._lock:
            self._make_room()
            qf.open_fd = fd
            self.opens += 1
            self._open[qf] = None

    def close(self, qf: QueueFile) -> None:
        """Close ``qf`` for good: now if unpinned, else at its last release."""
        with self._lock:
            qf.closed_for_good = True
            if qf.pins == 0:
                self._close_fd(qf)

    def _close_fd(self, qf: QueueFile) -> None:
        fd = qf.open_fd
        if fd >= 0:
            qf.open_fd = -1
            self._open.pop(qf, None)
            os.close(fd)

    def _make_room(self) -> None:
        """Close idle files until one more fits (the file about to be added is not
        in the LRU yet, so it can never be its own victim)."""
        while len(self._open) >= self.capacity:
            # Oldest first; a pinned file is skipped (usually the first one is idle,
            # so this is O(1), not a walk of every open file).
            for victim in self._open:
                if victim.pins == 0:
                    break
            else:
                return  # every open file is in use: over the bound until a release
            self.evictions += 1
            self._close_fd(victim)


class QueueFile(MappedFile):
    """One ConsumeQueue file: a :class:`MappedFile` in interface (positions, holds,
    expiry), with no mapping and a descriptor borrowed from an :class:`OpenFiles`.

    Created files are sparse, ``file_size`` bytes. An existing file is not
    opened by the constructor (a restart over 40,000 queues opens each file
    only while recovery reads it); it must be ``file_size`` bytes, or empty
    (made that size), else CorruptFileError.
    """

    __slots__ = ("closed_for_good", "open_fd", "open_files", "open_flags", "pins")

    def __init__(
        self,
        path: Path,
        file_size: int,
        open_files: OpenFiles,
        *,
        read_only: bool = False,
        actual_size: int | None = None,
    ) -> None:
        """``actual_size``: the file's size on disk if the caller just read it (a
        queue's load stats every file once; 40,000 queues, 40,000 stats)."""
        # MappedFile.__init__ is not called: it would map the file. The methods that
        # use the mapping are overridden.
        self._init_state(path, file_size, read_only=read_only)
        self._fd = -1  # MappedFile's slot; the live descriptor is open_fd
        self.open_files = open_files
        self.open_flags = (os.O_RDONLY if read_only else os.O_RDWR) | os.O_CLOEXEC
        self.open_fd = -1
        self.pins = 0
        self.closed_for_good = False
        actual = actual_size
        if actual is None:
            try:
                actual = os.stat(path).st_size
            except FileNotFoundError:
                actual = -1
        if actual == file_size:
            return
        if actual > 0 or read_only:
            raise wrong_size(path, actual, file_size)
        # New (or empty): sparse at full size, so byte positions match RocketMQ's.
        fd = os.open(path, self.open_flags | os.O_CREAT, 0o644)
        try:
            os.ftruncate(fd, file_size)
        except BaseException:
            os.close(fd)
            if actual < 0:
                path.unlink(missing_ok=True)  # never leave a half-made file behind
            raise
        open_files.adopt(self, fd)
        file_created(path)  # the space guard looks at the disk when a file is made

    def __repr__(self) -> str:
        return f"QueueFile({self.path.name}, wrote={self.wrote_position})"

    @property
    def closed(self) -> bool:
        return self.closed_for_good

    @property
    def fd(self) -> int:
        """Not available: the descriptor is borrowed per call (see :class:`OpenFiles`)."""
        raise TypeError(f"{self.path.name}: a QueueFile has no lasting descriptor")

    @property
    def buffer(self) -> mmap.mmap:
        """Not available: a QueueFile has no mapping; use :meth:`read`."""
        raise TypeError(f"{self.path.name}: a QueueFile has no mapping, use read()")

    def _call(self, op: Callable[[int], int | bytes | None]) -> int | bytes | None:
        fd = self.open_files.acquire(self)
        try:
            return op(fd)
        finally:
            self.open_files.release(self)

    def append(self, data: bytes | bytearray) -> None:
        """Write ``data`` at ``wrote_position`` and advance it; ENOSPC/EMFILE raise
        OSError with the position unchanged and the region zeroed again."""
        pos = self.wrote_position
        end = pos + len(data)
        if end > self.file_size:
            raise ValueError(f"{self.path.name}: append of {len(data)} bytes past the end")
        self._drop_cached()
        fd = self.open_files.acquire(self)
        try:
            try:
                pwrite_all(fd, data, pos)
            except OSError:
                # A partial unit must not read as written after a restart.
                with contextlib.suppress(OSError):
                    pwrite_all(fd, bytes(len(data)), pos)
                raise
        finally:
            self.open_files.release(self)
        self.wrote_position = end

    def write_at(self, pos: int, data: bytes) -> None:
        self._drop_cached()
        fd = self.open_files.acquire(self)
        try:
            pwrite_all(fd, data, pos)
        finally:
            self.open_files.release(self)

    def read(self, pos: int, size: int) -> bytes:
        """Up to ``size`` bytes from ``pos`` in one ``pread`` (a sparse hole reads as zeros)."""
        size = min(size, self.file_size - pos)
        if size <= 0:
            return b""
        cache = self.open_files.read_cache
        if cache is not None:
            head = cache.get(self)
            if head is not None and pos + size <= len(head):
                return head[pos : pos + size]
        fd = self.open_files.acquire(self)
        try:
            data = os.pread(fd, size, pos)
            while len(data) < size:  # short only past EOF: never for a full-size file
                more = os.pread(fd, size - len(data), pos + len(data))
                if not more:
                    break
                data += more
        finally:
            self.open_files.release(self)
        if (
            cache is not None
            and pos == 0
            and size <= READ_CACHE_FILE_BYTES
            and self.open_files.read_cache_bytes + size <= READ_CACHE_TOTAL_BYTES
        ):
            self._drop_cached()
            cache[self] = data
            self.open_files.read_cache_bytes += size
        return data

    def keep_cached(self, size: int) -> None:
        """Keep at most the first ``size`` bytes of the file's cached start (see
        :meth:`OpenFiles.caching_reads`): recovery reads a page of each queue to
        find its written end, and only the written units are read again by the
        later passes, so the cache's budget holds every small queue's units."""
        cache = self.open_files.read_cache
        head = cache.get(self) if cache is not None else None
        if cache is not None and head is not None and len(head) > size:
            cache[self] = head[:size]
            self.open_files.read_cache_bytes -= len(head) - size

    def _drop_cached(self) -> None:
        """Forget the file's cached start (:meth:`OpenFiles.caching_reads`): it is
        being written."""
        cache = self.open_files.read_cache
        if cache is not None:
            self.open_files.read_cache_bytes -= len(cache.pop(self, b""))

    def data_end(self) -> int:
        """End of the first data extent from the start: past it the file is a hole
        (zeros) up to the next extent. 0 when the file starts with a hole."""
        fd = self.open_files.acquire(self)
        try:
            extents = fd_data_extents(fd, 0, self.file_size)
        finally:
            self.open_files.release(self)
        if not extents or extents[0][0] > 0:
            return 0
        return extents[0][1]

    def flush(self) -> int:
        """fdatasync if anything was written since the last flush. The descriptor may
        be a fresh one: fdatasync writes back the file's dirty pages, whoever dirtied them."""
        target = self.wrote_position
        if target > self.flushed_position:
            fd = self.open_files.acquire(self)
            try:
                os.fdatasync(fd)
            finally:
                self.open_files.release(self)
            self.flushed_position = target
        return self.flushed_position

    def _scan_tail(self, start: int, end: int | None, *, clear: bool) -> int:
        """As MappedFile's, over the file's data extents only: holes are zeros."""
        stop = self.file_size if end is None else min(end, self.file_size)
        if start >= stop:
            return 0
        if self._tail_is_clean(start, stop):
            return 0
        if clear:
            self._drop_cached()
        fd = self.open_files.acquire(self)
        try:
            data_end = start
            step = len(_ZERO_CHUNK)
            for begin, finish in fd_data_extents(fd, start, stop):
                for pos in range(begin, finish, step):
                    chunk_end = min(pos + step, finish)
                    chunk = os.pread(fd, chunk_end - pos, pos)
                    if chunk == _ZERO_CHUNK[: len(chunk)]:
                        continue
                    if clear:
                        pwrite_all(fd, _ZERO_CHUNK[: len(chunk)], pos)
                    data_end = pos + len(chunk.rstrip(b"\x00"))
            return data_end - start
        finally:
            self.open_files.release(self)

    def _tail_is_clean(self, start: int, stop: int) -> bool:
        """Whether ``[start, stop)`` is known to be all zeros from the start of the
        file cached by :meth:`OpenFiles.caching_reads` plus one ``SEEK_DATA``
        past it; False when unknown (the caller scans the extents).

        Recovery checks the tail past every queue's written end: with the
        queue's first page already read, this is one system call (ENXIO: no
        data further on) instead of walking the extents and reading them again.
        """
        cache = self.open_files.read_cache
        head = cache.get(self) if cache is not None else None
        if head is None or start > len(head):
            return False
        covered = min(stop, len(head))
        if head[start:covered] != _ZERO_CHUNK[: covered - start]:
            return False
        if covered >= stop:
            return True
        fd = self.open_files.acquire(self)
        try:
            next_data = os.lseek(fd, covered, os.SEEK_DATA)
        except OSError as e:
            # ENXIO: only holes from there on. EINVAL: no SEEK_DATA here, scan.
            return e.errno == errno.ENXIO
        finally:
            self.open_files.release(self)
        return next_data >= stop

    def close(self) -> None:
        self._drop_cached()
        self.open_files.close(self)


def queue_file_factory(open_files: OpenFiles) -> FileFactory:
    """A MappedFileQueue file factory making QueueFiles that share ``open_files``."""

    def make(
        path: Path, file_size: int, read_only: bool, /, *, actual_size: int | None = None
    ) -> MappedFile:
        return QueueFile(path, file_size, open_files, read_only=read_only, actual_size=actual_size)

    return make
