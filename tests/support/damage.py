"""The one catalogue of ways to damage a stopped store's root.

:func:`build_store` writes a small store (several CommitLog and ConsumeQueue
files, a few topics × queues, committed consumer offsets, a pop group with
messages in flight), stops it cleanly and returns its :class:`Layout`: where
every record sits and where each of its fields starts. Every body encodes its
identity (``b"topic|queue|queue_offset|seq"`` plus padding) and every record
carries the same string as its key, so a reader can tell a wrong record from a
right one without trusting the store.

:data:`CATALOGUE` holds the damage: each :class:`Damage` changes a copy of
that root behind the store's back and returns a :class:`Harm`, what the
contract of issues 14 and 28 allows the restart to lose (the records the
damaged bytes held, nothing else; never a queue offset issued twice) and where
the damage is. Used by
``tests/reliability/`` (every entry, one rng seed) and
``benchmarks/torture.py`` (entries and positions at random over many seeds).

The functions take an ``rng`` so the benchmark can pick other records and
bytes; given the same rng state they damage the same bytes. They import no
pytest: the benchmark uses them outside a test run.
"""

from __future__ import annotations

import os
import random
import shutil
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from basalt.common.message import BORNHOST_V6_FLAG, STOREHOSTADDRESS_V6_FLAG
from basalt.common.record import PREFIX, SIZE_AND_MAGIC, host_length
from basalt.store import Message, MessageStore, MessageStoreConfig
from basalt.store.config import CQ_STORE_UNIT_SIZE
from basalt.store.consistency import CheckReport
from basalt.store.consumer_offsets import consumer_offset_path
from basalt.store.mapped_file import file_name
from tests.support.stores import small_store_config

#: (topic, queue id, queue offset): one record's identity in its queue.
RecordKey = tuple[str, int, int]
QueueKey = tuple[str, int]

#: Small files so a few hundred records fill several of each.
COMMITLOG_FILE = 16 * 1024
CQ_UNITS_PER_FILE = 32
CQ_FILE = CQ_UNITS_PER_FILE * CQ_STORE_UNIT_SIZE
PAGE = 4096
TOPICS = ("Alpha", "Beta", "%RETRY%g")
QUEUES = 2
#: Records per queue: 6 queues × 70 = 420 records, ~7 CommitLog files, 3 ConsumeQueue
#: files a queue (so one can be deleted between two others).
PER_QUEUE = 70
GROUP = "G"
#: A RocketMQ 5 (pop) group: it popped POPPED messages of POP_QUEUE and acked the
#: first POP_ACKED; the rest are in flight, invisible for an hour.
POP_GROUP = "PopG"
POP_QUEUE: tuple[str, int] = ("Alpha", 0)
POPPED = 8
POP_ACKED = 4
POP_INVISIBLE_MS = 3_600_000


def store_config(root: Path, **overrides: Any) -> MessageStoreConfig:
    """The configuration every catalogue store is written and reopened with."""
    values: dict[str, Any] = {
        "mapped_file_size_commit_log": COMMITLOG_FILE,
        "mapped_file_size_consume_queue": CQ_FILE,
        **overrides,
    }
    return small_store_config(root, **values)


def body_of(key: RecordKey, seq: int) -> bytes:
    """A body that names its record, padded to a size that varies with ``seq``."""
    topic, queue_id, queue_offset = key
    ident = f"{topic}|{queue_id}|{queue_offset}|{seq}".encode()
    return ident + b"." * (seq * 37 % 200)


def key_of(key: RecordKey) -> str:
    """The KEYS property every catalogue record carries: its identity."""
    return "{}|{}|{}".format(*key)


#: Field name -> (start within the record, length), for the fixed-position fields;
#: the variable ones (STORETIMESTAMP onwards) are found per record.
_PREFIX_FIELDS = {
    "TOTALSIZE": (0, 4),
    "MAGIC": (4, 4),
    "BODYCRC": (8, 4),
    "QUEUEID": (12, 4),
    "FLAG": (16, 4),
    "QUEUEOFFSET": (20, 8),
    "PHYSICALOFFSET": (28, 8),
    "SYSFLAG": (36, 4),
    "BORNTIMESTAMP": (40, 8),
}


