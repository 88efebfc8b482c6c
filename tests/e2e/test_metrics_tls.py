"""Metrics over TLS on ``basalt cluster up --tls`` (issue 28, item 8): every
Prometheus endpoint serves https with the cluster's certificates and requires
a client certificate signed by the cluster's CA; a plain-HTTP scrape and an
https one without a client certificate are refused; a real Prometheus with
the cluster's client certificate scrapes every process."""

from __future__ import annotations

import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from basalt.common.local_cluster import CA_FILE, CLIENT_CERT_FILE, CLIENT_KEY_FILE, TLS_DIR
from tests.support.polling import eventually_sync
from tests.support.processes import local_cluster
from tests.support.prometheus import prometheus, scrape_config

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Path, list[dict[str, Any]]]]:
    data = tmp_path_factory.mktemp("mtls") / "c"
    with local_cluster(data, "--tls") as rows:
        yield data / TLS_DIR, [r for r in rows if r.get("metrics")]


def _context(certs: Path, *, client_cert: bool) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(certs / CA_FILE))
    if client_cert:
        context.load_cert_chain(certs / CLIENT_CERT_FILE, certs / CLIENT_KEY_FILE)
    return context


def test_metrics_are_https_with_a_client_certificate_only(
    cluster: tuple[Path, list[dict[str, Any]]],
) -> None:
    certs, rows = cluster
    assert {r["role"] for r in rows} >= {"store-node", "pull-service"}
    for row in rows:
        url = row["metrics"]
        assert url.startswith("https://"), row
        context = _context(certs, client_cert=True)
        with urllib.request.urlopen(url, timeout=10, context=context) as answer:
            assert answer.status == 200
            assert b"# TYPE" in answer.read()
        plain = "http://" + url.removeprefix("https://")
        with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
            urllib.request.urlopen(plain, timeout=10).read()
        with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError, OSError)):
            context = _context(certs, client_cert=False)
            urllib.request.urlopen(url, timeout=10, context=context).read()


def test_prometheus_scrapes_every_process_with_the_cluster_client_certificate(
    cluster: tuple[Path, list[dict[str, Any]]], tmp_path: Path
) -> None:
    certs, rows = cluster
    tls = {
        "ca_file": str(certs / CA_FILE),
        "cert_file": str(certs / CLIENT_CERT_FILE),
        "key_file": str(certs / CLIENT_KEY_FILE),
    }
    with prometheus(scrape_config(rows, tls=tls), tmp_path / "prometheus") as prom:

        def all_up() -> bool:
            up = prom.query("up")
            return len(up) == len(rows) and all(v == 1.0 for _, v in up)

        eventually_sync(all_up, timeout_s=30, what="every https target up")
