"""Offline tools for a store root: ``check`` (a consistency verifier) and ``dump``.

Both open the root **read-only**: no ``lock`` taken, no ``abort`` created,
every data file mapped with ``read_only=True``, nothing written, truncated or
recovered. They are safe on a root a running store holds and on a crashed
root before recovery. File sizes are inferred from the files on disk.

:func:`check_store` makes three passes:

1. every ConsumeQueue: find its written end (the first invalid unit, as
   ConsumeQueue recovery would) and report data past it (a hole);
2. the whole CommitLog from its first file: every record's magic code,
   TOTALSIZE, CRC and PHYSICALOFFSET, end-of-file blanks, no gap between
   files, and queue offsets consecutive per (topic, queue) for dispatchable
   records; records at or past their queue's end are *undispatched* (info);
3. every ConsumeQueue unit below the end found in pass 1 — except filler units
   and units whose record is below the CommitLog min offset — must point at a
   dispatchable record of its own topic and queue, with the unit's size and
   tagsCode, whose QUEUEOFFSET is the unit's index.

Pass 1 runs before pass 2 so that, on a running store, every unit checked
points at a record the CommitLog walk has seen. A record being written while
the walk reads it may look torn: the last file's tail is read twice before
it is called corrupt, but only a quiescent root gives a definitive answer.

:func:`dump_store` prints records one per line, like Kafka's
``kafka-dump-log``, from the CommitLog or through one ConsumeQueue.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import TextIO

from store.checkpoint import StoreCheckpoint
from store.config import CQ_STORE_UNIT_SIZE
from store.consume_queue import BLANK_UNIT_SIZE, UNIT
from store.errors import CorruptRecordError, StoreError
from store.hashing import tags_code
from store.mapped_file import MappedFile, parse_file_name
from store.mapped_file_queue import MappedFileQueue
from store.message import (
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    MessageRecord,
    decode_properties,
    is_dispatchable,
    transaction_type,
)
from store.record import RecordInfo, RecordKind, check_record, decode_record

#: Exit statuses of the ``basalt store`` commands.
EXIT_OK = 0
EXIT_INCONSISTENT = 1
EXIT_USAGE = 2
#: Problems kept in a report; the rest are only counted (``problems_total``).
MAX_PROBLEMS = 1000
#: Problems the human summary lists.
SUMMARY_PROBLEMS = 50
DEFAULT_BODY_PREVIEW_BYTES = 64

QueueKey = tuple[str, int]


class StoreRootError(StoreError, FileNotFoundError):
    """The path given is missing, not a directory, or not a store root."""

    def __init__(self, root: Path, reason: str) -> None:
        super().__init__(f"{root}: {reason}")
        self.root = root
        self.reason = reason


# -- the report ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Problem:
    """One inconsistency: a short ``code``, a sentence, and where it is.

    ``offset`` is a CommitLog physical offset for CommitLog problems and a
    queue offset (unit index) for ConsumeQueue problems; ``path`` the file.
    """

    code: str
    message: str
    path: str | None = None
    offset: int | None = None

    def __str__(self) -> str:
        return f"[{self.code}] {self.message}"


@dataclass(frozen=True, slots=True)
class QueueReport:
    """One (topic, queue id) as the CommitLog and its ConsumeQueue describe it."""

    topic: str
    queue_id: int
    #: Dispatchable records of this queue found in the CommitLog.
    records: int
    first_queue_offset: int | None
    last_queue_offset: int | None
    consume_queue_files: int
    #: First unit index the ConsumeQueue files cover, and one past the last written unit.
    consume_queue_min_offset: int
    consume_queue_max_offset: int
    units_checked: int
    undispatched: int


@dataclass(frozen=True, slots=True)
class CheckCounts:
    commitlog_files: int = 0
    commitlog_file_size: int = 0
    commitlog_min_offset: int = 0
    #: One past the last valid byte the walk reached.
    commitlog_max_offset: int = 0
    commitlog_bytes: int = 0
    records: int = 0
    #: Prepared or rolled-back transactional records: in no ConsumeQueue.
    records_not_dispatchable: int = 0
    end_of_file_blanks: int = 0
    topics: int = 0
    queues: int = 0
    consume_queue_files: int = 0
    consume_queue_units_checked: int = 0
    consume_queue_filler_units: int = 0
    consume_queue_units_below_min: int = 0
    undispatched_records: int = 0


@dataclass(frozen=True, slots=True)
class CheckReport:
    """What :func:`check_store` found. ``ok`` iff there is no problem; info never fails."""

    root: Path
    counts: CheckCounts
    problems: tuple[Problem, ...]
    info: tuple[str, ...]
    queues: tuple[QueueReport, ...] = ()
    #: Every problem found, including those beyond MAX_PROBLEMS not kept in ``problems``.
    problems_total: int = 0

    @property
    def ok(self) -> bool:
        return self.problems_total == 0 and not self.problems

    def as_dict(self) -> dict[str, object]:
        """A JSON-ready dict: ``ok``, ``root``, ``counts``, ``problems``, ``info``, ``queues``."""
        return {
            "ok": self.ok,
            "root": str(self.root),
            "counts": asdict(self.counts),
            "problems": [asdict(p) for p in self.problems],
            "problems_total": max(self.problems_total, len(self.problems)),
            "info": list(self.info),
            "queues": [asdict(q) for q in self.queues],
        }

    def summary(self) -> str:
        """A human summary, several lines, ending with the verdict."""
        c = self.counts
        topics = sorted({q.topic for q in self.queues})
        lines = [
            f"store root: {self.root}",
            f"commitlog: {c.commitlog_files} files of {c.commitlog_file_size} bytes, "
            f"offsets [{c.commitlog_min_offset}, {c.commitlog_max_offset}), "
            f"{c.commitlog_bytes} bytes, {c.records} records "
            f"({c.records_not_dispatchable} not dispatchable), {c.end_of_file_blanks} blanks",
            f"topics: {c.topics} ({', '.join(topics)}), queues: {c.queues}",
        ]
        for q in self.queues:
            span = (
                "-"
                if q.first_queue_offset is None
                else f"{q.first_queue_offset}..{q.last_queue_offset}"
            )
            lines.append(
                f"  {q.topic}/{q.queue_id}: {q.records} records (queue offsets {span}), "
                f"consumequeue [{q.consume_queue_min_offset}, {q.consume_queue_max_offset}) "
                f"in {q.consume_queue_files} files, {q.units_checked} units checked, "
                f"{q.undispatched} undispatched"
            )
        lines.append(
            f"consume queues: {c.consume_queue_files} files, "
            f"{c.consume_queue_units_checked} units checked, {c.consume_queue_filler_units} "
            f"filler, {c.consume_queue_units_below_min} below the commitlog min offset"
        )
        lines += [f"info: {i}" for i in self.info]
        total = max(self.problems_total, len(self.problems))
        lines.append(f"problems: {total}")
        lines += [f"  {p}" for p in self.problems[:SUMMARY_PROBLEMS]]
        if total > SUMMARY_PROBLEMS:
            lines.append(f"  … and {total - SUMMARY_PROBLEMS} more (--json lists {MAX_PROBLEMS})")
        lines.append("result: OK" if self.ok else "result: INCONSISTENT")
        return "\n".join(lines)


class _Findings:
    """Collects problems (keeping the first MAX_PROBLEMS) and info lines."""

    def __init__(self) -> None:
        self.problems: list[Problem] = []
        self.total = 0
        self.info: list[str] = []

    def problem(
        self, code: str, message: str, *, path: Path | None = None, offset: int | None = None
    ) -> None:
        self.total += 1
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(Problem(code, message, str(path) if path else None, offset))

    def note(self, message: str) -> None:
        self.info.append(message)


# -- read-only access to the files --------------------------------------------------------


def _require_root(root: Path) -> None:
    if not root.exists():
        raise StoreRootError(root, "no such store root")
    if not root.is_dir():
        raise StoreRootError(root, "not a directory")
    if not any((root / name).exists() for name in ("commitlog", "consumequeue", "checkpoint")):
        raise StoreRootError(root, "not a store root (no commitlog/, consumequeue/ or checkpoint)")


def _open_data_files(
    directory: Path, what: str, findings: _Findings, *, unit: int = 1
) -> MappedFileQueue:
    """Map a directory's data files read-only into a MappedFileQueue, reporting misfits.

    The file size is the most common size on disk; a file of another size, a
    size that is not a multiple of ``unit``, a name that is not a multiple of
    the size, or a gap between names is a problem, and the misfit is left
    out. An empty last file (created by a writer that died before allocating
    it) is only noted. The caller closes the queue.
    """
    paths = sorted(p for p in directory.iterdir() if parse_file_name(p) is not None and p.is_file())
    sizes = {p: p.stat().st_size for p in paths}
    common = Counter(s for s in sizes.values() if s > 0).most_common(1)
    file_size = common[0][0] if common else 0
    files_queue = MappedFileQueue(directory, max(file_size, 1), read_only=True)
    if file_size and file_size % unit:
        findings.problem(
            "file-size",
            f"{what} files are {file_size} bytes, not a multiple of {unit}",
            path=directory,
        )
        return files_queue
    opened: list[MappedFile] = []
    starts = [int(p.name) for p in paths]
    for i, path in enumerate(paths):
        size = sizes[path]
        if i > 0 and file_size and starts[i] != starts[i - 1] + file_size:
            findings.problem("file-gap", f"{what}: gap before {path.name}", path=path)
        if size == 0 and i == len(paths) - 1:
            findings.note(f"{what}: {path.name} is empty (created, never written)")
        elif size != file_size or not size:
            problem = f"{what}: {path.name} is {size} bytes but the others are {file_size}"
            findings.problem("file-size", problem, path=path)
        else:
            try:
                opened.append(MappedFile(path, file_size, read_only=True))
            except OSError as e:  # CorruptFileError included
                findings.problem("file-unreadable", f"{what}: {path.name}: {e}", path=path)
    files_queue.files = opened
    return files_queue


def _iso(ms: int) -> str:
    try:
        return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    except (OverflowError, OSError, ValueError):
        return "invalid"


def _record_tags_code(info: RecordInfo) -> int:
    return tags_code(decode_properties(info.properties).get(PROPERTY_TAGS))


# -- check --------------------------------------------------------------------------------


@dataclass(slots=True)
class _Queue:
    """Running state of one (topic, queue) during a check."""

    files: MappedFileQueue | None = None
    #: Unit index range of the ConsumeQueue: first file start, end of written units.
    cq_start: int = 0
    cq_end: int = 0
    records: int = 0
    first: int | None = None
    last: int | None = None
    #: The queue offset the next record must carry; None after a corrupt stretch.
    expected: int | None = None
    undispatched: int = 0
    before_cq: int = 0
    units_checked: int = 0
    filler: int = 0
    below_min: int = 0


class _Checker:
    """One run of :func:`check_store`; owns the mapped files until :meth:`close`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.findings = _Findings()
        self.queues: dict[QueueKey, _Queue] = {}
        self.commitlog = MappedFileQueue(root / "commitlog", 1, read_only=True)
        self.records = self.not_dispatchable = self.blanks = 0
        self.walk_end = 0
        self.resynced = False

    def close(self) -> None:
        self.commitlog.close()
        for q in self.queues.values():
            if q.files is not None:
                q.files.close()

    def run(self) -> CheckReport:
        root, f = self.root, self.findings
        if (root / "abort").exists():
            f.note("abort file present: the store is running, or crashed and was not recovered yet")
        else:
            f.note("no abort file: the last shutdown was clean (or the store never started)")
        cp_path = root / "checkpoint"
        if cp_path.exists():
            cp = StoreCheckpoint(cp_path, read_only=True)
            f.note(
                f"checkpoint: physic {cp.physic_msg_timestamp} ({_iso(cp.physic_msg_timestamp)}), "
                f"logics {cp.logics_msg_timestamp} ({_iso(cp.logics_msg_timestamp)}), "
                f"index {cp.index_msg_timestamp} ({_iso(cp.index_msg_timestamp)})"
            )
        self._scan_consume_queue_ends()
        if self.commitlog.directory.is_dir():
            self.commitlog = _open_data_files(self.commitlog.directory, "commitlog", f)
        self._walk_commitlog()
        for key, q in sorted(self.queues.items()):
            self._check_units(key, q)
        return self._report()

    # -- pass 1 ------------------------------------------------------------------------

    def _scan_consume_queue_ends(self) -> None:
        cq_root = self.root / "consumequeue"
        if not cq_root.is_dir():
            return
        for topic_dir in sorted(p for p in cq_root.iterdir() if p.is_dir()):
            for queue_dir in sorted(topic_dir.iterdir()):
                if not (queue_dir.is_dir() and queue_dir.name.isdigit()):
                    self.findings.note(f"ignored {queue_dir}: not a queue id directory")
                    continue
                what = f"consumequeue {topic_dir.name}/{queue_dir.name}"
                files = _open_data_files(queue_dir, what, self.findings, unit=CQ_STORE_UNIT_SIZE)
                q = self.queues.setdefault((topic_dir.name, int(queue_dir.name)), _Queue())
                q.files = files
                if files.files:
                    q.cq_start = q.cq_end = files.files[0].file_from_offset // CQ_STORE_UNIT_SIZE
                    self._find_cq_end(what, q, files.files)

    def _find_cq_end(self, what: str, q: _Queue, files: list[MappedFile]) -> None:
        """Set ``q.cq_end`` to the first invalid unit's index; any data after it is a hole."""
        end: int | None = None  # byte offset of the first invalid unit, once found
        for i, mf in enumerate(files):
            if end is None and i and mf.file_from_offset != files[i - 1].file_end_offset:
                end = files[i - 1].file_end_offset  # the gap was reported when opening
            for attempt in (0, 1):
                data = mf.read(0, mf.file_size)
                pos = _valid_units_end(data) if end is None else 0
                tail = data[pos:]
                dirty_at = len(data) - len(tail.lstrip(b"\0"))
                # The dispatcher of a running store may be appending to the last file.
                if dirty_at == len(data) or i < len(files) - 1 or attempt:
                    break
            if end is None:
                q.cq_end = (mf.file_from_offset + pos) // CQ_STORE_UNIT_SIZE
                if pos < mf.file_size:
                    end = mf.file_from_offset + pos
            if dirty_at < len(data):
                index = (mf.file_from_offset + dirty_at) // CQ_STORE_UNIT_SIZE
                self.findings.problem(
                    "cq-hole",
                    f"{what}: units at queue offset {index} and later follow the end of the "
                    f"written units at queue offset {q.cq_end}",
                    path=mf.path,
                    offset=index,
                )
                return

    # -- pass 2 ------------------------------------------------------------------------

    def _walk_commitlog(self) -> None:
        files = self.commitlog.files
        self.walk_end = files[0].file_from_offset if files else 0
        for i, mf in enumerate(files):
            last = i == len(files) - 1
            if i and mf.file_from_offset != files[i - 1].file_end_offset:
                self._resync()  # the gap or misfit file was reported when opening
            pos = 0
            info, dirty = self._record_at(mf, pos, retry=last)
            while info.kind is RecordKind.MESSAGE:
                self._on_record(info, mf.file_from_offset + pos)
                pos += info.size
                self.walk_end = mf.file_from_offset + pos
                info, dirty = self._record_at(mf, pos, retry=last)
            problem = partial(self._commitlog_problem, mf, pos)
            if info.kind is RecordKind.BLANK:
                self.blanks += 1
                self.walk_end = mf.file_end_offset
                if info.size != mf.file_size - pos:
                    remain = mf.file_size - pos
                    problem("commitlog-blank", f"blank of {info.size} bytes but {remain} remain")
                if last:
                    self.findings.note(f"commitlog: the last file, {mf.path.name}, is full")
                continue
            if info.kind is RecordKind.CORRUPT:
                problem("commitlog-corrupt", info.reason)
            if dirty:
                problem("commitlog-dirty", f"{dirty} non-zero bytes after the end of the data")
            if info.kind is RecordKind.END and not last:
                problem("commitlog-no-blank", "no end-of-file blank, but later files follow")
            if info.kind is RecordKind.CORRUPT or not last:
                self._resync()

    def _commitlog_problem(self, mf: MappedFile, pos: int, code: str, why: str) -> None:
        phys = mf.file_from_offset + pos
        self.findings.problem(
            code,
            f"commitlog offset {phys} ({mf.path.name}+{pos}): {why}",
            path=mf.path,
            offset=phys,
        )

    @staticmethod
    def _record_at(mf: MappedFile, pos: int, *, retry: bool) -> tuple[RecordInfo, int]:
        """check_record at ``pos`` (with CRC) and, at the end of data, the dirty bytes after it."""
        for attempt in (0, 1):
            info = check_record(
                mf.buffer,
                pos,
                mf.file_size,
                check_crc=True,
                expected_offset=mf.file_from_offset + pos,
            )
            dirty = mf.dirty_bytes_from(pos) if info.kind is RecordKind.END else 0
            torn = info.kind is RecordKind.CORRUPT or dirty > 0
            # In the last file a writer may be mid-way through this record: look once more.
            if not (torn and retry) or attempt:
                return info, dirty
        raise AssertionError("unreachable")

    def _resync(self) -> None:
        """A stretch of the CommitLog could not be read: queue offsets may jump after it."""
        self.resynced = True
        for q in self.queues.values():
            q.expected = None

    def _on_record(self, info: RecordInfo, phys: int) -> None:
        self.records += 1
        if not is_dispatchable(info.sys_flag):
            self.not_dispatchable += 1
            return
        key = (info.topic, info.queue_id)
        q = self.queues.get(key)
        if q is None:
            q = self.queues[key] = _Queue()
        offset = info.queue_offset
        if q.expected is not None and offset != q.expected:
            self.findings.problem(
                "queue-offset",
                f"commitlog offset {phys}: {info.topic}/{info.queue_id} queue offset {offset} "
                f"but the previous record of the queue had {q.expected - 1}",
                offset=phys,
            )
        elif (
            q.first is None and offset != 0 and self.commitlog.min_offset == 0 and not self.resynced
        ):
            self.findings.problem(
                "queue-offset",
                f"commitlog offset {phys}: {info.topic}/{info.queue_id} starts at queue offset "
                f"{offset} but the CommitLog starts at 0",
                offset=phys,
            )
        q.expected = offset + 1
        q.records += 1
        q.first = offset if q.first is None else min(q.first, offset)
        q.last = offset if q.last is None else max(q.last, offset)
        if offset >= q.cq_end:
            q.undispatched += 1
        elif offset < q.cq_start:
            q.before_cq += 1

    # -- pass 3 ------------------------------------------------------------------------

    def _check_units(self, key: QueueKey, q: _Queue) -> None:
        topic, queue_id = key
        where = f"consumequeue {topic}/{queue_id}"
        if q.before_cq:
            self.findings.problem(
                "cq-missing",
                f"{where}: {q.before_cq} records in the CommitLog have queue offsets below "
                f"the first ConsumeQueue file (queue offset {q.cq_start})",
                offset=q.cq_start,
            )
        if q.files is None:
            return
        min_offset = self.commitlog.min_offset
        first_kept = q.first if q.first is not None else q.cq_end
        for index, phy, size, code, mf in _iter_units(q.files.files, q.cq_end):
            if size == BLANK_UNIT_SIZE or phy < min_offset:
                if size == BLANK_UNIT_SIZE:
                    q.filler += 1
                else:
                    q.below_min += 1
                if index >= first_kept and not self.resynced:
                    what = "a filler unit" if size == BLANK_UNIT_SIZE else f"offset {phy}"
                    self._unit_problem(
                        "cq-hole",
                        where,
                        index,
                        mf,
                        f"{what} but the CommitLog holds the queue's records from queue "
                        f"offset {first_kept}",
                    )
                continue
            q.units_checked += 1
            reason = self._unit_mismatch(key, index, phy, size, code)
            if reason:
                self._unit_problem("cq-mismatch", where, index, mf, reason)

    def _unit_problem(self, code: str, where: str, index: int, mf: MappedFile, why: str) -> None:
        self.findings.problem(
            code,
            f"{where} unit at queue offset {index} ({mf.path.name}): {why}",
            path=mf.path,
            offset=index,
        )

    def _unit_mismatch(self, key: QueueKey, index: int, phy: int, size: int, code: int) -> str:
        """Why the unit does not describe the record at ``phy``; "" when it does."""
        mf = self.commitlog.find_by_offset(phy)
        if mf is None:
            return f"points at commitlog offset {phy}, which no CommitLog file holds"
        info = check_record(
            mf.buffer,
            phy - mf.file_from_offset,
            mf.file_size,
            check_crc=False,
            expected_offset=phy,
        )
        if info.kind is not RecordKind.MESSAGE:
            why = info.reason or info.kind.value
            return f"points at commitlog offset {phy}, where there is no record ({why})"
        wrong = []
        if (info.topic, info.queue_id) != key:
            wrong.append(f"the record belongs to {info.topic}/{info.queue_id}")
        if info.size != size:
            wrong.append(f"size {size} but the record is {info.size} bytes")
        if info.queue_offset != index:
            wrong.append(f"the record has queue offset {info.queue_offset}")
        if not is_dispatchable(info.sys_flag):
            wrong.append(f"the record is not dispatchable (sysflag 0x{info.sys_flag:x})")
        expected_code = _record_tags_code(info)
        if expected_code != code:
            wrong.append(f"tagsCode {code} but the record's tags hash to {expected_code}")
        return f"commitlog offset {phy}: " + "; ".join(wrong) if wrong else ""

    # -- the report --------------------------------------------------------------------

    def _report(self) -> CheckReport:
        undispatched = {k: q.undispatched for k, q in sorted(self.queues.items()) if q.undispatched}
        total_undispatched = sum(undispatched.values())
        if total_undispatched:
            detail = ", ".join(f"{t}/{i}: {n}" for (t, i), n in list(undispatched.items())[:20])
            self.findings.note(f"undispatched records: {total_undispatched} ({detail})")
        cl = self.commitlog
        queues = tuple(
            QueueReport(
                topic=t,
                queue_id=i,
                records=q.records,
                first_queue_offset=q.first,
                last_queue_offset=q.last,
                consume_queue_files=len(q.files.files) if q.files else 0,
                consume_queue_min_offset=q.cq_start,
                consume_queue_max_offset=q.cq_end,
                units_checked=q.units_checked,
                undispatched=q.undispatched,
            )
            for (t, i), q in sorted(self.queues.items())
        )
        vals = self.queues.values()
        counts = CheckCounts(
            commitlog_files=len(cl.files),
            commitlog_file_size=cl.mapped_file_size if cl.files else 0,
            commitlog_min_offset=cl.min_offset,
            commitlog_max_offset=self.walk_end,
            commitlog_bytes=self.walk_end - cl.min_offset,
            records=self.records,
            records_not_dispatchable=self.not_dispatchable,
            end_of_file_blanks=self.blanks,
            topics=len({t for t, _ in self.queues}),
            queues=len(self.queues),
            consume_queue_files=sum(len(q.files.files) for q in vals if q.files),
            consume_queue_units_checked=sum(q.units_checked for q in vals),
            consume_queue_filler_units=sum(q.filler for q in vals),
            consume_queue_units_below_min=sum(q.below_min for q in vals),
            undispatched_records=total_undispatched,
        )
        f = self.findings
        return CheckReport(self.root, counts, tuple(f.problems), tuple(f.info), queues, f.total)


