"""The source's row schema, and stored records as Arrow RecordBatches.

One row per message; timestamps are Unix ms as ``long`` (Basalt's unit
everywhere: the record layout, SearchOffset, the SDK), so a row's values are
the stored fields unchanged; ``timestamp_millis(store_timestamp)`` makes a
Spark timestamp of one.

=================  ===================  =====================================
column             Spark type           from the stored record
=================  ===================  =====================================
topic              string               TOPIC
broker             string               the store-node's broker name
queue_id           int                  QUEUEID
queue_offset       long                 QUEUEOFFSET
commitlog_offset   long                 PHYSICALOFFSET
msg_id             string               the offset message id (STOREHOST + PHYSICALOFFSET)
tags               string (nullable)    property TAGS
keys               string (nullable)    property KEYS (keys joined by one space)
properties         map<string,string>   every property (TAGS, KEYS, UNIQ_KEY and the user's)
born_timestamp     long                 BORNTIMESTAMP, Unix ms
store_timestamp    long                 STORETIMESTAMP, Unix ms
body               binary               BODY
=================  ===================  =====================================
"""

from __future__ import annotations

import mmap
from collections.abc import Generator, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from basalt.common import _records
from basalt.common.message import (
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    MessageRecord,
    encode_host,
    offset_msg_id,
)
from basalt.common.record import Buffer, CorruptRecordError, DamagedRecord, decode_records

#: The schema as Spark DDL (what ``DataSource.schema()`` answers).
SCHEMA_DDL = (
    "topic string, broker string, queue_id int, queue_offset long, commitlog_offset long, "
    "msg_id string, tags string, keys string, properties map<string,string>, "
    "born_timestamp long, store_timestamp long, body binary"
)

#: The same schema in Arrow's terms, in the same order.
ARROW_SCHEMA = pa.schema(
    [
        ("topic", pa.string()),
        ("broker", pa.string()),
        ("queue_id", pa.int32()),
        ("queue_offset", pa.int64()),
        ("commitlog_offset", pa.int64()),
        ("msg_id", pa.string()),
        ("tags", pa.string()),
        ("keys", pa.string()),
        ("properties", pa.map_(pa.string(), pa.string())),
        ("born_timestamp", pa.int64()),
        ("store_timestamp", pa.int64()),
        ("body", pa.binary()),
    ]
)


def _msg_ids(records: Sequence[MessageRecord]) -> list[str]:
    """Each record's offset message id (:func:`offset_msg_id`), the store host
    encoded once per host (a partition's records share one): the per-record
    :attr:`MessageRecord.msg_id` would parse the address again and cost a third
    of a row."""
    hosts: dict[str, bytes] = {}
    out = []
    for r in records:
        host = hosts.get(r.store_host)
        if host is None:
            host = hosts[r.store_host] = encode_host(r.store_host)
        out.append(offset_msg_id(host, r.commit_log_offset))
    return out


#: Rows of one RecordBatch made from raw records (Spark moves each to the JVM whole).
BATCH_ROWS = 8192
#: Body bytes after which a RecordBatch is cut short of BATCH_ROWS (large bodies).
BATCH_BYTES = 16 << 20


def record_batch(broker: str, records: Sequence[MessageRecord]) -> pa.RecordBatch:
    """``records`` (all read from ``broker``) as one RecordBatch of :data:`ARROW_SCHEMA`.

    The readable reference of :func:`raw_batches` (tests hold the two equal),
    and its fallback for property blocks that are not UTF-8."""
    columns = [
        [r.topic for r in records],
        [broker] * len(records),
        [r.queue_id for r in records],
        [r.queue_offset for r in records],
        [r.commit_log_offset for r in records],
        _msg_ids(records),
        [r.properties.get(PROPERTY_TAGS) for r in records],
        [r.properties.get(PROPERTY_KEYS) for r in records],
        [list(r.properties.items()) for r in records],
        [r.born_timestamp_ms for r in records],
        [r.store_timestamp_ms for r in records],
        [r.body for r in records],
    ]
    return pa.RecordBatch.from_arrays(
        [pa.array(c, type=f.type) for c, f in zip(columns, ARROW_SCHEMA, strict=True)],
        schema=ARROW_SCHEMA,
    )


def _column(
    kind: pa.DataType, rows: int, part: tuple[pa.Buffer, pa.Buffer, pa.Buffer, int]
) -> pa.Array:
    """A string or binary column from arrow_columns' (offsets, data, validity, nulls)."""
    offsets, data, validity, nulls = part
    return pa.Array.from_buffers(
        kind, rows, [validity if nulls else None, offsets, data], null_count=nulls
    )


