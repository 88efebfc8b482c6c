"""Timer messages on the put path: the delivery time a message asks for, and
the message as it is stored (parked in the timer topic, or as it is when due).

A message asks for a delivery time with a property (RocketMQ 5's names, in
:mod:`basalt.common.message`): TIMER_DELIVER_MS or __STARTDELIVERTIME (Unix
ms), TIMER_DELAY_SEC or TIMER_DELAY_MS (after the put). :func:`park_timer`
resolves it to an absolute time *at put* and, when that time is still ahead,
stores the message in :data:`~basalt.common.message.TIMER_TOPIC` queue 0 with
REAL_TOPIC / REAL_QID, TIMER_DELIVER_MS (absolute) and TIMER_OUT_MS (the
same, the store's mark that it went through the timer) - RocketMQ's
``HookUtils.transformTimerMessage``. A time already passed is stored directly.

Unlike RocketMQ, whose parking rounds the time *down* to the precision (so a
message may arrive up to one tick early), the wheel files a message under the
tick at or after its time (:func:`tick_of`): never delivered before its time.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from basalt.common.message import (
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TIMER_DEL_UNIQKEY,
    PROPERTY_TIMER_DELAY_MS,
    PROPERTY_TIMER_DELAY_SEC,
    PROPERTY_TIMER_DELIVER_MS,
    PROPERTY_TIMER_OUT_MS,
    PROPERTY_TIMER_ROLL_TIMES,
    PROPERTY_UNIQ_KEY,
    SCHEDULE_TOPIC,
    TIMER_REQUEST_PROPERTIES,
    TIMER_TOPIC,
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    TRANSACTION_TYPE_MASK,
    Message,
    MessageRecord,
)
from basalt.store.errors import StoreError

log = logging.getLogger(__name__)

#: What the delivered copy loses (REAL_* as the delay levels' unpark; the
#: relative forms were resolved at put). TIMER_DELIVER_MS and TIMER_OUT_MS stay:
#: the delivery time shows on the delivered message and it is never parked again.
DELIVERY_DROPS = frozenset(
    {
        PROPERTY_REAL_TOPIC,
        PROPERTY_REAL_QUEUE_ID,
        PROPERTY_TIMER_DELAY_SEC,
        PROPERTY_TIMER_DELAY_MS,
        PROPERTY_TIMER_ROLL_TIMES,
    }
)


_TIMER_NAMES = frozenset(TIMER_REQUEST_PROPERTIES)


class BadTimer(StoreError, ValueError):
    """A timer property that is not a number, or a time past the maximum: refused."""


def tick_of(deliver_ms: int, precision_ms: int) -> int:
    """The wheel tick a message due at ``deliver_ms`` is filed under: the first
    tick whose time (tick * precision) is at or after it."""
    return -(-deliver_ms // precision_ms)


def delete_key(topic: str, uniq_key: str) -> str:
    """A recall's key: RocketMQ 5.3's ``TimerMessageStore.buildDeleteKey``."""
    return f"{topic}+{uniq_key}"


def _number(props: dict[str, str], name: str) -> int:
    raw = props[name]
    try:
        return int(raw)
    except ValueError:
        raise BadTimer(f"{name} {raw[:30]!r} is not an integer") from None


def requested_deliver_ms(props: dict[str, str], now_ms: int) -> int | None:
    """The absolute delivery time ``props`` ask for (None: no timer). Raises
    :class:`BadTimer` for a value that is not an integer."""
    for name in TIMER_REQUEST_PROPERTIES:
        if name in props:
            value = _number(props, name)
            if name == PROPERTY_TIMER_DELAY_SEC:
                return now_ms + value * 1000
            if name == PROPERTY_TIMER_DELAY_MS:
                return now_ms + value
            return value
    return None


def is_timer_request(message: Message) -> bool:
    """Whether :func:`park_timer` has anything to do with ``message`` (cheap: the
    put path asks it of every message with properties)."""
    props = message.properties
    if message.deliver_time_ms > 0:
        return PROPERTY_TIMER_OUT_MS not in props
    if not props or _TIMER_NAMES.isdisjoint(props):
        return False
    return PROPERTY_TIMER_OUT_MS not in props


def park_timer(message: Message, now_ms: int, max_delay_ms: int, *, enabled: bool) -> Message:
    """``message`` as stored (see the module's doc). ``max_delay_ms``: the furthest
    ahead a time may be (RocketMQ's timerMaxDelaySec). Raises :class:`BadTimer`
    for a bad value, a time past the maximum, or any timer while ``enabled`` is
    False (timer_wheel_enable off)."""
    if not is_timer_request(message) or message.topic in (TIMER_TOPIC, SCHEDULE_TOPIC):
        return message
    props = message.all_properties()
    if PROPERTY_DELAY_TIME_LEVEL in props:
        # RocketMQ's checkIfTimerMessage: a delay level wins, the timer is dropped.
        for name in TIMER_REQUEST_PROPERTIES:
            props.pop(name, None)
        return replace(message, tags=None, keys=(), properties=props, deliver_time_ms=0)
    if message.sys_flag & TRANSACTION_TYPE_MASK in (
        TRANSACTION_PREPARED_TYPE,
        TRANSACTION_ROLLBACK_TYPE,
    ):
        return message  # only a transaction's commit is parked (as for delay levels)
    if not enabled:
        raise BadTimer("timer messages are disabled on this store (timer_wheel_enable)")
    deliver_ms = requested_deliver_ms(props, now_ms)
    assert deliver_ms is not None  # is_timer_request said so
    if deliver_ms - now_ms > max_delay_ms:
        raise BadTimer(
            f"delivery time {deliver_ms} is {deliver_ms - now_ms} ms ahead: at most "
            f"timer_max_delay_sec ({max_delay_ms // 1000} s) is allowed"
        )
    for name in TIMER_REQUEST_PROPERTIES:
        props.pop(name, None)
    props[PROPERTY_TIMER_DELIVER_MS] = str(deliver_ms)
    if deliver_ms <= now_ms:
        # Due already: stored as it is, marked so it is never parked again.
        props[PROPERTY_TIMER_OUT_MS] = str(deliver_ms)
        return replace(message, tags=None, keys=(), properties=props, deliver_time_ms=0)
    props[PROPERTY_TIMER_OUT_MS] = str(deliver_ms)
    props[PROPERTY_REAL_TOPIC] = message.topic
    props[PROPERTY_REAL_QUEUE_ID] = str(message.queue_id)
    return replace(
        message,
        topic=TIMER_TOPIC,
        queue_id=0,
        tags=None,
        keys=(),
        properties=props,
        delay_time_level=0,
        deliver_time_ms=0,
    )


def delete_marker(topic: str, uniq_key: str, deliver_ms: int, born_ms: int) -> Message:
    """A recall's delete marker, parked as it is (RocketMQ 5.3's
    RecallMessageProcessor.buildMessage): filed in the same slot as the message
    it cancels, whose scan then skips that message."""
    return Message(
        TIMER_TOPIC,
        b"0",
        queue_id=0,
        properties={
            PROPERTY_TIMER_DEL_UNIQKEY: delete_key(topic, uniq_key),
            PROPERTY_UNIQ_KEY: uniq_key,
            PROPERTY_TIMER_DELIVER_MS: str(deliver_ms),
            PROPERTY_TIMER_OUT_MS: str(deliver_ms),
            PROPERTY_REAL_TOPIC: topic,
            PROPERTY_REAL_QUEUE_ID: "0",
        },
        born_timestamp_ms=born_ms,
    )


def out_ms(record: MessageRecord | None) -> int | None:
    """A parked record's delivery time (TIMER_OUT_MS); None when it has none."""
    if record is None:
        return None
    raw = record.properties.get(PROPERTY_TIMER_OUT_MS)
    try:
        return int(raw) if raw is not None else None
    except ValueError:
        log.error("timer: record at %d has TIMER_OUT_MS %r", record.commit_log_offset, raw)
        return None


def rolled(record: MessageRecord) -> Message:
    """A ROLL entry's record written to the timer topic again, as it is (RocketMQ's
    convertMessage with needRoll), TIMER_ROLL_TIMES counting."""
    props = dict(record.properties)
    try:
        times = int(props.get(PROPERTY_TIMER_ROLL_TIMES, "0"))
    except ValueError:
        times = 0
    props[PROPERTY_TIMER_ROLL_TIMES] = str(times + 1)
    return Message(
        TIMER_TOPIC,
        record.body,
        queue_id=0,
        properties=props,
        flag=record.flag,
        sys_flag=record.sys_flag,
        born_timestamp_ms=record.born_timestamp_ms,
        born_host=record.born_host,
        reconsume_times=record.reconsume_times,
        prepared_transaction_offset=record.prepared_transaction_offset,
    )


__all__ = [
    "DELIVERY_DROPS",
    "TIMER_REQUEST_PROPERTIES",
    "BadTimer",
    "delete_key",
    "delete_marker",
    "is_timer_request",
    "out_ms",
    "park_timer",
    "requested_deliver_ms",
    "rolled",
    "tick_of",
]
