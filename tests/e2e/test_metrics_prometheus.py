"""Metrics end to end on one ``basalt cluster up`` cluster (real etcd,
store-node, pull-service and admin processes) for the module: a real
Prometheus scrapes it and its HTTP API answers what a known workload did; every
query of the Grafana dashboard names a metric the cluster exports; a scrape
under load is answered while sends go on."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import re
import threading
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from basalt.client import (
    ConsumeFromWhere,
    LitePullConfig,
    LitePullConsumer,
    Message,
    Producer,
)
from basalt.services.cluster.local import CLUSTER_NAME
from basalt.services.histograms import DURATION_BUCKETS_S
from basalt.services.meta import MetaClient, MetaConfig, TopicConfig
from basalt.v1 import common_pb2 as pb
from basalt.v1 import pull_service_pb2 as ps
from basalt.v1 import pull_service_pb2_grpc as ps_grpc
from tests.support.nodes import BROKERS
from tests.support.polling import eventually_sync
from tests.support.processes import REPO_ROOT, local_cluster
from tests.support.prometheus import (
    exposed_names,
    histogram_base,
    metric_names,
    prometheus,
    scrape_config,
)

pytestmark = pytest.mark.slow

TOPIC = "MetricsE2E"
#: The scrape-under-load test's topic (TOPIC's counts stay the workload's).
LOAD_TOPIC = "MetricsLoad"
GROUP = "MG"
#: Messages the workload sends to TOPIC, and its consumer group then consumes.
SENT = 50

#: Prometheus' names of the metrics the workload is checked by (OpenTelemetry
#: names rendered by the Prometheus exporter: dots to underscores, unit, _total).
PUT_MESSAGES = "basalt_store_put_messages_total"
GET_MESSAGES = "basalt_store_get_messages_total"
CONSUMER_LAG = "basalt_consumer_lag"
TOPIC_LABEL = "messaging_destination_name"
GROUP_LABEL = "messaging_consumer_group_name"

DASHBOARD = REPO_ROOT / "deploy" / "grafana" / "basalt.json"


@dataclass(frozen=True)
class Cluster:
    rows: list[dict[str, Any]]

    def of_role(self, role: str) -> list[dict[str, Any]]:
        return [r for r in self.rows if r["role"] == role]

    @property
    def pull_address(self) -> str:
        return str(self.of_role("pull-service")[0]["address"])

    def scrape(self, row: dict[str, Any]) -> str:
        with urllib.request.urlopen(row["metrics"], timeout=10) as answer:
            return str(answer.read().decode())


async def workload(cluster: Cluster) -> None:
    """TOPIC and LOAD_TOPIC on both store-nodes; SENT messages sent to it; GROUP consumes them
    all (a LitePullConsumer) and commits; one PullBatch through the pull-service."""
    etcd = cluster.of_role("etcd")[0]["address"]
    async with MetaClient(MetaConfig(endpoints=(etcd,), cluster=CLUSTER_NAME)) as meta:
        for topic in (TOPIC, LOAD_TOPIC):
            await meta.create_topic(
                TopicConfig(
                    topic_name=topic, read_queue_nums=2, write_queue_nums=2, brokers=BROKERS
                )
            )
    async with Producer(cluster.pull_address, group="MP") as producer:
        for i in range(SENT):
            assert (await producer.send(Message(topic=TOPIC, body=b"m%d" % i))).ok
    consumer = LitePullConsumer(
        cluster.pull_address,
        config=LitePullConfig(
            consumer_group=GROUP, consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET
        ),
    )
    consumer.subscribe(TOPIC)
    async with consumer:
        got = 0
        while got < SENT:
            got += len(await consumer.poll(timeout_ms=1000))
        assert got == SENT
        await consumer.commit()
    # The SDK reads the store-nodes directly; the pull-service's PullBatch (and
    # the dashboard's panels of it) serve other languages' clients: one such
    # call, of the empty LOAD_TOPIC, so TOPIC's counts stay the consumer's.
    async with grpc.aio.insecure_channel(cluster.pull_address) as channel:
        await ps_grpc.PullServiceStub(channel).PullBatch(
            ps.PullBatchRequest(
                group="MP-other-languages",
                pulls=[
                    ps.PullRequest(
                        queue=pb.MessageQueue(topic=LOAD_TOPIC, broker_name=BROKERS[0], queue_id=0),
                        max_nums=1,
                    )
                ],
            ),
            timeout=10,
        )


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One cluster for the module, after :func:`workload`."""
    with local_cluster(tmp_path_factory.mktemp("metrics") / "cluster") as rows:
        c = Cluster(rows)
        asyncio.run(workload(c))
        yield c


