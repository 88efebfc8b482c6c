"""What PullService offers a client without Basalt's SDK (issue 19 §4): pulls
answered with decoded messages, a PullBatch byte cap, and consumer offsets
(query, and commit fenced by the reset epoch) through the pull-service alone.
Over real etcd, store-nodes and a pull-service (tests/support/nodes.py)."""

from __future__ import annotations

from pathlib import Path

import grpc

from basalt.services.meta import MetaConfig
from basalt.v1 import common_pb2 as pb
from basalt.v1 import pull_service_pb2 as ps
from basalt.v1 import store_node_pb2 as sn
from tests.support.aio import async_test
from tests.support.nodes import TOPIC, cluster
from tests.support.rpc import bodies, pull_request, refused


def entry(queue_id: int, offset: int = 0, **kw: object) -> ps.PullRequest:
    return pull_request("broker-a", queue_id, offset, group="", **kw)


def queue(queue_id: int, broker: str = "broker-a", topic: str = TOPIC) -> pb.MessageQueue:
    return pb.MessageQueue(topic=topic, broker_name=broker, queue_id=queue_id)


@async_test
async def test_pull_with_decode_answers_messages_and_filters_as_the_raw_pull(
    tmp_path: Path, meta_config: MetaConfig
) -> None:
    async with cluster(tmp_path, meta_config, brokers=("broker-a",)) as h:
        node = h.node_stubs["broker-a"]
        sent = await node.SendMessage(
            sn.SendMessageRequest(
                message=pb.Message(
                    topic=TOPIC,
                    body=b"one",
                    tags="TagA",
                    keys=["k1", "k2"],
                    properties={"UNIQ_KEY": "U1", "color": "red"},
                    born_timestamp_ms=1234,
                    flag=7,
                ),
                queue_id=1,
            )
        )
        await h.send("broker-a", 1, b"two", tags="TagB")
        got = await h.stub.Pull(pull_request("broker-a", 1, decode=True))
        assert got.status == pb.PULL_STATUS_FOUND and got.next_begin_offset == 2
        assert not got.HasField("records")  # decoded instead of raw, not both
        first, second = got.messages
        assert (first.topic, first.queue_id, first.queue_offset) == (TOPIC, 1, 0)
        assert first.commit_log_offset == sent.result.physical_offsets[0]
        assert first.msg_id == sent.result.offset_msg_ids[0]
        assert (first.uniq_key, first.tags, list(first.keys)) == ("U1", "TagA", ["k1", "k2"])
        assert first.properties["color"] == "red" and first.properties["TAGS"] == "TagA"
        assert (first.body, first.born_timestamp_ms, first.flag) == (b"one", 1234, 7)
        assert first.store_timestamp_ms == sent.result.store_timestamp_ms
        assert first.store_host == sent.result.store_host and first.store_size_bytes > 0
        assert (second.body, second.queue_offset, second.uniq_key) == (b"two", 1, "")
        # The raw path is unchanged and is the default.
        raw = await h.stub.Pull(pull_request("broker-a", 1))
        assert bodies(raw) == [b"one", b"two"] and not raw.messages
        # A filtered pull decodes only what the store-node matched.
        tag_b = pb.Subscription(expression="TagB")
        got = await h.stub.Pull(pull_request("broker-a", 1, subscription=tag_b, decode=True))
        assert [m.body for m in got.messages] == [b"two"]
        # A filter that does not parse is refused before anything is read or decoded.
        bad = pb.Subscription(type=pb.EXPRESSION_TYPE_SQL92, expression="a >")
        status, code, _ = await refused(
            h.stub.Pull(pull_request("broker-a", 1, subscription=bad, decode=True))
        )
        assert (status, code) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            pb.RESPONSE_CODE_SUBSCRIPTION_PARSE_FAILED,
        )


