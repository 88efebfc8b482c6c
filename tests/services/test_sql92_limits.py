"""SQL92 subscriptions over the limits (issue 14): refused by the store-node and
the pull-service with INVALID_ARGUMENT / SUBSCRIPTION_PARSE_FAILED naming the
limit, before anything is parsed, and both keep serving.

The limits themselves are tested in tests/store/test_sql92.py.
"""

from __future__ import annotations

from pathlib import Path

import grpc

from basalt.services.meta import MetaConfig
from basalt.store.sql92 import MAX_SQL92_LENGTH
from basalt.v1 import common_pb2 as pb
from basalt.v1 import store_node_pb2 as sn
from tests.support.aio import async_test, run
from tests.support.nodes import NODE_TOPIC, cluster, node
from tests.support.rpc import bodies, pull_request, refused, wire

#: Issue 14's hostile filter: an AND chain of 30,000 terms, about 300 KB.
HOSTILE = " AND ".join(f"a = '{i}'" for i in range(30_000))
#: Within the length, over the term limit.
TOO_MANY_TERMS = " OR ".join(["a"] * 300)
GOOD = "a = 'x'"


def sql92(expression: str) -> pb.Subscription:
    return pb.Subscription(type=pb.EXPRESSION_TYPE_SQL92, expression=expression)


def test_store_node_refuses_an_over_limit_subscription_and_keeps_serving(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with node(tmp_path) as (_, stub, _):
            sent = await stub.SendMessage(
                sn.SendMessageRequest(
                    message=wire(NODE_TOPIC, b"match", properties={"a": "x"}), queue_id=0
                )
            )
            assert sent.result.status == pb.SEND_STATUS_SEND_OK

            def get(expression: str) -> sn.GetMessageRequest:
                return sn.GetMessageRequest(
                    group="G",
                    topic=NODE_TOPIC,
                    queue_id=0,
                    max_msg_nums=32,
                    subscription=sql92(expression),
                )

            status, code, message = await refused(stub.GetMessage(get(HOSTILE)))
            assert (status, code) == (
                grpc.StatusCode.INVALID_ARGUMENT,
                pb.RESPONSE_CODE_SUBSCRIPTION_PARSE_FAILED,
            )
            assert f"is {len(HOSTILE)} characters long" in message
            assert f"over the SQL92 length limit of {MAX_SQL92_LENGTH}" in message
            status, code, message = await refused(stub.GetMessage(get(TOO_MANY_TERMS)))
            assert code == pb.RESPONSE_CODE_SUBSCRIPTION_PARSE_FAILED
            assert "has 599 terms, over the SQL92 terms limit of 256" in message
            # The node keeps serving: a normal filtered read finds the message.
            got = await stub.GetMessage(get(GOOD))
            assert got.status == pb.GET_MESSAGE_STATUS_FOUND
            assert got.next_begin_offset == 1

    run(scenario)


@async_test
async def test_pull_service_refuses_an_over_limit_subscription_and_keeps_serving(
    tmp_path: Path, meta_config: MetaConfig
) -> None:
    async with cluster(tmp_path, meta_config) as h:
        await h.send("broker-a", 0, b"match", properties={"a": "x"})
        for expression, says in [
            (HOSTILE, f"over the SQL92 length limit of {MAX_SQL92_LENGTH}"),
            (TOO_MANY_TERMS, "over the SQL92 terms limit of 256"),
        ]:
            status, code, message = await refused(
                h.stub.Pull(pull_request(subscription=sql92(expression)))
            )
            assert (status, code) == (
                grpc.StatusCode.INVALID_ARGUMENT,
                pb.RESPONSE_CODE_SUBSCRIPTION_PARSE_FAILED,
            )
            assert says in message
        r = await h.stub.Pull(pull_request(subscription=sql92(GOOD)))
        assert r.status == pb.PULL_STATUS_FOUND
        assert bodies(r) == [b"match"]
