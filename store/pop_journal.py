"""The pop journal's records: the on-disk format of :mod:`basalt.store.pop`'s state.

``<root>/pop/journal``: records appended in the order of the changes, replayed
at start. Each record, big-endian:

======  ====  ============  =================================================
Offset  Size  Field         Meaning
======  ====  ============  =================================================
0       4     TOTALSIZE     the record's length, this field included
4       4     CRC32         zlib.crc32 of bytes 8 .. TOTALSIZE
8       1     KIND          1 INFLIGHT, 2 ACK, 3 CURSOR, 4 RESET
9       4     QUEUEID       the queue (RESET: -1, every queue)
13      8     QUEUEOFFSET   INFLIGHT/ACK: the message; CURSOR: the cursor
21      8     VISIBLEAT     INFLIGHT: when it is delivered again, Unix ms
29      4     ATTEMPTS      INFLIGHT: deliveries so far (1 = the first)
33      8     NONCE         INFLIGHT: the delivery's nonce
41      2     GROUPLEN      length of GROUP
43      2     TOPICLEN      length of TOPIC
45      ..    GROUP, TOPIC  UTF-8
======  ====  ============  =================================================

INFLIGHT sets an entry (a delivery, or a changed invisible time) and moves the
cursor past it; ACK removes one; CURSOR moves the cursor (past messages a
filter skipped, or to an expired queue's min offset); RESET drops a (group,
topic)'s tables. :func:`decode_records` stops at the first record that is
short, out of bounds or fails its CRC; replay and compaction are
:class:`basalt.store.pop.PopStore`'s.
"""

from __future__ import annotations

import enum
import os
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path

JOURNAL_NAME = "journal"


def not_a_journal(directory: Path) -> list[tuple[Path, str, str]]:
    """What stands where the journal folder ``directory`` or its journal should be but
    is not one: (path, quarantine name, what it should be) for a folder that is no
    folder (a file, a dangling link) and a journal that is no regular file. A
    start sets each aside; ``store check`` reports each. Only the folder is listed
    when it is not one (the journal cannot be inside it).
    """
    # lexists: a dangling link is "there" (mkdir would fail on it) but not a dir.
    if os.path.lexists(directory) and not os.path.isdir(directory):
        return [(directory, "pop-folder", "folder")]
    journal = directory / JOURNAL_NAME
    if os.path.lexists(journal) and not os.path.isfile(journal):
        return [(journal, "pop-journal", "file")]
    return []


#: The fixed part of a journal record; GROUP and TOPIC follow.
RECORD = struct.Struct(
    ">"
    "i"  # TOTALSIZE
    "I"  # CRC32
    "B"  # KIND
    "i"  # QUEUEID
    "q"  # QUEUEOFFSET
    "q"  # VISIBLEAT
    "i"  # ATTEMPTS
    "q"  # NONCE
    "H"  # GROUPLEN
    "H"  # TOPICLEN
)
#: Bytes before the CRC'd part: TOTALSIZE and CRC32.
_CRC_FROM = struct.calcsize(">iI")
#: A record is never larger than this (two names of at most 64 KiB each).
MAX_RECORD_SIZE = RECORD.size + 2 * 0xFFFF


class Kind(enum.IntEnum):
    """A journal record's KIND."""

    INFLIGHT = 1
    ACK = 2
    CURSOR = 3
    RESET = 4


def encode_record(
    kind: Kind,
    group: str,
    topic: str,
    queue_id: int,
    queue_offset: int = 0,
    visible_at_ms: int = 0,
    attempts: int = 0,
    nonce: int = 0,
) -> bytes:
    """One journal record (see the module docstring)."""
    g, t = group.encode(), topic.encode()
    size = RECORD.size + len(g) + len(t)
    buf = bytearray(size)
    RECORD.pack_into(
        buf, 0, size, 0, kind, queue_id, queue_offset, visible_at_ms, attempts, nonce, len(g),
        len(t),
    )  # fmt: skip
    buf[RECORD.size :] = g + t
    struct.pack_into(">I", buf, 4, zlib.crc32(memoryview(buf)[_CRC_FROM:]))
    return bytes(buf)


def decode_records(
    data: bytes,
) -> Iterator[tuple[int, tuple[Kind, str, str, int, int, int, int, int]]]:
    """Each whole, CRC-valid record from the start of ``data``, with the offset
    past it; stops at the first record that is not."""
    pos = 0
    while pos + RECORD.size <= len(data):
        size, crc, kind, queue_id, offset, visible, attempts, nonce, glen, tlen = (
            RECORD.unpack_from(data, pos)
        )
        if not RECORD.size <= size <= MAX_RECORD_SIZE or size != RECORD.size + glen + tlen:
            return
        if pos + size > len(data) or zlib.crc32(data[pos + _CRC_FROM : pos + size]) != crc:
            return
        try:
            kind_ = Kind(kind)
            names = data[pos + RECORD.size : pos + size]
            group, topic = names[:glen].decode(), names[glen:].decode()
        except (ValueError, UnicodeDecodeError):
            return
        pos += size
        yield pos, (kind_, group, topic, queue_id, offset, visible, attempts, nonce)
