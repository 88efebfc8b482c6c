"""What observability costs: batched produce and consume of a loopback cluster,
three ways (and a fourth that
splits metrics from spans), in one run.

Each mode starts its own ``basalt cluster up`` (two store-nodes, a
pull-service, the admin service; ASYNC flush) with the mode's ``OTEL_*``
variables in the environment the services inherit, runs two cells of
``benchmarks/e2e_throughput.py`` — **produce**: ``records`` batches of 100 on
``StoreNode.SendStream``; **consume**: ``PullBatch`` ``max_nums`` 256,
committing, of what the produce cell wrote — and brings the cluster down:

* **off** — ``OTEL_SDK_DISABLED=true``: the SDK's providers are no-ops, so no
  span is made and no instrument records (``cluster up`` still passes
  ``--metrics-port``; the endpoint serves an empty registry and nothing
  scrapes it).
* **metrics, default sampling** — the set-up as shipped: every instrument
  records, a scraper reads every service's ``/metrics`` every
  ``--scrape-interval`` s (Prometheus' job), and traces run on a service's
  default sampling (1 % of roots: the load's requests carry no trace context,
  so 1 % of the SendStream streams and PullBatch calls start a recorded trace
  and the rest make no span) with no exporter (no
  ``OTEL_EXPORTER_OTLP_ENDPOINT``: those spans are made, then dropped).
* **metrics, traces sampled out** — as above with ``OTEL_TRACES_SAMPLER=
  always_off``: what the metrics alone cost (a diagnostic row: the spans'
  share of the previous row is the difference).
* **metrics, 100 % sampling, OTLP** — as above with ``OTEL_TRACES_SAMPLER=
  always_on`` and every span exported by OTLP/gRPC (batch span processor,
  its defaults) to a receiver in this process (:mod:`tests.support.otlp`,
  a collector on the same machine, so its CPU counts too).

The load processes are plain gRPC clients, untraced. The table gives msgs/s
per cell and the overhead against **off**; the target is <= 5 % with metrics
on and default sampling. ``--rounds N`` runs the modes N times,
interleaved, and keeps each cell's best (the machine's other work only ever
slows a run down).

Usage::

    .venv/bin/python benchmarks/otel_overhead.py            # ~3 min (--rounds 3: ~7)
    .venv/bin/python benchmarks/otel_overhead.py --quick    # smoke run, ~1 min
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import shutil
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import grpc

from basalt.common.local_cluster import CLUSTER_FILE, load_processes
from basalt.services import process
from basalt.v1 import pull_service_pb2_grpc as ps_grpc
from benchmarks import e2e_throughput as e2e
from benchmarks.e2e_client import Cluster
from benchmarks.report import Figure, Report, Table, add_json_out, load_text
from benchmarks.store_append import bench_root
from tests.support.otlp import OtlpReceiver, otlp_receiver

#: The target: metrics on with default sampling costs at most this much.
TARGET_OVERHEAD_PCT = 5.0


@dataclass(frozen=True, slots=True)
class Mode:
    name: str
    #: Set in the environment the cluster's services inherit.
    env: Mapping[str, str]
    #: Scrape every service's metrics endpoint during the cells.
    scrape: bool
    #: Export traces to an OTLP receiver in this process.
    export: bool


MODES = (
    Mode("off", {"OTEL_SDK_DISABLED": "true"}, scrape=False, export=False),
    Mode("metrics, default sampling", {}, scrape=True, export=False),
    Mode("metrics, traces sampled out", {"OTEL_TRACES_SAMPLER": "always_off"}, True, False),
    Mode(
        "metrics, 100 % sampling, OTLP",
        {"OTEL_TRACES_SAMPLER": "always_on"},
        scrape=True,
        export=True,
    ),
)

#: Variables a mode may set: cleared for every mode, so that the caller's
#: environment cannot turn one mode into another.
_OTEL_VARIABLES = (
    "OTEL_SDK_DISABLED",
    "OTEL_TRACES_SAMPLER",
    "OTEL_TRACES_SAMPLER_ARG",
    "OTEL_TRACES_EXPORTER",
    "OTEL_METRICS_EXPORTER",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
)


@contextlib.contextmanager
def environment(values: Mapping[str, str]) -> Iterator[None]:
    """``os.environ`` with the OTEL_* variables above unset and ``values`` set,
    restored after the block."""
    saved = dict(os.environ)
    for name in _OTEL_VARIABLES:
        os.environ.pop(name, None)
    os.environ.update(values)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@contextlib.contextmanager
def scraping(urls: Sequence[str], interval_s: float) -> Iterator[list[int]]:
    """A thread that GETs every URL each ``interval_s`` until the block ends;
    yields a one-item list: the count of scrapes answered."""
    answered = [0]
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(interval_s):
            for url in urls:
                with contextlib.suppress(OSError):
                    with urllib.request.urlopen(url, timeout=10) as answer:
                        answer.read()
                    answered[0] += 1

    thread = threading.Thread(target=loop, name="scraper", daemon=True)
    thread.start()
    try:
        yield answered
    finally:
        stop.set()
        thread.join(30)


@dataclass(slots=True)
class Result:
    produce: float
    consume: float
    scrapes: int = 0
    spans: int = 0
    #: Every round's (produce, consume) msgs/s, in the order run.
    rounds: list[tuple[float, float]] = field(default_factory=list)


#: The consume window as a share of the produce window (see run_mode).
CONSUME_SHARE = 0.6


async def run_mode(
    s: e2e.Settings, mode: Mode, root: Path, receiver: OtlpReceiver, scrape_interval_s: float
) -> Result:
    env = dict(mode.env)
    if mode.export:
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = receiver.endpoint
    cluster = Cluster(root / "cluster")
    spans_before = len(receiver.spans)
    with environment(env):
        try:
            e2e._progress(f"{mode.name}: basalt cluster up")
            cluster.up()
            meter = e2e.CpuMeter({p.name: p.pid for p in cluster.processes})
            cpu: list[e2e.CpuRow] = []
            async with grpc.aio.insecure_channel(cluster.pull_address) as channel:
                pull: ps_grpc.PullServiceAsyncStub = ps_grpc.PullServiceStub(channel)
                routes = await e2e.create_topics(cluster, pull, s.queues)
            state = load_processes(cluster.data_dir / CLUSTER_FILE)
            urls = [p.metrics_url for p in state if p.metrics_url and mode.scrape]
            with scraping(urls, scrape_interval_s) as scrapes:
                produced = await e2e.produce_cell(
                    s, "records", routes["records"], meter, cpu, stream=True
                )
                # The consume cell reads what the produce cell wrote: at equal windows
                # a consumer faster than the producer drained the queues during its
                # warm-up and measured 0 msgs/s. Read less than was written.
                consumed, drained = await e2e.consume_cell(
                    dataclasses.replace(s, duration_s=s.duration_s * CONSUME_SHARE),
                    256,
                    routes["records"],
                    cluster.pull_address,
                    meter,
                    cpu,
                    batched=True,
                )
                if drained is not None:
                    print(f"  !! {mode.name}: {drained}", file=sys.stderr)
            return Result(
                produced.rate, consumed.rate, scrapes[0], len(receiver.spans) - spans_before
            )
        finally:
            e2e._progress(f"{mode.name}: basalt cluster down")
            print(cluster.down().rstrip(), file=sys.stderr)
            # Each mode writes ~5 GB: twelve of them kept until the end filled the
            # disk past the store-nodes' 90 % guard, which refused the last sends.
            shutil.rmtree(cluster.data_dir, ignore_errors=True)


async def run(
    s: e2e.Settings, root: Path, rounds: int, scrape_interval_s: float
) -> dict[str, Result]:
    best: dict[str, Result] = {}
    with otlp_receiver() as receiver:
        for r in range(rounds):
            for i, mode in enumerate(MODES):
                got = await run_mode(
                    s, mode, root / f"round{r}-mode{i}", receiver, scrape_interval_s
                )
                got.rounds.append((got.produce, got.consume))
                if mode.name in best:
                    was = best[mode.name]
                    got.produce = max(got.produce, was.produce)
                    got.consume = max(got.consume, was.consume)
                    got.scrapes += was.scrapes
                    got.spans += was.spans
                    got.rounds[:0] = was.rounds
                best[mode.name] = got
    return best


def _cost(pct: float) -> Figure:
    return Figure(pct, "%", better="lower", fmt="+.1f")


def results_table(best: Mapping[str, Result]) -> Table:
    """Each mode's best rates and their cost against **off** (in %, lower is better)."""
    base = best[MODES[0].name]
    table = Table(
        "modes",
        ("mode", "produce msgs/s", "produce overhead", "consume msgs/s", "consume overhead",
         "also"),
    )  # fmt: skip
    for mode in MODES:
        r = best[mode.name]
        produce_pct = 100 * (1 - r.produce / base.produce) if base.produce else 0.0
        consume_pct = 100 * (1 - r.consume / base.consume) if base.consume else 0.0
        also: list[str | Figure] = []
        if len(r.rounds) > 1:
            each = " ".join(f"{p / 1000:.0f}k/{c / 1000:.0f}k" for p, c in r.rounds)
            also.append(f"rounds {each}")
        if mode.scrape:
            also.append(Figure(r.scrapes, "scrapes", better=None, fmt=","))
        if mode.export:
            also.append(Figure(r.spans, "spans exported", better=None, fmt=","))
        if mode is MODES[1]:
            met = max(produce_pct, consume_pct) <= TARGET_OVERHEAD_PCT
            also.append(f"target <= {TARGET_OVERHEAD_PCT:g} %: {'met' if met else 'NOT MET'}")
        base_row = mode is MODES[0]
        table.add(
            mode.name,
            Figure(r.produce, "msgs/s", fmt=",.0f"),
            "" if base_row else _cost(produce_pct),
            Figure(r.consume, "msgs/s", fmt=",.0f"),
            "" if base_row else _cost(consume_pct),
            also,
        )
    return table


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--quick", action="store_true", help="short cells: a smoke run")
    p.add_argument("--warmup", type=float, default=2.0, help="s of warm-up per cell")
    p.add_argument("--duration", type=float, default=10.0, help="s measured per cell")
    p.add_argument("--rounds", type=int, default=1, help="runs of the modes, interleaved")
    p.add_argument(
        "--scrape-interval", type=float, default=5.0, help="s between scrapes of every endpoint"
    )
    p.add_argument("--root", type=Path, help="cluster directories (default: a temp dir, removed)")
    add_json_out(p)
    args = p.parse_args(argv)
    if args.quick:
        args.warmup, args.duration = 0.5, 2.0
    return args


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    # e2e_throughput's settings (load processes, channels, in flight, queues)
    # with this run's windows.
    s = dataclasses.replace(
        e2e.settings_from(e2e.parse_args([])), warmup_s=args.warmup, duration_s=args.duration
    )
    report = Report.start(__file__, args, argv)
    with bench_root(args.root, "otel_overhead.py", argv) as root:
        print(
            f"settings:  warmup {s.warmup_s:g} s + {s.duration_s:g} s per cell; produce: "
            f"records batches of {e2e.BATCH} on SendStream; consume: PullBatch max_nums 256; "
            f"{e2e.BODY} B bodies; {s.queues} queues per store-node; {args.rounds} round(s); "
            f"scrapes every {args.scrape_interval:g} s"
        )
        started = time.perf_counter()
        best = asyncio.run(run(s, root, args.rounds, args.scrape_interval))
        print()
        report.emit(results_table(best))
        elapsed = time.perf_counter() - started
        print()
        report.note(f"load avg:  {load_text()} (1/5/15 min) at end; total {elapsed:.0f} s")
    return 0


if __name__ == "__main__":
    # As e2e_throughput.py: this process and its load processes run on the gRPC
    # settings `basalt cluster up` gives the services.
    process.rerun_with_service_env()
    raise SystemExit(main())
