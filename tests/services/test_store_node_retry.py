"""ConsumerSendMsgBack through a store-node (a real grpc.aio server over a real
store with one-second delay levels): a message given back reaches %RETRY%<group>
after its delay with the retry properties, past max_reconsume_times (or with a
negative level) it goes to %DLQ%<group> at once, the topics are created with
one queue, and bad input is refused with nothing stored."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import grpc

from basalt.common.message import SCHEDULE_TOPIC, MessageRecord, encode_host, offset_msg_id
from basalt.common.record import decode_record
from basalt.store.config import MessageStoreConfig
from basalt.v1 import common_pb2 as pb
from basalt.v1 import store_node_pb2 as sn
from basalt.v1 import store_node_pb2_grpc as sn_grpc
from tests.support.aio import run
from tests.support.nodes import NODE_TOPIC as TOPIC
from tests.support.nodes import node
from tests.support.polling import eventually
from tests.support.rpc import refused, wire
from tests.support.stores import node_store_config

#: Four one-second levels: a first retry (level 3) is due a second after it is stored.
FAST_LEVELS = "1s 1s 1s 1s"
#: The producer's message id (what a consumer dedupes on): kept by every copy.
UNIQ = "7F0000010001000000000000000A0001"


def fast_store(root: Path) -> MessageStoreConfig:
    return replace(node_store_config(root), message_delay_level=FAST_LEVELS)


async def _only_record(stub: sn_grpc.StoreNodeStub, topic: str) -> MessageRecord | None:
    got = await stub.GetMessage(
        sn.GetMessageRequest(group="reader", topic=topic, queue_id=0, max_msg_nums=8)
    )
    return decode_record(got.records.data) if got.status == pb.GET_MESSAGE_STATUS_FOUND else None


def test_a_message_given_back_is_retried_after_its_delay_then_dead_lettered(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        async with node(tmp_path, store_config=fast_store) as (running, stub, topics):
            sent = await stub.SendMessage(
                sn.SendMessageRequest(
                    message=wire(
                        TOPIC,
                        b"poison",
                        tags="A",
                        keys=["k1"],
                        properties={"p": "1", "UNIQ_KEY": UNIQ},
                    ),
                    queue_id=1,
                )
            )
            first_id = sent.result.offset_msg_ids[0]
            back = await stub.ConsumerSendMsgBack(
                sn.ConsumerSendMsgBackRequest(
                    group="G", offset_msg_id=first_id, origin_topic=TOPIC, max_reconsume_times=1
                )
            )
            assert (back.topic, back.dead_lettered, back.reconsume_times) == ("%RETRY%G", False, 1)
            assert back.result.status == pb.SEND_STATUS_SEND_OK
            # Parked until due (level 3), in a retry topic of one queue on this broker.
            assert running.store.get_max_offset_in_queue(SCHEDULE_TOPIC, 2) == 1
            retry_config = topics.topic("%RETRY%G")
            assert retry_config is not None
            assert (retry_config.write_queue_nums, retry_config.brokers) == (1, ("broker-a",))

            async def retried() -> bool:
                return await _only_record(stub, "%RETRY%G") is not None

            await eventually(retried, timeout_s=15, what="the retry copy")
            copy = await _only_record(stub, "%RETRY%G")
            assert copy is not None
            assert (copy.body, copy.tags, copy.keys) == (b"poison", "A", ["k1"])
            assert copy.reconsume_times == 1
            props = copy.properties
            assert props["p"] == "1" and props["UNIQ_KEY"] == UNIQ
            assert props["RETRY_TOPIC"] == TOPIC
            assert props["ORIGIN_MESSAGE_ID"] == first_id
            assert (props["RECONSUME_TIME"], props["MAX_RECONSUME_TIMES"]) == ("1", "1")
            assert "DELAY" not in props and "REAL_TOPIC" not in props
            # Given back again: reconsumed once = max_reconsume_times, so dead-lettered now.
            dead = await stub.ConsumerSendMsgBack(
                sn.ConsumerSendMsgBackRequest(
                    group="G", offset_msg_id=copy.msg_id, max_reconsume_times=1
                )
            )
            assert (dead.topic, dead.dead_lettered, dead.reconsume_times) == ("%DLQ%G", True, 2)
            letter = await _only_record(stub, "%DLQ%G")
            assert letter is not None
            assert (letter.body, letter.reconsume_times) == (b"poison", 2)
            props = letter.properties
            assert props["DLQ_ORIGIN_TOPIC"] == TOPIC and props["RETRY_TOPIC"] == TOPIC
            assert props["DLQ_ORIGIN_MESSAGE_ID"] == UNIQ
            assert props["ORIGIN_MESSAGE_ID"] == first_id
            # A negative level dead-letters at once, whatever the count.
            direct = await stub.ConsumerSendMsgBack(
                sn.ConsumerSendMsgBackRequest(group="H", offset_msg_id=first_id, delay_level=-1)
            )
            assert (direct.topic, direct.dead_lettered) == ("%DLQ%H", True)
            assert running.store.get_max_offset_in_queue("%DLQ%H", 0) == 1

    run(scenario)


def test_bad_send_backs_are_refused_with_nothing_stored(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with node(tmp_path, store_config=fast_store) as (running, stub, _):
            sent = await stub.SendMessage(
                sn.SendMessageRequest(message=wire(TOPIC, b"x"), queue_id=0)
            )
            good = sent.result.offset_msg_ids[0]
            physical = sent.result.physical_offsets[0]
            elsewhere = offset_msg_id(encode_host("10.1.2.3:10911"), physical)
            here = running.store.config.store_host
            cases = [
                (sn.ConsumerSendMsgBackRequest(group="", offset_msg_id=good), "group"),
                (sn.ConsumerSendMsgBackRequest(group="G", offset_msg_id="zz"), "offset message id"),
                (sn.ConsumerSendMsgBackRequest(group="G", offset_msg_id=elsewhere), "10.1.2.3"),
                (
                    sn.ConsumerSendMsgBackRequest(group="G", offset_msg_id=good, origin_topic="T2"),
                    "not of origin_topic",
                ),
                (
                    sn.ConsumerSendMsgBackRequest(
                        group="G", offset_msg_id=offset_msg_id(encode_host(here), physical + 1)
                    ),
                    "no message",
                ),
            ]
            before = running.store.max_physical_offset
            for request, words in cases:
                status, code, details = await refused(stub.ConsumerSendMsgBack(request))
                assert words in details, details
                if words == "no message":
                    assert (status, code) == (
                        grpc.StatusCode.NOT_FOUND,
                        pb.RESPONSE_CODE_QUERY_NOT_FOUND,
                    )
                else:
                    assert (status, code) == (
                        grpc.StatusCode.INVALID_ARGUMENT,
                        pb.RESPONSE_CODE_INVALID_PARAMETER,
                    ), details
            past_the_end = offset_msg_id(encode_host(here), before + 1000)
            _, code, _ = await refused(
                stub.ConsumerSendMsgBack(
                    sn.ConsumerSendMsgBackRequest(group="G", offset_msg_id=past_the_end)
                )
            )
            assert code == pb.RESPONSE_CODE_QUERY_NOT_FOUND
            assert running.store.max_physical_offset == before

    run(scenario)


def test_a_read_only_broker_refuses_a_send_back(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with node(tmp_path, broker_permission=4, store_config=fast_store) as (
            running,
            stub,
            _,
        ):
            here = running.store.config.store_host
            _, code, details = await refused(
                stub.ConsumerSendMsgBack(
                    sn.ConsumerSendMsgBackRequest(
                        group="G", offset_msg_id=offset_msg_id(encode_host(here), 0)
                    )
                )
            )
            assert code == pb.RESPONSE_CODE_NO_PERMISSION and "forbidden" in details

    run(scenario)
