"""The queue manifest: every ConsumeQueue's max offset, so a start can tell a lost
queue from one never written.

``<root>/config/consumeQueueManifest.json``. A ConsumeQueue is derived data,
rebuilt from the CommitLog when damaged, but a queue whose whole directory is
gone looks like a queue never written, and a queue whose records left the
CommitLog (a deleted CommitLog file, expiry) cannot be rebuilt at all: without
a record of its offsets, the next send would get queue offset 0 again. The
manifest is that record. Recovery compares it with the queues it loaded: a
queue it lists that is missing, or that ends before the offset it lists, is
rebuilt from the CommitLog, and a queue the CommitLog no longer holds keeps
its offsets (min = max = the offset listed), so no offset is issued twice
(:mod:`basalt.store.recovery`).

The file is JSON (``jq`` reads it), one line, with a checksum over the
``queues`` value::

    {"version":1,"crc32":"dbeacd0c","queues":{"TopicTest":{"0":750,"1":748}}}

=======  ==================================================================
key      meaning
=======  ==================================================================
version  1
crc32    CRC32 (zlib's) of the bytes of the ``queues`` value as written, 8
         lowercase hex digits; the text before the value has a fixed length,
         so its bytes run from there to the last closing brace
queues   topic → {queue id (a JSON string) → one past the queue's last
         offset}; queues with no offset taken (max 0) are left out
=======  ==================================================================

When it is written: by the ConsumeQueue flusher after a flush, at most every
:data:`MANIFEST_INTERVAL_MS` and only when a queue's max offset changed, and
at a clean shutdown (the last flush). The maxima are read *before* the flush,
so the manifest never vouches for units that flush did not make durable. It
is written whole to ``.tmp``, fsynced, renamed over the old one and its folder
fsynced (:func:`basalt.store.files.write_atomically`): a crash leaves the old
manifest or the new one, and either is a lower bound of every queue's max
offset. A queue created after the last write is not in it (after a crash, a
lost directory of such a queue is not detected).

Damage never stops a start: a manifest that is missing, unreadable, not
JSON, of another version, failing its CRC or listing what no queue can have
(an empty topic, a negative queue id, an offset that is not a positive
integer below 2^63 / 20) is ignored (logged; recovery then
runs as without one) and rewritten by the next flush round.

Cost, measured over 40,000 queues (a 390 KB file) on the 2-core VM: at start
one read and ``json.loads`` (13-19 ms with the checks) and a dictionary lookup
per entry (~14 ms, :meth:`ConsumeQueueTable.not_reaching`), no system call
per queue; a clean restart writes nothing. While running, every 10 s at most,
each queue's max read from memory (~20 ms) and, when one changed, an encode
and an fsync'ed write (~30 ms), on the flusher's thread.
"""

from __future__ import annotations

import enum
import json
import logging
import re
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from basalt.store.config import CQ_STORE_UNIT_SIZE
from basalt.store.errors import StoreError
from basalt.store.files import write_atomically

log = logging.getLogger(__name__)

#: The manifest's name in the store's ``config/`` folder.
MANIFEST_NAME = "consumeQueueManifest.json"
VERSION = 1
#: The flusher writes a changed manifest at most this often (and at a clean stop).
MANIFEST_INTERVAL_MS = 10_000

#: Everything before the ``queues`` value is these, with the CRC's 8 hex digits between.
_HEADER_START = b'{"version":%d,"crc32":"' % VERSION
_HEADER_END = b'","queues":'
_HEADER_LEN = len(_HEADER_START) + 8 + len(_HEADER_END)
_HEADER_RE = re.compile(re.escape(_HEADER_START) + rb"([0-9a-f]{8})" + re.escape(_HEADER_END))

#: The largest queue id and max offset a manifest may list: a unit's byte position
#: (offset × 20) is a signed 64-bit number, a queue id a signed 32-bit one.
MAX_QUEUE_ID = (1 << 31) - 1
MAX_QUEUE_OFFSET = ((1 << 63) - 1) // CQ_STORE_UNIT_SIZE

#: (topic, queue id) → one past the queue's last offset.
QueueMaxima = dict[tuple[str, int], int]


def manifest_path(root: Path) -> Path:
    """Where the manifest of the store rooted at ``root`` lives."""
    return root / "config" / MANIFEST_NAME


def encode_manifest(maxima: Mapping[tuple[str, int], int]) -> bytes:
    """The manifest's bytes for ``maxima``; entries of 0 are left out. Topics and
    queue ids are sorted, so equal tables give equal bytes."""
    table: dict[str, dict[str, int]] = {}
    for (topic, queue_id), max_offset in sorted(maxima.items()):
        if max_offset > 0:
            table.setdefault(topic, {})[str(queue_id)] = max_offset
    body = json.dumps(table, separators=(",", ":"), ensure_ascii=False).encode()
    crc = f"{zlib.crc32(body):08x}".encode()
    return _HEADER_START + crc + _HEADER_END + body + b"}\n"


class ManifestDamage(StoreError, ValueError):
    """The manifest's bytes are not a manifest: the message says why. Raised by
    :func:`decode_manifest` only; :meth:`QueueManifest.load` turns it into a
    DAMAGED load, never a refusal to start."""


