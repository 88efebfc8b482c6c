"""IndexService: the IndexFiles of ``<root>/index/``, built from dispatched records.

RocketMQ 4.x's ``store/index/IndexService``. Files (:mod:`basalt.store.index_file`)
are ordered by name, which is their creation time; only the last one is
written. For every dispatched record the service adds ``topic#uniqKey`` (when
the record has a UNIQ_KEY property) and ``topic#key`` for each entry of the
space-separated KEYS property, all pointing at the record's CommitLog offset.
When the last file is full a new one is created, starting where the full one
ended, and the full one is handed to :meth:`IndexService.flush`.

Durability and the checkpoint (RocketMQ's rule): ``indexMsgTimestamp`` in the
checkpoint is the end timestamp of the newest *full* file known to be on disk.
After an abnormal exit, :meth:`IndexService.load` destroys every file whose
end timestamp is later than that, i.e. the file that was being written.
RocketMQ indexes its records again only as far back as recovery re-dispatches
and loses older ones; Basalt's store resumes from where the remaining files
end (or from the CommitLog's start when none remains), so every record is
indexed again (``MessageStore._catch_up_index``). The file being written is
therefore never flushed before shutdown: its pages would be thrown away after
a crash anyway.

Concurrency: one writer - :meth:`build_from_commitlog` (the store's bulk path,
on the dispatcher's thread) or :meth:`on_dispatch`/:meth:`build_index` (the
per-record Python path, kept as the reference the bulk path is tested
against). :meth:`query_offset` may run on any thread at the
same time: it holds ``_lock`` while it walks, and so do the operations that
close files (:meth:`delete_expired_file`, :meth:`shutdown`, :meth:`destroy`)
and those that replace the file list (a roll, :meth:`load`). The list is
replaced, never mutated in place, so the writer reads its last file without
the lock; within a file, readers and the writer follow the rule in
:mod:`basalt.store.index_file`. :meth:`flush` may run on a flush thread.
:meth:`shutdown` and :meth:`destroy` need the dispatcher stopped first.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from basalt.common import _records
from basalt.common.message import TRANSACTION_ROLLBACK_TYPE, transaction_type
from basalt.store.clock import Clock
from basalt.store.commitlog import CommitLog
from basalt.store.dispatcher import DispatchRequest
from basalt.store.errors import CorruptFileError, StoreClosedError, StoreConfigError
from basalt.store.failures import FailureChannel
from basalt.store.files import set_aside
from basalt.store.index_file import (
    DEFAULT_HASH_SLOT_NUM,
    DEFAULT_INDEX_NUM,
    IndexFile,
    index_file_name,
    index_file_size,
    is_index_file_name,
    next_index_file_name,
)

log = logging.getLogger(__name__)

#: RocketMQ's MessageStoreConfig.maxMsgsNumBatch: the most offsets one query returns.
DEFAULT_MAX_MSGS_NUM_BATCH = 64
#: RocketMQ's MAX_TRY_IDX_CREATE, and its pause between attempts.
MAX_TRY_IDX_CREATE = 3
CREATE_RETRY_INTERVAL_S = 1.0
#: Java's int: RocketMQ computes the file size as one.
_JAVA_INT_MAX = 2**31 - 1


class QueryOffsetResult(NamedTuple):
    """RocketMQ's QueryOffsetResult: candidate offsets, newest first, plus how far
    the index reached (the last file's end) when the query ran."""

    phy_offsets: list[int]
    index_last_update_timestamp: int
    index_last_update_phyoffset: int


@dataclass(frozen=True, slots=True)
class IndexLoadResult:
    """What :meth:`IndexService.load` found: file names kept and destroyed."""

    loaded: tuple[str, ...]
    destroyed: tuple[str, ...]
    #: Unfinished creations (``*.tmp``) removed.
    removed_tmp: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class DroppedIndexFile:
    """An index file set aside at start: it was damaged (or followed one that was)."""

    name: str
    reason: str
    #: Where it went: ``<root>/quarantine/index-<name>``.
    quarantine: str


@dataclass(frozen=True, slots=True)
class IndexRebuild:
    """What the store's start did to the index: the files it quarantined and the
    CommitLog range it indexed again (``MessageStore.index_rebuild``)."""

    dropped: tuple[DroppedIndexFile, ...]
    #: CommitLog offset indexing resumed from: where the kept files end.
    from_offset: int
    #: Where that catch-up reached (the dispatcher's position at start).
    to_offset: int


def build_key(topic: str, key: str) -> str:
    """The indexed string for a key of a topic: ``topic#key``."""
    return f"{topic}#{key}"


class IndexService:
    """The index files of one store; see the module docstring for the rules."""

    def __init__(
        self,
        store_path_root_dir: Path,
        *,
        clock: Clock,
        max_hash_slot_num: int = DEFAULT_HASH_SLOT_NUM,
        max_index_num: int = DEFAULT_INDEX_NUM,
        max_msgs_num_batch: int = DEFAULT_MAX_MSGS_NUM_BATCH,
    ) -> None:
        """Raises StoreConfigError for sizes RocketMQ could not hold: fewer than one
        slot or two entries (entry 0 is unused), or a file past 2 GiB - 1."""
        if max_hash_slot_num < 1:
            raise StoreConfigError("max_hash_slot_num must be at least 1")
        if max_index_num < 2:
            raise StoreConfigError("max_index_num must be at least 2: entry 0 is never used")
        if index_file_size(max_hash_slot_num, max_index_num) > _JAVA_INT_MAX:
            raise StoreConfigError(
                "an index file of max_hash_slot_num 4-byte slots and max_index_num "
                f"20-byte entries must stay below {_JAVA_INT_MAX + 1} bytes"
            )
        if max_msgs_num_batch < 1:
            raise StoreConfigError("max_msgs_num_batch must be at least 1")
        self.index_dir = Path(store_path_root_dir) / "index"
        self.clock = clock
        self.hash_slot_num = max_hash_slot_num
        self.index_num = max_index_num
        self.max_msgs_num_batch = max_msgs_num_batch
        #: Ascending by name; replaced under ``_lock``, never mutated in place.
        self._files: tuple[IndexFile, ...] = ()
        #: Full files not yet flushed: the next flush() makes them durable.
        self._unflushed_full: list[IndexFile] = []
        #: The checkpoint's indexMsgTimestamp as this service knows it.
        self._index_msg_timestamp_ms = 0
        self._lock = threading.Lock()
        self._closed = False
        #: CommitLog offset :meth:`build_from_commitlog` continues from.
        self.reput_offset = 0
        #: Keys of the record at ``reput_offset`` already put (a file filled mid-record).
        self._skip_keys = 0
        #: Set when no index file could be created: index building has stopped
        #: (RocketMQ's makeIndexFileError; its store then refuses writes).
        self.build_error: str | None = None
        #: Where a creation failure is recorded (set by the owner): RocketMQ's store
        #: refuses writes once no index file can be made, and so does this one.
        self.failures: FailureChannel | None = None
        #: Files quarantined by load() and check(), in order.
        self._dropped: list[DroppedIndexFile] = []

    # -- load -------------------------------------------------------------------------

    def load(self, last_exit_ok: bool, index_msg_timestamp_ms: int) -> IndexLoadResult:
        """Map every index file, oldest first (RocketMQ's ``load``).

        After an abnormal exit (``last_exit_ok`` False) a file whose end
        timestamp is later than the checkpoint's ``index_msg_timestamp_ms`` is
        destroyed: it may hold entries that never reached the disk, and
        re-dispatch rebuilds them. Leftover ``*.tmp`` files (a creation cut
        short) are removed. A file of the wrong size, and every file after it,
        is moved to quarantine (``<root>/quarantine/index-<name>``): the index is
        derived data, so a damaged file is a reason to rebuild (:meth:`check`),
        never to refuse to start. Other names are ignored.
        """
        loaded: list[IndexFile] = []
        destroyed: list[str] = []
        removed: list[str] = []
        damaged = False
        if self.index_dir.is_dir():
            for path in sorted(self.index_dir.iterdir()):
                if path.name.endswith(".tmp") and is_index_file_name(path.name[:-4]):
                    path.unlink()
                    removed.append(path.name)
                    continue
                if not is_index_file_name(path.name):
                    log.warning("ignoring %s: not an index file name", path)
                    continue
                if damaged:
                    self._quarantine_path(path, "follows a damaged index file")
                    continue
                try:
                    f = IndexFile.open(path, self.hash_slot_num, self.index_num)
                except CorruptFileError as e:
                    self._quarantine_path(path, e.reason)
                    damaged = True
                    continue
                except BaseException:
                    for g in loaded:
                        g.close()
                    raise
                if not last_exit_ok and f.end_timestamp_ms > index_msg_timestamp_ms:
                    log.info(
                        "destroying index file %s: ends at %d, after the checkpoint's %d",
                        path.name,
                        f.end_timestamp_ms,
                        index_msg_timestamp_ms,
                    )
                    f.destroy()
                    destroyed.append(path.name)
                    continue
                loaded.append(f)
        with self._lock:
            self._files = tuple(loaded)
            self._index_msg_timestamp_ms = index_msg_timestamp_ms
        log.info("loaded index files %s", [f.file_name for f in loaded])
        return IndexLoadResult(tuple(f.file_name for f in loaded), tuple(destroyed), tuple(removed))

    def check(self, commitlog: CommitLog) -> tuple[DroppedIndexFile, ...]:
        """Check the loaded files against themselves and ``commitlog`` (recovered);
        quarantine the first untrustworthy one and every file after it. Returns
        every file quarantined since construction (by :meth:`load` too).

        Each file must pass :meth:`IndexFile.check`, and the files must cover
        the CommitLog without a gap: a file with entries begins at its
        predecessor's end (the record that filled it) or at the first record
        after that end which has a key, and the first file no later than the
        first keyed record from the CommitLog's start. That is how a deleted
        middle file shows: its predecessor is full and the next one begins
        records later. Finding the first keyed record walks the CommitLog
        only until a key: a few records. Before the dispatcher starts.
        """
        files = self._files
        keep = len(files)
        reason: str | None = None
        max_offset = commitlog.max_offset
        for i, f in enumerate(files):
            prev = files[i - 1] if i else None
            reason = f.check(max_offset, prev)
            if reason is None and f.index_count > 1:
                after = commitlog.min_offset if prev is None else prev.end_phy_offset
                if f.begin_phy_offset > after:
                    first = self._first_keyed_offset(
                        commitlog, after, inclusive=prev is None, limit=f.begin_phy_offset
                    )
                    if first is not None and first < f.begin_phy_offset:
                        reason = (
                            f"begins at commitlog offset {f.begin_phy_offset} but the record "
                            f"at {first} has a key no index file holds (a file is missing)"
                        )
            if reason is not None:
                keep = i
                break
        if keep < len(files):
            with self._lock:
                self._files = files[:keep]
            for j, f in enumerate(files[keep:]):
                f.close()
                self._quarantine_path(f.path, reason if j == 0 else "follows a damaged index file")
        return tuple(self._dropped)

    def truncate_from(self, offset: int) -> int:
        """Forget every entry for CommitLog offsets at or past ``offset`` (a durable
        truncation): the files holding any are deleted, and :meth:`build_from_commitlog`
        indexes again from the start of the first of them. Returns how many files
        went. The dispatcher must be stopped (or not started)."""
        files = self._files
        keep = len(files)
        for i, f in enumerate(files):
            if f.index_count > 1 and f.end_phy_offset >= offset:
                keep = i
                break
        doomed = files[keep:]
        restart = min([offset, *(f.begin_phy_offset for f in doomed if f.index_count > 1)])
        with self._lock:
            self._files = files[:keep]
            self._unflushed_full = [f for f in self._unflushed_full if f not in doomed]
        for f in doomed:
            f.destroy()
        if self.reput_offset > restart:
            self.reput_offset = restart
            self._skip_keys = 0
        return len(doomed)

    @property
    def dropped(self) -> tuple[DroppedIndexFile, ...]:
        """The files quarantined by :meth:`load` and :meth:`check`, in order."""
        return tuple(self._dropped)

    def _quarantine_path(self, path: Path, reason: str | None) -> None:
        """Move ``path`` to ``<root>/quarantine/index-<name>`` (never over an earlier
        one) for an operator to look at, and log why at ERROR."""
        target = set_aside(path, self.index_dir.parent / "quarantine", f"index-{path.name}")
        why = reason or "damaged"
        log.error("index file %s quarantined to %s: %s", path.name, target, why)
        self._dropped.append(DroppedIndexFile(path.name, why, str(target)))

    @staticmethod
    def _first_keyed_offset(
        commitlog: CommitLog, after: int, *, inclusive: bool, limit: int
    ) -> int | None:
        """Offset of the first record after ``after`` (or at it, ``inclusive``) and
        below ``limit`` that the index would hold a key of; None when there is none
        (or the CommitLog does not parse there: the dispatcher reports that).

        Uses the C indexer on a scratch index of one slot and one entry, which
        is full after the first key put: its end offset is that key's record.
        """
        scratch = bytearray(index_file_size(1, 2))
        pos = max(after, commitlog.min_offset)  # a record boundary, as index_put needs
        # index_put skips the records below its state's end offset: the one at
        # ``after`` too unless ``inclusive``.
        skip_below = pos if inclusive or pos > after else after + 1
        while pos < limit:
            mf = commitlog.files.find_by_offset(pos)
            if mf is None or not mf.hold():
                return None
            try:
                rel = pos - mf.file_from_offset
                lim = min(limit - mf.file_from_offset, mf.wrote_position)
                new_rel, _, state, stop, _ = _records.index_put(
                    mf.buffer,
                    rel,
                    lim,
                    mf.file_from_offset,
                    scratch,
                    1,
                    2,
                    (0, 0, 0, skip_below, 0, 1),
                    0,
                )
            finally:
                mf.release()
            if state[5] > 1:
                return state[3]
            if stop == _records.INDEX_BLANK:
                pos = mf.file_end_offset
            elif stop == _records.INDEX_CORRUPT or new_rel == rel:
                return None
            else:
                pos = mf.file_from_offset + new_rel
        return None

    # -- accessors --------------------------------------------------------------------

    @property
    def files(self) -> tuple[IndexFile, ...]:
        """The index files, oldest first (a snapshot)."""
        return self._files

    @property
    def index_msg_timestamp_ms(self) -> int:
        """What the checkpoint's indexMsgTimestamp should hold (see :meth:`flush`)."""
        return self._index_msg_timestamp_ms

    @property
    def total_size(self) -> int:
        """Bytes of all index files."""
        return len(self._files) * index_file_size(self.hash_slot_num, self.index_num)

    # -- build ------------------------------------------------------------------------

    def on_dispatch(self, requests: Sequence[DispatchRequest]) -> None:
        """The DispatchListener hook: :meth:`build_index`."""
        self.build_index(requests)

    def build_index(self, requests: Sequence[DispatchRequest]) -> None:
        """Index each record, in order (RocketMQ's ``buildIndex``, per record).

        A record below the last file's endPhyOffset is skipped: it was indexed
        before (re-dispatch after a restart). The record *at* that offset is not
        skipped (RocketMQ compares with ``<``), so re-dispatch indexes the last
        indexed record once more and a query may return its offset twice.
        Rolled-back transactional records are skipped. Prepared ones are
        indexed, as RocketMQ 4.x does (the dispatcher never hands them over).
        Dispatcher thread only. Raises StoreClosedError after shutdown.
        """
        if self._closed:
            raise StoreClosedError("index service is shut down")
        for req in requests:
            if self.build_error is not None:
                return
            f = self._retry_get_and_create_last_file()
            if f is None:
                return
            if req.commit_log_offset < f.end_phy_offset:
                continue
            if transaction_type(req.sys_flag) == TRANSACTION_ROLLBACK_TYPE:
                continue
            uniq_key = req.uniq_key
            if uniq_key is not None:
                f = self._put_key(f, req, build_key(req.topic, uniq_key))
                if f is None:
                    return
            for key in req.keys:
                f = self._put_key(f, req, build_key(req.topic, key))
                if f is None:
                    return

    def build_from_commitlog(self, commitlog: CommitLog, end_offset: int) -> int:
        """Index the CommitLog's records from :attr:`reput_offset` up to ``end_offset``
        (which must be a record boundary below which everything is dispatched);
        returns the bytes of CommitLog covered.

        The bulk path: records are read where they are stored (each file held
        against expiry while it is read) and indexed by C without the GIL
        (:meth:`IndexFile.put_records`), so the dispatcher thread can follow a
        fast writer. A record that does not parse stops the index (``build_error``).
        Dispatcher thread only (or before it starts).
        """
        if self._closed:
            raise StoreClosedError("index service is shut down")
        start = pos = max(self.reput_offset, commitlog.min_offset)
        while pos < end_offset and self.build_error is None:
            f = self._retry_get_and_create_last_file()
            mf = commitlog.files.find_by_offset(pos)
            if f is None or mf is None:
                break
            if not mf.hold():  # being deleted by expiry: its records are gone
                pos = mf.file_end_offset
                continue
            try:
                rel = pos - mf.file_from_offset
                limit = min(end_offset - mf.file_from_offset, mf.wrote_position)
                new_rel, self._skip_keys, stop, reason = f.put_records(
                    mf.buffer, rel, limit, mf.file_from_offset, self._skip_keys
                )
            finally:
                mf.release()
            pos = mf.file_from_offset + new_rel
            if stop == _records.INDEX_BLANK:
                pos = mf.file_end_offset
            elif stop == _records.INDEX_CORRUPT:
                self.build_error = f"commitlog offset {pos}: {reason}"
                log.error("index building stopped: %s", self.build_error)
            elif stop == _records.INDEX_DONE and new_rel == rel:
                break  # nothing more is written in this file yet
        self.reput_offset = pos
        return pos - start

    def _put_key(self, f: IndexFile, req: DispatchRequest, key: str) -> IndexFile | None:
        """Put ``key`` into ``f`` or, when it is full, into a new last file."""
        while not f.put_key(key, req.commit_log_offset, req.store_timestamp_ms):
            log.warning("index file %s is full, creating another one", f.file_name)
            new = self._retry_get_and_create_last_file()
            if new is None:
                log.error(
                    "putKey error: commitlog offset %d uniq key %s",
                    req.commit_log_offset,
                    req.uniq_key,
                )
                return None
            f = new
        return f

    def _retry_get_and_create_last_file(self) -> IndexFile | None:
        """The last file, or a new one if there is none or it is full; None (and
        ``build_error`` set) when creation failed MAX_TRY_IDX_CREATE times."""
        files = self._files
        if files and not files[-1].is_write_full:
            return files[-1]
        error: OSError | None = None
        for attempt in range(MAX_TRY_IDX_CREATE):
            if attempt:
                time.sleep(CREATE_RETRY_INTERVAL_S)
            try:
                return self._create_last_file()
            except OSError as e:
                error = e
                log.error("creating an index file failed (attempt %d): %s", attempt + 1, e)
        self.build_error = f"cannot create an index file in {self.index_dir}: {error}"
        log.error("index building stopped: %s", self.build_error)
        if self.failures is not None and error is not None:
            self.failures.record("index-service", error)
        return None

    def _create_last_file(self) -> IndexFile:
        prev = self._files[-1] if self._files else None
        self.index_dir.mkdir(parents=True, exist_ok=True)
        name = index_file_name(self.clock.now_ms())
        if prev is not None and name <= prev.file_name:
            name = next_index_file_name(prev.file_name)  # same millisecond, or clock went back
        while (self.index_dir / name).exists():
            name = next_index_file_name(name)
        f = IndexFile.create(
            self.index_dir / name,
            self.hash_slot_num,
            self.index_num,
            end_phy_offset=prev.end_phy_offset if prev is not None else 0,
            end_timestamp_ms=prev.end_timestamp_ms if prev is not None else 0,
        )
        with self._lock:
            self._files = (*self._files, f)
            if prev is not None:
                self._unflushed_full.append(prev)
        log.info("created index file %s", name)
        return f

    # -- query ------------------------------------------------------------------------

    def query_offset(
        self, topic: str, key: str, max_num: int, begin_ms: int, end_ms: int
    ) -> QueryOffsetResult:
        """CommitLog offsets of records indexed under ``topic#key`` with a store
        time in ``[begin_ms, end_ms]`` (second resolution), newest file first.

        RocketMQ's ``queryOffset``: ``max_num`` is capped at
        ``max_msgs_num_batch``; files whose time span overlaps the range are
        searched from the newest; the walk stops after a file that begins
        before ``begin_ms`` or once ``max_num`` offsets are found. Offsets are
        candidates: keys sharing a Java hash share entries, so the caller
        re-checks the key on each record. Any thread.
        """
        max_num = min(max_num, self.max_msgs_num_batch)
        phy_offsets: list[int] = []
        last_update_ts = last_update_phy = 0
        full_key = build_key(topic, key)
        with self._lock:
            files = self._files
            if files:
                last = files[-1].header
                last_update_ts, last_update_phy = last.end_timestamp_ms, last.end_phy_offset
            for f in reversed(files):
                if f.is_time_matched(begin_ms, end_ms):
                    f.select_phy_offsets(
                        full_key, max_num, begin_ms, end_ms, phy_offsets=phy_offsets
                    )
                if f.begin_timestamp_ms < begin_ms or len(phy_offsets) >= max_num:
                    break
        return QueryOffsetResult(phy_offsets, last_update_ts, last_update_phy)

    # -- flush, expiry, lifecycle -----------------------------------------------------

    def flush(self) -> int:
        """fsync every full file not yet flushed; returns the value for the
        checkpoint's indexMsgTimestamp: the end timestamp of the newest full file
        on disk, or the value :meth:`load` was given when no file filled since.

        RocketMQ flushes a full file on a thread of its own at the roll and then
        writes the checkpoint; here the caller's flush loop calls this (it
        blocks on fsync: keep it off an event loop) and writes the checkpoint.
        Any thread.
        """
        with self._lock:
            pending = list(self._unflushed_full)
        for f in pending:
            header = f.flush()  # None: deleted meanwhile, nothing left to make durable
            with self._lock:
                if f in self._unflushed_full:
                    self._unflushed_full.remove(f)
                if header is not None and header.end_timestamp_ms > self._index_msg_timestamp_ms:
                    self._index_msg_timestamp_ms = header.end_timestamp_ms
        return self._index_msg_timestamp_ms

    def delete_expired_file(self, commitlog_min_offset: int) -> int:
        """Destroy the oldest files whose endPhyOffset is below
        ``commitlog_min_offset`` (their records are gone from the CommitLog);
        never the last file. Returns how many were destroyed. Any thread."""
        with self._lock:
            files = self._files
            if not files or files[0].end_phy_offset >= commitlog_min_offset:
                return 0
            expired = 0
            for f in files[:-1]:
                if f.end_phy_offset >= commitlog_min_offset:
                    break
                expired += 1
            for f in files[:expired]:
                log.info("destroying expired index file %s", f.file_name)
                f.destroy()
                if f in self._unflushed_full:
                    self._unflushed_full.remove(f)
            self._files = files[expired:]
        return expired

    def shutdown(self) -> None:
        """Flush and close every file (RocketMQ's ``shutdown``); idempotent.

        Afterwards :attr:`index_msg_timestamp_ms` covers every full file. Every
        file is closed even if a flush fails; the first failure is re-raised.
        The dispatcher must be stopped first.
        """
        with self._lock:
            self._closed = True
            files, self._files = self._files, ()
            self._unflushed_full.clear()
        failure: OSError | None = None
        for f in files:
            try:
                header = f.flush()
            except OSError as e:
                log.error("flushing index file %s failed: %s", f.file_name, e)
                failure = failure or e
                header = None
            f.close()
            if header is not None and f.is_write_full:
                with self._lock:
                    ts = max(self._index_msg_timestamp_ms, header.end_timestamp_ms)
                    self._index_msg_timestamp_ms = ts
        if failure is not None:
            raise failure

    close = shutdown

    def destroy(self) -> None:
        """Close and delete every file. The dispatcher must be stopped first."""
        with self._lock:
            self._closed = True
            files, self._files = self._files, ()
            self._unflushed_full.clear()
            for f in files:
                f.destroy()
