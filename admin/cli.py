"""The ``basalt`` console script: one argparse parser, one subcommand group per area.

::

    basalt store check ROOT [--json]
    basalt store dump ROOT [--topic T] [--queue Q] [--from-offset N]

Each group is a :class:`Group` of :data:`GROUPS`: its module, imported when
the parser is built, adds the group's subcommands and sets a ``handler``
(``args, stdout, stderr -> exit status``) on each; this module only wires
them. What a group needs beyond the base install (``pip install basalt``: the
SDK, ``produce``, ``consume``, ``health``, ``admin``) comes with an extra
(:mod:`basalt.admin.extras`): a group whose module cannot be imported without
one stays in ``basalt --help`` and, run (``--help`` included), says which
extra to install and exits 2; so does a command that meets a missing module
of an extra once running (``basalt admin topicRoute`` reads etcd itself).

Run as a program (the console script, ``python -m basalt.admin``), a command
sets up tracing and logging first (:func:`_traced`; ``basalt --log-format
json ...``; no metrics endpoint) and runs inside one root span, ``basalt
<group> <command>``, so every RPC it makes is a span of one trace; the
service groups (``basalt store-node`` ...) set up their own instead.

Exit statuses: 0 success, 1 the command ran and found a problem (e.g. an
inconsistent store), 2 a usage error, a bad path or an extra not installed
(with a one-line message, never a traceback), 130 interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import logging
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from types import ModuleType
from typing import TextIO

from basalt.admin import extras
from basalt.admin.service_specs import SERVICES
from basalt.common.telemetry import LOG_FORMATS

#: A usage error, or a command whose extra is not installed (the module docstring).
EXIT_USAGE = 2

#: A command: parsed arguments, stdout, stderr -> exit status.
CommandHandler = Callable[[argparse.Namespace, TextIO, TextIO], int]

#: Adds a group's subcommands to the group's parser, from the group's module.
GroupRegistrar = Callable[[ModuleType, argparse.ArgumentParser], None]


@dataclasses.dataclass(frozen=True, slots=True)
class Group:
    """A command group: ``basalt NAME …``. Its ``module`` is imported when the
    parser is built and handed to ``register``, which adds the subcommands;
    a module of an extra missing on that import leaves the group in the
    parser as a stub that says which extra to install (:func:`build_parser`)."""

    name: str
    help: str
    module: str
    register: GroupRegistrar
    #: The extras the group needs (:mod:`basalt.admin.extras`); none: the base install.
    needs: tuple[str, ...] = ()


#: The groups that run a service process, which sets its own telemetry up.
SERVICE_GROUPS = frozenset(SERVICES)


def _call(function: str) -> GroupRegistrar:
    """A registrar calling the group module's ``function(parser)``."""
    return lambda module, parser: getattr(module, function)(parser)


def _service(name: str, help_text: str) -> Group:
    command = SERVICES[name]
    return Group(name, help_text, command.module, command.register, ("server",))


#: The command groups, in help order.
GROUPS: tuple[Group, ...] = (
    Group(
        "store",
        "inspect a store root on local disk (read-only)",
        "basalt.store.tools",
        _call("add_store_commands"),
        ("server",),
    ),
    Group(
        "cluster",
        "a local cluster on loopback: etcd, store-nodes, a pull-service, the admin service",
        "basalt.services.cluster.local",
        _call("add_commands"),
        ("server",),
    ),
    _service("store-node", "run a store-node: one store behind the StoreNode gRPC service"),
    _service(
        "pull-service",
        "run a pull-service: routes, pulls and consumer sessions in front of the store-nodes",
    ),
    _service(
        "admin-service",
        "run the admin service: the Admin gRPC API (topics, reset offset by time) over etcd",
    ),
    Group(
        "admin",
        "mqadmin's verbs: topics, routes, status, consumer progress",
        "basalt.admin.verbs",
        _call("add_commands"),
    ),
    Group(
        "health",
        "ask a Basalt service (or etcd) for its grpc.health.v1 status",
        "basalt.admin.health",
        _call("add_commands"),
    ),
    Group(
        "produce",
        "send messages to a topic (RocketMQ's quickstart Producer)",
        "basalt.client.quickstart",
        _call("add_produce"),
    ),
    Group(
        "consume",
        "read a topic as a consumer group (RocketMQ's quickstart Consumer)",
        "basalt.client.quickstart",
        _call("add_consume"),
    ),
    Group(
        "pipeline",
        "Spark jobs over store roots (export, verify, rebuild-index) and lag",
        "basalt.pipeline.jobs",
        _call("add_commands"),
        ("server", "spark"),
    ),
)