def _allocate(size: int) -> pa.Buffer:
    """A buffer for arrow_columns to fill, from Arrow's memory pool (mimalloc):
    it keeps freed memory for the next batch, where malloc hands blocks this
    large back to the kernel and each next batch faults its pages in again
    (~0.3 s of system CPU per 1,000,000 rows of 1 KiB in the worker)."""
    return pa.allocate_buffer(size)


def raw_batches(
    broker: str,
    data: Buffer | Sequence[Buffer],
    pos: int = 0,
    end: int | None = None,
    *,
    max_rows: int = BATCH_ROWS,
    max_bytes: int = BATCH_BYTES,
    check_crc: bool = True,
    damaged: list[DamagedRecord] | None = None,
    max_batches: int | None = None,
) -> Generator[pa.RecordBatch, None, int]:
    """The records of ``data[pos:end]`` (stored records back to back: a pull's
    answer, a run of a CommitLog file; all read from ``broker``) as RecordBatches
    of :data:`ARROW_SCHEMA` of at most ``max_rows`` rows (or ``max_bytes`` of
    bodies), equal to :func:`record_batch` of their :func:`decode_records`.

    ``data`` may be a sequence of buffers each holding whole records (the
    answers of several pulls): it is read as their concatenation, in place
    (positions are in ``b"".join(data)``), so a batch may span answers without
    their bytes being joined first.

    Each batch's buffers are built by one C call
    (:func:`basalt.common._records.arrow_columns`, the GIL released: a thread
    writing the previous batch to Spark runs meanwhile) from the bytes, with
    no Python object per row and each body copied once; a batch holding a
    property block that is not UTF-8 is decoded record by record instead (the
    decoder replaces what Arrow would refuse). Checks each record's checksum
    and raises CorruptRecordError as decode_records does (``check_crc``,
    ``damaged``: a record whose checksum fails is left out and appended to
    ``damaged``, its position one in ``data``; the export, whose scan checked
    them, passes ``check_crc=False``). With ``max_batches``, stops after that
    many batches. Returns (as the generator's value) the position it stopped
    at: ``end``, or where the next batch would begin."""
    parts: Buffer | list[Buffer]
    if isinstance(data, (bytes, bytearray, memoryview, mmap.mmap)):
        parts, size = data, len(memoryview(data))
    else:
        parts = list(data)
        size = sum(len(memoryview(d)) for d in parts)
    stop = size if end is None else end
    broker_value = pa.scalar(broker, pa.string())
    made = 0
    while pos < stop and (max_batches is None or made < max_batches):
        made += 1
        got = _records.arrow_columns(
            parts, pos, stop, max_rows, max_bytes, CorruptRecordError,
            check_crc, damaged, DamagedRecord, _allocate,
        )  # fmt: skip
        at, rows, utf8_ok, queue_id, queue_offset, commitlog_offset, born, stored, entries = got[:9]
        if not utf8_ok:
            # The damaged records of this range are reported already: skip them again.
            joined = b"".join(parts) if isinstance(parts, list) else parts
            records = decode_records(memoryview(joined)[pos:at], check_crc=check_crc, damaged=[])
            yield record_batch(broker, records)
            pos = at
            continue
        topic, msg_id, tags, keys, names, values, body = got[9:]
        n_entries = names[0].size // 4 - 1
        properties = pa.MapArray.from_arrays(
            pa.Array.from_buffers(pa.int32(), rows + 1, [None, entries]),
            _column(pa.string(), n_entries, names),
            _column(pa.string(), n_entries, values),
        )
        columns = [
            _column(pa.string(), rows, topic),
            pa.repeat(broker_value, rows),
            pa.Array.from_buffers(pa.int32(), rows, [None, queue_id]),
            pa.Array.from_buffers(pa.int64(), rows, [None, queue_offset]),
            pa.Array.from_buffers(pa.int64(), rows, [None, commitlog_offset]),
            _column(pa.string(), rows, msg_id),
            _column(pa.string(), rows, tags),
            _column(pa.string(), rows, keys),
            properties,
            pa.Array.from_buffers(pa.int64(), rows, [None, born]),
            pa.Array.from_buffers(pa.int64(), rows, [None, stored]),
            _column(pa.binary(), rows, body),
        ]
        yield pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA)
        pos = at
    return pos


def rows_where(batch: pa.RecordBatch, mask: pa.BooleanArray | None) -> pa.RecordBatch:
    """``batch``'s rows where ``mask`` is true (``batch`` itself when all are, or no mask)."""
    if mask is None or pc.all(mask).as_py():
        return batch
    return batch.filter(mask)
