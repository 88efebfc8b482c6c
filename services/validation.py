"""The one table of request limits - names, sizes, durations - both protocols check.

Each limit is a :class:`Rule`: what a request past it is refused, in basalt.v1
terms (a response code, whose gRPC status is basalt.services.errors') and in
RocketMQ 5 v2 terms (a ``Code`` in the answer's Status). The check functions
raise :class:`LimitError` (a ValueError) naming the rule; the v1 servicers
raise its :meth:`~LimitError.refusal`, the v2 front answers its
:attr:`~LimitError.v2_code`. Documented once, here and in
docs/architecture.md#request-limits. Each row: the limit, its bound (RocketMQ's
name for it), then the v1 response code / v2 code a request past it gets::

    topic name              1-127 of [%|a-zA-Z0-9_-] (TopicValidator.TOPIC_MAX_LENGTH)
                            MESSAGE_ILLEGAL / ILLEGAL_TOPIC
    user properties         128 names, 16 KiB of names and values (the v2 proxy's
                            userPropertyMaxNum, maxUserPropertySize)
                            MESSAGE_ILLEGAL / MESSAGE_PROPERTIES_TOO_LARGE
    properties as stored    32,767 bytes: tag, keys, message id, message group and
                            user properties, and the __CRC32# the store adds
                            (PROPLEN is a short) - MESSAGE_ILLEGAL (the store's
                            PROPERTIES_SIZE_EXCEEDED) / MESSAGE_PROPERTIES_TOO_LARGE
    reserved property names __CRC32# (the store's own, which recovery trusts) for
                            both; every MessageConst name for v2 (STRING_HASH_SET)
                            MESSAGE_ILLEGAL / ILLEGAL_MESSAGE_PROPERTY_KEY
    message group           1-64 characters (the v2 proxy's maxMessageGroupSize)
                            - / ILLEGAL_MESSAGE_GROUP
    invisible duration      at most 12 h (the v2 proxy's maxInvisibleTimeMills)
                            INVALID_PARAMETER / ILLEGAL_INVISIBLE_TIME
    a Duration              protobuf's: |seconds| <= 315,576,000,000, |nanos| < 1e9
                            and of seconds' sign - / the field's own code
                            (ILLEGAL_INVISIBLE_TIME, ILLEGAL_POLLING_TIME)
    a Timestamp             protobuf's: 0001-01-01 .. 9999-12-31, nanos 0..999,999,999
                            - / BAD_REQUEST
    username, ACL subject   1-64 ASCII letters, digits, - or _ (an etcd key)
                            INVALID_PARAMETER / -
    secret key              6-1,024 characters - INVALID_PARAMETER / -
                            (both in basalt.services.auth.model, which imports nothing)

A request that does not parse at all is refused by the decoding layer
(basalt.services.decoding), before any of these.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from basalt.common.message import PROPERTY_KEYS, PROPERTY_TAGS, PROPERTY_UNIQ_KEY, Message
from basalt.common.record import CRC32_RESERVED_LEN, MAX_PROPERTIES_SIZE, PROPERTY_CRC32
from basalt.rocketmq.v2 import definition_pb2 as v2
from basalt.services.errors import Refusal
from basalt.services.meta.errors import MetaValidationError
from basalt.services.meta.fields import check_topic_name
from basalt.v1 import common_pb2 as pb


@dataclass(frozen=True, slots=True)
class Rule:
    """One limit: its name and what a request past it is refused, per protocol."""

    name: str
    v1_code: int
    v2_code: int


TOPIC = Rule("topic", pb.RESPONSE_CODE_MESSAGE_ILLEGAL, v2.ILLEGAL_TOPIC)
PROPERTIES = Rule("properties", pb.RESPONSE_CODE_MESSAGE_ILLEGAL, v2.MESSAGE_PROPERTIES_TOO_LARGE)
RESERVED_PROPERTY = Rule(
    "reserved property", pb.RESPONSE_CODE_MESSAGE_ILLEGAL, v2.ILLEGAL_MESSAGE_PROPERTY_KEY
)
MESSAGE_GROUP = Rule("message group", pb.RESPONSE_CODE_MESSAGE_ILLEGAL, v2.ILLEGAL_MESSAGE_GROUP)
INVISIBLE_DURATION = Rule(
    "invisible duration", pb.RESPONSE_CODE_INVALID_PARAMETER, v2.ILLEGAL_INVISIBLE_TIME
)
POLLING_TIME = Rule(
    "long polling time", pb.RESPONSE_CODE_INVALID_PARAMETER, v2.ILLEGAL_POLLING_TIME
)
DURATION = Rule("duration", pb.RESPONSE_CODE_INVALID_PARAMETER, v2.BAD_REQUEST)
TIMESTAMP = Rule("timestamp", pb.RESPONSE_CODE_INVALID_PARAMETER, v2.BAD_REQUEST)

#: RocketMQ 5 proxy's userPropertyMaxNum and maxUserPropertySize.
MAX_USER_PROPERTIES = 128
MAX_USER_PROPERTIES_BYTES = 16 * 1024
#: RocketMQ 5 proxy's maxMessageGroupSize.
MAX_MESSAGE_GROUP_LENGTH = 64
#: RocketMQ 5 proxy's maxInvisibleTimeMills.
MAX_INVISIBLE_MS = 12 * 3600 * 1000
#: google.protobuf.Duration's range, and Timestamp's (0001-01-01 .. 9999-12-31).
MAX_DURATION_SECONDS = 315_576_000_000
MIN_TIMESTAMP_SECONDS = -62_135_596_800
MAX_TIMESTAMP_SECONDS = 253_402_300_799
_NANOS = 1_000_000_000

#: The property the store adds to every record and recovery trusts: never a user's.
STORE_PROPERTIES = frozenset({PROPERTY_CRC32})
#: Property names the server owns (RocketMQ's MessageConst.STRING_HASH_SET): a v2
#: client's user property by one of these names is refused (a v2 message carries
#: tag, keys, id and group as fields of their own).
RESERVED_PROPERTIES = STORE_PROPERTIES | frozenset(
    {
        PROPERTY_TAGS, PROPERTY_KEYS, PROPERTY_UNIQ_KEY, "__SHARDINGKEY", "TRACE_ON", "WAIT",
        "DELAY", "RETRY_TOPIC", "REAL_TOPIC", "REAL_QID", "TRAN_MSG", "PGROUP", "MIN_OFFSET",
        "MAX_OFFSET", "BUYER_ID", "ORIGIN_MESSAGE_ID", "TRANSFER_FLAG", "CORRECTION_FLAG",
        "MQ2_FLAG", "RECONSUME_TIME", "MSG_REGION", "TRAN_PREPARED_QUEUE_OFFSET",
        "TRANSACTION_CHECK_TIMES", "CHECK_IMMUNITY_TIME_IN_SECONDS", "MAX_RECONSUME_TIMES",
        "CONSUME_START_TIME", "POP_CK", "POP_CK_OFFSET", "1ST_POP_TIME", "TIMER_DELIVER_MS",
        "TIMER_DELAY_SEC", "TIMER_DELAY_MS", "TIMER_OUT_MS", "TIMER_ENQUEUE_MS",
        "TIMER_DEQUEUE_MS", "TIMER_ROLL_TIMES", "TIMER_DEL_UNIQKEY", "INNER_NUM",
        "INNER_MULTI_DISPATCH", "INNER_MULTI_QUEUE_OFFSET", "CLUSTER", "BORNHOST",
        "__STARTDELIVERTIME", "__RECALL_HANDLE",
    }
)  # fmt: skip


class LimitError(ValueError):
    """A request past one of the module's limits: ``rule`` says which."""

    def __init__(self, rule: Rule, message: str) -> None:
        super().__init__(message)
        self.rule = rule
        self.message = message

    @property
    def v2_code(self) -> int:
        return self.rule.v2_code

    def refusal(self) -> Refusal:
        """The basalt.v1 refusal: the rule's response code, this message."""
        return Refusal(self.rule.v1_code, self.message)


