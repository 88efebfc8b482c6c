"""Reading a CommitLog past damage: resynchronise, quarantine, and mark what was lost.

RocketMQ's recovery stops at the first bad record and truncates everything
after it: one flipped byte in a file's first record loses the whole file and
every later one. Basalt keeps going. Every record carries its own
PHYSICALOFFSET, so after a bad record at ``x`` the next record is the first
position ``p > x`` where the magic code, the sizes, the CRC (with
``check_crc_on_recover``) and ``PHYSICALOFFSET == p`` all agree
(:func:`resync`): a stray magic code inside a body fails the offset check, a
torn record fails its CRC. Everything from ``x`` to ``p`` is a *damaged
span*.

Before anything is rewritten, a span's bytes are copied to
``<root>/quarantine/commitlog-<offset:020d>-<length>.bin``
(:func:`quarantine`). Then the span is overwritten by a *tombstone*
(:func:`tombstone`): a well-formed record of topic :data:`TOMBSTONE_TOPIC`
exactly the span's length, marked as a rolled-back transaction, so every
reader of the CommitLog - the dispatcher, the C scan, ``store check``,
``store dump``, RocketMQ's own tools - steps over it as a record that indexes
nothing. A span that runs to its file's end becomes the usual end-of-file
blank instead.

The search reads only a file's data extents (``SEEK_DATA``/``SEEK_HOLE``):
CommitLog files are sparse, so the unwritten part of the last file, or a
file recreated after it was deleted, costs nothing to look through.
"""

from __future__ import annotations

import dataclasses
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from basalt.common import _records
from basalt.common.message import TRANSACTION_ROLLBACK_TYPE, Message, transaction_type
from basalt.common.record import (
    MAX_TOPIC_LENGTH,
    MESSAGE_MAGIC_CODE,
    PREFIX,
    EncodedMessage,
    body_length_at,
)
from basalt.store.mapped_file import MappedFile, data_extents

#: The topic of a tombstone record (see the module docstring). Rolled back, it is
#: never dispatched to a ConsumeQueue or the index, whatever its name.
TOMBSTONE_TOPIC = "BASALT_SYS_DAMAGED"
#: The tombstone's property naming the quarantine file of the bytes it replaced.
PROPERTY_QUARANTINE = "QUARANTINE"

_MAGIC = MESSAGE_MAGIC_CODE.to_bytes(4, "big")
_INT = struct.Struct(">i")

#: (scan end position, kind, reason, last store timestamp, first newer position, count):
#: what ``_records.scan`` returns.
ScanTuple = tuple[int, int, str, int, int, int]


@dataclass(frozen=True, slots=True)
class DamagedSpan:
    """A stretch of the CommitLog that held no readable record, and was replaced."""

    #: CommitLog offset where the damage starts (where a record should have been).
    offset: int
    #: Bytes lost: up to the next valid record, or the end of the data.
    length: int
    #: Why the record at ``offset`` was not valid.
    reason: str
    #: The lost record's topic, queue and queue offset, where its header was readable.
    topic: str | None = None
    queue_id: int | None = None
    queue_offset: int | None = None
    #: The file holding the span's bytes as they were found ("" if none were kept).
    quarantine: str = ""

    @property
    def end(self) -> int:
        return self.offset + self.length

    def describe(self) -> str:
        where = (
            f" ({self.topic}/{self.queue_id} queue offset {self.queue_offset})"
            if self.topic is not None
            else ""
        )
        kept = f", bytes kept in {self.quarantine}" if self.quarantine else ""
        return f"commitlog offset {self.offset}, {self.length} bytes{where}: {self.reason}{kept}"


