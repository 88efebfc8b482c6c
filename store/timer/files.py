"""The timer's two data files: the TimerLog and the TimerWheel (RocketMQ 5's
TimerLog and TimerWheel, read with pread/pwrite rather than mapped).

**TimerLog** (``<root>/timerlog/<20-digit start offset>``, files of
``mapped_file_size_timer_log`` bytes): an append-only log of fixed-size
entries, one per timer message filed in the wheel::

    prev_pos(8) slot_tick(8) deliver_ms(8) phy_offset(8) size(4) magic(4) topic_hash(4) crc(4)

``prev_pos`` is the previous entry of the same slot (-1: the first): each slot
heads a linked list walked backwards from its last entry. ``phy_offset`` /
``size`` locate the parked record in the CommitLog. ``magic`` is 1 (a
message), | 2 (ROLL: filed early, to be written to the timer topic again),
| 4 (DELETE: a recall's marker). ``topic_hash`` is crc32 of the real topic
(the pending count of a message whose record is gone is still taken off its
topic). ``crc`` is crc32 of the 44 bytes before it. A file holds
``size // 48`` entries; an entry never straddles two files.

**TimerWheel** (``<root>/timerwheel``): ``ring_slots`` slots of 32 bytes::

    tick(8) first_pos(8) last_pos(8) num(4) pad(4)

Tick ``t`` lives at index ``t % ring_slots``; a slot whose stored tick is not
``t`` is empty for ``t`` (it is an old turn of the ring), so nothing is ever
cleared. The file is sparse until slots are written. Slots changed since the
last checkpoint are kept in memory (``dirty``) and written, with the
checkpoint that lists them, by :meth:`TimerWheel.write_dirty`.

Neither file is mapped: mapped pages count in the process's RSS, and the
timer's memory must not grow with the messages pending. Reads go through the
page cache with ``os.pread``.
"""

from __future__ import annotations

import logging
import os
import struct
import zlib
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import NamedTuple

from basalt.store.files import fsync_dir

log = logging.getLogger(__name__)

ENTRY = struct.Struct(">qqqqiiII")
ENTRY_SIZE = ENTRY.size  # 48
_ENTRY_BODY = struct.Struct(">qqqqiiI")
SLOT = struct.Struct(">qqqi4x")
SLOT_SIZE = SLOT.size  # 32

MAGIC_DEFAULT = 1
MAGIC_ROLL = 2
MAGIC_DELETE = 4


def topic_hash(topic: str) -> int:
    return zlib.crc32(topic.encode("utf-8"))


class TimerEntry(NamedTuple):
    """One TimerLog entry, with its own position."""

    pos: int
    prev: int
    slot_tick: int
    deliver_ms: int
    phy: int
    size: int
    magic: int
    topic_hash: int

    @property
    def is_roll(self) -> bool:
        return bool(self.magic & MAGIC_ROLL)

    @property
    def is_delete(self) -> bool:
        return bool(self.magic & MAGIC_DELETE) and not self.magic & MAGIC_ROLL


def encode_entry(
    prev: int, slot_tick: int, deliver_ms: int, phy: int, size: int, magic: int, t_hash: int
) -> bytes:
    body = _ENTRY_BODY.pack(prev, slot_tick, deliver_ms, phy, size, magic, t_hash)
    return body + zlib.crc32(body).to_bytes(4, "big")


def decode_entry(pos: int, data: bytes) -> TimerEntry | None:
    """The entry in ``data`` (48 bytes), or None when its crc does not match."""
    if len(data) != ENTRY_SIZE or zlib.crc32(data[:-4]) != int.from_bytes(data[-4:], "big"):
        return None
    prev, slot_tick, deliver_ms, phy, size, magic, t_hash, _ = ENTRY.unpack(data)
    return TimerEntry(pos, prev, slot_tick, deliver_ms, phy, size, magic, t_hash)


