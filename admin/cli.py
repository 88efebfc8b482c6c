"""The ``basalt`` console script: one argparse parser, one subcommand group per area.

::

    basalt store check ROOT [--json]
    basalt store dump ROOT [--topic T] [--queue Q] [--from-offset N]

Each group is a ``(name, help, registrar)`` entry of :data:`GROUPS`; the
registrar adds the group's subcommands and sets a ``handler`` (``args, stdout,
stderr -> exit status``) on each. Later issues append ``basalt.admin``, ``cluster``
and ``store-node`` groups there; this module only wires them.

Run as a program (the console script, ``python -m basalt.admin``), a command
sets up tracing and logging first (:func:`_traced`; ``basalt --log-format
json ...``; no metrics endpoint) and runs inside one root span, ``basalt
<group> <command>``, so every RPC it makes is a span of one trace; the
service groups (``basalt store-node`` ...) set up their own instead.

Exit statuses: 0 success, 1 the command ran and found a problem (e.g. an
inconsistent store), 2 a usage error or a bad path (with a one-line message,
never a traceback), 130 interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable, Iterator, Sequence

from basalt.common.telemetry import LOG_FORMATS
from basalt.store.tools import EXIT_USAGE, CommandHandler, add_store_commands


def add_cluster(parser: argparse.ArgumentParser) -> None:
    """``basalt cluster {up,down,status}`` (basalt.services.cluster.local)."""
    from basalt.services.cluster import local as cluster

    cluster.add_commands(parser)


def _service_command(module: str, service_name: str) -> Callable[[argparse.ArgumentParser], None]:
    """``basalt <service> …``: run a service process until SIGTERM; ``module`` (a
    dotted name) supplies ``add_arguments`` and ``serve``; ``service_name`` is
    its telemetry's service.name."""

    def register(parser: argparse.ArgumentParser) -> None:
        import importlib

        from basalt.services import process

        service = importlib.import_module(module)
        service.add_arguments(parser)
        process.add_common_arguments(parser, service_name)
        parser.set_defaults(handler=lambda args, stdout, stderr: process.run(service.serve, args))

    return register


def add_admin(parser: argparse.ArgumentParser) -> None:
    """``basalt admin <verb>`` (admin.verbs)."""
    from basalt.admin import verbs

    verbs.add_commands(parser)


def add_health(parser: argparse.ArgumentParser) -> None:
    """``basalt health ADDRESS`` (admin.health)."""
    from basalt.admin import health

    health.add_commands(parser)


def add_produce(parser: argparse.ArgumentParser) -> None:
    """``basalt produce`` (client.quickstart)."""
    from basalt.client import quickstart

    quickstart.add_produce(parser)


def add_consume(parser: argparse.ArgumentParser) -> None:
    """``basalt consume`` (client.quickstart)."""
    from basalt.client import quickstart

    quickstart.add_consume(parser)


def add_pipeline(parser: argparse.ArgumentParser) -> None:
    """``basalt pipeline <job>`` (basalt.pipeline.jobs; needs the ``spark`` extra)."""
    from basalt.pipeline import jobs

    jobs.add_commands(parser)


add_store_node_command = _service_command("basalt.services.store_node.main", "basalt-store-node")
add_pull_service_command = _service_command(
    "basalt.services.pull_service.main", "basalt-pull-service"
)
add_admin_service_command = _service_command("basalt.admin.service_main", "basalt-admin-service")

#: The groups that run a service process, which sets its own telemetry up.
SERVICE_GROUPS = frozenset({"store-node", "pull-service", "admin-service"})


#: Adds a group's subcommands to the group's parser.
GroupRegistrar = Callable[[argparse.ArgumentParser], None]