def resync(
    mf: MappedFile, after: int, limit: int, *, check_crc: bool, newer_than_ms: int
) -> tuple[int, ScanTuple] | None:
    """The first valid record of ``mf`` strictly after position ``after`` and
    starting before ``limit``: (its position, the C scan from there), or None.

    A candidate is every occurrence of the magic code 4 bytes into a
    would-be record; the scan from it must accept at least one record (its
    size, CRC and PHYSICALOFFSET agree), and its result is where the caller's
    walk goes on, so no byte is scanned twice.
    """
    buf = mf.buffer
    base = mf.file_from_offset
    for start, end in data_extents(mf, after + 1, limit):
        at = max(start, after + 1) + 4
        while True:
            # The magic code lies wholly in the extent (a hole reads as zeros), and
            # the scan reads no further than the data: see data_extents.
            hit = buf.find(_MAGIC, at, end)
            if hit < 0:
                break
            candidate = hit - 4
            result: ScanTuple = _records.scan(buf, candidate, end, base, check_crc, newer_than_ms)
            if result[5] > 0:
                return candidate, result
            at = hit + 1
    return None


def data_length(mf: MappedFile, start: int, end: int) -> int:
    """Bytes from ``start`` to the last non-zero byte before ``end`` (data extents only)."""
    last = start
    for s, e in data_extents(mf, start, end):
        used = mf.dirty_bytes_from(s, e)
        if used:
            last = s + used
    return last - start


def read_header(mf: MappedFile, pos: int, limit: int) -> tuple[str, int, int] | None:
    """(topic, queue id, queue offset) of the damaged record at ``pos`` if its header
    still reads as a record that sits there; None otherwise."""
    buf = mf.buffer
    if pos + PREFIX.size + 8 > limit:
        return None
    _, magic, _, queue_id, _, queue_offset, phys, sys_flag, _ = PREFIX.unpack_from(buf, pos)
    if magic != MESSAGE_MAGIC_CODE or phys != mf.file_from_offset + pos or queue_id < 0:
        return None
    if queue_offset < 0:
        return None
    p = body_length_at(pos, sys_flag)
    if p + 4 > limit:
        return None
    (body_len,) = _INT.unpack_from(buf, p)
    p += 4 + body_len
    if body_len < 0 or p + 1 > limit:
        return None
    topic_len = buf[p]
    if topic_len == 0 or topic_len > MAX_TOPIC_LENGTH or p + 1 + topic_len > limit:
        return None
    try:
        topic = bytes(buf[p + 1 : p + 1 + topic_len]).decode("utf-8")
    except UnicodeDecodeError:
        return None
    return topic, queue_id, queue_offset


def quarantine(directory: Path, offset: int, length: int, data: bytes) -> Path:
    """Copy a damaged span's bytes to ``directory`` (created), durably; returns the file.

    ``data`` may be shorter than ``length``: trailing zeros are not kept.
    """
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"commitlog-{offset:020d}-{length}.bin"
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return path


def tombstone(
    offset: int, length: int, *, store_host: bytes, store_timestamp_ms: int, note: str
) -> bytes:
    """A record of exactly ``length`` bytes at CommitLog ``offset`` that indexes nothing:
    rolled back, a zero body to fill the length, topic :data:`TOMBSTONE_TOPIC` and
    ``note`` (the quarantine file) as a property - or, in a span too short for
    those, no topic and no property. Raises ValueError when ``length`` is too
    short for any record (a span always holds one: it starts where a record
    started and ends where another starts)."""
    for topic, properties in (
        (TOMBSTONE_TOPIC, {PROPERTY_QUARANTINE: note}),
        (TOMBSTONE_TOPIC, {}),
        ("", {}),
    ):
        message = Message(
            topic=topic,
            properties=properties,
            sys_flag=TRANSACTION_ROLLBACK_TYPE,
            born_timestamp_ms=store_timestamp_ms,
        )
        overhead = EncodedMessage(message, store_host=store_host).size
        if overhead <= length:
            message = dataclasses.replace(message, body=bytes(length - overhead))
            record = EncodedMessage(message, store_host=store_host).encode(
                0, offset, store_timestamp_ms
            )
            assert len(record) == length
            return record
    raise ValueError(f"a span of {length} bytes is too short for any record")


def is_tombstone(topic: str, sys_flag: int) -> bool:
    """Whether a stored record is a tombstone written by recovery (rolled back, of
    :data:`TOMBSTONE_TOPIC` or of no topic, which no sent record has)."""
    return transaction_type(sys_flag) == TRANSACTION_ROLLBACK_TYPE and topic in (
        TOMBSTONE_TOPIC,
        "",
    )
