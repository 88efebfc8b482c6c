"""``basalt pull-service`` / ``python -m basalt.services.pull_service.main``: run one pull-service.

::

    basalt pull-service --id ps-1 --listen 127.0.0.1:8081 --etcd 127.0.0.1:2379 \\
        [--cluster DefaultCluster] [--heartbeat-interval-ms 10000]

The first line on stdout is ``pull-service <id> serving on <host:port>``
(scripts and tests wait for it). The service registers
``pull-services/<id>`` under a lease it keeps alive, reads topics, brokers
and pull-services from watched etcd caches (serving from them while etcd is
away) and registers each consumer session under ``consumers/``. etcd must
answer at start (the caches need a first listing). SIGTERM or SIGINT stops
it gracefully (see :mod:`basalt.services.pull_service.server`). Logs go to stderr, one line
per event: ``time level logger [trace_id span_id] message`` or JSON, and
``--metrics-port`` serves Prometheus metrics (docs/observability.md).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from basalt.services import process
from basalt.services.meta import MetaClient, MetaConfig, parse_endpoints
from basalt.services.pull_service.server import start_pull_service
from basalt.services.pull_service.service import PullServiceConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--id", required=True, help="pull-service id, unique in the cluster")
    parser.add_argument("--listen", default="127.0.0.1:8081", help="host:port to serve on")
    parser.add_argument(
        "--advertise-host",
        default=None,
        help="host others reach it at (default: the --listen host; 127.0.0.1 for 0.0.0.0)",
    )
    parser.add_argument("--etcd", required=True, help="etcd endpoints host:port[,host:port]")
    parser.add_argument("--cluster", default="DefaultCluster", help="etcd key prefix's cluster")
    parser.add_argument("--lease-ttl-s", type=int, default=10)
    parser.add_argument("--heartbeat-interval-ms", type=int, default=10_000)
    parser.add_argument("--max-suspend-timeout-ms", type=int, default=30_000)
    parser.add_argument(
        "--max-pending-calls",
        type=int,
        default=process.MAX_PENDING_CALLS,
        help="arrived calls gRPC queues before the event loop picks them up",
    )


def _advertise_host(listen: str, given: str | None) -> str:
    if given:
        return given
    host = listen.rpartition(":")[0]
    # A wildcard bind is reachable on loopback at least; give --advertise-host otherwise.
    return "127.0.0.1" if host in ("", "0.0.0.0", "[::]") else host


async def serve(args: argparse.Namespace) -> int:
    """Run until SIGTERM/SIGINT; returns the exit status."""
    stop = process.stop_signal()
    config = PullServiceConfig(
        pull_service_id=args.id,
        heartbeat_interval_ms=args.heartbeat_interval_ms,
        max_suspend_timeout_ms=args.max_suspend_timeout_ms,
        max_pending_calls=args.max_pending_calls,
    )
    meta = MetaClient(
        MetaConfig(
            endpoints=parse_endpoints(args.etcd), cluster=args.cluster, lease_ttl_s=args.lease_ttl_s
        )
    )
    try:
        await meta.connect()
        running = await start_pull_service(
            config,
            meta,
            listen=args.listen,
            advertise_host=_advertise_host(args.listen, args.advertise_host),
        )
        await process.serve_until_stopped(f"pull-service {args.id}", running, stop)
    finally:
        await meta.close()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return process.main("basalt pull-service", __doc__.split("\n")[0], add_arguments, serve, argv)


if __name__ == "__main__":
    process.exit_now(main())
