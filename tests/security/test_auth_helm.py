"""The Helm chart's auth: on by default, a generated admin user and cluster key
in a Secret mounted into every Basalt container, the services told where;
an existing Secret instead; off on request. Rendered with ``helm template``."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from cryptography.fernet import Fernet

from basalt.common.auth import Credentials
from basalt.services.auth.config import AuthConfig
from tests.support.helm import Manifest, install_helm, pod_spec, render, workloads

RELEASE, NAMESPACE = "mq", "messaging"
SECRET = f"{RELEASE}-basalt-auth"
ENV = {
    "BASALT_AUTH_ENABLED": "true",
    "BASALT_AUTH_CREDENTIALS_FILE": "/etc/basalt/auth/admin.json",
    "BASALT_AUTH_CLUSTER_KEY_FILE": "/etc/basalt/auth/cluster.key",
    "BASALT_AUTH_CLOCK_SKEW_S": "300",
}


@pytest.fixture(scope="module")
def helm() -> Path:
    return install_helm()


def _render(helm: Path, tmp_path: Path, values: dict[str, Any]) -> list[Manifest]:
    return render(helm, tmp_path, values, release=RELEASE, namespace=NAMESPACE)


def _basalt_containers(manifests: list[Manifest]) -> list[tuple[Manifest, Manifest]]:
    return [
        (w, c)
        for w in workloads(manifests)
        for c in pod_spec(w)["containers"]
        if c["image"].startswith("basalt:")
    ]


def _secrets(manifests: list[Manifest]) -> list[Manifest]:
    return [m for m in manifests if m["kind"] == "Secret"]


def _check_mounted(manifests: list[Manifest], secret: str) -> None:
    containers = _basalt_containers(manifests)
    assert {c["args"][0] for _, c in containers} == {"store-node", "pull-service", "admin-service"}
    for workload, container in containers:
        assert {
            "name": "auth",
            "secret": {"secretName": secret, "defaultMode": 0o400},
        } in pod_spec(workload)["volumes"]
        assert {"name": "auth", "mountPath": "/etc/basalt/auth", "readOnly": True} in container[
            "volumeMounts"
        ]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert {k: env.get(k) for k in ENV} == ENV


def test_on_by_default_with_a_generated_admin_user_and_cluster_key(
    helm: Path, tmp_path: Path
) -> None:
    manifests = _render(helm, tmp_path, {})
    [secret] = _secrets(manifests)
    assert secret["metadata"]["name"] == SECRET
    assert secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    admin = json.loads(base64.b64decode(secret["data"]["admin.json"]))
    credentials = Credentials(admin["accessKey"], admin["secretKey"])
    assert credentials.access_key == "admin" and len(credentials.secret_key) == 32
    key = base64.b64decode(secret["data"]["cluster.key"])
    Fernet(key)  # a valid Fernet key: url-safe base64 of 32 bytes
    _check_mounted(manifests, SECRET)
    # What the services build from those settings.
    AuthConfig(
        auth_enabled=True,
        auth_credentials_file=ENV["BASALT_AUTH_CREDENTIALS_FILE"],
        auth_cluster_key_file=ENV["BASALT_AUTH_CLUSTER_KEY_FILE"],
        auth_clock_skew_s=300.0,
    )


def test_an_existing_secret_replaces_the_generated_one(helm: Path, tmp_path: Path) -> None:
    manifests = _render(helm, tmp_path, {"auth": {"existingSecret": "my-basalt-auth"}})
    assert _secrets(manifests) == []
    _check_mounted(manifests, "my-basalt-auth")


def test_off_renders_no_secret_no_mount_and_no_auth_setting(helm: Path, tmp_path: Path) -> None:
    manifests = _render(helm, tmp_path, {"auth": {"enabled": False}})
    assert _secrets(manifests) == []
    for _, container in _basalt_containers(manifests):
        assert all(m["name"] != "auth" for m in container["volumeMounts"])
        assert not any(e["name"].startswith("BASALT_AUTH_") for e in container["env"])
