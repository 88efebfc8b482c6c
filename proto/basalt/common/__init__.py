"""What the SDK and the services both need, and nothing else (RocketMQ's ``common``).

The modules here import the standard library, protobuf and the generated
``basalt.v1`` only: never the engine (:mod:`basalt.store`), the services or
grpc's server side, so ``import basalt.client`` stays small. The engine and
the services import the same modules, so each format is defined once.
"""
