"""Consumer sessions on real pull-services and real etcd: registration, commands and
acks, every way a session ends, and commands across two pull-services."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import grpc
import pytest

from basalt.services.meta import MetaClient, MetaConfig
from basalt.services.pull_service.service import SCOPE_KEY, SCOPE_LOCAL
from basalt.v1 import common_pb2 as pb
from basalt.v1 import pull_service_pb2 as ps
from tests.support.aio import async_test
from tests.support.nodes import cluster
from tests.support.polling import eventually
from tests.support.rpc import status_of
from tests.support.sessions import Consumer

#: Short, so that a silent session ends quickly (the timeout is 3 x this).
HEARTBEAT_MS = 300


def sessions(tmp_path: Path, meta_config: MetaConfig, *pull_services: str) -> Any:
    """A cluster of pull-services only (sessions need no store-node)."""
    return cluster(
        tmp_path,
        meta_config,
        brokers=(),
        pull_services=pull_services or ("ps-1",),
        heartbeat_interval_ms=HEARTBEAT_MS,
        topic=None,
    )


async def registered(meta: MetaClient, group: str = "G") -> dict[str, str]:
    """client id -> pull-service id of the group's consumers in etcd."""
    return {c: r.pull_service_id for c, r in (await meta.list_consumers(group)).items()}


def rebalance(timeout_ms: int = 5_000, command_id: str = "") -> ps.Command:
    return ps.Command(
        command_id=command_id, timeout_ms=timeout_ms, rebalance=ps.RebalanceCommand(topics=["T"])
    )


def outcomes(reply: ps.NotifyConsumersResponse) -> list[tuple[str, str]]:
    return [(a.client_id, ps.CommandOutcome.Name(a.outcome)[16:]) for a in reply.acks]


@async_test
async def test_open_registers_in_etcd_commands_are_acked_and_close_deregisters(
    tmp_path: Path, meta_config: MetaConfig
) -> None:
    async with sessions(tmp_path, meta_config) as h:
        sub = pb.TopicSubscription(
            topic="T",
            subscription=pb.Subscription(type=pb.EXPRESSION_TYPE_SQL92, expression="a > 1"),
        )
        c1 = Consumer(h.stub, "10.0.0.1@1")
        opened = await c1.open(sub)
        assert opened.pull_service_id == "ps-1"
        assert (opened.heartbeat_interval_ms, opened.session_timeout_ms) == (300, 900)
        # Registered by the time `opened` arrives, under the pull-service's id.
        assert await registered(h.meta) == {"10.0.0.1@1": "ps-1"}
        value = (await h.meta.list_consumers("G"))["10.0.0.1@1"]
        assert value.subscriptions[0].expression == "a > 1"
        assert value.client_version == "basalt-test 0.1"
        assert value.connected_since_ms > 0
        c2 = Consumer(h.stub, "10.0.0.2@2", answer=lambda c: (False, "cannot rebalance now"))
        await c2.open()

        listed = await h.stub.ListConsumers(ps.ListConsumersRequest(group="G"))
        assert [c.client_id for c in listed.consumers] == ["10.0.0.1@1", "10.0.0.2@2"]
        first = listed.consumers[0]
        assert first.connected_since_ms == value.connected_since_ms
        assert first.subscriptions[0].topic == "T"

        reply = await h.stub.NotifyConsumers(
            ps.NotifyConsumersRequest(group="G", command=rebalance(), client_ids=["10.0.0.9@9"])
        )
        assert outcomes(reply) == [("10.0.0.9@9", "NOT_CONNECTED")]
        reply = await h.stub.NotifyConsumers(
            ps.NotifyConsumersRequest(group="G", command=rebalance())
        )
        assert reply.command_id.startswith("ps-1-")  # assigned by the service
        assert outcomes(reply) == [("10.0.0.1@1", "OK"), ("10.0.0.2@2", "FAILED")]
        assert [a.detail for a in reply.acks] == ["done", "cannot rebalance now"]
        # The consumer saw the general envelope with the id the reply names.
        assert c1.commands[0].command_id == reply.command_id
        assert c1.commands[0].WhichOneof("body") == "rebalance"

        await c1.close()
        assert c1.ended.result() is None  # a clean end: status OK
        await eventually(lambda: _equals(registered(h.meta), {"10.0.0.2@2": "ps-1"}))
        await c2.cancel()  # vanishes: the service notices and deregisters it too
        await eventually(lambda: _equals(registered(h.meta), {}))
        assert len(h.services[0].servicer.sessions) == 0


async def _equals(value: Awaitable[Any], expected: Any) -> bool:
    return bool(await value == expected)


