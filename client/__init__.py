"""Basalt's Python SDK: producers and consumers over the gRPC contracts in proto/.

Records are decoded with ``basalt.store.record`` (one definition of the layout).
"""

from basalt.client.consumer_base import ConsumeFromWhere, MessageQueue
from basalt.client.errors import (
    BrokerNotFoundError,
    ClientError,
    ConsumerNotOnlineError,
    FlushTimeoutError,
    IllegalMessageError,
    InvalidArgumentError,
    MessageNotFoundError,
    NoPermissionError,
    OffsetFencedError,
    ServerError,
    ServiceUnavailableError,
    SubscriptionError,
    SystemBusyError,
    TopicExistsError,
    TopicNotFoundError,
)
from basalt.client.lite_pull_consumer import LitePullConfig, LitePullConsumer
from basalt.client.membership import TopicSubscription
from basalt.client.producer import Producer, ProducerConfig, SendResult
from basalt.client.push_consumer import ConsumeStatus, PushConsumer, PushConsumerConfig
from basalt.client.sync import SyncLitePullConsumer, SyncProducer, SyncPushConsumer

__all__ = [
    "BrokerNotFoundError",
    "ClientError",
    "ConsumeFromWhere",
    "ConsumeStatus",
    "ConsumerNotOnlineError",
    "FlushTimeoutError",
    "IllegalMessageError",
    "InvalidArgumentError",
    "LitePullConfig",
    "LitePullConsumer",
    "MessageNotFoundError",
    "MessageQueue",
    "NoPermissionError",
    "OffsetFencedError",
    "Producer",
    "ProducerConfig",
    "PushConsumer",
    "PushConsumerConfig",
    "SendResult",
    "ServerError",
    "ServiceUnavailableError",
    "SubscriptionError",
    "SyncLitePullConsumer",
    "SyncProducer",
    "SyncPushConsumer",
    "SystemBusyError",
    "TopicExistsError",
    "TopicNotFoundError",
    "TopicSubscription",
]
