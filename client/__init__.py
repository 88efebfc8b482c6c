"""Basalt's Python SDK: producers and consumers over the gRPC contracts in proto/.

``from basalt.client import Producer, PushConsumer, LitePullConsumer, Message``.
The SDK imports grpc, protobuf, the generated ``basalt.v1`` and
:mod:`basalt.common` only, never the engine or the services: records are
encoded and decoded with :mod:`basalt.common.record`, the one definition of
the layout that the store uses too.
"""

from basalt.client.consumer_base import ConsumeFromWhere, MessageQueue
from basalt.client.lite_pull_consumer import LitePullConfig, LitePullConsumer
from basalt.client.membership import TopicSubscription
from basalt.client.producer import ClientError, Producer, ProducerConfig, SendResult
from basalt.client.push_consumer import ConsumeStatus, PushConsumer, PushConsumerConfig
from basalt.client.sync import SyncLitePullConsumer, SyncProducer, SyncPushConsumer

from basalt.common.message import Message, MessageRecord

__all__ = [
    "ClientError",
    "ConsumeFromWhere",
    "ConsumeStatus",
    "LitePullConfig",
    "LitePullConsumer",
    "Message",
    "MessageQueue",
    "MessageRecord",
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
