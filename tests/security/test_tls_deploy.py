"""The compose TLS variant (docker-compose.tls.yml over docker-compose.yml),
rendered by ``docker compose config`` (no engine, no stack started): every
Basalt service serves and dials with the mounted certificates, etcd serves
https and requires client certificates. The Helm chart's TLS is checked with
the rest of the chart (tests/deploy/test_helm.py)."""

from __future__ import annotations

import json

from tests.support.docker import COMPOSE_FILE, Compose
from tests.support.processes import REPO_ROOT

TLS_OVERRIDE = REPO_ROOT / "docker-compose.tls.yml"
BASALT_SERVICES = ("store-node-a", "store-node-b", "pull-service", "admin-service")


def test_the_compose_tls_variant_renders_with_tls_on_every_hop() -> None:
    compose = Compose("basalt-tls-config", {}, files=(COMPOSE_FILE, TLS_OVERRIDE))
    services = json.loads(compose.run("config", "--format", "json"))["services"]
    for name in BASALT_SERVICES:
        env = services[name]["environment"]
        assert env["BASALT_TLS_ENABLE"] == "true", name
        assert env["BASALT_TLS_CLIENT_AUTH"] == "REQUIRE", name
        assert env["BASALT_TLS_CERT_FILE"] == "/etc/basalt/tls/node.pem", name
        # The base file's settings stay: the override only adds.
        assert env["BASALT_ETCD"] == "etcd:2379", name
    for name in (*BASALT_SERVICES, "etcd"):
        mounts = services[name]["volumes"]
        assert any(m["target"] == "/etc/basalt/tls" and m["read_only"] for m in mounts), name
    etcd = services["etcd"]["environment"]
    assert etcd["ETCD_LISTEN_CLIENT_URLS"] == "https://0.0.0.0:2379"
    assert etcd["ETCD_CLIENT_CERT_AUTH"] == "true"
    assert etcd["ETCDCTL_CACERT"] == "/etc/basalt/tls/ca.pem"
