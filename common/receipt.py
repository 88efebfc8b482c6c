"""Receipt handles: what a pop delivery is acked by, self-describing so any front routes it.

A handle names the store-node (broker) that holds the delivery, the queue and
offset of the message, and the delivery's nonce (a later delivery of the same
message has another: the earlier handle is stale). It is opaque to clients -
RocketMQ 5 clients echo it back - and compact, URL-safe base64 (no padding)
of these bytes, big-endian:

======  ====  ===============  ==============================================
Offset  Size  Field            Meaning
======  ====  ===============  ==============================================
0       1     VERSION          1
1       4     CRC32            zlib.crc32 of bytes 5 .. end
5       4     QUEUEID          the queue
9       8     QUEUEOFFSET      the message's queue offset
17      8     COMMITLOGOFFSET  the record's CommitLog offset
25      8     NONCE            the delivery's nonce
33      8     VISIBLEAT        when the message is visible again, Unix ms
41      8     INVISIBLEMS      the invisible duration the delivery was given
49      2     BROKERLEN        length of BROKER
51      2     TOPICLEN         length of TOPIC
53      ..    BROKER, TOPIC    UTF-8
======  ====  ===============  ==============================================

The CRC catches a handle mangled in transit or typed by hand: anything that
does not decode raises :class:`ReceiptHandleError` (a ValueError).
"""

from __future__ import annotations

import base64
import binascii
import struct
import zlib
from dataclasses import dataclass

__all__ = ["RECEIPT_VERSION", "ReceiptHandle", "ReceiptHandleError"]

RECEIPT_VERSION = 1

_LAYOUT = struct.Struct(
    ">"
    "B"  # VERSION
    "I"  # CRC32
    "i"  # QUEUEID
    "q"  # QUEUEOFFSET
    "q"  # COMMITLOGOFFSET
    "q"  # NONCE
    "q"  # VISIBLEAT
    "q"  # INVISIBLEMS
    "H"  # BROKERLEN
    "H"  # TOPICLEN
)
#: Bytes before the CRC'd part: VERSION and CRC32.
_CRC_FROM = struct.calcsize(">BI")
#: Longer text is refused before decoding (two names of at most 64 KiB each).
MAX_HANDLE_LENGTH = (_LAYOUT.size + 2 * 0xFFFF) * 4 // 3 + 4


class ReceiptHandleError(ValueError):
    """A receipt handle that does not decode; ``handle`` is the text given."""

    def __init__(self, handle: str, reason: str) -> None:
        super().__init__(f"malformed receipt handle ({reason}): {handle[:80]!r}")
        self.handle = handle
        self.reason = reason


@dataclass(frozen=True, slots=True)
class ReceiptHandle:
    """One delivery of a popped message (see the module docstring)."""

    broker_name: str
    topic: str
    queue_id: int
    queue_offset: int
    commit_log_offset: int
    nonce: int
    visible_at_ms: int
    invisible_ms: int

    def encode(self) -> str:
        """The handle's text. Raises ValueError for a field out of its range."""
        b, t = self.broker_name.encode(), self.topic.encode()
        if len(b) > 0xFFFF or len(t) > 0xFFFF:
            raise ValueError("broker name or topic longer than 65535 bytes")
        try:
            head = _LAYOUT.pack(
                RECEIPT_VERSION, 0, self.queue_id, self.queue_offset, self.commit_log_offset,
                self.nonce, self.visible_at_ms, self.invisible_ms, len(b), len(t),
            )  # fmt: skip
        except struct.error as e:
            raise ValueError(f"receipt handle field out of range: {e}") from e
        raw = bytearray(head + b + t)
        struct.pack_into(">I", raw, 1, zlib.crc32(memoryview(raw)[_CRC_FROM:]))
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")

    @classmethod
    def decode(cls, handle: str) -> ReceiptHandle:
        """The handle a text encodes. Raises :class:`ReceiptHandleError`."""
        if not handle or len(handle) > MAX_HANDLE_LENGTH:
            raise ReceiptHandleError(handle, "empty or too long")
        try:
            raw = base64.urlsafe_b64decode(handle + "=" * (-len(handle) % 4))
        except (binascii.Error, ValueError) as e:
            raise ReceiptHandleError(handle, "not URL-safe base64") from e
        if len(raw) < _LAYOUT.size:
            raise ReceiptHandleError(handle, "too short")
        version, crc, queue_id, offset, physical, nonce, visible, invisible, blen, tlen = (
            _LAYOUT.unpack_from(raw)
        )
        if version != RECEIPT_VERSION:
            raise ReceiptHandleError(handle, f"version {version}")
        if len(raw) != _LAYOUT.size + blen + tlen:
            raise ReceiptHandleError(handle, "wrong length")
        if zlib.crc32(raw[_CRC_FROM:]) != crc:
            raise ReceiptHandleError(handle, "CRC mismatch")
        names = raw[_LAYOUT.size :]
        try:
            broker, topic = names[:blen].decode(), names[blen:].decode()
        except UnicodeDecodeError as e:
            raise ReceiptHandleError(handle, "names are not UTF-8") from e
        return cls(broker, topic, queue_id, offset, physical, nonce, visible, invisible)
