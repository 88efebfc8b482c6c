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

from collections.abc import Sequence

import pyarrow as pa

from basalt.common.message import (
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    MessageRecord,
    encode_host,
    offset_msg_id,
)

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


def record_batch(broker: str, records: Sequence[MessageRecord]) -> pa.RecordBatch:
    """``records`` (all read from ``broker``) as one RecordBatch of :data:`ARROW_SCHEMA`."""
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
