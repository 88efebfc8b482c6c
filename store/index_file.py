"""IndexFile: one fixed-size hash index from message keys to CommitLog offsets.

RocketMQ 4.x's ``store/index/IndexFile`` and ``IndexHeader``, byte for byte.
A file lives in ``<root>/index/`` and is named by its creation time,
``yyyyMMddHHmmssSSS`` in local time (RocketMQ's ``UtilAll.timeMillisToHumanString``).
Its size is ``40 + hashSlotNum * 4 + indexNum * 20`` bytes (420,000,040 with
RocketMQ's defaults), everything big-endian::

    offset                        size  field
    ----------------------------  ----  ------------------------------------------------
    0                             8     beginTimestamp  store time (ms) of entry 1
    8                             8     endTimestamp    store time (ms) of the newest entry
    16                            8     beginPhyOffset  CommitLog offset of entry 1
    24                            8     endPhyOffset    CommitLog offset of the newest entry
    32                            4     hashSlotCount   slots that were empty when first used
    36                            4     indexCount      number of the next entry (starts at 1)
    40 + 4*s                      4     slot s: number of the newest entry whose
                                        keyHash % hashSlotNum == s; 0 = empty
    40 + 4*hashSlotNum + 20*i     20    entry i (i >= 1; entry 0 is never written)

    entry  offset  size  field
    -----  ------  ----  ------------------------------------------------------------
           0       4     keyHash    abs(String.hashCode(key)); Integer.MIN_VALUE gives 0
           4       8     phyOffset  CommitLog offset of the record
           12      4     timeDiff   (storeTimestamp - beginTimestamp) / 1000, seconds,
                                    clamped to [0, Integer.MAX_VALUE]; 0 while
                                    beginTimestamp <= 0
           16      4     prevIndex  the slot's previous value: the next older entry
                                    of the same slot, 0 at the end of the chain

Keys are ``topic#key`` (see :mod:`basalt.store.index_service`). A lookup reads the
slot and walks the chain of entries newest to oldest; it returns the offsets
of entries with the same keyHash, so two keys with the same Java hash both
match and the caller re-checks the key on the record, as RocketMQ does.

RocketMQ quirks kept on purpose, because the bytes must match: the file holds
``indexNum - 1`` entries, not ``indexNum`` (entry 0 is unused and a file is
full when ``indexCount >= indexNum``); the on-disk ``indexCount`` stays 0
until the first entry or flush writes it (it is 1 in memory); a file created after a full one
starts with the previous file's end timestamp and offset as both its begin and
end, and its first entry's timeDiff is taken against that timestamp before
``beginTimestamp`` is reset to the entry's own store time.

Concurrency: one writer (the dispatcher's thread) calls :meth:`IndexFile.put_key`
or :meth:`IndexFile.put_records`; any thread may call the readers
(:meth:`select_phy_offsets`, :meth:`is_time_matched`, the header accessors)
at the same time; :meth:`flush` may run on another thread. :meth:`close` and
:meth:`destroy` need every other user to be done with the file
(:class:`basalt.store.index_service.IndexService` guarantees that with its lock).

The rule that keeps readers from seeing a torn header or a half-written
entry: every entry is written before the slot that names it, and the slot
before the header's ``indexCount`` that counts it. The header lives in an
immutable :class:`IndexHeader` snapshot that the writer replaces with one
attribute assignment; ``put_records`` (C, without the GIL) publishes the
snapshot only when it returns, but writes the header bytes after every
entry, ``indexCount`` last. A reader reads the slot *first*, then the larger
of the snapshot's and the bytes' ``indexCount``, so the slot can never name
an entry beyond the count it uses, and every entry a slot or a ``prevIndex``
names was written before it was named. The writer and :meth:`IndexFile.flush`
write the header bytes under a small lock, so a flush never puts an older
header over a newer one.

Checked against RocketMQ 4.9.8's own ``IndexFile.java`` (compiled unmodified
against a stub MappedFile): 1,200 random scripts of creates, puts (with
clamped, negative and colliding cases), flushes, reloads, lookups and
``isTimeMatched`` calls gave identical files and identical answers; one of
them is kept as golden bytes in ``tests/store/test_index_file.py``.
"""

