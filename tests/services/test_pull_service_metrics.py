"""The pull-service's metrics and spans: held PullBatch calls, call durations,
batch sizes, sessions; one span per PullBatch call."""

from __future__ import annotations

import asyncio
from pathlib import Path

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from basalt.services.histograms import DURATION_BUCKETS_S
from basalt.services.meta import MetaConfig
from basalt.v1 import pull_service_pb2 as ps
from tests.support.aio import async_test
from tests.support.nodes import cluster
from tests.support.polling import eventually
from tests.support.rpc import bodies, pull_request
from tests.support.telemetry import metric_reader


@async_test
async def test_a_held_pull_batch_is_counted_measured_and_one_span(
    tmp_path: Path, meta_config: MetaConfig, spans: InMemorySpanExporter
) -> None:
    t = metric_reader()
    # Process-wide instruments: compare with what earlier tests left.
    held_before = t.value("basalt.pull.held") or 0
    call = {"basalt.pull.call": "PullBatch"}
    calls_before = sum(p.count for _, p in t.points("basalt.pull.duration", **call))
    spans_before = len([s for s in spans.get_finished_spans() if s.name == "PullBatch"])
    async with cluster(tmp_path, meta_config) as h:
        assert t.value("basalt.pull.sessions", **{"basalt.pull_service.id": "ps-1"}) == 0
        pulls = [pull_request("broker-a", q, 0, group="") for q in range(4)]
        held = asyncio.ensure_future(
            h.stub.PullBatch(ps.PullBatchRequest(group="G", pulls=pulls, suspend_timeout_ms=30_000))
        )
        await eventually(
            lambda: t.value("basalt.pull.held") == held_before + 1, what="the call held"
        )
        await h.send("broker-a", 3, b"late")
        got = await asyncio.wait_for(held, 10)
        assert [bodies(x) for x in got.results] == [[], [], [], [b"late"]]
        assert t.value("basalt.pull.held") == held_before
        durations = t.points("basalt.pull.duration", **call)
        assert sum(p.count for _, p in durations) == calls_before + 1
        # Bucketed in seconds (OpenTelemetry's defaults are for milliseconds).
        assert {tuple(p.explicit_bounds) for _, p in durations} == {DURATION_BUCKETS_S}
    calls = [s for s in spans.get_finished_spans() if s.name == "PullBatch"]
    assert len(calls) == spans_before + 1
    assert (calls[-1].attributes or {})["basalt.queue.count"] == 4
