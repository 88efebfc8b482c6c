"""consumerOffset.json's bytes: encoding, decoding, and salvaging a damaged copy.

Pure functions over bytes, no state: :mod:`basalt.store.consumer_offsets`
owns the file, its ``.bak`` and when each is written.

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
resetEpochTable    ``"topic@group"`` → reset epoch; Basalt's own (the fence of
                   :mod:`basalt.store.consumer_offsets`)
dataVersion        RocketMQ's DataVersion: ``counter`` is the change counter, ``timestamp``
                   the wall-clock ms of the last change, ``stateVersion`` always 0
=================  ===================================================================

RocketMQ's broker deserialises this file with fastjson into its own class,
which ignores unknown keys: ``resetEpochTable`` is invisible to it, so a
RocketMQ broker or ``mqadmin`` tooling can read a Basalt broker's file. Queue
ids are written as JSON strings (``"0"``); fastjson reads them as the Integer
keys it expects. fastjson itself writes them *unquoted* (``{0:12}``, not
valid JSON, apache/rocketmq#1506); :func:`decode_offsets` accepts
that form too, so a RocketMQ broker's file can be taken over.

Damage
------

:func:`read_copy` reads one copy (the file or its ``.bak``);
:func:`decode_offsets` takes a copy whole or not at all. When neither copy decodes whole,
:func:`salvage` takes what each still holds, entry by entry: a copy that
parses as JSON is checked one ``topic@group`` entry at a time; one that does
not (torn by a crash or a hand edit, a zeroed page) is scanned, each table
read entry after entry from its start until the text stops making sense, and
every ``topic@group`` key left in the offsetTable's stretch of text is
*named*. An entry is kept from the main file, else from the ``.bak`` (older:
consumers see redelivery, not loss); an epoch is the higher of the two (epochs
never go back). :attr:`Salvage.lost` is every key a copy named that neither
gave back: those groups restart per their ConsumeFromWhere, as RocketMQ does
for a group it has no offsets for. Keys past the point where a torn file
stops cannot be named; :attr:`Salvage.cut` says so.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

#: RocketMQ's ``ConsumerOffsetManager.TOPIC_GROUP_SEPARATOR``: keys are ``topic@group``.
TOPIC_GROUP_SEPARATOR = "@"
#: RocketMQ reads queue ids as a Java ``int`` and offsets as a Java ``long``.
MAX_QUEUE_ID = 2**31 - 1
MAX_OFFSET = 2**63 - 1

#: A fastjson map key: a bare integer after ``{`` or ``,``. The string alternative comes
#: first so digits inside a quoted string are consumed with it and never rewritten.
_BARE_KEY = re.compile(r'("(?:[^"\\]|\\.)*")|([{,]\s*)(-?\d+)(\s*:)')


def name_problem(group: str, topic: str) -> str | None:
    """Why ``group``/``topic`` cannot make a ``topic@group`` key; None when they can."""
    for what, name in (("group", group), ("topic", topic)):
        if not name:
            return f"{what} name is empty"
        if TOPIC_GROUP_SEPARATOR in name:
            return f"{what} name {name!r} contains {TOPIC_GROUP_SEPARATOR!r}"
    return None


# -- encoding -----------------------------------------------------------------------------


@dataclass(slots=True)
class OffsetTables:
    """What the file holds: offsets and epochs by ``topic@group``, and its dataVersion."""

    offsets: dict[str, dict[int, int]]
    epochs: dict[str, int]
    version: int
    changed_ms: int


def encode_offsets(
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


def decode_offsets(data: bytes) -> OffsetTables:
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
    return OffsetTables(offsets, epochs, counter, timestamp)


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
    if not sep or name_problem(group, topic) is not None:
        raise ValueError(f"bad topic@group key {key!r}")


def _int(value: object, high: int, where: str) -> int:
    # bool is an int to Python but never a number to JSON's writers.
    if type(value) is not int or not 0 <= value <= high:
        raise ValueError(f"{where} is {value!r}, not an integer in [0, {high}]")
    return value


# -- damage -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FileCopy:
    """One of the two files as :meth:`ConsumerOffsetManager.load` found it."""

    #: Its bytes; None when missing or unreadable.
    data: bytes | None
    #: Its decoded tables; None unless it decoded whole.
    tables: OffsetTables | None
    #: Why it is unusable; None when it decoded, or is missing.
    problem: str | None


def read_copy(path: Path) -> FileCopy:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return FileCopy(None, None, None)
    except OSError as e:  # a bad sector reads as EIO: as damaged as a torn write
        return FileCopy(None, None, str(e))
    try:
        return FileCopy(data, decode_offsets(data), None)
    except ValueError as e:  # UnicodeDecodeError included
        return FileCopy(data, None, str(e))


@dataclass(slots=True)
class Salvage:
    """What :func:`salvage` made of two damaged copies."""

    #: The entries that decoded.
    tables: OffsetTables
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
_TABLE_CLOSE = re.compile(r"\s*\}")
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
        # A table of the wrong type names nothing: what it held is lost unnamed.
        found.cut = offsets is not None and not isinstance(offsets, dict)
        for key, queues in (offsets if isinstance(offsets, dict) else {}).items():
            found.named.add(key)
            with contextlib.suppress(ValueError):
                found.offsets[key] = _queues(key, queues)
        for key, epoch in (epochs if isinstance(epochs, dict) else {}).items():
            with contextlib.suppress(ValueError):
                _check_key(key)
                found.epochs[key] = _int(epoch, MAX_OFFSET, key)
        return found
    entries, stop = _scan(text, "offsetTable", _OFFSET_ENTRY)
    for key, value in entries:
        found.named.add(key)
        with contextlib.suppress(ValueError, json.JSONDecodeError):
            found.offsets[key] = _queues(key, _parse(value))
    if stop is None:
        found.cut = True
    else:
        found.cut = _TABLE_CLOSE.match(text, stop) is None
        end = _TABLE_END.search(text, stop)
        for m in _KEY.finditer(text, stop, end.start() if end is not None else len(text)):
            key = _string(m[1])
            if key is not None and TOPIC_GROUP_SEPARATOR in key:
                found.named.add(key)
    for key, value in _scan(text, "resetEpochTable", _EPOCH_ENTRY)[0]:
        with contextlib.suppress(ValueError):
            _check_key(key)
            found.epochs[key] = _int(int(value), MAX_OFFSET, key)
    return found


def _scan(
    text: str, table: str, entry: re.Pattern[str]
) -> tuple[list[tuple[str, str]], int | None]:
    """The whole entries ``table`` starts with in ``text``, as (key, value text), and
    the position where they stop (None when the table is nowhere in ``text``)."""
    start = _TABLE_START[table].search(text)
    if start is None:
        return [], None
    found: list[tuple[str, str]] = []
    pos = start.end()
    while (m := entry.match(text, pos)) is not None:
        pos = m.end()
        key = _string(m[1])
        if key is not None:
            found.append((key, m[2]))
    return found, pos


def salvage(main: FileCopy, bak: FileCopy) -> Salvage:
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
    return Salvage(
        OffsetTables(offsets, epochs, min(version, MAX_OFFSET), min(ts, MAX_OFFSET)),
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


def describe_lost(salvage: Salvage) -> str:
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


# -- the space reserve --------------------------------------------------------------------

#: Smallest reserve kept beside the file; otherwise twice the last save's size.
MIN_RESERVE_BYTES = 64 * 1024
#: Errors a released reserve can cure: the file system, or the user's quota, is full.
_NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})


class SpaceReserve:
    """A preallocated file (``consumerOffset.json.reserve``) whose blocks a save
    can take back when the disk is full.

    A save writes a whole new copy before the rename frees the old one, so it
    needs free space for a moment; on a full disk it would fail, and an offset
    commit answered OK would be lost at shutdown. RocketMQ persists on a timer
    and loses it. Here the reserve holds twice the last save's size: a save
    refused for lack of space releases it and tries once more. It is made
    again (best effort) after each save, so it is there for the last save of
    a shutdown, which runs after the CommitLog stopped taking writes and
    nothing else can take the freed space.
    """

    def __init__(self, path: Path) -> None:
        self.path = path

    def ensure(self, size: int) -> bool:
        """Make the reserve hold at least ``max(size, MIN_RESERVE_BYTES)`` allocated
        bytes; returns whether it does (False, logged, when the disk refuses)."""
        want = max(size, MIN_RESERVE_BYTES)
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            log.warning("cannot keep a space reserve at %s: %s", self.path, e)
            return False
        try:
            if os.fstat(fd).st_blocks * 512 < want:
                os.posix_fallocate(fd, 0, want)
            return True
        except OSError as e:
            log.warning("cannot keep a space reserve at %s: %s", self.path, e)
            return False
        finally:
            os.close(fd)

    def release(self) -> bool:
        """Delete the reserve, freeing its blocks; returns whether there was one."""
        try:
            self.path.unlink()
        except FileNotFoundError:
            return False
        return True

    @staticmethod
    def cures(error: OSError) -> bool:
        """Whether ``error`` is the full disk a released reserve makes room for."""
        return error.errno in _NO_SPACE
