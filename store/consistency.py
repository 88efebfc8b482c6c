"""``basalt store check``: a read-only consistency verifier for a store root.

:func:`check_store` opens the root through :mod:`basalt.store.readonly` (no lock, no
``abort``, nothing written, truncated or recovered), so it may run beside a
live store or on a crashed root before recovery. It makes four passes:

1. every ConsumeQueue: find its written end (the first invalid unit, as
   ConsumeQueue recovery would) and report data past it (a hole);
2. the whole CommitLog from its first file: every record's magic code,
   TOTALSIZE, CRC and PHYSICALOFFSET, end-of-file blanks, no gap between
   files, and queue offsets consecutive per (topic, queue) for dispatchable
   records; records at or past their queue's written end are *undispatched*;
3. every ConsumeQueue unit below the end found in pass 1 — except filler units
   and units whose record is below the CommitLog min offset — must point at a
   dispatchable record of its own topic and queue, with the unit's size and
   tagsCode, whose QUEUEOFFSET is the unit's index;
4. the checkpoint, consumer offsets, queue manifest, pop journal and
   IndexFiles, each by its loader's own rule
   (:mod:`basalt.store.consistency_files`).

Undispatched records are *info* while an ``abort`` file is present (the store
is running, or crashed and awaits recovery, which re-dispatches them) and a
*problem* (``undispatched``) when it is absent: a clean shutdown always lets
the dispatcher catch up before it removes ``abort``.

Pass 1 runs before pass 2 so that, on a running store, every unit checked
points at a record the CommitLog walk has seen. A record being written while
the walk reads it may look torn: the last file's tail is read twice before
it is called corrupt, but only a quiescent root gives a definitive answer.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

from basalt.common.message import (
    PROPERTY_TAGS,
    SCHEDULE_TOPIC,
    decode_properties,
    is_dispatchable,
)
from basalt.common.record import RecordInfo, RecordKind
from basalt.store.checkpoint import StoreCheckpoint
from basalt.store.config import CQ_STORE_UNIT_SIZE, MessageStoreConfig
from basalt.store.consistency_files import check_side_files
from basalt.store.consume_queue import ConsumeQueue
from basalt.store.hashing import tags_code
from basalt.store.mapped_file import MappedFile
from basalt.store.mapped_file_queue import MappedFileQueue
from basalt.store.readonly import (
    StoreRootError,
    check_at,
    iso_ms,
    open_consume_queue,
    open_data_files,
    report_shrunk,
    store_layout,
)
from basalt.store.resync import is_tombstone

__all__ = [
    "CheckCounts",
    "CheckReport",
    "Problem",
    "QueueReport",
    "StoreRootError",
    "check_store",
    "unit_mismatch",
]

#: Problems kept in a report; the rest are only counted (``problems_total``).
MAX_PROBLEMS = 1000
#: Problems the human summary lists.
SUMMARY_PROBLEMS = 50

QueueKey = tuple[str, int]


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
    #: ConsumeQueue files mapped, up to the one holding the written end.
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
    """Collects problems (keeping the first MAX_PROBLEMS) and info lines.

    A :class:`basalt.store.readonly.Findings` sink.
    """

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


# -- check --------------------------------------------------------------------------------


@dataclass(slots=True)
class _Queue:
    """Running state of one (topic, queue) during a check."""

    cq: ConsumeQueue | None = None
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

    def __init__(
        self,
        layout: MessageStoreConfig,
        index_geometry: tuple[int, int] | None = None,
        commitlog_file_size: int | None = None,
    ) -> None:
        self.layout = layout
        self.index_geometry = index_geometry
        self.commitlog_file_size = commitlog_file_size
        self.findings = _Findings()
        self.queues: dict[QueueKey, _Queue] = {}
        #: Mapped after pass 1, so that every unit checked points below the CommitLog seen.
        self.commitlog = MappedFileQueue(layout.commitlog_dir, 1, read_only=True)
        self.abort = False
        #: The checkpoint's confirmPhyOffset (controller mode; 0 otherwise): records
        #: at or past it wait for it, they are not behind.
        self.confirm_offset = 0
        self.unconfirmed = 0
        self.records = self.not_dispatchable = self.blanks = 0
        self.walk_end = 0
        self.resynced = False

    def close(self) -> None:
        self.commitlog.close()
        for q in self.queues.values():
            if q.cq is not None:
                q.cq.close()

    def run(self) -> CheckReport:
        layout, f = self.layout, self.findings
        self.abort = layout.abort_path.exists()
        if self.abort:
            f.note("abort file present: the store is running, or crashed and was not recovered yet")
        else:
            f.note("no abort file: the last shutdown was clean (or the store never started)")
        if layout.checkpoint_path.is_file():
            cp = StoreCheckpoint(layout.checkpoint_path, read_only=True)
            stamps = (
                ("physic", cp.physic_msg_timestamp),
                ("logics", cp.logics_msg_timestamp),
                ("index", cp.index_msg_timestamp),
            )
            f.note("checkpoint: " + ", ".join(f"{n} {ms} ({iso_ms(ms)})" for n, ms in stamps))
            self.confirm_offset = cp.confirm_phy_offset
            if self.confirm_offset:
                f.note(f"checkpoint: confirm offset {self.confirm_offset} (controller mode)")
        self._open_consume_queues()
        self.commitlog = open_data_files(
            layout.commitlog_dir, "commitlog", f, file_size=self.commitlog_file_size
        )
        self._walk_commitlog()
        for key, q in sorted(self.queues.items()):
            self._check_units(key, q)
        self._check_undispatched()
        check_side_files(
            layout.store_path_root_dir,
            f,
            abort=self.abort,
            commitlog_max_offset=self.walk_end,
            queue_ends={k: q.cq_end for k, q in self.queues.items() if q.cq is not None},
            index_geometry=self.index_geometry,
        )
        report_shrunk(self.commitlog, "commitlog", f)
        for (topic, queue_id), q in sorted(self.queues.items()):
            if q.cq is not None:
                report_shrunk(q.cq.files, f"consumequeue {topic}/{queue_id}", f)
        return self._report()

    # -- pass 1 ------------------------------------------------------------------------

    def _open_consume_queues(self) -> None:
        cq_root = self.layout.consume_queue_dir
        if not cq_root.is_dir():
            return
        for topic_dir in sorted(p for p in cq_root.iterdir() if p.is_dir()):
            for queue_dir in sorted(topic_dir.iterdir()):
                if not (queue_dir.is_dir() and queue_dir.name.isdigit()):
                    self.findings.note(f"ignored {queue_dir}: not a queue id directory")
                    continue
                key = (topic_dir.name, int(queue_dir.name))
                cq = open_consume_queue(self.layout, *key, self.findings)
                if cq is not None:
                    self.queues[key] = _Queue(
                        cq, cq_start=cq.min_offset_in_queue, cq_end=cq.max_offset_in_queue
                    )

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
            info = check_at(mf, pos)
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
            if is_tombstone(info.topic, info.sys_flag):
                self._resync()  # recovery set a lost record aside here: offsets jump
            return
        q = self.queues.setdefault((info.topic, info.queue_id), _Queue())
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
        if offset >= q.cq_end and self.confirm_offset and phys >= self.confirm_offset:
            self.unconfirmed += 1  # controller mode: dispatched once confirmed
        elif offset >= q.cq_end:
            q.undispatched += 1
        elif offset < q.cq_start:
            q.before_cq += 1

    # -- pass 3 ------------------------------------------------------------------------

    def _check_units(self, key: QueueKey, q: _Queue) -> None:
        """Check every unit of the queue; filler units are the indexes ``iter_units`` skips."""
        if q.before_cq:
            topic, queue_id = key
            self.findings.problem(
                "cq-missing",
                f"consumequeue {topic}/{queue_id}: {q.before_cq} records in the CommitLog have "
                f"queue offsets below the first ConsumeQueue file (queue offset {q.cq_start})",
                offset=q.cq_start,
            )
        cq = q.cq
        if cq is None:
            return
        min_offset = self.commitlog.min_offset
        next_index = q.cq_start
        for index, phy, size, code in cq.iter_units(q.cq_start):
            self._filler_units(q, cq, next_index, index)
            next_index = index + 1
            if phy < min_offset:
                q.below_min += 1
                self._unit_without_record(q, cq, index, f"offset {phy}")
                continue
            q.units_checked += 1
            reason = self._unit_mismatch(key, index, phy, size, code)
            if reason:
                self._unit_problem("cq-mismatch", cq, index, reason)
        self._filler_units(q, cq, next_index, q.cq_end)

    def _filler_units(self, q: _Queue, cq: ConsumeQueue, start: int, end: int) -> None:
        for index in range(start, end):
            q.filler += 1
            self._unit_without_record(q, cq, index, "a filler unit")

    def _unit_without_record(self, q: _Queue, cq: ConsumeQueue, index: int, what: str) -> None:
        """A filler or deleted-record unit: a hole if the CommitLog still holds its record."""
        first_kept = q.first if q.first is not None else q.cq_end
        if index >= first_kept and not self.resynced:
            why = f"{what} but the CommitLog holds the queue's records from queue offset"
            self._unit_problem("cq-hole", cq, index, f"{why} {first_kept}")

    def _unit_problem(self, code: str, cq: ConsumeQueue, index: int, why: str) -> None:
        mf = cq.files.find_by_offset(index * CQ_STORE_UNIT_SIZE)
        assert mf is not None  # every unit checked lies below the written end
        self.findings.problem(
            code,
            f"consumequeue {cq.topic}/{cq.queue_id} unit at queue offset {index} "
            f"({mf.path.name}): {why}",
            path=mf.path,
            offset=index,
        )

    def _unit_mismatch(self, key: QueueKey, index: int, phy: int, size: int, code: int) -> str:
        return unit_mismatch(self.commitlog, key, index, phy, size, code)

    # -- the verdict on lag, and the report --------------------------------------------

    def _check_undispatched(self) -> None:
        """Lag behind the CommitLog is info with ``abort`` present, a problem without;
        records past the checkpoint's confirm offset (controller mode) are info."""
        if self.unconfirmed:
            self.findings.note(
                f"records past the confirm offset {self.confirm_offset}: {self.unconfirmed} "
                "(controller mode: dispatched once the in-sync replicas have them)"
            )
        lagging = {k: q for k, q in sorted(self.queues.items()) if q.undispatched}
        if not lagging:
            return
        if self.abort:
            total = sum(q.undispatched for q in lagging.values())
            items = list(lagging.items())[:20]
            detail = ", ".join(f"{t}/{i}: {q.undispatched}" for (t, i), q in items)
            self.findings.note(f"undispatched records: {total} ({detail})")
            return
        for (topic, queue_id), q in lagging.items():
            self.findings.problem(
                "undispatched",
                f"consumequeue {topic}/{queue_id}: {q.undispatched} records from queue offset "
                f"{q.cq_end} are in the CommitLog but in no ConsumeQueue unit, and there is "
                f"no abort file (a clean shutdown dispatches every record)",
                path=self.layout.consume_queue_dir / topic / str(queue_id),
                offset=q.cq_end,
            )

    def _report(self) -> CheckReport:
        cl = self.commitlog
        queues = tuple(
            QueueReport(
                topic=t,
                queue_id=i,
                records=q.records,
                first_queue_offset=q.first,
                last_queue_offset=q.last,
                consume_queue_files=len(q.cq.files.files) if q.cq else 0,
                consume_queue_min_offset=q.cq_start,
                consume_queue_max_offset=q.cq_end,
                units_checked=q.units_checked,
                undispatched=q.undispatched,
            )
            for (t, i), q in sorted(self.queues.items())
        )
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
            consume_queue_files=sum(q.consume_queue_files for q in queues),
            consume_queue_units_checked=sum(q.units_checked for q in queues),
            consume_queue_filler_units=sum(q.filler for q in self.queues.values()),
            consume_queue_units_below_min=sum(q.below_min for q in self.queues.values()),
            undispatched_records=sum(q.undispatched for q in queues),
        )
        f = self.findings
        return CheckReport(
            self.layout.store_path_root_dir,
            counts,
            tuple(f.problems),
            tuple(f.info),
            queues,
            f.total,
        )