@dataclass(frozen=True, slots=True)
class Placed:
    """One record of the built store and where its bytes are."""

    key: RecordKey
    body: bytes
    physical_offset: int
    size: int
    #: Field name -> (absolute CommitLog offset, length): every field of the layout.
    fields: dict[str, tuple[int, int]]

    @property
    def end(self) -> int:
        return self.physical_offset + self.size


@dataclass(frozen=True, slots=True)
class Layout:
    """A cleanly stopped catalogue store: its records in CommitLog order, each
    queue's max offset, the consumer offsets committed. Paths are relative to
    whichever copy of the root a function is given."""

    records: tuple[Placed, ...]
    queue_max: dict[QueueKey, int]
    committed: dict[QueueKey, int]
    commitlog_files: int
    #: POP_GROUP's queue offsets in flight on POP_QUEUE (popped, not acked).
    pop_in_flight: tuple[int, ...] = ()

    def file_of(self, physical_offset: int) -> tuple[str, int]:
        """The CommitLog file name holding ``physical_offset`` and the position in it."""
        start = physical_offset // COMMITLOG_FILE * COMMITLOG_FILE
        return file_name(start), physical_offset - start

    def in_file(self, index: int) -> list[Placed]:
        """The records of the ``index``-th CommitLog file."""
        lo, hi = index * COMMITLOG_FILE, (index + 1) * COMMITLOG_FILE
        return [r for r in self.records if lo <= r.physical_offset < hi]

    def overlapping(self, start: int, end: int) -> list[Placed]:
        """Records with a byte in ``[start, end)``."""
        return [r for r in self.records if r.physical_offset < end and r.end > start]


def _record_fields(data: bytes, pos: int, phys: int) -> dict[str, tuple[int, int]]:
    """Every field of the record at ``pos`` of ``data`` (which sits at ``phys``)."""
    fields = {name: (phys + start, length) for name, (start, length) in _PREFIX_FIELDS.items()}
    sys_flag = int.from_bytes(data[pos + 36 : pos + 40], "big")
    p = PREFIX.size
    born = host_length(sys_flag, BORNHOST_V6_FLAG)
    fields["BORNHOST"] = (phys + p, born)
    p += born
    fields["STORETIMESTAMP"] = (phys + p, 8)
    p += 8
    store = host_length(sys_flag, STOREHOSTADDRESS_V6_FLAG)
    fields["STOREHOST"] = (phys + p, store)
    p += store
    fields["RECONSUMETIMES"] = (phys + p, 4)
    p += 4
    fields["PREPAREDTXOFFSET"] = (phys + p, 8)
    p += 8
    body_len = int.from_bytes(data[pos + p : pos + p + 4], "big")
    fields["BODYLEN"] = (phys + p, 4)
    p += 4
    fields["BODY"] = (phys + p, body_len)
    p += body_len
    topic_len = data[pos + p]
    fields["TOPICLEN"] = (phys + p, 1)
    fields["TOPIC"] = (phys + p + 1, topic_len)
    p += 1 + topic_len
    props_len = int.from_bytes(data[pos + p : pos + p + 2], "big")
    fields["PROPLEN"] = (phys + p, 2)
    fields["PROPERTIES"] = (phys + p + 2, props_len)
    return fields


