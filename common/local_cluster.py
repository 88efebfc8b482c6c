"""A local cluster's data directory, and how a CLI command finds what to dial with.

``basalt cluster up`` (:mod:`basalt.services.cluster.local`) writes one entry
per process it started to ``<data-dir>/cluster.json``; ``down`` and ``status``
read them back. The tools that default to the local cluster (the quickstart,
the admin CLI) find, each strongest first (a flag, else an environment
variable, else the nearest ``.basalt`` directory upward):

- an address: :func:`discover`;
- the TLS to dial with: :func:`discover_tls` (``<data-dir>/tls/``);
- the credentials to sign with: :func:`discover_credentials`
  (``<data-dir>/auth/admin.json``).

The state file is a JSON list of :class:`ProcessInfo` objects::

    [{"role": "etcd", "name": "etcd", "pid": 4242,
      "address": "127.0.0.1:2379", "log": "/.../.basalt/logs/etcd.log",
      "metrics": null},
     {"role": "store-node", "name": "broker-a", ..., "metrics": "127.0.0.1:40211"}, ...]

``metrics`` (the process's Prometheus endpoint, ``host:port``; null for etcd)
came later: a file written before it reads back with ``metrics`` None; so did
``tls`` (true: the process serves TLS, ``basalt cluster up --tls``; its CA and
a client certificate are in ``<data-dir>/tls/``, :func:`local_tls`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from basalt.common import tls as transport
from basalt.common.auth import CREDENTIALS_ENV, Credentials

#: The state file's name, in the cluster's data directory.
CLUSTER_FILE = "cluster.json"
#: Where ``basalt cluster up`` keeps its state unless told otherwise.
DEFAULT_DATA_DIR = Path(".basalt")
#: ``basalt cluster up --tls``'s certificates, in the cluster's data directory.
TLS_DIR = "tls"
#: In :data:`TLS_DIR`: the CA, and the certificate and key the tools present.
CA_FILE = "ca.pem"
CLIENT_CERT_FILE = "client.pem"
CLIENT_KEY_FILE = "client-key.pem"
#: Where ``basalt cluster up --auth`` writes the admin user's credentials and
#: the cluster key, under its data directory.
LOCAL_CREDENTIALS = Path("auth") / "admin.json"
LOCAL_CLUSTER_KEY = Path("auth") / "cluster.key"
#: The help of every command's ``--credentials FILE`` (:func:`discover_credentials`).
CREDENTIALS_HELP = (
    f"sign calls with this {{accessKey, secretKey}} file (default: env {CREDENTIALS_ENV}, "
    "else the local cluster's admin user; none: unsigned)"
)


@dataclass(slots=True)
class ProcessInfo:
    """One process of the cluster, as recorded in cluster.json."""

    role: str  # etcd | store-node | pull-service | admin
    name: str
    pid: int
    address: str
    log: str
    #: ``host:port`` of its Prometheus metrics endpoint (``/metrics``); None: none.
    metrics: str | None = None
    #: A pull-service's ``host:port`` for RocketMQ 5 clients
    #: (apache.rocketmq.v2.MessagingService); None: not served.
    rocketmq_v2: str | None = None
    #: Serves (and, etcd, is dialed) with mutual TLS: ``basalt cluster up --tls``.
    tls: bool = False
    #: A store-node's broker group (its broker name) and its id in it.
    group: str | None = None
    broker_id: int | None = None

    @property
    def metrics_url(self) -> str | None:
        """``http://<metrics>/metrics`` (``https`` with TLS: a client certificate
        signed by the cluster's CA is required), or None without an endpoint."""
        scheme = "https" if self.tls else "http"
        return None if self.metrics is None else f"{scheme}://{self.metrics}/metrics"


def write_processes(state: Path, processes: Sequence[ProcessInfo]) -> None:
    """Write ``processes`` to the state file ``state``, replacing what it held."""
    state.write_text(json.dumps([asdict(p) for p in processes], indent=2))


def load_processes(state: Path) -> list[ProcessInfo]:
    """The processes recorded in the state file ``state``.

    Raises OSError when it cannot be read, ValueError when it is not JSON and
    TypeError when an entry is not a :class:`ProcessInfo`.
    """
    return [ProcessInfo(**p) for p in json.loads(state.read_text())]


def local_address(role: str, data_dir: Path = DEFAULT_DATA_DIR) -> str | None:
    """The address of the first ``role`` process (etcd, store-node,
    pull-service, admin) of the cluster ``basalt cluster up`` started in ``data_dir``;
    None when there is none (the tools' default endpoint)."""
    try:
        processes = load_processes(data_dir / CLUSTER_FILE)
    except (OSError, ValueError, TypeError):
        return None
    return next((p.address for p in processes if p.role == role), None)


