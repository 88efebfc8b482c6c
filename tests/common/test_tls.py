"""basalt.common.tls without a network: its settings' rules, the fetcher that
re-reads rotated files (on a fake clock), the environment, and the local
cluster's certificates as the CLI finds them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from basalt.common import tls as transport
from basalt.common.local_cluster import (
    CLUSTER_FILE,
    ProcessInfo,
    discover_tls,
    local_tls,
    write_processes,
)
from basalt.services.cluster.certs import Authority, make_cluster_certificates


def test_settings_refuse_half_a_pair_and_mtls_without_a_ca(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="given together"):
        transport.TlsConfig(tls_enable=True, tls_cert_file=tmp_path / "c.pem")
    with pytest.raises(ValueError, match="needs tls_ca_file"):
        transport.TlsConfig(tls_enable=True, tls_client_auth=transport.ClientAuth.REQUIRE)
    with pytest.raises(ValueError, match="tls_reload_interval_ms must be non-negative"):
        transport.TlsConfig(tls_reload_interval_ms=-1)
    # Text from a file or the environment becomes paths and the enum.
    tls = transport.TlsConfig(tls_ca_file="ca.pem", tls_client_auth="require")  # type: ignore[arg-type]
    assert tls.tls_ca_file == Path("ca.pem") and tls.tls_client_auth is transport.ClientAuth.REQUIRE
    assert not transport.enabled(tls) and not transport.enabled(None)


def test_serving_needs_a_certificate() -> None:
    with pytest.raises(ValueError, match="tls_cert_file and tls_key_file"):
        transport.server_credentials(transport.TlsConfig(tls_enable=True))


def test_the_fetcher_rereads_changed_files_at_most_once_per_interval(tmp_path: Path) -> None:
    ca = Authority.create()
    cert, key = tmp_path / "s.pem", tmp_path / "s-key.pem"
    ca.issue(cert, key, common_name="s")
    now = [0.0]
    tls = transport.TlsConfig(
        tls_enable=True, tls_cert_file=cert, tls_key_file=key, tls_reload_interval_ms=1_000
    )
    fetch = transport.certificate_fetcher(tls, clock=lambda: now[0])
    now[0] = 2.0
    assert fetch() is None  # nothing changed
    ca.issue(cert, key, common_name="s")
    os.utime(cert, ns=(1, 1))  # a different stamp, whatever the clock's resolution
    now[0] = 2.5
    assert fetch() is None  # within the interval: not looked at
    now[0] = 3.5
    assert fetch() is not None  # changed: a new configuration
    now[0] = 5.0
    assert fetch() is None  # and only once
    key.unlink()
    os.utime(cert, ns=(2, 2))
    now[0] = 7.0
    assert fetch() is None  # unreadable: the previous certificate stays


def test_from_env_reads_the_services_variable_names(tmp_path: Path) -> None:
    assert transport.from_env({}) == transport.PLAINTEXT
    tls = transport.from_env(
        {"BASALT_TLS_ENABLE": "true", "BASALT_TLS_CA_FILE": str(tmp_path / "ca.pem")}
    )
    assert tls.tls_enable and tls.tls_ca_file == tmp_path / "ca.pem"
    assert transport.from_env({"BASALT_TLS_RELOAD_INTERVAL_MS": "0"}).tls_reload_interval_ms == 0
    with pytest.raises(ValueError, match="BASALT_TLS_ENABLE"):
        transport.from_env({"BASALT_TLS_ENABLE": "yes"})


def test_the_cli_finds_a_local_tls_cluster_and_the_environment_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tmp_path / ".basalt"
    certs = make_cluster_certificates(data / "tls")
    row = ProcessInfo("etcd", "etcd", 1, "127.0.0.1:2379", "etcd.log")
    write_processes(data / CLUSTER_FILE, [row])
    assert local_tls(data) is None  # recorded without TLS
    row.tls = True
    write_processes(data / CLUSTER_FILE, [row])
    assert local_tls(data) == certs.client_tls()
    monkeypatch.chdir(tmp_path)
    assert discover_tls({}) == certs.client_tls()
    assert discover_tls({"BASALT_TLS_ENABLE": "false"}) == transport.PLAINTEXT
