"""The state file of a local cluster: ``<data-dir>/cluster.json``.

``basalt cluster up`` (:mod:`basalt.services.cluster.local`) writes one entry
per process it started; ``down`` and ``status`` read them back, and the tools
that default to the local cluster (the quickstart, the admin CLI) find an
address in it with :func:`discover` (a flag, else an environment variable,
else the nearest ``.basalt`` directory upward). The file is a JSON list of
:class:`ProcessInfo` objects::

    [{"role": "etcd", "name": "etcd", "pid": 4242,
      "address": "127.0.0.1:2379", "log": "/.../.basalt/logs/etcd.log",
      "metrics": null},
     {"role": "store-node", "name": "broker-a", ..., "metrics": "127.0.0.1:40211"}, ...]

``metrics`` (the process's Prometheus endpoint, ``host:port``; null for etcd)
came later: a file written before it reads back with ``metrics`` None.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

#: The state file's name, in the cluster's data directory.
CLUSTER_FILE = "cluster.json"
#: Where ``basalt cluster up`` keeps its state unless told otherwise.
DEFAULT_DATA_DIR = Path(".basalt")


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

    @property
    def metrics_url(self) -> str | None:
        """``http://<metrics>/metrics``, or None without an endpoint."""
        return None if self.metrics is None else f"http://{self.metrics}/metrics"


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
