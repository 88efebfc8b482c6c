"""Pure conversions between RocketMQ 5's v2 messages and Basalt's (no I/O).

* **Queues.** As RocketMQ 5's proxy answers a route: each of the topic's
  brokers (store-nodes) lists its own ``n = max(read_queue_nums,
  write_queue_nums)`` queues, ids ``0 .. n - 1``, each ``MessageQueue``
  carrying its ``Broker`` (name, id 0: Basalt has no slaves). A queue is the
  pair (broker, id): :func:`queue_of` maps a request's ``MessageQueue`` back.
  The official clients need every broker to have a queue 0 (the Node.js
  SimpleConsumer 1.0.8 reads only through queues whose id is 0, mistaking the
  queue id for the broker id).
* **Messages.** :func:`to_message` turns a v2 ``Message`` into a
  :class:`basalt.common.message.Message`: tag, keys and user properties as
  Basalt stores them, the client's ``message_id`` as the UNIQ_KEY, the FIFO
  ``message_group`` as RocketMQ's ``__SHARDINGKEY`` property, a GZIP body
  decoded. What Basalt cannot take is a :class:`V2Error` with its v2 code.
* **Deliveries.** :func:`to_v2_message` turns a popped record into the v2
  ``Message`` a consumer reads: every system property the official clients
  read, the body digest as MD5 (the one digest the Python and Node.js clients
  agree on: their CRC32 strings differ, hex and decimal), user properties
  without the server's own names. The copy written to ``%DLQ%<group>`` is
  :func:`basalt.common.message.dead_letter`, shared with the SDK's retries.
* **Codes.** :func:`code_of_response` maps Basalt's (RocketMQ 4) response
  codes to v2 codes; :data:`CODE_OF_SEND_STATUS` a stored send's flush and
  replication outcomes.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import ipaddress
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from basalt.common.message import (
    NAME_VALUE_SEPARATOR,
    PROPERTY_CRC32,
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_SEPARATOR,
    PROPERTY_TIMER_DELAY_SEC,
    PROPERTY_TIMER_DELIVER_MS,
    PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_UNIQ_KEY,
    Message,
    MessageRecord,
)
from basalt.rocketmq.v2 import definition_pb2 as v2
from basalt.services.meta.model import TopicConfig
from basalt.services.validation import (
    RESERVED_PROPERTIES,
    LimitError,
    check_message_group,
    check_stored_properties,
    check_topic,
    check_user_properties,
    timestamp_ms,
)
from basalt.v1 import common_pb2 as pb

#: RocketMQ's message group property (MessageConst.PROPERTY_SHARDING_KEY); a
#: user property by this name, or by any of RESERVED_PROPERTIES, is refused
#: ILLEGAL_MESSAGE_PROPERTY_KEY (basalt.services.validation).
PROPERTY_SHARDING_KEY = "__SHARDINGKEY"
#: RocketMQ's MessageConst name of a half message's check immunity, which the
#: front stamps with TRAN_MSG and PGROUP (basalt.common.message's).
PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS = "CHECK_IMMUNITY_TIME_IN_SECONDS"

#: A stored send's SendStatus -> the v2 code of its entry (RocketMQ's proxy:
#: a flush or replication timeout is reported, the message is stored).
CODE_OF_SEND_STATUS: dict[int, int] = {
    pb.SEND_STATUS_SEND_OK: v2.OK,
    pb.SEND_STATUS_FLUSH_DISK_TIMEOUT: v2.MASTER_PERSISTENCE_TIMEOUT,
    pb.SEND_STATUS_FLUSH_SLAVE_TIMEOUT: v2.SLAVE_PERSISTENCE_TIMEOUT,
    pb.SEND_STATUS_SLAVE_NOT_AVAILABLE: v2.HA_NOT_AVAILABLE,
}

#: Basalt's response codes (RocketMQ 4's numbers) -> v2 codes; any other code
#: is INTERNAL_ERROR.
_CODE_OF_RESPONSE: dict[int, int] = {
    pb.RESPONSE_CODE_SUCCESS: v2.OK,
    pb.RESPONSE_CODE_TOPIC_NOT_EXIST: v2.TOPIC_NOT_FOUND,
    pb.RESPONSE_CODE_MESSAGE_ILLEGAL: v2.BAD_REQUEST,
    pb.RESPONSE_CODE_INVALID_PARAMETER: v2.BAD_REQUEST,
    pb.RESPONSE_CODE_NO_PERMISSION: v2.FORBIDDEN,
    pb.RESPONSE_CODE_SYSTEM_BUSY: v2.TOO_MANY_REQUESTS,
    pb.RESPONSE_CODE_SERVICE_NOT_AVAILABLE: v2.INTERNAL_SERVER_ERROR,
    pb.RESPONSE_CODE_FLUSH_DISK_TIMEOUT: v2.MASTER_PERSISTENCE_TIMEOUT,
    pb.RESPONSE_CODE_FLUSH_SLAVE_TIMEOUT: v2.SLAVE_PERSISTENCE_TIMEOUT,
    pb.RESPONSE_CODE_SLAVE_NOT_AVAILABLE: v2.HA_NOT_AVAILABLE,
    # A broker group failing over (docs/replication.md): RocketMQ's proxy answers
    # HA_NOT_AVAILABLE for its IN_SYNC_REPLICAS_NOT_ENOUGH; the clients retry.
    pb.RESPONSE_CODE_NOT_MASTER: v2.HA_NOT_AVAILABLE,
    pb.RESPONSE_CODE_IN_SYNC_REPLICAS_NOT_ENOUGH: v2.HA_NOT_AVAILABLE,
    pb.RESPONSE_CODE_SUBSCRIPTION_PARSE_FAILED: v2.ILLEGAL_FILTER_EXPRESSION,
    pb.RESPONSE_CODE_SUBSCRIPTION_GROUP_NOT_EXIST: v2.CONSUMER_GROUP_NOT_FOUND,
    pb.RESPONSE_CODE_QUERY_NOT_FOUND: v2.MESSAGE_NOT_FOUND,
}

#: What every queue accepts: Basalt topics have no message type attribute
#: (RocketMQ 5's ``message.type``), and the official clients refuse to send a
#: type a queue does not list.
ACCEPTED_MESSAGE_TYPES = (v2.NORMAL, v2.FIFO, v2.DELAY, v2.TRANSACTION)

#: PermName bits (RocketMQ's PermName.PERM_READ / PERM_WRITE).
_PERM_READ, _PERM_WRITE = 4, 2


class V2Error(Exception):
    """A request refused with a v2 ``code`` (answered as the response's Status,
    never as a gRPC error: v2 clients read the Status)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def status(self) -> v2.Status:
        return v2.Status(code=v2.Code.ValueType(self.code), message=self.message)


