"""PullService.PullBatch: many queues of one broker in one call, over real etcd,
real store-nodes and a real pull-service (the harness of test_pull_service.py).

Each entry is checked as Pull checks it and answered on its own; a refused
entry carries the status and code Pull would fail with, the others are served.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc

from basalt.services.meta import MetaConfig, Perm
from basalt.v1 import common_pb2 as pb
from basalt.v1 import pull_service_pb2 as ps
from basalt.v1 import store_node_pb2 as sn
from tests.support.aio import async_test
from tests.support.nodes import TOPIC, cluster
from tests.support.polling import eventually
from tests.support.rpc import bodies, pull_request, refused


def entry(queue_id: int, offset: int = 0, **kw: object) -> ps.PullRequest:
    """A PullBatch entry on broker-a: no group of its own (the call's applies)."""
    return pull_request("broker-a", queue_id, offset, group="", **kw)


@async_test
async def test_pull_batch_reads_every_queue_commits_and_answers_refusals_per_entry(
    tmp_path: Path, meta_config: MetaConfig
) -> None:
    async with cluster(tmp_path, meta_config) as h:
        for q in range(3):
            for i in range(q + 1):
                await h.send("broker-a", q, b"q%d-%d" % (q, i), tags="A" if i % 2 == 0 else "B")
        got = await h.stub.PullBatch(
            ps.PullBatchRequest(
                group="G",
                pulls=[
                    entry(0, commit_offset=0),
                    entry(1, subscription=pb.Subscription(expression="A")),
                    entry(2, 1),
                    entry(3),  # nothing there yet
                    entry(4),  # read_queue_nums is 4
                    pull_request("broker-a", 0, topic="Nope", group=""),
                    entry(5, subscription=pb.Subscription(type=1, expression="a >")),
                ],
            )
        )
        r = got.results
        assert len(r) == 7
        assert bodies(r[0]) == [b"q0-0"] and r[0].status == pb.PULL_STATUS_FOUND
        assert r[0].commit.code == pb.RESPONSE_CODE_SUCCESS
        assert bodies(r[1]) == [b"q1-0"] and r[1].next_begin_offset == 2
        assert bodies(r[2]) == [b"q2-1", b"q2-2"]
        assert r[3].code == pb.RESPONSE_CODE_PULL_NOT_FOUND
        assert r[3].status == pb.PULL_STATUS_NO_NEW_MSG
        assert r[4].refused.code == pb.RESPONSE_CODE_INVALID_PARAMETER
        assert r[4].refused.grpc_code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
        assert "queue id 4" in r[4].refused.message
        assert r[5].refused.code == pb.RESPONSE_CODE_TOPIC_NOT_EXIST
        assert r[6].refused.code == pb.RESPONSE_CODE_INVALID_PARAMETER  # queue 5 >= 4 first
        offsets = await h.node_stubs["broker-a"].QueryConsumerOffset(
            sn.QueryConsumerOffsetRequest(group="G", topic=TOPIC, queue_id=0)
        )
        assert offsets.offset == 0


@async_test
async def test_pull_batch_is_held_until_any_queue_gets_a_message(
    tmp_path: Path, meta_config: MetaConfig
) -> None:
    async with cluster(tmp_path, meta_config) as h:
        held = asyncio.ensure_future(
            h.stub.PullBatch(
                ps.PullBatchRequest(
                    group="G", pulls=[entry(q) for q in range(4)], suspend_timeout_ms=30_000
                )
            )
        )
        node = h.nodes["broker-a"]
        await eventually(lambda: node.servicer.hold.held >= 1)
        await h.send("broker-a", 3, b"late")
        got = await asyncio.wait_for(held, 10)
        assert [bodies(x) for x in got.results] == [[], [], [], [b"late"]]
        # A broker that is not readable refuses every entry; nothing is held.
        await h.register_broker("broker-a", node.address, perm=Perm.WRITE)
        await h.seen(lambda s: s.servicer.view.brokers.get("broker-a").perm == Perm.WRITE)
        denied = await h.stub.PullBatch(
            ps.PullBatchRequest(group="G", pulls=[entry(0), entry(1)], suspend_timeout_ms=30_000)
        )
        assert [x.refused.code for x in denied.results] == [pb.RESPONSE_CODE_NO_PERMISSION] * 2


@async_test
async def test_pull_batch_refuses_malformed_calls_and_keeps_serving(
    tmp_path: Path, meta_config: MetaConfig
) -> None:
    async with cluster(tmp_path, meta_config) as h:
        cases = [
            (ps.PullBatchRequest(group="", pulls=[entry(0)]), "group must not be empty"),
            (ps.PullBatchRequest(group="G"), "0 pulls"),
            (
                ps.PullBatchRequest(group="G", pulls=[entry(q % 4, q) for q in range(33)]),
                "33 pulls",
            ),
            (
                ps.PullBatchRequest(
                    group="G", pulls=[entry(0), pull_request("broker-b", 0, group="")]
                ),
                "reads one broker",
            ),
            (ps.PullBatchRequest(group="G", pulls=[entry(1), entry(1)]), "pulled twice"),
            (
                ps.PullBatchRequest(group="G", pulls=[pull_request("broker-a", 0, group="H")]),
                "'H' is not the call's 'G'",
            ),
            (
                ps.PullBatchRequest(group="G", pulls=[entry(0, suspend_timeout_ms=5)]),
                "no suspend_timeout_ms",
            ),
            (ps.PullBatchRequest(group="G", pulls=[entry(0)], suspend_timeout_ms=-1), "negative"),
        ]
        for request, words in cases:
            status, code, message = await refused(h.stub.PullBatch(request))
            assert status == grpc.StatusCode.INVALID_ARGUMENT, message
            assert code == pb.RESPONSE_CODE_INVALID_PARAMETER
            assert words in message
        await h.send("broker-a", 0, b"still")
        ok = await h.stub.PullBatch(ps.PullBatchRequest(group="G", pulls=[entry(0)]))
        assert bodies(ok.results[0]) == [b"still"]