@async_test
async def test_no_ack_in_time_is_timeout_and_a_session_that_ends_first_is_disconnected(
    tmp_path: Path, meta_config: MetaConfig
) -> None:
    async with sessions(tmp_path, meta_config) as h:
        mute = Consumer(h.stub, "mute", answer=lambda c: None)
        await mute.open()
        started = time.monotonic()
        reply = await h.stub.NotifyConsumers(
            ps.NotifyConsumersRequest(group="G", command=rebalance(timeout_ms=300))
        )
        assert outcomes(reply) == [("mute", "TIMEOUT")]
        assert time.monotonic() - started < 5  # answered at the command's timeout
        assert len(mute.commands) == 1

        pending = asyncio.ensure_future(
            h.stub.NotifyConsumers(ps.NotifyConsumersRequest(group="G", command=rebalance(20_000)))
        )
        await eventually(lambda: len(mute.commands) >= 2)
        await mute.cancel()
        reply = await asyncio.wait_for(pending, 10)  # well before the 20 s timeout
        assert outcomes(reply) == [("mute", "DISCONNECTED")]


@async_test
async def test_a_session_must_open_first_and_only_once(
    tmp_path: Path, meta_config: MetaConfig
) -> None:
    async with sessions(tmp_path, meta_config) as h:
        call = h.stub.Session()
        await call.write(ps.SessionRequest(heartbeat=ps.Heartbeat()))
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await call.read()
        status, code, details = status_of(e.value)
        assert (status, code) == (
            grpc.StatusCode.FAILED_PRECONDITION,
            pb.RESPONSE_CODE_INVALID_PARAMETER,
        )
        assert "first frame of a session must be open, got heartbeat" in details

        c = Consumer(h.stub, "twice")
        await c.open()
        await c._write(ps.SessionRequest(open=ps.OpenSession(group="G", client_id="twice")))
        status, code, details = status_of(await asyncio.wait_for(c.ended, 10))
        assert status == grpc.StatusCode.FAILED_PRECONDITION
        assert "already open" in details
        await eventually(lambda: _equals(registered(h.meta), {}))
        # Still serving:
        ok = Consumer(h.stub, "after")
        await ok.open()
        assert await registered(h.meta) == {"after": "ps-1"}
        await ok.close()


@async_test
async def test_bad_open_frames_are_refused_clearly(tmp_path: Path, meta_config: MetaConfig) -> None:
    async with sessions(tmp_path, meta_config) as h:
        sql = pb.EXPRESSION_TYPE_SQL92
        cases: list[tuple[ps.OpenSession, int, str]] = [
            (ps.OpenSession(group="", client_id="c"), 29, "group must not be empty"),
            (ps.OpenSession(group="G", client_id=""), 29, "client_id must not be empty"),
            (ps.OpenSession(group="G", client_id="a b"), 29, "client id 'a b'"),
            (
                ps.OpenSession(
                    group="G",
                    client_id="c",
                    subscriptions=[
                        pb.TopicSubscription(
                            topic="T", subscription=pb.Subscription(type=sql, expression="a >")
                        )
                    ],
                ),
                pb.RESPONSE_CODE_SUBSCRIPTION_PARSE_FAILED,
                "position 3",
            ),
            (
                ps.OpenSession(
                    group="G",
                    client_id="c",
                    subscriptions=[pb.TopicSubscription(topic="bad topic")],
                ),
                29,
                "topic 'bad topic'",
            ),
        ]
        for request, code, words in cases:
            call = h.stub.Session()
            await call.write(ps.SessionRequest(open=request))
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await call.read()
            status, got_code, details = status_of(e.value)
            assert (status, got_code) == (grpc.StatusCode.INVALID_ARGUMENT, code), details
            assert words in details, details
        assert await registered(h.meta) == {}


@async_test
async def test_a_silent_session_is_closed_and_a_newer_session_replaces_an_older(
    tmp_path: Path, meta_config: MetaConfig
) -> None:
    async with sessions(tmp_path, meta_config) as h:
        silent = Consumer(h.stub, "quiet", heartbeat=False)
        await silent.open()
        assert await registered(h.meta) == {"quiet": "ps-1"}
        status, code, details = status_of(await asyncio.wait_for(silent.ended, 10))
        assert (status, code) == (
            grpc.StatusCode.DEADLINE_EXCEEDED,
            pb.RESPONSE_CODE_CONSUMER_NOT_ONLINE,
        )
        assert "no frame from consumer G/quiet for 900 ms" in details
        await eventually(lambda: _equals(registered(h.meta), {}))

        old = Consumer(h.stub, "same")
        await old.open()
        new = Consumer(h.stub, "same")
        await new.open()
        status, _, details = status_of(await asyncio.wait_for(old.ended, 10))
        assert status == grpc.StatusCode.ABORTED and "newer session" in details
        # The newer session holds the registration and gets the commands.
        assert await registered(h.meta) == {"same": "ps-1"}
        reply = await h.stub.NotifyConsumers(
            ps.NotifyConsumersRequest(group="G", command=rebalance())
        )
        assert outcomes(reply) == [("same", "OK")]
        assert (len(old.commands), len(new.commands)) == (0, 1)
        await new.close()