def test_prometheus_scrapes_the_cluster_put_and_get_counts_and_zero_lag(
    cluster: Cluster, tmp_path: Path
) -> None:
    config = scrape_config(cluster.rows, interval_s=1)
    with prometheus(config, tmp_path / "prometheus") as prom:

        def counted() -> bool:
            put = prom.value(f'sum({PUT_MESSAGES}{{{TOPIC_LABEL}="{TOPIC}"}})')
            got = prom.value(f'sum({GET_MESSAGES}{{{TOPIC_LABEL}="{TOPIC}"}})')
            lag = prom.value(
                f'sum({CONSUMER_LAG}{{{GROUP_LABEL}="{GROUP}",{TOPIC_LABEL}="{TOPIC}"}})'
            )
            return (put, got, lag) == (SENT, SENT, 0)

        eventually_sync(counted, timeout_s=60, interval_s=0.5, what="put, get and lag")
        # Every process with an endpoint is a target that answers. Each target is
        # scraped on its own schedule: the pull-service's first scrape may come
        # after the store-nodes' counts arrived, so wait for every target's `up`.
        expected = {r["name"]: 1.0 for r in cluster.rows if r["metrics"]}

        def all_up() -> bool:
            return {labels["instance"]: v for labels, v in prom.query("up")} == expected

        eventually_sync(all_up, timeout_s=60, interval_s=0.5, what="every target up")


def test_duration_histograms_are_exported_in_seconds_buckets(cluster: Cluster) -> None:
    """The ``le`` bounds a scrape shows for every duration histogram are
    DURATION_BUCKETS_S (seconds, 50 µs ... 10 s) and +Inf, not OpenTelemetry's
    default edges for milliseconds (0, 5, 10, ... 10000)."""
    wanted = {
        "store-node": ("basalt_store_put_duration_seconds", "basalt_store_get_duration_seconds"),
        "pull-service": ("basalt_pull_duration_seconds",),
    }
    for role, names in wanted.items():
        text = cluster.scrape(cluster.of_role(role)[0])
        for name in names:
            bounds = set(re.findall(rf'^{name}_bucket{{[^}}]*le="([^"]+)"', text, re.MULTILINE))
            assert "+Inf" in bounds, (name, text)
            assert {float(b) for b in bounds - {"+Inf"}} == set(DURATION_BUCKETS_S), name


def test_every_dashboard_query_names_an_exported_metric(cluster: Cluster) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["templating"]["list"][0]["type"] == "datasource"
    queried: dict[str, set[str]] = {}
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]
            names = metric_names(target["expr"])
            assert names, (panel["title"], target["expr"])
            queried[panel["title"]] = queried.get(panel["title"], set()) | names
    missing: dict[str, list[str]] = {}

    def all_exported() -> bool:
        """Every queried name in some endpoint's scrape (a series appears with
        its first sample: the CommitLog's first background fsync, say)."""
        exported: set[str] = set()
        for row in cluster.rows:
            if row["metrics"]:
                exported |= exposed_names(cluster.scrape(row))
        exported |= {histogram_base(n) for n in exported}
        missing.clear()
        missing.update(
            (title, sorted(names - exported))
            for title, names in queried.items()
            if names - exported
        )
        return not missing

    with contextlib.suppress(AssertionError):
        eventually_sync(all_exported, timeout_s=30, interval_s=0.5)
    assert missing == {}


def test_dashboard_query_names_are_read_past_functions_matchers_and_groupings() -> None:
    expr = (
        "histogram_quantile(0.99, sum by (le, messaging_destination_name) "
        '(rate(basalt_store_put_duration_seconds_bucket{job="store-node",x=~"a|b"}'
        "[$__rate_interval]))) / on (instance) group_left max(up offset 5m) "
        "and sum without (pid) (increase(x_total[1m:10s]))"
    )
    assert metric_names(expr) == {"basalt_store_put_duration_seconds_bucket", "up", "x_total"}
    text = '# HELP a_total x\n# TYPE a_total counter\na_total{t="1"} 3\nb 1.5\nc_bucket{le="1"} 2\n'
    assert exposed_names(text) == {"a_total", "b", "c_bucket"}
    assert histogram_base("c_bucket") == "c"


def test_a_scrape_under_load_is_answered_while_sends_go_on(cluster: Cluster) -> None:
    """A scrape runs on prometheus_client's thread in the store-node, never on
    its event loop: scrapes interleaved with a producer sending all along are
    all answered, and sends complete between every two of them."""
    scrapes = 20
    node = cluster.of_role("store-node")[0]
    sent = 0
    done = threading.Event()

    async def produce() -> None:
        nonlocal sent
        async with Producer(cluster.pull_address, group="MP-load") as producer:
            while not done.is_set():
                batch = [Message(topic=LOAD_TOPIC, body=b"load") for _ in range(16)]
                results = await producer.send_batch(batch)
                assert all(r.ok for r in results)
                sent += len(batch)

    def scrape_all() -> list[int]:
        """Scrapes, each once more sends completed since the last; the count at each."""
        seen = []
        try:
            for _ in range(scrapes):
                before = sent
                eventually_sync(
                    lambda before=before: sent > before, timeout_s=30, what="sends going on"
                )
                assert "process_cpu_time_seconds_total" in cluster.scrape(node)
                seen.append(sent)
        finally:
            done.set()
        return seen

    async def run() -> list[int]:
        producer = asyncio.create_task(produce())
        try:
            return await asyncio.to_thread(scrape_all)
        finally:
            await producer

    counts = asyncio.run(run())
    assert len(counts) == scrapes
    assert all(a < b for a, b in itertools.pairwise(counts))
