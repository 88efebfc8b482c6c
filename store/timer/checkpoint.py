"""The timer's checkpoint, ``<root>/config/timercheck`` (RocketMQ 5's
TimerCheckpoint, plus what Basalt keeps with it), and the progress a master
hands its slaves.

One binary file, replaced atomically (store.files.write_atomically), crc32 at
the end. It holds where the timer stands - the timer topic's queue offset
enqueued up to, the next tick to scan, the TimerLog's end - and what goes
with that point: pending per topic, pending per bucket of ticks (so scans and
status skip empty stretches of the wheel), the last tick filed per TimerLog
file (a file is deleted once scanned past), and the wheel slots changed
since the previous checkpoint (written to the wheel only after this file:
a crash in between replays them from here, so the wheel always matches a
checkpoint).
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field

MAGIC = b"BTMR"
VERSION = 2
#: Version 1 (no open slot's handled entries) is still read.
_READABLE = (1, 2)
_HEAD = struct.Struct(">4sHIIqqqqqq")
_COUNT = struct.Struct(">I")
_PAIR = struct.Struct(">qq")
_SLOT = struct.Struct(">qqqi")
_POS = struct.Struct(">q")
_NAME = struct.Struct(">H")
_PROGRESS = struct.Struct(">4sqq")
_PROGRESS_MAGIC = b"BTP1"


@dataclass
class TimerState:
    """Everything the checkpoint holds (see the module's doc). ``master_cap`` is
    -1 unless a slave adopted a master's progress: then its enqueue stops there."""

    precision_ms: int
    ring_slots: int
    enqueue_offset: int = 0
    scan_tick: int = 0
    log_end: int = 0
    skip_below: int = 0
    master_cap: int = -1
    #: mapped_file_size_timer_log when written (store check maps positions with it).
    log_file_size: int = 0
    counts: dict[str, int] = field(default_factory=dict)
    buckets: dict[int, int] = field(default_factory=dict)
    files: dict[int, int] = field(default_factory=dict)
    slots: list[tuple[int, int, int, int]] = field(default_factory=list)
    #: The TimerLog positions of the entries of slot ``scan_tick`` (the open
    #: one) already handled: a restart does not deliver them again.
    open_done: list[int] = field(default_factory=list)


def encode_state(state: TimerState) -> bytes:
    parts = [
        _HEAD.pack(
            MAGIC,
            VERSION,
            state.precision_ms,
            state.ring_slots,
            state.enqueue_offset,
            state.scan_tick,
            state.log_end,
            state.skip_below,
            state.master_cap,
            state.log_file_size,
        ),
        _COUNT.pack(len(state.counts)),
    ]
    for topic, count in sorted(state.counts.items()):
        name = topic.encode("utf-8")
        parts += (_NAME.pack(len(name)), name, count.to_bytes(8, "big", signed=True))
    for table in (state.buckets, state.files):
        parts.append(_COUNT.pack(len(table)))
        parts += [_PAIR.pack(k, v) for k, v in sorted(table.items())]
    parts.append(_COUNT.pack(len(state.slots)))
    parts += [_SLOT.pack(*slot) for slot in state.slots]
    parts.append(_COUNT.pack(len(state.open_done)))
    parts += [_POS.pack(p) for p in state.open_done]
    body = b"".join(parts)
    return body + zlib.crc32(body).to_bytes(4, "big")


def decode_state(data: bytes) -> TimerState:
    """Raises ValueError when ``data`` is not a whole, undamaged checkpoint."""
    if len(data) < _HEAD.size + 4 or zlib.crc32(data[:-4]) != int.from_bytes(data[-4:], "big"):
        raise ValueError("timer checkpoint is truncated or damaged (crc)")
    magic, version, precision, ring, enq, scan, end, skip, cap, fsize = _HEAD.unpack_from(data)
    if magic != MAGIC or version not in _READABLE:
        raise ValueError(f"not a timer checkpoint (magic {magic!r}, version {version})")
    state = TimerState(precision, ring, enq, scan, end, skip, cap, fsize)
    pos = _HEAD.size
    (n,) = _COUNT.unpack_from(data, pos)
    pos += 4
    for _ in range(n):
        (length,) = _NAME.unpack_from(data, pos)
        pos += 2
        topic = data[pos : pos + length].decode("utf-8")
        pos += length
        state.counts[topic] = int.from_bytes(data[pos : pos + 8], "big", signed=True)
        pos += 8
    for table in (state.buckets, state.files):
        (n,) = _COUNT.unpack_from(data, pos)
        pos += 4
        for k, v in _PAIR.iter_unpack(data[pos : pos + n * _PAIR.size]):
            table[k] = v
        pos += n * _PAIR.size
    (n,) = _COUNT.unpack_from(data, pos)
    pos += 4
    state.slots = list(_SLOT.iter_unpack(data[pos : pos + n * _SLOT.size]))
    pos += n * _SLOT.size
    if version >= 2:
        (n,) = _COUNT.unpack_from(data, pos)
        pos += 4
        state.open_done = [p for (p,) in _POS.iter_unpack(data[pos : pos + n * _POS.size])]
        pos += n * _POS.size
    if pos != len(data) - 4:
        raise ValueError("timer checkpoint has trailing bytes")
    return state


def encode_progress(scan_ms: int, enqueue_offset: int) -> bytes:
    """A master's timer progress for its slaves (MessageStore.timer_progress):
    what it has scanned up to (ms) and the timer topic offset it enqueued to."""
    return _PROGRESS.pack(_PROGRESS_MAGIC, scan_ms, enqueue_offset)


def decode_progress(data: bytes) -> tuple[int, int]:
    """(scan_ms, enqueue_offset); ValueError when ``data`` is not progress."""
    if len(data) != _PROGRESS.size:
        raise ValueError(f"timer progress is {_PROGRESS.size} bytes, not {len(data)}")
    magic, scan_ms, offset = _PROGRESS.unpack(data)
    if magic != _PROGRESS_MAGIC or scan_ms < 0 or offset < 0:
        raise ValueError("not timer progress")
    return scan_ms, offset


__all__ = ["TimerState", "decode_progress", "decode_state", "encode_progress", "encode_state"]
