"""``basalt admin-service`` / ``python -m basalt.admin.service_main``: run the admin service.

::

    basalt admin-service --listen 127.0.0.1:8090 --etcd 127.0.0.1:2379 \\
        [--cluster DefaultCluster] [--op-timeout-s 3] [--config FILE]

Every setting of MetaConfig and AdminServiceProcessConfig is a flag, a
``BASALT_*`` env var and a config file key (:mod:`basalt.services.config`).

The first line on stdout is ``admin-service serving on <host:port>``
(scripts and tests wait for it; ``--listen`` port 0 picks a free port, and
the line gives it). The service holds nothing durable and keeps no cache:
every call reads etcd, so it registers nowhere either; tools find the local
cluster's instance in ``.basalt/cluster.json`` (``basalt cluster up`` starts
one). etcd must answer at start (a wrong ``--etcd`` fails at once, exit 1);
later outages fail only the calls made during them (UNAVAILABLE). SIGTERM or
SIGINT stops it gracefully: NOT_SERVING, no new calls, in-flight ones finish.
Logs go to stderr, one line per event: ``time level logger [trace_id
span_id] message`` or JSON, and ``--metrics-port`` serves Prometheus metrics
(docs/observability.md).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from basalt.admin.service import start_admin_service
from basalt.common.settings import config_dataclass, setting, validate
from basalt.services import config, process
from basalt.services.meta import MetaClient, MetaConfig, MetaError


@config_dataclass
class AdminServiceProcessConfig:
    """The admin service's own settings (its etcd ones are MetaConfig's)."""

    listen: str = setting(
        default="127.0.0.1:8090",
        check=config.listen_address,
        doc="host:port to serve on (port 0: any free port, given on the first line).",
    )
    stop_grace_s: float = config.stop_grace_setting()

    def __post_init__(self) -> None:
        validate(self, ValueError)


#: ``endpoints`` is ``--etcd``; ``op_timeout_s`` bounds every etcd call.
SPEC = config.ServiceSpec(
    "basalt-admin-service",
    (
        config.Section(AdminServiceProcessConfig),
        config.Section(MetaConfig, aliases={"endpoints": "etcd"}),
    ),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    config.add_arguments(parser, SPEC)


async def serve(args: argparse.Namespace) -> int:
    """Run until SIGTERM/SIGINT; returns the exit status (1: etcd did not answer
    at start, or the address could not be bound)."""
    stop = process.stop_signal()
    settings = process.settings(args)
    process_config = settings.build(AdminServiceProcessConfig)
    listen = process_config.listen
    meta = MetaClient(settings.build(MetaConfig), tls=process.tls_config(args))
    try:
        try:
            await meta.connect()
            running = await start_admin_service(
                meta, listen=listen, advertise_host=config.reachable_host(listen)
            )
        # grpc raises RuntimeError for a bad bind; OSError: TLS files it cannot read.
        except (MetaError, RuntimeError, OSError) as e:
            print(f"basalt admin-service: {e}", file=sys.stderr)
            return 1
        await process.serve_until_stopped(
            "admin-service", running, stop, grace_s=process_config.stop_grace_s
        )
    finally:
        await meta.close()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return process.main("basalt admin-service", __doc__.split("\n")[0], add_arguments, serve, argv)


if __name__ == "__main__":
    process.exit_now(main())
