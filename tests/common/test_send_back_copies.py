"""basalt.common.message's retry and dead-letter copies: RocketMQ 4's
consumerSendMsgBack rule, the RocketMQ 5 front's dead letter, and what
resendDlq restores."""

from __future__ import annotations

from basalt.common.message import (
    COMPRESSED_FLAG,
    TRANSACTION_COMMIT_TYPE,
    Message,
    MessageRecord,
    encode_host,
    restored_message,
    send_back_copy,
)
from basalt.common.record import decode_record, encode_batch


def _stored(message: Message, reconsume_times: int = 0) -> MessageRecord:
    message.reconsume_times = reconsume_times
    records = encode_batch(
        [message], ["01UNIQ"], queue_id=0, store_host=encode_host("127.0.0.1:8080"),
        born_timestamp_ms=1_700_000_000_000,
    )  # fmt: skip
    return decode_record(records)


def test_a_first_send_back_waits_level_3_and_names_its_origin() -> None:
    record = _stored(
        Message("T", b"b", tags="A", keys=["k"], properties={"p": "1", "DELAY": "2"}, flag=7)
    )
    copy = send_back_copy(record, "G", delay_level=0, max_reconsume_times=16)
    assert (copy.topic, copy.delay_time_level, copy.reconsume_times) == ("%RETRY%G", 3, 1)
    assert (copy.body, copy.tags, list(copy.keys), copy.flag) == (b"b", "A", ["k"], 7)
    assert copy.born_timestamp_ms == record.born_timestamp_ms
    props = copy.all_properties()
    assert props["RETRY_TOPIC"] == "T" and props["ORIGIN_MESSAGE_ID"] == record.msg_id
    assert (props["RECONSUME_TIME"], props["MAX_RECONSUME_TIMES"]) == ("1", "16")
    assert props["UNIQ_KEY"] == "01UNIQ" and props["p"] == "1"
    assert props["DELAY"] == "3"  # the copy's own level, not the record's
    assert "__CRC32#" not in copy.properties and "DLQ_ORIGIN_TOPIC" not in props


def test_later_send_backs_keep_the_origin_and_wait_longer_until_the_last() -> None:
    retried = _stored(
        Message("%RETRY%G", b"b", properties={"RETRY_TOPIC": "T", "ORIGIN_MESSAGE_ID": "FIRST"}),
        reconsume_times=4,
    )
    copy = send_back_copy(retried, "G", delay_level=0, max_reconsume_times=16)
    assert (copy.topic, copy.delay_time_level, copy.reconsume_times) == ("%RETRY%G", 7, 5)
    assert copy.properties["RETRY_TOPIC"] == "T"
    assert copy.properties["ORIGIN_MESSAGE_ID"] == "FIRST"
    asked = send_back_copy(retried, "G", delay_level=1, max_reconsume_times=16)
    assert asked.delay_time_level == 1
    # Reconsumed max times already, or a negative level: dead-lettered, no delay.
    for level, most in ((0, 4), (-1, 16)):
        dead = send_back_copy(retried, "G", delay_level=level, max_reconsume_times=most)
        assert (dead.topic, dead.delay_time_level, dead.reconsume_times) == ("%DLQ%G", 0, 5)
        assert dead.properties["DLQ_ORIGIN_TOPIC"] == "T"
        assert dead.properties["DLQ_ORIGIN_MESSAGE_ID"] == "01UNIQ"


def test_a_copy_keeps_the_bodys_bits_but_not_the_transactions() -> None:
    record = _stored(Message("T", b"z", sys_flag=COMPRESSED_FLAG | TRANSACTION_COMMIT_TYPE))
    copy = send_back_copy(record, "G", delay_level=0, max_reconsume_times=16)
    assert copy.sys_flag == COMPRESSED_FLAG


def test_a_restored_dead_letter_is_its_original_message() -> None:
    letter = _stored(
        Message(
            "%DLQ%G",
            b"b",
            tags="A",
            keys=["k"],
            properties={
                "p": "1",
                "RETRY_TOPIC": "T",
                "ORIGIN_MESSAGE_ID": "FIRST",
                "RECONSUME_TIME": "17",
                "MAX_RECONSUME_TIMES": "16",
                "DLQ_ORIGIN_TOPIC": "T",
                "DLQ_ORIGIN_MESSAGE_ID": "01UNIQ",
            },
        ),
        reconsume_times=17,
    )
    home = restored_message(letter)
    assert (home.topic, home.body, home.tags, list(home.keys)) == ("T", b"b", "A", ["k"])
    assert home.properties == {"p": "1", "UNIQ_KEY": "01UNIQ"}
    assert home.reconsume_times == 0 and home.delay_time_level == 0
    # A v2 dead letter names its origin only by DLQ_ORIGIN_TOPIC.
    v2_letter = _stored(Message("%DLQ%G", b"b", properties={"DLQ_ORIGIN_TOPIC": "V"}))
    assert restored_message(v2_letter).topic == "V"
