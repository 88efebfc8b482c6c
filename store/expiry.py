"""Expired file deletion: RocketMQ's CleanCommitLogService and CleanConsumeQueueService.

A CommitLog file is *expired* once its last write is ``file_reserved_time_hours``
old. Expired files are deleted only when one of these holds:

* the hour is one of ``delete_when`` (default "04": at night),
* disk use of the store's filesystem passes ``disk_max_used_space_ratio`` %,
* an operator asked (:meth:`ExpiryService.delete_manually`: the next 20 runs).

Past ``disk_space_clean_forcibly_ratio`` % (with ``clean_file_forcibly_enable``)
files go even when young, oldest first; past ``disk_space_warning_level_ratio``
% the store refuses sends until use falls back (``disk_full``).

Deletion goes from the oldest file, never the file being written, never a
file the dispatcher has not finished with, and stops at the first file that
is not expired (no holes). Between two deleted files it pauses
``delete_commit_log_files_interval_ms``; a file a reader holds is retried and
deleted anyway after ``destroy_mapped_file_interval_forcibly_ms``. Then
ConsumeQueue (and index) files wholly below the new CommitLog min offset
follow, and every ConsumeQueue's min offset is corrected, so a pull below it
gets OFFSET_TOO_SMALL with the corrected next offset.

Disk use is measured as ``df`` does: ``used / (used + avail)`` from
``statvfs`` (``used = f_blocks - f_bfree``, ``avail = f_bavail``), so root's
reserved blocks count neither as used nor as available. It is measured on
every run, whenever a data file is created under the store root
(:func:`basalt.store.files.watch_file_creation`), and by a send that finds
the last measure older than :data:`SPACE_RECHECK_S` or the CommitLog grown
by half the room that was left below the warning ratio: a timer alone let
a small disk fill between two runs, and sends were first refused at 100 %.

Time comes from the store's clock and disk use from an injectable probe, so
tests need no waiting and no full disk.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from basalt.store.clock import Clock
from basalt.store.commitlog import CommitLog
from basalt.store.config import MessageStoreConfig
from basalt.store.consume_queue_table import ConsumeQueueTable
from basalt.store.files import watch_file_creation
from basalt.store.mapped_file import MappedFile
from basalt.store.service_thread import ServiceThread

log = logging.getLogger(__name__)

#: RocketMQ's MAX_MANUAL_DELETE_FILE_TIMES: runs a manual request stays active.
MANUAL_DELETE_RUNS = 20
#: RocketMQ's DELETE_FILES_BATCH_MAX: CommitLog files deleted per run at most.
DELETE_FILES_BATCH_MAX = 10
_HOUR_MS = 3_600_000


#: A send re-measures disk use when the last measure is older than this: a
#: statvfs per send would cost more than it tells.
SPACE_RECHECK_S = 0.1


def disk_used_percent(path: Path) -> float:
    """Used share of the filesystem holding ``path``, in percent, as ``df`` shows it
    (-1 if unknown): ``used / (used + avail)`` with ``used = f_blocks - f_bfree``
    and ``avail = f_bavail``. ``(total - free) / total`` would count root's
    reserve as used: 70 % for a disk ``df`` shows at 31 %."""
    try:
        st = os.statvfs(path)
    except OSError:
        return -1.0
    used = st.f_blocks - st.f_bfree
    seen = used + st.f_bavail
    return 100.0 * used / seen if seen > 0 else -1.0


def _filesystem_bytes(path: Path) -> int:
    """Bytes ``df`` counts as the size of the filesystem holding ``path`` (used +
    available); 0 if unknown."""
    try:
        st = os.statvfs(path)
    except OSError:
        return 0
    return (st.f_blocks - st.f_bfree + st.f_bavail) * st.f_frsize


class IndexExpiry(Protocol):
    """The IndexService's part in expiry."""

    def delete_expired_file(self, commitlog_min_offset: int) -> int: ...


@dataclass(slots=True)
class ExpiryReport:
    """What one run deleted, and why it ran."""

    commitlog_files: list[str] = field(default_factory=list)
    consume_queue_files: int = 0
    index_files: int = 0
    reasons: list[str] = field(default_factory=list)

    @property
    def deleted_anything(self) -> bool:
        return bool(self.commitlog_files or self.consume_queue_files or self.index_files)