#: The command groups, in help order.
GROUPS: tuple[tuple[str, str, GroupRegistrar], ...] = (
    ("store", "inspect a store root on local disk (read-only)", add_store_commands),
    (
        "cluster",
        "a local cluster on loopback: etcd, store-nodes, a pull-service, the admin service",
        add_cluster,
    ),
    (
        "store-node",
        "run a store-node: one store behind the StoreNode gRPC service",
        add_store_node_command,
    ),
    (
        "pull-service",
        "run a pull-service: routes, pulls and consumer sessions in front of the store-nodes",
        add_pull_service_command,
    ),
    (
        "admin-service",
        "run the admin service: the Admin gRPC API (topics, reset offset by time) over etcd",
        add_admin_service_command,
    ),
    ("admin", "mqadmin's verbs: topics, routes, status, consumer progress", add_admin),
    ("health", "ask a Basalt service (or etcd) for its grpc.health.v1 status", add_health),
    ("produce", "send messages to a topic (RocketMQ's quickstart Producer)", add_produce),
    ("consume", "read a topic as a consumer group (RocketMQ's quickstart Consumer)", add_consume),
    (
        "pipeline",
        "Spark jobs over store roots (export, verify, rebuild-index) and lag",
        add_pipeline,
    ),
)


def build_parser() -> argparse.ArgumentParser:
    """The whole ``basalt`` parser, every group registered."""
    parser = argparse.ArgumentParser(
        prog="basalt", description="Basalt, a RocketMQ-style message queue: command line."
    )
    # Its own dest: a service group's --log-format (process.add_common_arguments)
    # would otherwise overwrite this one with its default.
    parser.add_argument(
        "--log-format",
        dest="cli_log_format",
        choices=LOG_FORMATS,
        default="text",
        help="the command's own log lines on stderr (warnings and errors): text or json",
    )
    groups = parser.add_subparsers(dest="group", metavar="GROUP", required=True)
    for name, help_text, register in GROUPS:
        group = groups.add_parser(name, help=help_text, description=help_text)
        # Its own dest: a verb's -g/--group (a consumer group) overwrites ``group``.
        group.set_defaults(cli_group=name)
        register(group)
    return parser


@contextlib.contextmanager
def _traced(args: argparse.Namespace) -> Iterator[None]:
    """Telemetry for this command's process (basalt.common.telemetry: no metrics
    endpoint, logs at WARNING) and one root span around the command, flushed
    at its end."""
    from opentelemetry import trace

    from basalt.common.telemetry import TelemetryConfig, setup_telemetry

    telemetry = setup_telemetry(
        TelemetryConfig(
            service_name="basalt-cli", log_format=args.cli_log_format, log_level="WARNING"
        )
    )
    # Each group names its subcommand's dest its own way.
    sub = [getattr(args, d) for d in ("command", "verb", "store_command") if getattr(args, d, None)]
    name = " ".join(["basalt", args.cli_group, *sub[:1]])
    try:
        with trace.get_tracer("basalt.cli").start_as_current_span(name):
            yield
    finally:
        telemetry.shutdown()


def main(argv: Sequence[str] | None = None) -> int:
    """Run one ``basalt`` command; returns its exit status (see the module docstring).

    ``argv`` defaults to ``sys.argv[1:]``; output goes to the current
    ``sys.stdout``/``sys.stderr``. Telemetry is set up (:func:`_traced`) only
    then, when this is the program: a caller that passes ``argv`` runs the
    command in its own process, whose providers and logging are its own.
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse has printed usage or help already
        return 0 if e.code is None else e.code if isinstance(e.code, int) else EXIT_USAGE
    handler: CommandHandler = args.handler
    as_program = argv is None and args.cli_group not in SERVICE_GROUPS
    try:
        with _traced(args) if as_program else contextlib.nullcontext():
            return handler(args, sys.stdout, sys.stderr)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`basalt store dump ROOT | head`): stop quietly.
        # Point stdout at /dev/null so the interpreter's final flush cannot fail again;
        # a captured stdout (tests) has no descriptor to redirect.
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except OSError as e:
        print(f"basalt {args.group}: error: {e}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    raise SystemExit(main())
