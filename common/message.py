"""Messages as producers hand them to the store, and as the store hands them back.

Shared by the SDK and the engine: the message types, the properties format,
the sysflag bits, RocketMQ's host bytes and its message ids (the offset id a
store assigns, the UNIQ_KEY a producer assigns).

Property wire format (RocketMQ ``MessageDecoder.messageProperties2String``):
``name\\x01value\\x02name\\x01value\\x02…`` in UTF-8, every pair terminated by
``\\x02``. TAGS, KEYS (space-separated) and UNIQ_KEY are ordinary properties.

SysFlag bits (RocketMQ ``MessageSysFlag``)::

    0x01 COMPRESSED          0x04 TRANSACTION_PREPARED   0x10 BORNHOST_V6
    0x02 MULTI_TAGS          0x08 TRANSACTION_COMMIT     0x20 STOREHOSTADDRESS_V6
                             0x0C TRANSACTION_ROLLBACK
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import itertools
import os
import random
import socket
import struct
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

PROPERTY_TAGS = "TAGS"
PROPERTY_KEYS = "KEYS"
PROPERTY_UNIQ_KEY = "UNIQ_KEY"
#: RocketMQ's PROPERTY_DELAY_TIME_LEVEL: the delay level (1..N of the store's
#: ``message_delay_level``) a message waits in :data:`SCHEDULE_TOPIC` for.
PROPERTY_DELAY_TIME_LEVEL = "DELAY"
#: Where a scheduled message goes when due (RocketMQ's PROPERTY_REAL_TOPIC and
#: PROPERTY_REAL_QUEUE_ID), set by the store when it parks the message.
PROPERTY_REAL_TOPIC = "REAL_TOPIC"
PROPERTY_REAL_QUEUE_ID = "REAL_QID"
#: RocketMQ's TopicValidator.RMQ_SYS_SCHEDULE_TOPIC: queue ``level - 1`` holds the
#: messages of delay level ``level``; a unit's tagsCode is its due time (docs/scheduled.md).
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
#: RocketMQ 5's timers (docs/timers.md). A message asks for a delivery time with
#: one of: TIMER_DELIVER_MS (Unix ms), __STARTDELIVERTIME (Unix ms, RocketMQ 4's
#: commercial name, still sent by clients), TIMER_DELAY_SEC / TIMER_DELAY_MS
#: (after the store time; resolved to TIMER_DELIVER_MS when stored).
PROPERTY_TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
PROPERTY_START_DELIVER_TIME = "__STARTDELIVERTIME"
PROPERTY_TIMER_DELAY_SEC = "TIMER_DELAY_SEC"
PROPERTY_TIMER_DELAY_MS = "TIMER_DELAY_MS"
#: The properties that ask for a timer, in the order the store reads them.
TIMER_REQUEST_PROPERTIES = (
    PROPERTY_TIMER_DELIVER_MS,
    PROPERTY_START_DELIVER_TIME,
    PROPERTY_TIMER_DELAY_SEC,
    PROPERTY_TIMER_DELAY_MS,
)
#: Set by the store on a parked timer message: its delivery time (Unix ms). A
#: message carrying it is never parked again (RocketMQ's rule: it has been
#: through the timer already), so the delivered copy keeps it.
PROPERTY_TIMER_OUT_MS = "TIMER_OUT_MS"
#: A recall's delete marker: ``<real topic>+<UNIQ_KEY>`` of the timer message
#: it cancels (RocketMQ 5.3's TimerMessageStore.buildDeleteKey).
PROPERTY_TIMER_DEL_UNIQKEY = "TIMER_DEL_UNIQKEY"
#: How often a timer message past the wheel's roll window was put back into
#: the timer topic to wait further (RocketMQ's TIMER_ROLL_TIMES).
PROPERTY_TIMER_ROLL_TIMES = "TIMER_ROLL_TIMES"
#: RocketMQ 5's TimerMessageStore.TIMER_TOPIC (``rmq_sys_`` + ``wheel_timer``):
#: every timer message waits here (queue 0) until due (docs/timers.md).
TIMER_TOPIC = "rmq_sys_wheel_timer"
KEY_SEPARATOR = " "
NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"

COMPRESSED_FLAG = 0x1
MULTI_TAGS_FLAG = 0x2
TRANSACTION_NOT_TYPE = 0x0
TRANSACTION_PREPARED_TYPE = 0x4
TRANSACTION_COMMIT_TYPE = 0x8
TRANSACTION_ROLLBACK_TYPE = 0xC
TRANSACTION_TYPE_MASK = 0xC
BORNHOST_V6_FLAG = 0x10
STOREHOSTADDRESS_V6_FLAG = 0x20


def transaction_type(sys_flag: int) -> int:
    """The transaction bits of a sysflag: one of the ``TRANSACTION_*_TYPE`` values."""
    return sys_flag & TRANSACTION_TYPE_MASK


def is_dispatchable(sys_flag: int) -> bool:
    """Whether a record belongs in a ConsumeQueue: not prepared, not rolled back."""
    t = sys_flag & TRANSACTION_TYPE_MASK
    return t in (TRANSACTION_NOT_TYPE, TRANSACTION_COMMIT_TYPE)


def encode_properties(properties: Mapping[str, str]) -> bytes:
    """Encode properties as ``name\\x01value\\x02…`` UTF-8 bytes."""
    if not properties:
        return b""
    return "".join(
        f"{k}{NAME_VALUE_SEPARATOR}{v}{PROPERTY_SEPARATOR}" for k, v in properties.items()
    ).encode("utf-8")


def decode_properties(data: bytes) -> dict[str, str]:
    """Decode ``name\\x01value\\x02…`` bytes; pairs without a separator are skipped."""
    out: dict[str, str] = {}
    if not data:
        return out
    for pair in data.decode("utf-8", errors="replace").split(PROPERTY_SEPARATOR):
        name, sep, value = pair.partition(NAME_VALUE_SEPARATOR)
        if sep:
            out[name] = value
    return out


def property_value(
    data: bytes, name: bytes, start: int = 0, end: int | None = None
) -> bytes | None:
    """Find one property's raw value without decoding the rest.

    Searches the properties block ``data[start:end]`` in place (the dispatcher
    passes a whole CommitLog chunk and the block's bounds, so nothing is
    sliced but the value). ``name`` is the UTF-8 name; the match must start
    the block or follow a ``\x02`` so that ``XTAGS`` never matches ``TAGS``.
    """
    if end is None:
        end = len(data)
    needle = name + b"\x01"
    block_start = start
    while True:
        i = data.find(needle, start, end)
        if i < 0:
            return None
        if i == block_start or data[i - 1] == 2:
            j = i + len(needle)
            value_end = data.find(b"\x02", j, end)
            return data[j : end if value_end < 0 else value_end]
        start = i + 1


def encode_host(address: str) -> bytes:
    """``"ip:port"`` (IPv6 may be bracketed) to RocketMQ's host bytes: ip(4|16) + port(4)."""
    host, _, port = address.rpartition(":")
    ip = ipaddress.ip_address(host.strip("[]"))
    return ip.packed + struct.pack(">i", int(port))


