"""ConsumerSendMsgBack on a broker group of three real store-node processes
(docs/retry.md, docs/replication.md): a slave refuses it NOT_MASTER naming the
master, and after a kill -9 of the master the new one takes the send-back of
a message the old one wrote (its offset message id names the old master's
store host, which the record carries on every member).

Timings are small (tests.support.groups.ha_flags); nothing here asserts how
long anything took.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from basalt.common.record import decode_record
from basalt.common.status import master_address_of
from basalt.services.cluster.etcd import EtcdProcess
from basalt.v1 import common_pb2 as pb
from basalt.v1 import store_node_pb2 as sn
from tests.support.aio import async_test
from tests.support.etcd import unique_cluster
from tests.support.groups import TOPIC, ReplicaGroup, ha_flags
from tests.support.polling import eventually
from tests.support.rpc import refused

pytestmark = pytest.mark.slow

#: A failover (lease 2 s, then a campaign) takes seconds; this bounds a hang.
WAIT_S = 60.0


@async_test(timeout_s=240)
async def test_only_the_master_takes_a_send_back_and_a_new_master_takes_the_old_ones_ids(
    tmp_path: Path, etcd: EtcdProcess
) -> None:
    async with ReplicaGroup(
        tmp_path, etcd.endpoint, unique_cluster(), flags=ha_flags(min_in_sync=2)
    ) as group:
        await eventually(lambda: group.in_sync({0, 1, 2}), timeout_s=WAIT_S, what="all in sync")
        first = await group.state()
        old = first.master_id
        sent = await group.stub(old).SendMessage(
            sn.SendMessageRequest(message=pb.Message(topic=TOPIC, body=b"poison"), queue_id=0)
        )
        assert sent.result.status == pb.SEND_STATUS_SEND_OK  # SYNC: a slave has it too
        msg_id = sent.result.offset_msg_ids[0]
        back = sn.ConsumerSendMsgBackRequest(group="G", offset_msg_id=msg_id, delay_level=-1)

        slave = next(i for i in group.members if i != old)
        _, code, details = await refused(group.stub(slave).ConsumerSendMsgBack(back))
        assert code == pb.RESPONSE_CODE_NOT_MASTER
        assert master_address_of(details) == group.members[old].address

        group.members[old].kill()
        await eventually(
            lambda: group.master_ready(above_epoch=first.epoch, not_id=old),
            timeout_s=WAIT_S,
            what="a new master",
        )
        new = (await group.state()).master_id
        answer = await group.stub(new).ConsumerSendMsgBack(back)
        assert (answer.topic, answer.dead_lettered) == ("%DLQ%G", True)
        got = await group.stub(new).GetMessage(
            sn.GetMessageRequest(group="reader", topic="%DLQ%G", queue_id=0, max_msg_nums=8)
        )
        letter = decode_record(got.records.data)
        assert letter.body == b"poison" and letter.properties["DLQ_ORIGIN_TOPIC"] == TOPIC
