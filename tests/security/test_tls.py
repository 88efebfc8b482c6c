"""TLS on every hop, against ``basalt cluster up --tls`` (real processes, one
cluster for the module): plaintext and strangers' certificates are refused on
every port, etcd included; the SDK, the CLI and the official RocketMQ 5 Python
client work over it; a server picks up a certificate rotated on disk."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2

from basalt.admin.health import check
from basalt.client import ConsumeFromWhere, LitePullConfig, LitePullConsumer, Producer
from basalt.common import dial
from basalt.common import tls as transport
from basalt.common.message import Message
from basalt.services.cluster.certs import Authority, ClusterCertificates
from basalt.services.meta import MetaClient, MetaConfig, MetaUnavailableError
from basalt.services.process import add_health_and_reflection, add_port, grpc_server, set_serving
from tests.support.aio import async_test
from tests.support.interop import PRODUCERS, ensure_node_modules
from tests.support.processes import local_cluster, run_basalt_sync
from tests.support.timeouts import SUBPROCESS_TEST_TIMEOUT_S

TOPIC = "TlsTopic"


@dataclass(frozen=True)
class Cluster:
    data: Path
    certs: ClusterCertificates
    etcd: str
    #: Every gRPC service's address, by name (store-nodes, pull-service, admin, v2 front).
    services: dict[str, str]
    pull: str
    v2: str


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    data = tmp_path_factory.mktemp("tls") / ".basalt"
    with local_cluster(data, "--tls", "--store-nodes", "1") as rows:
        by_role = {r["role"]: r for r in rows}
        services = {r["name"]: r["address"] for r in rows if r["role"] != "etcd"}
        v2 = by_role["pull-service"]["rocketmq_v2"]
        services["rocketmq-v2"] = v2
        c = Cluster(
            data,
            ClusterCertificates(data / "tls"),
            by_role["etcd"]["address"],
            services,
            by_role["pull-service"]["address"],
            v2,
        )
        made = run_basalt_sync(
            "admin", "updateTopic", "-t", TOPIC, "-r", "2", "-w", "2", "--etcd", c.etcd,
            env=_cli_env(c),
        )  # fmt: skip
        assert made.returncode == 0, made.stdout + made.stderr
        yield c


def _cli_env(c: Cluster) -> dict[str, str]:
    tls = c.certs.client_tls()
    return {
        "BASALT_TLS_ENABLE": "true",
        "BASALT_TLS_CA_FILE": str(tls.tls_ca_file),
        "BASALT_TLS_CERT_FILE": str(tls.tls_cert_file),
        "BASALT_TLS_KEY_FILE": str(tls.tls_key_file),
    }


def _stranger(directory: Path) -> transport.TlsConfig:
    """A client whose CA and certificate are another authority's."""
    other = Authority.create("another CA")
    other.write(directory / "ca.pem")
    other.issue(directory / "c.pem", directory / "k.pem", common_name="stranger", server=False)
    return transport.TlsConfig(
        tls_enable=True,
        tls_ca_file=directory / "ca.pem",
        tls_cert_file=directory / "c.pem",
        tls_key_file=directory / "k.pem",
    )


def test_every_port_serves_tls_and_refuses_plaintext(cluster: Cluster) -> None:
    tls = cluster.certs.client_tls()
    for name, address in cluster.services.items():
        assert check(address, tls=tls) == "SERVING", name
        assert check(address, timeout_s=1.0).startswith("UNREACHABLE: UNAVAILABLE"), name


def test_a_certificate_of_another_ca_is_refused_both_ways(cluster: Cluster, tmp_path: Path) -> None:
    stranger = _stranger(tmp_path)
    mine = cluster.certs.client_tls()
    # Server side: the cluster's CA trusted, but a certificate it did not sign presented.
    presents_stranger = replace(stranger, tls_ca_file=mine.tls_ca_file)
    # mTLS: trusting the CA is not enough, a certificate is required.
    presents_none = replace(mine, tls_cert_file=None, tls_key_file=None)
    # Client side: the client trusts only another CA, so it refuses the servers.
    trusts_stranger = replace(mine, tls_ca_file=stranger.tls_ca_file)
    for name, address in cluster.services.items():
        if name == "rocketmq-v2":
            continue  # asks for no client certificate (the official clients have none)
        for tls in (presents_stranger, presents_none, trusts_stranger):
            assert check(address, tls=tls, timeout_s=1.0).startswith("UNREACHABLE"), (name, tls)
    assert check(cluster.v2, tls=trusts_stranger, timeout_s=1.0).startswith("UNREACHABLE")
    assert check(cluster.v2, tls=presents_none) == "SERVING"


