"""Recall handles: what cancels a timer message before it is due (RocketMQ 5.3's
``RecallMessageHandle``), in RocketMQ's own format so a handle from either
side reads the same.

A handle is URL-safe base64 (with padding, as Java's ``Base64.getUrlEncoder``;
decoding accepts it without) of the UTF-8 text::

    v1 <topic> <broker name> <delivery time, Unix ms> <message id (UNIQ_KEY)>

It names everything a front needs to route it (the broker) and the store to
find the message's slot (the time) and the message (topic and id). Topic
and broker names hold no spaces (basalt.common.naming's pattern), so the
fields split cleanly. Anything that does not decode raises
:class:`RecallHandleError` (a ValueError).
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass

__all__ = ["RECALL_VERSION", "RecallHandle", "RecallHandleError"]

RECALL_VERSION = "v1"
#: Longer text is refused before decoding.
MAX_HANDLE_LENGTH = 4096


class RecallHandleError(ValueError):
    """Text that is not a recall handle."""


@dataclass(frozen=True, slots=True)
class RecallHandle:
    """A decoded recall handle (see the module's doc)."""

    topic: str
    broker_name: str
    deliver_time_ms: int
    message_id: str

    def encode(self) -> str:
        text = " ".join(
            (
                RECALL_VERSION,
                self.topic,
                self.broker_name,
                str(self.deliver_time_ms),
                self.message_id,
            )
        )
        return base64.urlsafe_b64encode(text.encode("utf-8")).decode("ascii")

    @classmethod
    def decode(cls, handle: str) -> RecallHandle:
        """Raises :class:`RecallHandleError` when ``handle`` is not one."""
        if not handle or len(handle) > MAX_HANDLE_LENGTH:
            raise RecallHandleError("recall handle is empty or too long")
        try:
            raw = base64.urlsafe_b64decode(handle + "=" * (-len(handle) % 4))
            text = raw.decode("utf-8")
        except (binascii.Error, ValueError):
            raise RecallHandleError("recall handle is not base64 of UTF-8 text") from None
        fields = text.split(" ")
        if len(fields) != 5 or fields[0] != RECALL_VERSION:
            raise RecallHandleError(f"recall handle is not '{RECALL_VERSION} topic broker time id'")
        _, topic, broker, when, message_id = fields
        if not (topic and broker and message_id) or not when.isdigit():
            raise RecallHandleError("recall handle has an empty field or a time that is not ms")
        return cls(topic, broker, int(when), message_id)
