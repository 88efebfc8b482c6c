"""Signatures (both official clients' forms), the ACL model's decisions and
secrets sealed at rest."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import subprocess
import sys
import time

import pytest

from basalt.common import auth
from basalt.services.auth.cipher import SecretCipher, new_cluster_key
from basalt.services.auth.model import (
    Acl,
    Action,
    AuthModelError,
    Decision,
    Policy,
    Resource,
    ResourcePattern,
    ResourceType,
    User,
    decide,
)

T0 = 1_773_000_000.0


def test_signature_is_hmac_sha1_of_the_date_time_in_hex() -> None:
    date_time = auth.format_date_time(T0)
    assert len(date_time) == 16 and date_time.endswith("Z") and date_time[8] == "T"
    expected = hmac.new(b"sk", date_time.encode(), hashlib.sha1).hexdigest()
    assert auth.sign("sk", date_time) == expected
    assert auth.parse_date_time(date_time) == T0


#: The official Python client's signing, run in a child: its generated protos
#: clash with Basalt's copy of apache.rocketmq.v2 in one descriptor pool.
_OFFICIAL_PYTHON_SIGNS = """
import json, types
from rocketmq.v5.util.signature import Signature
creds = types.SimpleNamespace(ak="alice", sk="secret-1")
config = types.SimpleNamespace(credentials=creds, namespace="")
print(json.dumps(dict(Signature.metadata(config, "client-1"))))
"""


def test_the_official_python_clients_metadata_parses_and_verifies() -> None:
    child = subprocess.run(
        [sys.executable, "-c", _OFFICIAL_PYTHON_SIGNS],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "TZ": "UTC"},
    )
    metadata = json.loads(child.stdout)
    parsed = auth.parse_authorization(metadata[auth.AUTHORIZATION])
    assert parsed.access_key == "alice"
    assert parsed.signed_headers == auth.DATE_TIME
    assert parsed.signature == auth.sign("secret-1", metadata[auth.DATE_TIME])
    # Local time stamped with a Z: under TZ=UTC, a time this host accepts.
    assert abs(auth.parse_date_time(metadata[auth.DATE_TIME]) - time.time()) < 60


def test_nodes_upper_case_hex_parses() -> None:
    value = f"MQv2-HMAC-SHA1 Credential=bob, SignedHeaders=x-mq-date-time, Signature={'AB' * 20}"
    assert auth.parse_authorization(value).signature == "AB" * 20


@pytest.mark.parametrize(
    "value", ["", "Basic abc", "MQv2-HMAC-SHA1 Credential=a", "MQv2-HMAC-SHA1 Signature=00"]
)
def test_a_malformed_authorization_is_refused(value: str) -> None:
    with pytest.raises(ValueError):
        auth.parse_authorization(value)


def test_signed_metadata_round_trips() -> None:
    creds = auth.Credentials("alice", "secret-1")
    metadata = dict(auth.signed_metadata(creds, T0))
    parsed = auth.parse_authorization(metadata[auth.AUTHORIZATION])
    assert parsed.signature == auth.sign("secret-1", metadata[auth.DATE_TIME])
    assert "secret-1" not in repr(creds)


def test_credentials_file_round_trips_owner_only(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "a" / "admin.json"
    auth.Credentials("admin", "s3cret!").to_file(path)
    assert auth.Credentials.from_file(path) == auth.Credentials("admin", "s3cret!")
    assert path.stat().st_mode & 0o077 == 0


def _acl(*policies: Policy) -> Acl:
    return Acl("User:alice", policies)


def _policy(resources: tuple[str, ...], actions: set[Action], **kw: object) -> Policy:
    return Policy(tuple(ResourcePattern(r) for r in resources), frozenset(actions), **kw)  # type: ignore[arg-type]


TOPIC = Resource(ResourceType.TOPIC, "orders-eu")


def test_exact_prefix_and_any_patterns() -> None:
    assert decide(_acl(_policy(("Topic:orders-eu",), {Action.PUB})), TOPIC, Action.PUB, None)
    assert decide(_acl(_policy(("Topic:orders-*",), {Action.PUB})), TOPIC, Action.PUB, None)
    assert decide(_acl(_policy(("*",), {Action.ALL})), TOPIC, Action.SUB, None)
    assert not decide(_acl(_policy(("Topic:orders",), {Action.PUB})), TOPIC, Action.PUB, None)
    assert not decide(_acl(_policy(("Group:orders-*",), {Action.PUB})), TOPIC, Action.PUB, None)
    assert not decide(_acl(_policy(("Topic:orders-*",), {Action.PUB})), TOPIC, Action.SUB, None)
    cluster = Resource(ResourceType.CLUSTER)
    assert decide(_acl(_policy(("Cluster",), {Action.LIST})), cluster, Action.LIST, None)
    assert not decide(None, TOPIC, Action.PUB, None)


def test_deny_wins_over_allow_whatever_the_order() -> None:
    allow = _policy(("Topic:*",), {Action.PUB})
    deny = _policy(("Topic:orders-eu",), {Action.PUB}, decision=Decision.DENY)
    assert not decide(_acl(allow, deny), TOPIC, Action.PUB, None)
    assert not decide(_acl(deny, allow), TOPIC, Action.PUB, None)
    assert decide(_acl(allow, deny), Resource(ResourceType.TOPIC, "other"), Action.PUB, None)


def test_source_ip_ranges() -> None:
    acl = _acl(_policy(("Topic:*",), {Action.PUB}, source_ips=("10.0.0.0/8", "127.0.0.1")))
    assert decide(acl, TOPIC, Action.PUB, "10.1.2.3")
    assert decide(acl, TOPIC, Action.PUB, "127.0.0.1")
    assert not decide(acl, TOPIC, Action.PUB, "192.168.0.1")
    assert not decide(acl, TOPIC, Action.PUB, None)


@pytest.mark.parametrize("text", ["Topic:", "Queue:x", "Topic:a*b", "orders"])
def test_bad_resource_patterns_are_refused(text: str) -> None:
    with pytest.raises(AuthModelError):
        ResourcePattern(text)


def test_acl_json_round_trips() -> None:
    acl = _acl(
        _policy(("Topic:a", "Group:g-*"), {Action.PUB, Action.SUB}, source_ips=("10.0.0.0/8",)),
        _policy(("Cluster",), {Action.GET}, decision=Decision.DENY),
    )
    assert Acl.from_json(acl.to_json()) == acl


def test_secrets_are_sealed_not_stored_in_clear() -> None:
    cipher = SecretCipher(new_cluster_key())
    user = User("alice", "secret-1")
    raw = user.to_json(cipher.seal(user.secret_key))
    assert b"secret-1" not in raw
    assert User.from_json(raw, cipher.open(User.sealed_secret(raw))) == user
    with pytest.raises(AuthModelError):
        SecretCipher(new_cluster_key()).open(json.loads(raw)["secretKey"])
