"""When a stored message is (or was) due: the one reading of its scheduling
properties, for the admin tools and anything else that shows or checks it.

A record asks for later delivery in one of two ways (docs/scheduled.md,
docs/timers.md):

* a **delay level** (``DELAY`` = n): due at its STORETIMESTAMP + level n's delay
  (a level past the last is the last, as the store clamps it). Only the parked
  record in ``SCHEDULE_TOPIC_XXXX`` (or a record not yet parked) carries it:
  the store removes ``DELAY`` from the copy it delivers.
* a **timer** (RocketMQ 5): ``TIMER_OUT_MS`` (the due time a store stamps on a
  timer it accepted), else ``TIMER_DELAY_SEC`` / ``TIMER_DELAY_MS`` after the
  STORETIMESTAMP, else ``TIMER_DELIVER_MS`` / ``__STARTDELIVERTIME``, an
  absolute Unix time in ms. RocketMQ's broker reads the relative ones first
  (HookUtils.transformTimerMessage) and a delay level wins over them all
  (it clears the timer properties of a message that has both).

The relative timer properties are relative to when the store received the
message, so on a delivered copy (whose STORETIMESTAMP is its delivery) only
a stamped ``TIMER_OUT_MS`` or an absolute property gives the right time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from basalt.common.message import (
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_START_DELIVER_TIME,
    PROPERTY_TIMER_DELAY_MS,
    PROPERTY_TIMER_DELAY_SEC,
    PROPERTY_TIMER_DELIVER_MS,
    PROPERTY_TIMER_OUT_MS,
)

#: The absolute timer properties, in the order they are read.
_ABSOLUTE = (PROPERTY_TIMER_DELIVER_MS, PROPERTY_START_DELIVER_TIME)
#: The relative ones: name, ms per unit; read before the absolute ones.
_RELATIVE = ((PROPERTY_TIMER_DELAY_SEC, 1000), (PROPERTY_TIMER_DELAY_MS, 1))


def delay_level(raw: str | None) -> int:
    """A DELAY value as the store reads it: a level when it is 1 to 9 ASCII digits
    (0: no delay), else 0 (the rule of basalt.store.schedule.parse_delay_level)."""
    if raw is None or not 1 <= len(raw) <= 9 or not raw.isascii() or not raw.isdigit():
        return 0
    return int(raw)


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
    for name, unit_ms in _RELATIVE:
        amount = _long(properties.get(name))
        if amount is not None:
            return store_timestamp_ms + amount * unit_ms
    for name in _ABSOLUTE:
        at = _long(properties.get(name))
        if at is not None:
            return at
    return None
