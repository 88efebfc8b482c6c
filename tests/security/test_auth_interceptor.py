"""The verifying interceptor on a real grpc.aio server (port 0), its users and
ACLs written through AuthStore to a real etcd and read back by its watched
cache. A recording StoreNode servicer shows that a refused call executes
nothing; the Admin service's user and ACL RPCs run behind the same guard."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from basalt.admin.service import start_admin_service
from basalt.common import auth, dial
from basalt.services.auth.cipher import SecretCipher, new_cluster_key
from basalt.services.auth.interceptor import AuthGuard, AuthInterceptor, install
from basalt.services.auth.model import (
    Action,
    Decision,
    Policy,
    ResourcePattern,
    User,
    UserType,
)
from basalt.services.auth.store import AuthCache, AuthStore
from basalt.services.cluster.etcd import EtcdProcess
from basalt.services.meta import MetaClient, MetaConfig
from basalt.services.process import add_health_and_reflection, add_servicer
from basalt.services.pull_service.channels import SEND_STREAM
from basalt.v1 import admin_pb2 as adm
from basalt.v1 import admin_pb2_grpc as adm_grpc
from basalt.v1 import common_pb2 as pb
from basalt.v1 import store_node_pb2 as sn
from basalt.v1 import store_node_pb2_grpc as sn_grpc
from tests.support.aio import async_test
from tests.support.etcd import unique_cluster

Status = grpc.StatusCode
INTERNAL = auth.Credentials("internal", "internal-secret")
ALICE = auth.Credentials("alice", "alice-secret")
ROOT = auth.Credentials("root", "root-secret")
SKEW_S = 60.0


def policy(resources: Sequence[str], actions: set[Action], **kw: Any) -> Policy:
    return Policy(tuple(ResourcePattern(r) for r in resources), frozenset(actions), **kw)


class Recording:
    """A StoreNode that records what it was asked to do."""

    def __init__(self) -> None:
        self.done: list[str] = []

    async def SendMessage(self, request: sn.SendMessageRequest, context: Any) -> Any:
        self.done.append(f"send {request.message.topic}")
        return sn.SendMessageResponse()

    async def GetMessage(self, request: sn.GetMessageRequest, context: Any) -> Any:
        self.done.append(f"get {request.topic}")
        return sn.GetMessageResponse()

    async def SendStream(self, requests: Any, context: Any) -> None:
        while (request := await context.read()) is not grpc.aio.EOF:
            for item in request.items:
                self.done.append(f"stream {item.message.message.topic}")
            await context.write(sn.SendStreamResponse())


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


async def seed(meta: MetaClient, cipher: SecretCipher) -> None:
    store = AuthStore(meta, cipher)
    await store.create_user(User(ALICE.access_key, ALICE.secret_key))
    await store.create_user(User(ROOT.access_key, ROOT.secret_key, UserType.SUPER))
    await store.create_acl("User:alice", policy(["Topic:orders-*"], {Action.PUB}))
    await store.create_acl(
        "User:alice", policy(["Topic:orders-secret"], {Action.PUB}, decision=Decision.DENY)
    )
    await store.create_acl(
        "User:alice", policy(["Topic:lan-*"], {Action.PUB}, source_ips=("10.0.0.0/8",))
    )


@asynccontextmanager
async def guarded(meta_config: MetaConfig, clock: Clock) -> AsyncIterator[tuple[str, Recording]]:
    """The recording StoreNode behind a guard; yields its address."""
    cipher = SecretCipher(new_cluster_key())
    async with MetaClient(meta_config) as meta:
        await seed(meta, cipher)
        guard = AuthGuard(
            lambda: AuthCache(MetaClient(meta_config), cipher),
            INTERNAL,
            clock_skew_s=SKEW_S,
            clock=clock,
        )
        server = grpc.aio.server(interceptors=[AuthInterceptor(guard)])
        servicer = Recording()
        add_servicer(
            server,
            servicer,
            sn.DESCRIPTOR.services_by_name["StoreNode"],
            only=frozenset({"SendMessage", "GetMessage", "SendStream"}),
        )
        add_health_and_reflection(server, "basalt.v1.StoreNode")
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            yield f"127.0.0.1:{port}", servicer
        finally:
            await server.stop(0)
            if guard._cache is not None:
                await guard._cache.users.close()
                await guard._cache.acls.close()


def stub(
    address: str, credentials: auth.Credentials | None, clock: Clock | None = None
) -> tuple[grpc.aio.Channel, sn_grpc.StoreNodeAsyncStub]:
    interceptors = (
        []
        if credentials is None
        else auth.signing_interceptors(credentials, clock=clock or time.time)
    )
    channel = grpc.aio.insecure_channel(address, interceptors=interceptors)
    return channel, sn_grpc.StoreNodeStub(channel)  # type: ignore[return-value]


def send(topic: str) -> sn.SendMessageRequest:
    return sn.SendMessageRequest(message=pb.Message(topic=topic, body=b"x"))


async def refusal(call: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    return caught.value


@async_test
async def test_unsigned_wrong_secret_unknown_user_and_stale_signatures_are_unauthenticated(
    meta_config: MetaConfig, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    caplog.set_level(logging.INFO, logger="basalt.audit")
    async with guarded(meta_config, clock) as (address, servicer):
        for credentials, signed_at, reason in (
            (None, clock.now, "no authorization"),
            (auth.Credentials("alice", "not-her-secret"), clock.now, "does not match"),
            (auth.Credentials("mallory", "whatever"), clock.now, "unknown access key"),
            (ALICE, clock.now - SKEW_S - 5, "outside"),
            (ALICE, clock.now + SKEW_S + 5, "outside"),
        ):
            signer = Clock()
            signer.now = signed_at
            channel, node = stub(address, credentials, signer)
            async with channel:
                error = await refusal(node.SendMessage(send("orders-eu")))
            assert error.code() is Status.UNAUTHENTICATED, reason
            assert reason in (error.details() or "")
            assert "not-her-secret" not in (error.details() or "")
        assert servicer.done == []
        refusals = [r for r in caplog.records if r.name == "basalt.audit"]
        assert len(refusals) == 5
        assert all("SendMessage" in r.getMessage() for r in refusals)


@async_test
async def test_a_replayed_signature_works_inside_the_window_only(meta_config: MetaConfig) -> None:
    clock = Clock()
    async with guarded(meta_config, clock) as (address, servicer):
        metadata = auth.signed_metadata(ALICE, clock.now)
        async with grpc.aio.insecure_channel(address) as channel:
            node = sn_grpc.StoreNodeStub(channel)
            await node.SendMessage(send("orders-eu"), metadata=metadata)
            clock.now += SKEW_S / 2
            await node.SendMessage(send("orders-eu"), metadata=metadata)
            clock.now += SKEW_S
            error = await refusal(node.SendMessage(send("orders-eu"), metadata=metadata))
        assert error.code() is Status.UNAUTHENTICATED
        assert servicer.done == ["send orders-eu"] * 2


@async_test
async def test_acls_decide_prefix_deny_source_ip_and_sub_without_grant(
    meta_config: MetaConfig,
) -> None:
    async with guarded(meta_config, Clock()) as (address, servicer):
        channel, node = stub(address, ALICE)
        async with channel:
            await node.SendMessage(send("orders-eu"))  # Pub on the prefix
            # Node's upper-case hex signs as well.
            upper = [
                (k, v.replace(v.rpartition("=")[2], v.rpartition("=")[2].upper()))
                if k == auth.AUTHORIZATION
                else (k, v)
                for k, v in auth.signed_metadata(ALICE, time.time())
            ]
            async with grpc.aio.insecure_channel(address) as plain:
                await sn_grpc.StoreNodeStub(plain).SendMessage(send("orders-us"), metadata=upper)
            sub = await refusal(node.GetMessage(sn.GetMessageRequest(group="g", topic="orders-eu")))
            assert sub.code() is Status.PERMISSION_DENIED
            assert "Sub on Topic:orders-eu" in (sub.details() or "")
            denied = await refusal(node.SendMessage(send("orders-secret")))
            assert denied.code() is Status.PERMISSION_DENIED
            assert "Pub on Topic:orders-secret" in (denied.details() or "")
            lan = await refusal(node.SendMessage(send("lan-1")))  # 127.0.0.1 is not 10/8
            assert lan.code() is Status.PERMISSION_DENIED
            other = await refusal(node.SendMessage(send("payments")))
            assert other.code() is Status.PERMISSION_DENIED
        assert servicer.done == ["send orders-eu", "send orders-us"]


@async_test
async def test_each_message_of_a_stream_is_authorized(meta_config: MetaConfig) -> None:
    async with guarded(meta_config, Clock()) as (address, servicer):
        # Signed as it opens, as every stream the SDK and the services open.
        async with dial.channel(address, credentials=ALICE) as channel:
            stream = dial.open_stream(
                channel,
                SEND_STREAM,
                sn.SendStreamRequest.SerializeToString,
                sn.SendStreamResponse.FromString,
            )
            for topic in ("orders-eu", "payments"):
                await stream.write(
                    sn.SendStreamRequest(items=[sn.SendStreamItem(message=send(topic))])
                )
            await stream.done_writing()
            error = await refusal(_drain(stream))
        assert error.code() is Status.PERMISSION_DENIED
        assert "Topic:payments" in (error.details() or "")
        assert servicer.done == ["stream orders-eu"]


async def _drain(stream: Any) -> None:
    async for _ in stream:
        pass


@async_test
async def test_super_users_and_the_internal_user_pass_and_health_needs_no_signature(
    meta_config: MetaConfig,
) -> None:
    async with guarded(meta_config, Clock()) as (address, servicer):
        for credentials in (ROOT, INTERNAL):
            channel, node = stub(address, credentials)
            async with channel:
                await node.SendMessage(send("payments"))
                await node.GetMessage(sn.GetMessageRequest(group="g", topic="payments"))
        async with grpc.aio.insecure_channel(address) as channel:
            answer = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest()
            )
            assert answer.status == health_pb2.HealthCheckResponse.SERVING
        assert servicer.done == ["send payments", "get payments"] * 2


@async_test
async def test_etcd_unreachable_keeps_cached_acls_and_refuses_unknown_users(
    private_etcd: EtcdProcess,
) -> None:
    config = MetaConfig(
        endpoints=(private_etcd.endpoint,), cluster=unique_cluster(), op_timeout_s=1.0
    )
    async with guarded(config, Clock()) as (address, servicer):
        channel, node = stub(address, ALICE)
        async with channel:
            await node.SendMessage(send("orders-eu"))  # caches loaded
            private_etcd.stop()
            await node.SendMessage(send("orders-eu"))
            denied = await refusal(node.SendMessage(send("orders-secret")))
            assert denied.code() is Status.PERMISSION_DENIED
        channel, node = stub(address, auth.Credentials("mallory", "whatever"))
        async with channel:
            unknown = await refusal(node.SendMessage(send("orders-eu")))
            assert unknown.code() is Status.UNAUTHENTICATED
        assert servicer.done == ["send orders-eu"] * 2


@async_test
async def test_admin_user_and_acl_rpcs_are_for_super_users_and_never_show_secrets(
    meta_config: MetaConfig, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="basalt.audit")
    cipher = SecretCipher(new_cluster_key())
    async with MetaClient(meta_config) as meta:
        await seed(meta, cipher)
    guard = AuthGuard(
        lambda: AuthCache(MetaClient(meta_config), cipher), INTERNAL, clock_skew_s=SKEW_S
    )
    install(guard)
    try:
        async with MetaClient(meta_config) as meta:
            running = await start_admin_service(meta, cipher=cipher)
            try:
                await _admin_calls(running.address)
            finally:
                await running.stop(0)
    finally:
        install(None)
        if guard._cache is not None:
            await guard._cache.users.close()
            await guard._cache.acls.close()
    lines = [r.getMessage() for r in caplog.records if r.name == "basalt.audit"]
    assert any("admin CreateUser by root" in line and "username=bob" in line for line in lines)
    assert any("refused /basalt.v1.Admin/CreateUser" in line for line in lines)
    assert not any("bob-secret" in line for line in lines)


async def _admin_calls(address: str) -> None:
    def admin(credentials: auth.Credentials) -> tuple[grpc.aio.Channel, Any]:
        channel = grpc.aio.insecure_channel(
            address, interceptors=auth.signing_interceptors(credentials)
        )
        return channel, adm_grpc.AdminStub(channel)

    bob = adm.UserInfo(username="bob", secret_key="bob-secret")
    channel, alice = admin(ALICE)
    async with channel:
        error = await refusal(alice.CreateUser(adm.CreateUserRequest(user=bob)))
        assert error.code() is Status.PERMISSION_DENIED
        error = await refusal(alice.TopicList(adm.TopicListRequest()))
        assert error.code() is Status.PERMISSION_DENIED
        assert "List on Cluster" in (error.details() or "")
    channel, root = admin(ROOT)
    async with channel:
        await root.CreateUser(adm.CreateUserRequest(user=bob))
        again = await refusal(root.CreateUser(adm.CreateUserRequest(user=bob)))
        assert again.code() is Status.ALREADY_EXISTS
        users = (await root.ListUser(adm.ListUserRequest())).users
        assert [u.username for u in users] == ["alice", "bob", "root"]
        assert all(u.secret_key == "" for u in users)
        created = await root.CreateAcl(
            adm.CreateAclRequest(
                subject="User:bob",
                policy=adm.AclPolicy(resources=["Cluster"], actions=["List"]),
            )
        )
        assert list(created.acl.policies[0].actions) == ["List"]
        bad = await refusal(
            root.CreateAcl(
                adm.CreateAclRequest(
                    subject="User:bob", policy=adm.AclPolicy(resources=["Queue:x"], actions=["Pub"])
                )
            )
        )
        assert bad.code() is Status.INVALID_ARGUMENT
        await root.UpdateUser(
            adm.UpdateUserRequest(user=adm.UserInfo(username="bob", user_status="Disable"))
        )
        acls = (await root.ListAcl(adm.ListAclRequest(subject="User:bob"))).acls
        assert [a.subject for a in acls] == ["User:bob"]
        await root.DeleteAcl(adm.DeleteAclRequest(subject="User:bob"))
        await root.DeleteUser(adm.DeleteUserRequest(username="bob"))
        gone = await refusal(root.DeleteUser(adm.DeleteUserRequest(username="bob")))
        assert gone.code() is Status.NOT_FOUND