@async_test
async def test_list_and_notify_reach_consumers_across_two_pull_services(
    tmp_path: Path, meta_config: MetaConfig
) -> None:
    async with sessions(tmp_path, meta_config, "ps-1", "ps-2") as h:
        on_1 = Consumer(h.stubs[0], "c1")
        on_2a = Consumer(h.stubs[1], "c2a")
        on_2b = Consumer(h.stubs[1], "c2b", answer=lambda c: (False, "busy"))
        opened_from_ms = int(time.time() * 1000)
        for c in (on_1, on_2a, on_2b):
            await c.open()
        opened_by_ms = int(time.time() * 1000)
        assert await registered(h.meta) == {"c1": "ps-1", "c2a": "ps-2", "c2b": "ps-2"}

        since: list[dict[str, int]] = []
        for stub in h.stubs:  # either pull-service lists the whole group
            listed = await stub.ListConsumers(ps.ListConsumersRequest(group="G"))
            assert [(c.client_id, c.pull_service_id) for c in listed.consumers] == [
                ("c1", "ps-1"),
                ("c2a", "ps-2"),
                ("c2b", "ps-2"),
            ]
            since.append({c.client_id: c.connected_since_ms for c in listed.consumers})
        # Each session's real start, the same whether the session is held by the
        # answering pull-service or by the other one (read from etcd).
        assert since[0] == since[1]
        assert all(opened_from_ms <= t <= opened_by_ms for t in since[0].values()), since
        local = await h.stubs[1].ListConsumers(
            ps.ListConsumersRequest(group="G"), metadata=((SCOPE_KEY, SCOPE_LOCAL),)
        )
        assert [c.client_id for c in local.consumers] == ["c2a", "c2b"]

        reply = await h.stubs[0].NotifyConsumers(
            ps.NotifyConsumersRequest(group="G", command=rebalance(command_id="reset-1"))
        )
        assert reply.command_id == "reset-1"
        assert outcomes(reply) == [("c1", "OK"), ("c2a", "OK"), ("c2b", "FAILED")]
        assert [c.commands[0].command_id for c in (on_1, on_2a, on_2b)] == ["reset-1"] * 3
        only = await h.stubs[0].NotifyConsumers(
            ps.NotifyConsumersRequest(group="G", command=rebalance(), client_ids=["c2a", "gone"])
        )
        assert outcomes(only) == [("c2a", "OK"), ("gone", "NOT_CONNECTED")]
        local_only = await h.stubs[0].NotifyConsumers(
            ps.NotifyConsumersRequest(group="G", command=rebalance(), client_ids=["c2a"]),
            metadata=((SCOPE_KEY, SCOPE_LOCAL),),
        )
        assert outcomes(local_only) == [("c2a", "NOT_CONNECTED")]
        assert "ps-1" in local_only.acks[0].detail

        # ps-2 stops: its sessions end (UNAVAILABLE) and leave etcd; ps-1 carries on.
        await h.services[1].stop(grace_s=1)
        h.services.pop(1)
        status, code, _ = status_of(await asyncio.wait_for(on_2a.ended, 10))
        assert (status, code) == (
            grpc.StatusCode.UNAVAILABLE,
            pb.RESPONSE_CODE_SERVICE_NOT_AVAILABLE,
        )
        assert await registered(h.meta) == {"c1": "ps-1"}
        reply = await h.stubs[0].NotifyConsumers(
            ps.NotifyConsumersRequest(group="G", command=rebalance())
        )
        assert outcomes(reply) == [("c1", "OK")]
        await on_1.close()


@async_test
async def test_a_newer_session_on_another_pull_service_replaces_the_older(
    tmp_path: Path, meta_config: MetaConfig
) -> None:
    async with sessions(tmp_path, meta_config, "ps-1", "ps-2") as h:
        old = Consumer(h.stubs[0], "moving")
        await old.open()
        assert await registered(h.meta) == {"moving": "ps-1"}
        new = Consumer(h.stubs[1], "moving")
        await new.open()
        status, code, details = status_of(await asyncio.wait_for(old.ended, 10))
        assert (status, code) == (grpc.StatusCode.ABORTED, pb.RESPONSE_CODE_CONSUMER_NOT_ONLINE)
        assert "newer session on pull-service ps-2" in details
        # The older session's revoked lease did not take the newer's key with it.
        assert await registered(h.meta) == {"moving": "ps-2"}
        reply = await h.stubs[0].NotifyConsumers(
            ps.NotifyConsumersRequest(group="G", command=rebalance())
        )
        assert outcomes(reply) == [("moving", "OK")]
        assert (len(old.commands), len(new.commands)) == (0, 1)
        await new.close()
