"""Consumer offsets: RocketMQ's ConsumerOffsetManager, with a reset-epoch fence.

Where each consumer group is in each queue of each topic it consumes, kept in
memory and persisted to ``<root>/config/consumerOffset.json`` (RocketMQ's
``BrokerPathConfigHelper.getConsumerOffsetPath``) by a timer thread, every
``flush_consumer_offset_interval_ms`` (RocketMQ's name and default, 5 s) and
once more at shutdown. The file's bytes (RocketMQ's ``offsetTable``, read
by a RocketMQ broker and readable from one) and the salvage of a damaged copy
are :mod:`basalt.store.consumer_offset_file`'s.

The reset-epoch fence
---------------------

RocketMQ resets a group's offsets on the broker (``assignResetOffset``) and
admits in a comment that the reset "may get overridden by the client
instantly": a consumer that pulled before the reset commits its old position
after it and silently undoes the reset. Basalt numbers resets: every
(group, topic) has an epoch, 0 at first, and :meth:`reset_offsets` bumps it
under the same lock as commits. A consumer learns the epoch when it fetches
its offsets and sends it with every commit; a commit carrying an *older*
epoch is refused (``STALE_RESET_EPOCH``, with the current epoch) and changes
nothing. A commit without an epoch (``None``: tools, the broker itself) is
not fenced. A *newer* epoch than the broker's is accepted: it can only mean
the broker lost a reset it had not persisted yet, and refusing would wedge
the consumer.

Durability
----------

:meth:`ConsumerOffsetManager.persist` writes a temporary file in the same
directory, fsyncs it, renames it over the file and fsyncs the directory, so a
crash leaves the old or the new file, never a mix. (RocketMQ's ConfigManager
instead moves the file to ``.bak`` and writes the new content under the old
name, relying on the ``.bak`` fallback when a crash tears that write; its
older ``MixAll.string2File`` wrote a ``.tmp``, deleted the file and renamed
the ``.tmp``, without any fsync.)

Every save leaves ``consumerOffset.json.bak`` (RocketMQ's backup name)
holding a whole, valid copy. Like RocketMQ's, it is the *previous* save:
before each write the current file is hard-linked as the ``.bak`` (it was
fsynced when written, so the link is durable without copying a byte). The
first save has no previous content, and a save after :meth:`load` found no
good copy has none worth keeping: then the new content is written as the
``.bak`` too, as a second file (a link would share one inode, and whatever
damages its blocks would take both). After :meth:`load` fell back to the
``.bak``, the ``.bak`` is left alone until a good main file is written. The
rename already rules out torn files; the backup covers what it cannot — a
damaged sector, a bad hand edit, a file written by a RocketMQ broker. Falling
back to it loses about one more interval of commits, which consumers see as
redelivery, never as loss. It may also predate a reset (and its epoch);
callers that must not lose a reset call :meth:`persist` right after
:meth:`reset_offsets`.

Damage never keeps a store from starting. A main file that is missing or
does not decode gives way to the ``.bak`` (WARNING). When neither decodes,
:meth:`load` starts with every ``topic@group`` entry that still decodes in
either, logs at ERROR the keys whose offsets neither gave back, and returns
them (:attr:`OffsetLoadResult.lost`); those groups restart per their
ConsumeFromWhere, as RocketMQ does for a new group. A damaged file is never
overwritten: the next persist renames it ``<name>.corrupt-<ms>``.

Concurrency: every method but :meth:`ConsumerOffsetManager.load` (called once,
before the manager is shared) is thread-safe. Commits and queries from any
number of threads take one short lock; :meth:`persist` copies the table under
that lock and does its I/O outside it, so commits never wait for a disk.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from basalt.store.clock import Clock
from basalt.store.consumer_offset_file import (
    MAX_OFFSET,
    MAX_QUEUE_ID,
    TOPIC_GROUP_SEPARATOR,
    FileCopy,
    OffsetTables,
    Salvage,
    SpaceReserve,
    decode_offsets,
    describe_lost,
    encode_offsets,
    name_problem,
    read_copy,
    salvage,
)
from basalt.store.errors import StoreConfigError, StoreError
from basalt.store.files import fsync_dir, write_atomically
from basalt.store.service_thread import ServiceThread

log = logging.getLogger(__name__)

CONSUMER_OFFSET_FILE_NAME = "consumerOffset.json"
#: RocketMQ's BrokerConfig.flushConsumerOffsetInterval.
DEFAULT_FLUSH_CONSUMER_OFFSET_INTERVAL_MS = 5000


def consumer_offset_path(root: Path) -> Path:
    """``<root>/config/consumerOffset.json``, where RocketMQ keeps the file."""
    return root / "config" / CONSUMER_OFFSET_FILE_NAME


class CommitStatus(enum.Enum):
    """Outcome of :meth:`ConsumerOffsetManager.commit_offset`."""

    OK = "OK"
    #: The commit carried a reset epoch older than the (group, topic)'s: refused.
    STALE_RESET_EPOCH = "STALE_RESET_EPOCH"
    #: Topic or group empty or containing ``@``.
    INVALID_NAME = "INVALID_NAME"
    #: Queue id negative or past a Java int.
    INVALID_QUEUE_ID = "INVALID_QUEUE_ID"
    #: Offset negative or past a Java long.
    INVALID_OFFSET = "INVALID_OFFSET"


@dataclass(frozen=True, slots=True)
class CommitResult:
    """What a commit got back.

    ``reset_epoch`` is the (group, topic)'s current epoch (0 for an invalid
    name): after ``STALE_RESET_EPOCH``, the consumer fetches its offsets
    again and commits under this epoch.
    """

    status: CommitStatus
    reset_epoch: int
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.status is CommitStatus.OK


@dataclass(frozen=True, slots=True)
class OffsetLoadResult:
    """What :meth:`ConsumerOffsetManager.load` found."""

    #: The file the table came from; None when neither the file nor its backup existed.
    source: Path | None
    #: The main file was missing or unusable and the ``.bak`` was loaded instead.
    from_backup: bool
    #: Why the main file was not used (None when it was, or when it was missing).
    main_problem: str | None
    #: ``topic@group`` keys with offsets, and (key, queue) offsets, loaded.
    keys: int
    offsets: int
    #: Why the ``.bak`` was not used, when it was needed and unusable.
    backup_problem: str | None = None
    #: Neither file decoded whole: the table holds the entries that did (``source`` is None).
    salvaged: bool = False
    #: Sorted ``topic@group`` keys a damaged file named whose offsets (all or some
    #: queues) neither file gave back: those groups restart per their ConsumeFromWhere.
    lost: tuple[str, ...] = ()
    #: A damaged copy stopped making sense before its offsetTable ended (or could not
    #: be read): entries past that point may be lost without ``lost`` naming them.
    lost_unnamed: bool = False


class InvalidOffsetRequestError(StoreError, ValueError):
    """An admin request on offsets names an impossible group, topic, queue or offset."""


def _key(group: str, topic: str) -> str:
    return f"{topic}{TOPIC_GROUP_SEPARATOR}{group}"


class ConsumerOffsetManager:
    """The offset table of every (group, topic, queue), with reset epochs.

    Call :meth:`load` once before use (a fresh manager is empty). All other
    methods are thread-safe; see the module docstring for the locking.
    """

    def __init__(self, path: Path, *, clock: Clock, space_reserve: bool = False) -> None:
        """``space_reserve`` keeps ``<file>.reserve`` beside the file, whose blocks a save
        takes back on a full disk (see
        :class:`~basalt.store.consumer_offset_file.SpaceReserve`): a store's
        manager does; a tool's, which only reads, need not."""
        self.path = Path(path)
        self.bak_path = self.path.with_name(self.path.name + ".bak")
        #: Blocks a save takes back on a full disk (see SpaceReserve).
        self._reserve = (
            SpaceReserve(self.path.with_name(self.path.name + ".reserve"))
            if space_reserve
            else None
        )
        self.clock = clock
        self._lock = threading.Lock()
        # Serialises whole persists so an older snapshot never lands after a newer one.
        self._persist_lock = threading.Lock()
        self._offsets: dict[str, dict[int, int]] = {}
        self._epochs: dict[str, int] = {}
        # Bumped on every change; persist_if_changed compares it with _persisted_version.
        self._version = 0
        self._changed_ms = 0
        self._persisted_version = 0
        # False after load() rejected the main file: linking it as .bak would replace
        # the good backup with the bad file (RocketMQ deletes it for the same reason).
        self._main_trusted = True
        # True after load() took the table from the .bak: it is the one good copy, so
        # it stays the backup until a good main file has been written over the bad one.
        self._bak_trusted = False
        # Files load() found damaged: set aside (not overwritten) by the next persist.
        self._damaged: list[Path] = []
        #: What the last :meth:`load` found (None before it), for recovery reports.
        self.last_load: OffsetLoadResult | None = None

    # -- commits and queries --------------------------------------------------------

    def commit_offset(
        self,
        group: str,
        topic: str,
        queue_id: int,
        offset: int,
        *,
        reset_epoch: int | None = None,
    ) -> CommitResult:
        """Store ``offset`` as the next offset ``group`` consumes in ``topic``'s queue.

        Refused, changing nothing: an invalid name, queue id or offset, and a
        ``reset_epoch`` older than the (group, topic)'s current one. ``None``
        is not fenced. A commit below the stored offset is accepted, as in
        RocketMQ (a consumer may rewind), and logged.
        """
        problem = name_problem(group, topic)
        if problem is not None:
            return CommitResult(CommitStatus.INVALID_NAME, 0, problem)
        key = _key(group, topic)
        if not 0 <= queue_id <= MAX_QUEUE_ID:
            return CommitResult(
                CommitStatus.INVALID_QUEUE_ID,
                self.reset_epoch(group, topic),
                f"queue id {queue_id} not in [0, {MAX_QUEUE_ID}]",
            )
        if not 0 <= offset <= MAX_OFFSET:
            return CommitResult(
                CommitStatus.INVALID_OFFSET,
                self.reset_epoch(group, topic),
                f"offset {offset} not in [0, {MAX_OFFSET}]",
            )
        with self._lock:
            current = self._epochs.get(key, 0)
            if reset_epoch is not None and reset_epoch < current:
                return CommitResult(
                    CommitStatus.STALE_RESET_EPOCH,
                    current,
                    f"{key} was reset: epoch {reset_epoch} < {current}",
                )
            queues = self._offsets.get(key)
            if queues is None:
                queues = self._offsets[key] = {}
            previous = queues.get(queue_id)
            # Consumers re-commit unchanged offsets every few seconds; only a change
            # makes the next persist worth its two fsyncs.
            if previous != offset:
                queues[queue_id] = offset
                self._changed_locked()
        if previous is not None and offset < previous:
            log.warning(
                "consumer offset moved back: %s queue %d %d -> %d", key, queue_id, previous, offset
            )
        return CommitResult(CommitStatus.OK, current)

    def query_offset(self, group: str, topic: str, queue_id: int) -> int:
        """The committed offset, or -1 when the group never committed to that queue."""
        with self._lock:
            return self._offsets.get(_key(group, topic), {}).get(queue_id, -1)

    def query_offsets(self, group: str, topic: str) -> dict[int, int]:
        """A copy of {queue id → offset} for the (group, topic); empty when unknown."""
        with self._lock:
            return dict(self._offsets.get(_key(group, topic), {}))

    def all_offsets(self) -> list[tuple[str, str, int, int]]:
        """Every committed offset as (group, topic, queue id, offset): a copy taken
        under the lock, for a monitor computing consumer lag."""
        with self._lock:
            items = [(k, dict(q)) for k, q in self._offsets.items()]
        out: list[tuple[str, str, int, int]] = []
        for key, queues in items:
            topic, _, group = key.partition(TOPIC_GROUP_SEPARATOR)
            out.extend((group, topic, queue_id, offset) for queue_id, offset in queues.items())
        return out

    def reset_epoch(self, group: str, topic: str) -> int:
        """The (group, topic)'s reset epoch: 0 until its first reset."""
        with self._lock:
            return self._epochs.get(_key(group, topic), 0)

    def reset_offsets(self, group: str, topic: str, offsets: Mapping[int, int]) -> int:
        """Store ``offsets`` for those queues and bump the epoch, atomically; returns the epoch.

        RocketMQ's broker-side resetOffset. Other queues keep their offsets.
        An empty mapping only bumps the epoch, fencing every consumer that has
        not fetched its offsets since. Only in memory until the next persist.

        Raises InvalidOffsetRequestError (nothing changed) for an invalid name,
        queue id or offset.
        """
        problem = name_problem(group, topic)
        if problem is not None:
            raise InvalidOffsetRequestError(problem)
        for queue_id, offset in offsets.items():
            if not 0 <= queue_id <= MAX_QUEUE_ID:
                raise InvalidOffsetRequestError(f"queue id {queue_id} out of range")
            if not 0 <= offset <= MAX_OFFSET:
                raise InvalidOffsetRequestError(f"offset {offset} of queue {queue_id} out of range")
        key = _key(group, topic)
        with self._lock:
            epoch = self._epochs.get(key, 0) + 1
            self._epochs[key] = epoch
            if offsets:
                self._offsets.setdefault(key, {}).update(offsets)
            self._changed_locked()
        log.info("reset %s to epoch %d: %s", key, epoch, dict(offsets))
        return epoch

    def groups_of_topic(self, topic: str) -> set[str]:
        """Groups with committed offsets in ``topic`` (RocketMQ's whichGroupByTopic)."""
        with self._lock:
            keys = list(self._offsets)
        return {g for t, _, g in (k.partition(TOPIC_GROUP_SEPARATOR) for k in keys) if t == topic}

    def topics_of_group(self, group: str) -> set[str]:
        """Topics ``group`` has committed offsets in (RocketMQ's whichTopicByConsumer)."""
        with self._lock:
            keys = list(self._offsets)
        return {t for t, _, g in (k.partition(TOPIC_GROUP_SEPARATOR) for k in keys) if g == group}

    def remove_group(self, group: str, topic: str) -> bool:
        """Forget the (group, topic)'s offsets; returns whether it had any.

        The epoch is kept and bumped, not dropped: epochs never go back, so a
        consumer of the removed group still committing under its old epoch is
        refused rather than resurrecting the offsets.
        """
        key = _key(group, topic)
        with self._lock:
            if self._offsets.pop(key, None) is None:
                return False
            self._epochs[key] = self._epochs.get(key, 0) + 1
            self._changed_locked()
        log.info("removed the offsets of %s", key)
        return True

    def _changed_locked(self) -> None:
        self._version += 1
        self._changed_ms = self.clock.now_ms()

    @property
    def dirty(self) -> bool:
        """Whether something changed since the last persist or load."""
        with self._lock:
            return self._version != self._persisted_version

    # -- the file -------------------------------------------------------------------

    def persist(self) -> None:
        """Write the table to the file now, atomically (see the module docstring).

        Raises OSError when the disk refuses; the file is then unchanged (or
        only its ``.bak`` refreshed) and a later persist retries.
        """
        self._persist(force=True)

    def persist_if_changed(self) -> bool:
        """:meth:`persist` if anything changed since the last persist; returns whether it wrote."""
        return self._persist(force=False)

    def snapshot(self) -> bytes:
        """The whole table as consumerOffset.json's bytes (a master's replica state)."""
        with self._lock:
            offsets = {k: dict(v) for k, v in self._offsets.items()}
            epochs = dict(self._epochs)
            version, changed_ms = self._version, self._changed_ms
        return encode_offsets(offsets, epochs, version, changed_ms)

    def install(self, data: bytes) -> None:
        """Replace the whole table with a :meth:`snapshot`'s and persist it (a slave
        taking its master's offsets). Raises ValueError when ``data`` does not decode
        (nothing changed), OSError when the write fails."""
        tables = decode_offsets(data)
        with self._lock:
            self._offsets = tables.offsets
            self._epochs = tables.epochs
            self._changed_locked()
        self.persist()

    def _persist(self, *, force: bool) -> bool:
        with self._persist_lock:
            with self._lock:
                if not force and self._version == self._persisted_version:
                    return False
                version, changed_ms = self._version, self._changed_ms
                # Copy, encode outside: json of a large table must not hold up commits.
                offsets = {k: dict(v) for k, v in self._offsets.items()}
                epochs = dict(self._epochs)
            data = encode_offsets(offsets, epochs, version, changed_ms)
            self._write(data)
            with self._lock:
                self._persisted_version = version
            return True

    def _write(self, data: bytes) -> None:
        reserve = self._reserve
        try:
            self._write_copies(data)
        except OSError as e:
            if reserve is None or not (SpaceReserve.cures(e) and reserve.release()):
                raise
            log.warning("disk full: released %s to save consumer offsets", reserve.path)
            self._write_copies(data)
        if reserve is not None:
            reserve.ensure(2 * len(data))

    def _write_copies(self, data: bytes) -> None:
        parent = self.path.parent
        if not parent.is_dir():
            parent.mkdir(parents=True, exist_ok=True)
            fsync_dir(parent.parent)
        self._set_aside_damaged()
        if self._main_trusted and self.path.exists():
            self._back_up_main()  # the .bak keeps the previous save, as in RocketMQ
            write_atomically(self.path, data)
        elif self._bak_trusted:
            write_atomically(self.path, data)  # over the bad main; the good .bak stays
        else:
            # The first save, or no good copy was left: the new content is the only
            # valid one, so it becomes the backup too - never a save without a .bak.
            # A copy, not a link: one inode would share whatever damages its blocks.
            write_atomically(self.path, data)
            write_atomically(self.bak_path, data)
        self._main_trusted = True
        self._bak_trusted = False

    def _set_aside_damaged(self) -> None:
        # A damaged file is evidence (and what a salvage could not read may still be
        # recovered by hand): renamed <name>.corrupt-<ms>, never overwritten.
        while self._damaged:
            damaged = self._damaged[0]
            with contextlib.suppress(FileNotFoundError):
                os.replace(
                    damaged, damaged.with_name(f"{damaged.name}.corrupt-{self.clock.now_ms()}")
                )
            self._damaged.pop(0)

    def _back_up_main(self) -> None:
        # The main file was fsynced when it was written, so a hard link makes a durable
        # backup without copying a byte; the rename makes the switch atomic.
        tmp = self.bak_path.with_name(self.bak_path.name + ".tmp")
        tmp.unlink(missing_ok=True)
        try:
            os.link(self.path, tmp)
        except OSError:
            # A filesystem without hard links: copy instead.
            write_atomically(self.bak_path, self.path.read_bytes())
            return
        os.replace(tmp, self.bak_path)

    def load(self) -> OffsetLoadResult:
        """Replace the in-memory table with the file's; never refuses to start.

        A missing file (and no ``.bak``) means an empty table. A main file that
        cannot be read or decoded, is empty, or is missing while a ``.bak``
        exists, gives way to the ``.bak`` as in RocketMQ's ConfigManager
        (logged at WARNING); the next persist then rewrites the main file and
        keeps the good backup. When no whole copy remains, the table is
        salvaged entry by entry from both (see "Damage" in
        :mod:`basalt.store.consumer_offset_file`), logged at ERROR naming
        every ``topic@group`` that lost offsets, and the result says so. The outcome is also kept as
        :attr:`last_load`. Call it before the manager is shared between threads.
        """
        main = read_copy(self.path)
        bak = read_copy(self.bak_path) if main.tables is None else FileCopy(None, None, None)
        from_backup = main.tables is None and bak.tables is not None
        rescue: Salvage | None = None
        if main.tables is not None:
            tables, source = main.tables, self.path
        elif bak.tables is not None:
            tables, source = bak.tables, self.bak_path
        elif main.problem is None and bak.problem is None:  # neither file exists
            tables, source = OffsetTables({}, {}, 0, 0), None
        else:
            rescue = salvage(main, bak)
            tables, source = rescue.tables, None
        with self._lock:
            self._offsets, self._epochs = tables.offsets, tables.epochs
            self._version, self._changed_ms = tables.version, tables.changed_ms
            # Not loaded from the main file: it is stale or bad, so the next persist
            # must rewrite it even if nothing is committed meanwhile.
            rewrite = from_backup or rescue is not None
            self._persisted_version = self._version - 1 if rewrite else self._version
            self._main_trusted = main.problem is None
            self._bak_trusted = from_backup
            self._damaged = [
                f for f, c in ((self.path, main), (self.bak_path, bak)) if c.problem is not None
            ]
        result = OffsetLoadResult(
            source=source,
            from_backup=from_backup,
            main_problem=main.problem,
            keys=len(tables.offsets),
            offsets=sum(len(q) for q in tables.offsets.values()),
            backup_problem=bak.problem,
            salvaged=rescue is not None,
            lost=rescue.lost if rescue is not None else (),
            lost_unnamed=rescue is not None and rescue.cut,
        )
        self.last_load = result
        if self._reserve is not None:
            # Before the first save, too: a disk may fill before the timer's first tick.
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._reserve.ensure(2 * len(encode_offsets(self._offsets, self._epochs, 0, 0)))
        if from_backup:
            log.warning(
                "%s unusable (%s): loaded %s instead", self.path, main.problem or "missing", source
            )
        elif rescue is not None:
            log.error(
                "%s unusable (%s) and its backup %s unusable (%s): started with the %d "
                "topic@group entries that decode (%d of them from the backup); %s",
                self.path,
                main.problem or "missing",
                self.bak_path.name,
                bak.problem or "missing",
                result.keys,
                rescue.from_backup,
                describe_lost(rescue),
            )
        return result


