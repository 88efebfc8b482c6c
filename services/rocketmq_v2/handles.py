"""The v2 front's self-describing transaction ids.

A v2 ``SendResultEntry`` answers a transactional send's ``transaction_id``;
the client echoes it back later (``EndTransaction``, its checker's too),
possibly to another pull-service. RocketMQ's proxy keeps transaction ids in
memory (its TransactionDataManager) and so must be asked by the same proxy;
Basalt's front keeps nothing, so the id names what routes it, as receipt
handles do (:mod:`basalt.common.receipt`): the store-node (broker) holding
the half message, the topic it was sent to, and the half's offset message id
(what ``StoreNode.EndTransaction`` finds it by). (A timer's recall handle
needs no such wrapper: the store-node's, RocketMQ 5.3's format
(:mod:`basalt.common.recall`), names its broker already.)

An id is URL-safe base64 (no padding) of these bytes, big-endian:

======  ====  ===========  ==================================================
Offset  Size  Field        Meaning
======  ====  ===========  ==================================================
0       1     VERSION      1
1       1     KIND         ``T`` (a transaction id; other kinds may follow)
2       4     CRC32        zlib.crc32 of bytes 6 .. end
6       2     BROKERLEN    length of BROKER
8       2     TOPICLEN     length of TOPIC
10      2     REFLEN       length of REF
12      ..    BROKER,      UTF-8; REF is the half's offset message id
              TOPIC, REF
======  ====  ===========  ==================================================

The CRC catches an id mangled in transit or typed by hand. Anything that does not decode
raises :class:`HandleError` (a ValueError).
"""

from __future__ import annotations

import base64
import binascii
import struct
import zlib
from dataclasses import dataclass
from typing import ClassVar

__all__ = ["HandleError", "TransactionId"]

_VERSION = 1
_LAYOUT = struct.Struct(">BBIHHH")  # VERSION KIND CRC32 BROKERLEN TOPICLEN REFLEN
#: Bytes before the CRC'd part: VERSION, KIND and CRC32.
_CRC_FROM = struct.calcsize(">BBI")
#: Longer text is refused before decoding (three names of at most 64 KiB each).
MAX_TEXT_LENGTH = (_LAYOUT.size + 3 * 0xFFFF) * 4 // 3 + 4


class HandleError(ValueError):
    """A handle that does not decode; ``text`` is what was given."""

    def __init__(self, what: str, text: str, reason: str) -> None:
        super().__init__(f"malformed {what} ({reason}): {text[:80]!r}")
        self.text = text
        self.reason = reason


def _encode(kind: bytes, broker: str, topic: str, ref: str) -> str:
    parts = [broker.encode(), topic.encode(), ref.encode()]
    if any(len(p) > 0xFFFF for p in parts):
        raise ValueError("broker name, topic or reference longer than 65535 bytes")
    head = _LAYOUT.pack(_VERSION, kind[0], 0, *(len(p) for p in parts))
    raw = bytearray(head + b"".join(parts))
    struct.pack_into(">I", raw, 2, zlib.crc32(memoryview(raw)[_CRC_FROM:]))
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def _decode(kind: bytes, what: str, text: str) -> tuple[str, str, str]:
    if not text or len(text) > MAX_TEXT_LENGTH:
        raise HandleError(what, text, "empty or too long")
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError) as e:
        raise HandleError(what, text, "not URL-safe base64") from e
    if len(raw) < _LAYOUT.size:
        raise HandleError(what, text, "too short")
    version, got_kind, crc, blen, tlen, rlen = _LAYOUT.unpack_from(raw)
    if version != _VERSION:
        raise HandleError(what, text, f"version {version}")
    if got_kind != kind[0]:
        raise HandleError(what, text, "another kind of handle")
    if len(raw) != _LAYOUT.size + blen + tlen + rlen:
        raise HandleError(what, text, "wrong length")
    if zlib.crc32(raw[_CRC_FROM:]) != crc:
        raise HandleError(what, text, "CRC mismatch")
    rest = raw[_LAYOUT.size :]
    try:
        broker = rest[:blen].decode()
        topic = rest[blen : blen + tlen].decode()
        ref = rest[blen + tlen :].decode()
    except UnicodeDecodeError as e:
        raise HandleError(what, text, "names are not UTF-8") from e
    if not broker or not ref:
        raise HandleError(what, text, "no broker or reference")
    return broker, topic, ref


@dataclass(frozen=True, slots=True)
class TransactionId:
    """A transactional send's ``transaction_id`` (the module docstring)."""

    _KIND: ClassVar[bytes] = b"T"

    broker_name: str
    topic: str
    offset_msg_id: str

    def encode(self) -> str:
        """The id's text. Raises ValueError for a name past 65535 bytes."""
        return _encode(self._KIND, self.broker_name, self.topic, self.offset_msg_id)

    @classmethod
    def decode(cls, text: str) -> TransactionId:
        """The id a text encodes. Raises :class:`HandleError`."""
        return cls(*_decode(cls._KIND, "transaction id", text))
