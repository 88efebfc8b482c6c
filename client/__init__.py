"""Basalt's Python SDK: producers and consumers over the gRPC contracts in proto/.

Records are decoded with ``basalt.store.record`` (one definition of the layout).
"""

from basalt.client.consumer_base import ConsumeFromWhere, MessageQueue
from basalt.client.lite_pull_consumer import LitePullConfig, LitePullConsumer
from basalt.client.membership import TopicSubscription
from basalt.client.producer import ClientError, Producer, ProducerConfig, SendResult
from basalt.client.push_consumer import ConsumeStatus, PushConsumer, PushConsumerConfig
from basalt.client.sync import SyncLitePullConsumer, SyncProducer, SyncPushConsumer

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
