"""ConsumeQueue: the per-(topic, queue) index into the CommitLog.

Lives in ``consumequeue/<topic>/<queueId>/``, files of
``mapped_file_size_consume_queue`` bytes (300,000 units by default) named by
their start offset in bytes. Every unit is 20 bytes, big-endian::

    offset  size  field
    ------  ----  ------------------------------------------------------------
    0       8     CommitLog physical offset of the record
    8       4     record size (TOTALSIZE)
    12      8     tagsCode: Java String.hashCode of the TAGS property, 0 if none

Unit ``i`` describes queue offset ``i``: the byte position is ``i * 20``. A
queue whose first file does not start at offset 0 of its first unit gets a
leading run of blank units ``(0, 0x7FFFFFFF, 0)``, as RocketMQ's fillPreBlank.
An all-zero unit marks the end of what was written.

Concurrency: written by one dispatching thread at a time (the dispatcher's,
or a writer applying its own hand-off, under the dispatch lock; recovery
before either); readers read units below the write position; expiry deletes
files from the front, waiting for readers that hold them.
"""

from __future__ import annotations

import contextlib
import logging
import struct
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from basalt.common import _records
from basalt.common.message import SCHEDULE_TOPIC
from basalt.common.record import (
    MESSAGE_MAGIC_CODE,
    MIN_RECORD_SIZE,
    PREFIX,
    Buffer,
    body_length_at,
)
from basalt.store.config import CQ_STORE_UNIT_SIZE
from basalt.store.mapped_file import MappedFile
from basalt.store.mapped_file_queue import TORN_WRITE_WINDOW_BYTES, MappedFileQueue
from basalt.store.queue_file import OpenFiles, QueueFile, queue_file_factory

log = logging.getLogger(__name__)

UNIT = struct.Struct(
    ">"
    "q"  # CommitLog physical offset
    "i"  # record size
    "q"  # tagsCode
)
assert UNIT.size == CQ_STORE_UNIT_SIZE
#: The size field of a filler unit (RocketMQ writes Integer.MAX_VALUE).
BLANK_UNIT_SIZE = 0x7FFFFFFF
BLANK_UNIT = UNIT.pack(0, BLANK_UNIT_SIZE, 0)
_SCHEDULE_TOPIC_RAW = SCHEDULE_TOPIC.encode()

#: (queue offset, physical offset, size, tagsCode) — what the dispatcher hands in.
CqEntry = tuple[int, int, int, int]


#: The most blank units the dispatcher pads a hole with (records lost to damage);
#: a record claiming a queue offset further past its queue's end is not indexed.
MAX_PADDED_GAP_UNITS = 1 << 20

#: The first read of a queue file at start (see ConsumeQueue.written_end).
_HEAD_READ_BYTES = 4096

#: Below the fully validated tail, one unit in this many is checked at start.
VALIDATE_SAMPLE_STRIDE = 1024

_INT = struct.Struct(">i")


def _is_valid_unit(phy: int, size: int) -> bool:
    return phy >= 0 and size > 0


def _mismatch(
    log: MappedFileQueue,
    log_end: int,
    phy: int,
    size: int,
    queue_id: int,
    queue_offset: int,
    topic_raw: bytes,
    tags_code: int,
) -> str | None:
    """Why the unit (phy, size, tags_code) at ``queue_offset`` is not its record; None
    if it is."""
    if phy < 0 or size < MIN_RECORD_SIZE or phy + size > log_end:
        return f"unit ({phy}, {size}) is outside the CommitLog"
    mf = log.find_by_offset(phy)
    if mf is None or phy - mf.file_from_offset + size > mf.wrote_position:
        return f"unit ({phy}, {size}) is outside the CommitLog"
    buf = mf.buffer
    rel = phy - mf.file_from_offset
    total, magic, _, qid, _, qoff, phys, sys_flag, _ = PREFIX.unpack_from(buf, rel)
    if magic != MESSAGE_MAGIC_CODE or total != size or phys != phy:
        return f"unit ({phy}, {size}) does not point at a record of that size"
    if qid != queue_id or qoff != queue_offset:
        return f"unit ({phy}, {size}) points at queue {qid} offset {qoff}"
    p = body_length_at(rel, sys_flag)
    (body_len,) = _INT.unpack_from(buf, p)
    p += 4 + body_len
    if body_len < 0 or p + 1 > rel + size or buf[p + 1 : p + 1 + buf[p]] != topic_raw:
        return f"unit ({phy}, {size}) points at another topic's record"
    if topic_raw == _SCHEDULE_TOPIC_RAW:
        # Its tagsCode is a due time from the delay levels configured when it was
        # dispatched (store.schedule), which this check does not know.
        return None
    # A wrong tagsCode hides the record from TAG subscriptions (and fails store check).
    code = _records.tags_code_at(buf, rel)
    if code != tags_code:
        return f"unit ({phy}, {size}) has tagsCode {tags_code} but its record's TAGS give {code}"
    return None