def build_store(root: Path, *, per_queue: int = PER_QUEUE) -> Layout:
    """Write the catalogue store at ``root``, stop it cleanly and return its layout.

    Sends round-robin over TOPICS × QUEUES, one message a send, so queues
    interleave in the CommitLog; commits offset ``per_queue // 2`` for
    GROUP on every queue; POP_GROUP pops POPPED messages of POP_QUEUE and
    acks the first POP_ACKED (its journal then holds messages in flight).
    Raises AssertionError when a send fails.
    """
    config = store_config(root)
    placed: dict[int, tuple[RecordKey, bytes]] = {}
    seq = 0
    with MessageStore(config) as store:
        for i in range(per_queue):
            for topic in TOPICS:
                for queue_id in range(QUEUES):
                    key: RecordKey = (topic, queue_id, i)
                    body = body_of(key, seq)
                    seq += 1
                    result = store.put_message(
                        Message(topic, body, queue_id=queue_id, keys=[key_of(key)], tags="t")
                    )
                    assert result.ok and result.queue_offsets == (i,), result
                    placed[result.physical_offsets[0]] = (key, body)
        committed = {(t, q): per_queue // 2 for t in TOPICS for q in range(QUEUES)}
        for (topic, queue_id), offset in committed.items():
            store.commit_offset(GROUP, topic, queue_id, offset)
        assert store.wait_dispatched()
        popped = store.pop.pop(
            POP_GROUP, *POP_QUEUE, POPPED, POP_INVISIBLE_MS, int(time.time() * 1000)
        )
        assert [m.queue_offset for m in popped] == list(range(POPPED))
        for m in popped[:POP_ACKED]:
            assert store.pop.ack(POP_GROUP, *POP_QUEUE, m.queue_offset, m.nonce).name == "OK"
    records = []
    files = sorted(config.commitlog_dir.iterdir())
    for index, path in enumerate(files):
        data = path.read_bytes()
        base = index * COMMITLOG_FILE
        for phys in sorted(p for p in placed if base <= p < base + COMMITLOG_FILE):
            pos = phys - base
            (size, _) = SIZE_AND_MAGIC.unpack_from(data, pos)
            key, body = placed[phys]
            records.append(Placed(key, body, phys, size, _record_fields(data, pos, phys)))
    assert len(records) == len(placed)
    queue_max = {(t, q): per_queue for t in TOPICS for q in range(QUEUES)}
    in_flight = tuple(range(POP_ACKED, POPPED))
    return Layout(tuple(records), queue_max, committed, len(files), in_flight)


def copy_root(source: Path, target: Path) -> None:
    """A fresh copy of a built root (the lock file is not held by a stopped store)."""
    shutil.copytree(source, target)


# -- what a damage may cost -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Harm:
    """What one damage may cost, and where it is.

    ``lost`` are the records whose bytes the damage touched: the restart may
    lose these and only these. ``commitlog_span`` is the damaged CommitLog
    range ``[start, end)`` the recovery report must list (None when the
    CommitLog is intact, or for a deleted file: nothing left to list or
    quarantine). ``quarantined``: the damaged bytes still exist, so recovery
    must have copied them to ``<root>/quarantine/``. ``offsets_kept``: the
    committed consumer offsets must all come back (false only when every
    copy of consumerOffset.json was damaged).

    ``undetected_span``: CommitLog damage a start does not look for (in a file
    older than the last three a clean start scans, RocketMQ's rule): its
    records may still read back from the engine as they now are (the engine
    serves stored bytes; every reader that decodes them checks their CRCs and
    skips them: tests/reliability/test_crc_on_read.py), every other record
    must be intact, and
    ``store check``, which reads the whole log, must report it and nothing
    else. ``pop_lost``: the pop journal was set aside, so POP_GROUP's
    messages in flight are delivered again.
    """

    lost: frozenset[RecordKey] = frozenset()
    commitlog_span: tuple[int, int] | None = None
    quarantined: bool = False
    offsets_kept: bool = True
    undetected_span: tuple[int, int] | None = None
    pop_lost: bool = False
    #: The start refuses the root (a CommitLog file longer than configured: which of
    #: its bytes are valid cannot be told); ``store check`` must call it inconsistent.
    refused: bool = False


#: Damage a copy of a built root; the rng picks records and bytes.
DamageFn = Callable[[Layout, Path, random.Random], Harm]


@dataclass(frozen=True, slots=True)
class Damage:
    """One catalogue entry: a name, the structure it damages, the function.

    With ``abort`` the root is also left as a crash leaves it (the ``abort``
    file present), so the restart runs abnormal recovery.
    """

    name: str
    target: str
    apply: DamageFn
    abort: bool = False

    def __call__(self, layout: Layout, root: Path, rng: random.Random) -> Harm:
        harm = self.apply(layout, root, rng)
        if self.abort:
            store_config(root).abort_path.touch()
        return harm


def _keys(records: Iterable[Placed]) -> frozenset[RecordKey]:
    return frozenset(r.key for r in records)


def _xor_byte(path: Path, pos: int) -> None:
    with path.open("r+b") as f:
        f.seek(pos)
        (b,) = f.read(1)
        f.seek(pos)
        f.write(bytes([b ^ 0xFF]))


def _middle_record(layout: Layout, rng: random.Random) -> Placed:
    """A record in the part of the log a clean restart scans (the last three files,
    RocketMQ's rule), neither the first of that part nor the log's last: its
    neighbours must survive. Older damage is seen at start only through a
    ConsumeQueue unit that points at it, and always by ``store check``."""
    first = max(0, layout.commitlog_files - 3) * COMMITLOG_FILE
    scanned = [r for r in layout.records if r.physical_offset >= first]
    return scanned[rng.randrange(1, len(scanned) - 1)]


def _commitlog(root: Path, name: str) -> Path:
    return store_config(root).commitlog_dir / name


# -- CommitLog ------------------------------------------------------------------------------


def _flip_field(field_name: str) -> DamageFn:
    """XOR one byte of ``field_name`` of a middle record with 0xFF."""

    def flip(layout: Layout, root: Path, rng: random.Random) -> Harm:
        victim = _middle_record(layout, rng)
        start, length = victim.fields[field_name]
        at = start + rng.randrange(length)
        name, pos = layout.file_of(at)
        _xor_byte(_commitlog(root, name), pos)
        return Harm(_keys([victim]), (victim.physical_offset, victim.end), quarantined=True)

    flip.__name__ = f"flip_{field_name.lower()}"
    return flip


def _zero_page(layout: Layout, root: Path, rng: random.Random) -> Harm:
    """Zero one 4 KiB page inside a middle CommitLog file (a lost page write)."""
    index = rng.randrange(1, layout.commitlog_files - 1)
    start = index * COMMITLOG_FILE + PAGE * rng.randrange(1, COMMITLOG_FILE // PAGE - 1)
    name, pos = layout.file_of(start)
    with _commitlog(root, name).open("r+b") as f:
        f.seek(pos)
        f.write(bytes(PAGE))
    hit = layout.overlapping(start, start + PAGE)
    span = (min(r.physical_offset for r in hit), max(r.end for r in hit))
    return Harm(_keys(hit), span, quarantined=True)


def _truncate_mid_record(layout: Layout, root: Path, rng: random.Random) -> Harm:
    """Cut a middle CommitLog file inside one of its records: that record and the
    rest of the file are gone."""
    index = rng.randrange(1, layout.commitlog_files - 1)
    in_file = layout.in_file(index)
    victim = in_file[rng.randrange(len(in_file) // 4, 3 * len(in_file) // 4)]
    cut = victim.physical_offset + victim.size // 2
    name, pos = layout.file_of(cut)
    os.truncate(_commitlog(root, name), pos)
    lost = [r for r in in_file if r.end > cut]
    return Harm(_keys(lost), (victim.physical_offset, (index + 1) * COMMITLOG_FILE))


def _truncate_last_file(layout: Layout, root: Path, rng: random.Random) -> Harm:
    """Cut the last CommitLog file between two records, half-way through its data."""
    index = layout.commitlog_files - 1
    in_file = layout.in_file(index)
    keep = len(in_file) // 2
    cut = in_file[keep].physical_offset
    name, pos = layout.file_of(cut)
    os.truncate(_commitlog(root, name), pos)
    return Harm(_keys(in_file[keep:]), (cut, (index + 1) * COMMITLOG_FILE))


def _delete_middle_file(layout: Layout, root: Path, rng: random.Random) -> Harm:
    """Delete one CommitLog file between the first and the last."""
    index = rng.randrange(1, layout.commitlog_files - 1)
    _commitlog(root, file_name(index * COMMITLOG_FILE)).unlink()
    return Harm(_keys(layout.in_file(index)))


def _garbage_past_end(layout: Layout, root: Path, rng: random.Random) -> Harm:
    """Random bytes after the last record, inside the last file (a torn tail)."""
    end = layout.records[-1].end
    name, pos = layout.file_of(end)
    length = min(PAGE, COMMITLOG_FILE - pos)
    with _commitlog(root, name).open("r+b") as f:
        f.seek(pos)
        f.write(rng.randbytes(length))
    return Harm(frozenset(), (end, end + length), quarantined=True)


def _flip_body_in_old_file(layout: Layout, root: Path, rng: random.Random) -> Harm:
    """XOR one byte of the body of a record in a CommitLog file older than the last
    three, which a clean start does not scan (issue 28 point 1's damage)."""
    scanned_from = (layout.commitlog_files - 3) * COMMITLOG_FILE
    old = [r for r in layout.records if r.end <= scanned_from]
    victim = old[rng.randrange(len(old))]
    start, length = victim.fields["BODY"]
    name, pos = layout.file_of(start + rng.randrange(length))
    _xor_byte(_commitlog(root, name), pos)
    return Harm(_keys([victim]), undetected_span=(victim.physical_offset, victim.end))


def _delete_every_file(layout: Layout, root: Path, rng: random.Random) -> Harm:
    """Delete every CommitLog file (a small store's whole log is one file): every
    record is lost, and no queue offset may be issued again (issue 28 point 3)."""
    for path in store_config(root).commitlog_dir.iterdir():
        path.unlink()
    return Harm(_keys(layout.records))


def _longer_than_configured(layout: Layout, root: Path, rng: random.Random) -> Harm:
    """Bytes appended to the last CommitLog file, past its configured size (issue 28
    point 11: ``store check`` passed it, the node refused it)."""
    last = _commitlog(root, file_name((layout.commitlog_files - 1) * COMMITLOG_FILE))
    with last.open("ab") as f:
        f.write(rng.randbytes(PAGE))
    return Harm(refused=True)


# -- ConsumeQueue ---------------------------------------------------------------------------


def _queue_dir(root: Path, key: QueueKey) -> Path:
    return store_config(root).consume_queue_dir / key[0] / str(key[1])


def _some_queue(layout: Layout, rng: random.Random) -> QueueKey:
    return sorted(layout.queue_max)[rng.randrange(len(layout.queue_max))]


def _cq_flip(layout: Layout, root: Path, rng: random.Random) -> Harm:
    """XOR one byte of one unit of the first ConsumeQueue file of a queue."""
    cq = _queue_dir(root, _some_queue(layout, rng)) / file_name(0)
    _xor_byte(cq, rng.randrange(CQ_UNITS_PER_FILE * CQ_STORE_UNIT_SIZE))
    return Harm()


def _cq_truncate(layout: Layout, root: Path, rng: random.Random) -> Harm:
    """Cut the first ConsumeQueue file of a queue inside a unit."""
    cq = _queue_dir(root, _some_queue(layout, rng)) / file_name(0)
    os.truncate(cq, rng.randrange(1, CQ_FILE))
    return Harm()


def _cq_delete_file(layout: Layout, root: Path, rng: random.Random) -> Harm:
    """Delete the middle one of a queue's three ConsumeQueue files."""
    (_queue_dir(root, _some_queue(layout, rng)) / file_name(CQ_FILE)).unlink()
    return Harm()


def _cq_wrong_offset(layout: Layout, root: Path, rng: random.Random) -> Harm:
    """Swap two units of a queue: each points at the other's record (valid bytes,
    wrong record)."""
    cq = _queue_dir(root, _some_queue(layout, rng)) / file_name(0)
    a = rng.randrange(CQ_UNITS_PER_FILE // 2)
    b = a + 1 + rng.randrange(CQ_UNITS_PER_FILE // 2 - 1)
    with cq.open("r+b") as f:
        f.seek(a * CQ_STORE_UNIT_SIZE)
        unit_a = f.read(CQ_STORE_UNIT_SIZE)
        f.seek(b * CQ_STORE_UNIT_SIZE)
        unit_b = f.read(CQ_STORE_UNIT_SIZE)
        f.seek(a * CQ_STORE_UNIT_SIZE)
        f.write(unit_b)
        f.seek(b * CQ_STORE_UNIT_SIZE)
        f.write(unit_a)
    return Harm()


def _cq_past_its_size(layout: Layout, root: Path, rng: random.Random) -> Harm:
    """Units written past the configured size of a queue's first ConsumeQueue file
    (issue 28 point 11: the node refused to start): set aside and rebuilt."""
    cq = _queue_dir(root, _some_queue(layout, rng)) / file_name(0)
    with cq.open("ab") as f:
        f.write(rng.randbytes(CQ_STORE_UNIT_SIZE * (1 + rng.randrange(4))))
    return Harm()


def _cq_delete_directory(layout: Layout, root: Path, rng: random.Random) -> Harm:
    """Delete one queue's whole ConsumeQueue directory (issue 28 point 2): the queue
    manifest shows it gone, and it is rebuilt from the CommitLog."""
    shutil.rmtree(_queue_dir(root, _some_queue(layout, rng)))
    return Harm()


def _commitlog_and_queues_deleted(layout: Layout, root: Path, rng: random.Random) -> Harm:
    """Delete the CommitLog and every ConsumeQueue: only the queue manifest knows the
    offsets given out, and no queue offset may be issued again."""
    config = store_config(root)
    shutil.rmtree(config.commitlog_dir)
    shutil.rmtree(config.consume_queue_dir)
    return Harm(_keys(layout.records))


# -- pop journal ----------------------------------------------------------------------------


def _pop_folder_replaced_by_file(layout: Layout, root: Path, rng: random.Random) -> Harm:
    """The pop journal's folder replaced by a file (issue 28 point 4: exit 2): set
    aside, the pop state starts empty and messages in flight come again."""
    folder = root / "pop"
    shutil.rmtree(folder)
    folder.write_bytes(rng.randbytes(PAGE))
    return Harm(pop_lost=True)


def _pop_journal_garbage_tail(layout: Layout, root: Path, rng: random.Random) -> Harm:
    """Random bytes after the pop journal's last record (a torn append, bad sectors):
    a start cuts them, and the records before them hold."""
    with (root / "pop" / "journal").open("ab") as f:
        f.write(b"\xff" + rng.randbytes(64))
    return Harm()


def _pop_journal_replaced_by_folder(layout: Layout, root: Path, rng: random.Random) -> Harm:
    journal = root / "pop" / "journal"
    journal.unlink()
    journal.mkdir()
    (journal / "x").write_bytes(rng.randbytes(16))
    return Harm(pop_lost=True)


# -- IndexFile, checkpoint, consumer offsets -----------------------------------------------


def _index_files(root: Path) -> list[Path]:
    files = sorted(store_config(root).index_dir.iterdir())
    assert files, "the catalogue store has no IndexFile"
    return files


def _index_flip(layout: Layout, root: Path, rng: random.Random) -> Harm:
    """XOR one byte of the IndexFile's first 8 KiB (header, slots, first entries)."""
    path = _index_files(root)[0]
    _xor_byte(path, rng.randrange(min(8192, path.stat().st_size)))
    return Harm()


def _index_truncate(layout: Layout, root: Path, rng: random.Random) -> Harm:
    """Cut the IndexFile to a random length."""
    path = _index_files(root)[0]
    os.truncate(path, rng.randrange(path.stat().st_size))
    return Harm()


def _index_delete(layout: Layout, root: Path, rng: random.Random) -> Harm:
    for path in _index_files(root):
        path.unlink()
    return Harm()


def _checkpoint_flip(layout: Layout, root: Path, rng: random.Random) -> Harm:
    """XOR one byte of the checkpoint's three timestamps."""
    _xor_byte(store_config(root).checkpoint_path, rng.randrange(24))
    return Harm()


def _checkpoint_truncate(layout: Layout, root: Path, rng: random.Random) -> Harm:
    os.truncate(store_config(root).checkpoint_path, rng.randrange(24))
    return Harm()


def _manifest_flip(layout: Layout, root: Path, rng: random.Random) -> Harm:
    """XOR one byte of the queue manifest's table: its CRC fails, a start ignores it."""
    path = root / "config" / "consumeQueueManifest.json"
    _xor_byte(path, path.read_bytes().index(b'"queues":') + 12 + rng.randrange(8))
    return Harm()


def _checkpoint_delete(layout: Layout, root: Path, rng: random.Random) -> Harm:
    store_config(root).checkpoint_path.unlink()
    return Harm()


def _tear(path: Path, rng: random.Random) -> None:
    """Cut a JSON file inside its content, as a torn write leaves it."""
    size = path.stat().st_size
    os.truncate(path, rng.randrange(1, size - 1))


def _offsets_torn(layout: Layout, root: Path, rng: random.Random) -> Harm:
    """A torn consumerOffset.json; its .bak is whole."""
    _tear(consumer_offset_path(root), rng)
    return Harm()


def _offsets_both_torn(layout: Layout, root: Path, rng: random.Random) -> Harm:
    """consumerOffset.json and its .bak both torn: the store must still start."""
    main = consumer_offset_path(root)
    _tear(main, rng)
    _tear(main.with_name(main.name + ".bak"), rng)
    return Harm(offsets_kept=False)


#: The fields a flipped byte is tried in (issue 14: "a flipped byte in each record field").
FLIPPED_FIELDS = (
    "TOTALSIZE",
    "MAGIC",
    "BODYCRC",
    "QUEUEID",
    "QUEUEOFFSET",
    "PHYSICALOFFSET",
    "SYSFLAG",
    "BORNTIMESTAMP",
    "STORETIMESTAMP",
    "BODY",
    "TOPIC",
    "PROPERTIES",
)


def _catalogue() -> tuple[Damage, ...]:
    entries = [
        Damage(f"commitlog-flip-{f.lower()}", "commitlog", _flip_field(f)) for f in FLIPPED_FIELDS
    ]
    entries += [
        Damage("commitlog-zero-page", "commitlog", _zero_page),
        Damage("commitlog-truncate-mid-record", "commitlog", _truncate_mid_record),
        Damage("commitlog-truncate-last-file", "commitlog", _truncate_last_file),
        Damage("commitlog-delete-middle-file", "commitlog", _delete_middle_file),
        Damage("commitlog-delete-every-file", "commitlog", _delete_every_file),
        Damage("commitlog-garbage-past-end", "commitlog", _garbage_past_end),
        Damage("commitlog-old-file-flip-body", "commitlog", _flip_body_in_old_file),
        Damage("commitlog-longer-than-configured", "commitlog", _longer_than_configured),
        Damage("consumequeue-past-its-size", "consumequeue", _cq_past_its_size),
        Damage("pop-journal-garbage-tail", "pop", _pop_journal_garbage_tail),
        Damage("queue-manifest-flip", "manifest", _manifest_flip),
        Damage("consumequeue-flip", "consumequeue", _cq_flip),
        Damage("consumequeue-truncate", "consumequeue", _cq_truncate),
        Damage("consumequeue-delete-file", "consumequeue", _cq_delete_file),
        Damage("consumequeue-delete-directory", "consumequeue", _cq_delete_directory),
        Damage("commitlog-and-consumequeues-deleted", "commitlog", _commitlog_and_queues_deleted),
        # Not here: a queue's deleted *first* file. It looks like expiry; telling the two
        # apart takes a walk of the whole CommitLog at every start (docs/storage.md).
        Damage("consumequeue-wrong-offsets", "consumequeue", _cq_wrong_offset),
        Damage("index-flip", "index", _index_flip),
        Damage("index-truncate", "index", _index_truncate),
        Damage("index-delete", "index", _index_delete),
        Damage("checkpoint-flip", "checkpoint", _checkpoint_flip),
        Damage("checkpoint-truncate", "checkpoint", _checkpoint_truncate),
        Damage("checkpoint-delete", "checkpoint", _checkpoint_delete),
        Damage("offsets-torn", "offsets", _offsets_torn),
        Damage("offsets-both-torn", "offsets", _offsets_both_torn),
        Damage("pop-folder-replaced-by-file", "pop", _pop_folder_replaced_by_file),
        Damage("pop-journal-replaced-by-folder", "pop", _pop_journal_replaced_by_folder),
    ]
    # After a crash recovery starts from the checkpoint, not from the last files:
    # the same damage must cost no more.
    entries += [
        Damage(f"{name}+abort", target, fn, abort=True)
        for name, target, fn in (
            ("commitlog-flip-body", "commitlog", _flip_field("BODY")),
            ("commitlog-zero-page", "commitlog", _zero_page),
            ("commitlog-garbage-past-end", "commitlog", _garbage_past_end),
            ("consumequeue-truncate", "consumequeue", _cq_truncate),
            ("consumequeue-past-its-size", "consumequeue", _cq_past_its_size),
            ("consumequeue-delete-directory", "consumequeue", _cq_delete_directory),
            ("commitlog-delete-every-file", "commitlog", _delete_every_file),
            ("pop-folder-replaced-by-file", "pop", _pop_folder_replaced_by_file),
            ("index-flip", "index", _index_flip),
            ("checkpoint-delete", "checkpoint", _checkpoint_delete),
        )
    ]
    return tuple(entries)


#: Every way the tests and the benchmark damage a stopped root.
CATALOGUE: tuple[Damage, ...] = _catalogue()
DAMAGES: dict[str, Damage] = {d.name: d for d in CATALOGUE}
assert len(DAMAGES) == len(CATALOGUE), "catalogue names must be unique"


@dataclass(slots=True)
class Outcome:
    """What one damaged restart did, against what the damage allowed.

    Filled by :func:`verify`; the test asserts it is clean, the benchmark
    counts it.
    """

    #: Records not in the allowed set that did not read back (or read back wrong).
    collateral: set[RecordKey] = field(default_factory=set)
    #: Allowed-lost records that were lost.
    damaged: set[RecordKey] = field(default_factory=set)
    #: (queue, offset the next send got, offset it should have got) where they differ.
    reissued: list[tuple[QueueKey, int, int]] = field(default_factory=list)
    #: Wrong bodies returned by a read, stalls, or records not found by key.
    wrong: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not (self.collateral or self.reissued or self.wrong)


def check_as_expected(check: CheckReport, harm: Harm) -> bool:
    """Whether ``store check`` after the restart says what the damage allows: no
    problem at all, or, for damage a start does not look for
    (``harm.undetected_span``), problems at that CommitLog stretch and nowhere
    else (check reads the whole log)."""
    if harm.undetected_span is None:
        return check.ok
    start, end = harm.undetected_span
    return bool(check.problems) and all(
        p.code.startswith("commitlog") and p.offset is not None and start <= p.offset < end
        for p in check.problems
    )


def read_queue(
    store: MessageStore, topic: str, queue_id: int, upto: int
) -> tuple[dict[int, bytes], list[str]]:
    """Read a queue from 0 in batches of 16, as a consumer does: the records got
    by queue offset, and what went wrong (an offset that did not advance, one
    record twice, offsets going backwards)."""
    got: dict[int, bytes] = {}
    problems: list[str] = []
    offset = 0
    while offset < upto:
        result = store.get_message(GROUP, topic, queue_id, offset, 16)
        for record in result.decode():
            if record.queue_offset < offset or record.queue_offset in got:
                problems.append(f"{topic}/{queue_id}: offset {record.queue_offset} read again")
            got[record.queue_offset] = record.body
        if result.next_begin_offset <= offset:
            problems.append(
                f"{topic}/{queue_id}: stalled at {offset} ({result.status.name}, "
                f"next {result.next_begin_offset}, max {upto})"
            )
            break
        offset = result.next_begin_offset
    return got, problems


def verify(store: MessageStore, layout: Layout, harm: Harm) -> Outcome:
    """Read a restarted, damaged store back against ``layout``; then send one
    message per queue. Fills an :class:`Outcome`; asserts nothing (a test
    asserts the outcome, the benchmark counts it)."""
    out = Outcome()
    expected = {r.key: r.body for r in layout.records}
    for key, body in expected.items():
        topic, queue_id, queue_offset = key
        got = store.get_message(GROUP, topic, queue_id, queue_offset, 1).decode()
        intact = bool(got) and got[0].queue_offset == queue_offset and got[0].body == body
        if intact:
            found = store.query_message(topic, key_of(key), 4, 0, 1 << 62).decode()
            if body not in [m.body for m in found]:
                out.wrong.append(f"{key}: not found by its key")
        elif key in harm.lost:
            out.damaged.add(key)
        else:
            out.collateral.add(key)
    for (topic, queue_id), upto in sorted(layout.queue_max.items()):
        got_bodies, problems = read_queue(store, topic, queue_id, upto)
        out.wrong += problems
        for queue_offset, body in got_bodies.items():
            key = (topic, queue_id, queue_offset)
            if expected.get(key) == body:
                continue
            if harm.undetected_span is not None and key in harm.lost:
                continue  # the engine's bytes as they are: the decoding readers skip it
            out.wrong.append(f"{topic}/{queue_id}@{queue_offset}: wrong body {body[:40]!r}")
    for (topic, queue_id), upto in sorted(layout.queue_max.items()):
        result = store.put_message(Message(topic, b"after the damage", queue_id=queue_id))
        got_offset = result.queue_offsets[0] if result.ok else -1
        if got_offset != upto:
            out.reissued.append(((topic, queue_id), got_offset, upto))
    if harm.offsets_kept:
        for (topic, queue_id), offset in layout.committed.items():
            if store.query_offset(GROUP, topic, queue_id) != offset:
                out.wrong.append(f"{topic}/{queue_id}: committed offset {offset} lost")
    return out