def group_name(group: v2.Resource) -> str:
    """A request's consumer group; V2Error ILLEGAL_CONSUMER_GROUP when it names none."""
    if not group.name:
        raise V2Error(v2.ILLEGAL_CONSUMER_GROUP, "no consumer group")
    return group.name


def entries_status(entries: Sequence[Any]) -> v2.Status:
    """The status of a response of ``entries`` (each with a ``status``): theirs
    when they all agree, MULTIPLE_RESULTS when they differ (RocketMQ 5's proxy)."""
    if len({e.status.code for e in entries}) == 1:
        return entries[0].status  # type: ignore[no-any-return]
    return v2.Status(code=v2.MULTIPLE_RESULTS, message="entries differ")


def ok_status() -> v2.Status:
    return v2.Status(code=v2.OK, message="OK")


def code_of_response(code: int) -> int:
    """The v2 code of a Basalt response code (INTERNAL_ERROR for one not listed)."""
    return _CODE_OF_RESPONSE.get(code, v2.INTERNAL_ERROR)


# -- queues ------------------------------------------------------------------------------


def queues_per_broker(config: TopicConfig) -> int:
    return max(config.read_queue_nums, config.write_queue_nums)


def _permission(config: TopicConfig, broker_perm: int, queue_id: int) -> int:
    perm = int(config.perm) & broker_perm
    readable = bool(perm & _PERM_READ) and queue_id < config.read_queue_nums
    writable = bool(perm & _PERM_WRITE) and queue_id < config.write_queue_nums
    if readable and writable:
        return v2.READ_WRITE
    if readable:
        return v2.READ
    return v2.WRITE if writable else v2.NONE


