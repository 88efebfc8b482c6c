"""``basalt store dump``: print a store root's records one per line, like ``kafka-dump-log``.

:func:`dump_store` reads the root through :mod:`basalt.store.readonly` (no lock, no
``abort``, nothing written), either walking the CommitLog by physical offset
or iterating one ConsumeQueue by queue offset. Every record printed has passed
:func:`basalt.common.record.check_record` with its CRC and was decoded by
:func:`basalt.common.record.decode_record`; the first record that fails ends the dump
with an error (:class:`DumpResult`). :func:`format_record` and
:func:`body_preview` are pure functions of a decoded record.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from basalt.common.message import (
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    MessageRecord,
    transaction_type,
)
from basalt.common.record import CorruptRecordError, RecordInfo, RecordKind, decode_record
from basalt.store.mapped_file import MappedFile
from basalt.store.mapped_file_queue import MappedFileQueue
from basalt.store.readonly import (
    check_at,
    iso_ms,
    open_consume_queue,
    open_data_files,
    report_shrunk,
    store_layout,
)

__all__ = [
    "DEFAULT_BODY_PREVIEW_BYTES",
    "DumpResult",
    "body_preview",
    "dump_store",
    "format_record",
]

DEFAULT_BODY_PREVIEW_BYTES = 64

_TX_NAMES = {
    TRANSACTION_PREPARED_TYPE: "PREPARED",
    TRANSACTION_COMMIT_TYPE: "COMMIT",
    TRANSACTION_ROLLBACK_TYPE: "ROLLBACK",
}


@dataclass(frozen=True, slots=True)
class DumpResult:
    """How a dump ended: records printed, and the corruption that stopped it, if any."""

    records: int
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


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
            f"storeTimestamp: {record.store_timestamp_ms} ({iso_ms(record.store_timestamp_ms)})",
            f"bornTimestamp: {record.born_timestamp_ms} ({iso_ms(record.born_timestamp_ms)})",
            f"topic: {json.dumps(record.topic, ensure_ascii=False)}",
            f"tags: {json.dumps(record.tags, ensure_ascii=False)}",
            f"keys: {json.dumps(record.keys, ensure_ascii=False)}",
            f"sysFlag: 0x{record.sys_flag:x}" + (f" transaction: {tx}" if tx else ""),
            f"properties: {json.dumps(others, ensure_ascii=False, sort_keys=True)}",
            f"bodySize: {len(record.body)}",
            f"body: {body_preview(record.body, body_bytes)}",
        )
    )


class _Warnings:
    """A :class:`basalt.store.readonly.Findings` sink that prints problems as ``warning:`` lines."""

    def __init__(self, out: TextIO) -> None:
        self.out = out

    def problem(
        self, code: str, message: str, *, path: Path | None = None, offset: int | None = None
    ) -> None:
        self.out.write(f"warning: {message}\n")

    def note(self, message: str) -> None:
        pass


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
    offset ``from_offset`` (default its start) and print whatever each unit
    points at; otherwise walk the CommitLog from physical offset
    ``from_offset`` (default its start; an offset inside a record starts at
    the next one) keeping records that match the filters. Files left out as
    damaged are ``warning:`` lines. A record that fails its checks (magic,
    size, CRC, physical offset) is printed as a ``corrupt record`` line and
    ends the dump with an error. Raises StoreRootError for a missing or
    non-store root.
    """
    layout = store_layout(root)
    warnings = _Warnings(out)
    commitlog = open_data_files(layout.commitlog_dir, "commitlog", warnings)
    try:
        if topic is None or queue_id is None:
            start = max(from_offset or 0, commitlog.min_offset)
            out.write(f"Dumping {layout.commitlog_dir} from physical offset {start}\n")
            keep = _matching(_via_commitlog(commitlog, start), topic, queue_id)
            return _print_records(keep, out, body_bytes)
        cq = open_consume_queue(layout, topic, queue_id, warnings)
        cq_dir = layout.consume_queue_dir / topic / str(queue_id)
        out.write(f"Dumping {cq_dir} from queue offset {from_offset or 0}\n")
        if cq is None:
            out.write(f"no ConsumeQueue for {topic}/{queue_id}\n")
            return DumpResult(0)
        try:
            # Print whatever the queue points at, even another queue's record.
            units = cq.iter_units(from_offset or 0)
            return _print_records(_via_queue(commitlog, units), out, body_bytes)
        finally:
            cq.close()
    finally:
        report_shrunk(commitlog, "commitlog", warnings)
        commitlog.close()


#: What the record iterators yield: a record, a note line, or a corruption that ends the dump.
_Item = MessageRecord | str | CorruptRecordError


def _matching(items: Iterator[_Item], topic: str | None, queue_id: int | None) -> Iterator[_Item]:
    for item in items:
        if not isinstance(item, MessageRecord) or (
            (topic is None or item.topic == topic)
            and (queue_id is None or item.queue_id == queue_id)
        ):
            yield item


def _print_records(items: Iterator[_Item], out: TextIO, body_bytes: int) -> DumpResult:
    count = 0
    for item in items:
        if isinstance(item, CorruptRecordError):
            out.write(f"corrupt record at offset {item.offset}: {item.reason}\n")
            out.write(f"records: {count} (stopped at a corrupt record)\n")
            return DumpResult(count, str(item))
        if isinstance(item, str):
            out.write(item + "\n")
            continue
        out.write(format_record(item, body_bytes=body_bytes) + "\n")
        count += 1
    out.write(f"records: {count}\n")
    return DumpResult(count)


def _decode(mf: MappedFile, pos: int, info: RecordInfo) -> MessageRecord | CorruptRecordError:
    """The record :func:`check_at` found valid at ``pos``, or the corruption it found."""
    phys = mf.file_from_offset + pos
    if info.kind is not RecordKind.MESSAGE:
        return CorruptRecordError(phys, info.reason or f"no record here ({info.kind.value})")
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
        info = check_at(mf, pos)
        while info.kind is RecordKind.MESSAGE:
            if mf.file_from_offset + pos >= start:
                yield _decode(mf, pos, info)
            pos += info.size
            info = check_at(mf, pos)
        if info.kind is RecordKind.CORRUPT:
            yield _decode(mf, pos, info)
            return
        if info.kind is RecordKind.END:
            return  # the end of the data
        nxt = commitlog.next_file(mf)
        if nxt is None and mf is not commitlog.last_file:
            yield CorruptRecordError(mf.file_end_offset, "no CommitLog file follows the blank")
            return
        mf = nxt


def _via_queue(
    commitlog: MappedFileQueue, units: Iterator[tuple[int, int, int, int]]
) -> Iterator[_Item]:
    for index, phy, size, _ in units:
        mf = commitlog.find_by_offset(phy)
        if phy < commitlog.min_offset or mf is None:
            gone = "deleted" if phy < commitlog.min_offset else "no CommitLog file holds it"
            yield f"queueOffset: {index} offset: {phy} size: {size} ({gone})"
            continue
        info = check_at(mf, phy - mf.file_from_offset)
        if info.kind in (RecordKind.BLANK, RecordKind.END):
            yield CorruptRecordError(phy, f"queue offset {index} points at a blank or nothing")
            return
        yield _decode(mf, phy - mf.file_from_offset, info)
