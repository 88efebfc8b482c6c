"""Where a service finds topic configurations: etcd's cache, or a local table.

The store-node and the pull-service check every request against the topic's
configuration (perm, read/write queue counts) and, for a send to a topic
that does not exist, create it when ``auto_create_topic_enable`` is on
(RocketMQ's autoCreateTopicEnable, ``default_topic_queue_nums`` queues).
"""

from __future__ import annotations

from typing import Protocol

from basalt.services.meta.model import TopicConfig


class TopicDirectory(Protocol):
    """Topic configurations as a service sees them."""

    def topic(self, name: str) -> TopicConfig | None:
        """The cached configuration, or None for an unknown topic. Never blocks."""

    async def ensure_topic(
        self, name: str, broker: str, *, queue_nums: int | None = None
    ) -> TopicConfig:
        """The topic's configuration, created with ``queue_nums`` read and write
        queues (None: the default counts) when it does not exist yet, ``broker``
        added to its brokers when missing. Raises
        ``basalt.services.meta.errors.MetaUnavailableError`` when it cannot be written."""


class LocalTopics:
    """An in-process directory: a store-node without etcd (tests, a laptop)."""

    def __init__(self, default_topic_queue_nums: int = 4) -> None:
        self.default_topic_queue_nums = default_topic_queue_nums
        self._topics: dict[str, TopicConfig] = {}

    def put(self, config: TopicConfig) -> None:
        self._topics[config.topic_name] = config

    def topic(self, name: str) -> TopicConfig | None:
        return self._topics.get(name)

    async def ensure_topic(
        self, name: str, broker: str, *, queue_nums: int | None = None
    ) -> TopicConfig:
        config = self._topics.get(name)
        if config is None:
            n = queue_nums or self.default_topic_queue_nums
            config = TopicConfig(
                topic_name=name, read_queue_nums=n, write_queue_nums=n, brokers=(broker,)
            )
        elif broker not in config.brokers:
            config = config.with_broker(broker)
        self._topics[name] = config
        return config
