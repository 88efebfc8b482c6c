"""What ``basalt pipeline rebuild-index`` runs in a Spark task besides the ConsumeQueues:
a store root's IndexFiles rebuilt from its CommitLog, and its ConsumeQueue units
checked against the CommitLog (``basalt pipeline verify``).

IndexFiles are written by the engine's own writer, never a second one: an
:class:`basalt.store.index_service.IndexService` on a scratch folder of the
output runs :meth:`~basalt.store.index_service.IndexService.build_from_commitlog`
(the store's bulk path, the C indexer) over the source's CommitLog mapped
read-only, so the bytes are the dispatcher's by construction.

Why the IndexFiles are built in one task, in CommitLog order, and not one task
per file: a file's bytes depend on everything indexed before it. A file is
full after ``max_index_num - 1`` keys counted from the CommitLog's first keyed
record, so where a file begins (even inside a record: a record's keys may span
two files) is fixed by the key count of every earlier record; a new file's
header starts at its predecessor's end timestamp and offset, and its first
entry's timeDiff is taken against that timestamp. Only a file's own header,
read from the source, could stand in for that state, and a rebuild exists
because the source's index is not trusted. So the IndexFiles are one task that
runs beside the ConsumeQueue tasks (which are parallel per queue) in the same
Spark job.

Names: a file's name is its creation time, which no record holds. When the
source root has IndexFiles, the rebuilt files take their names in order (the
n-th rebuilt file the n-th source name; boundaries are the engine's, which
are the source's when the source was sound): a byte-identical copy, names
included. Without source names a file is named by the store time of its first
entry (``yyyyMMddHHmmssSSS``, local time, as the store names them): the store
creates a file when it dispatches the record that goes first into it, so the
name is that moment up to the dispatch delay, and a rebuild of a rebuild
gives the same names. Names are kept strictly ascending (one millisecond
after the previous name when they would not be), as the store keeps them.
"""

from __future__ import annotations

import shutil
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from basalt.common import _records
from basalt.pipeline._store_read import _Ignore
from basalt.store.clock import ManualClock
from basalt.store.commitlog import CommitLog
from basalt.store.config import MessageStoreConfig
from basalt.store.consistency import unit_mismatch
from basalt.store.index_file import (
    ENTRY,
    HEADER,
    SLOT,
    index_file_name,
    index_file_size,
    is_index_file_name,
    next_index_file_name,
)
from basalt.store.index_service import IndexService
from basalt.store.mapped_file_queue import MappedFileQueue
from basalt.store.readonly import open_consume_queue, open_data_files, store_layout

__all__ = [
    "SCRATCH_DIR",
    "IndexBuild",
    "QueueUnits",
    "check_queue_units",
    "choose_names",
    "consume_queues",
    "rebuild_index_files",
    "source_index",
]

#: Where, under the output root, the IndexService builds before the files get their names.
SCRATCH_DIR = ".rebuild-index"


def source_index(
    root: Path, hash_slot_num: int | None, index_num: int | None
) -> tuple[int, int, list[str]]:
    """``(hash_slot_num, index_num, names)``: the IndexFile geometry to rebuild with and
    the IndexFile names of ``root/index``, oldest first (``*.tmp`` and other names
    ignored).

    The geometry comes from the arguments and the size of the root's IndexFiles
    (the most common size: a truncated file is damage, not a misfit): a missing
    one is solved from ``size = 40 + 4 * hash_slot_num + 20 * index_num``, and
    with neither given, ``index_num = 4 * hash_slot_num`` (RocketMQ's default
    ratio, and the store's). A root without IndexFiles takes the store's
    defaults for what is not given. Raises ValueError when no geometry fits the
    size (or what was given does not): the rebuilt files would not match.
    """
    defaults = MessageStoreConfig(store_path_root_dir=root)
    directory = store_layout(root).index_dir
    paths = (
        sorted(p for p in directory.iterdir() if is_index_file_name(p.name) and p.is_file())
        if directory.is_dir()
        else []
    )
    sizes = Counter(p.stat().st_size for p in paths).most_common(1)
    if not sizes:
        slots = hash_slot_num or defaults.max_hash_slot_num
        entries = index_num or defaults.max_index_num
    else:
        room = sizes[0][0] - HEADER.size  # slots and entries
        if hash_slot_num and index_num:
            slots, entries = hash_slot_num, index_num
        elif hash_slot_num:
            slots, entries = hash_slot_num, (room - SLOT.size * hash_slot_num) // ENTRY.size
        elif index_num:
            slots, entries = (room - ENTRY.size * index_num) // SLOT.size, index_num
        else:
            slots = room // (SLOT.size + 4 * ENTRY.size)
            entries = 4 * slots
        if slots < 1 or entries < 2 or index_file_size(slots, entries) != sizes[0][0]:
            raise ValueError(
                f"{directory}: IndexFiles of {sizes[0][0]} bytes fit no geometry of "
                f"--max-hash-slot-num {hash_slot_num or '?'} and --max-index-num "
                f"{index_num or '?'} (40 + 4 * slots + 20 * entries bytes): give the store's"
            )
    if slots < 1 or entries < 2:  # IndexService's own bounds, checked before any task
        raise ValueError("an IndexFile needs at least 1 hash slot and 2 entries")
    return slots, entries, [p.name for p in paths]