def _shown(text: str) -> str:
    return repr(text[:60]) + ("..." if len(text) > 60 else "")


def check_topic(topic: str) -> None:
    """LimitError TOPIC unless ``topic`` is a topic name."""
    try:
        check_topic_name(topic)
    except MetaValidationError as e:
        raise LimitError(TOPIC, str(e)) from None


def check_property_names(properties: Mapping[str, str], reserved: frozenset[str]) -> None:
    """LimitError RESERVED_PROPERTY for a name in ``reserved`` (a basalt.v1
    send: STORE_PROPERTIES; its other limit is the stored size, which the
    store checks)."""
    for name in properties.keys() & reserved:
        raise LimitError(RESERVED_PROPERTY, f"property name {_shown(name)} is reserved")


def check_user_properties(properties: Mapping[str, str], reserved: frozenset[str]) -> None:
    """A v2 message's user properties: LimitError RESERVED_PROPERTY for a name
    in ``reserved`` (or empty), PROPERTIES for more than MAX_USER_PROPERTIES or
    MAX_USER_PROPERTIES_BYTES."""
    if len(properties) > MAX_USER_PROPERTIES:
        raise LimitError(
            PROPERTIES, f"{len(properties)} user properties: at most {MAX_USER_PROPERTIES}"
        )
    size = 0
    for name, value in properties.items():
        if not name or name in reserved:
            raise LimitError(RESERVED_PROPERTY, f"property name {_shown(name)} is reserved")
        size += len(name.encode()) + len(value.encode())
    if size > MAX_USER_PROPERTIES_BYTES:
        raise LimitError(
            PROPERTIES, f"user properties of {size} bytes: at most {MAX_USER_PROPERTIES_BYTES}"
        )