def _unit_at(mf: MappedFile, index: int) -> tuple[int, int, int]:
    """Unit ``index`` of ``mf`` (one 20-byte read)."""
    phy, size, tags = UNIT.unpack(mf.read(index * CQ_STORE_UNIT_SIZE, CQ_STORE_UNIT_SIZE))
    return phy, size, tags


class ConsumeQueue:
    """One queue's index files."""

    def __init__(
        self,
        topic: str,
        queue_id: int,
        consume_queue_dir: Path,
        mapped_file_size: int,
        *,
        read_only: bool = False,
        open_files: OpenFiles | None = None,
    ) -> None:
        """``open_files`` is the LRU of descriptors shared by a store's queues
        (ConsumeQueueTable's); a queue made on its own gets one of its own."""
        self.topic = topic
        self.queue_id = queue_id
        self.mapped_file_size = mapped_file_size
        # Sparse files written with pwrite and read with pread, a descriptor only
        # while in use (store/queue_file.py): a queue costs kilobytes, not a
        # populated 6 MB mapping, and a full disk is an OSError, never a SIGBUS.
        self.files = MappedFileQueue(
            consume_queue_dir / topic / str(queue_id),
            mapped_file_size,
            read_only=read_only,
            # Derived data: a short file is repaired and rebuilt, never a refusal.
            repair_unit=CQ_STORE_UNIT_SIZE,
            new_file=queue_file_factory(open_files if open_files is not None else OpenFiles()),
            defer_dir_sync=True,
            # A file longer than configured: set aside (as recovery does with damaged
            # CommitLog bytes) and the queue rebuilt, never a refusal to start.
            quarantine=(
                consume_queue_dir.parent / "quarantine",
                f"consumequeue-{topic}-{queue_id}-",
            ),
        )
        #: End (offset + size) of the last real unit; -1 when the queue is empty.
        self.max_physic_offset = -1
        #: Byte position of the first readable unit.
        self.min_logic_offset = 0

    # -- load & recovery ------------------------------------------------------------

    def load(self) -> None:
        self.files.load()

    def recover(self) -> int:
        """Find the end of the written units, scanning from the third-last file.

        Returns how many non-zero bytes lay past that end and were cleared:
        more than a torn append's means units were lost to damage.
        """
        files = self.files.files
        if not files:
            return 0
        end = files[0].file_from_offset
        for mf in files[max(0, len(files) - 3) :]:
            end = mf.file_from_offset
            pos = self.written_end(mf)
            end += pos
            if pos < self.mapped_file_size:
                break
        # Units are appended back to back, so past the first empty unit only a torn
        # append can have left bytes; a corrupt unit means anything may follow.
        stop = self.files.find_by_offset(end)
        torn = stop is not None and stop.read(end - stop.file_from_offset, CQ_STORE_UNIT_SIZE)
        clean_stop = not torn or torn == bytes(CQ_STORE_UNIT_SIZE)
        cleared = self.files.truncate_dirty_files(
            end, dirty_end=end + TORN_WRITE_WINDOW_BYTES if clean_stop else None
        )
        for mf in files:
            if isinstance(mf, QueueFile):
                mf.keep_cached(mf.wrote_position)
        self.max_physic_offset = self._last_physic_end()
        self.min_logic_offset = self._first_real_unit_offset(files[0])
        return cleared

    def written_end(self, mf: MappedFile) -> int:
        """Bytes of valid units at the start of ``mf``; an all-zero or negative unit ends them.

        Units are written back to back from the file's start, so a QueueFile is
        read from its start in doubling chunks, from one page (204 units), until
        a chunk holds an invalid unit: a queue with a few units costs one
        ``pread``, whatever the file's size (a sparse file's hole reads as
        zeros). Finding the first hole with ``SEEK_HOLE`` first cost two more
        system calls a queue, a sixth of a restart over 40,000 queues.
        """
        size = _HEAD_READ_BYTES if isinstance(mf, QueueFile) else self.mapped_file_size
        while True:
            data = mf.read(0, size)
            pos = 0
            for phy, unit_size, _ in UNIT.iter_unpack(
                memoryview(data)[: len(data) - len(data) % CQ_STORE_UNIT_SIZE]
            ):
                if not _is_valid_unit(phy, unit_size):
                    return pos
                pos += CQ_STORE_UNIT_SIZE
            if len(data) < size or size >= self.mapped_file_size:
                return pos
            size *= 2

    def _first_real_unit_offset(self, mf: MappedFile) -> int:
        data = mf.read(0, mf.wrote_position)
        for i, (_, size, _) in enumerate(UNIT.iter_unpack(data)):
            if size != BLANK_UNIT_SIZE:
                return mf.file_from_offset + i * CQ_STORE_UNIT_SIZE
        return mf.file_from_offset + mf.wrote_position

    def _last_physic_end(self) -> int:
        for mf in reversed(self.files.files):
            data = mf.read(0, mf.wrote_position)
            for i in range(len(data) - CQ_STORE_UNIT_SIZE, -1, -CQ_STORE_UNIT_SIZE):
                phy, size, _ = UNIT.unpack_from(data, i)
                if size != BLANK_UNIT_SIZE:
                    return int(phy + size)
        return -1

    def truncate_dirty(self, phy_offset: int) -> int:
        """Drop units pointing at or past ``phy_offset``; returns how many real units went."""
        dropped = 0
        for mf in reversed(self.files.files):
            data = mf.read(0, mf.wrote_position)
            if not data:
                continue  # an empty last file: the units to check are further back
            cut = None
            for i, (phy, size, _) in enumerate(UNIT.iter_unpack(data)):
                if size != BLANK_UNIT_SIZE and phy + size > phy_offset:
                    cut = i
                    break
            if cut is None:
                break
            dropped += sum(
                1
                for _, size, _ in UNIT.iter_unpack(data[cut * CQ_STORE_UNIT_SIZE :])
                if size != BLANK_UNIT_SIZE
            )
            self.files.truncate_dirty_files(
                mf.file_from_offset + cut * CQ_STORE_UNIT_SIZE, dirty_end=self.files.max_offset
            )
            if cut > 0:
                break
        self.max_physic_offset = self._last_physic_end()
        if not self.files.files:
            self.min_logic_offset = 0
        return dropped

    def validate(self, log: MappedFileQueue, full_from: int) -> tuple[int, str] | None:
        """The first unit found not to index its own record, as (queue offset, why).

        Unit ``i`` must point at a MESSAGE record of exactly the unit's size
        in ``log`` (the CommitLog, after its recovery) whose PHYSICALOFFSET,
        QUEUEID, QUEUEOFFSET and TOPIC are the unit's position, this queue and
        ``i``, and whose TAGS hash to the unit's tagsCode (found in C:
        ``_records.tags_code_at``). Blank units, and units below the
        CommitLog's first file (expired records), are not checked.

        Cost: about 1 µs a unit (a few ``unpack_from`` on the CommitLog's
        mapping, a random read). Every unit whose record is at or past
        ``full_from`` is checked (recovery passes the CommitLog's last 64 MiB,
        where writes, crashes and torn pages are); earlier units are sampled
        (each file's first and last, and every
        :data:`VALIDATE_SAMPLE_STRIDE`-th), ~0.1 % of them, because checking
        every unit of a large store would be a random-read pass over all of
        it at every start.
        """
        if log.first_file is None:
            return None
        log_min = log.min_offset
        log_end = log.max_offset
        topic_raw = self.topic.encode("utf-8")
        for mf in self.files.files:
            data = mf.read(0, mf.wrote_position)
            count = len(data) // CQ_STORE_UNIT_SIZE
            if count == 0:
                continue
            first_full = self._first_unit_at_or_past(data, count, full_from)
            indexes = list(range(0, first_full, VALIDATE_SAMPLE_STRIDE))
            if first_full > 0 and indexes[-1] != first_full - 1:
                indexes.append(first_full - 1)
            indexes.extend(range(first_full, count))
            base = mf.file_from_offset // CQ_STORE_UNIT_SIZE
            for i in indexes:
                phy, size, tags = UNIT.unpack_from(data, i * CQ_STORE_UNIT_SIZE)
                if size == BLANK_UNIT_SIZE or 0 <= phy < log_min:
                    continue
                why = _mismatch(log, log_end, phy, size, self.queue_id, base + i, topic_raw, tags)
                if why is not None:
                    return base + i, why
        return None

    @staticmethod
    def _first_unit_at_or_past(data: Buffer, count: int, phy_offset: int) -> int:
        """Index of the first unit pointing at or past ``phy_offset`` (a binary
        search: units are in CommitLog order; damage at worst mis-places the split)."""
        lo, hi = 0, count
        while lo < hi:
            mid = (lo + hi) // 2
            phy, size, _ = UNIT.unpack_from(data, mid * CQ_STORE_UNIT_SIZE)
            if size != BLANK_UNIT_SIZE and phy >= phy_offset:
                hi = mid
            else:
                lo = mid + 1
        return lo

    def truncate_to(self, queue_offset: int) -> int:
        """Drop the units at and past ``queue_offset``; returns how many real units went."""
        pos = queue_offset * CQ_STORE_UNIT_SIZE
        dropped = sum(1 for _ in self.iter_units(queue_offset))
        self.files.truncate_dirty_files(pos, dirty_end=self.files.max_offset)
        self.max_physic_offset = self._last_physic_end()
        if self.min_logic_offset > pos:
            self.min_logic_offset = pos
        return dropped

    def delete_expired_files(
        self, commitlog_min_offset: int, now_ms: int = 0, forcibly_after_ms: int = 0
    ) -> int:
        """Delete the files whose every unit points below the CommitLog's min offset
        (never the last file), then move ``min_logic_offset`` up to the first unit
        still readable; returns how many files went. RocketMQ's
        deleteExpiredFile + correctMinOffset. Called by the expiry service only."""

        def below_min(mf: MappedFile) -> bool:
            if mf.wrote_position < CQ_STORE_UNIT_SIZE:
                return False
            last_phy, _, _ = _unit_at(mf, mf.wrote_position // CQ_STORE_UNIT_SIZE - 1)
            return bool(last_phy < commitlog_min_offset)

        deleted = 0
        # A file a reader holds (a pull mid-scan) waits, as CommitLog files do.
        while self.files.delete_expired_file(below_min, now_ms, forcibly_after_ms) is not None:
            deleted += 1
        if self.files.files:
            self.min_logic_offset = max(self.min_logic_offset, self.files.min_offset)
        first = self.get_unit(self.min_offset_in_queue)
        if first is not None and first[0] < commitlog_min_offset:
            self.correct_min_offset(commitlog_min_offset)
        return deleted

    def correct_min_offset(self, commitlog_min_offset: int) -> None:
        """Move ``min_logic_offset`` to the first unit whose record is still in the CommitLog."""
        for mf in self.files.files:
            data = mf.read(0, mf.wrote_position)
            for i, (phy, size, _) in enumerate(UNIT.iter_unpack(data)):
                if size != BLANK_UNIT_SIZE and phy >= commitlog_min_offset:
                    self.min_logic_offset = mf.file_from_offset + i * CQ_STORE_UNIT_SIZE
                    return
        self.min_logic_offset = self.files.max_offset

    # -- writing (dispatcher only) ----------------------------------------------------

    def put_entries(self, entries: Sequence[CqEntry]) -> int:
        """Append units for these records; returns how many were written.

        Idempotent: entries whose record ends at or below ``max_physic_offset``
        or whose position is already written are skipped, so re-dispatching a
        stretch of the CommitLog is harmless.
        """
        if not entries:
            return 0
        first_offset = entries[0][0]
        if entries[-1][0] == first_offset + len(entries) - 1:
            units = b"".join([UNIT.pack(phy, size, tags) for _, phy, size, tags in entries])
            return self.put_units(first_offset, len(entries), units)
        return sum(self._put_one(*entry) for entry in entries)

    def fits_in_last_file(self, first_offset: int, count: int) -> bool:
        """Whether ``count`` units from queue offset ``first_offset`` continue the
        queue inside its last file: :meth:`put_units` then creates no file (no
        mkdir, no open) and makes one write."""
        last = self.files.last_file
        if last is None:
            return False
        pos = first_offset * CQ_STORE_UNIT_SIZE
        return (
            pos == last.file_from_offset + last.wrote_position
            and last.wrote_position + count * CQ_STORE_UNIT_SIZE <= last.file_size
        )

    def put_units(self, first_offset: int, count: int, units: bytes) -> int:
        """Append ``count`` packed units for queue offsets ``first_offset``, ``+1``, …;
        returns how many were written. Idempotent like :meth:`put_entries`.

        The common case - the run continues the queue inside its last file -
        is one write of the bytes as they are.
        """
        if count <= 0:
            return 0
        last_phy, last_size, _ = UNIT.unpack_from(units, (count - 1) * CQ_STORE_UNIT_SIZE)
        if last_phy + last_size <= self.max_physic_offset:
            return 0  # already indexed (re-dispatch after recovery)
        first_phy, first_size, _ = UNIT.unpack_from(units, 0)
        pos = first_offset * CQ_STORE_UNIT_SIZE
        last = self.files.last_file
        if (last is None and pos == 0) or (last is not None and pos == last.file_end_offset):
            last = self.files.get_last_mapped_file(pos)  # the queue's first, or next, file
        if (
            last is not None
            and first_phy + first_size > self.max_physic_offset
            and pos == last.file_from_offset + last.wrote_position
        ):
            room = (self.mapped_file_size - last.wrote_position) // CQ_STORE_UNIT_SIZE
            if count > room:  # the run crosses into the next file
                split = room * CQ_STORE_UNIT_SIZE
                return self.put_units(first_offset, room, units[:split]) + self.put_units(
                    first_offset + room, count - room, units[split:]
                )
            last.append(units)
            self.max_physic_offset = last_phy + last_size
            return count
        return sum(
            self._put_one(first_offset + i, phy, size, tags)
            for i, (phy, size, tags) in enumerate(UNIT.iter_unpack(units))
        )

    def _put_one(self, cq_offset: int, phy: int, size: int, tags_code: int) -> int:
        if phy + size <= self.max_physic_offset:
            log.debug("%s-%d: record %d already indexed", self.topic, self.queue_id, phy)
            return 0
        expect = cq_offset * CQ_STORE_UNIT_SIZE
        mf = self.files.get_last_mapped_file(expect)
        if mf.first_create_in_queue and cq_offset != 0 and mf.wrote_position == 0:
            # The queue's first file starts mid-way: blank units up to its first offset.
            self.min_logic_offset = expect
            self.files.flushed_where = expect
            self._fill_blank(mf, expect - mf.file_from_offset)
        current = self.files.max_offset
        if expect < current:
            log.debug("%s-%d: offset %d already indexed", self.topic, self.queue_id, cq_offset)
            return 0
        if expect - current > MAX_PADDED_GAP_UNITS * CQ_STORE_UNIT_SIZE:
            # A QUEUEOFFSET this far past the queue's end is a damaged header (a record
            # without the whole-record CRC), not lost records: padding to it would
            # write gigabytes of blank units. The record is left unindexed.
            log.error(
                "%s-%d: queue offset %d is %d past the queue's end %d: not indexed",
                self.topic, self.queue_id, cq_offset,
                cq_offset - current // CQ_STORE_UNIT_SIZE, current // CQ_STORE_UNIT_SIZE,
            )  # fmt: skip
            return 0
        if current < expect:
            # A hole would shift every later unit; pad so unit i stays at i * 20.
            log.error(
                "%s-%d: queue offset %d but the queue ends at %d; padding",
                self.topic,
                self.queue_id,
                cq_offset,
                current // CQ_STORE_UNIT_SIZE,
            )
            self.pad_to(cq_offset)
        mf = self.files.get_last_mapped_file(expect)
        mf.append(UNIT.pack(phy, size, tags_code))
        self.max_physic_offset = phy + size
        return 1

    def pad_to(self, queue_offset: int) -> None:
        """Fill the queue with blank units up to ``queue_offset`` (exclusive): the
        offsets of records that are gone stay taken, and unit i stays at i * 20."""
        expect = queue_offset * CQ_STORE_UNIT_SIZE
        current = self.files.max_offset
        while current < expect:
            mf = self.files.get_last_mapped_file(current)
            self._fill_blank(mf, min(expect - mf.file_from_offset, self.mapped_file_size))
            current = self.files.max_offset

    def keep_offsets_to(self, queue_offset: int) -> bool:
        """Take every queue offset below ``queue_offset`` (records that are gone), so
        the queue's next offset is ``queue_offset``; returns whether the queue has
        no readable unit left (its min is then its max).

        A queue with no file starts at ``queue_offset``: its first file is the one
        holding that offset, blank units from the file's start up to it, as
        RocketMQ's fillPreBlank does for a queue whose first offset is not 0 (at
        most one file's worth, whatever the offset). Otherwise blank units are
        appended up to it (:meth:`pad_to`). Recovery only.
        """
        pos = queue_offset * CQ_STORE_UNIT_SIZE
        if pos <= self.files.max_offset:
            return self.min_logic_offset >= self.files.max_offset
        if not self.files.files:
            mf = self.files.get_last_mapped_file(pos)
            self.files.flushed_where = mf.file_from_offset
            self._fill_blank(mf, pos - mf.file_from_offset)
            self.min_logic_offset = pos
            return True
        emptied = self.min_logic_offset >= self.files.max_offset
        self.pad_to(queue_offset)
        if emptied:
            self.min_logic_offset = pos
        return emptied

    def blank_units(self, start_phy: int, end_phy: int) -> int:
        """Turn the units of records starting in CommitLog ``[start_phy, end_phy)``
        into blank units; returns how many. Their queue offsets stay taken: a
        reader steps over a blank unit to the next record, and the queue's next
        offset does not move back (recovery, for records lost to damage)."""
        if self.max_physic_offset <= start_phy:
            return 0  # every unit's record starts before the span (or there is none)
        blanked = 0
        for mf in self.files.files:
            count = mf.wrote_position // CQ_STORE_UNIT_SIZE
            if count == 0:
                continue
            last_phy, last_size, _ = UNIT.unpack(
                mf.read((count - 1) * CQ_STORE_UNIT_SIZE, CQ_STORE_UNIT_SIZE)
            )
            if last_size != BLANK_UNIT_SIZE and last_phy < start_phy:
                continue  # units are in CommitLog order: this whole file is before the span
            buf = mf.read(0, count * CQ_STORE_UNIT_SIZE)
            first = self._first_unit_at_or_past(buf, count, start_phy)
            while first > 0:  # the search may land past a blank unit: step back over it
                phy, size, _ = UNIT.unpack_from(buf, (first - 1) * CQ_STORE_UNIT_SIZE)
                if size != BLANK_UNIT_SIZE and phy < start_phy:
                    break
                first -= 1
            for i in range(first, count):
                phy, size, _ = UNIT.unpack_from(buf, i * CQ_STORE_UNIT_SIZE)
                if size == BLANK_UNIT_SIZE:
                    continue
                if phy >= end_phy:
                    break
                mf.write_at(i * CQ_STORE_UNIT_SIZE, BLANK_UNIT)
                blanked += 1
        if blanked:
            self.max_physic_offset = self._last_physic_end()
        return blanked

    @staticmethod
    def _fill_blank(mf: MappedFile, until_pos: int) -> None:
        count = (until_pos - mf.wrote_position) // CQ_STORE_UNIT_SIZE
        if count > 0:
            mf.append(BLANK_UNIT * count)

    # -- reading ----------------------------------------------------------------------

    @property
    def max_offset_in_queue(self) -> int:
        """One past the last queue offset written."""
        return self.files.max_offset // CQ_STORE_UNIT_SIZE

    @property
    def min_offset_in_queue(self) -> int:
        return self.min_logic_offset // CQ_STORE_UNIT_SIZE

    def get_unit(self, queue_offset: int) -> tuple[int, int, int] | None:
        """(physical offset, size, tagsCode) of one queue offset, or None if not readable."""
        pos = queue_offset * CQ_STORE_UNIT_SIZE
        if queue_offset < 0 or pos < self.min_logic_offset:
            return None
        mf = self.files.find_by_offset(pos)
        if mf is None or pos - mf.file_from_offset >= mf.wrote_position:
            return None
        phy, size, tags = UNIT.unpack(mf.read(pos - mf.file_from_offset, CQ_STORE_UNIT_SIZE))
        return phy, size, tags

    def read_units(self, queue_offset: int, max_count: int) -> bytes:
        """Raw units from ``queue_offset``, at most ``max_count``, never across a file end."""
        pos = queue_offset * CQ_STORE_UNIT_SIZE
        if queue_offset < 0 or pos < self.min_logic_offset:
            return b""
        mf = self.files.find_by_offset(pos)
        if mf is None:
            return b""
        rel = pos - mf.file_from_offset
        count = min(max_count, (mf.wrote_position - rel) // CQ_STORE_UNIT_SIZE)
        return mf.read(rel, count * CQ_STORE_UNIT_SIZE) if count > 0 else b""

    def get_offset_in_queue_by_time(
        self, timestamp_ms: int, store_time_of: Callable[[int], int], min_physic_offset: int
    ) -> int:
        """The queue offset whose record was stored at ``timestamp_ms``, or the nearest.

        RocketMQ 4.x's rules: pick the first file whose last record was stored
        at or after ``timestamp_ms`` (else the last file) and binary search it by
        store time. An exact hit gives that entry (the first of equal ones);
        otherwise the nearer of its two neighbours (the earlier on a tie);
        after the last record, the last; before the first, the first. Units
        whose record is below ``min_physic_offset`` (expired) count as earlier.
        ``store_time_of(phy)`` reads a record's STORETIMESTAMP (-1 if gone).
        Returns 0 for an empty queue.
        """
        files = [mf for mf in self.files.files if mf.wrote_position >= CQ_STORE_UNIT_SIZE]
        if not files:
            return 0

        def last_time(mf: MappedFile) -> int:
            (phy, _, _) = _unit_at(mf, mf.wrote_position // CQ_STORE_UNIT_SIZE - 1)
            return store_time_of(phy)

        # Files are in time order: bisect for the first whose last record is not earlier.
        lo, hi = 0, len(files) - 1
        while lo < hi:
            mid = (lo + hi) // 2
            if last_time(files[mid]) >= timestamp_ms:
                hi = mid
            else:
                lo = mid + 1
        chosen = files[lo]
        # Units are read one by one: a ConsumeQueue file is megabytes, a search ~20 units.
        low = max(0, (self.min_logic_offset - chosen.file_from_offset) // CQ_STORE_UNIT_SIZE)
        high = chosen.wrote_position // CQ_STORE_UNIT_SIZE - 1
        left = right = target = -1
        left_ts = right_ts = -1
        while low <= high:
            mid = (low + high) // 2
            phy, _, _ = _unit_at(chosen, mid)
            if phy < min_physic_offset:
                low, left = mid + 1, mid
                continue
            ts = store_time_of(phy)
            if ts < 0:
                return 0
            if ts == timestamp_ms:
                # RocketMQ stops at any equal entry; the first of them is the one a
                # reset to this time must not skip past, so keep searching left.
                target, high = mid, mid - 1
            elif ts > timestamp_ms:
                high, right, right_ts = mid - 1, mid, ts
            else:
                low, left, left_ts = mid + 1, mid, ts
        if target >= 0:
            index = target
        elif left_ts == -1:
            index = right if right >= 0 else left + 1
        elif right_ts == -1:
            index = left
        else:
            index = right if timestamp_ms - left_ts > right_ts - timestamp_ms else left
        return chosen.file_from_offset // CQ_STORE_UNIT_SIZE + index

    def iter_units(self, queue_offset: int = 0) -> Iterator[tuple[int, int, int, int]]:
        """Yield (queue offset, physical offset, size, tagsCode) from ``queue_offset``.

        Blank filler units are skipped.
        """
        offset = max(queue_offset, self.min_offset_in_queue)
        while True:
            data = self.read_units(offset, 4096)
            if not data:
                return
            for i, (phy, size, tags) in enumerate(UNIT.iter_unpack(data)):
                if size != BLANK_UNIT_SIZE:
                    yield offset + i, phy, size, tags
            offset += len(data) // CQ_STORE_UNIT_SIZE

    # -- lifecycle --------------------------------------------------------------------

    def flush(self) -> None:
        self.files.flush()

    def close(self) -> None:
        self.files.close()

    def destroy(self) -> None:
        self.files.destroy()
        self.max_physic_offset = -1
        self.min_logic_offset = 0
        with contextlib.suppress(OSError):
            self.files.directory.parent.rmdir()
