"""Topic configs in etcd as the operator changes them (mqadmin updateTopic,
deleteTopic, topicList), with etcd's mod revisions.

A topic's config is one etcd key, ``topics/<topic>``, changed only by
compare-and-swap on its mod revision. :func:`update_topic` offers the three
write modes of the admin service's UpdateTopic (``expected_mod_revision``):

=============  ================================================================
``None``       write whatever is there: create the topic, or change the given
               fields of the stored config (read, change, compare-and-swap,
               retried while concurrent writers win: MetaClient.update_topic)
``0``          create only: TopicExistsError when the topic exists
``> 0``        only if the key is still at that revision (the caller read it
               there): RevisionMismatchError otherwise, nothing written
=============  ================================================================

and answers the key's mod revision after the write, for the caller's next
compare-and-swap. MetaClient keeps revisions to itself, so the revision reads
and the compare-and-swap at a caller's revision go through an
:class:`~basalt.services.meta.session.EtcdSession` of their own, one per write
(operator writes are rare; a connection each costs nothing that matters).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from basalt.admin.errors import BrokerNotRegisteredError, RevisionMismatchError
from basalt.services.meta import (
    MetaConflictError,
    MetaValidationError,
    Perm,
    TopicConfig,
    TopicExistsError,
    TopicNotFoundError,
)
from basalt.v1 import common_pb2 as pb

if TYPE_CHECKING:
    # etcd's client: the server extra. The values and their admin.proto forms
    # (TopicChange, TopicWrite, topic_config_pb ...) import without it.
    from basalt.services.meta import MetaClient
    from basalt.services.meta.session import EtcdSession, KeyValue

log = logging.getLogger(__name__)

V = TypeVar("V")

#: mqadmin updateTopic's queue counts for a new topic when none are given.
NEW_TOPIC_QUEUE_NUMS = 8

#: A change to a stored config (pure: a compare-and-swap may apply it more than once).
_Change = Callable[[TopicConfig], TopicConfig]
#: The config of a topic about to be created.
_Fresh = Callable[[], Awaitable[TopicConfig]]


@dataclass(frozen=True, slots=True, kw_only=True)
class TopicChange:
    """What an updateTopic sets; a field left None (``brokers`` empty) keeps
    the stored value, or takes mqadmin's default for a new topic (8 read and 8
    write queues, perm RW, not ordered, every registered store-node)."""

    read_queue_nums: int | None = None
    write_queue_nums: int | None = None
    perm: Perm | None = None
    brokers: tuple[str, ...] = ()
    order: bool | None = None
    #: Never lower an existing topic's read_queue_nums: a read queue removed
    #: before every group consumed it strands its messages. ``shrinkTopic``
    #: lowers it once the removed queues are drained.
    keep_read_queues: bool = False

    def apply(self, config: TopicConfig) -> TopicConfig:
        """``config`` with the fields given (pure: a compare-and-swap may call it
        more than once); MetaValidationError if a value is out of range."""
        read = _given(self.read_queue_nums, config.read_queue_nums)
        if self.keep_read_queues and read >= 1:  # an invalid count still fails validation
            read = max(read, config.read_queue_nums)
        return dataclasses.replace(
            config,
            read_queue_nums=read,
            write_queue_nums=_given(self.write_queue_nums, config.write_queue_nums),
            perm=_given(self.perm, config.perm),
            brokers=self.brokers or config.brokers,
            order=_given(self.order, config.order),
        )

    def new_topic(self, topic: str, hosts: Sequence[str] = ()) -> TopicConfig:
        """A new topic's config: mqadmin's defaults with the fields given, on
        ``brokers`` or else ``hosts`` (empty: the writer's choice)."""
        return dataclasses.replace(self, keep_read_queues=False).apply(
            TopicConfig(
                topic_name=topic,
                read_queue_nums=NEW_TOPIC_QUEUE_NUMS,
                write_queue_nums=NEW_TOPIC_QUEUE_NUMS,
                brokers=tuple(hosts),
            )
        )


def _given(value: V | None, stored: V) -> V:
    return stored if value is None else value


@dataclass(frozen=True, slots=True)
class TopicWrite:
    """A topic's config as stored and its etcd key's mod revision; from
    :func:`update_topic`, also whether the call created the topic (a
    mod_revision of 0: deleted again before it could be read back)."""

    config: TopicConfig
    created: bool
    mod_revision: int


async def topic_config(meta: MetaClient, topic: str) -> TopicConfig:
    """The topic's config as etcd holds it now; TopicNotFoundError if none."""
    config = await meta.get_topic(topic)
    if config is None:
        raise TopicNotFoundError(topic)
    return config


async def get_topic(meta: MetaClient, topic: str) -> TopicWrite:
    """The topic's config and mod revision now (``created`` False);
    TopicNotFoundError if it has none."""
    async with _etcd(meta) as etcd:
        kv = await etcd.get(meta.keys.topic(topic))
    if kv is None:
        raise TopicNotFoundError(topic)
    return TopicWrite(TopicConfig.from_json(kv.value, topic_name=topic), False, kv.mod_revision)


async def topic_names(meta: MetaClient) -> list[str]:
    """mqadmin topicList: every configured topic, sorted by name."""
    return sorted(await meta.list_topics())


async def delete_topic(meta: MetaClient, topic: str) -> None:
    """mqadmin deleteTopic: remove the topic's config (its files expire as
    usual); TopicNotFoundError if it has none."""
    if not await meta.delete_topic(topic):
        raise TopicNotFoundError(topic)


async def update_topic(
    meta: MetaClient,
    topic: str,
    change: TopicChange,
    *,
    expected_mod_revision: int | None = None,
) -> TopicWrite:
    """mqadmin updateTopic: create the topic or apply ``change`` to it, in the
    write mode ``expected_mod_revision`` names (module docstring).

    Raises BrokerNotRegisteredError (a store-node in ``change.brokers`` is not
    registered, or none is to host a new topic), MetaValidationError (a value
    out of range), TopicExistsError (create only, and it exists),
    RevisionMismatchError, MetaConflictError (concurrent writers kept
    winning), MetaUnavailableError (etcd did not answer); nothing is written
    in any of those cases.
    """
    if expected_mod_revision is not None and expected_mod_revision < 0:
        raise MetaValidationError(
            f"expected_mod_revision {expected_mod_revision}: 0 (create only) or a revision"
        )
    if change.brokers:
        unknown = sorted(set(change.brokers) - set(await meta.list_brokers()))
        if unknown:
            raise BrokerNotRegisteredError(unknown)

    async def fresh() -> TopicConfig:
        hosts = change.brokers or tuple(sorted(await meta.list_brokers()))
        if not hosts:
            raise BrokerNotRegisteredError((), "no store-node is registered to host the topic")
        return change.new_topic(topic, hosts)

    key = meta.keys.topic(topic)
    async with _etcd(meta) as etcd:
        if expected_mod_revision is None:
            config, created = await _write_any(meta, topic, change.apply, fresh)
        elif expected_mod_revision == 0:
            config, created = await meta.create_topic(await fresh()), True
        else:
            config, created = await _write_at(etcd, key, topic, change.apply, expected_mod_revision)
        return _read_back(await etcd.get(key), config, created)


async def _write_any(
    meta: MetaClient, topic: str, changed: _Change, fresh: _Fresh
) -> tuple[TopicConfig, bool]:
    """Create or update, whatever is stored; each step tolerates a concurrent
    create or delete of the same topic by going round again."""
    for _ in range(meta.config.max_cas_attempts):
        if await meta.get_topic(topic) is None:
            with contextlib.suppress(TopicExistsError):  # created meanwhile: update it
                return await meta.create_topic(await fresh()), True
            continue
        with contextlib.suppress(TopicNotFoundError):  # deleted meanwhile: create it
            return await meta.update_topic(topic, changed), False
    # Only a topic created and deleted over and over by others gets here.
    raise MetaConflictError(meta.keys.topic(topic), meta.config.max_cas_attempts)


async def _write_at(
    etcd: EtcdSession, key: str, topic: str, changed: _Change, expected: int
) -> tuple[TopicConfig, bool]:
    """Change the stored config only if its key is at mod revision ``expected``."""
    kv = await etcd.get(key)
    if kv is None or kv.mod_revision != expected:
        raise RevisionMismatchError(topic, expected, None if kv is None else kv.mod_revision)
    current = TopicConfig.from_json(kv.value, topic_name=topic)
    updated = changed(current)
    if updated == current:
        return current, False
    if not await etcd.compare_and_put(key, updated.to_json(), expected):
        now = await etcd.get(key)
        raise RevisionMismatchError(topic, expected, None if now is None else now.mod_revision)
    log.info("topic %s updated at revision %d: %s", topic, expected, updated.to_json().decode())
    return updated, False


def _read_back(kv: KeyValue | None, written: TopicConfig, created: bool) -> TopicWrite:
    """The write's outcome with the key's revision as read after it. Another
    writer may have changed the key in between: the answer then describes its
    newer state, config and revision together, so a compare-and-swap at that
    revision starts from what is really stored."""
    if kv is None:
        return TopicWrite(written, created, 0)
    return TopicWrite(
        TopicConfig.from_json(kv.value, topic_name=written.topic_name), created, kv.mod_revision
    )


@contextlib.asynccontextmanager
async def _etcd(meta: MetaClient) -> AsyncIterator[EtcdSession]:
    from basalt.services.meta.session import EtcdSession

    session = EtcdSession(meta.config, tls=meta.tls)
    try:
        yield session
    finally:
        await session.close()


def topic_config_pb(config: TopicConfig) -> pb.TopicConfig:
    """A stored config as admin.proto's TopicConfig."""
    return pb.TopicConfig(
        topic=config.topic_name,
        read_queue_nums=config.read_queue_nums,
        write_queue_nums=config.write_queue_nums,
        perm=int(config.perm),
        brokers=config.brokers,
        order=config.order,
    )


def topic_config_from_pb(message: pb.TopicConfig) -> TopicConfig:
    """admin.proto's TopicConfig as the stored config; MetaValidationError if a
    field is out of range."""
    return TopicConfig(
        topic_name=message.topic,
        read_queue_nums=message.read_queue_nums,
        write_queue_nums=message.write_queue_nums,
        perm=Perm.parse(message.perm),
        brokers=tuple(message.brokers),
        order=message.order,
    )
