"""What every Basalt service process shares: telemetry (traces, metrics, logs),
the gRPC server shell, health and reflection, and waiting for SIGTERM.

A service's ``*_main`` module supplies ``add_arguments`` and an async
``serve(args)``; :func:`main` turns them into a process entry point and the
``basalt <service>`` command (admin/cli.py) reuses the same pair. Both add
the common flags (:func:`add_common_arguments`: ``--metrics-port``,
``--log-format``, ``--log-level`` ..., ``--config``, ``--print-config``);
:func:`run` resolves every setting (flag > env > file > default,
:mod:`basalt.services.config`), refuses a bad one before anything starts and
sets telemetry up (:mod:`basalt.common.telemetry`) before the service starts.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import faulthandler
import gc
import logging
import os
import resource
import signal
import sys
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from typing import Any, NoReturn, Protocol, TypeVar

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from google.protobuf.descriptor import ServiceDescriptor
from google.protobuf.message_factory import GetMessageClass
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2

import basalt
from basalt.common import tls as transport
from basalt.common.settings import config_dataclass, one_of, setting, validate
from basalt.common.telemetry import (
    TelemetryConfig,
    server_interceptors,
    setup_telemetry,
)
from basalt.services import auth, config
from basalt.services.auth import interceptor as auth_interceptor
from basalt.services.decoding import decoding
from basalt.services.meta import MetaConfig

T = TypeVar("T")
Serve = Callable[[argparse.Namespace], Coroutine[Any, Any, int]]

#: gRPC core settings the launcher (``basalt cluster up``) gives every service
#: process: :data:`basalt.GRPC_ENV`, which importing ``basalt`` also gives the
#: importing process.
SERVICE_ENV = basalt.GRPC_ENV


def service_env() -> dict[str, str]:
    """The environment to start a service process with: this process's own,
    plus :data:`SERVICE_ENV` for what it does not set."""
    return {**SERVICE_ENV, **os.environ}


def rerun_with_service_env() -> None:
    """Run this command again, in place, under :func:`service_env` - when its
    gRPC was imported before ``basalt`` put the settings in the environment
    (:data:`basalt.GRPC_ENV_MISSED`): for a client measured against the
    services on their own gRPC settings. It replaces the process: call it
    from a ``__main__`` block, before anything else."""
    if basalt.GRPC_ENV_MISSED:
        os.execve(sys.executable, sys.orig_argv, service_env())


log = logging.getLogger(__name__)


#: glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
#: Allocations below this come from the heap, not their own mmap.
MMAP_THRESHOLD_BYTES = 64 * 1024 * 1024
#: Free heap memory kept (not returned to the OS) up to this much.
TRIM_THRESHOLD_BYTES = 256 * 1024 * 1024


def keep_large_buffers() -> bool:
    """Have glibc's malloc serve and keep large buffers in the heap.

    A pull answer is a megabyte or more, allocated and freed several times per
    call (gRPC's message, the records, protobuf's copy). glibc serves blocks
    above its mmap threshold (128 KiB at first, adapting upwards only slowly)
    with their own mmap and returns them on free, so each answer page-faults
    its memory in again: on a 2-vCPU VM that was a third of a pull-service's
    time, and consumption through it ran at ~190 k msgs/s against ~280 k with
    the thresholds raised (docs/benchmarks-history.md). The cost: up to
    TRIM_THRESHOLD_BYTES of freed memory stays with the process. Returns
    False where there is no glibc (nothing changed)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    return bool(
        mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
        and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
    )


def raise_open_files_limit() -> tuple[int, int]:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard limit, as RocketMQ's start
    scripts raise ``ulimit -n``: a store-node holds descriptors per mapped file
    and a pull-service one per connection, and a distribution's default soft
    limit (1,024) is reached long before the hard one. Logs the limits before
    and after at INFO. Returns ``(before, after)`` soft limits; ``before ==
    after`` where the soft limit already was the hard one, or where raising it
    is refused (logged at WARNING, the process runs on at ``before``)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == hard:
        log.info("open files limit %s (already the hard limit)", _limit(soft))
        return soft, soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError) as e:
        # e.g. an unlimited hard limit that the kernel's nr_open caps: keep going
        # on the soft limit rather than refuse to start.
        log.warning("open files limit stays %s (hard %s): %s", _limit(soft), _limit(hard), e)
        return soft, soft
    log.info("open files limit raised from %s to %s (the hard limit)", _limit(soft), _limit(hard))
    return soft, hard


