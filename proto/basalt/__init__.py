"""Basalt: a RocketMQ-style message queue. The one top-level package.

Its sub-packages come from the folders the user laid out (setup.py's
``package-dir`` mapping): ``basalt.store`` (store/, the engine),
``basalt.services`` (services/), ``basalt.admin`` (admin/), ``basalt.client``
(client/, the SDK), and from here, proto/basalt/: ``basalt.v1``, the generated
modules of the gRPC contracts (regenerate them with ``python
scripts/generate_protos.py``, see ``proto/README.md``), and ``basalt.common``,
what the SDK and the services share.
"""
