"""Basalt as real processes: the ``basalt`` command line, service processes, and
the pull path (store-nodes and a pull-service) as a small cluster of processes.

Every wait on a child is capped by :data:`~tests.support.timeouts.SUBPROCESS_TIMEOUT_S`.
The ``processes`` fixture is registered by ``tests/conftest.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from basalt.services.cluster.etcd import EtcdProcess, free_port
from basalt.services.meta import MetaClient, MetaConfig, TopicConfig
from basalt.v1 import common_pb2 as pb
from basalt.v1 import pull_service_pb2_grpc as ps_grpc
from tests.support.nodes import BROKERS
from tests.support.rpc import pull_queue
from tests.support.timeouts import SUBPROCESS_TIMEOUT_S

#: The repository's root: the working directory of every child the tests start.
REPO_ROOT = Path(__file__).resolve().parents[2]

# -- the command line ----------------------------------------------------------------------


async def run_basalt(*argv: str, env: Mapping[str, str] | None = None) -> tuple[int, str, str]:
    """``basalt ARGV...`` (``python -m basalt.admin``) as a user runs it, with
    ``env`` over this process's environment; returns its exit status, stdout
    and stderr. Killed if it outlives the cap."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "basalt.admin",
        *argv,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=REPO_ROOT,
        env=None if env is None else {**os.environ, **env},
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), SUBPROCESS_TIMEOUT_S)
    finally:
        if proc.returncode is None:  # the cap passed, or the test was cancelled
            proc.kill()
            await proc.wait()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def run_basalt_sync(
    *argv: str, env: Mapping[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """:func:`run_basalt` for plain threads: the completed process (text output);
    run in ``cwd`` (default: the repository's root)."""
    return subprocess.run(
        [sys.executable, "-m", "basalt.admin", *argv],
        cwd=cwd or REPO_ROOT,
        env=None if env is None else {**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
        check=False,
    )


@contextlib.contextmanager
def local_cluster(
    data: Path, *args: str, env: Mapping[str, str] | None = None
) -> Iterator[list[dict[str, Any]]]:
    """``basalt cluster up --data-dir DATA ARGS...`` (its services inherit
    ``env`` over this process's environment); yields ``cluster status --json``'s
    rows (every process's role, name, addresses and ``/metrics`` URL); ``basalt
    cluster down`` always, which must succeed."""
    started = run_basalt_sync("cluster", "up", "--data-dir", str(data), *args, env=env)
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        status = run_basalt_sync("cluster", "status", "--data-dir", str(data), "--json")
        assert status.returncode == 0, status.stdout + status.stderr
        rows: list[dict[str, Any]] = json.loads(status.stdout)
        yield rows
    finally:
        stopped = run_basalt_sync("cluster", "down", "--data-dir", str(data))
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr


# -- service processes ---------------------------------------------------------------------


def store_node_process(directory: Path, name: str = "broker-a", *args: str) -> ServiceProcess:
    """A store-node process named ``name`` with its store in ``directory / name``
    and its log in ``directory / "<name>.log"``, started with ``args`` after
    those (see :class:`ServiceProcess`)."""
    return ServiceProcess(
        directory / f"{name}.log",
        "basalt.services.store_node.main",
        "--name",
        name,
        "--data-dir",
        str(directory / name),
        *args,
    )


class ServiceProcess:
    """``python -m <module> --listen 127.0.0.1:<free port> ARGS...``, a service
    whose first stdout line says where it serves; stderr goes to ``log``."""

    def __init__(self, log: Path, module: str, *args: str) -> None:
        self.port = free_port()
        self.log = log
        self.args = [sys.executable, "-m", module, "--listen", f"127.0.0.1:{self.port}", *args]
        self.start()

    def start(self) -> None:
        """Spawn the process; again after it ended, on the same port with the same
        arguments (its stderr appended to the same log)."""
        with self.log.open("ab") as stderr:
            self.proc = subprocess.Popen(
                self.args, stdout=subprocess.PIPE, stderr=stderr, cwd=os.getcwd()
            )

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def wait_serving(self) -> str:
        """Block until the process says it serves on its address; returns that line."""
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().decode()
        assert f"serving on {self.address}" in line, line
        return line.strip()

    def stop(self, sig: int = signal.SIGTERM) -> int:
        """Send ``sig`` unless it already ended; returns its exit status. One that
        outlives the cap is killed once it has written its threads' stacks
        (:func:`signal_and_wait`), and the test fails with the log's tail: what
        it hung on."""
        code = signal_and_wait(self.proc, sig, SUBPROCESS_TIMEOUT_S)
        if code is None:
            tail = self.log.read_text(errors="replace")[-12_000:]
            raise AssertionError(
                f"{self.args[2]} did not exit within {SUBPROCESS_TIMEOUT_S} s of signal "
                f"{sig}; its log's tail (stacks at the end):\n{tail}"
            )
        return code


def signal_and_wait(proc: subprocess.Popen[bytes], sig: int, timeout_s: float) -> int | None:
    """Send ``sig`` to a service process unless it already ended, and wait up to
    ``timeout_s``: its exit status. None when it outlived that: it was then asked
    for its threads' stacks (SIGQUIT: every service registers faulthandler on
    it, written to its stderr, the log), given a moment to write them, killed
    and reaped."""
    if proc.poll() is None:
        proc.send_signal(sig)
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGQUIT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
        proc.kill()
        proc.wait()
        return None


@pytest.fixture
def processes() -> Iterator[list[ServiceProcess]]:
    """A list for the test's service processes: any still running at teardown is killed."""
    started: list[ServiceProcess] = []
    try:
        yield started
    finally:
        for p in started:
            if p.proc.poll() is None:
                p.stop(signal.SIGKILL)


# -- the pull path as processes ------------------------------------------------------------

#: The topic of :func:`create_topic`: QUEUES queues on each of BROKERS.
TOPIC = "E2E"
QUEUES = 2


async def create_topic(etcd: EtcdProcess, cluster: str) -> None:
    async with MetaClient(MetaConfig(endpoints=(etcd.endpoint,), cluster=cluster)) as meta:
        await meta.create_topic(
            TopicConfig(
                topic_name=TOPIC, read_queue_nums=QUEUES, write_queue_nums=QUEUES, brokers=BROKERS
            )
        )


async def registered(etcd: EtcdProcess, cluster: str) -> tuple[set[str], set[str], set[str]]:
    """Live brokers, pull-services and consumers of group G in etcd."""
    async with MetaClient(MetaConfig(endpoints=(etcd.endpoint,), cluster=cluster)) as meta:
        return (
            set(await meta.list_brokers()),
            set(await meta.list_pull_services()),
            set(await meta.list_consumers("G")),
        )


async def consume(
    stub: ps_grpc.PullServiceAsyncStub, group: str, subscription: pb.Subscription | None = None
) -> dict[tuple[str, int], list[bytes]]:
    """Everything every queue of TOPIC returns through Pull, in the order returned."""
    got: dict[tuple[str, int], list[bytes]] = {}
    for broker in BROKERS:
        for q in range(QUEUES):
            got[(broker, q)] = await pull_queue(
                stub, broker, q, topic=TOPIC, group=group, commit=False, subscription=subscription
            )
    return got


def start_processes(
    tmp_path: Path,
    etcd: EtcdProcess,
    cluster: str,
    lease_ttl_s: int,
    started: list[ServiceProcess],
) -> tuple[dict[str, ServiceProcess], ServiceProcess]:
    """A store-node process per broker of BROKERS (data and logs under ``tmp_path``)
    and pull-service ``ps-1`` (consumers heartbeat every second), on ``etcd`` as
    ``cluster``; each is appended to ``started`` as soon as it is spawned (the
    ``processes`` fixture's list, which kills leftovers). Returns once all of them
    serve: the store-nodes by broker name, and the pull-service."""
    common = ("--etcd", etcd.endpoint, "--cluster", cluster, "--lease-ttl-s", str(lease_ttl_s))
    nodes: dict[str, ServiceProcess] = {}
    for name in BROKERS:
        nodes[name] = store_node_process(tmp_path, name, *common)
        started.append(nodes[name])
    pull = ServiceProcess(
        tmp_path / "ps-1.log",
        "basalt.services.pull_service.main",
        "--id",
        "ps-1",
        "--heartbeat-interval-ms",
        "1000",
        *common,
    )
    started.append(pull)
    for p in nodes.values():
        p.wait_serving()
    assert pull.wait_serving() == f"pull-service ps-1 serving on {pull.address}"
    return nodes, pull