def message_queues(
    config: TopicConfig,
    broker_perms: dict[str, int],
    *,
    namespace: str,
    endpoints: v2.Endpoints,
    own: Mapping[str, v2.Endpoints] | None = None,
) -> list[v2.MessageQueue]:
    """The topic's queues on its registered brokers (``broker_perms``: name ->
    PermName bits; a broker not in it is down and left out), in config order,
    each broker's numbered ``0 .. n - 1`` (module docstring), each reachable at
    the broker's own front where ``own`` names one (RocketMQ 5's local proxy
    mode), else at ``endpoints`` (the access point the client called, which
    serves every queue)."""
    n = queues_per_broker(config)
    topic = v2.Resource(resource_namespace=namespace, name=config.topic_name)
    out = []
    for name in config.brokers:
        if name not in broker_perms:
            continue
        at = endpoints if own is None else own.get(name, endpoints)
        broker = v2.Broker(name=name, id=0, endpoints=at)
        for q in range(n):
            out.append(
                v2.MessageQueue(
                    topic=topic,
                    id=q,
                    permission=v2.Permission.ValueType(_permission(config, broker_perms[name], q)),
                    broker=broker,
                    accept_message_types=ACCEPTED_MESSAGE_TYPES,
                )
            )
    return out


def endpoints_of(address: str) -> v2.Endpoints:
    """``host:port`` as v2 Endpoints, the scheme from the host (an IPv4 or IPv6
    literal, else a domain name)."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    try:
        scheme = v2.IPv6 if ipaddress.ip_address(host).version == 6 else v2.IPv4
    except ValueError:
        scheme = v2.DOMAIN_NAME
    return v2.Endpoints(scheme=scheme, addresses=[v2.Address(host=host, port=int(port))])


@dataclass(frozen=True, slots=True)
class StoreQueue:
    """One queue of a topic: a broker and its own (broker-local) queue id."""

    broker_name: str
    queue_id: int


def queue_of(config: TopicConfig, mq: v2.MessageQueue) -> StoreQueue | None:
    """The topic's queue a request's ``mq`` names (inverse of
    :func:`message_queues`): its broker's queue ``mq.id``. A ``mq`` naming no
    broker (a raw call; the official clients always name one) means the
    topic's first broker in config order. None for a broker the topic is not
    on or an id outside ``0 .. n - 1``."""
    broker = mq.broker.name or (config.brokers[0] if config.brokers else "")
    if broker not in config.brokers or not 0 <= mq.id < queues_per_broker(config):
        return None
    return StoreQueue(broker, mq.id)


def readable_brokers(config: TopicConfig, broker_perms: dict[str, int]) -> list[str]:
    """The topic's brokers, in config order, whose queues can be read: the
    topic's perm and the broker's (``broker_perms``: name -> PermName bits of
    the registered ones; a broker not in it is down) both allow reads."""
    if not int(config.perm) & _PERM_READ:
        return []
    return [n for n in config.brokers if broker_perms.get(n, 0) & _PERM_READ]


def writable_queues(config: TopicConfig, live: Sequence[str]) -> list[StoreQueue]:
    """The topic's writable queues on the brokers in ``live``, broker by broker
    in config order."""
    if not int(config.perm) & _PERM_WRITE:
        return []
    return [
        StoreQueue(name, q)
        for name in config.brokers
        if name in live
        for q in range(config.write_queue_nums)
    ]


def asked_queue(queue_id: int, turn: int, writable: Sequence[StoreQueue]) -> StoreQueue:
    """Where a send naming ``queue_id`` goes (a v2 SendMessage names a queue id
    but no broker): the ``turn``-th of the writable brokers round robin, and
    there its queue ``queue_id`` modulo that broker's writable queue count.
    ``writable`` is :func:`writable_queues`' answer, not empty."""
    brokers = list(dict.fromkeys(q.broker_name for q in writable))
    broker = brokers[turn % len(brokers)]
    count = sum(1 for q in writable if q.broker_name == broker)
    return StoreQueue(broker, queue_id % count)


