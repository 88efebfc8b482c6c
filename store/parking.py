"""Parked messages: what the system-topic services share.

A delayed message (store.schedule) and a transactional half message
(store.transaction) are stored in a system topic with their real destination
in the REAL_TOPIC / REAL_QID properties, and later put again where they were
going. :func:`real_destination` reads that destination; :func:`copy_of` makes
the message a parked record becomes, everything the producer sent kept (body,
flag, sysflag, born time and host, reconsume times, and the properties: TAGS,
KEYS and UNIQ_KEY, so a consumer sees the producer's message id).
"""

from __future__ import annotations

from collections.abc import Collection

from basalt.common.message import (
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    Message,
    MessageRecord,
)


def real_destination(record: MessageRecord) -> tuple[str, int]:
    """(REAL_TOPIC, REAL_QID) of a parked record. Raises ValueError when it has
    no (valid) destination."""
    props = record.properties
    topic = props.get(PROPERTY_REAL_TOPIC)
    try:
        queue_id = int(props.get(PROPERTY_REAL_QUEUE_ID, "-1"))
    except ValueError:
        queue_id = -1
    if not topic or queue_id < 0:
        raise ValueError(f"record at {record.commit_log_offset} has no REAL_TOPIC/REAL_QID")
    return topic, queue_id


def copy_of(
    record: MessageRecord,
    topic: str,
    queue_id: int,
    *,
    drop: Collection[str] = (),
    add: dict[str, str] | None = None,
    sys_flag: int | None = None,
    prepared_transaction_offset: int | None = None,
) -> Message:
    """``record`` as a new message to ``topic`` / ``queue_id``: its properties
    without the names in ``drop``, with ``add``; its sysflag and prepared
    transaction offset unless given; everything else as stored."""
    props = {k: v for k, v in record.properties.items() if k not in drop}
    if add:
        props.update(add)
    return Message(
        topic,
        record.body,
        queue_id=queue_id,
        properties=props,
        flag=record.flag,
        sys_flag=record.sys_flag if sys_flag is None else sys_flag,
        born_timestamp_ms=record.born_timestamp_ms,
        born_host=record.born_host,
        reconsume_times=record.reconsume_times,
        prepared_transaction_offset=record.prepared_transaction_offset
        if prepared_transaction_offset is None
        else prepared_transaction_offset,
    )


__all__ = ["copy_of", "real_destination"]
