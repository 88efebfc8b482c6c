"""TLS and auth together, against ``basalt cluster up --tls --auth`` (real
processes, one cluster for the module): the SDK produces and consumes over
mutual TLS signed, and unsigned it is refused; the CLI finds both the
certificates and the admin user's credentials; the official RocketMQ 5
producers send over TLS with credentials and are refused without."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from basalt.client import (
    LitePullConsumer,
    Message,
    NoPermissionError,
    Producer,
)
from basalt.common import auth
from basalt.common.local_cluster import LOCAL_CREDENTIALS
from basalt.services.cluster.certs import ClusterCertificates
from tests.support.aio import async_test
from tests.support.consumers import lite_pull_config
from tests.support.interop import PRODUCERS, ensure_node_modules, produce_signed
from tests.support.polling import eventually
from tests.support.processes import local_cluster, run_basalt_sync
from tests.support.timeouts import SUBPROCESS_TEST_TIMEOUT_S

TOPIC = "SecureTopic"


@dataclass(frozen=True)
class Cluster:
    data: Path
    certs: ClusterCertificates
    admin_user: auth.Credentials
    pull: str
    v2: str


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    data = tmp_path_factory.mktemp("tls-auth") / ".basalt"
    with local_cluster(data, "--tls", "--auth", "--store-nodes", "1") as rows:
        by_role = {r["role"]: r for r in rows}
        c = Cluster(
            data,
            ClusterCertificates(data / "tls"),
            auth.Credentials.from_file(data / LOCAL_CREDENTIALS),
            by_role["pull-service"]["address"],
            by_role["pull-service"]["rocketmq_v2"],
        )
        # Run where the cluster is: the CLI finds its certificates and admin user.
        made = run_basalt_sync(
            "admin", "updateTopic", "-t", TOPIC, "-r", "2", "-w", "2", cwd=data.parent
        )
        assert made.returncode == 0, made.stdout + made.stderr
        yield c


@async_test(timeout_s=SUBPROCESS_TEST_TIMEOUT_S)
async def test_the_sdk_produces_and_consumes_over_tls_signed_and_unsigned_is_refused(
    cluster: Cluster,
) -> None:
    tls = cluster.certs.client_tls()
    async with Producer(
        cluster.pull, group="secure-producer", tls=tls, credentials=cluster.admin_user
    ) as producer:
        for i in range(5):
            await producer.send(Message(topic=TOPIC, body=f"s{i}".encode()))
    async with Producer(cluster.pull, group="unsigned", tls=tls) as unsigned:
        with pytest.raises(NoPermissionError, match="no authorization"):
            await unsigned.send(Message(topic=TOPIC, body=b"never"))
    consumer = LitePullConsumer(
        cluster.pull,
        config=lite_pull_config("secure-group"),
        tls=tls,
        credentials=cluster.admin_user,
    )
    consumer.subscribe(TOPIC)
    got: list[bytes] = []
    async with consumer:

        async def polled() -> bool:
            got.extend(r.body for r in await consumer.poll(timeout_ms=300))
            return len(got) >= 5

        await eventually(polled, what="the signed TLS consumer reads every message")
    assert sorted(got) == [f"s{i}".encode() for i in range(5)]


def test_the_cli_produces_and_consumes_with_the_clusters_certificates_and_admin_user(
    cluster: Cluster,
) -> None:
    here = cluster.data.parent
    produced = run_basalt_sync("produce", "-t", TOPIC, "-n", "4", cwd=here)
    assert produced.returncode == 0, produced.stdout + produced.stderr
    consumed = run_basalt_sync("consume", "-t", TOPIC, "-g", "cli-group", "--count", "4", cwd=here)
    assert consumed.returncode == 0, consumed.stdout + consumed.stderr
    assert f"received 4 messages from {TOPIC}" in consumed.stdout, consumed.stdout


def _produce(client: str, cluster: Cluster, credentials: auth.Credentials | None) -> list[Any]:
    return produce_signed(
        client,
        cluster.v2,
        TOPIC,
        credentials,
        args=["tls"],
        env={"GRPC_DEFAULT_SSL_ROOTS_FILE_PATH": str(cluster.certs.ca_file)},
    )


@pytest.mark.parametrize("client", sorted(PRODUCERS))
def test_official_producers_send_over_tls_with_credentials_and_without_are_refused(
    cluster: Cluster, client: str
) -> None:
    ensure_node_modules()
    (sent,) = _produce(client, cluster, cluster.admin_user)
    assert "message_id" in sent, sent
    (refused,) = _produce(client, cluster, None)
    assert "error" in refused, refused
