"""Basalt's Python SDK: producers and consumers over the gRPC contracts in proto/.

Records are decoded with ``store.record`` (one definition of the layout).
"""

from client.producer import Producer, ProducerConfig, SendError, SendResult

__all__ = ["Producer", "ProducerConfig", "SendError", "SendResult"]
