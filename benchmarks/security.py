"""Security's throughput cost: batched produce and consume through the SDK with
TLS off and on and auth off and on, in one run (issue 20's targets: TLS costs
at most 15 %, auth at most 5 %).

For each :data:`VARIANTS` entry, ``basalt cluster up`` (etcd, 2 store-nodes,
a pull-service; RocketMQ's file sizes) with that variant's flags, a topic of
``--queues`` queues per store-node, then benchmarks/sdk_throughput.py's
``produce`` (``--senders`` ``send_batch`` calls of ``--batch`` 1 KiB messages
in flight, ``--duration`` s) and ``consume`` (a LitePullConsumer reading it
all back) with that variant's client settings; ``cluster down``. ``--rounds``
repeats the list (plain, TLS, auth, TLS + auth, plain ...) so drift on a
shared machine lands on all. Prints every row, then each variant's best rate
against its baseline's as a cost in percent: TLS against plaintext (TLS's
cost), auth against the same transport without auth (auth's cost, with and
without TLS).

A variant is TLS on or off and auth on or off: ``cluster up`` flags
(``--tls``, ``--auth``) and the SDK's settings from the cluster's data
directory (its client certificate, the generated admin user's credentials).

Usage::

    .venv/bin/python benchmarks/security.py [--duration 10] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from basalt.common.auth import Credentials
from basalt.common.local_cluster import LOCAL_CREDENTIALS, client_tls
from basalt.common.tls import TlsConfig
from benchmarks.e2e_client import Cluster
from benchmarks.report import Figure, Report, Row, Table, add_json_out, rows_table
from benchmarks.sdk_throughput import TOPIC, consume, produce

#: The most throughput TLS may cost (issue 20).
TLS_COST_TARGET_PERCENT = 15.0
#: The most throughput auth (signatures and ACLs) may cost (issue 20).
AUTH_COST_TARGET_PERCENT = 5.0


@dataclass(frozen=True, slots=True)
class Variant:
    """One way of running the cluster and its clients."""

    tls: bool
    auth: bool

    @property
    def name(self) -> str:
        parts = ["mutual TLS" if self.tls else "plaintext"]
        return " + ".join([*parts, "auth"]) if self.auth else parts[0]

    @property
    def up_args(self) -> tuple[str, ...]:
        return (*(("--tls",) if self.tls else ()), *(("--auth",) if self.auth else ()))

    def client_tls(self, data: Path) -> TlsConfig | None:
        """The SDK's TLS from the cluster's data directory (None: plaintext)."""
        return client_tls(data) if self.tls else None

    def credentials(self, data: Path) -> Credentials | None:
        """The admin user ``cluster up --auth`` generated (None: unsigned)."""
        return Credentials.from_file(data / LOCAL_CREDENTIALS) if self.auth else None

    @property
    def baseline(self) -> Variant | None:
        """What this variant's cost is measured against, and that cost's target:
        auth against the same transport without it, TLS against plaintext."""
        if self.auth:
            return Variant(self.tls, False)
        return Variant(False, False) if self.tls else None

    @property
    def target_percent(self) -> float:
        return AUTH_COST_TARGET_PERCENT if self.auth else TLS_COST_TARGET_PERCENT


VARIANTS = (
    Variant(tls=False, auth=False),
    Variant(tls=True, auth=False),
    Variant(tls=False, auth=True),
    Variant(tls=True, auth=True),
)


async def measure(variant: Variant, args: argparse.Namespace, data: Path) -> list[Row]:
    """One variant's produce and consume rows, on a new cluster in ``data``."""
    cluster = Cluster(data, up_args=variant.up_args)
    try:
        try:
            print(cluster.up().rstrip(), file=sys.stderr)
        except RuntimeError:
            # The run's directory goes with the run: keep the logs that say why.
            kept = Path(tempfile.mkdtemp(prefix="basalt-security-failed-"))
            shutil.copytree(data / "logs", kept / "logs", dirs_exist_ok=True)
            print(f"cluster up failed: logs kept in {kept / 'logs'}", file=sys.stderr)
            raise
        tls = variant.client_tls(data)
        credentials = variant.credentials(data)
        await cluster.create_topics((TOPIC,), args.queues, tls=tls)
        address = cluster.pull_address
        produced = await produce(
            address, args.senders, args.batch, args.duration, tls=tls, credentials=credentials
        )
        consumed = await consume(address, produced.count + 1, tls=tls, credentials=credentials)
        return [
            Row(f"{r.path} ({variant.name})", r.config, r.rate, r.unit, r.count, r.seconds,
                None, r.extra)
            for r in (produced, consumed)
        ]  # fmt: skip
    finally:
        print(cluster.down().rstrip(), file=sys.stderr)


def costs(rows: Sequence[Row]) -> Table:
    """Each variant's best rate per path against its baseline's: the cost in %."""
    best: dict[tuple[str, str], float] = {}
    for row in rows:
        path, _, rest = row.path.partition(" (")
        key = (path, rest.removesuffix(")"))
        best[key] = max(best.get(key, 0.0), row.rate)
    table = Table(
        "costs",
        ("path", "variant", "msgs/s", "against", "its msgs/s", "cost %", "target", "status"),
        key=("path", "variant"),
    )
    for path in sorted({p for p, _ in best}):
        for variant in VARIANTS:
            rate = best.get((path, variant.name))
            baseline = variant.baseline
            base = None if baseline is None else best.get((path, baseline.name))
            if rate is None or baseline is None or not base:
                continue
            cost = (1 - rate / base) * 100
            target = variant.target_percent
            table.add(
                path,
                variant.name,
                Figure(rate, "msgs/s", fmt=",.0f"),
                baseline.name,
                Figure(base, "msgs/s", fmt=",.0f"),
                Figure(cost, "%", better="lower", fmt=".1f"),
                f"<= {target:.0f} %",
                "met" if cost <= target else "NOT MET",
            )
    return table


async def run(args: argparse.Namespace, root: Path) -> list[Row]:
    rows: list[Row] = []
    for round_ in range(args.rounds):
        for variant in VARIANTS:
            data = root / f"{variant.name.replace(' ', '-')}-{round_}"
            rows += await measure(variant, args, data)
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--senders", type=int, default=32, help="send_batch calls in flight")
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--queues", type=int, default=8, help="queues per store-node")
    parser.add_argument("--rounds", type=int, default=2, help="times through the variants")
    add_json_out(parser)
    args = parser.parse_args(argv)
    report = Report.start(__file__, args, argv)
    with tempfile.TemporaryDirectory(prefix="basalt-security-") as tmp:
        rows = asyncio.run(run(args, Path(tmp)))
    report.emit(rows_table("cells", rows))
    print()
    report.emit(costs(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
