"""``basalt health ADDRESS``: one ``grpc.health.v1.Health/Check`` against a Basalt service.

::

    basalt health 127.0.0.1:10911 [--service NAME] [--timeout-s S]

Prints the status the server answers (``SERVING``, ``NOT_SERVING``,
``SERVICE_UNKNOWN``, ...) or ``UNREACHABLE: <reason>`` when no answer came
within the timeout. Exit status 0 when ``SERVING``, 1 otherwise (unreachable
included), 2 for bad usage. It is what the image's ``HEALTHCHECK`` and the
compose file's healthchecks run: every Basalt service (and etcd, which serves
the same protocol on its client port) answers it, so one command checks them
all without a shell or ``grpc_health_probe`` in the image.
"""

from __future__ import annotations

import argparse
from typing import IO, Any, cast

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from basalt.common import dial
from basalt.common import tls as transport
from basalt.common.local_cluster import discover_tls

#: What the services report for the whole server (services/process.py registers "").
WHOLE_SERVER = ""


def check(
    address: str,
    *,
    service: str = WHOLE_SERVER,
    timeout_s: float = 3.0,
    tls: transport.TlsConfig | None = None,
) -> str:
    """The health status name ``address`` answers for ``service`` within ``timeout_s``
    (``SERVING``, ``NOT_SERVING``, ...), or ``UNREACHABLE: <gRPC status and detail>``
    when the call failed (nothing listening, the deadline passed, no health service).
    Never raises for a failed call. With ``tls`` enabled, over TLS."""
    with dial.sync_channel(address, tls) as channel:
        # types-grpcio-health-checking leaves the stub's methods untyped.
        stub = cast(Any, health_pb2_grpc.HealthStub(channel))
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout_s)
        except grpc.RpcError as e:
            # A failed unary call's error is also its grpc.Call (status code and detail),
            # which the stubs cannot express.
            call = cast(Any, e)
            return f"UNREACHABLE: {call.code().name} {call.details()}"
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


def _run(args: argparse.Namespace, stdout: IO[str], stderr: IO[str]) -> int:
    status = check(args.address, service=args.service, timeout_s=args.timeout_s, tls=discover_tls())
    print(status, file=stdout)
    return 0 if status == "SERVING" else 1


def _positive_seconds(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def add_commands(parser: argparse.ArgumentParser) -> None:
    """The ``health`` group's arguments on ``parser``; sets its ``handler``."""
    parser.add_argument("address", metavar="ADDRESS", help="host:port of the gRPC server")
    parser.add_argument(
        "--service",
        default=WHOLE_SERVER,
        metavar="NAME",
        help="the health service name to ask about (default: the whole server)",
    )
    parser.add_argument(
        "--timeout-s",
        type=_positive_seconds,
        default=3.0,
        metavar="S",
        help="give up (UNREACHABLE, exit 1) after S seconds (default 3)",
    )
    parser.set_defaults(handler=_run)
