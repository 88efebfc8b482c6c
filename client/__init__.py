"""Basalt's Python SDK: producers and consumers over the gRPC contracts in proto/.

Records are decoded with ``store.record`` (one definition of the layout).
"""

from client.consumer_base import ConsumeFromWhere, MessageQueue
from client.lite_pull_consumer import LitePullConfig, LitePullConsumer
from client.membership import TopicSubscription
from client.producer import ClientError, Producer, ProducerConfig, SendResult
from client.push_consumer import ConsumeStatus, PushConsumer, PushConsumerConfig
from client.sync import SyncLitePullConsumer, SyncProducer, SyncPushConsumer

__all__ = [
    "ClientError",
    "ConsumeFromWhere",
    "ConsumeStatus",
    "LitePullConfig",
    "LitePullConsumer",
    "MessageQueue",
    "Producer",
    "ProducerConfig",
    "PushConsumer",
    "PushConsumerConfig",
    "SendResult",
    "SyncLitePullConsumer",
    "SyncProducer",
    "SyncPushConsumer",
    "TopicSubscription",
]
