"""A whole cluster under ``basalt cluster up --auth``: the CLI signs as the
generated admin user, users and ACLs are made with the admin verbs, and the
SDK and the official Python and Node.js producers (subprocesses) are let in
or refused by what those say."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from basalt.client import (
    LitePullConsumer,
    Message,
    NoPermissionError,
    Producer,
)
from basalt.common import auth
from basalt.common.local_cluster import LOCAL_CREDENTIALS
from basalt.v1 import common_pb2 as pb
from basalt.v1 import pull_service_pb2 as ps
from basalt.v1 import pull_service_pb2_grpc as ps_grpc
from basalt.v1 import store_node_pb2 as sn
from basalt.v1 import store_node_pb2_grpc as sn_grpc
from tests.support.aio import async_test
from tests.support.consumers import lite_pull_config
from tests.support.interop import PRODUCERS, ensure_node_modules, produce_signed
from tests.support.polling import eventually
from tests.support.processes import local_cluster, run_basalt_sync

TOPIC = "orders-eu"
ALICE = auth.Credentials("alice", "alice-secret")


@dataclass(frozen=True)
class Cluster:
    data: Path
    pull: str
    v2: str
    admin: str
    store: str

    def basalt(
        self, *argv: str, credentials: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        """``basalt admin VERB ... --server ADMIN``, signed as the admin user
        (or with ``credentials``)."""
        creds = credentials or self.data / LOCAL_CREDENTIALS
        return run_basalt_sync("admin", *argv, "--server", self.admin, "--credentials", str(creds))


def ok(run: subprocess.CompletedProcess[str]) -> str:
    assert run.returncode == 0, run.stdout + run.stderr
    return run.stdout


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    ensure_node_modules()
    data = tmp_path_factory.mktemp("auth") / ".basalt"
    with local_cluster(data, "--store-nodes", "1", "--auth") as rows:
        by_role = {r["role"]: r for r in rows}
        c = Cluster(
            data,
            by_role["pull-service"]["address"],
            by_role["pull-service"]["rocketmq_v2"],
            by_role["admin"]["address"],
            by_role["store-node"]["address"],
        )
        ok(c.basalt("updateTopic", "-t", TOPIC, "-r", "2", "-w", "2"))
        ok(c.basalt("createUser", "-u", ALICE.access_key, "-p", ALICE.secret_key))
        ok(c.basalt("createAcl", "-s", "User:alice", "-r", "Topic:orders-*", "-a", "Pub"))
        yield c


def test_the_generated_admin_user_is_a_file_the_cli_uses_and_lists_no_secret(
    cluster: Cluster,
) -> None:
    admin = auth.Credentials.from_file(cluster.data / LOCAL_CREDENTIALS)
    assert (cluster.data / LOCAL_CREDENTIALS).stat().st_mode & 0o077 == 0
    users = json.loads(ok(cluster.basalt("listUser", "--json")))
    assert {"username": "alice", "user_type": "Normal", "user_status": "Enable"} in users
    listed = ok(cluster.basalt("listUser"))
    assert ALICE.secret_key not in listed and admin.secret_key not in listed
    assert TOPIC in ok(cluster.basalt("topicList"))


def test_the_cli_without_credentials_or_with_a_wrong_secret_is_refused(
    cluster: Cluster, tmp_path: Path
) -> None:
    wrong = tmp_path / "wrong.json"
    auth.Credentials("admin", "not-the-secret").to_file(wrong)
    refused = cluster.basalt("topicList", credentials=wrong)
    assert refused.returncode == 1
    assert "signature does not match" in refused.stderr
    assert "not-the-secret" not in refused.stderr
    unsigned = run_basalt_sync("admin", "topicList", "--server", cluster.admin, cwd=tmp_path)
    assert unsigned.returncode == 1 and "no authorization" in unsigned.stderr


def _pull_batch(cluster: Cluster, group: str) -> ps.PullBatchRequest:
    return ps.PullBatchRequest(
        group=group,
        pulls=[
            ps.PullRequest(
                group=group,
                queue=pb.MessageQueue(topic=TOPIC, broker_name="broker-a", queue_id=0),
                max_nums=1,
            )
        ],
    )


async def _pull(cluster: Cluster, group: str) -> grpc.StatusCode:
    async with grpc.aio.insecure_channel(
        cluster.pull, interceptors=auth.signing_interceptors(ALICE)
    ) as channel:
        try:
            await ps_grpc.PullServiceStub(channel).PullBatch(_pull_batch(cluster, group))
        except grpc.aio.AioRpcError as e:
            return e.code()
        return grpc.StatusCode.OK


@async_test
async def test_pub_without_sub_sends_but_cannot_pull_until_topic_and_group_are_granted(
    cluster: Cluster,
) -> None:
    async with Producer(cluster.pull, group="p", credentials=ALICE) as producer:
        result = await producer.send(Message(TOPIC, b"hello"))
        assert result.msg_id
    assert await _pull(cluster, "alice-group") is grpc.StatusCode.PERMISSION_DENIED
    ok(cluster.basalt("createAcl", "-s", "User:alice", "-r", f"Topic:{TOPIC}", "-a", "Sub"))

    async def refused_on_the_group() -> bool:
        async with grpc.aio.insecure_channel(
            cluster.pull, interceptors=auth.signing_interceptors(ALICE)
        ) as channel:
            try:
                await ps_grpc.PullServiceStub(channel).PullBatch(
                    _pull_batch(cluster, "alice-group")
                )
            except grpc.aio.AioRpcError as e:
                return "Group:alice-group" in (e.details() or "")
        return False

    await eventually(refused_on_the_group, what="the topic's Sub is seen, the group's not")
    ok(cluster.basalt("createAcl", "-s", "User:alice", "-r", "Group:alice-*", "-a", "Sub"))

    async def pulls() -> bool:
        return await _pull(cluster, "alice-group") is grpc.StatusCode.OK

    await eventually(pulls, what="alice pulls once granted Sub on the group")
    # The SDK's consumer (routes, session, pulls, commits) signs all of it.
    consumer = LitePullConsumer(
        cluster.pull,
        config=lite_pull_config("alice-group"),
        credentials=ALICE,
    )
    consumer.subscribe(TOPIC)
    async with consumer:
        got: list[bytes] = []

        async def polled() -> bool:
            got.extend(m.body for m in await consumer.poll(timeout_ms=300))
            return b"hello" in got

        await eventually(polled, what="alice's consumer reads what she sent")
    ok(cluster.basalt("deleteAcl", "-s", "User:alice", "-r", "Group:alice-*"))
    await eventually(lambda: _denied(cluster), what="alice refused again once revoked")


async def _denied(cluster: Cluster) -> bool:
    return await _pull(cluster, "alice-group") is grpc.StatusCode.PERMISSION_DENIED


@async_test
async def test_a_pub_only_users_consumer_is_refused_by_the_store_node_it_reads(
    cluster: Cluster,
) -> None:
    """The SDK's consumers read store-nodes directly (GetMessages): there too a
    user with Pub but not Sub on the topic cannot read. Bob may Get the topic
    (where a consumer starts) and Sub his groups: only the read is left to refuse."""
    bob = auth.Credentials("bob", "bob-secret")
    ok(cluster.basalt("createUser", "-u", bob.access_key, "-p", bob.secret_key))
    ok(
        cluster.basalt(
            "createAcl", "-s", "User:bob", "-r", "Topic:orders-*", "-a", "Pub", "-a", "Get"
        )
    )
    ok(cluster.basalt("createAcl", "-s", "User:bob", "-r", "Group:bob-*", "-a", "Sub"))

    async def sent() -> bool:
        async with Producer(cluster.pull, group="p", credentials=bob) as producer:
            try:
                await producer.send(Message(TOPIC, b"from bob"))
            except NoPermissionError:
                return False  # bob's user or ACL not seen yet
        return True

    await eventually(sent, what="bob's Pub is seen")
    async with grpc.aio.insecure_channel(
        cluster.store, interceptors=auth.signing_interceptors(bob)
    ) as channel:
        read = sn.GetMessageRequest(group="bob-group", topic=TOPIC, queue_id=0, max_msg_nums=1)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await sn_grpc.StoreNodeStub(channel).GetMessages(sn.GetMessagesRequest(reads=[read]))
        assert refused.value.code() is grpc.StatusCode.PERMISSION_DENIED
        assert f"Sub on Topic:{TOPIC}" in (refused.value.details() or "")
    consumer = LitePullConsumer(
        cluster.pull,
        config=lite_pull_config("bob-group"),
        credentials=bob,
    )
    async with consumer:
        await consumer.assign(await consumer.queues_of(TOPIC))
        with pytest.raises(NoPermissionError, match=f"Sub on Topic:{TOPIC}"):
            await consumer.poll(timeout_ms=10_000)
        # Its commits would be refused too (UpdateConsumerOffset is Sub): none on close.
        await consumer.assign([])


@async_test
async def test_an_unsigned_sdk_producer_is_refused_and_stores_nothing(cluster: Cluster) -> None:
    async with Producer(cluster.pull, group="p") as producer:
        with pytest.raises(NoPermissionError, match="no authorization"):
            await producer.send(Message(TOPIC, b"never"))


def test_admin_actions_follow_the_acl(cluster: Cluster, tmp_path: Path) -> None:
    alice = tmp_path / "alice.json"
    ALICE.to_file(alice)
    refused = cluster.basalt("deleteTopic", "-t", TOPIC, credentials=alice)
    assert refused.returncode == 1 and f"Delete on Topic:{TOPIC}" in refused.stderr
    refused = cluster.basalt("createUser", "-u", "eve", "-p", "eve-secret", credentials=alice)
    assert refused.returncode == 1 and "super user" in refused.stderr
    assert TOPIC in ok(cluster.basalt("topicList"))  # nothing deleted


def _produce(client: str, cluster: Cluster, credentials: auth.Credentials | None) -> list[Any]:
    return produce_signed(client, cluster.v2, TOPIC, credentials)


@pytest.mark.parametrize("client", sorted(PRODUCERS))
def test_official_producers_with_credentials_send_and_without_are_refused(
    cluster: Cluster, client: str
) -> None:
    (sent,) = _produce(client, cluster, ALICE)
    assert "message_id" in sent, sent
    before = _refusals(cluster)
    (refused,) = _produce(client, cluster, None)
    assert "error" in refused, refused
    (wrong,) = _produce(client, cluster, auth.Credentials("alice", "not-her-secret"))
    assert "error" in wrong, wrong
    # The clients' errors hide the cause; the audit log names it.
    reasons = _refusals(cluster)[len(before) :]
    assert any("signature does not match for access key alice" in r for r in reasons)
    assert any(
        "no authorization" in r or "authorization is not 'MQv2-HMAC-SHA1" in r for r in reasons
    )


def _refusals(cluster: Cluster) -> list[str]:
    """The v2 front's audit lines of refused calls, oldest first."""
    log = (cluster.data / "logs" / "pull-service-1.log").read_text()
    front = "refused /apache.rocketmq.v2.MessagingService/"
    return [line for line in log.splitlines() if "basalt.audit" in line and front in line]


def test_basalt_produce_signs_as_the_local_admin_and_unsigned_is_refused(
    cluster: Cluster, tmp_path: Path
) -> None:
    here = run_basalt_sync(
        "produce", "-t", TOPIC, "-n", "3", "--endpoints", cluster.pull, cwd=cluster.data.parent
    )
    assert here.returncode == 0, here.stdout + here.stderr
    elsewhere = run_basalt_sync(
        "produce", "-t", TOPIC, "-n", "1", "--endpoints", cluster.pull, cwd=tmp_path
    )
    assert elsewhere.returncode == 1 and "no authorization" in elsewhere.stderr
