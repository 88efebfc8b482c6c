"""The epoch file ``<root>/epochFileCheckpoint``: which master wrote which stretch
of the CommitLog (RocketMQ 5's EpochFileCache).

Each entry says "from CommitLog offset ``start_offset`` on, the records were
written by the master of ``epoch``"; an entry ends where the next one starts,
and the last one is open (it ends at the log's max offset). Epochs and start
offsets only grow. A slave compares its entries with its master's to find the
*consistent point* (:meth:`EpochFile.find_consistent_point`), truncates its
log there and copies on from it.

Layout (big-endian)::

    offset   size  field
    ------   ----  ----------------------------------------------------------
    0        4     magic        0x45504F43 ("EPOC")
    4        4     version      1
    8        4     count        number of entries
    12       16×n  entries      [epoch 8][start_offset 8], ascending
    12+16n   4     crc32        zlib.crc32 of every byte before it

The file is rewritten whole on every change: written to
``epochFileCheckpoint.tmp``, fsynced, renamed over the old one, and the
directory fsynced, so a crash leaves the old file or the new one, never a
mix. A file whose magic, version, size or CRC is wrong is an error naming
the path (:class:`~basalt.store.errors.CorruptFileError`), never read as
empty: an empty epoch file would make a slave copy from offset 0 over a log
it already has, or a master forget its terms.

Concurrency: every method takes the instance lock; any thread may call.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import struct
import threading
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from basalt.store.errors import CorruptFileError, StoreError
from basalt.store.files import fsync_dir

EPOCH_FILE_NAME = "epochFileCheckpoint"
EPOCH_MAGIC = 0x45504F43
EPOCH_VERSION = 1

_HEADER = struct.Struct(
    ">"
    "I"  # magic
    "I"  # version
    "I"  # count
)
_ENTRY = struct.Struct(
    ">"
    "q"  # epoch
    "q"  # start_offset
)
_CRC = struct.Struct(">I")


class EpochOrderError(StoreError, ValueError):
    """An entry that would make epochs or start offsets go backwards."""


@dataclass(frozen=True, slots=True)
class EpochEntry:
    """One master's term in the log: ``[start_offset, end_offset)``; ``end_offset``
    -1 for the open (last) entry."""

    epoch: int
    start_offset: int
    end_offset: int = -1


def encode_entries(entries: Sequence[tuple[int, int]]) -> bytes:
    """The file's bytes for ``(epoch, start_offset)`` pairs (see the layout above)."""
    out = bytearray(_HEADER.pack(EPOCH_MAGIC, EPOCH_VERSION, len(entries)))
    for epoch, start in entries:
        out += _ENTRY.pack(epoch, start)
    out += _CRC.pack(zlib.crc32(out))
    return bytes(out)


def decode_entries(data: bytes, path: Path) -> list[tuple[int, int]]:
    """The ``(epoch, start_offset)`` pairs of an epoch file's bytes; raises
    CorruptFileError naming ``path`` for anything but a whole, valid file."""
    if len(data) < _HEADER.size + _CRC.size:
        raise CorruptFileError(path, f"epoch file of {len(data)} bytes is too short")
    magic, version, count = _HEADER.unpack_from(data, 0)
    if magic != EPOCH_MAGIC:
        raise CorruptFileError(path, f"bad epoch file magic 0x{magic:08X}")
    if version != EPOCH_VERSION:
        raise CorruptFileError(path, f"unknown epoch file version {version}")
    expected = _HEADER.size + count * _ENTRY.size + _CRC.size
    if len(data) != expected:
        raise CorruptFileError(
            path, f"epoch file of {len(data)} bytes, expected {expected} for {count} entries"
        )
    (crc,) = _CRC.unpack_from(data, expected - _CRC.size)
    if crc != zlib.crc32(data[: expected - _CRC.size]):
        raise CorruptFileError(path, "epoch file CRC mismatch")
    pairs = [
        (int(e), int(s)) for e, s in _ENTRY.iter_unpack(data[_HEADER.size : expected - _CRC.size])
    ]
    for (e0, s0), (e1, s1) in itertools.pairwise(pairs):
        if e1 <= e0 or s1 < s0:
            raise CorruptFileError(
                path, f"epoch entries out of order: ({e0}, {s0}) then ({e1}, {s1})"
            )
    return pairs