def client_tls(data_dir: Path) -> transport.TlsConfig:
    """The TlsConfig a tool dials ``basalt cluster up --tls``'s cluster in
    ``data_dir`` with: its CA, and the client certificate made for the tools."""
    certs = data_dir / TLS_DIR
    return transport.TlsConfig(
        tls_enable=True,
        tls_ca_file=certs / CA_FILE,
        tls_cert_file=certs / CLIENT_CERT_FILE,
        tls_key_file=certs / CLIENT_KEY_FILE,
    )


def local_tls(data_dir: Path = DEFAULT_DATA_DIR) -> transport.TlsConfig | None:
    """:func:`client_tls` when the cluster recorded in ``data_dir`` runs with TLS;
    None when it does not (or there is none)."""
    try:
        processes = load_processes(data_dir / CLUSTER_FILE)
    except (OSError, ValueError, TypeError):
        return None
    return client_tls(data_dir) if any(p.tls for p in processes) else None


def discover_tls(environ: Mapping[str, str] | None = None) -> transport.TlsConfig:
    """The TLS a CLI command dials with, strongest first: ``BASALT_TLS_*`` in the
    environment when ``BASALT_TLS_ENABLE`` is set (:func:`basalt.common.tls.from_env`);
    the local cluster's in the nearest ``.basalt`` (:func:`local_tls`);
    plaintext. Raises ValueError for a bad ``BASALT_TLS_*`` value."""
    environ = os.environ if environ is None else environ
    if environ.get(transport.ENV_PREFIX + "TLS_ENABLE", "").strip():
        return transport.from_env(environ)
    data_dir = find_data_dir()
    found = None if data_dir is None else local_tls(data_dir)
    return found or transport.PLAINTEXT


def discover_credentials(given: str | None) -> Credentials | None:
    """The credentials a CLI command signs with, strongest first: the file
    ``given`` (a flag), the file named by ``BASALT_CREDENTIALS``, the local
    cluster's admin user (:data:`LOCAL_CREDENTIALS` in the nearest data
    directory upward, as :func:`discover` finds addresses); None when none is
    there (calls go unsigned). Raises OSError or ValueError for a named file
    that cannot be read."""
    named = given or os.environ.get(CREDENTIALS_ENV, "").strip()
    if named:
        return Credentials.from_file(named)
    data_dir = find_data_dir()
    if data_dir is not None and (data_dir / LOCAL_CREDENTIALS).is_file():
        return Credentials.from_file(data_dir / LOCAL_CREDENTIALS)
    return None


def find_data_dir(start: Path | None = None) -> Path | None:
    """The nearest ``.basalt`` directory (:data:`DEFAULT_DATA_DIR`) in ``start``
    (default: the current directory) or a directory above it, as git finds
    ``.git``: a command run anywhere inside a project reaches the cluster
    ``basalt cluster up`` started at its top. None when there is none."""
    here = (start or Path.cwd()).resolve()
    for directory in (here, *here.parents):
        candidate = directory / DEFAULT_DATA_DIR
        if candidate.is_dir():
            return candidate
    return None


class ClusterNotFoundError(LookupError):
    """:func:`discover` found no address; the message names every place it looked."""


def discover(role: str, *, flag: str, given: str | None, env: str | None = None) -> str:
    """The address a CLI command reaches ``role`` (etcd, pull-service, admin) at,
    strongest first: the flag's value ``given``; the environment variable
    ``env`` (e.g. BASALT_ETCD); the ``role`` process of the local cluster in
    the nearest ``.basalt`` directory (:func:`find_data_dir`).

    The one place the CLI's commands find a cluster, so each says the same.
    Raises :class:`ClusterNotFoundError` naming the flag, the variable and the
    directory searched when none gives one.
    """
    if given:
        return given
    if env is not None and (from_env := os.environ.get(env, "").strip()):
        return from_env
    data_dir = find_data_dir()
    address = None if data_dir is None else local_address(role, data_dir)
    if address is not None:
        return address
    places = f"no {flag}" + (f", no {env} in the environment" if env else "")
    where = "" if data_dir is None else f" ({data_dir} has no running {role})"
    raise ClusterNotFoundError(
        f"{places}, and no local cluster in ./.basalt or a directory above{where}: "
        "start one with `basalt cluster up`"
    )