from __future__ import annotations

import logging
import mmap
import os
import struct
import threading
from datetime import datetime, timedelta, tzinfo
from pathlib import Path
from typing import NamedTuple

from basalt.common import _records
from basalt.common.record import Buffer
from basalt.store.errors import CorruptFileError
from basalt.store.files import file_created, fsync_dir
from basalt.store.hashing import java_string_hash

log = logging.getLogger(__name__)

HEADER = struct.Struct(
    ">"
    "q"  # beginTimestamp: store time (ms) of the first entry
    "q"  # endTimestamp: store time (ms) of the newest entry
    "q"  # beginPhyOffset: CommitLog offset of the first entry
    "q"  # endPhyOffset: CommitLog offset of the newest entry
    "i"  # hashSlotCount: slots in use
    "i"  # indexCount: number of the next entry
)
SLOT = struct.Struct(
    ">i"  # number of the newest entry of this slot, 0 = empty
)
ENTRY = struct.Struct(
    ">"
    "i"  # keyHash: abs(String.hashCode(key))
    "q"  # phyOffset: CommitLog offset of the record
    "i"  # timeDiff: seconds since beginTimestamp
    "i"  # prevIndex: next older entry of the same slot, 0 = none
)
assert HEADER.size == 40
assert ENTRY.size == 20

#: RocketMQ's defaults (MessageStoreConfig.maxHashSlotNum / maxIndexNum).
DEFAULT_HASH_SLOT_NUM = 5_000_000
DEFAULT_INDEX_NUM = 5_000_000 * 4
#: A slot or prevIndex of 0 (or below) means "no entry".
INVALID_INDEX = 0
#: Index file names: creation time as yyyyMMddHHmmssSSS.
FILE_NAME_DIGITS = 17
_INT_MAX = 2**31 - 1
_INT_MIN = -(2**31)


class IndexHeader(NamedTuple):
    """The 40-byte header, as one immutable snapshot (see the module's concurrency rule)."""

    begin_timestamp_ms: int
    end_timestamp_ms: int
    begin_phy_offset: int
    end_phy_offset: int
    hash_slot_count: int
    index_count: int


#: Where the header keeps indexCount (the last field), and a big-endian long.
_INDEX_COUNT_AT = HEADER.size - 4
_LONG = struct.Struct(">q")


def index_key_hash(key: str) -> int:
    """RocketMQ's ``indexKeyHashMethod``: ``Math.abs(key.hashCode())``, and 0 for
    Integer.MIN_VALUE (whose absolute value does not fit an int)."""
    h = java_string_hash(key)
    return 0 if h == _INT_MIN else abs(h)


def index_file_size(hash_slot_num: int, index_num: int) -> int:
    """Bytes of an index file with these capacities."""
    return HEADER.size + hash_slot_num * SLOT.size + index_num * ENTRY.size


def index_file_name(timestamp_ms: int, tz: tzinfo | None = None) -> str:
    """``yyyyMMddHHmmssSSS`` of ``timestamp_ms`` in ``tz`` (default: local time, as
    RocketMQ's ``Calendar.getInstance()``)."""
    seconds, millis = divmod(timestamp_ms, 1000)
    t = datetime.fromtimestamp(seconds, tz)
    return f"{_format_seconds(t)}{millis:03d}"


def next_index_file_name(name: str) -> str:
    """The name one millisecond after ``name``: how two files created in the same
    millisecond (or after the clock went back) still get distinct, ordered names."""
    t = datetime.strptime(name[:14], "%Y%m%d%H%M%S") + timedelta(milliseconds=int(name[14:]) + 1)
    return f"{_format_seconds(t)}{t.microsecond // 1000:03d}"


def _format_seconds(t: datetime) -> str:
    return f"{t.year:04d}{t.month:02d}{t.day:02d}{t.hour:02d}{t.minute:02d}{t.second:02d}"


def is_index_file_name(name: str) -> bool:
    return len(name) == FILE_NAME_DIGITS and name.isdigit()