def _valid_units_end(data: bytes) -> int:
    """Byte position of the first invalid unit (phy < 0 or size <= 0) in ``data``."""
    for i, (phy, size, _) in enumerate(UNIT.iter_unpack(data)):
        if phy < 0 or size <= 0:
            return i * CQ_STORE_UNIT_SIZE
    return len(data)


def _iter_units(
    files: list[MappedFile], end_index: int, start_index: int = 0
) -> Iterator[tuple[int, int, int, int, MappedFile]]:
    """Yield (index, phy, size, tagsCode, file) for units in [start_index, end_index)."""
    for mf in files:
        base = mf.file_from_offset // CQ_STORE_UNIT_SIZE
        if base >= end_index:
            return
        if base + mf.file_size // CQ_STORE_UNIT_SIZE <= start_index:
            continue
        first = max(start_index - base, 0)
        count = min(end_index - base, mf.file_size // CQ_STORE_UNIT_SIZE) - first
        data = mf.read(first * CQ_STORE_UNIT_SIZE, count * CQ_STORE_UNIT_SIZE)
        for i, (phy, size, code) in enumerate(UNIT.iter_unpack(data)):
            yield base + first + i, phy, size, code, mf


def check_store(root: Path) -> CheckReport:
    """Verify a store root read-only; see the module docstring for what is checked.

    Returns the report (``ok`` false on any inconsistency); raises
    StoreRootError when ``root`` is missing or not a store root. Never writes,
    locks or truncates anything, so it may run beside a live store.
    """
    root = Path(root)
    _require_root(root)
    checker = _Checker(root)
    try:
        return checker.run()
    finally:
        checker.close()


# -- dump ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DumpResult:
    """How a dump ended: records printed, and the corruption that stopped it, if any."""

    records: int
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


_TX_NAMES = {
    TRANSACTION_PREPARED_TYPE: "PREPARED",
    TRANSACTION_COMMIT_TYPE: "COMMIT",
    TRANSACTION_ROLLBACK_TYPE: "ROLLBACK",
}


def body_preview(body: bytes, limit: int = DEFAULT_BODY_PREVIEW_BYTES) -> str:
    """The first ``limit`` bytes of a body: a JSON string if printable UTF-8, else ``0x…`` hex.

    A trailing ``...`` marks a cut body.
    """
    head = body[:limit]
    more = "..." if len(body) > limit else ""
    for cut in range(4 if more else 1):  # a cut may split a multi-byte character
        try:
            text = head[: len(head) - cut].decode("utf-8")
        except UnicodeDecodeError:
            continue
        if all(ch.isprintable() or ch in "\t\n\r" for ch in text):
            return json.dumps(text, ensure_ascii=False) + more
        break
    return "0x" + head.hex() + more


def format_record(record: MessageRecord, *, body_bytes: int = DEFAULT_BODY_PREVIEW_BYTES) -> str:
    """One ``kafka-dump-log``-style line: ``name: value`` pairs, strings JSON-quoted."""
    others = {k: v for k, v in record.properties.items() if k not in (PROPERTY_TAGS, PROPERTY_KEYS)}
    tx = _TX_NAMES.get(transaction_type(record.sys_flag))
    return " ".join(
        (
            f"offset: {record.commit_log_offset}",
            f"size: {record.store_size}",
            f"queueId: {record.queue_id}",
            f"queueOffset: {record.queue_offset}",
            f"storeTimestamp: {record.store_timestamp_ms} ({_iso(record.store_timestamp_ms)})",
            f"bornTimestamp: {record.born_timestamp_ms} ({_iso(record.born_timestamp_ms)})",
            f"topic: {json.dumps(record.topic, ensure_ascii=False)}",
            f"tags: {json.dumps(record.tags, ensure_ascii=False)}",
            f"keys: {json.dumps(record.keys, ensure_ascii=False)}",
            f"sysFlag: 0x{record.sys_flag:x}" + (f" transaction: {tx}" if tx else ""),
            f"properties: {json.dumps(others, ensure_ascii=False, sort_keys=True)}",
            f"bodySize: {len(record.body)}",
            f"body: {body_preview(record.body, body_bytes)}",
        )
    )


def dump_store(
    root: Path,
    out: TextIO,
    *,
    topic: str | None = None,
    queue_id: int | None = None,
    from_offset: int | None = None,
    body_bytes: int = DEFAULT_BODY_PREVIEW_BYTES,
) -> DumpResult:
    """Print records of a store root to ``out``, one line each (:func:`format_record`).

    With both ``topic`` and ``queue_id``, iterate that ConsumeQueue from queue
    offset ``from_offset`` (default its start); otherwise walk the CommitLog
    from physical offset ``from_offset`` (default its start; an offset inside
    a record starts at the next one) keeping records that match the filters.
    Read-only. A record that fails its checks (magic, size, CRC, physical
    offset) is printed as a ``corrupt record`` line and ends the dump with an
    error. Raises StoreRootError for a missing or non-store root.
    """
    root = Path(root)
    _require_root(root)
    findings = _Findings()
    cl_dir = root / "commitlog"
    commitlog = (
        _open_data_files(cl_dir, "commitlog", findings)
        if cl_dir.is_dir()
        else MappedFileQueue(cl_dir, 1, read_only=True)
    )
    cq: MappedFileQueue | None = None
    try:
        if topic is not None and queue_id is not None:
            cq_dir = root / "consumequeue" / topic / str(queue_id)
            if cq_dir.is_dir():
                cq = _open_data_files(cq_dir, "consumequeue", findings, unit=CQ_STORE_UNIT_SIZE)
            for p in findings.problems:
                out.write(f"warning: {p.message}\n")
            out.write(f"Dumping {cq_dir} from queue offset {from_offset or 0}\n")
            if cq is None:
                out.write(f"no ConsumeQueue for {topic}/{queue_id}\n")
                return DumpResult(0)
            records = _via_queue(commitlog, cq.files, from_offset or 0)
            # Print whatever the queue points at, even another queue's record.
            topic = queue_id = None
        else:
            for p in findings.problems:
                out.write(f"warning: {p.message}\n")
            start = max(from_offset or 0, commitlog.min_offset)
            out.write(f"Dumping {cl_dir} from physical offset {start}\n")
            records = _via_commitlog(commitlog, start)
        return _print_records(records, out, topic, queue_id, body_bytes)
    finally:
        commitlog.close()
        if cq is not None:
            cq.close()


#: What the record iterators yield: a record, a note line, or a corruption that ends the dump.
_Item = MessageRecord | str | CorruptRecordError


def _print_records(
    items: Iterator[_Item], out: TextIO, topic: str | None, queue_id: int | None, body_bytes: int
) -> DumpResult:
    count = 0
    for item in items:
        if isinstance(item, CorruptRecordError):
            out.write(f"corrupt record at offset {item.offset}: {item.reason}\n")
            out.write(f"records: {count} (stopped at a corrupt record)\n")
            return DumpResult(count, str(item))
        if isinstance(item, str):
            out.write(item + "\n")
            continue
        if (topic is None or item.topic == topic) and (
            queue_id is None or item.queue_id == queue_id
        ):
            out.write(format_record(item, body_bytes=body_bytes) + "\n")
            count += 1
    out.write(f"records: {count}\n")
    return DumpResult(count)


def _decode_at(mf: MappedFile, pos: int) -> MessageRecord | CorruptRecordError | None:
    """The record at ``pos`` (CRC checked), a corruption, or None at a blank or the end."""
    phys = mf.file_from_offset + pos
    info = check_record(mf.buffer, pos, mf.file_size, check_crc=True, expected_offset=phys)
    if info.kind is RecordKind.CORRUPT:
        return CorruptRecordError(phys, info.reason)
    if info.kind is not RecordKind.MESSAGE:
        return None
    try:
        return decode_record(mf.read(pos, info.size))
    except CorruptRecordError as e:
        return CorruptRecordError(phys, e.reason)


def _via_commitlog(commitlog: MappedFileQueue, start: int) -> Iterator[_Item]:
    mf = commitlog.find_by_offset(start)
    if mf is None:
        yield f"no CommitLog file holds physical offset {start}"
        return
    while mf is not None:
        pos = 0
        while True:
            item = _decode_at(mf, pos)
            if item is None or isinstance(item, CorruptRecordError):
                if item is not None:
                    yield item
                    return
                break
            if item.commit_log_offset >= start:
                yield item
            pos += item.store_size
        info = check_record(mf.buffer, pos, mf.file_size, check_crc=False)
        if info.kind is not RecordKind.BLANK:
            return  # the end of the data
        nxt = commitlog.find_by_offset(mf.file_end_offset)
        if nxt is None and mf is not commitlog.last_file:
            yield CorruptRecordError(mf.file_end_offset, "no CommitLog file follows the blank")
            return
        mf = nxt


def _via_queue(
    commitlog: MappedFileQueue, cq_files: list[MappedFile], start: int
) -> Iterator[_Item]:
    end = 0
    for mf in cq_files:
        pos = _valid_units_end(mf.read(0, mf.file_size))
        end = (mf.file_from_offset + pos) // CQ_STORE_UNIT_SIZE
        if pos < mf.file_size:
            break
    for index, phy, size, _, _ in _iter_units(cq_files, end, start):
        if size == BLANK_UNIT_SIZE:
            continue
        cl = commitlog.find_by_offset(phy)
        if phy < commitlog.min_offset or cl is None:
            gone = "deleted" if phy < commitlog.min_offset else "no CommitLog file holds it"
            yield f"queueOffset: {index} offset: {phy} size: {size} ({gone})"
            continue
        item = _decode_at(cl, phy - cl.file_from_offset)
        if item is None:
            item = CorruptRecordError(phy, f"queue offset {index} points at a blank or nothing")
        yield item


# -- the ``basalt store`` command group ------------------------------------------------------

#: A command: parsed arguments, stdout, stderr -> exit status.
CommandHandler = Callable[[argparse.Namespace, TextIO, TextIO], int]


def _non_negative_int(text: str) -> int:
    try:
        value = int(text, 16) if text.lower().startswith("0x") else int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative: {value}")
    return value


def add_store_commands(parser: argparse.ArgumentParser) -> None:
    """Add ``check`` and ``dump`` under ``parser`` (the ``store`` group).

    Each subcommand sets ``handler`` (a :data:`CommandHandler`) in the namespace.
    """
    sub = parser.add_subparsers(dest="store_command", metavar="COMMAND", required=True)
    check = sub.add_parser(
        "check",
        help="verify a store root (read-only)",
        description="Verify every CommitLog record and every ConsumeQueue unit of a store "
        "root, read-only (safe beside a running store). Exit 0 when consistent, 1 on any "
        "inconsistency, 2 on a usage error.",
    )
    check.add_argument("root", type=Path, metavar="ROOT", help="the store root directory")
    check.add_argument("--json", action="store_true", help="print one JSON object")
    check.set_defaults(handler=run_check)
    dump = sub.add_parser(
        "dump",
        help="print records, one per line (read-only)",
        description="Print CommitLog records like kafka-dump-log. With --topic and --queue, "
        "iterate that ConsumeQueue and read --from-offset as a queue offset; otherwise walk "
        "the CommitLog and read it as a physical offset.",
    )
    dump.add_argument("root", type=Path, metavar="ROOT", help="the store root directory")
    dump.add_argument("--topic", help="only records of this topic")
    dump.add_argument("--queue", type=_non_negative_int, help="only records of this queue id")
    dump.add_argument("--from-offset", type=_non_negative_int, metavar="N", help="start here")
    dump.add_argument(
        "--body-bytes",
        type=_non_negative_int,
        default=DEFAULT_BODY_PREVIEW_BYTES,
        metavar="N",
        help=f"body preview length (default {DEFAULT_BODY_PREVIEW_BYTES})",
    )
    dump.set_defaults(handler=run_dump)


def run_check(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """``basalt store check``: 0 consistent, 1 inconsistent, 2 bad root."""
    try:
        report = check_store(args.root)
    except StoreRootError as e:
        err.write(f"basalt store check: error: {e}\n")
        return EXIT_USAGE
    if args.json:
        out.write(json.dumps(report.as_dict(), ensure_ascii=False) + "\n")
    else:
        out.write(report.summary() + "\n")
    return EXIT_OK if report.ok else EXIT_INCONSISTENT


def run_dump(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """``basalt store dump``: 0 done, 1 stopped at a corrupt record, 2 bad root."""
    try:
        result = dump_store(
            args.root,
            out,
            topic=args.topic,
            queue_id=args.queue,
            from_offset=args.from_offset,
            body_bytes=args.body_bytes,
        )
    except StoreRootError as e:
        err.write(f"basalt store dump: error: {e}\n")
        return EXIT_USAGE
    if not result.ok:
        err.write(f"basalt store dump: {result.error}\n")
    return EXIT_OK if result.ok else EXIT_INCONSISTENT
