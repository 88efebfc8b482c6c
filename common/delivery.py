"""When a stored message is (or was) due: the one reading of its scheduling
properties, for the admin tools and anything else that shows or checks it.

A record asks for later delivery in one of two ways (docs/scheduled.md,
docs/timers.md):

* a **delay level** (``DELAY`` = n): due at its STORETIMESTAMP + level n's delay
  (a level past the last is the last, as the store clamps it). Only the parked
  record in ``SCHEDULE_TOPIC_XXXX`` (or a record not yet parked) carries it:
  the store removes ``DELAY`` from the copy it delivers.
* a **timer** (RocketMQ 5): ``TIMER_OUT_MS`` (the due time the store stamps on
  a timer message it parks; the delivered copy keeps it), else what the
  message asked for, in the store's order (``TIMER_REQUEST_PROPERTIES``):
  ``TIMER_DELIVER_MS`` / ``__STARTDELIVERTIME`` (Unix ms), then
  ``TIMER_DELAY_SEC`` / ``TIMER_DELAY_MS`` after the STORETIMESTAMP. A delay
  level wins over them all (the store drops the timer of a message that has
  both, as RocketMQ's checkIfTimerMessage does).

The relative timer properties are relative to when the store received the
message, so on a delivered copy (whose STORETIMESTAMP is its delivery) only
the stamped ``TIMER_OUT_MS`` or an absolute property gives the right time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from basalt.common.message import (
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_TIMER_DELAY_MS,
    PROPERTY_TIMER_DELAY_SEC,
    PROPERTY_TIMER_OUT_MS,
    TIMER_REQUEST_PROPERTIES,
)

#: The properties relative to the store time: ms per unit (the others are Unix ms).
_RELATIVE_UNIT_MS = {PROPERTY_TIMER_DELAY_SEC: 1000, PROPERTY_TIMER_DELAY_MS: 1}


def delay_level(raw: bytes | str | None) -> int:
    """A DELAY value as the store reads it: a level when it is 1 to 9 ASCII digits
    (0: no delay), else 0. The one rule: the store's parking and ConsumeQueue
    tagsCode (basalt.store.schedule, whose C walk ``_records`` applies it too)
    and the tools that show a due time all read DELAY with it."""
    if raw is None:
        return 0
    data = raw.encode("utf-8") if isinstance(raw, str) else raw
    if not 1 <= len(data) <= 9 or not data.isdigit():  # bytes.isdigit: ASCII only
        return 0
    return int(data)


def _long(raw: str | None) -> int | None:
    """Java's Long.parseLong of a property value: an optional sign and ASCII
    digits; None when absent or malformed."""
    if raw is None:
        return None
    digits = raw[1:] if raw[:1] in ("-", "+") else raw
    if not 1 <= len(digits) <= 19 or not digits.isascii() or not digits.isdigit():
        return None
    return int(raw)


def delivery_time_ms(
    properties: Mapping[str, str], store_timestamp_ms: int, delays_ms: Sequence[int]
) -> int | None:
    """The Unix time in ms the record with ``properties``, stored at
    ``store_timestamp_ms``, is due; None when it asks for no later delivery (or
    only with malformed values, which the store refuses at the send).

    ``delays_ms`` is the store's delay table (level ``i``'s delay at index
    ``i - 1``: ``MessageStoreConfig.delay_levels_ms``, or what the store-node's
    GetScheduleStatus lists); empty when unknown, and then a DELAY gives None.
    A time already past is returned as it is: such a message is delivered at
    once."""
    level = delay_level(properties.get(PROPERTY_DELAY_TIME_LEVEL))
    if level > 0:
        if not delays_ms:
            return None
        return store_timestamp_ms + delays_ms[min(level, len(delays_ms)) - 1]
    stamped = _long(properties.get(PROPERTY_TIMER_OUT_MS))
    if stamped is not None:
        return stamped
    for name in TIMER_REQUEST_PROPERTIES:
        value = _long(properties.get(name))
        if value is not None:
            unit_ms = _RELATIVE_UNIT_MS.get(name)
            return value if unit_ms is None else store_timestamp_ms + value * unit_ms
    return None