def _time_diff_s(store_timestamp_ms: int, begin_timestamp_ms: int) -> int:
    """RocketMQ's timeDiff: whole seconds (Java's truncating division), clamped."""
    if begin_timestamp_ms <= 0:
        return 0
    delta_ms = store_timestamp_ms - begin_timestamp_ms
    if delta_ms < 0:
        return 0  # truncation toward zero then the clamp: every negative gives 0
    return min(delta_ms // 1000, _INT_MAX)


def check_index_bytes(
    data: bytes | mmap.mmap,
    hash_slot_num: int,
    index_num: int,
    commitlog_max_offset: int,
    prev: tuple[str, IndexHeader] | None,
) -> str | None:
    """:meth:`IndexFile.check`'s rule over the bytes of a whole index file of this
    geometry; ``prev`` the previous file's name and header (its ``index_count`` at
    least 1, as loaded). Shared with ``basalt store check``, which reads the bytes
    with ``pread``."""
    begin_ts, end_ts, begin_phy, end_phy, slot_count, raw_count = HEADER.unpack_from(data, 0)
    count = max(raw_count, 1)
    if not 0 <= raw_count <= index_num:
        return f"header: index count {raw_count} outside [0, {index_num}]"
    if not 0 <= slot_count <= min(hash_slot_num, count - 1):
        return f"header: hash slot count {slot_count} but {count - 1} entries"
    if not (0 <= begin_ts <= end_ts and 0 <= begin_phy <= end_phy):
        return (
            f"header: begin ({begin_ts} ms, offset {begin_phy}) after end "
            f"({end_ts} ms, offset {end_phy})"
        )
    if count == 1 and (begin_ts != end_ts or begin_phy != end_phy):
        return "header: no entries but begin and end differ"
    if count > 1 and end_phy >= commitlog_max_offset:
        return f"header: end offset {end_phy} past the commitlog's end {commitlog_max_offset}"
    if prev is not None:
        prev_name, prev_header = prev
        if prev_header.index_count < index_num:
            return f"follows {prev_name}, which is not full"
        if begin_phy < prev_header.end_phy_offset:
            return f"header: begin offset {begin_phy} before {prev_name}'s end"
    reason = _records.index_check(data, hash_slot_num, index_num, count, begin_phy, end_phy)
    return reason or None


def loaded_header(data: bytes | mmap.mmap) -> IndexHeader:
    """The header at the start of ``data`` as :meth:`IndexFile.open` loads it
    (an ``indexCount`` of 0 or less reads as 1)."""
    begin_ts, end_ts, begin_phy, end_phy, slot_count, index_count = HEADER.unpack_from(data, 0)
    return IndexHeader(begin_ts, end_ts, begin_phy, end_phy, slot_count, max(index_count, 1))


class IndexFile:
    """One memory-mapped index file. Build with :meth:`create` or :meth:`open`."""

    __slots__ = (
        "_closed",
        "_entries_pos",
        "_fd",
        "_flushed",
        "_header",
        "_header_lock",
        "_io_lock",
        "_mm",
        "file_size",
        "hash_slot_num",
        "index_num",
        "path",
    )

    def __init__(
        self,
        path: Path,
        hash_slot_num: int,
        index_num: int,
        fd: int,
        mm: mmap.mmap,
        header: IndexHeader,
    ) -> None:
        """Wrap an open, mapped file; use :meth:`create` or :meth:`open` instead."""
        self.path = path
        self.hash_slot_num = hash_slot_num
        self.index_num = index_num
        self.file_size = index_file_size(hash_slot_num, index_num)
        self._entries_pos = HEADER.size + hash_slot_num * SLOT.size
        self._fd = fd
        self._mm = mm
        self._header = header
        #: The header as of the last flush: what is known to be on disk.
        self._flushed: IndexHeader | None = None
        #: Serialises flush against close: an fsync never meets a closed descriptor.
        self._io_lock = threading.Lock()
        #: Held while the header bytes are written, so a flush never writes an
        #: older header over a newer one (held for one pack, never over I/O).
        self._header_lock = threading.Lock()
        self._closed = False

    @classmethod
    def create(
        cls,
        path: Path,
        hash_slot_num: int,
        index_num: int,
        *,
        end_phy_offset: int = 0,
        end_timestamp_ms: int = 0,
    ) -> IndexFile:
        """Create a new, zeroed index file at ``path`` (which must not exist).

        ``end_phy_offset`` and ``end_timestamp_ms`` are the previous file's end,
        written as this file's begin and end when positive (RocketMQ's
        constructor). The file is made under a ``.tmp`` name, its blocks
        reserved (stores through the mapping must never meet a full disk: that
        is a SIGBUS, not an error) and then renamed, so a crash never leaves a
        short file under an index file name. Raises FileExistsError or OSError
        (ENOSPC from the reservation on a full disk: an error here, never a
        signal later).
        """
        size = index_file_size(hash_slot_num, index_num)
        if path.exists():
            raise FileExistsError(f"{path}: index file already exists")
        tmp = path.with_name(path.name + ".tmp")
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.posix_fallocate(fd, 0, size)
            os.fsync(fd)
            os.rename(tmp, path)
            fsync_dir(path.parent)
            mm = mmap.mmap(fd, size, access=mmap.ACCESS_WRITE)
        except BaseException:
            os.close(fd)
            tmp.unlink(missing_ok=True)
            raise
        file_created(path)
        begin_ts = end_ts = end_timestamp_ms if end_timestamp_ms > 0 else 0
        begin_phy = end_phy = end_phy_offset if end_phy_offset > 0 else 0
        # In memory indexCount starts at 1; on disk it stays 0 until the first entry.
        HEADER.pack_into(mm, 0, begin_ts, end_ts, begin_phy, end_phy, 0, 0)
        return cls(
            path,
            hash_slot_num,
            index_num,
            fd,
            mm,
            IndexHeader(begin_ts, end_ts, begin_phy, end_phy, 0, 1),
        )

    @classmethod
    def open(cls, path: Path, hash_slot_num: int, index_num: int) -> IndexFile:
        """Map an existing index file and read its header (RocketMQ's ``load``).

        An ``indexCount`` of 0 or less reads as 1. Raises CorruptFileError when
        the file's size does not match ``hash_slot_num`` and ``index_num``.
        """
        size = index_file_size(hash_slot_num, index_num)
        fd = os.open(path, os.O_RDWR)
        try:
            actual = os.fstat(fd).st_size
            if actual != size:
                raise CorruptFileError(
                    path,
                    f"size {actual} but index files of {hash_slot_num} hash slots and "
                    f"{index_num} entries are {size} bytes",
                )
            mm = mmap.mmap(fd, size, access=mmap.ACCESS_WRITE)
        except BaseException:
            os.close(fd)
            raise
        return cls(path, hash_slot_num, index_num, fd, mm, loaded_header(mm))

    def __repr__(self) -> str:
        return f"IndexFile({self.path.name}, entries={self._header.index_count - 1})"

    # -- header -----------------------------------------------------------------------

    @property
    def file_name(self) -> str:
        return self.path.name

    @property
    def header(self) -> IndexHeader:
        """The current header snapshot (immutable; consistent with itself)."""
        return self._header

    @property
    def begin_timestamp_ms(self) -> int:
        return self._header.begin_timestamp_ms

    @property
    def end_timestamp_ms(self) -> int:
        return self._header.end_timestamp_ms

    @property
    def begin_phy_offset(self) -> int:
        return self._header.begin_phy_offset

    @property
    def end_phy_offset(self) -> int:
        return self._header.end_phy_offset

    @property
    def hash_slot_count(self) -> int:
        return self._header.hash_slot_count

    @property
    def index_count(self) -> int:
        """The number the next entry gets: entries held + 1."""
        return self._header.index_count

    @property
    def is_write_full(self) -> bool:
        """RocketMQ's ``isWriteFull``: ``indexCount >= indexNum``."""
        return self._header.index_count >= self.index_num

    def is_time_matched(self, begin_ms: int, end_ms: int) -> bool:
        """Whether ``[begin_ms, end_ms]`` overlaps this file's time span, as RocketMQ
        decides it: the range covers the span, or either end lies within it."""
        h = self._header
        b, e = h.begin_timestamp_ms, h.end_timestamp_ms
        return (begin_ms < b and end_ms > e) or b <= begin_ms <= e or b <= end_ms <= e

    def check(self, commitlog_max_offset: int, prev: IndexFile | None) -> str | None:
        """What makes this file untrustworthy, or None: the start-up check.

        The on-disk header must be consistent with itself and the file's
        capacity (``indexCount`` in ``[0, indexNum]``, ``hashSlotCount`` at most
        the slots and the entries written, begin before end, an empty file's
        begin equal to its end), end before ``commitlog_max_offset``, and begin
        at or after ``prev``'s end (``prev``, the file before, must be full). Then
        every written slot and entry (C, without the GIL, one pass): a slot
        names a written entry of its own slot, an entry's ``prevIndex`` an older
        entry of the same slot, its offset lies between the previous entry's
        and the header's end, keyHash and timeDiff are not negative. So a query
        following any pointer of a file that passes stays within the written
        entries. What it cannot see - a flipped bit that leaves every value
        plausible - the query path's check of topic and key on the record
        catches (``basalt.store.store_reads``).
        """
        previous = None if prev is None else (prev.file_name, prev._header)
        return check_index_bytes(
            self._mm, self.hash_slot_num, self.index_num, commitlog_max_offset, previous
        )

    # -- write ------------------------------------------------------------------------

    def put_key(self, key: str, phy_offset: int, store_timestamp_ms: int) -> bool:
        """Add an entry for ``key``; False when the file is full (nothing written).

        Single writer. Writes the entry, then the slot, then the header bytes,
        then publishes the new header snapshot (the module's concurrency rule).
        """
        h = self._header
        count = h.index_count
        if count >= self.index_num:
            log.warning(
                "index file %s is full: index count %d, index max num %d",
                self.path.name,
                count,
                self.index_num,
            )
            return False
        key_hash = index_key_hash(key)
        slot_pos = HEADER.size + (key_hash % self.hash_slot_num) * SLOT.size
        mm = self._mm
        (slot_value,) = SLOT.unpack_from(mm, slot_pos)
        if slot_value <= INVALID_INDEX or slot_value > count:
            slot_value = INVALID_INDEX  # empty, or left over from a torn write
        time_diff = _time_diff_s(store_timestamp_ms, h.begin_timestamp_ms)
        ENTRY.pack_into(
            mm,
            self._entries_pos + count * ENTRY.size,
            key_hash,
            phy_offset,
            time_diff,
            slot_value,
        )
        SLOT.pack_into(mm, slot_pos, count)
        first = count <= 1
        new = IndexHeader(
            store_timestamp_ms if first else h.begin_timestamp_ms,
            store_timestamp_ms,
            phy_offset if first else h.begin_phy_offset,
            phy_offset,
            h.hash_slot_count + (slot_value == INVALID_INDEX),
            count + 1,
        )
        with self._header_lock:
            HEADER.pack_into(mm, 0, *new)
            self._header = new
        return True

    def put_records(
        self, log: Buffer, pos: int, limit: int, base_phys: int, skip_keys: int
    ) -> tuple[int, int, int, str]:
        """Index the keys of the stored records in ``log[pos:limit]`` (one CommitLog
        file's bytes, which start at physical offset ``base_phys``), in order, with
        :meth:`put_key`'s rules: ``topic#UNIQ_KEY``, then ``topic#key`` for each KEYS
        entry; records below the file's ``endPhyOffset`` (indexed before) and
        rolled-back transactional ones are skipped. ``skip_keys`` keys of the first
        record were put already (a previous call stopped on a full file).

        Returns ``(pos, keys_done, stop, reason)``: ``stop`` is
        ``_records.INDEX_DONE`` (``pos == limit``), ``INDEX_FULL`` (this file is
        full: go on in a new one with ``keys_done``), ``INDEX_BLANK`` (an
        end-of-file blank at ``pos``) or ``INDEX_CORRUPT`` (``reason`` says why).
        The per-key loop runs in C without the GIL, writing the header bytes
        after every entry; the header snapshot is published when it returns
        (the module's concurrency rule). Single writer, like :meth:`put_key`.
        """
        pos, keys_done, state, stop, reason = _records.index_put(
            log,
            pos,
            limit,
            base_phys,
            self._mm,
            self.hash_slot_num,
            self.index_num,
            self._header,
            skip_keys,
        )
        new = IndexHeader(*state)
        if new != self._header:
            with self._header_lock:
                HEADER.pack_into(self._mm, 0, *new)
                self._header = new
        return pos, keys_done, stop, reason

    # -- read -------------------------------------------------------------------------

    def select_phy_offsets(
        self,
        key: str,
        max_num: int,
        begin_ms: int,
        end_ms: int,
        *,
        phy_offsets: list[int] | None = None,
    ) -> list[int]:
        """CommitLog offsets of entries whose keyHash equals ``key``'s and whose
        time lies in ``[begin_ms, end_ms]``, newest first; appended to
        ``phy_offsets`` (returned) until it holds ``max_num`` offsets.

        RocketMQ's ``selectPhyOffset``: the walk follows the slot's chain and
        stops at ``max_num``, at a negative timeDiff, at a ``prevIndex`` outside
        ``(0, indexCount]``, and at the first entry (of any key) older than
        ``begin_ms``. Entry times are ``beginTimestamp + timeDiff * 1000``:
        second resolution. One hardening over RocketMQ: a ``prevIndex`` not
        below the current entry also ends the walk (RocketMQ stops only on an
        equal one), so a damaged file cannot loop; chains RocketMQ writes
        always point to older, lower-numbered entries.

        Safe against a concurrent :meth:`put_key`; see the module's concurrency rule.
        """
        out: list[int] = [] if phy_offsets is None else phy_offsets
        key_hash = index_key_hash(key)
        mm = self._mm
        slot_pos = HEADER.size + (key_hash % self.hash_slot_num) * SLOT.size
        (slot_value,) = SLOT.unpack_from(mm, slot_pos)
        h = self._header  # after the slot: the slot cannot be ahead of it
        # put_records (C, without the GIL) publishes the snapshot only when it
        # returns, but writes indexCount into the header bytes after each entry:
        # the larger of the two is never behind a slot read before it.
        (count_now,) = SLOT.unpack_from(mm, _INDEX_COUNT_AT)
        count = max(h.index_count, count_now)
        if slot_value <= INVALID_INDEX or slot_value > count or count <= 1:
            return out
        begin_timestamp_ms = h.begin_timestamp_ms or _LONG.unpack_from(mm, 0)[0]
        entries_pos = self._entries_pos
        current = slot_value
        while len(out) < max_num:
            hash_read, phy_read, time_diff, prev = ENTRY.unpack_from(
                mm, entries_pos + current * ENTRY.size
            )
            if time_diff < 0:
                break
            time_read = begin_timestamp_ms + time_diff * 1000
            if hash_read == key_hash and begin_ms <= time_read <= end_ms:
                out.append(phy_read)
            if prev <= INVALID_INDEX or prev > count or prev >= current or time_read < begin_ms:
                break
            current = prev
        return out

    # -- lifecycle --------------------------------------------------------------------

    def flush(self) -> IndexHeader | None:
        """Write the header and fsync the file (RocketMQ's ``flush``: its
        ``updateByteBuffer`` then ``force``); returns the header now known to be
        on disk, None once closed.

        Blocking (``fdatasync``, which releases the GIL and, on Linux, writes
        pages dirtied through the mapping). Every entry the returned header
        counts was written before the fsync started. The fsync is skipped when
        nothing changed since the last flush. Any thread: the header bytes are
        written under the lock ``put_key`` writes them under, so a flush cannot
        put an older header over a newer one. Writing them matters once: a new
        file holds indexCount 0 on disk until a flush (or an entry) writes 1.
        """
        with self._io_lock:
            if self._closed:
                return None
            with self._header_lock:
                h = self._header
                HEADER.pack_into(self._mm, 0, *h)
            if h is not self._flushed:
                os.fdatasync(self._fd)
                self._flushed = h
            return h

    def close(self) -> None:
        """Unmap and close without flushing (a crash looks the same to the file);
        idempotent. No reader or writer may use the file any more."""
        with self._io_lock:
            if self._closed:
                return
            self._closed = True
            self._mm.close()
            os.close(self._fd)

    def shutdown(self) -> None:
        """RocketMQ's ``shutdown``: flush, then close."""
        self.flush()
        self.close()

    def destroy(self) -> None:
        """Close and delete the file."""
        self.close()
        self.path.unlink(missing_ok=True)
