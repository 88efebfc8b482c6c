"""What the SDK and the services both need, and nothing else (RocketMQ's ``common``).

The modules here import the standard library (``settings``, ``message``,
``record`` and its C extension, ``local_cluster``), protobuf's descriptors
(``protowire``) and grpc's error type (``status``) only: never the engine
(:mod:`basalt.store`), the services or lark, so ``import basalt.client`` stays
small (tests/common/test_isolation.py holds it to that). The engine and
the services import the same modules, so each format is defined once.
"""