def write_durably(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data``: temporary file, fsync, rename, directory fsync."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def check_epoch_file(path: Path) -> str | None:
    """Why the epoch file at ``path`` cannot be loaded, or None (absent is fine)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        return f"unreadable: {e}"
    try:
        decode_entries(data, path)
    except CorruptFileError as e:
        return e.reason
    return None


class EpochFile:
    """The epoch entries of one store root, loaded from and persisted to ``path``.

    Raises CorruptFileError on construction when the file exists but is damaged.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._pairs: list[tuple[int, int]] = []
        with contextlib.suppress(FileNotFoundError):
            self._pairs = decode_entries(path.read_bytes(), path)

    def entries(self) -> list[EpochEntry]:
        """Every entry, oldest first; each ends where the next starts, the last at -1."""
        with self._lock:
            return _entries(self._pairs)

    def last_epoch(self) -> int:
        """The newest entry's epoch; 0 when there is none."""
        with self._lock:
            return self._pairs[-1][0] if self._pairs else 0

    def last_entry(self) -> EpochEntry | None:
        with self._lock:
            if not self._pairs:
                return None
            epoch, start = self._pairs[-1]
            return EpochEntry(epoch, start, -1)

    def find_entry_by_offset(self, offset: int) -> EpochEntry | None:
        """The entry whose stretch holds CommitLog ``offset`` (the last one for any
        offset at or past its start); None before the first entry."""
        with self._lock:
            found = None
            for entry in _entries(self._pairs):
                if entry.start_offset <= offset:
                    found = entry
            return found

    def append(self, epoch: int, start_offset: int) -> None:
        """Add ``(epoch, start_offset)`` and make it durable before returning.

        The same epoch again is a no-op (a restarted master, a resent frame);
        an older epoch, or a start before the last entry's, raises
        EpochOrderError. OSError from the write leaves the entries unchanged.
        """
        with self._lock:
            if self._pairs:
                last_epoch, last_start = self._pairs[-1]
                if epoch == last_epoch:
                    return
                if epoch < last_epoch or start_offset < last_start:
                    raise EpochOrderError(
                        f"epoch entry ({epoch}, {start_offset}) does not follow the last one "
                        f"({last_epoch}, {last_start})"
                    )
            pairs = [*self._pairs, (epoch, start_offset)]
            write_durably(self.path, encode_entries(pairs))
            self._pairs = pairs

    def truncate_from(self, offset: int) -> None:
        """Forget the log from ``offset`` on: entries starting at or past it go (the
        last kept one is open again and so ends at the new max offset).
        Durable before it returns; a no-op when nothing starts at or past it."""
        with self._lock:
            pairs = [(e, s) for e, s in self._pairs if s < offset]
            if len(pairs) == len(self._pairs):
                return
            write_durably(self.path, encode_entries(pairs))
            self._pairs = pairs

    def find_consistent_point(
        self, master_entries: Sequence[EpochEntry], my_max_offset: int, master_max_offset: int
    ) -> int:
        """Where this log (max offset ``my_max_offset``) and the master's (entries
        ``master_entries``, max offset ``master_max_offset``) stop agreeing.

        From the newest of this file's entries back, the first epoch the master
        also has with the same start offset: the smaller of the two ends, where
        an open end is its side's max offset. -1 when no epoch matches (copy
        from the master's start)."""
        theirs = {e.epoch: e for e in master_entries}
        for mine in reversed(self.entries()):
            other = theirs.get(mine.epoch)
            if other is None or other.start_offset != mine.start_offset:
                continue
            my_end = my_max_offset if mine.end_offset < 0 else mine.end_offset
            their_end = master_max_offset if other.end_offset < 0 else other.end_offset
            return min(my_end, their_end)
        return -1


def _entries(pairs: list[tuple[int, int]]) -> list[EpochEntry]:
    if not pairs:
        return []
    ends = [s for _, s in pairs[1:]] + [-1]
    return [EpochEntry(e, s, end) for (e, s), end in zip(pairs, ends, strict=True)]
