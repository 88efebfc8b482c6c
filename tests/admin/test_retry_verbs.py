"""``basalt admin retryStatus`` and ``resendDlq`` run as a user would (processes)
against real etcd and store-nodes (one-second delay levels) whose retry and
dead-letter topics were filled by real send-backs."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from basalt.common.record import decode_record
from basalt.services.meta import MetaConfig
from basalt.store.config import MessageStoreConfig
from basalt.v1 import common_pb2 as pb
from basalt.v1 import store_node_pb2 as sn
from tests.support.aio import async_test
from tests.support.nodes import TOPIC, Harness, cluster
from tests.support.polling import eventually
from tests.support.processes import run_basalt as basalt
from tests.support.stores import node_store_config
from tests.support.timeouts import SUBPROCESS_TEST_TIMEOUT_S


def fast_store(root: Path) -> MessageStoreConfig:
    return replace(node_store_config(root), message_delay_level="1s 1s 1s 1s")


async def give_back(h: Harness, broker: str, body: bytes, uniq: str, delay_level: int) -> None:
    """Store ``body`` on ``broker`` and send it back for group AG."""
    sent = await h.node_stubs[broker].SendMessage(
        sn.SendMessageRequest(
            message=pb.Message(
                topic=TOPIC, body=body, tags="T", keys=["k"], properties={"UNIQ_KEY": uniq}
            ),
            queue_id=0,
        )
    )
    await h.node_stubs[broker].ConsumerSendMsgBack(
        sn.ConsumerSendMsgBackRequest(
            group="AG", offset_msg_id=sent.result.offset_msg_ids[0], delay_level=delay_level
        )
    )


@async_test(timeout_s=SUBPROCESS_TEST_TIMEOUT_S)
async def test_retry_status_shows_depths_and_resend_dlq_sends_dead_letters_home(
    tmp_path: Path, meta_config: MetaConfig
) -> None:
    async with cluster(tmp_path, meta_config, store_config=fast_store) as h:
        etcd = ("--etcd", meta_config.endpoints[0], "--cluster", meta_config.cluster)
        code, out, err = await basalt("admin", "retryStatus", "-g", "AG", "--json", *etcd)
        assert code == 0, err
        assert [(r["topic"], r["broker"], r["depth"]) for r in json.loads(out)] == [
            ("%RETRY%AG", "(none)", 0),
            ("%DLQ%AG", "(none)", 0),
        ]
        await give_back(h, "broker-a", b"bad1", "ID-BAD-1", -1)
        await give_back(h, "broker-b", b"bad2", "ID-BAD-2", -1)
        await give_back(h, "broker-a", b"slow", "ID-SLOW", 0)

        async def retry_due() -> bool:
            got = await h.node_stubs["broker-a"].GetMinMaxOffset(
                sn.GetMinMaxOffsetRequest(topic="%RETRY%AG", queue_id=0)
            )
            return got.max_offset == 1

        await eventually(retry_due, timeout_s=15, what="the retry copy due")
        code, out, err = await basalt("admin", "retryStatus", "-g", "AG", "--json", *etcd)
        assert code == 0, err
        rows = json.loads(out)
        assert [(r["topic"], r["broker"], r["consumer_offset"], r["depth"]) for r in rows] == [
            ("%RETRY%AG", "broker-a", -1, 1),
            ("%DLQ%AG", "broker-a", "", 1),
            ("%DLQ%AG", "broker-b", "", 1),
        ]
        code, out, _ = await basalt("admin", "retryStatus", "-g", "AG", *etcd)
        assert out.splitlines()[0].split() == [
            "topic", "broker", "queue", "min_offset", "max_offset", "consumer_offset", "depth"
        ]  # fmt: skip

        # One by its message id, then all of them: each back in its original topic.
        code, out, err = await basalt(
            "admin", "resendDlq", "-g", "AG", "-i", "ID-BAD-2", "--json", *etcd
        )
        assert code == 0, err
        first, total = json.loads(out)
        assert (first["msg_id"], first["topic"], total["msg_id"]) == (
            "ID-BAD-2",
            TOPIC,
            "(1 re-sent)",
        )
        view = await h.node_stubs[first["broker"]].ViewMessage(
            sn.ViewMessageRequest(offset_msg_id=first["offset_msg_id"])
        )
        home = decode_record(view.records.data)
        assert (home.topic, home.body, home.tags, home.keys, home.uniq_key) == (
            TOPIC,
            b"bad2",
            "T",
            ["k"],
            "ID-BAD-2",
        )
        assert home.reconsume_times == 0
        assert not {"DLQ_ORIGIN_TOPIC", "RETRY_TOPIC", "RECONSUME_TIME"} & set(home.properties)
        code, out, err = await basalt("admin", "resendDlq", "-g", "AG", *etcd)
        assert code == 0, err
        assert "(2 re-sent)" in out and "ID-BAD-1" in out and "ID-BAD-2" in out

        # Clear failures, nothing sent.
        before = h.nodes["broker-a"].store.max_physical_offset
        code, _, err = await basalt("admin", "resendDlq", "-g", "AG", "-i", "NOPE", *etcd)
        assert code == 1 and "NOPE" in err
        code, _, err = await basalt("admin", "resendDlq", "-g", "Nobody", *etcd)
        assert code == 1 and "no dead-letter topic" in err
        assert h.nodes["broker-a"].store.max_physical_offset == before