def _limit(value: int) -> str:
    return "unlimited" if value == resource.RLIM_INFINITY else str(value)


#: Traces a service starts itself (a call that arrives with no trace context) that
#: are sampled, unless OTEL_TRACES_SAMPLER says otherwise: every SendStream request
#: and PullBatch call of an untraced client starts one, and recording them all cost
#: ~6 % of batched throughput (BENCHMARKS.md, "Observability"). Calls from a traced
#: client, the CLI's commands and their fan-outs are sampled as their caller chose.
SERVICE_ROOT_SAMPLING_RATIO = 0.01

#: The telemetry settings every service takes (``--metrics-port``, ``--log-level``
#: ...); its name and instance come from the program and its ``name``/``id``.
TELEMETRY = config.Section(
    TelemetryConfig,
    hidden=frozenset({"service_name", "service_instance_id"}),
    defaults={"root_sampling_ratio": SERVICE_ROOT_SAMPLING_RATIO},
)


#: The TLS settings every service takes (``--tls-enable``, ``--tls-cert-file`` ...,
#: basalt.common.tls): what it serves with and what it dials the others and etcd with.
TLS = config.Section(transport.TlsConfig)
#: Request signatures and ACLs (``--auth-enabled``, ``--auth-credentials-file`` ...;
#: docs/security.md), off by default; every service takes them.
AUTH = config.Section(auth.AuthConfig)
#: The event loops a service can run on (:class:`RuntimeConfig`).
EVENT_LOOPS = ("uvloop", "asyncio")


@config_dataclass
class RuntimeConfig:
    """How a service process runs its event loop."""

    event_loop: str = setting(
        default="uvloop",
        check=one_of(*EVENT_LOOPS),
        doc="The event loop the service runs on: uvloop (libuv's loop, the server "
        "extra's; a one-in-flight send costs the store-node ~10 % less CPU and "
        "batched sends go faster, BENCHMARKS.md) or asyncio (the standard library's).",
    )

    def __post_init__(self) -> None:
        validate(self, ValueError)


#: The event loop of every service (``--event-loop``).
RUNTIME = config.Section(RuntimeConfig)
#: The sections every service adds to its own.
COMMON_SECTIONS = (TELEMETRY, TLS, AUTH, RUNTIME)


def add_common_arguments(parser: argparse.ArgumentParser, service_name: str) -> None:
    """The flags every service takes: :data:`TELEMETRY`'s (``--metrics-port``:
    Prometheus text over HTTP, 0 picks a free port, none by default;
    ``--metrics-host``, ``--log-format``, ``--log-level`` ...), ``--config FILE``
    and ``--print-config`` (basalt.services.config). ``service_name`` (e.g.
    ``basalt-store-node``) becomes the telemetry resource's ``service.name``."""
    config.add_flags(parser, config.ServiceSpec(service_name, COMMON_SECTIONS).options())
    config.add_config_arguments(parser)
    parser.set_defaults(service_name=service_name)