@async_test
async def test_etcd_answers_mutual_tls_only(cluster: Cluster, tmp_path: Path) -> None:
    config = MetaConfig(endpoints=(cluster.etcd,), cluster="DefaultCluster", op_timeout_s=1.0)
    async with MetaClient(config, tls=cluster.certs.client_tls()) as meta:
        assert set(await meta.list_brokers()) == {"broker-a"}
    refused = (
        None,
        replace(cluster.certs.client_tls(), tls_cert_file=None, tls_key_file=None),
        replace(_stranger(tmp_path), tls_ca_file=cluster.certs.ca_file),
    )
    for tls in refused:
        with pytest.raises(MetaUnavailableError):
            async with MetaClient(config, tls=tls):
                pass


@async_test(timeout_s=SUBPROCESS_TEST_TIMEOUT_S)
async def test_produce_consume_and_reset_through_the_sdk_and_cli(cluster: Cluster) -> None:
    tls = cluster.certs.client_tls()
    async with Producer(cluster.pull, group="tls-producer", tls=tls) as producer:
        for i in range(10):
            await producer.send(Message(topic=TOPIC, body=f"m{i}".encode()))
    config = LitePullConfig(
        consumer_group="tls-group", consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET
    )
    bodies = await _consume(cluster.pull, config, tls, 10)
    assert sorted(bodies) == sorted(f"m{i}".encode() for i in range(10))
    # Through the admin service, whose fan-out to the store-node is TLS too.
    reset = run_basalt_sync(
        "admin", "resetOffsetByTime", "-t", TOPIC, "-g", "tls-group", "-s", "0", "--server",
        cluster.services["admin"], env=_cli_env(cluster),
    )  # fmt: skip
    assert reset.returncode == 0, reset.stdout + reset.stderr
    assert sorted(await _consume(cluster.pull, config, tls, 10)) == sorted(bodies)


async def _consume(
    pull: str, config: LitePullConfig, tls: transport.TlsConfig, expect: int
) -> list[bytes]:
    consumer = LitePullConsumer(pull, config=config, tls=tls)
    consumer.subscribe(TOPIC)
    got: list[bytes] = []
    async with consumer:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 15
        while len(got) < expect and loop.time() < deadline:
            got += [r.body for r in await consumer.poll(timeout_ms=500)]
    return got


@pytest.mark.parametrize("client", sorted(PRODUCERS))
def test_the_official_clients_send_over_tls(cluster: Cluster, client: str) -> None:
    ensure_node_modules()
    spec = {"topic": TOPIC, "messages": [{"body": f"v2-{i}"} for i in range(3)]}
    run = subprocess.run(
        [*PRODUCERS[client], cluster.v2, "tls"], input=json.dumps(spec), capture_output=True,
        text=True, timeout=60, check=False,
        env={**os.environ, "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH": str(cluster.certs.ca_file)},
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    sent = json.loads(run.stdout.strip().splitlines()[-1])
    assert all("message_id" in s for s in sent), sent


@async_test
async def test_a_certificate_rotated_on_disk_is_served_to_new_connections(
    tmp_path: Path,
) -> None:
    old, new = Authority.create("old CA"), Authority.create("new CA")
    old.write(tmp_path / "old-ca.pem")
    new.write(tmp_path / "new-ca.pem")
    cert, key = tmp_path / "server.pem", tmp_path / "server-key.pem"
    old.issue(cert, key, common_name="server")
    served = transport.TlsConfig(
        tls_enable=True, tls_cert_file=cert, tls_key_file=key, tls_reload_interval_ms=0
    )
    server = grpc_server(1024 * 1024)
    health = add_health_and_reflection(server, "test")
    port = add_port(server, "127.0.0.1:0", served)
    await server.start()
    await set_serving(health, "test", True)
    address = f"127.0.0.1:{port}"

    def trusting(ca: str) -> transport.TlsConfig:
        return transport.TlsConfig(tls_enable=True, tls_ca_file=tmp_path / ca)

    try:
        assert await _health(address, trusting("old-ca.pem"))
        assert not await _health(address, trusting("new-ca.pem"))
        new.issue(cert, key, common_name="server")  # renamed into place, no restart
        assert await _health(address, trusting("new-ca.pem"))
        assert not await _health(address, trusting("old-ca.pem"))
    finally:
        await server.stop(None)


async def _health(address: str, tls: transport.TlsConfig) -> bool:
    """One health check on a fresh channel (a new connection, a new handshake)."""
    async with dial.channel(address, tls) as channel:
        try:
            await channel.unary_unary(
                "/grpc.health.v1.Health/Check",
                request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
                response_deserializer=health_pb2.HealthCheckResponse.FromString,
            )(health_pb2.HealthCheckRequest(), timeout=2.0)
        except grpc.aio.AioRpcError:
            return False
    return True
