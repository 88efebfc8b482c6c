"""The PullService over real etcd, real store-nodes and real grpc.aio servers on port 0.

Two store-nodes run in-process (``start_store_node`` over etcd-backed topics)
and register in etcd as the store-node process does; pull-services run
in-process too. Every refusal is checked for its gRPC status, its RocketMQ
code and a message that says what was wrong, and the service must keep
serving after each. Sessions have their own file (test_pull_sessions.py),
real processes theirs (test_pull_process.py). The cluster is
:func:`tests.support.nodes.cluster`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import grpc
import pytest

from basalt.services.cluster.etcd import EtcdProcess, free_port
from basalt.services.errors import pull_outcome
from basalt.services.meta import BrokerRegistration, MetaConfig, Perm, TopicConfig
from basalt.services.pull_service.service import SCOPE_KEY, SCOPE_LOCAL
from basalt.v1 import common_pb2 as pb
from basalt.v1 import pull_service_pb2 as ps
from basalt.v1 import store_node_pb2 as sn
from tests.support.aio import async_test
from tests.support.etcd import unique_cluster
from tests.support.nodes import BROKERS, TOPIC, cluster
from tests.support.polling import eventually
from tests.support.rpc import bodies, pull_queue, pull_request, refused

# -- the outcome table (no network) ---------------------------------------------------


@pytest.mark.parametrize(
    ("store_status", "offset", "code", "status"),
    [
        ("FOUND", 5, "SUCCESS", "FOUND"),
        ("NO_MATCHED_MESSAGE", 5, "PULL_RETRY_IMMEDIATELY", "NO_MATCHED_MSG"),
        ("MESSAGE_WAS_REMOVING", 5, "PULL_RETRY_IMMEDIATELY", "NO_MATCHED_MSG"),
        ("OFFSET_FOUND_NULL", 5, "PULL_NOT_FOUND", "NO_NEW_MSG"),
        ("OFFSET_OVERFLOW_ONE", 5, "PULL_NOT_FOUND", "NO_NEW_MSG"),
        ("OFFSET_OVERFLOW_BADLY", 5, "PULL_OFFSET_MOVED", "OFFSET_ILLEGAL"),
        ("OFFSET_TOO_SMALL", 5, "PULL_OFFSET_MOVED", "OFFSET_ILLEGAL"),
        ("NO_MATCHED_LOGIC_QUEUE", 0, "PULL_NOT_FOUND", "NO_NEW_MSG"),
        ("NO_MATCHED_LOGIC_QUEUE", 5, "PULL_OFFSET_MOVED", "OFFSET_ILLEGAL"),
        ("NO_MESSAGE_IN_QUEUE", 0, "PULL_NOT_FOUND", "NO_NEW_MSG"),
        ("NO_MESSAGE_IN_QUEUE", 5, "PULL_OFFSET_MOVED", "OFFSET_ILLEGAL"),
    ],
)
def test_store_status_maps_to_code_and_pull_status_by_rocketmqs_table(
    store_status: str, offset: int, code: str, status: str
) -> None:
    assert pull_outcome(
        pb.GetMessageStatus.Value("GET_MESSAGE_STATUS_" + store_status), offset
    ) == (
        pb.ResponseCode.Value("RESPONSE_CODE_" + code),
        pb.PullStatus.Value("PULL_STATUS_" + status),
    )


def test_an_unknown_store_status_is_a_system_error() -> None:
    from basalt.services.errors import Refusal

    with pytest.raises(Refusal) as e:
        pull_outcome(pb.GET_MESSAGE_STATUS_UNSPECIFIED, 0)
    assert e.value.code == pb.RESPONSE_CODE_SYSTEM_ERROR
    assert "UNSPECIFIED" in e.value.message


# -- routes -------------------------------------------------------------------------


@async_test
async def test_query_route_gives_brokers_addresses_queue_counts_and_perms(
    tmp_path: Path, meta_config: MetaConfig
) -> None:
    async with cluster(tmp_path, meta_config) as h:
        # broker-c hosts the topic on paper but is not registered: it is down.
        await h.create_topic(
            TopicConfig(
                topic_name="Routed",
                read_queue_nums=8,
                write_queue_nums=6,
                perm=Perm.READ,
                brokers=("broker-a", "broker-c", "broker-b"),
                order=True,
            )
        )
        route = (await h.stub.QueryRoute(ps.QueryRouteRequest(topic="Routed"))).route
        assert route.topic == "Routed" and route.order
        assert [
            (q.broker_name, q.read_queue_nums, q.write_queue_nums, q.perm)
            for q in route.queue_datas
        ] == [
            ("broker-a", 8, 6, 4),
            ("broker-c", 8, 6, 4),
            ("broker-b", 8, 6, 4),
        ]
        assert [(b.broker_name, b.address, b.perm) for b in route.broker_datas] == [
            ("broker-a", h.nodes["broker-a"].address, 6),
            ("broker-b", h.nodes["broker-b"].address, 6),
        ]
        # The store host is the one the store-node writes into its records.
        store_host = h.nodes["broker-a"].store.config.store_host
        assert route.broker_datas[0].store_host == store_host

        status, code, details = await refused(h.stub.QueryRoute(ps.QueryRouteRequest(topic="Nope")))
        assert (status, code) == (grpc.StatusCode.NOT_FOUND, pb.RESPONSE_CODE_TOPIC_NOT_EXIST)
        assert "'Nope' does not exist" in details


@async_test
async def test_routes_give_clients_the_client_address_and_pulls_dial_the_address(
    tmp_path: Path, meta_config: MetaConfig
) -> None:
    async with cluster(tmp_path, meta_config) as h:
        node = h.nodes["broker-a"]
        # An address only clients could reach (Kafka's external listener): the
        # pull-service must keep dialing the registered address.
        await h.meta.register(
            BrokerRegistration(
                broker_name="broker-a",
                address=node.address,
                client_address="broker-a.example.com:30911",
                store_root_id="root-broker-a",
                started_at_ms=1,
            )
        )
        await h.seen(
            lambda s: (
                (b := s.servicer.view.brokers.get("broker-a")) is not None
                and b.client_address != ""
            )
        )
        route = (await h.stub.QueryRoute(ps.QueryRouteRequest(topic=TOPIC))).route
        assert {b.broker_name: b.address for b in route.broker_datas} == {
            "broker-a": "broker-a.example.com:30911",
            "broker-b": h.nodes["broker-b"].address,
        }
        await h.send("broker-a", 0, b"through the address")
        assert await pull_queue(h.stub, "broker-a", 0) == [b"through the address"]


# -- pulls --------------------------------------------------------------------------


@async_test
async def test_pull_across_two_store_nodes_every_message_once_in_order_with_filters(
    tmp_path: Path, meta_config: MetaConfig
) -> None:
    async with cluster(tmp_path, meta_config) as h:
        sent: dict[tuple[str, int], list[bytes]] = {}
        for broker in BROKERS:
            for q in range(4):
                for i in range(40):  # more than one pull's worth (32) per queue
                    body = f"{broker}/{q}/{i}".encode()
                    tag = ("TagA", "TagB", "TagC")[i % 3]
                    await h.send(broker, q, body, tags=tag, properties={"n": str(i)})
                    sent.setdefault((broker, q), []).append(body)
        for (broker, q), expected in sent.items():
            assert await pull_queue(h.stub, broker, q) == expected
            tags = pb.Subscription(type=pb.EXPRESSION_TYPE_TAG, expression="TagA || TagC")
            assert await pull_queue(h.stub, broker, q, group="GTag", subscription=tags) == [
                b for i, b in enumerate(expected) if i % 3 != 1
            ]
            sql = pb.Subscription(type=pb.EXPRESSION_TYPE_SQL92, expression="n >= 30 AND n < 35")
            assert (
                await pull_queue(h.stub, broker, q, group="GSql", subscription=sql)
                == expected[30:35]
            )
        # The commit carried by the last pull of each queue was stored by its store-node.
        offset = await h.node_stubs["broker-b"].QueryConsumerOffset(
            sn.QueryConsumerOffsetRequest(group="G", topic=TOPIC, queue_id=3)
        )
        assert offset.offset == 40
        r = await h.stub.Pull(pull_request("broker-a", 0, 40, commit_offset=40, reset_epoch=0))
        assert r.status == pb.PULL_STATUS_NO_NEW_MSG and r.code == pb.RESPONSE_CODE_PULL_NOT_FOUND
        assert r.store_status == pb.GET_MESSAGE_STATUS_OFFSET_OVERFLOW_ONE
        assert (r.min_offset, r.max_offset, r.next_begin_offset) == (0, 40, 40)
        assert r.commit.code == pb.RESPONSE_CODE_SUCCESS
        # An offset past the end: RocketMQ's correction is the min offset when it
        # is 0 (a queue that never expired anything), else the max.
        moved = await h.stub.Pull(pull_request("broker-a", 0, 99))
        assert (moved.status, moved.code) == (
            pb.PULL_STATUS_OFFSET_ILLEGAL,
            pb.RESPONSE_CODE_PULL_OFFSET_MOVED,
        )
        assert moved.next_begin_offset == 0


@async_test
async def test_long_polling_through_pull_wakes_on_arrival_and_times_out_empty(
    tmp_path: Path, meta_config: MetaConfig
) -> None:
    async with cluster(tmp_path, meta_config) as h:
        pending = asyncio.ensure_future(
            h.stub.Pull(pull_request("broker-b", 2, 0, suspend_timeout_ms=20_000), timeout=30)
        )
        await asyncio.sleep(0.2)
        assert not pending.done()
        await h.send("broker-b", 2, b"wake")
        got = await asyncio.wait_for(pending, 10)  # well before the 20 s suspend timeout
        assert got.status == pb.PULL_STATUS_FOUND and bodies(got) == [b"wake"]
        empty = await h.stub.Pull(pull_request("broker-b", 2, 1, suspend_timeout_ms=300))
        assert (empty.status, empty.code) == (
            pb.PULL_STATUS_NO_NEW_MSG,
            pb.RESPONSE_CODE_PULL_NOT_FOUND,
        )
        assert empty.records.count == 0 and empty.next_begin_offset == 1


@async_test
async def test_queue_counts_changed_in_etcd_apply_without_restart(
    tmp_path: Path, meta_config: MetaConfig
) -> None:
    async with cluster(tmp_path, meta_config) as h:
        await h.send("broker-a", 3, b"before")
        await h.update_topic(TOPIC, write_queue_nums=2)

        async def send_refused() -> bool:  # once the store-node's watch cache has the change
            try:
                await h.send("broker-a", 3, b"after")
            except grpc.aio.AioRpcError as e:
                assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert "2 write queues" in (e.details() or "")
                return True
            return False

        # Within a second: a send to a removed queue is not accepted past that.
        await eventually(
            send_refused, timeout_s=1.0, interval_s=0.01, what="a send to a removed queue refused"
        )
        # Queue 3 is still readable (read_queue_nums 4): it drains.
        assert bodies(await h.stub.Pull(pull_request("broker-a", 3)))[0] == b"before"

        status, code, _ = await refused(h.stub.Pull(pull_request("broker-a", 6)))
        assert (status, code) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            pb.RESPONSE_CODE_INVALID_PARAMETER,
        )
        await h.update_topic(TOPIC, read_queue_nums=8)
        r = pb.PullResponse()

        async def pulled() -> bool:
            nonlocal r
            try:
                r = await h.stub.Pull(pull_request("broker-a", 6))
            except grpc.aio.AioRpcError as e:
                assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
                return False
            return True

        # Within a second: a pull of a new read queue is not refused past that.
        await eventually(
            pulled, timeout_s=1.0, interval_s=0.01, what="a pull of a new read queue served"
        )
        assert (r.status, r.code) == (pb.PULL_STATUS_NO_NEW_MSG, pb.RESPONSE_CODE_PULL_NOT_FOUND)


@async_test
async def test_every_bad_pull_is_refused_in_pull_message_processor_order_and_keeps_serving(
    tmp_path: Path, meta_config: MetaConfig
) -> None:
    async with cluster(tmp_path, meta_config) as h:
        await h.register_broker("broker-w", "127.0.0.1:1", perm=Perm.WRITE)
        await h.create_topic(TopicConfig(topic_name="WriteOnly", perm=Perm.WRITE, brokers=BROKERS))
        await h.send("broker-a", 0, b"kept")
        bad_sql = pb.Subscription(type=pb.EXPRESSION_TYPE_SQL92, expression="a > AND 3")
        invalid, not_found = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND
        denied, unavailable = grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAVAILABLE
        cases: list[tuple[ps.PullRequest, grpc.StatusCode, int, str]] = [
            (
                pull_request(group=""),
                invalid,
                pb.RESPONSE_CODE_INVALID_PARAMETER,
                "group must not be empty",
            ),
            (
                pull_request(group="no spaces"),
                invalid,
                pb.RESPONSE_CODE_INVALID_PARAMETER,
                "group 'no spaces'",
            ),
            (
                pull_request(offset=-1),
                invalid,
                pb.RESPONSE_CODE_INVALID_PARAMETER,
                "offset -1 is negative",
            ),
            (pull_request(max_nums=0), invalid, pb.RESPONSE_CODE_INVALID_PARAMETER, "max_nums 0"),
            (
                pull_request(suspend_timeout_ms=-5),
                invalid,
                pb.RESPONSE_CODE_INVALID_PARAMETER,
                "suspend_timeout_ms -5 is negative",
            ),
            (
                pull_request("nobody"),
                unavailable,
                pb.RESPONSE_CODE_BROKER_NOT_EXIST,
                "'nobody' is not registered",
            ),
            (pull_request("broker-w"), denied, pb.RESPONSE_CODE_NO_PERMISSION, "broker 'broker-w'"),
            (
                pull_request(topic="Nope"),
                not_found,
                pb.RESPONSE_CODE_TOPIC_NOT_EXIST,
                "'Nope' does not exist",
            ),
            (
                pull_request(topic="WriteOnly"),
                denied,
                pb.RESPONSE_CODE_NO_PERMISSION,
                "topic 'WriteOnly'",
            ),
            (
                pull_request(queue_id=4),
                invalid,
                pb.RESPONSE_CODE_INVALID_PARAMETER,
                "has 4 read queues",
            ),
            (pull_request(queue_id=-1), invalid, pb.RESPONSE_CODE_INVALID_PARAMETER, "queue id -1"),
            (
                pull_request(subscription=bad_sql),
                invalid,
                pb.RESPONSE_CODE_SUBSCRIPTION_PARSE_FAILED,
                "position 4",
            ),
            (
                pull_request(subscription=pb.Subscription(type=7, expression="x")),  # type: ignore[arg-type]
                invalid,
                pb.RESPONSE_CODE_SUBSCRIPTION_PARSE_FAILED,
                "7",
            ),
            # Seed 001's order: the first failing check answers.
            (
                pull_request("nobody", topic="Nope"),
                unavailable,
                pb.RESPONSE_CODE_BROKER_NOT_EXIST,
                "nobody",
            ),
            (
                pull_request("broker-w", topic="Nope"),
                denied,
                pb.RESPONSE_CODE_NO_PERMISSION,
                "broker",
            ),
            (
                pull_request(topic="Nope", queue_id=99),
                not_found,
                pb.RESPONSE_CODE_TOPIC_NOT_EXIST,
                "Nope",
            ),
            (
                pull_request(topic="WriteOnly", queue_id=99),
                denied,
                pb.RESPONSE_CODE_NO_PERMISSION,
                "WriteOnly",
            ),
            (
                pull_request(queue_id=99, subscription=bad_sql),
                invalid,
                pb.RESPONSE_CODE_INVALID_PARAMETER,
                "read queues",
            ),
        ]
        for request, status, code, words in cases:
            got_status, got_code, details = await refused(h.stub.Pull(request))
            assert (got_status, got_code) == (status, code), (request, details)
            assert words in details, details
            # Still serving, and what was stored is still there:
            ok = await h.stub.Pull(pull_request())
            assert bodies(ok) == [b"kept"]


@async_test
async def test_bad_consumer_admin_requests_are_refused_clearly(
    tmp_path: Path, meta_config: MetaConfig
) -> None:
    async with cluster(tmp_path, meta_config, brokers=(), topic=None) as h:
        rebalance = ps.Command(rebalance=ps.RebalanceCommand())
        cases: list[tuple[Awaitable[Any], int, str]] = [
            (
                h.stub.ListConsumers(ps.ListConsumersRequest(group="")),
                29,
                "group must not be empty",
            ),
            (h.stub.ListConsumers(ps.ListConsumersRequest(group="a/b")), 29, "group 'a/b'"),
            (h.stub.NotifyConsumers(ps.NotifyConsumersRequest(group="G")), 29, "no body"),
            (
                h.stub.NotifyConsumers(ps.NotifyConsumersRequest(group="", command=rebalance)),
                29,
                "group must not be empty",
            ),
            (
                h.stub.NotifyConsumers(
                    ps.NotifyConsumersRequest(
                        group="G",
                        command=ps.Command(timeout_ms=-1, rebalance=ps.RebalanceCommand()),
                    )
                ),
                29,
                "timeout_ms -1",
            ),
        ]
        for call, code, words in cases:
            status, got_code, details = await refused(call)
            assert (status, got_code) == (grpc.StatusCode.INVALID_ARGUMENT, code), details
            assert words in details, details
            # The service keeps serving; a group with no live consumer is not online.
            status, got_code, details = await refused(
                h.stub.ListConsumers(ps.ListConsumersRequest(group="G"))
            )
            assert (status, got_code) == (
                grpc.StatusCode.NOT_FOUND,
                pb.RESPONSE_CODE_CONSUMER_NOT_ONLINE,
            )
            assert "consumer group 'G' has no live consumer" in details
        status, got_code, details = await refused(
            h.stub.NotifyConsumers(ps.NotifyConsumersRequest(group="G", command=rebalance))
        )
        assert (status, got_code) == (
            grpc.StatusCode.NOT_FOUND,
            pb.RESPONSE_CODE_CONSUMER_NOT_ONLINE,
        )
        local = await h.stub.ListConsumers(
            ps.ListConsumersRequest(group="G"), metadata=((SCOPE_KEY, SCOPE_LOCAL),)
        )
        assert list(local.consumers) == []


@async_test
async def test_an_unreachable_store_node_fails_its_pulls_only(
    tmp_path: Path, meta_config: MetaConfig
) -> None:
    async with cluster(tmp_path, meta_config, brokers=("broker-a",)) as h:
        await h.register_broker("broker-gone", f"127.0.0.1:{free_port()}")
        await h.update_topic(TOPIC, brokers=("broker-a", "broker-gone"))
        await h.send("broker-a", 1, b"fine")
        for _ in range(2):  # and again: the cached channel does not wedge the service
            status, code, details = await refused(
                h.stub.Pull(pull_request("broker-gone", 1), timeout=20)
            )
            assert (status, code) == (
                grpc.StatusCode.UNAVAILABLE,
                pb.RESPONSE_CODE_SERVICE_NOT_AVAILABLE,
            )
            assert "store-node 'broker-gone'" in details and "unreachable" in details
            assert bodies(await h.stub.Pull(pull_request("broker-a", 1))) == [b"fine"]
        route = (await h.stub.QueryRoute(ps.QueryRouteRequest(topic=TOPIC))).route
        gone = [b for b in route.broker_datas if b.broker_name == "broker-gone"]
        assert gone and gone[0].store_host == ""  # unknown until it answers
        # It comes back at another address (a restart on a new port): pulls follow
        # the registration, and the old address's channel is let go.
        dead = gone[0].address
        pool = h.services[0].servicer.channels
        assert dead in pool._channels
        await h.register_broker("broker-gone", h.nodes["broker-a"].address)
        await h.seen(lambda s: s.servicer.view.brokers.get("broker-gone").address != dead)
        assert bodies(await h.stub.Pull(pull_request("broker-gone", 1))) == [b"fine"]
        assert dead not in pool._channels


@async_test
async def test_with_etcd_away_pulls_and_routes_serve_from_the_caches(
    tmp_path: Path, private_etcd: EtcdProcess
) -> None:
    config = MetaConfig(
        endpoints=(private_etcd.endpoint,), cluster=unique_cluster(), op_timeout_s=1.0
    )
    async with cluster(tmp_path, config) as h:
        await h.send("broker-b", 0, b"cached")
        await asyncio.to_thread(private_etcd.stop)
        route = (await h.stub.QueryRoute(ps.QueryRouteRequest(topic=TOPIC))).route
        assert len(route.broker_datas) == 2
        assert bodies(await h.stub.Pull(pull_request("broker-b", 0))) == [b"cached"]
        # What needs etcd now says so, rather than answering from a partial view.
        status, code, details = await refused(
            h.stub.ListConsumers(ps.ListConsumersRequest(group="G"))
        )
        assert (status, code) == (
            grpc.StatusCode.UNAVAILABLE,
            pb.RESPONSE_CODE_SERVICE_NOT_AVAILABLE,
        )
        assert "etcd" in details and "unreachable" in details
        await asyncio.to_thread(private_etcd.start)
        status, code, _ = await refused(
            h.stub.ListConsumers(ps.ListConsumersRequest(group="G"), timeout=10)
        )
        assert code == pb.RESPONSE_CODE_CONSUMER_NOT_ONLINE  # etcd answers again