class ExpiryService(ServiceThread):
    """Deletes expired CommitLog files, then the ConsumeQueue and index files they
    leave behind. ``run_once`` is the whole job; the thread calls it every
    ``clean_resource_interval_ms``."""

    name = "clean-expired-files"

    def __init__(
        self,
        config: MessageStoreConfig,
        commitlog: CommitLog,
        consume_queues: ConsumeQueueTable,
        clock: Clock,
        *,
        dispatched_to: Callable[[], int],
        index: IndexExpiry | None = None,
        disk_usage: Callable[[Path], float] = disk_used_percent,
    ) -> None:
        super().__init__()
        self.config = config
        self.commitlog = commitlog
        self.consume_queues = consume_queues
        self.clock = clock
        self.dispatched_to = dispatched_to
        self.index = index
        self.disk_usage = disk_usage
        self._disk_full = False
        self._measured_at = float("-inf")
        #: The last disk use measured, in percent (None before the first): for a
        #: monitor that must not measure itself (a statvfs per scrape).
        self.last_used_percent: float | None = None
        #: CommitLog end past which a send measures again (half the room left).
        self._recheck_at_offset = 0
        self._stop_watching: Callable[[], None] | None = None
        self._manual_runs = 0
        self._run_lock = threading.Lock()

    def delete_manually(self, *, wake: bool = True) -> None:
        """An operator's request (mqadmin deleteExpiredCommitLog): expired files go
        on the next runs whatever the hour; ``wake`` runs the service now (a
        caller that runs the first round itself passes False: the woken service
        would race it for the same files, and the caller's report miss them)."""
        self._manual_runs = MANUAL_DELETE_RUNS
        if wake:
            self.wakeup()

    @property
    def disk_full(self) -> bool:
        """Whether disk use is past disk_space_warning_level_ratio (sends are refused);
        re-measured when the last measure is older than :data:`SPACE_RECHECK_S`.
        Any thread."""
        if (
            time.monotonic() - self._measured_at > SPACE_RECHECK_S
            or self.commitlog.max_offset >= self._recheck_at_offset
        ):
            self.check_space()
        return self._disk_full

    def check_space(self) -> float:
        """Measure disk use now and update :attr:`disk_full`; past
        disk_max_used_space_ratio, wake the service to delete (on its own thread:
        the caller may be a writer creating a file). Returns the percent used."""
        used = self._measure()
        over = used < 0 or used > self.config.disk_max_used_space_ratio
        thread = self._thread
        # Never from the service's own thread (that would spin while the disk stays full).
        if over and thread is not None and thread is not threading.current_thread():
            self.wakeup()
        return used

    def _measure(self) -> float:
        """Measure disk use now and update :attr:`disk_full`; returns the percent used."""
        cfg = self.config
        # CommitLog and ConsumeQueues live under one root, so one filesystem.
        written = self.commitlog.max_offset
        used = self.disk_usage(cfg.store_path_root_dir)
        self._measured_at = time.monotonic()
        self.last_used_percent = used
        room = _filesystem_bytes(cfg.store_path_root_dir) * (
            cfg.disk_space_warning_level_ratio - used
        )
        # Measure again once the CommitLog took half the room left: on a small disk
        # a burst of sends fills more than the room between two timed measures.
        self._recheck_at_offset = written + max(int(room / 200), 0)
        full = used > cfg.disk_space_warning_level_ratio
        if full != self._disk_full:
            log.log(
                logging.ERROR if full else logging.INFO,
                "disk %.1f%% used: sends %s",
                used,
                "refused until space is freed" if full else "accepted again",
            )
        self._disk_full = full
        return used

    def start(self) -> None:
        """Start the thread, and measure disk use whenever a data file is created."""
        self._stop_watching = watch_file_creation(
            self.config.store_path_root_dir, self._on_file_created
        )
        super().start()

    def _on_file_created(self, _path: Path) -> None:
        self.check_space()

    def shutdown(self) -> None:
        if self._stop_watching is not None:
            self._stop_watching()
            self._stop_watching = None
        super().shutdown()

    def run(self) -> None:
        while True:
            self._wakeup.wait(self.config.clean_resource_interval_ms / 1000)
            self._wakeup.clear()
            if self._stopping:
                return
            try:
                self.run_once()
            except Exception:
                log.exception("expired file deletion failed")

    def run_once(self) -> ExpiryReport:
        """Check the clock and the disk, delete what is due; returns what went."""
        with self._run_lock:
            report = ExpiryReport()
            self._clean_commitlog(report)
            self._clean_consume_queues(report)
            if report.deleted_anything:
                log.info(
                    "expiry (%s): commitlog files %s, consume queue files %d, index files %d",
                    ", ".join(report.reasons),
                    report.commitlog_files or "none",
                    report.consume_queue_files,
                    report.index_files,
                )
            return report

    # -- the CommitLog ----------------------------------------------------------------

    def _space_pressure(self, report: ExpiryReport) -> tuple[bool, bool]:
        """(disk over the deletion ratio, clean at once); also updates ``disk_full``."""
        cfg = self.config
        # No wake-up from a run: a woken service would run again at once, racing a
        # caller's run (a test's, an operator's) for the same files.
        used = self._measure()
        clean_now = False
        if used > cfg.disk_space_clean_forcibly_ratio:
            clean_now = True
        over = used < 0 or used > cfg.disk_max_used_space_ratio
        if over:
            report.reasons.append(f"disk {used:.1f}% used")
        return over, clean_now

    def _clean_commitlog(self, report: ExpiryReport) -> None:
        cfg = self.config
        now_ms = self.clock.now_ms()
        hour = time.localtime(now_ms / 1000).tm_hour
        time_up = hour in cfg.delete_hours
        if time_up:
            report.reasons.append(f"hour {hour:02d} is in delete_when")
        space, clean_now = self._space_pressure(report)
        manual = self._manual_runs > 0
        if manual:
            self._manual_runs -= 1
            report.reasons.append("manual request")
        if not (time_up or space or manual):
            return
        clean_at_once = cfg.clean_file_forcibly_enable and clean_now
        reserved_ms = cfg.file_reserved_time_hours * _HOUR_MS
        dispatched_to = self.dispatched_to()

        def expired(mf: MappedFile) -> bool:
            if mf.file_end_offset > dispatched_to:
                return False  # the dispatcher still needs it
            if clean_at_once:
                return True
            written = self.last_write_ms(mf)
            return written >= 0 and now_ms >= written + reserved_ms

        files = self.commitlog.files
        for n in range(DELETE_FILES_BATCH_MAX):
            gone = files.delete_expired_file(
                expired, now_ms, cfg.destroy_mapped_file_interval_forcibly_ms
            )
            if gone is None:
                break
            report.commitlog_files.append(gone.path.name)
            if n + 1 < DELETE_FILES_BATCH_MAX and cfg.delete_commit_log_files_interval_ms:
                # Spread the disk's work: one file per interval, as RocketMQ does.
                if self._wakeup.wait(cfg.delete_commit_log_files_interval_ms / 1000):
                    self._wakeup.clear()
                if self._stopping:
                    break

    def last_write_ms(self, mf: MappedFile) -> int:
        """When a CommitLog file was last written (-1: unknown, keep it).

        Its last record's store time when this process wrote it; otherwise the
        store time of the next file's first record, which is no earlier - so a
        file is never taken for older than it is. (RocketMQ uses the file's
        mtime; store times follow the store's clock, which tests control.)
        """
        if mf.store_timestamp_ms > 0:
            return mf.store_timestamp_ms
        return self.commitlog.store_timestamp_at(mf.file_end_offset)

    # -- what follows -----------------------------------------------------------------

    def _clean_consume_queues(self, report: ExpiryReport) -> None:
        # Every run, not only when the CommitLog's min moved: a file a reader held
        # last time is retried.
        min_offset = self.commitlog.min_offset
        now_ms = self.clock.now_ms()
        forcibly = self.config.destroy_mapped_file_interval_forcibly_ms
        for cq in self.consume_queues:
            report.consume_queue_files += cq.delete_expired_files(min_offset, now_ms, forcibly)
        if self.index is not None:
            report.index_files += self.index.delete_expired_file(min_offset)