def fifo_queue(group: str, queues: Sequence[StoreQueue]) -> StoreQueue:
    """The fixed queue of a FIFO message group (a stable hash: the same group
    goes to the same queue while the topic's writable queues stay the same)."""
    return queues[zlib.crc32(group.encode("utf-8")) % len(queues)]


# -- messages ----------------------------------------------------------------------------


def _check_name_value(text: str, what: str, code: int) -> None:
    if NAME_VALUE_SEPARATOR in text or PROPERTY_SEPARATOR in text:
        raise V2Error(code, f"{what} {text[:60]!r} holds a reserved separator character")


def body_of(message: v2.Message, max_body_size: int) -> bytes:
    """The message's body as stored: a GZIP body decoded (V2Error
    MESSAGE_CORRUPTED when it does not decode); V2Error MESSAGE_BODY_TOO_LARGE
    past ``max_body_size`` bytes, before or after decoding."""
    body = message.body
    if len(body) > max_body_size:
        raise V2Error(v2.MESSAGE_BODY_TOO_LARGE, f"body of {len(body)} bytes > max {max_body_size}")
    encoding = message.system_properties.body_encoding
    if encoding == v2.GZIP:
        try:
            # Read one byte past the limit: a zip bomb stops there.
            with gzip.GzipFile(fileobj=io.BytesIO(body), mode="rb") as f:
                body = f.read(max_body_size + 1)
        except (OSError, EOFError, zlib.error) as e:
            raise V2Error(v2.MESSAGE_CORRUPTED, f"GZIP body does not decode: {e}") from None
        if len(body) > max_body_size:
            raise V2Error(v2.MESSAGE_BODY_TOO_LARGE, f"decoded body > max {max_body_size} bytes")
    elif encoding not in (v2.IDENTITY, v2.ENCODING_UNSPECIFIED):
        raise V2Error(v2.UNSUPPORTED, f"body encoding {v2.Encoding.Name(encoding)} unsupported")
    return body


def deliver_time_ms(message: v2.Message) -> int:
    """The Unix ms a DELAY message is due (its ``delivery_timestamp``), 0 for
    any other; V2Error ILLEGAL_DELIVERY_TIME for a DELAY message without one or
    one that is not a valid Timestamp, MESSAGE_PROPERTY_CONFLICT_WITH_TYPE for a
    ``delivery_timestamp`` on a FIFO or TRANSACTION message (RocketMQ 5's
    clients refuse both combinations before sending). The store-node checks
    the maximum delay (its ``timer_max_delay_sec``)."""
    system = message.system_properties
    kind = system.message_type
    if not system.HasField("delivery_timestamp"):
        if kind == v2.DELAY:
            raise V2Error(v2.ILLEGAL_DELIVERY_TIME, "a DELAY message without a delivery_timestamp")
        return 0
    if kind == v2.TRANSACTION or system.HasField("message_group"):
        raise V2Error(
            v2.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
            "a delivery_timestamp on a transactional or FIFO message",
        )
    try:
        due = timestamp_ms(system.delivery_timestamp, "delivery_timestamp")
    except LimitError as e:
        raise V2Error(v2.ILLEGAL_DELIVERY_TIME, e.message) from None
    # 0 is the wire's "no timer": a time at or before the epoch is due already.
    return max(due, 1)


def _transaction_properties(message: v2.Message) -> dict[str, str]:
    """What makes a send a half message (RocketMQ 5's proxy stamps the same):
    TRAN_MSG, PGROUP = the topic (the v2 protocol has no producer group: the
    proxy registers each publishing client under each of its topics, and
    checks go to that group), and the recovery duration the client asked for.
    MESSAGE_PROPERTY_CONFLICT_WITH_TYPE for a transactional FIFO message."""
    system = message.system_properties
    if system.HasField("message_group"):
        raise V2Error(
            v2.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, "a transactional message with a message_group"
        )
    stamped = {PROPERTY_TRANSACTION_PREPARED: "true", PROPERTY_PRODUCER_GROUP: message.topic.name}
    if system.HasField("orphaned_transaction_recovery_duration"):
        seconds = system.orphaned_transaction_recovery_duration.seconds
        if seconds > 0:
            stamped[PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS] = str(seconds)
    return stamped