def choose_names(source: list[str], begin_timestamps_ms: list[int]) -> list[str]:
    """The names of the rebuilt files whose first entries have these store times:
    ``source`` names in order, then names from the store times; strictly ascending
    (see the module docstring)."""
    names: list[str] = []
    for i, begin in enumerate(begin_timestamps_ms):
        name = source[i] if i < len(source) else index_file_name(begin)
        if names and name <= names[-1]:
            name = next_index_file_name(names[-1])
        names.append(name)
    return names


@dataclass(frozen=True, slots=True)
class IndexBuild:
    """What :func:`rebuild_index_files` wrote."""

    files: int
    entries: int
    #: The CommitLog offset the index reached.
    end_offset: int
    #: Why indexing stopped before the CommitLog's end (a record that does not parse).
    error: str | None


def _data_end(commitlog: MappedFileQueue) -> int:
    """Where the CommitLog's data ends: past the last file's last sound record (CRC
    checked, as recovery finds it), or the file's end when a blank fills it."""
    if not commitlog.files:
        return 0
    mf = commitlog.files[-1]
    end, kind, *_ = _records.scan(mf.buffer, 0, mf.readable_end(0), mf.file_from_offset, True, -1)
    return mf.file_end_offset if kind == _records.KIND_BLANK else mf.file_from_offset + end


def rebuild_index_files(
    root: str, out: str, hash_slot_num: int, index_num: int, names: list[str]
) -> IndexBuild:
    """Write the IndexFiles of ``root``'s CommitLog into ``out/index`` (see the module
    docstring for the engine used and :func:`choose_names` for ``names``, the
    source's). Reads ``root`` read-only; builds under ``out/.rebuild-index`` and
    moves each finished file to its name. Returns what was written; a CommitLog
    record that does not parse stops the index there (``error``).
    """
    layout = store_layout(Path(root))
    scratch = Path(out) / SCRATCH_DIR
    shutil.rmtree(scratch, ignore_errors=True)  # a failed attempt's files (a task retried)
    commitlog = CommitLog(layout, read_only=True)
    # Mapped: the C indexer scans the files' buffers (zero-copy).
    commitlog.files = open_data_files(layout.commitlog_dir, "commitlog", _Ignore(), mapped=True)
    # Names are chosen afterwards: the clock only has to give the scratch files names.
    service = IndexService(
        scratch, clock=ManualClock(0), max_hash_slot_num=hash_slot_num, max_index_num=index_num
    )
    try:
        service.build_from_commitlog(commitlog, _data_end(commitlog.files))
        built = [(f.path, f.begin_timestamp_ms, f.index_count - 1) for f in service.files]
        end, error = service.reput_offset, service.build_error
    finally:
        service.shutdown()
        commitlog.files.close()
    target = Path(out) / "index"
    target.mkdir(parents=True, exist_ok=True)
    for (path, _, _), name in zip(
        built, choose_names(names, [b for _, b, _ in built]), strict=True
    ):
        path.rename(target / name)
    shutil.rmtree(scratch, ignore_errors=True)  # absent when nothing was indexed
    return IndexBuild(len(built), sum(n for _, _, n in built), end, error)


# -- verify: ConsumeQueue units against the CommitLog ---------------------------------------


def consume_queues(root: Path) -> list[tuple[str, int]]:
    """``(topic, queue_id)`` of every ConsumeQueue directory of ``root``, sorted."""
    cq_dir = store_layout(root).consume_queue_dir
    if not cq_dir.is_dir():
        return []
    return sorted(
        (topic.name, int(queue.name))
        for topic in cq_dir.iterdir()
        if topic.is_dir()
        for queue in topic.iterdir()
        if queue.is_dir() and queue.name.isdigit()
    )


@dataclass(frozen=True, slots=True)
class QueueUnits:
    """One queue's units checked against the CommitLog (:func:`check_queue_units`)."""

    topic: str
    queue_id: int
    units_checked: int
    bad_units: int
    #: Queue offset of the first bad unit and why (``basalt store check``'s words).
    first_bad_unit: int | None
    first_bad_reason: str | None


def check_queue_units(root: str, queues: Iterable[tuple[str, int]]) -> Iterator[QueueUnits]:
    """Check every written unit of each queue with ``basalt store check``'s rule
    (:func:`basalt.store.consistency.unit_mismatch`): it must point at a record of its
    queue, in a CommitLog file, with its size, queue offset and tagsCode. So a
    unit past the CommitLog's end or at a non-record is found, which a walk of
    the CommitLog cannot see. Filler units and units below the CommitLog's
    first file (expired records) are not checked. Maps the CommitLog once for
    all of ``queues`` (one Spark partition); read-only.
    """
    layout = store_layout(Path(root))
    commitlog = open_data_files(layout.commitlog_dir, "commitlog", _Ignore())
    try:
        min_offset = commitlog.min_offset
        for topic, queue_id in queues:
            cq = open_consume_queue(layout, topic, queue_id, _Ignore())
            if cq is None:
                continue
            checked = bad = 0
            first: tuple[int, str] | None = None
            try:
                for index, phy, size, code in cq.iter_units(cq.min_offset_in_queue):
                    if phy < min_offset:
                        continue
                    checked += 1
                    reason = unit_mismatch(commitlog, (topic, queue_id), index, phy, size, code)
                    if reason:
                        bad += 1
                        first = first or (index, reason)
            finally:
                cq.close()
            yield QueueUnits(
                topic, queue_id, checked, bad,
                first[0] if first else None, first[1] if first else None,
            )  # fmt: skip
    finally:
        commitlog.close()
