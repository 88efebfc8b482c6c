"""services/pull_service/answers.py without the network: the PullBatch byte cap
on answers built from records the shared codec encodes, and decoding."""

from __future__ import annotations

import logging

import pytest

from basalt.common.message import Message, encode_host
from basalt.common.record import EncodedMessage
from basalt.services.errors import Refusal
from basalt.services.pull_service.answers import cap_bytes, decode_answer
from basalt.v1 import common_pb2 as pb

HOST = encode_host("127.0.0.1:10911")


def answer(queue_id: int, bodies: list[bytes], first_offset: int = 0) -> pb.PullResponse:
    """A FOUND answer of ``bodies`` stored at queue offsets from ``first_offset``."""
    data = b"".join(
        EncodedMessage(
            Message(topic="T", body=body, queue_id=queue_id, tags="t"), store_host=HOST
        ).encode(first_offset + i, 1000 * (first_offset + i), 5)
        for i, body in enumerate(bodies)
    )
    return pb.PullResponse(
        status=pb.PULL_STATUS_FOUND,
        next_begin_offset=first_offset + len(bodies),
        records=pb.Records(data=data, count=len(bodies)),
    )


def test_the_cap_keeps_records_in_entry_order_and_resumes_at_the_first_left_out() -> None:
    answers = [answer(0, [b"a" * 100] * 3), answer(1, [b"b" * 100] * 2, first_offset=7)]
    size = len(answers[0].records.data) // 3
    cap_bytes(answers, 4 * size - 1)
    assert [a.records.count for a in answers] == [3, 0]
    assert answers[0].next_begin_offset == 3  # untouched: all of it fit
    assert answers[1].next_begin_offset == 7 and answers[1].records.data == b""

    answers = [answer(0, [b"a" * 100] * 3), answer(1, [b"b" * 100] * 2, first_offset=7)]
    cap_bytes(answers, 4 * size)
    assert [a.records.count for a in answers] == [3, 1]
    assert answers[1].next_begin_offset == 8
    assert len(answers[1].records.data) == size


def test_the_first_record_is_kept_whatever_the_cap_even_after_empty_entries() -> None:
    empty = pb.PullResponse(status=pb.PULL_STATUS_NO_NEW_MSG, next_begin_offset=4)
    answers = [empty, answer(1, [b"x" * 5000, b"y"], first_offset=2)]
    cap_bytes(answers, 1)
    assert answers[0] == pb.PullResponse(status=pb.PULL_STATUS_NO_NEW_MSG, next_begin_offset=4)
    assert answers[1].records.count == 1 and answers[1].next_begin_offset == 3
    decode_answer(answers[1], call="Pull", broker="broker-a")
    assert [m.body for m in answers[1].messages] == [b"x" * 5000]
    assert not answers[1].HasField("records")


def test_records_that_are_not_records_are_a_system_error_not_a_loop() -> None:
    broken = pb.PullResponse(records=pb.Records(data=b"\x00" * 64, count=1))
    with pytest.raises(Refusal) as cap:
        cap_bytes([broken], 10)
    assert cap.value.code == pb.RESPONSE_CODE_SYSTEM_ERROR
    with pytest.raises(Refusal) as decode:
        decode_answer(broken, call="Pull", broker="broker-a")
    assert decode.value.code == pb.RESPONSE_CODE_SYSTEM_ERROR


def test_a_record_whose_checksum_fails_is_left_out_logged_and_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    damaged = answer(0, [b"first", b"second", b"third"], first_offset=10)
    data = bytearray(damaged.records.data)
    data[data.index(b"second")] ^= 0x01
    damaged.records.data = bytes(data)
    with caplog.at_level(logging.ERROR, "basalt.services.pull_service.metrics"):
        decode_answer(damaged, call="Pull", broker="broker-a")
    assert [m.body for m in damaged.messages] == [b"first", b"third"]
    assert damaged.next_begin_offset == 13  # past it: the read goes on
    [line] = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert "broker-a" in line and "queue 0 offset 11" in line and "body CRC mismatch" in line