def to_message(message: v2.Message, max_body_size: int) -> Message:
    """The Basalt message of a v2 one (module docstring), or V2Error:
    ILLEGAL_TOPIC / ILLEGAL_MESSAGE_ID without a topic or message id or for a
    topic name past its limit, ILLEGAL_MESSAGE_PROPERTY_KEY for a reserved or
    unencodable property name, ILLEGAL_MESSAGE_TAG / ILLEGAL_MESSAGE_KEY /
    ILLEGAL_MESSAGE_GROUP for values the record format cannot hold,
    MESSAGE_PROPERTIES_TOO_LARGE past the properties' limits
    (basalt.services.validation's table), :func:`body_of`'s, and
    MESSAGE_PROPERTY_CONFLICT_WITH_TYPE for a transactional FIFO message. A
    TRANSACTION message gets the half message's properties
    (:func:`_transaction_properties`); a DELAY message's time is
    :func:`deliver_time_ms`'s."""
    try:
        return _to_message(message, max_body_size)
    except LimitError as e:
        raise V2Error(e.v2_code, e.message) from None


def _to_message(message: v2.Message, max_body_size: int) -> Message:
    system = message.system_properties
    if not message.topic.name:
        raise V2Error(v2.ILLEGAL_TOPIC, "message without a topic")
    check_topic(message.topic.name)
    if not system.message_id:
        raise V2Error(v2.ILLEGAL_MESSAGE_ID, "message without a message_id")
    _check_name_value(system.message_id, "message id", v2.ILLEGAL_MESSAGE_ID)
    properties = dict(message.user_properties)
    check_user_properties(properties, RESERVED_PROPERTIES)
    if system.message_type == v2.TRANSACTION:
        properties.update(_transaction_properties(message))
    for name, value in properties.items():
        _check_name_value(name, "property name", v2.ILLEGAL_MESSAGE_PROPERTY_KEY)
        _check_name_value(value, "property value", v2.ILLEGAL_MESSAGE_PROPERTY_KEY)
    tag = system.tag if system.HasField("tag") else None
    if tag is not None:
        _check_name_value(tag, "tag", v2.ILLEGAL_MESSAGE_TAG)
    for key in system.keys:
        _check_name_value(key, "key", v2.ILLEGAL_MESSAGE_KEY)
        if " " in key:  # Basalt's KEYS property is space separated
            raise V2Error(v2.ILLEGAL_MESSAGE_KEY, f"key {key[:60]!r} holds a space")
    if system.HasField("message_group"):
        _check_name_value(system.message_group, "message group", v2.ILLEGAL_MESSAGE_GROUP)
        check_message_group(system.message_group)
        properties[PROPERTY_SHARDING_KEY] = system.message_group
    properties[PROPERTY_UNIQ_KEY] = system.message_id
    born_ms = (
        timestamp_ms(system.born_timestamp, "born_timestamp")
        if system.HasField("born_timestamp")
        else 0
    )
    converted = Message(
        topic=message.topic.name,
        body=body_of(message, max_body_size),
        tags=tag or None,
        keys=list(system.keys),
        properties=properties,
        born_timestamp_ms=max(0, born_ms),
    )
    check_stored_properties(converted)
    return converted


# -- deliveries --------------------------------------------------------------------------

#: Stored properties that are system properties of a v2 message (or the
#: store's own), never shown as user properties.
_HIDDEN_PROPERTIES = RESERVED_PROPERTIES | {PROPERTY_CRC32}


def _timestamp(ms: int) -> Timestamp:
    t = Timestamp()
    t.FromMilliseconds(ms)
    return t


def duration_ms(ms: int) -> Duration:
    d = Duration()
    d.FromMilliseconds(ms)
    return d