# -- the persister ------------------------------------------------------------------------


class OffsetPersistService(ServiceThread):
    """Persist the offsets every ``flush_consumer_offset_interval_ms``, if they changed.

    RocketMQ's broker persists on a scheduled executor whether or not anything
    changed; this writes only when the manager's change counter moved, so an
    idle broker does not fsync twice every five seconds. A failed persist is
    logged and retried on the next tick. :meth:`shutdown` stops the thread and
    then persists once more in the caller's thread, so a failure there
    raises. One thread; start and shutdown from one owner.
    """

    name = "persist-consumer-offsets"

    def __init__(
        self,
        manager: ConsumerOffsetManager,
        *,
        flush_consumer_offset_interval_ms: int = DEFAULT_FLUSH_CONSUMER_OFFSET_INTERVAL_MS,
    ) -> None:
        super().__init__()
        if flush_consumer_offset_interval_ms <= 0:
            raise StoreConfigError("flush_consumer_offset_interval_ms must be positive")
        self.manager = manager
        self.interval_ms = flush_consumer_offset_interval_ms
        #: Persists that wrote the file (the final one at shutdown included).
        self.writes = 0

    def run(self) -> None:
        while True:
            self._wakeup.wait(self.interval_ms / 1000)
            self._wakeup.clear()
            if self._stopping:  # shutdown() writes the last time, where its error can raise
                return
            try:
                if self.manager.persist_if_changed():
                    self.writes += 1
            except OSError:
                log.exception("persisting consumer offsets to %s failed", self.manager.path)

    def shutdown(self) -> None:
        """Stop the thread, then persist what changed since its last write (may raise OSError)."""
        super().shutdown()
        if self.manager.persist_if_changed():
            self.writes += 1
