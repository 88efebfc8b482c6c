"""Consumer offsets: RocketMQ's ConsumerOffsetManager, with a reset-epoch fence.

Where each consumer group is in each queue of each topic it consumes, kept in
memory and persisted to ``<root>/config/consumerOffset.json`` (RocketMQ's
``BrokerPathConfigHelper.getConsumerOffsetPath``) by a timer thread, every
``flush_consumer_offset_interval_ms`` (RocketMQ's name and default, 5 s) and
once more at shutdown.

The file
--------

Tab-indented like fastjson's pretty format, keys sorted so equal tables give
equal bytes::

    {
        "offsetTable":{
                "TopicTest@group_a":{
                        "0":12,
                        "1":7
                }
        },
        "resetEpochTable":{
                "TopicTest@group_a":3
        },
        "dataVersion":{
                "counter":41,
                "stateVersion":0,
                "timestamp":1700000000000
        }
    }

=================  ===================================================================
key                meaning
=================  ===================================================================
offsetTable        ``"topic@group"`` → {queue id → next offset to consume}; RocketMQ's
                   field, same name, same shape
resetEpochTable    ``"topic@group"`` → reset epoch; Basalt's own (see below)
dataVersion        RocketMQ's DataVersion: ``counter`` is the change counter, ``timestamp``
                   the wall-clock ms of the last change, ``stateVersion`` always 0
=================  ===================================================================

RocketMQ's broker deserialises this file with fastjson into its own class,
which ignores unknown keys: ``resetEpochTable`` is invisible to it, so a
RocketMQ broker or ``mqadmin`` tooling can read a Basalt broker's file. Queue
ids are written as JSON strings (``"0"``); fastjson reads them as the Integer
keys it expects. fastjson itself writes them *unquoted* (``{0:12}``, not
valid JSON, apache/rocketmq#1506); :meth:`ConsumerOffsetManager.load` accepts
that form too, so a RocketMQ broker's file can be taken over.

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
the ``.tmp``, without any fsync.) Before each write the
current file is hard-linked as ``consumerOffset.json.bak``, RocketMQ's backup
name: the rename already rules out torn files, but the backup still covers
what it cannot — a damaged sector, a bad hand edit, a file written by a
RocketMQ broker — and it costs a link, not a copy. Falling back to it loses
about one more interval of commits, which consumers see as redelivery, never
as loss. It may also predate a reset (and its epoch); callers that must not lose
a reset call :meth:`persist` right after :meth:`reset_offsets`.

Concurrency: every method but :meth:`ConsumerOffsetManager.load` (called once,
before the manager is shared) is thread-safe. Commits and queries from any
number of threads take one short lock; :meth:`persist` copies the table under
that lock and does its I/O outside it, so commits never wait for a disk.
"""

from __future__ import annotations

import contextlib
import enum
import json
import logging
import os
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from basalt.store.clock import Clock
from basalt.store.errors import StoreConfigError, StoreError
from basalt.store.files import fsync_dir, write_atomically
from basalt.store.service_thread import ServiceThread

log = logging.getLogger(__name__)

#: RocketMQ's ``ConsumerOffsetManager.TOPIC_GROUP_SEPARATOR``: keys are ``topic@group``.
TOPIC_GROUP_SEPARATOR = "@"
CONSUMER_OFFSET_FILE_NAME = "consumerOffset.json"
#: RocketMQ reads queue ids as a Java ``int`` and offsets as a Java ``long``.
MAX_QUEUE_ID = 2**31 - 1
MAX_OFFSET = 2**63 - 1
#: RocketMQ's BrokerConfig.flushConsumerOffsetInterval.
DEFAULT_FLUSH_CONSUMER_OFFSET_INTERVAL_MS = 5000

#: A fastjson map key: a bare integer after ``{`` or ``,``. The string alternative comes
#: first so digits inside a quoted string are consumed with it and never rewritten.
_BARE_KEY = re.compile(r'("(?:[^"\\]|\\.)*")|([{,]\s*)(-?\d+)(\s*:)')


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


class InvalidOffsetRequestError(StoreError, ValueError):
    """An admin request on offsets names an impossible group, topic, queue or offset."""


def _name_problem(group: str, topic: str) -> str | None:
    for what, name in (("group", group), ("topic", topic)):
        if not name:
            return f"{what} name is empty"
        if TOPIC_GROUP_SEPARATOR in name:
            return f"{what} name {name!r} contains {TOPIC_GROUP_SEPARATOR!r}"
    return None


