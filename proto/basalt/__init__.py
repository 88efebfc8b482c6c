"""Basalt's gRPC contracts: the generated modules of ``proto/basalt/*/*.proto``.

``basalt.v1.common_pb2``, ``basalt.v1.store_node_pb2`` and so on; regenerate
them with ``python scripts/generate_protos.py`` (see ``proto/README.md``).
"""
