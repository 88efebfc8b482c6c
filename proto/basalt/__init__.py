"""Basalt: a RocketMQ-style message queue. The one top-level package.

Its sub-packages come from the folders the user laid out (setup.py's
``package-dir`` mapping): ``basalt.store`` (store/, the engine),
``basalt.services`` (services/), ``basalt.admin`` (admin/), ``basalt.client``
(client/, the SDK), and from here, proto/basalt/: ``basalt.v1``, the generated
modules of the gRPC contracts (regenerate them with ``python
scripts/generate_protos.py``, see ``proto/README.md``), and ``basalt.common``,
what the SDK and the services share.
"""

import os
import sys

#: gRPC core settings every Basalt process runs with - the services (``basalt
#: cluster up`` starts them with these, as RocketMQ's start scripts give the
#: broker its JVM options) and an application using the SDK alike; a value
#: already in the environment wins (``GRPC_EXPERIMENTS=`` keeps gRPC's
#: defaults).
#:
#: ``GRPC_EXPERIMENTS``: serve and dial through gRPC core's iomgr poller rather
#: than the EventEngine's (the ``event_engine_listener`` and
#: ``event_engine_client`` experiments, on by default in recent grpcio). On
#: 2 vCPUs a one-in-flight round trip on a stream took ~30-70 us less at the
#: median on either end, and a unary call ~80 us (docs/store-node.md, "The
#: gRPC transport setting"); throughput held.
GRPC_ENV = {"GRPC_EXPERIMENTS": "-event_engine_client,-event_engine_listener"}

#: gRPC reads its settings once, when first imported: importing ``basalt`` puts
#: GRPC_ENV's defaults into the environment, in time for this process's gRPC
#: unless it was imported first (then True: only processes started from here
#: get them; ``basalt.services.process.rerun_with_service_env`` starts afresh).
GRPC_ENV_MISSED = "grpc" in sys.modules and any(name not in os.environ for name in GRPC_ENV)
for _name, _value in GRPC_ENV.items():
    os.environ.setdefault(_name, _value)