def _key(group: str, topic: str) -> str:
    return f"{topic}{TOPIC_GROUP_SEPARATOR}{group}"


class ConsumerOffsetManager:
    """The offset table of every (group, topic, queue), with reset epochs.

    Call :meth:`load` once before use (a fresh manager is empty). All other
    methods are thread-safe; see the module docstring for the locking.
    """

    def __init__(self, path: Path, *, clock: Clock) -> None:
        self.path = Path(path)
        self.bak_path = self.path.with_name(self.path.name + ".bak")
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
        problem = _name_problem(group, topic)
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
        problem = _name_problem(group, topic)
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

    def _persist(self, *, force: bool) -> bool:
        with self._persist_lock:
            with self._lock:
                if not force and self._version == self._persisted_version:
                    return False
                version, changed_ms = self._version, self._changed_ms
                # Copy, encode outside: json of a large table must not hold up commits.
                offsets = {k: dict(v) for k, v in self._offsets.items()}
                epochs = dict(self._epochs)
            data = _encode(offsets, epochs, version, changed_ms)
            self._write(data)
            with self._lock:
                self._persisted_version = version
            return True

    def _write(self, data: bytes) -> None:
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
        salvaged entry by entry from both (see "Damage" in the module
        docstring), logged at ERROR naming every ``topic@group`` that lost
        offsets, and the result says so. The outcome is also kept as
        :attr:`last_load`. Call it before the manager is shared between threads.
        """
        main = _read(self.path)
        bak = _read(self.bak_path) if main.tables is None else _Copy(None, None, None)
        from_backup = main.tables is None and bak.tables is not None
        salvage: _Salvage | None = None
        if main.tables is not None:
            tables, source = main.tables, self.path
        elif bak.tables is not None:
            tables, source = bak.tables, self.bak_path
        elif main.problem is None and bak.problem is None:  # neither file exists
            tables, source = _Tables({}, {}, 0, 0), None
        else:
            salvage = _salvage(main, bak)
            tables, source = salvage.tables, None
        with self._lock:
            self._offsets, self._epochs = tables.offsets, tables.epochs
            self._version, self._changed_ms = tables.version, tables.changed_ms
            # Not loaded from the main file: it is stale or bad, so the next persist
            # must rewrite it even if nothing is committed meanwhile.
            rewrite = from_backup or salvage is not None
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
            salvaged=salvage is not None,
            lost=salvage.lost if salvage is not None else (),
        )
        self.last_load = result
        if from_backup:
            log.warning(
                "%s unusable (%s): loaded %s instead", self.path, main.problem or "missing", source
            )
        elif salvage is not None:
            log.error(
                "%s unusable (%s) and its backup %s unusable (%s): started with the %d "
                "topic@group entries that decode (%d of them from the backup); %s",
                self.path,
                main.problem or "missing",
                self.bak_path.name,
                bak.problem or "missing",
                result.keys,
                salvage.from_backup,
                _describe_lost(salvage),
            )
        return result


# -- encoding -----------------------------------------------------------------------------


@dataclass(slots=True)
class _Tables:
    offsets: dict[str, dict[int, int]]
    epochs: dict[str, int]
    version: int
    changed_ms: int


def _encode(
    offsets: Mapping[str, Mapping[int, int]], epochs: Mapping[str, int], version: int, ts_ms: int
) -> bytes:
    """The file's bytes: sorted, so equal tables give equal files; RocketMQ's pretty layout."""
    doc = {
        "offsetTable": {
            key: {str(q): o for q, o in sorted(offsets[key].items())} for key in sorted(offsets)
        },
        "resetEpochTable": {key: epochs[key] for key in sorted(epochs)},
        "dataVersion": {"counter": version, "stateVersion": 0, "timestamp": ts_ms},
    }
    return json.dumps(doc, indent="\t", separators=(",", ":")).encode("ascii") + b"\n"


def _quote_bare_key(m: re.Match[str]) -> str:
    if m.group(1) is not None:
        return m.group(1)
    return f'{m.group(2)}"{m.group(3)}"{m.group(4)}'


def _decode(data: bytes) -> _Tables:
    """Parse and check the file's bytes; raises ValueError saying what is wrong."""
    if not data.strip():
        raise ValueError("empty file")
    text = data.decode("utf-8")
    try:
        doc = _parse(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"not JSON: {e}") from None
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object")
    offsets: dict[str, dict[int, int]] = {}
    for key, queues in _object(doc, "offsetTable").items():
        offsets[key] = _queues(key, queues)
    epochs: dict[str, int] = {}
    for key, epoch in _object(doc, "resetEpochTable").items():
        _check_key(key)
        epochs[key] = _int(epoch, MAX_OFFSET, f"resetEpochTable[{key!r}]")
    # Informational only: a damaged dataVersion does not make the offsets untrustworthy.
    version = doc.get("dataVersion")
    counter = timestamp = 0
    if isinstance(version, dict):
        if isinstance(version.get("counter"), int) and version["counter"] >= 0:
            counter = version["counter"]
        if isinstance(version.get("timestamp"), int):
            timestamp = version["timestamp"]
    return _Tables(offsets, epochs, counter, timestamp)


