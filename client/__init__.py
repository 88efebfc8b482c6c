"""Basalt's Python SDK: producers and consumers over the gRPC contracts in proto/.

``from basalt.client import Producer, PushConsumer, LitePullConsumer, Message``.
The SDK imports grpc, protobuf, the generated ``basalt.v1`` and
:mod:`basalt.common` only, never the engine or the services: records are
encoded and decoded with :mod:`basalt.common.record`, the one definition of
the layout that the store uses too.
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
    NotEnoughReplicasError,
    NotMasterError,
    OffsetFencedError,
    ServerError,
    ServiceUnavailableError,
    SubscriptionError,
    SystemBusyError,
    TopicExistsError,
    TopicNotFoundError,
    WrongServiceError,
)
from basalt.client.lite_pull_consumer import LitePullConfig, LitePullConsumer
from basalt.client.membership import TopicSubscription
from basalt.client.producer import Producer, ProducerConfig, SendResult, deliver_after
from basalt.client.push_consumer import ConsumeStatus, PushConsumer, PushConsumerConfig
from basalt.client.sync import SyncLitePullConsumer, SyncProducer, SyncPushConsumer
from basalt.common.message import Message, MessageRecord

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
    "Message",
    "MessageNotFoundError",
    "MessageQueue",
    "MessageRecord",
    "NoPermissionError",
    "NotEnoughReplicasError",
    "NotMasterError",
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
    "WrongServiceError",
    "deliver_after",
]