@async_test
async def test_pull_batch_byte_cap_spans_the_call_and_always_returns_one_record(
    tmp_path: Path, meta_config: MetaConfig
) -> None:
    async with cluster(tmp_path, meta_config, brokers=("broker-a",)) as h:
        for i in range(3):
            await h.send("broker-a", 0, b"a" * 1000 + bytes([i]))
        await h.send("broker-a", 1, b"b" * 1000)
        uncapped = await h.stub.PullBatch(
            ps.PullBatchRequest(group="G", pulls=[entry(0), entry(1)], decode=True)
        )
        sizes = [m.store_size_bytes for m in uncapped.results[0].messages]
        assert len(sizes) == 3 and uncapped.results[1].messages[0].body == b"b" * 1000

        # Room for two records and a half: queue 0 is cut after its second, and
        # queue 1, after the cap, answers FOUND with nothing and resumes at 0.
        capped = await h.stub.PullBatch(
            ps.PullBatchRequest(
                group="G",
                pulls=[entry(0), entry(1)],
                max_bytes=sizes[0] + sizes[1] + sizes[2] // 2,
            )
        )
        q0, q1 = capped.results
        assert len(bodies(q0)) == 2 and q0.records.count == 2 and q0.next_begin_offset == 2
        assert q1.status == pb.PULL_STATUS_FOUND and q1.records.count == 0
        assert q1.next_begin_offset == 0
        # A cap below one record still returns that record, decoded too.
        one = await h.stub.PullBatch(
            ps.PullBatchRequest(group="G", pulls=[entry(0, 2), entry(1)], max_bytes=1, decode=True)
        )
        assert [m.queue_offset for m in one.results[0].messages] == [2]
        assert one.results[0].next_begin_offset == 3
        assert not one.results[1].messages and one.results[1].next_begin_offset == 0
        # A refused entry keeps its place; the cap counts only what is served.
        mixed = await h.stub.PullBatch(
            ps.PullBatchRequest(group="G", pulls=[entry(9), entry(1)], max_bytes=1, decode=True)
        )
        assert mixed.results[0].refused.code == pb.RESPONSE_CODE_INVALID_PARAMETER
        assert [m.body for m in mixed.results[1].messages] == [b"b" * 1000]

        for cap in (0, -1):
            status, code, message = await refused(
                h.stub.PullBatch(ps.PullBatchRequest(group="G", pulls=[entry(0)], max_bytes=cap))
            )
            assert (status, code) == (
                grpc.StatusCode.INVALID_ARGUMENT,
                pb.RESPONSE_CODE_INVALID_PARAMETER,
            )
            assert "max_bytes" in message
        status, code, message = await refused(
            h.stub.PullBatch(ps.PullBatchRequest(group="G", pulls=[entry(0, decode=True)]))
        )
        assert code == pb.RESPONSE_CODE_INVALID_PARAMETER and "decode" in message


@async_test
async def test_offsets_query_and_commit_through_the_pull_service_fenced_by_resets(
    tmp_path: Path, meta_config: MetaConfig
) -> None:
    async with cluster(tmp_path, meta_config, brokers=("broker-a",)) as h:
        for i in range(3):
            await h.send("broker-a", 2, b"m%d" % i)
        fresh = await h.stub.QueryOffset(ps.QueryOffsetRequest(group="G", queue=queue(2)))
        assert (fresh.offset, fresh.reset_epoch, fresh.min_offset, fresh.max_offset) == (
            -1,
            0,
            0,
            3,
        )
        done = await h.stub.CommitOffset(
            ps.CommitOffsetRequest(group="G", queue=queue(2), offset=2, reset_epoch=0)
        )
        assert done.commit.code == pb.RESPONSE_CODE_SUCCESS
        assert (
            await h.stub.QueryOffset(ps.QueryOffsetRequest(group="G", queue=queue(2)))
        ).offset == 2

        # Admin resets the group (on the store-node, as admin does): the epoch
        # moves on, and a commit under the old one is refused, nothing stored.
        reset = await h.node_stubs["broker-a"].ResetOffset(
            sn.ResetOffsetRequest(topic=TOPIC, group="G", timestamp_ms=-1, force=True)
        )
        stale = await h.stub.CommitOffset(
            ps.CommitOffsetRequest(group="G", queue=queue(2), offset=1, reset_epoch=0)
        )
        assert stale.commit.code == pb.RESPONSE_CODE_STALE_RESET_EPOCH
        assert stale.commit.reset_epoch == reset.reset_epoch > 0
        now = await h.stub.QueryOffset(ps.QueryOffsetRequest(group="G", queue=queue(2)))
        assert (now.offset, now.reset_epoch) == (3, reset.reset_epoch)
        ok = await h.stub.CommitOffset(
            ps.CommitOffsetRequest(
                group="G", queue=queue(2), offset=3, reset_epoch=reset.reset_epoch
            )
        )
        assert ok.commit.code == pb.RESPONSE_CODE_SUCCESS

        for request, want in (
            (ps.QueryOffsetRequest(group="", queue=queue(2)), pb.RESPONSE_CODE_INVALID_PARAMETER),
            (
                ps.QueryOffsetRequest(group="G", queue=queue(0, "nope")),
                pb.RESPONSE_CODE_BROKER_NOT_EXIST,
            ),
            (
                ps.QueryOffsetRequest(group="G", queue=queue(0, topic="Nope")),
                pb.RESPONSE_CODE_TOPIC_NOT_EXIST,
            ),
            (ps.QueryOffsetRequest(group="G", queue=queue(4)), pb.RESPONSE_CODE_INVALID_PARAMETER),
        ):
            assert (await refused(h.stub.QueryOffset(request)))[1] == want
        status, code, message = await refused(
            h.stub.CommitOffset(ps.CommitOffsetRequest(group="G", queue=queue(2), offset=-1))
        )
        assert (status, code) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            pb.RESPONSE_CODE_INVALID_PARAMETER,
        )
        assert "negative" in message
