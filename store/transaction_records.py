"""The records of transactional messages: a half, its committed message, an op
mark, a re-checked copy, a copy given up on (store.transaction's shapes;
docs/transactions.md has the table of properties)."""

from __future__ import annotations

import enum

from basalt.common.message import (
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TRANSACTION_CHECK_TIMES,
    PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_TRANSACTION_RESOLUTION,
    PROPERTY_UNIQ_KEY,
    TRANS_CHECK_MAX_TIME_TOPIC,
    TRANS_HALF_TOPIC,
    TRANS_OP_HALF_TOPIC,
    TRANS_OP_TAG,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_TYPE_MASK,
    Message,
    MessageRecord,
)
from basalt.store.errors import StoreError
from basalt.store.parking import copy_of, real_destination

HALF_QUEUE_ID = 0
OP_QUEUE_ID = 0
#: RocketMQ's TransactionalMessageUtil.OFFSET_SEPARATOR (an op mark may list several).
_OFFSET_SEPARATOR = ","
#: What a half carries that its committed message does not.
_HALF_ONLY = frozenset(
    {
        PROPERTY_REAL_TOPIC,
        PROPERTY_REAL_QUEUE_ID,
        PROPERTY_TRANSACTION_PREPARED,
        PROPERTY_TRANSACTION_CHECK_TIMES,
    }
)


class Resolution(enum.Enum):
    """What was done with a transaction (the op mark's TRAN_RESOLUTION)."""

    COMMIT = "commit"
    ROLLBACK = "rollback"
    #: Checked transaction_check_max times: moved to TRANS_CHECK_MAX_TIME_TOPIC, rolled back.
    CHECK_MAX = "check_max"
    #: Resolved, how is not known (a RocketMQ op mark, or one long forgotten).
    RESOLVED = "resolved"


class BadHalf(StoreError, ValueError):
    """A transactional send that cannot be a half message (no PGROUP, no UNIQ_KEY)."""


def is_transactional(message: Message) -> bool:
    """Whether a send asks to be a half message (TRAN_MSG=true, as RocketMQ reads it)."""
    raw = message.properties.get(PROPERTY_TRANSACTION_PREPARED) if message.properties else None
    return raw is not None and raw.lower() == "true"


def half_message(message: Message) -> Message:
    """``message`` parked as a half in TRANS_HALF_TOPIC queue 0 (see the module's
    doc). Raises :class:`BadHalf` without a PGROUP or a UNIQ_KEY (the
    transaction id every EndTransaction names)."""
    props = message.all_properties()
    if not props.get(PROPERTY_PRODUCER_GROUP):
        raise BadHalf("a transactional message needs its producer group (PGROUP)")
    if not props.get(PROPERTY_UNIQ_KEY):
        raise BadHalf("a transactional message needs its transaction id (UNIQ_KEY)")
    props[PROPERTY_TRANSACTION_PREPARED] = "true"
    props[PROPERTY_REAL_TOPIC] = message.topic
    props[PROPERTY_REAL_QUEUE_ID] = str(message.queue_id)
    return Message(
        TRANS_HALF_TOPIC,
        message.body,
        queue_id=HALF_QUEUE_ID,
        properties=props,
        flag=message.flag,
        sys_flag=message.sys_flag & ~TRANSACTION_TYPE_MASK,
        born_timestamp_ms=message.born_timestamp_ms,
        born_host=message.born_host,
        reconsume_times=message.reconsume_times,
    )


def committed_message(half: MessageRecord) -> Message:
    """The real message a committed half becomes (RocketMQ's endMessageTransaction).
    Raises ValueError for a record without REAL_TOPIC / REAL_QID."""
    topic, queue_id = real_destination(half)
    sys_flag = (half.sys_flag & ~TRANSACTION_TYPE_MASK) | TRANSACTION_COMMIT_TYPE
    return copy_of(
        half,
        topic,
        queue_id,
        drop=_HALF_ONLY,
        sys_flag=sys_flag,
        prepared_transaction_offset=half.commit_log_offset,
    )


def op_mark(half_queue_offset: int, resolution: Resolution) -> Message:
    """The op mark resolving the half at ``half_queue_offset``: tag ``d``, the offset
    as the body (RocketMQ's layout), and what was done in TRAN_RESOLUTION."""
    return Message(
        TRANS_OP_HALF_TOPIC,
        str(half_queue_offset).encode(),
        queue_id=OP_QUEUE_ID,
        tags=TRANS_OP_TAG,
        properties={PROPERTY_TRANSACTION_RESOLUTION: resolution.value},
    )


def parse_op_mark(record: MessageRecord) -> tuple[list[int], Resolution]:
    """The half queue offsets an op mark resolves, and how; ([], ...) for a record
    that is no op mark (another tag, a body that is not offsets)."""
    if record.tags != TRANS_OP_TAG:
        return [], Resolution.RESOLVED
    try:
        offsets = [int(p) for p in record.body.decode("ascii").split(_OFFSET_SEPARATOR) if p]
    except (UnicodeDecodeError, ValueError):
        return [], Resolution.RESOLVED
    try:
        how = Resolution(record.properties.get(PROPERTY_TRANSACTION_RESOLUTION, "resolved"))
    except ValueError:
        how = Resolution.RESOLVED
    return offsets, how


def check_times(record: MessageRecord) -> int:
    """How many times a half has been checked (TRANSACTION_CHECK_TIMES; 0 if absent)."""
    try:
        return max(0, int(record.properties.get(PROPERTY_TRANSACTION_CHECK_TIMES, "0")))
    except ValueError:
        return 0


def rechecked_half(half: MessageRecord, times: int) -> Message:
    """A half put again to the half queue with TRANSACTION_CHECK_TIMES = ``times``."""
    return copy_of(
        half,
        TRANS_HALF_TOPIC,
        HALF_QUEUE_ID,
        add={PROPERTY_TRANSACTION_CHECK_TIMES: str(times)},
    )


def check_max_message(half: MessageRecord) -> Message:
    """A half given up on, as stored in TRANS_CHECK_MAX_TIME_TOPIC queue 0 (RocketMQ's
    toMessageExtBrokerInner: every property kept, REAL_TOPIC included)."""
    return copy_of(half, TRANS_CHECK_MAX_TIME_TOPIC, 0)


def transaction_key(record: MessageRecord) -> str:
    """The transaction a half belongs to: its UNIQ_KEY (its queue offset for a
    RocketMQ-written half without one)."""
    return record.uniq_key or f"#{record.queue_offset}"


__all__ = [
    "HALF_QUEUE_ID",
    "OP_QUEUE_ID",
    "BadHalf",
    "Resolution",
    "check_max_message",
    "check_times",
    "committed_message",
    "half_message",
    "is_transactional",
    "op_mark",
    "parse_op_mark",
    "rechecked_half",
    "transaction_key",
]