def check_stored_properties(message: Message) -> None:
    """LimitError PROPERTIES when ``message``'s properties as stored (tag, keys,
    user and system properties, and the store's __CRC32#) pass the record's
    16-bit PROPLEN."""
    size = len(message.encoded_properties()) + CRC32_RESERVED_LEN
    if size > MAX_PROPERTIES_SIZE:
        raise LimitError(
            PROPERTIES,
            f"properties (tag, keys, message id, group, user properties) of {size} bytes "
            f"as stored: at most {MAX_PROPERTIES_SIZE}",
        )


def check_message_group(group: str) -> None:
    """LimitError MESSAGE_GROUP for an empty or too long message group."""
    if not group or len(group) > MAX_MESSAGE_GROUP_LENGTH:
        raise LimitError(
            MESSAGE_GROUP,
            f"message group {_shown(group)} is not 1-{MAX_MESSAGE_GROUP_LENGTH} characters",
        )


def check_invisible_ms(ms: int, field: str, *, minimum_ms: int) -> int:
    """``ms`` when within ``minimum_ms`` .. MAX_INVISIBLE_MS; else LimitError
    INVISIBLE_DURATION naming ``field``."""
    if not minimum_ms <= ms <= MAX_INVISIBLE_MS:
        why = "is negative" if ms < 0 else f"is not within {minimum_ms} .. {MAX_INVISIBLE_MS}"
        raise LimitError(INVISIBLE_DURATION, f"{field} {ms} ms {why} (at most 12 h)")
    return ms


def duration_ms(duration: Duration, field: str, rule: Rule = DURATION) -> int:
    """A Duration in milliseconds (negative for a negative one); LimitError
    ``rule`` when it is not a valid Duration (out of range, nanos of the other
    sign than seconds)."""
    seconds, nanos = duration.seconds, duration.nanos
    if (
        abs(seconds) > MAX_DURATION_SECONDS
        or abs(nanos) >= _NANOS
        or (seconds > 0 and nanos < 0)
        or (seconds < 0 and nanos > 0)
    ):
        raise LimitError(rule, f"{field} is not a valid Duration ({seconds} s, {nanos} ns)")
    return seconds * 1000 + int(nanos / 1_000_000)


def timestamp_ms(timestamp: Timestamp, field: str) -> int:
    """A Timestamp in Unix milliseconds; LimitError TIMESTAMP outside
    0001-01-01 .. 9999-12-31 or with nanos outside 0 .. 999,999,999."""
    seconds, nanos = timestamp.seconds, timestamp.nanos
    if not MIN_TIMESTAMP_SECONDS <= seconds <= MAX_TIMESTAMP_SECONDS or not 0 <= nanos < _NANOS:
        raise LimitError(TIMESTAMP, f"{field} is not a valid Timestamp ({seconds} s, {nanos} ns)")
    return seconds * 1000 + nanos // 1_000_000