@functools.lru_cache(maxsize=256)
def decode_host(data: bytes) -> str:
    """Inverse of :func:`encode_host`; IPv6 addresses come back bracketed.
    Cached: a store-node answers every send with its one store host."""
    ip = ipaddress.ip_address(data[:-4])
    port = struct.unpack(">i", data[-4:])[0]
    return f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"


def offset_msg_id(store_host: bytes, physical_offset: int) -> str:
    """RocketMQ's offset message id: hex(store ip + port + physical offset), upper case."""
    return (store_host + physical_offset.to_bytes(8, "big", signed=True)).hex().upper()


def parse_offset_msg_id(msg_id: str) -> tuple[str, int]:
    """Split an offset message id into (store host, physical offset)."""
    raw = bytes.fromhex(msg_id)
    if len(raw) not in (16, 28):
        raise ValueError(f"not an offset message id: {msg_id!r}")
    return decode_host(raw[:-8]), int.from_bytes(raw[-8:], "big", signed=True)


def _client_ip() -> bytes:
    """The 4 IP bytes of a message id, as RocketMQ's MessageClientIDSetter takes
    them from ``UtilAll.getIP()``: this host's IPv4 address, never a loopback
    one. Here the address the host sends from on its way to a non-local
    address (a UDP socket's ``connect`` only looks the route up: no packet, no
    DNS); with no such route (no IPv4 network, or IPv6 only: the id keeps its
    4-byte field), RocketMQ's fake IP, the low 4 bytes of the time in ms."""
    with (
        contextlib.suppress(OSError, ValueError),
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe,
    ):
        probe.connect(("203.0.113.1", 9))  # TEST-NET-3 (RFC 5737): any non-local address
        ip = ipaddress.IPv4Address(probe.getsockname()[0])
        if not (ip.is_loopback or ip.is_unspecified):
            return ip.packed
    return (time.time_ns() // 1_000_000 & 0xFFFFFFFF).to_bytes(4, "big")


#: ip(4) pid(2) random(4): what every id this process makes starts with.
_UNIQ_PREFIX = (
    _client_ip()
    + (os.getpid() & 0xFFFF).to_bytes(2, "big")
    + random.getrandbits(32).to_bytes(4, "big")
)
_UNIQ_COUNTER = itertools.count(random.getrandbits(15))


def new_uniq_key() -> str:
    """A client-side unique message id in the shape of RocketMQ's MessageClientIDSetter.

    16 bytes as 32 upper-case hex digits: ip(4) pid(2) random(4) seconds(4) counter(2);
    the ip is this host's IPv4 address (:func:`_client_ip`).
    """
    tail = ((int(time.time()) & 0xFFFFFFFF) << 16) | (next(_UNIQ_COUNTER) & 0xFFFF)
    return (_UNIQ_PREFIX + tail.to_bytes(6, "big")).hex().upper()


#: Two upper-case hex digits per byte value: a key's counter in two lookups.
_HEX_BYTE = [f"{b:02X}" for b in range(256)]


def new_uniq_keys(count: int) -> list[str]:
    """``count`` keys as :func:`new_uniq_key` makes them, from one clock read and
    the same counter (a batch's keys differ in their last 16 bits): a producer's
    batch takes its keys in a third of the time of one call per key."""
    head = (_UNIQ_PREFIX + (int(time.time()) & 0xFFFFFFFF).to_bytes(4, "big")).hex().upper()
    hex_byte = _HEX_BYTE
    return [
        head + hex_byte[(c >> 8) & 0xFF] + hex_byte[c & 0xFF]
        for c in itertools.islice(_UNIQ_COUNTER, count)
    ]


@dataclass(slots=True)
class Message:
    """A message to store: RocketMQ's ``MessageExtBrokerInner`` before it is written.

    ``tags`` and ``keys`` are written as the TAGS and KEYS properties and take
    precedence over entries of the same name in ``properties``. A
    ``born_timestamp_ms`` of 0 is filled with the store time.
    """

    topic: str
    body: bytes = b""
    queue_id: int = 0
    tags: str | None = None
    keys: Sequence[str] = ()
    properties: dict[str, str] = field(default_factory=dict)
    flag: int = 0
    sys_flag: int = 0
    born_timestamp_ms: int = 0
    born_host: str = "127.0.0.1:0"
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0
    #: RocketMQ's delayTimeLevel: > 0 writes the DELAY property (which then wins
    #: over a DELAY in ``properties``); the store parks the message in
    #: :data:`SCHEDULE_TOPIC` until the level's delay has passed.
    delay_time_level: int = 0
    #: RocketMQ 5's timer: > 0 asks for delivery at this Unix ms (written as the
    #: TIMER_DELIVER_MS property, which it wins over); the store parks the message
    #: in :data:`TIMER_TOPIC` until then (docs/timers.md). 0: no timer.
    deliver_time_ms: int = 0

    def encoded_properties(self) -> bytes:
        """``encode_properties(self.all_properties())``, without the dict copy when the
        message has only a tag and keys (the common case on the send path)."""
        if self.properties or self.delay_time_level > 0 or self.deliver_time_ms > 0:
            return encode_properties(self.all_properties())
        text = f"{PROPERTY_TAGS}\x01{self.tags}\x02" if self.tags else ""
        if self.keys:
            text += f"{PROPERTY_KEYS}\x01{KEY_SEPARATOR.join(self.keys)}\x02"
        return text.encode("utf-8")

    def all_properties(self) -> dict[str, str]:
        """The properties as stored: user properties plus TAGS and KEYS."""
        props = dict(self.properties)
        if self.tags:
            props[PROPERTY_TAGS] = self.tags
        if self.keys:
            props[PROPERTY_KEYS] = KEY_SEPARATOR.join(self.keys)
        if self.delay_time_level > 0:
            props[PROPERTY_DELAY_TIME_LEVEL] = str(self.delay_time_level)
        if self.deliver_time_ms > 0:
            props[PROPERTY_TIMER_DELIVER_MS] = str(self.deliver_time_ms)
        return props


@dataclass(frozen=True, slots=True)
class MessageRecord:
    """A record decoded from the CommitLog: RocketMQ's ``MessageExt``."""

    store_size: int
    body_crc: int
    queue_id: int
    flag: int
    queue_offset: int
    commit_log_offset: int
    sys_flag: int
    born_timestamp_ms: int
    born_host: str
    store_timestamp_ms: int
    store_host: str
    reconsume_times: int
    prepared_transaction_offset: int
    body: bytes
    topic: str
    properties: dict[str, str]

    @property
    def tags(self) -> str | None:
        return self.properties.get(PROPERTY_TAGS)

    @property
    def keys(self) -> list[str]:
        raw = self.properties.get(PROPERTY_KEYS, "")
        return [k for k in raw.split(KEY_SEPARATOR) if k]

    @property
    def uniq_key(self) -> str | None:
        return self.properties.get(PROPERTY_UNIQ_KEY)

    @property
    def msg_id(self) -> str:
        """The offset message id of this record."""
        return offset_msg_id(encode_host(self.store_host), self.commit_log_offset)
