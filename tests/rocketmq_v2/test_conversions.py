"""basalt.services.rocketmq_v2.conversions: queue numbering, messages, codes."""

from __future__ import annotations

import gzip
import hashlib

import pytest

from basalt.common.message import Message, MessageRecord, dead_letter, encode_host
from basalt.common.record import decode_record, encode_batch
from basalt.rocketmq.v2 import definition_pb2 as v2
from basalt.services.meta.model import Perm, TopicConfig
from basalt.services.rocketmq_v2.conversions import (
    ACCEPTED_MESSAGE_TYPES,
    PROPERTY_SHARDING_KEY,
    StoreQueue,
    V2Error,
    asked_queue,
    code_of_response,
    fifo_queue,
    group_name,
    message_queues,
    queue_of,
    readable_brokers,
    to_message,
    to_v2_message,
    writable_queues,
)
from basalt.v1 import common_pb2 as pb

CONFIG = TopicConfig(
    topic_name="T", read_queue_nums=4, write_queue_nums=2, brokers=("broker-a", "broker-b")
)
ENDPOINTS = v2.Endpoints(addresses=[v2.Address(host="127.0.0.1", port=8081)])


def _mq(broker: str, queue_id: int) -> v2.MessageQueue:
    return v2.MessageQueue(topic=v2.Resource(name="T"), id=queue_id, broker=v2.Broker(name=broker))


def test_each_broker_numbers_its_queues_from_0_and_they_map_back() -> None:
    queues = message_queues(
        CONFIG, {"broker-a": 6, "broker-b": 6}, namespace="", endpoints=ENDPOINTS
    )
    # RocketMQ 5's route: every broker has its own queues 0..n-1 (the Node.js
    # SimpleConsumer reads only through queues numbered 0).
    assert [(q.broker.name, q.id) for q in queues] == [
        (b, i) for b in ("broker-a", "broker-b") for i in range(4)
    ]
    assert {q.broker.id for q in queues} == {0}
    # The official clients refuse to send a type the queue does not list.
    assert {tuple(q.accept_message_types) for q in queues} == {ACCEPTED_MESSAGE_TYPES}
    assert set(ACCEPTED_MESSAGE_TYPES) == {v2.NORMAL, v2.FIFO, v2.DELAY, v2.TRANSACTION}
    assert [q.permission for q in queues[:4]] == [v2.READ_WRITE, v2.READ_WRITE, v2.READ, v2.READ]
    assert queues[4:] == [
        v2.MessageQueue(
            topic=q.topic, id=q.id, permission=q.permission,
            accept_message_types=q.accept_message_types,
            broker=v2.Broker(name="broker-b", id=0, endpoints=ENDPOINTS),
        )
        for q in queues[:4]
    ]  # fmt: skip
    assert all(q.endpoints == ENDPOINTS for q in (q.broker for q in queues))
    for q in queues:
        assert queue_of(CONFIG, q) == StoreQueue(q.broker.name, q.id)


def test_queue_of_refuses_what_the_topic_does_not_have() -> None:
    assert queue_of(CONFIG, _mq("broker-a", 4)) is None
    assert queue_of(CONFIG, _mq("broker-b", -1)) is None
    assert queue_of(CONFIG, _mq("broker-c", 0)) is None
    # A raw call naming no broker means the topic's first.
    assert queue_of(CONFIG, _mq("", 3)) == StoreQueue("broker-a", 3)


def test_a_down_broker_is_left_out_and_perm_is_respected() -> None:
    queues = message_queues(CONFIG, {"broker-b": 4}, namespace="ns", endpoints=ENDPOINTS)
    assert [(q.broker.name, q.id) for q in queues] == [("broker-b", i) for i in range(4)]
    assert {q.permission for q in queues} == {v2.READ}
    assert queues[0].topic.resource_namespace == "ns"


def test_an_asked_queue_id_goes_round_robin_over_brokers_modulo_their_count() -> None:
    writable = writable_queues(CONFIG, ["broker-a", "broker-b"])
    assert [asked_queue(1, turn, writable) for turn in range(3)] == [
        StoreQueue("broker-a", 1), StoreQueue("broker-b", 1), StoreQueue("broker-a", 1),
    ]  # fmt: skip
    # Queue 3 is read-only (2 write queues): modulo, it is queue 1.
    assert asked_queue(3, 0, writable) == StoreQueue("broker-a", 1)
    assert asked_queue(1, 5, writable_queues(CONFIG, ["broker-b"])) == StoreQueue("broker-b", 1)


def test_fifo_group_hashes_to_a_fixed_writable_queue() -> None:
    writable = writable_queues(CONFIG, ["broker-a", "broker-b"])
    assert len(writable) == 4
    assert {fifo_queue("g1", writable) for _ in range(5)} == {fifo_queue("g1", writable)}


def _message(**system: object) -> v2.Message:
    body = system.pop("body", b"hello")
    props = system.pop("props", {"a": "1"})
    return v2.Message(
        topic=v2.Resource(name="T"),
        user_properties=props,
        system_properties=v2.SystemProperties(message_id="01ABC", **system),  # type: ignore[arg-type]
        body=body,  # type: ignore[arg-type]
    )


def test_to_message_keeps_tag_keys_properties_and_id() -> None:
    m = to_message(_message(tag="TagA", keys=["k1", "k2"], message_group="g"), 1024)
    assert (m.topic, m.body, m.tags, list(m.keys)) == ("T", b"hello", "TagA", ["k1", "k2"])
    assert m.properties == {"a": "1", "UNIQ_KEY": "01ABC", PROPERTY_SHARDING_KEY: "g"}