def message_type(properties: dict[str, str]) -> v2.MessageType.ValueType:
    """A stored message's v2 type, as RocketMQ 5's proxy reads it: TRANSACTION
    for a half message, DELAY with a delay level or timer, FIFO with a message
    group, else NORMAL."""
    if properties.get(PROPERTY_TRANSACTION_PREPARED) == "true":
        return v2.TRANSACTION
    if (
        PROPERTY_DELAY_TIME_LEVEL in properties
        or PROPERTY_TIMER_DELIVER_MS in properties
        or PROPERTY_TIMER_DELAY_SEC in properties
    ):
        return v2.DELAY
    return v2.FIFO if properties.get(PROPERTY_SHARDING_KEY) else v2.NORMAL


def to_v2_message(
    record: MessageRecord,
    *,
    namespace: str,
    queue_id: int,
    delivery_attempt: int,
    receipt_handle: str,
    invisible_ms: int,
) -> v2.Message:
    """The v2 message of one popped ``record`` (module docstring): the UNIQ_KEY
    as ``message_id`` (the offset message id when a non-RocketMQ-5 producer
    stored none), its :func:`message_type` (a timer's ``delivery_timestamp``
    from TIMER_DELIVER_MS), the given delivery's attempt, handle and invisible
    duration, ``queue_id`` the broker-local queue id (:func:`message_queues`'
    numbering)."""
    message = _v2_message(record, record.topic, namespace, queue_id)
    system = message.system_properties
    system.receipt_handle = receipt_handle
    system.invisible_duration.CopyFrom(duration_ms(invisible_ms))
    system.delivery_attempt = delivery_attempt
    return message


def _v2_message(record: MessageRecord, topic: str, namespace: str, queue_id: int) -> v2.Message:
    properties = record.properties
    group = properties.get(PROPERTY_SHARDING_KEY)
    system = v2.SystemProperties(
        keys=record.keys,
        message_id=record.uniq_key or record.msg_id,
        body_digest=v2.Digest(type=v2.MD5, checksum=hashlib.md5(record.body).hexdigest().upper()),
        body_encoding=v2.IDENTITY,
        message_type=message_type(properties),
        born_timestamp=_timestamp(record.born_timestamp_ms),
        born_host=record.born_host,
        store_timestamp=_timestamp(record.store_timestamp_ms),
        store_host=record.store_host,
        queue_id=queue_id,
        queue_offset=record.queue_offset,
    )
    if record.tags is not None:
        system.tag = record.tags
    if group:
        system.message_group = group
    due = properties.get(PROPERTY_TIMER_DELIVER_MS, "")
    if due.isdigit():
        system.delivery_timestamp.CopyFrom(_timestamp(int(due)))
    return v2.Message(
        topic=v2.Resource(resource_namespace=namespace, name=topic),
        user_properties={k: v for k, v in properties.items() if k not in _HIDDEN_PROPERTIES},
        system_properties=system,
        body=record.body,
    )


def checked_half(record: MessageRecord, namespace: str) -> v2.Message:
    """The v2 message of a half message a store-node asks the producers to
    decide (``TransactionCheck.record``), as RocketMQ's broker hands it to its
    check listener: its real topic and queue (REAL_TOPIC, REAL_QID), type
    TRANSACTION, no delivery state. ValueError when it has no REAL_TOPIC."""
    topic = record.properties.get(PROPERTY_REAL_TOPIC)
    if not topic:
        raise ValueError(f"half message {record.msg_id} has no {PROPERTY_REAL_TOPIC}")
    raw_queue = record.properties.get(PROPERTY_REAL_QUEUE_ID, "")
    queue_id = int(raw_queue) if raw_queue.isdigit() else record.queue_id
    message = _v2_message(record, topic, namespace, queue_id)
    message.system_properties.message_type = v2.TRANSACTION
    return message


def to_wire(message: Message, deliver_ms: int) -> pb.Message:
    """``message`` (:func:`to_message`'s) as a store-node's ``Message``, for the
    sends that go one by one (a timer, ``deliver_ms`` > 0; a half message): the
    store-node refuses a batch of records carrying either."""
    return pb.Message(
        topic=message.topic,
        tags=message.tags or "",
        keys=list(message.keys),
        properties=message.properties,
        body=message.body,
        born_timestamp_ms=message.born_timestamp_ms,
        deliver_time_ms=deliver_ms,
    )
