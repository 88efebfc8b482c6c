"""``basalt pull-service`` / ``python -m basalt.services.pull_service.main``: run one pull-service.

::

    basalt pull-service --id ps-1 --listen 127.0.0.1:8081 --etcd 127.0.0.1:2379 \\
        [--cluster DefaultCluster] [--heartbeat-interval-ms 10000] [--config FILE]

Every setting of PullServiceConfig, MetaConfig, PullServiceProcessConfig and
RocketMQv2Config is a flag, a ``BASALT_*`` env var and a config file key
(:mod:`basalt.services.config`, docs/configuration.md).

The first line on stdout is ``pull-service <id> serving on <host:port>``
(scripts and tests wait for it); ``--rocketmq-v2-listen`` serves RocketMQ 5
clients on a second port (logged; docs/rocketmq-v2.md). The service registers
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

from basalt.common.settings import config_dataclass, instance_of, setting, validate
from basalt.services import config, process
from basalt.services.meta import MetaClient, MetaConfig
from basalt.services.pull_service.server import start_pull_service
from basalt.services.pull_service.service import PullServiceConfig
from basalt.services.rocketmq_v2.service import RocketMQv2Config


@config_dataclass
class PullServiceProcessConfig:
    """A pull-service process's addresses (what has no home in PullServiceConfig)."""

    listen: str = setting(
        default="127.0.0.1:8081", check=config.listen_address, doc="host:port to serve on."
    )
    advertise_host: str = setting(
        default="",
        check=instance_of(str, "a host or empty"),
        doc="The host others reach it at (registered in etcd with the bound port); "
        "empty: the listen host, 127.0.0.1 for a wildcard.",
    )
    client_address: str = setting(
        default="",
        check=config.address_or_empty,
        doc="host:port registered for clients to reach it at; empty: the advertised address.",
    )
    stop_grace_s: float = config.stop_grace_setting()

    def __post_init__(self) -> None:
        validate(self, ValueError)


#: ``pull_service_id`` is ``--id``, ``endpoints`` ``--etcd``.
SPEC = config.ServiceSpec(
    "basalt-pull-service",
    (
        config.Section(PullServiceProcessConfig),
        config.Section(PullServiceConfig, aliases={"pull_service_id": "id"}),
        config.Section(RocketMQv2Config),
        config.Section(MetaConfig, aliases={"endpoints": "etcd"}),
    ),
    derived=(
        config.Derived(
            "advertise_host", lambda v: config.reachable_host(str(v["listen"])), "listen"
        ),
    ),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    config.add_arguments(parser, SPEC)


async def serve(args: argparse.Namespace) -> int:
    """Run until SIGTERM/SIGINT; returns the exit status."""
    stop = process.stop_signal()
    settings = process.settings(args)
    addresses = settings.build(PullServiceProcessConfig)
    front = settings.build(RocketMQv2Config)
    service_config = settings.build(PullServiceConfig)
    tls = process.tls_config(args)
    meta = MetaClient(settings.build(MetaConfig), tls=tls)
    try:
        await meta.connect()
        running = await start_pull_service(
            service_config,
            meta,
            listen=addresses.listen,
            advertise_host=addresses.advertise_host,
            client_address=addresses.client_address,
            rocketmq_v2_listen=front.rocketmq_v2_listen,
            rocketmq_v2=front,
            tls=tls,
            rocketmq_v2_tls=front.tls(tls),
        )
        await process.serve_until_stopped(
            f"pull-service {service_config.pull_service_id}",
            running,
            stop,
            grace_s=addresses.stop_grace_s,
        )
    finally:
        await meta.close()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return process.main("basalt pull-service", __doc__.split("\n")[0], add_arguments, serve, argv)


if __name__ == "__main__":
    process.exit_now(main())