def _import_group(group: Group) -> ModuleType | extras.MissingExtraError:
    """The group's module, or why it cannot be had on this install."""
    try:
        return importlib.import_module(group.module)
    except ModuleNotFoundError as e:
        return extras.missing_extra(f"basalt {group.name}", e, needs=group.needs)


#: The groups by name.
_BY_NAME = {group.name: group for group in GROUPS}


def _stub(missing: extras.MissingExtraError) -> CommandHandler:
    def run(args: argparse.Namespace, stdout: TextIO, stderr: TextIO) -> int:
        print(missing, file=stderr)
        return EXIT_USAGE

    return run


def build_parser() -> argparse.ArgumentParser:
    """The whole ``basalt`` parser, every group registered.

    A group whose module needs an extra that is not installed stays listed
    (its help says so) as a stub taking any arguments, ``--help`` included:
    running it prints which extra to install and exits 2."""
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
    for group in GROUPS:
        module = _import_group(group)
        if isinstance(module, extras.MissingExtraError):
            help_text = f"{group.help} [{extras.NOT_INSTALLED}: {module.extra} extra]"
            stub = groups.add_parser(
                group.name, help=help_text, description=str(module), add_help=False
            )
            # Whatever follows is left to the stub (main: takes_any_arguments).
            stub.set_defaults(cli_group=group.name, handler=_stub(module), takes_any_arguments=True)
            continue
        sub = groups.add_parser(group.name, help=group.help, description=group.help)
        # Its own dest: a verb's -g/--group (a consumer group) overwrites ``group``.
        sub.set_defaults(cli_group=group.name)
        group.register(module, sub)
    return parser


def _command_name(args: argparse.Namespace) -> str:
    """``basalt <group> <subcommand>``, as the span and the messages name it."""
    # Each group names its subcommand's dest its own way.
    sub = [getattr(args, d) for d in ("command", "verb", "store_command") if getattr(args, d, None)]
    return " ".join(["basalt", args.cli_group, *sub[:1]])


#: The variables that ask for traces to be exported (basalt.common.telemetry).
_EXPORT_VARIABLES = (
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_TRACES_EXPORTER",
)


@contextlib.contextmanager
def _traced(args: argparse.Namespace) -> Iterator[None]:
    """Telemetry for this command's process (basalt.common.telemetry: no metrics
    endpoint, logs at WARNING) and one root span around the command, flushed
    at its end. Without the OpenTelemetry SDK (a base install: it comes with
    the server extra) the logs only: the span is the API's no-op one."""
    from opentelemetry import trace

    from basalt.common.telemetry import TelemetryConfig, configure_logging, setup_telemetry

    config = TelemetryConfig(
        service_name="basalt-cli", log_format=args.cli_log_format, log_level="WARNING"
    )
    telemetry = None
    try:
        telemetry = setup_telemetry(config)
    except ModuleNotFoundError as e:
        # Raises e again when the module is not an extra's.
        missing = extras.missing_extra("exporting this command's traces", e)
        configure_logging(config.log_format, config.log_level)
        if any(os.environ.get(v) for v in _EXPORT_VARIABLES):
            logging.getLogger("basalt.cli").warning("%s", missing)
    try:
        with trace.get_tracer("basalt.cli").start_as_current_span(_command_name(args)):
            yield
    finally:
        if telemetry is not None:
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
        # parse_args, except that a stub group (an extra not installed) takes
        # whatever follows it, to say which extra is missing.
        args, rest = parser.parse_known_args(argv)
        if rest and not getattr(args, "takes_any_arguments", False):
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
    except SystemExit as e:  # argparse has printed usage or help already
        return 0 if e.code is None else e.code if isinstance(e.code, int) else EXIT_USAGE
    handler: CommandHandler = args.handler
    if getattr(args, "takes_any_arguments", False):
        return handler(args, sys.stdout, sys.stderr)
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
    except extras.MissingExtraError as e:
        print(e, file=sys.stderr)
        return EXIT_USAGE
    except ModuleNotFoundError as e:  # an extra's module, needed only once running
        needs = _BY_NAME[args.cli_group].needs
        print(extras.missing_extra(_command_name(args), e, needs=needs), file=sys.stderr)
        return EXIT_USAGE
    except OSError as e:
        print(f"basalt {args.group}: error: {e}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    raise SystemExit(main())
