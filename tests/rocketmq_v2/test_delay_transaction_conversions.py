"""The v2 front's delay and transaction pieces without a cluster: message
conversions (:mod:`basalt.services.rocketmq_v2.conversions`) and the
self-describing transaction ids (:mod:`basalt.services.rocketmq_v2.handles`)."""

from __future__ import annotations

import base64

import pytest
from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from basalt.common.message import (
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_TRANSACTION_PREPARED,
    Message,
    encode_host,
)
from basalt.common.recall import RecallHandle, RecallHandleError
from basalt.common.record import decode_record, encode_batch
from basalt.rocketmq.v2 import definition_pb2 as v2
from basalt.services.rocketmq_v2.conversions import (
    V2Error,
    checked_half,
    deliver_time_ms,
    message_type,
    to_message,
    to_v2_message,
    to_wire,
)
from basalt.services.rocketmq_v2.handles import HandleError, TransactionId


def _message(**system: object) -> v2.Message:
    return v2.Message(
        topic=v2.Resource(name="T"),
        user_properties={"a": "1"},
        system_properties=v2.SystemProperties(message_id="01ABC", **system),  # type: ignore[arg-type]
        body=b"hello",
    )


def _ts(ms: int) -> Timestamp:
    t = Timestamp()
    t.FromMilliseconds(ms)
    return t


def test_a_delay_message_is_due_at_its_delivery_timestamp() -> None:
    m = _message(message_type=v2.DELAY, delivery_timestamp=_ts(1_900_000_000_123))
    assert deliver_time_ms(m) == 1_900_000_000_123
    # The proxy reads a delivery_timestamp whatever the declared type.
    assert deliver_time_ms(_message(delivery_timestamp=_ts(1_900_000_000_000))) == (
        1_900_000_000_000
    )
    assert deliver_time_ms(_message()) == 0
    # At or before the epoch is due already; 0 would mean "no timer" on the wire.
    assert deliver_time_ms(_message(delivery_timestamp=_ts(0))) == 1
    stored = to_wire(to_message(m, 1024), deliver_time_ms(m))
    assert stored.deliver_time_ms == 1_900_000_000_123
    assert (stored.topic, stored.body, stored.properties["UNIQ_KEY"]) == ("T", b"hello", "01ABC")


@pytest.mark.parametrize(
    ("message", "code"),
    [
        (_message(message_type=v2.DELAY), v2.ILLEGAL_DELIVERY_TIME),
        (
            _message(message_type=v2.DELAY, delivery_timestamp=Timestamp(seconds=-(10**13))),
            v2.ILLEGAL_DELIVERY_TIME,
        ),
        (
            _message(message_type=v2.TRANSACTION, delivery_timestamp=_ts(1)),
            v2.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
        ),
        (
            _message(message_group="g", delivery_timestamp=_ts(1)),
            v2.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
        ),
    ],
)
def test_bad_delays_are_refused_with_their_code(message: v2.Message, code: int) -> None:
    with pytest.raises(V2Error) as e:
        deliver_time_ms(message)
    assert e.value.code == code


def test_a_transaction_message_is_stamped_as_the_proxy_does() -> None:
    recovery = Duration(seconds=30)
    m = to_message(
        _message(message_type=v2.TRANSACTION, orphaned_transaction_recovery_duration=recovery),
        1024,
    )
    assert m.properties[PROPERTY_TRANSACTION_PREPARED] == "true"
    # The v2 protocol has no producer group: the topic is the group.
    assert m.properties[PROPERTY_PRODUCER_GROUP] == "T"
    assert m.properties["CHECK_IMMUNITY_TIME_IN_SECONDS"] == "30"
    assert m.properties["a"] == "1"
    normal = to_message(_message(), 1024)
    assert PROPERTY_TRANSACTION_PREPARED not in normal.properties
    # A user cannot stamp them: they are system properties.
    with pytest.raises(V2Error) as e:
        to_message(
            v2.Message(
                topic=v2.Resource(name="T"),
                user_properties={"TRAN_MSG": "true"},
                system_properties=v2.SystemProperties(message_id="01"),
                body=b"x",
            ),
            1024,
        )
    assert e.value.code == v2.ILLEGAL_MESSAGE_PROPERTY_KEY


def _record(message: Message) -> bytes:
    return encode_batch(
        [message], ["01UNIQ"], queue_id=0, store_host=encode_host("127.0.0.1:8080"),
        born_timestamp_ms=1_700_000_000_000,
    )  # fmt: skip


def test_types_of_delivered_messages_and_a_timers_delivery_timestamp() -> None:
    assert message_type({"TRAN_MSG": "true"}) == v2.TRANSACTION
    assert message_type({"DELAY": "3"}) == v2.DELAY
    assert message_type({"TIMER_DELIVER_MS": "5"}) == v2.DELAY
    assert message_type({"__SHARDINGKEY": "g"}) == v2.FIFO
    assert message_type({}) == v2.NORMAL
    timer = decode_record(_record(Message("T", b"b", properties={"TIMER_DELIVER_MS": "1234"})))
    m = to_v2_message(
        timer, namespace="", queue_id=0, delivery_attempt=1, receipt_handle="H", invisible_ms=1
    )
    assert m.system_properties.message_type == v2.DELAY
    assert m.system_properties.delivery_timestamp.ToMilliseconds() == 1234
    assert "TIMER_DELIVER_MS" not in m.user_properties


def test_a_checked_half_shows_its_real_topic_and_no_delivery_state() -> None:
    half = Message(
        "RMQ_SYS_TRANS_HALF_TOPIC", b"order-1", tags="T1",
        properties={"REAL_TOPIC": "Orders", "REAL_QID": "2", "TRAN_MSG": "true",
                    "PGROUP": "Orders", "mine": "x"},
    )  # fmt: skip
    m = checked_half(decode_record(_record(half)), "ns")
    system = m.system_properties
    assert (m.topic.name, m.topic.resource_namespace, m.body) == ("Orders", "ns", b"order-1")
    assert (system.message_type, system.queue_id, system.message_id) == (
        v2.TRANSACTION,
        2,
        "01UNIQ",
    )
    assert system.tag == "T1"
    assert dict(m.user_properties) == {"mine": "x"}
    assert not system.HasField("receipt_handle")
    assert not system.HasField("delivery_attempt")
    with pytest.raises(ValueError, match="REAL_TOPIC"):
        checked_half(decode_record(_record(Message("X", b"b"))), "")


def test_transaction_ids_round_trip_and_name_their_broker() -> None:
    tid = TransactionId("broker-a", "Orders", "7F00000100001F900000000000000ABC")
    assert TransactionId.decode(tid.encode()) == tid
    # URL-safe: the clients carry them as strings.
    assert all(c.isalnum() or c in "-_" for c in tid.encode())


def _flipped(text: str) -> str:
    raw = bytearray(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
    raw[-1] ^= 0x01
    return base64.urlsafe_b64encode(bytes(raw)).rstrip(b"=").decode()


@pytest.mark.parametrize(
    "text",
    [
        "",
        "not base64 !",
        "AAAA",
        _flipped(TransactionId("b", "T", "ID").encode()),  # CRC catches it
        RecallHandle("T", "b", 1_900_000_000_000, "01ID").encode(),  # a recall handle
        "x" * 300_000,
    ],
)
def test_garbled_transaction_ids_do_not_decode(text: str) -> None:
    with pytest.raises(HandleError):
        TransactionId.decode(text)


def test_a_transaction_id_is_not_a_recall_handle() -> None:
    with pytest.raises(RecallHandleError):
        RecallHandle.decode(TransactionId("b", "T", "ID").encode())
