"""Traces over OTLP, end to end: a ``basalt cluster up --otlp-endpoint`` cluster
(real etcd, store-node, pull-service and admin processes) exports to a real
OTLP/gRPC receiver on loopback (:mod:`tests.support.otlp`), and so do a
traced SDK application (:mod:`tests.support.traced_client`) and the ``basalt``
command line. One ``basalt admin resetOffsetByTime`` is one trace across all
of them; a consumed message's process span links to its send span."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from basalt.services.cluster.local import CLUSTER_NAME
from basalt.services.meta import MetaClient, MetaConfig, TopicConfig
from tests.support.nodes import BROKERS
from tests.support.otlp import OtlpReceiver, ReceivedSpan, otlp_receiver
from tests.support.polling import eventually_sync
from tests.support.processes import REPO_ROOT, local_cluster, run_basalt_sync
from tests.support.timeouts import SUBPROCESS_TIMEOUT_S
from tests.support.traced_client import SERVICE_NAME as CLIENT_SERVICE

pytestmark = pytest.mark.slow

TOPIC = "TracedE2E"
GROUP = "TG"
RESET = "basalt admin resetOffsetByTime"

#: The batch span processor's delay (ms; the SDK's default is 5 s): spans reach
#: the receiver within a second of ending, in every process.
FAST_EXPORT = {"OTEL_BSP_SCHEDULE_DELAY": "200"}


def _root(receiver: OtlpReceiver, name: str) -> ReceivedSpan | None:
    roots = [s for s in receiver.named(name) if not s.parent_span_id]
    return roots[0] if roots else None


def _where(spans: list[ReceivedSpan]) -> set[tuple[str, str]]:
    """(service.name, service.instance.id) of each span's process (the
    instance: the broker or pull-service name; a generated id elsewhere)."""
    return {(s.service, s.instance) for s in spans}


def create_topic(etcd: str) -> None:
    """TOPIC with queues on both store-nodes (a first send would create it on
    the one store-node it reaches)."""

    async def create() -> None:
        async with MetaClient(MetaConfig(endpoints=(etcd,), cluster=CLUSTER_NAME)) as meta:
            await meta.create_topic(
                TopicConfig(
                    topic_name=TOPIC, read_queue_nums=2, write_queue_nums=2, brokers=BROKERS
                )
            )

    asyncio.run(create())


def test_a_reset_is_one_trace_and_a_consumed_message_links_to_its_send(tmp_path: Path) -> None:
    with otlp_receiver() as receiver:
        traced = FAST_EXPORT | {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint}
        # --otlp-endpoint hands the endpoint to the services; the export delay
        # reaches them through the environment `cluster up` passes on.
        otlp = ("--otlp-endpoint", receiver.endpoint)
        with local_cluster(tmp_path / "cluster", *otlp, env=FAST_EXPORT) as rows:
            by_role = {r["role"]: r for r in rows}
            create_topic(by_role["etcd"]["address"])
            client = subprocess.Popen(
                [sys.executable, "-m", "tests.support.traced_client",
                 by_role["pull-service"]["address"], GROUP, TOPIC],
                stdout=subprocess.PIPE,
                cwd=REPO_ROOT,
                env={**os.environ, **traced},
            )  # fmt: skip
            try:
                assert client.stdout is not None
                assert client.stdout.readline() == b"consumed\n"
                reset = run_basalt_sync(
                    "admin", "resetOffsetByTime", "-g", GROUP, "-t", TOPIC, "-s", "now",
                    "--server", by_role["admin"]["address"], "--cluster", CLUSTER_NAME,
                    env=traced,
                )  # fmt: skip
                assert reset.returncode == 0, reset.stdout + reset.stderr

                # (a) one trace from the command line down to the consumer's ack
                expected = {
                    ("basalt-store-node", "broker-a"),
                    ("basalt-store-node", "broker-b"),
                    ("basalt-pull-service", "pull-service-1"),
                }
                services = {"basalt-cli", "basalt-admin-service", CLIENT_SERVICE}

                def whole_trace() -> bool:
                    root = _root(receiver, RESET)
                    if root is None:
                        return False
                    spans = receiver.in_trace(root.trace_id)
                    handled = [s for s in spans if s.name == "handle reset_offset"]
                    return (
                        expected <= _where(spans)
                        and services <= {s.service for s in spans}
                        and bool(handled)
                    )

                eventually_sync(whole_trace, timeout_s=30, what="the reset's whole trace")
                root = _root(receiver, RESET)
                assert root is not None and root.service == "basalt-cli"
                spans = receiver.in_trace(root.trace_id)
                assert {s.service for s in spans} == {s for s, _ in expected} | services
                (handled,) = [s for s in spans if s.name == "handle reset_offset"]
                assert handled.service == CLIENT_SERVICE
                (deliver,) = [s for s in spans if s.name == "deliver reset_offset"]
                assert deliver.service == "basalt-pull-service"
                assert handled.parent_span_id == deliver.span_id
                assert len(receiver.named(RESET)) == 1  # no second trace of the one command
            finally:
                client.send_signal(signal.SIGTERM)  # a clean close flushes its spans
                assert client.wait(SUBPROCESS_TIMEOUT_S) == 0

            # (b) the message's process span links to its send span, across processes
            def linked() -> bool:
                return bool(receiver.named(f"send {TOPIC}")) and bool(
                    receiver.named(f"process {TOPIC}")
                )

            eventually_sync(linked, timeout_s=30, what="the send and process spans")
            (send,) = receiver.named(f"send {TOPIC}")
            processes = receiver.named(f"process {TOPIC}")
            assert send.service == CLIENT_SERVICE
            assert {(send.trace_id, send.span_id)} == {link for p in processes for link in p.links}
            assert all(p.trace_id != send.trace_id for p in processes)  # a link, not a child
