"""basalt.common keeps the two sides apart: ``import basalt.client`` loads
neither the engine nor the services (nor lark, nor the admin tools, nor any
module of an extra), and the engine that imports the same codec still loads
no grpc or protobuf. The SDK runs where no extra is installed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support.absent import SERVER, SPARK, run_python_without

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
assert [r.body for r in decode_records(records)] == [b"body"]
"""

#: The engine as a library (STYLE §1: no network imports), tools included.
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