def unit_mismatch(
    commitlog: MappedFileQueue, key: QueueKey, index: int, phy: int, size: int, code: int
) -> str:
    """Why the ConsumeQueue unit ``index`` of queue ``key`` (``phy``, ``size``,
    ``code``) does not describe the record at ``phy`` of ``commitlog``; "" when it
    does. Pass 3's rule: a CommitLog file holds ``phy``, a record starts there
    (CRC not checked: pass 2 does that), of the unit's topic, queue, size, queue
    offset and tagsCode, and dispatchable. Shared with ``basalt pipeline verify``.
    """
    mf = commitlog.find_by_offset(phy)
    if mf is None:
        return f"points at commitlog offset {phy}, which no CommitLog file holds"
    info = check_at(mf, phy - mf.file_from_offset, check_crc=False)
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
    expected_code = tags_code(decode_properties(info.properties).get(PROPERTY_TAGS))
    # SCHEDULE_TOPIC_XXXX's tagsCode is a due time from the delay levels configured at
    # dispatch (store.schedule), not known here: not checked.
    if expected_code != code and info.topic != SCHEDULE_TOPIC:
        wrong.append(f"tagsCode {code} but the record's tags hash to {expected_code}")
    return f"commitlog offset {phy}: " + "; ".join(wrong) if wrong else ""


def check_store(
    root: Path,
    *,
    index_geometry: tuple[int, int] | None = None,
    commitlog_file_size: int | None = None,
) -> CheckReport:
    """Verify a store root read-only; see the module docstring for what is checked.

    Returns the report (``ok`` false on any inconsistency); raises
    StoreRootError when ``root`` is missing or not a store root. Never writes,
    locks or truncates anything, so it may run beside a live store.
    ``index_geometry``: the store's (``max_hash_slot_num``, ``max_index_num``),
    which IndexFiles do not record; without it, inferred from their size.
    ``commitlog_file_size``: the store's ``mapped_file_size_commit_log``, which
    a CommitLog file must be exactly (the store refuses any other size);
    without it, the most common size on disk, so a one-file store's only file
    passes whatever its size.
    """
    checker = _Checker(store_layout(root), index_geometry, commitlog_file_size)
    try:
        return checker.run()
    finally:
        checker.close()