def decode_manifest(data: bytes) -> QueueMaxima:
    """The table of a manifest's bytes; raises :class:`ManifestDamage` when they are
    not one whole, CRC-valid manifest of this version."""
    text = data.rstrip(b"\n")
    header = _HEADER_RE.fullmatch(text[:_HEADER_LEN])
    if header is None or not text.endswith(b"}"):
        raise ManifestDamage("not a version 1 queue manifest (its header or end is damaged)")
    body = text[_HEADER_LEN:-1]
    crc = int(header[1], 16)
    if zlib.crc32(body) != crc:
        raise ManifestDamage(f"crc32 mismatch: {zlib.crc32(body):08x}, its header says {crc:08x}")
    try:
        table = json.loads(body)
        maxima = {
            (topic, int(queue_id)): max_offset
            for topic, queues in table.items()
            for queue_id, max_offset in queues.items()
        }
    except (ValueError, TypeError, AttributeError, RecursionError) as e:
        raise ManifestDamage(f"not a table of queue offsets: {e}") from None  # not ours
    for (topic, queue_id), max_offset in maxima.items():
        if not (
            isinstance(topic, str)
            and topic
            and 0 <= queue_id <= MAX_QUEUE_ID
            and type(max_offset) is int
            and 0 < max_offset <= MAX_QUEUE_OFFSET
        ):
            raise ManifestDamage(f"not a queue's max offset: {topic!r}/{queue_id}: {max_offset!r}")
    return maxima


class ManifestStatus(enum.Enum):
    """How :meth:`QueueManifest.load` found the file."""

    LOADED = "loaded"
    #: No manifest: a new store, or one written before manifests.
    MISSING = "missing"
    #: Unreadable or damaged: ignored, rewritten by the next flush round.
    DAMAGED = "damaged"


@dataclass(frozen=True, slots=True)
class ManifestLoad:
    """What the start found in the manifest (part of the RecoveryReport)."""

    status: ManifestStatus
    #: The queues' max offsets it listed (empty unless LOADED).
    maxima: QueueMaxima = field(default_factory=dict)
    #: Why it was damaged.
    problem: str = ""

    def describe(self) -> str:
        if self.status is ManifestStatus.LOADED:
            return f"queue manifest: {len(self.maxima)} queues"
        if self.status is ManifestStatus.MISSING:
            return "queue manifest: none"
        return f"queue manifest: damaged ({self.problem}), ignored"


def read_manifest(path: Path) -> ManifestLoad:
    """How the manifest at ``path`` reads: MISSING, DAMAGED (unreadable, or
    :func:`decode_manifest` refused it, with why) or LOADED. Never raises, never
    logs, writes nothing: a start (:meth:`QueueManifest.load`) and ``basalt store
    check`` judge it by this one rule."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return ManifestLoad(ManifestStatus.MISSING)
    except OSError as e:  # a folder in its place, EIO, EACCES
        return ManifestLoad(ManifestStatus.DAMAGED, problem=f"unreadable: {e}")
    try:
        return ManifestLoad(ManifestStatus.LOADED, decode_manifest(data))
    except ManifestDamage as e:
        return ManifestLoad(ManifestStatus.DAMAGED, problem=str(e))


class QueueManifest:
    """The manifest file of one store root: loaded once at start, then written
    by the ConsumeQueue flusher.

    Concurrency: :meth:`load` before the flusher starts; :meth:`write_if_due`
    from the flusher's thread only (and the stop's last flush, after it ended).
    """

    def __init__(self, path: Path, *, interval_ms: int = MANIFEST_INTERVAL_MS) -> None:
        self.path = path
        self.interval_ms = interval_ms
        #: What the file holds now, as far as this process knows (None: unknown).
        self._written: QueueMaxima | None = None
        self._last_write_ms: int | None = None
        #: Manifests written since construction (tests, runtime info).
        self.writes = 0

    def load(self) -> ManifestLoad:
        """Read the manifest (:func:`read_manifest`); never raises for a missing or
        damaged file (logged)."""
        found = read_manifest(self.path)
        if found.status is ManifestStatus.MISSING:
            log.info("no queue manifest %s: lost queues are not detected this start", self.path)
        elif found.status is ManifestStatus.DAMAGED:
            log.error(
                "queue manifest %s ignored: %s; lost queues cannot be detected this start, "
                "and the manifest is written again by the next flush",
                self.path, found.problem,
            )  # fmt: skip
        else:
            self._written = found.maxima
        return found

    def due(self, now_ms: int) -> bool:
        """Whether the interval since the last write has passed (or none was made)."""
        return self._last_write_ms is None or now_ms - self._last_write_ms >= self.interval_ms

    def write_if_due(
        self, maxima: Iterable[tuple[tuple[str, int], int]], now_ms: int, *, final: bool = False
    ) -> bool:
        """Write ``maxima`` (read before the flush that made them durable) when it
        differs from what the file holds and the interval has passed, or with
        ``final`` (a stop's last flush) whenever it differs. Returns whether it
        wrote. Raises OSError when the write fails (the file is then the old one,
        or gone, both safe: the caller logs and tries again next round)."""
        if not final and not self.due(now_ms):
            return False
        table = {key: max_offset for key, max_offset in maxima if max_offset > 0}
        if table == self._written:
            self._last_write_ms = now_ms
            return False
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._written = None  # unknown until the rename is durable
        write_atomically(self.path, encode_manifest(table))
        self._written = table
        self._last_write_ms = now_ms
        self.writes += 1
        return True