def settings(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> config.Resolved:
    """The effective settings of the service run with ``args``: its
    ``service_spec`` (set by its ``add_arguments``), :data:`TELEMETRY` and :data:`TLS`, from
    the flags, the environment and the config file. Resolved once, then kept on
    ``args.settings``. Raises config.ConfigError; with ``--print-config`` a
    required setting no layer gives is :data:`config.UNSET` instead."""
    resolved: config.Resolved | None = getattr(args, "settings", None)
    if resolved is None:
        spec: config.ServiceSpec = getattr(
            args, "service_spec", config.ServiceSpec(args.service_name, ())
        )
        resolved = config.resolve_args(
            spec.with_sections(*COMMON_SECTIONS),
            args,
            environ,
            missing_ok=getattr(args, "print_config", False),
        )
        args.settings = resolved
    return resolved


def telemetry_config(args: argparse.Namespace) -> TelemetryConfig:
    """The telemetry of a service run with ``args`` (:func:`settings`); its
    ``service.instance.id`` is the service's ``name`` or ``id`` where it has
    one (a store-node given a ``broker_id``: ``<name>-<broker_id>``). Raises
    config.ConfigError (a ValueError) for a bad value (a metrics port out of
    range)."""
    resolved = settings(args)
    named = [resolved[n] for n in ("name", "id") if n in resolved.values]
    instance = next((str(v) for v in named if v is not config.UNSET), "")
    if instance and "broker_id" in resolved.values and resolved.given("broker_id"):
        # A member of a replicated broker group: <broker>-<id>, as `cluster up` names it.
        instance = f"{instance}-{resolved['broker_id']}"
    return resolved.build(
        TelemetryConfig, service_name=args.service_name, service_instance_id=instance
    )


def tls_config(args: argparse.Namespace) -> transport.TlsConfig:
    """The TLS of a service run with ``args`` (:func:`settings`): what it serves
    with (:func:`add_port`) and dials with. Raises config.ConfigError."""
    return settings(args).build(transport.TlsConfig)


def run(serve: Serve, args: argparse.Namespace) -> int:
    """Resolve and check the settings (:func:`settings`; every section's
    dataclass built once): on a bad or missing value print the one-line
    message and return 2 before anything starts. With ``--print-config``,
    print them (:func:`basalt.services.config.format_table`; a required one
    not given shows as unset) and return 0.
    Otherwise run ``serve(args)`` (``args.settings`` holds them) on a fresh
    event loop of :class:`RuntimeConfig`'s kind (:func:`run_on`), telemetry set
    up (the metrics endpoint logged, ignored config keys warned of), the open
    files limit raised (:func:`raise_open_files_limit`), large buffers kept
    (:func:`keep_large_buffers`), the objects made so far frozen out of the
    garbage collector's walks (``gc.freeze``), SIGQUIT dumping every thread's
    stack to stderr; its exit status. Spans
    and metrics are flushed once ``serve`` returns (the service stopped),
    before the caller exits."""
    try:
        telemetry_settings = telemetry_config(args)
        tls_settings = tls_config(args)
        resolved = settings(args)
        resolved.check(**{TelemetryConfig.__name__: _telemetry_hidden(telemetry_settings)})
        event_loop = resolved.build(RuntimeConfig).event_loop
    except config.ConfigError as e:
        print(f"{args.service_name}: {e}", file=sys.stderr)
        return 2
    if getattr(args, "print_config", False):
        sys.stdout.write(config.format_table(resolved))
        return 0
    try:
        telemetry = setup_telemetry(telemetry_settings, tls_settings)
    except (OSError, ValueError) as e:
        print(f"{args.service_name}: metrics: {e}", file=sys.stderr)
        return 2
    for key in resolved.ignored:
        log.warning("config: RocketMQ key %s is ignored (Basalt has no such setting)", key)
    if telemetry.metrics_url is not None:
        log.info("metrics on %s", telemetry.metrics_url)
    raise_open_files_limit()
    keep_large_buffers()
    # kill -QUIT writes every thread's stack to stderr and the service goes on
    # (a JVM broker's thread dump): what a process that will not stop waits on.
    faulthandler.register(signal.SIGQUIT, all_threads=True)
    try:
        _setup_auth(resolved)
    except (OSError, ValueError) as e:
        print(f"{args.service_name}: auth: {e}", file=sys.stderr)
        return 2
    # What the imports made (modules, classes, protobuf descriptors: most of the
    # ~60,000 objects a store-node tracks) lives as long as the process: frozen,
    # a full collection no longer walks it (~4 us of a one-in-flight send's CPU).
    gc.freeze()
    try:
        return run_on(event_loop, serve(args))
    finally:
        telemetry.shutdown()


def run_on(event_loop: str, main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` to its end on a fresh loop of the kind ``event_loop`` names
    (:data:`EVENT_LOOPS`), as ``asyncio.run`` does; its result.

    uvloop's loop runs its own handles and I/O in C, where asyncio's runs them
    in Python: with one message in flight a store-node turns its loop four times
    a send, so the loop itself is a visible part of what a send costs."""
    if event_loop == "uvloop":
        import uvloop  # the server extra's; imported only by a service that runs on it

        return uvloop.run(main)
    return asyncio.run(main)


def _setup_auth(resolved: config.Resolved) -> None:
    """Turn auth on for this process when its settings say so (the users and
    ACLs watched from the service's etcd, when it has one, over the service's TLS)."""
    with_meta = any(s.cls is MetaConfig and resolved.enabled(s) for s in resolved.spec.sections)
    auth.setup_process(
        resolved.build(auth.AuthConfig),
        resolved.build(MetaConfig) if with_meta else None,
        resolved.build(transport.TlsConfig),
    )


def _telemetry_hidden(telemetry: TelemetryConfig) -> dict[str, object]:
    return {
        "service_name": telemetry.service_name,
        "service_instance_id": telemetry.service_instance_id,
    }


def main(
    prog: str,
    description: str,
    add_arguments: Callable[[argparse.ArgumentParser], None],
    serve: Serve,
    argv: Sequence[str] | None = None,
) -> int:
    """A service process's entry point: parse ``argv`` (the service's flags and
    :func:`add_common_arguments`; ``prog`` ``"basalt store-node"`` names the
    service ``basalt-store-node``), then :func:`run`."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    add_arguments(parser)
    add_common_arguments(parser, prog.replace(" ", "-"))
    return run(serve, parser.parse_args(argv))


def exit_now(code: int) -> NoReturn:
    """End a service process with ``code`` once :func:`main` has returned, without
    the interpreter's teardown. Everything was closed by the service's stop; the
    teardown would only free every object one by one (~0.3 s for a store-node
    holding 40,000 queues, counted in a restart). Logs and stdio are flushed
    first. For ``__main__`` blocks only: in-process callers use :func:`main`."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def stop_signal() -> asyncio.Event:
    """An event set by the first SIGTERM or SIGINT (the graceful-stop path).

    Call it first thing in ``serve``: a signal that arrives while the service
    is still starting must stop it gracefully too, not kill it by default.
    """
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop


class Running(Protocol):
    """A started service: where it serves, and its graceful stop."""

    @property
    def address(self) -> str: ...

    async def stop(self, grace_s: float = ...) -> None: ...


async def serve_until_stopped(
    label: str, running: Running, stop: asyncio.Event, *, grace_s: float = 5.0
) -> None:
    """Say where ``running`` serves (the first line on stdout, which ``basalt
    cluster up`` and the tests read), wait for ``stop`` and stop it gracefully,
    in-flight calls given ``grace_s``."""
    print(f"{label} serving on {running.address}", flush=True)
    await stop.wait()
    with stopping(grace_s):
        await running.stop(grace_s)


#: How long past its grace period a graceful stop may run before the process
#: reports what it waits on (:func:`stopping`): closing the store and etcd's
#: leases after the calls end takes seconds, not this.
STOP_REPORT_AFTER_S = 30.0


@contextlib.contextmanager
def stopping(grace_s: float, report_after_s: float = STOP_REPORT_AFTER_S) -> Iterator[None]:
    """Log "stopping"; a stop still under way ``grace_s + report_after_s`` later
    is reported at ERROR with every asyncio task's await chain (:func:`awaiting`)
    and, on stderr, every thread's stack (faulthandler): a stop that hangs
    names the await or the join it hangs on, once, and goes on waiting (an
    orchestrator's kill ends it).
    The threads' dump is armed apart from the loop, so a blocked loop is
    reported too."""
    log.info("stopping")
    after_s = grace_s + report_after_s
    loop = asyncio.get_running_loop()
    report = loop.call_later(after_s, _report_stop, after_s)
    faulthandler.dump_traceback_later(after_s, exit=False)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()
        report.cancel()


def _report_stop(after_s: float) -> None:
    log.error(
        "still stopping after %.0f s; what each task waits on (threads follow on stderr):\n%s",
        after_s,
        "\n".join(awaiting(task) for task in asyncio.all_tasks()),
    )


def awaiting(task: asyncio.Task[Any]) -> str:
    """``task``'s name and its await chain, outermost first: each coroutine's
    place (file:line in function), then what the innermost awaits (a future,
    an event). ``Task.print_stack`` shows only the outermost coroutine of a
    suspended task, which says nothing of the await it hangs on."""
    lines = [task.get_name()]
    step: Any = task.get_coro()
    while step is not None:
        frame = getattr(step, "cr_frame", None) or getattr(step, "ag_frame", None)
        frame = frame or getattr(step, "gi_frame", None)
        if frame is None:
            # A future's iterator (C) does not name its future; the task does.
            lines.append(f"  awaits {getattr(task, '_fut_waiter', None) or step!r}")
            break
        code = frame.f_code
        lines.append(f"  {code.co_filename}:{frame.f_lineno} in {code.co_qualname}")
        step = (
            getattr(step, "cr_await", None)
            or getattr(step, "ag_await", None)
            or getattr(step, "gi_yieldfrom", None)
        )
    return "\n".join(lines)


#: The default backlog of calls a service's gRPC server takes before Python
#: picks them up (:func:`grpc_server`): five times a burst of 2,000 long polls.
MAX_PENDING_CALLS = 10_000


def grpc_server(
    max_message_bytes: int, *, max_pending_calls: int = MAX_PENDING_CALLS
) -> grpc.aio.Server:
    """A grpc.aio server whose message limit fits the largest message it must
    take, and which queues up to ``max_pending_calls`` arrived calls that the
    event loop has not picked up yet, refusing none below that.

    gRPC core queues a call that arrives before the server has asked for the
    next one; the aio server asks one call at a time from its event loop, so a
    burst of calls (2,000 long polls at once) builds such a backlog. Past 1,000
    queued calls core's "random early detection" cancels a newcomer with a
    probability rising to 1 at 3,000 (``grpc.server.max_pending_requests`` and
    ``..._hard_limit``): the caller sees CANCELLED, nothing is logged, and a
    held pull is dropped before it is ever held. Both limits set to
    ``max_pending_calls`` leave no random drop: the backlog is bounded (each
    queued call holds an HTTP/2 stream and its call state, not a thread) and a
    call past it is refused, the one overload that still answers CANCELLED.

    Every call gets a server span (:func:`~basalt.common.telemetry.server_interceptors`)
    in the trace its caller's metadata names, and, with auth on, has its
    signature and ACL checked first (basalt.services.auth)."""
    return grpc.aio.server(
        interceptors=[*server_interceptors(), *auth_interceptor.server_interceptors()],
        options=(
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
            ("grpc.server.max_pending_requests", max_pending_calls),
            ("grpc.server.max_pending_requests_hard_limit", max_pending_calls),
        ),
    )


def add_port(server: grpc.aio.Server, listen: str, tls: transport.TlsConfig | None) -> int:
    """Bind ``server`` to ``listen`` (port 0: a free one) - with TLS when ``tls``
    is enabled (:func:`basalt.common.tls.server_credentials`: certificates
    re-read when their files change, client certificates required when it
    says so), plaintext otherwise; the port bound. Raises what binding raises
    (the address in use), ValueError/OSError for TLS files it cannot use."""
    if transport.enabled(tls):
        assert tls is not None
        return server.add_secure_port(listen, transport.server_credentials(tls))
    return server.add_insecure_port(listen)


_HANDLERS = {
    (False, False): grpc.unary_unary_rpc_method_handler,
    (False, True): grpc.unary_stream_rpc_method_handler,
    (True, False): grpc.stream_unary_rpc_method_handler,
    (True, True): grpc.stream_stream_rpc_method_handler,
}


def add_servicer(
    server: grpc.aio.Server,
    servicer: object,
    service: ServiceDescriptor,
    *,
    may_answer_bytes: frozenset[str] = frozenset(),
    only: frozenset[str] | None = None,
) -> None:
    """Register ``servicer``'s methods for ``service``, as protoc's generated
    ``add_<Service>Servicer_to_server`` does, behind the decoding layer (a
    request that does not parse: INVALID_ARGUMENT, basalt.services.decoding),
    except that the methods named in
    ``may_answer_bytes`` may also return an already serialized answer (bytes,
    e.g. a downstream answer passed through), sent as is. With ``only``, just
    the methods it names: gRPC answers any other UNIMPLEMENTED."""
    handlers = {}
    for method in service.methods:
        if only is not None and method.name not in only:
            continue
        request_class = GetMessageClass(method.input_type)
        serialize: Callable[[Any], bytes] = GetMessageClass(method.output_type).SerializeToString
        if method.name in may_answer_bytes:
            serialize = _bytes_or(serialize)
        # A request that does not parse is refused INVALID_ARGUMENT (basalt.services.decoding).
        behavior, deserialize = decoding(
            f"{service.name}/{method.name}",
            getattr(servicer, method.name),
            request_class,
            request_streaming=method.client_streaming,
        )
        handlers[method.name] = _HANDLERS[method.client_streaming, method.server_streaming](
            behavior,
            request_deserializer=deserialize,
            response_serializer=serialize,
        )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(service.full_name, handlers),)
    )
    server.add_registered_method_handlers(service.full_name, handlers)


def _bytes_or(serialize: Callable[[Any], bytes]) -> Callable[[Any], bytes]:
    def serialize_unless_bytes(answer: Any) -> bytes:
        return answer if isinstance(answer, bytes) else serialize(answer)

    return serialize_unless_bytes


#: gRPC server reflection v1. grpcio-reflection (1.85) serves only v1alpha;
#: v1 is the same service renamed (same messages, field for field, and the same
#: one method), so the v1alpha servicer answers both names. Current clients
#: (grpcurl, Postman, grpc-java/go reflection) ask v1 first.
REFLECTION_V1_SERVICE = "grpc.reflection.v1.ServerReflection"
_REFLECTION_V1_FILE = "grpc/reflection/v1/reflection.proto"


def _register_reflection_v1() -> None:
    """Add v1's reflection.proto to the default descriptor pool (v1alpha's with
    its package renamed), so that reflection can describe the v1 service it
    lists. Nothing when some library registered it already."""
    pool = descriptor_pool.Default()
    try:
        pool.FindFileByName(_REFLECTION_V1_FILE)
        return
    except KeyError:
        pass
    old, new = "grpc.reflection.v1alpha", "grpc.reflection.v1"
    file = descriptor_pb2.FileDescriptorProto()
    reflection_pb2.DESCRIPTOR.CopyToProto(file)
    file.name, file.package = _REFLECTION_V1_FILE, new
    file.ClearField("options")  # v1alpha's are marked deprecated; v1 is not
    for message in file.message_type:
        for f in message.field:
            if f.type_name.startswith(f".{old}."):
                f.type_name = f".{new}." + f.type_name[len(old) + 2 :]
    for rpc in file.service[0].method:
        rpc.input_type = rpc.input_type.replace(f".{old}.", f".{new}.")
        rpc.output_type = rpc.output_type.replace(f".{old}.", f".{new}.")
    pool.Add(file)


def add_health_and_reflection(server: grpc.aio.Server, service: str) -> health.aio.HealthServicer:
    """``grpc.health.v1`` (call :func:`set_serving` once ready) and reflection,
    v1 and v1alpha (see :data:`REFLECTION_V1_SERVICE`), of ``service``, health
    and reflection themselves."""
    servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    _register_reflection_v1()
    names = (service, health.SERVICE_NAME, REFLECTION_V1_SERVICE, reflection.SERVICE_NAME)
    reflecting = reflection.aio.ReflectionServicer(names)
    info = grpc.stream_stream_rpc_method_handler(
        reflecting.ServerReflectionInfo,
        request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
        response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        tuple(
            grpc.method_handlers_generic_handler(name, {"ServerReflectionInfo": info})
            for name in (REFLECTION_V1_SERVICE, reflection.SERVICE_NAME)
        )
    )
    return servicer


async def set_serving(servicer: health.aio.HealthServicer, service: str, serving: bool) -> None:
    """Report ``service`` (and the server as a whole) SERVING or NOT_SERVING."""
    status = (
        health_pb2.HealthCheckResponse.SERVING
        if serving
        else health_pb2.HealthCheckResponse.NOT_SERVING
    )
    await servicer.set(service, status)
    await servicer.set("", status)