class TimerLog:
    """See the module's doc. Not thread-safe: the timer service's lock guards it."""

    def __init__(self, directory: Path, file_size: int) -> None:
        self.directory = directory
        self.file_size = file_size
        self.capacity = (file_size // ENTRY_SIZE) * ENTRY_SIZE
        self._fds: dict[int, int] = {}
        #: The next entry's position.
        self.end = 0
        self._buffer = bytearray()
        self._buffer_start = 0
        self._unsynced: set[int] = set()

    # -- files ------------------------------------------------------------------------

    def load(self) -> None:
        """Open the files there are (the end is set by :meth:`truncate`)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        for path in sorted(self.directory.iterdir()):
            if len(path.name) == 20 and path.name.isdigit():
                self._fds[int(path.name)] = os.open(path, os.O_RDWR)

    @property
    def file_starts(self) -> list[int]:
        return sorted(self._fds)

    @property
    def min_offset(self) -> int:
        return min(self._fds) if self._fds else self.end

    def disk_bytes(self) -> int:
        return sum(os.fstat(fd).st_size for fd in self._fds.values())

    def file_start(self, pos: int) -> int:
        return pos - pos % self.file_size

    def covers(self, end: int) -> str | None:
        """Why the files cannot hold entries up to ``end`` (None: they can): a file
        missing between the first and the one ``end`` falls in, or one too short."""
        if end == 0:
            return None
        if not self._fds:
            return f"no TimerLog file, but the checkpoint says it ends at {end}"
        last = self.file_start(end - 1)
        start = min(self._fds)
        while start <= last:
            fd = self._fds.get(start)
            if fd is None:
                return f"TimerLog file {start:020d} is missing"
            need = min(end - start, self.capacity)
            size = os.fstat(fd).st_size
            if size < need:
                return f"TimerLog file {start:020d} has {size} bytes, the checkpoint needs {need}"
            start += self.file_size
        return None

    def truncate(self, end: int) -> None:
        """Drop everything at and after ``end`` (the checkpoint's end): later files
        go, the one ``end`` falls in is cut. Sets :attr:`end`."""
        self._buffer.clear()
        last = self.file_start(end)
        for start in sorted(self._fds):
            if start > last:
                self._remove(start)
            elif start == last:
                os.ftruncate(self._fds[start], end - start)
        self.end = end

    def _remove(self, start: int) -> None:
        fd = self._fds.pop(start)
        os.close(fd)
        (self.directory / f"{start:020d}").unlink(missing_ok=True)
        self._unsynced.discard(start)

    def delete_file(self, start: int) -> None:
        """Delete a file whose entries were all scanned (never the one written)."""
        if start in self._fds and start != self.file_start(self.end):
            self._remove(start)

    def reset(self) -> None:
        """Delete every file (a rebuild): the log starts again at 0."""
        for start in list(self._fds):
            self._remove(start)
        self._buffer.clear()
        self.end = 0

    def _fd(self, start: int) -> int:
        fd = self._fds.get(start)
        if fd is None:
            path = self.directory / f"{start:020d}"
            fd = self._fds[start] = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            fsync_dir(self.directory)
        return fd

    # -- writes -----------------------------------------------------------------------

    def append(self, entry: bytes) -> int:
        """Buffer one entry; returns its position. :meth:`write` writes the buffer."""
        pos = self.end
        if not self._buffer:
            self._buffer_start = pos
        elif self.file_start(pos) != self.file_start(self._buffer_start):
            self.write()
            self._buffer_start = pos
        self._buffer += entry
        nxt = pos + ENTRY_SIZE
        if nxt % self.file_size >= self.capacity or nxt % self.file_size == 0:
            nxt = self.file_start(pos) + self.file_size
        self.end = nxt
        return pos

    def write(self) -> None:
        """pwrite the buffered entries (readable from then on)."""
        if not self._buffer:
            return
        start = self.file_start(self._buffer_start)
        os.pwrite(self._fd(start), self._buffer, self._buffer_start - start)
        self._unsynced.add(start)
        self._buffer.clear()

    def sync(self) -> None:
        """fsync what was written since the last sync."""
        self.write()
        for start in sorted(self._unsynced):
            fd = self._fds.get(start)
            if fd is not None:
                os.fsync(fd)
        self._unsynced.clear()

    # -- reads ------------------------------------------------------------------------

    def read(self, pos: int) -> TimerEntry | None:
        """The entry at ``pos``; None when its file is gone or the bytes are not an
        entry (a damaged file)."""
        start = self.file_start(pos)
        fd = self._fds.get(start)
        if fd is None or pos < 0:
            return None
        return decode_entry(pos, os.pread(fd, ENTRY_SIZE, pos - start))

    def chain(self, last: int, limit: int = 1 << 62, *, stop: int = -1) -> list[TimerEntry]:
        """A slot's entries, walked back from ``last`` (up to the entry at ``stop``,
        excluded: what a caller has read already), returned oldest first. A
        missing or damaged entry ends the walk (logged)."""
        out: list[TimerEntry] = []
        pos = last
        while pos >= 0 and pos != stop and len(out) < limit:
            entry = self.read(pos)
            if entry is None:
                log.error("TimerLog entry at %d is missing or damaged: its slot's list ends", pos)
                break
            out.append(entry)
            pos = entry.prev
        out.reverse()
        return out

    def damaged_before(self, end: int, count: int) -> int | None:
        """The position of the first of the last ``count`` entries before ``end``
        that does not read back (None: all do)."""
        if end <= 0:
            return None
        pos = end - ENTRY_SIZE if end % self.file_size else self.file_start(end - 1)
        if not end % self.file_size:
            pos += self.capacity - ENTRY_SIZE
        start = max(self.file_start(pos), pos - (count - 1) * ENTRY_SIZE)
        for i, entry in enumerate(self.iter_entries(start, pos + ENTRY_SIZE)):
            if entry is None:
                return start + i * ENTRY_SIZE
        return None

    def iter_entries(self, start: int, end: int) -> Iterable[TimerEntry | None]:
        """Every position's entry in [start, end), in order (None: damaged)."""
        pos = start
        while pos < end:
            fstart = self.file_start(pos)
            fd = self._fds.get(fstart)
            stop = min(end, fstart + self.capacity)
            if fd is None:
                yield None
                pos = fstart + self.file_size
                continue
            data = os.pread(fd, stop - pos, pos - fstart)
            for i in range(0, stop - pos, ENTRY_SIZE):
                yield decode_entry(pos + i, data[i : i + ENTRY_SIZE])
            pos = fstart + self.file_size

    def close(self) -> None:
        self.write()
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


class TimerWheel:
    """See the module's doc. Not thread-safe: the timer service's lock guards it."""

    def __init__(self, path: Path, ring_slots: int) -> None:
        self.path = path
        self.ring_slots = ring_slots
        self._fd = -1
        #: tick -> (first, last, num) changed since the last write_dirty.
        self.dirty: dict[int, tuple[int, int, int]] = {}

    @property
    def size_bytes(self) -> int:
        return self.ring_slots * SLOT_SIZE

    def open(self) -> bool:
        """Open (creating a sparse file of the ring's size); False when an existing
        file has another size (another precision or roll window: rebuild it)."""
        exists = self.path.exists()
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        size = os.fstat(self._fd).st_size
        if exists and size not in (0, self.size_bytes):
            return False
        if size != self.size_bytes:
            os.ftruncate(self._fd, self.size_bytes)
            fsync_dir(self.path.parent)
        return True

    def reset(self) -> None:
        """Empty every slot (a rebuild)."""
        os.ftruncate(self._fd, 0)
        os.ftruncate(self._fd, self.size_bytes)
        self.dirty.clear()

    def get(self, tick: int) -> tuple[int, int, int] | None:
        """(first, last, num) of ``tick``'s slot, None when it is empty."""
        slot = self.dirty.get(tick)
        if slot is not None:
            return slot
        data = os.pread(self._fd, SLOT_SIZE, (tick % self.ring_slots) * SLOT_SIZE)
        if len(data) != SLOT_SIZE:
            return None
        stored, first, last, num = SLOT.unpack(data)
        return (first, last, num) if stored == tick and last >= 0 else None

    def put(self, tick: int, first: int, last: int, num: int) -> None:
        self.dirty[tick] = (first, last, num)

    def occupied(self, first_tick: int, count: int) -> list[tuple[int, int, int, int]]:
        """(tick, first, last, num) of every non-empty slot of ticks
        [first_tick, first_tick + count), ascending; ``count`` <= ring_slots."""
        out: dict[int, tuple[int, int, int]] = {}
        tick = first_tick
        end = first_tick + count
        while tick < end:
            index = tick % self.ring_slots
            n = min(end - tick, self.ring_slots - index)
            data = os.pread(self._fd, n * SLOT_SIZE, index * SLOT_SIZE)
            for i, (stored, first, last, num) in enumerate(SLOT.iter_unpack(data)):
                if stored == tick + i and last >= 0 and stored != 0:
                    out[stored] = (first, last, num)
            tick += n
        for t, slot in self.dirty.items():
            if first_tick <= t < end:
                out[t] = slot
        return [(t, *out[t]) for t in sorted(out)]

    def write_dirty(self, slots: Sequence[tuple[int, int, int, int]]) -> None:
        """Write ``slots`` (tick, first, last, num) into the file and fsync it."""
        for tick, first, last, num in slots:
            os.pwrite(
                self._fd, SLOT.pack(tick, first, last, num), (tick % self.ring_slots) * SLOT_SIZE
            )
        if slots:
            os.fsync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


__all__ = [
    "ENTRY_SIZE",
    "MAGIC_DEFAULT",
    "MAGIC_DELETE",
    "MAGIC_ROLL",
    "SLOT_SIZE",
    "TimerEntry",
    "TimerLog",
    "TimerWheel",
    "decode_entry",
    "encode_entry",
    "topic_hash",
]
