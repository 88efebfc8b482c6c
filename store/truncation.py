"""Durable truncation of the CommitLog (RocketMQ #10666): the ``<root>/truncate``
marker and the cut itself.

A slave whose log runs past the consistent point with its master (records of a
deposed master's term) cuts it there before it copies on. The cut must
survive a crash at any point, or a restart would recover the stale tail and
ack offsets the master never wrote. So the cut point is recorded first::

    offset  size  field
    ------  ----  -----------------------------------------------
    0       4     magic       0x54524E43 ("TRNC")
    4       8     offset      the CommitLog offset cut at
    12      4     crc32       zlib.crc32 of bytes 0..12

written to ``truncate.tmp``, fsynced, renamed, the directory fsynced; then the
CommitLog's tail is zeroed and fsynced and later files deleted, ConsumeQueue
units and index entries at or past the offset dropped, the queue manifest,
checkpoint and epoch file rewritten - and only then is the marker removed. A
start that finds the marker does the cut again before recovery (every step
is idempotent). A marker that does not decode is an error naming its path:
the store cannot know where the cut was to be.
"""

from __future__ import annotations

import contextlib
import os
import struct
import zlib
from pathlib import Path

from basalt.common.record import RecordKind, check_record
from basalt.store.commitlog import CommitLog
from basalt.store.epoch_file import write_durably
from basalt.store.errors import CorruptFileError
from basalt.store.files import fsync_dir
from basalt.store.mapped_file import MappedFile

TRUNCATE_MARKER_NAME = "truncate"
TRUNCATE_MAGIC = 0x54524E43
_MARKER = struct.Struct(
    ">"
    "I"  # magic
    "q"  # offset
)
_CRC = struct.Struct(">I")


def encode_marker(offset: int) -> bytes:
    head = _MARKER.pack(TRUNCATE_MAGIC, offset)
    return head + _CRC.pack(zlib.crc32(head))


def decode_marker(data: bytes, path: Path) -> int:
    """The offset a marker's bytes record; CorruptFileError naming ``path`` otherwise."""
    if len(data) != _MARKER.size + _CRC.size:
        raise CorruptFileError(path, f"truncate marker of {len(data)} bytes")
    magic, offset = _MARKER.unpack_from(data, 0)
    (crc,) = _CRC.unpack_from(data, _MARKER.size)
    if magic != TRUNCATE_MAGIC or crc != zlib.crc32(data[: _MARKER.size]) or offset < 0:
        raise CorruptFileError(path, "truncate marker does not check out (magic or CRC)")
    return int(offset)


def read_marker(path: Path) -> int | None:
    """The offset of a leftover marker, None when there is none."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    return decode_marker(data, path)


def write_marker(path: Path, offset: int) -> None:
    write_durably(path, encode_marker(offset))


def remove_marker(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    fsync_dir(path.parent)


def check_cut_point(commitlog: CommitLog, offset: int) -> str | None:
    """Why ``offset`` is no place to cut the CommitLog, or None: it must lie in
    ``[min offset, max offset]`` and be the max offset, a file's start, or where a
    record (its PHYSICALOFFSET says so) or an end-of-file blank starts."""
    if offset < commitlog.min_offset or offset > commitlog.max_offset:
        return f"outside the commitlog [{commitlog.min_offset}, {commitlog.max_offset}]"
    if offset == commitlog.max_offset or offset % commitlog.mapped_file_size == 0:
        return None
    mf = commitlog.files.find_by_offset(offset)
    if mf is None:
        return "no commitlog file holds it"
    rel = offset - mf.file_from_offset
    info = check_record(mf.buffer, rel, mf.wrote_position, check_crc=False, expected_offset=offset)
    if info.kind is RecordKind.MESSAGE:
        return None
    if info.kind is RecordKind.BLANK and info.size == mf.file_size - rel:
        return None
    if info.kind is RecordKind.BLANK:
        return "a blank that does not end its file"
    return f"no record starts there ({info.reason or info.kind.value})"


def cut_commitlog(commitlog: CommitLog, offset: int) -> int:
    """Zero the CommitLog from ``offset`` on and fsync it; delete the files wholly
    past it and fsync the directory. Returns the bytes cleared in the file
    holding ``offset``. Idempotent (a redo after a crash)."""
    files = commitlog.files
    keep: list[MappedFile] = []
    cleared = 0
    doomed: list[MappedFile] = []
    for mf in files.files:
        if mf.file_from_offset > offset:
            doomed.append(mf)
            continue
        if mf.file_end_offset > offset:
            pos = offset - mf.file_from_offset
            # The whole rest of the file: a stale record anywhere past the cut
            # could look valid to a later recovery.
            cleared = mf.zero_tail(pos)
            os.fdatasync(mf.fd)
            mf.wrote_position = mf.flushed_position = pos
        keep.append(mf)
    files.files = keep
    for mf in doomed:
        mf.destroy()
    if doomed:
        fsync_dir(files.directory)
    files.flushed_where = min(files.flushed_where, offset)
    return cleared
