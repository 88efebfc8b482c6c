"""Basalt's Python SDK: producers and consumers over the gRPC contracts in proto/.

Records are decoded with ``store.record`` (one definition of the layout).
"""

from client.lite_pull_consumer import (
    ConsumeFromWhere,
    LitePullConfig,
    LitePullConsumer,
    MessageQueue,
)
from client.producer import ClientError, Producer, ProducerConfig, SendResult
from client.sync import SyncLitePullConsumer, SyncProducer

__all__ = [
    "ClientError",
    "ConsumeFromWhere",
    "LitePullConfig",
    "LitePullConsumer",
    "MessageQueue",
    "Producer",
    "ProducerConfig",
    "SendResult",
    "SyncLitePullConsumer",
    "SyncProducer",
]