def test_gzip_body_is_decoded() -> None:
    m = to_message(_message(body=gzip.compress(b"x" * 100), body_encoding=v2.GZIP), 1024)
    assert m.body == b"x" * 100


@pytest.mark.parametrize(
    ("message", "code"),
    [
        (_message(props={"UNIQ_KEY": "x"}), v2.ILLEGAL_MESSAGE_PROPERTY_KEY),
        (_message(props={"a\x01": "x"}), v2.ILLEGAL_MESSAGE_PROPERTY_KEY),
        (_message(body=b"x" * 1025), v2.MESSAGE_BODY_TOO_LARGE),
        (
            _message(body=gzip.compress(b"x" * 2000), body_encoding=v2.GZIP),
            v2.MESSAGE_BODY_TOO_LARGE,
        ),
        (_message(body=b"not gzip", body_encoding=v2.GZIP), v2.MESSAGE_CORRUPTED),
        (
            _message(message_type=v2.TRANSACTION, message_group="g"),
            v2.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
        ),
        (_message(keys=["a b"]), v2.ILLEGAL_MESSAGE_KEY),
        (v2.Message(topic=v2.Resource(name="T")), v2.ILLEGAL_MESSAGE_ID),
        (v2.Message(), v2.ILLEGAL_TOPIC),
    ],
)
def test_refusals(message: v2.Message, code: int) -> None:
    with pytest.raises(V2Error) as e:
        to_message(message, 1024)
    assert e.value.code == code
    assert e.value.status().code == code


def test_response_codes() -> None:
    assert code_of_response(pb.RESPONSE_CODE_TOPIC_NOT_EXIST) == v2.TOPIC_NOT_FOUND
    assert code_of_response(pb.RESPONSE_CODE_FLUSH_DISK_TIMEOUT) == v2.MASTER_PERSISTENCE_TIMEOUT
    assert code_of_response(pb.RESPONSE_CODE_SYSTEM_BUSY) == v2.TOO_MANY_REQUESTS
    assert code_of_response(12345) == v2.INTERNAL_ERROR


def _stored(message: Message, uniq: str = "01UNIQ") -> MessageRecord:
    """``message`` as the store would hand it back (offsets 0)."""
    records = encode_batch(
        [message], [uniq], queue_id=1, store_host=encode_host("127.0.0.1:8080"),
        born_timestamp_ms=1_700_000_000_000,
    )  # fmt: skip
    return decode_record(records)


def test_to_v2_message_carries_every_system_property() -> None:
    record = _stored(
        Message("T", b"body", tags="TagA", keys=["k1", "k2"],
                properties={"color": "red", PROPERTY_SHARDING_KEY: "g1"})
    )  # fmt: skip
    m = to_v2_message(
        record, namespace="ns", queue_id=5, delivery_attempt=2, receipt_handle="H",
        invisible_ms=30_000,
    )  # fmt: skip
    system = m.system_properties
    assert (m.topic.name, m.topic.resource_namespace, m.body) == ("T", "ns", b"body")
    assert (system.message_id, system.tag, list(system.keys)) == ("01UNIQ", "TagA", ["k1", "k2"])
    assert system.body_digest == v2.Digest(
        type=v2.MD5, checksum=hashlib.md5(b"body").hexdigest().upper()
    )
    assert (system.message_type, system.message_group) == (v2.FIFO, "g1")
    assert (system.queue_id, system.delivery_attempt, system.receipt_handle) == (5, 2, "H")
    assert system.invisible_duration.ToMilliseconds() == 30_000
    assert system.born_timestamp.ToMilliseconds() == 1_700_000_000_000
    assert system.born_host and system.store_host == "127.0.0.1:8080"
    # Only the user's properties: TAGS, KEYS, UNIQ_KEY, __SHARDINGKEY are system ones.
    assert dict(m.user_properties) == {"color": "red"}
    plain = to_v2_message(
        _stored(Message("T", b"x")), namespace="", queue_id=0, delivery_attempt=1,
        receipt_handle="H", invisible_ms=1,
    )  # fmt: skip
    assert plain.system_properties.message_type == v2.NORMAL
    assert not plain.system_properties.HasField("tag")
    assert not plain.system_properties.HasField("message_group")


def test_dead_letter_copy_keeps_the_message_and_names_its_origin() -> None:
    record = _stored(Message("T", b"b", tags="A", keys=["k"], properties={"p": "1"}))
    copy = dead_letter(record, "G")
    assert (copy.topic, copy.body, copy.tags, copy.keys) == ("%DLQ%G", b"b", "A", ["k"])
    assert copy.properties["p"] == "1" and copy.properties["UNIQ_KEY"] == "01UNIQ"
    assert copy.properties["DLQ_ORIGIN_TOPIC"] == "T"
    assert copy.properties["DLQ_ORIGIN_MESSAGE_ID"] == "01UNIQ"


def test_group_name_is_required() -> None:
    assert group_name(v2.Resource(name="G")) == "G"
    with pytest.raises(V2Error) as e:
        group_name(v2.Resource())
    assert e.value.code == v2.ILLEGAL_CONSUMER_GROUP


def test_readable_brokers_need_the_topics_and_the_brokers_read_perm() -> None:
    assert readable_brokers(CONFIG, {"broker-a": 6, "broker-b": 6}) == ["broker-a", "broker-b"]
    assert readable_brokers(CONFIG, {"broker-b": 6}) == ["broker-b"]  # broker-a is down
    assert readable_brokers(CONFIG, {"broker-a": 2, "broker-b": 4}) == ["broker-b"]  # a: W only
    write_only = TopicConfig(topic_name="W", perm=Perm.WRITE, brokers=("broker-a",))
    assert readable_brokers(write_only, {"broker-a": 6}) == []