def _queues(key: str, queues: object) -> dict[int, int]:
    """One offsetTable entry's {queue id → offset}; raises ValueError saying what is wrong."""
    _check_key(key)
    if not isinstance(queues, dict):
        raise ValueError(f"offsetTable[{key!r}] is not an object")
    table: dict[int, int] = {}
    for queue, offset in queues.items():
        if not queue.isdigit() or int(queue) > MAX_QUEUE_ID:
            raise ValueError(f"offsetTable[{key!r}]: bad queue id {queue!r}")
        table[int(queue)] = _int(offset, MAX_OFFSET, f"offsetTable[{key!r}][{queue!r}]")
    return table


def _parse(text: str) -> Any:
    """JSON, or fastjson's JSON with bare integer keys; raises json.JSONDecodeError."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return json.loads(_BARE_KEY.sub(_quote_bare_key, text))


def _object(doc: dict[str, Any], name: str) -> dict[str, Any]:
    value = doc.get(name, {})
    if not isinstance(value, dict):
        raise ValueError(f"{name} is not an object")
    return value


def _check_key(key: str) -> None:
    topic, sep, group = key.partition(TOPIC_GROUP_SEPARATOR)
    if not sep or _name_problem(group, topic) is not None:
        raise ValueError(f"bad topic@group key {key!r}")


def _int(value: object, high: int, where: str) -> int:
    # bool is an int to Python but never a number to JSON's writers.
    if type(value) is not int or not 0 <= value <= high:
        raise ValueError(f"{where} is {value!r}, not an integer in [0, {high}]")
    return value


# -- damage -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Copy:
    """One of the two files as :meth:`ConsumerOffsetManager.load` found it."""

    #: Its bytes; None when missing or unreadable.
    data: bytes | None
    #: Its decoded tables; None unless it decoded whole.
    tables: _Tables | None
    #: Why it is unusable; None when it decoded, or is missing.
    problem: str | None


def _read(path: Path) -> _Copy:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return _Copy(None, None, None)
    except OSError as e:  # a bad sector reads as EIO: as damaged as a torn write
        return _Copy(None, None, str(e))
    try:
        return _Copy(data, _decode(data), None)
    except ValueError as e:  # UnicodeDecodeError included
        return _Copy(data, None, str(e))


@dataclass(slots=True)
class _Salvage:
    tables: _Tables
    #: Sorted keys a damaged file named that neither file gave back.
    lost: tuple[str, ...]
    #: Entries taken from the backup because the main file's was unreadable.
    from_backup: int
    #: A file's text stopped being readable before its offsetTable ended.
    cut: bool


_STRING = r'"(?:[^"\\]|\\.)*"'
_TABLE_START = {
    name: re.compile(rf'"{name}"\s*:\s*\{{') for name in ("offsetTable", "resetEpochTable")
}
#: A whole offsetTable entry: a key and a flat object (queue ids → offsets have no braces).
_OFFSET_ENTRY = re.compile(rf"\s*,?\s*({_STRING})\s*:\s*(\{{[^{{}}]*\}})")
_EPOCH_ENTRY = re.compile(rf"\s*,?\s*({_STRING})\s*:\s*(\d+)")
_KEY = re.compile(rf"({_STRING})\s*:")
_TABLE_END = re.compile(r'"(?:resetEpochTable|dataVersion|pullOffsetTable)"\s*:')
_COUNTER = re.compile(r'"counter"\s*:\s*(\d+)')
_TIMESTAMP = re.compile(r'"timestamp"\s*:\s*(\d+)')


@dataclass(slots=True)
class _Entries:
    """What one damaged file gives back: whole entries, and every key it names."""

    offsets: dict[str, dict[int, int]]
    epochs: dict[str, int]
    named: set[str]
    cut: bool


def _string(literal: str) -> str | None:
    try:
        value = json.loads(literal)
    except ValueError:
        return None
    return value if isinstance(value, str) else None


def _entries(data: bytes) -> _Entries:
    """Every entry of a damaged file that decodes on its own.

    A file that still parses as JSON is taken entry by entry; one that does
    not (torn, overwritten) is scanned: each table is read entry after entry
    from its start until the text stops making sense, and every ``topic@group``
    key in the offsetTable's stretch of text is named, so that what could not
    be read can still be reported.
    """
    text = data.decode("utf-8", errors="replace")
    found = _Entries({}, {}, set(), cut=False)
    try:
        doc = _parse(text)
    except json.JSONDecodeError:
        doc = None
    if isinstance(doc, dict):
        offsets, epochs = doc.get("offsetTable"), doc.get("resetEpochTable")
        for key, queues in (offsets if isinstance(offsets, dict) else {}).items():
            found.named.add(key)
            with contextlib.suppress(ValueError):
                found.offsets[key] = _queues(key, queues)
        for key, epoch in (epochs if isinstance(epochs, dict) else {}).items():
            with contextlib.suppress(ValueError):
                _check_key(key)
                found.epochs[key] = _int(epoch, MAX_OFFSET, key)
        return found
    start = _TABLE_START["offsetTable"].search(text)
    if start is not None:
        pos = start.end()
        while (m := _OFFSET_ENTRY.match(text, pos)) is not None:
            pos = m.end()
            key = _string(m[1])
            if key is None:
                continue
            found.named.add(key)
            with contextlib.suppress(ValueError, json.JSONDecodeError):
                found.offsets[key] = _queues(key, _parse(m[2]))
        found.cut = re.match(r"\s*\}", text[pos:]) is None
        end = _TABLE_END.search(text, pos)
        for m in _KEY.finditer(text, pos, end.start() if end is not None else len(text)):
            key = _string(m[1])
            if key is not None and TOPIC_GROUP_SEPARATOR in key:
                found.named.add(key)
    else:
        found.cut = True
    start = _TABLE_START["resetEpochTable"].search(text)
    if start is not None:
        pos = start.end()
        while (m := _EPOCH_ENTRY.match(text, pos)) is not None:
            pos = m.end()
            key = _string(m[1])
            if key is not None and _is_key(key):
                with contextlib.suppress(ValueError):
                    found.epochs[key] = _int(int(m[2]), MAX_OFFSET, m[1])
    return found


def _salvage(main: _Copy, bak: _Copy) -> _Salvage:
    """The table from the damaged copies: the main file's entries, the backup's
    where the main file has none (older, so consumers see redelivery, not
    loss), the higher epoch of the two (epochs never go back). A missing copy
    adds nothing; an unreadable one adds nothing but counts as cut."""
    newer, older = (
        _entries(c.data) if c.data is not None else _Entries({}, {}, set(), False)
        for c in (main, bak)
    )
    offsets = dict(newer.offsets)
    from_backup = 0
    for key, queues in older.offsets.items():
        if key not in offsets:
            offsets[key] = queues
            from_backup += 1
    epochs = dict(older.epochs)
    for key, epoch in newer.epochs.items():
        epochs[key] = max(epoch, epochs.get(key, 0))
    lost = tuple(sorted(k for k in newer.named | older.named if k not in offsets and _is_key(k)))
    texts = [c.data.decode("latin-1") for c in (main, bak) if c.data is not None]
    version = max((int(v) for t in texts for v in _COUNTER.findall(t)), default=0)
    ts = max((int(v) for t in texts for v in _TIMESTAMP.findall(t)), default=0)
    unreadable = any(c.data is None and c.problem is not None for c in (main, bak))
    return _Salvage(
        _Tables(offsets, epochs, min(version, MAX_OFFSET), min(ts, MAX_OFFSET)),
        lost,
        from_backup,
        cut=newer.cut or older.cut or unreadable,
    )


def _is_key(key: str) -> bool:
    try:
        _check_key(key)
    except ValueError:
        return False
    return True


#: How many lost keys the ERROR line names; the load result holds them all.
_LOST_KEYS_LOGGED = 100


def _describe_lost(salvage: _Salvage) -> str:
    named = ", ".join(salvage.lost[:_LOST_KEYS_LOGGED])
    more = len(salvage.lost) - _LOST_KEYS_LOGGED
    parts = []
    if salvage.lost:
        parts.append(
            f"offsets lost for {len(salvage.lost)} topic@group: {named}"
            + (f" and {more} more" if more > 0 else "")
        )
    if salvage.cut:
        parts.append("entries past the damage could not be named")
    if not parts:
        return "no offsets lost"
    return "; ".join(parts) + " (those groups restart per their ConsumeFromWhere)"


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
