"""MetaClient: topic configs, registrations and watch caches on etcd.

Writes go straight to etcd and raise :class:`MetaUnavailableError` when no
endpoint answers — a config change must never be believed applied when it was
not. Topic configs change only by compare-and-swap on the key's mod_revision
(read, apply a pure function, write if nobody wrote in between, else retry), so
concurrent admins and auto-creating store-nodes never lose each other's
updates. Services read configs from a :class:`MetaWatcher`, not from here.

Concurrency: a client, its registrations and its watchers belong to the event
loop that first uses them; any number of tasks on that loop may share them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any, TypeVar

from basalt.common.tls import TlsConfig
from basalt.services.meta.config import MetaConfig, MetaKeys
from basalt.services.meta.errors import (
    MetaConflictError,
    MetaError,
    MetaValidationError,
    TopicExistsError,
    TopicNotFoundError,
)
from basalt.services.meta.fields import check_name, check_topic_name
from basalt.services.meta.group_model import (
    GroupEntry,
    GroupState,
    MemberRegistration,
    decode_group_entry,
)
from basalt.services.meta.lease import Registration
from basalt.services.meta.model import (
    DEFAULT_TOPIC_QUEUE_NUMS,
    BrokerRegistration,
    ConsumerRegistration,
    FrontRegistration,
    Perm,
    PullServiceRegistration,
    Registrable,
    TopicConfig,
)
from basalt.services.meta.session import EtcdSession, KeyValue
from basalt.services.meta.watch import MetaWatcher

log = logging.getLogger(__name__)

V = TypeVar("V")
#: A queue as the lock keys name it: (topic, broker name, queue id).
QueueKey = tuple[str, str, int]

#: Longest pause between two compare-and-swap attempts (jittered, doubling from 1 ms).
_CAS_BACKOFF_MAX_S = 0.05


class MetaClient:
    """The metadata API of one cluster (``/basalt/<config.cluster>/``)."""

    def __init__(self, config: MetaConfig, *, tls: TlsConfig | None = None) -> None:
        self.config = config
        #: The transport of the cluster this client reaches: etcd is dialed with
        #: it, and so are the services whose addresses etcd gives (admin's
        #: fan-outs). One CA signs a cluster's certificates (docs/security.md).
        self.tls = tls
        self.keys = MetaKeys(config.cluster)
        self._session = EtcdSession(config, tls=tls)
        self._registrations: set[Registration] = set()
        self._watchers: list[MetaWatcher[Any]] = []
        #: Compare-and-swap attempts that lost to a concurrent writer (observability).
        self.cas_conflicts = 0

    @property
    def session(self) -> EtcdSession:
        """The etcd session, for this package's modules that need more than this
        class offers (basalt.services.meta.groups' transactions)."""
        return self._session

    async def connect(self) -> None:
        """Check that etcd answers (one read); raises MetaUnavailableError if not."""
        await self._session.get(self.keys.root)

    async def close(self) -> None:
        """Revoke every registration, stop every watcher, close the connection. Idempotent."""
        for registration in list(self._registrations):
            await registration.close()
        self._registrations.clear()
        for watcher in self._watchers:
            await watcher.close()
        self._watchers.clear()
        await self._session.close()

    async def __aenter__(self) -> MetaClient:
        await self.connect()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # -- topics ------------------------------------------------------------------------

    async def create_topic(self, config: TopicConfig) -> TopicConfig:
        """Create the topic; raises TopicExistsError if it is already configured."""
        key = self.keys.topic(config.topic_name)
        if not await self._session.create(key, config.to_json()):
            raise TopicExistsError(config.topic_name)
        log.info("topic %s created: %s", config.topic_name, config.to_json().decode())
        return config

    async def get_topic(self, topic: str) -> TopicConfig | None:
        """The topic's config read from etcd now (None if absent); MetaValidationError if
        the stored value is malformed."""
        kv = await self._session.get(self.keys.topic(topic))
        return None if kv is None else TopicConfig.from_json(kv.value, topic_name=topic)

    async def list_topics(self) -> dict[str, TopicConfig]:
        """Every topic's config; malformed values are logged and left out."""
        return await self._list(
            self.keys.topics, lambda name, raw: TopicConfig.from_json(raw, topic_name=name)
        )

    async def update_topic(
        self, topic: str, change: Callable[[TopicConfig], TopicConfig]
    ) -> TopicConfig:
        """Read the topic, apply ``change`` (a pure function: it may run more than
        once), and write the result if nobody wrote in between; retry otherwise.

        Returns the config now stored. Raises TopicNotFoundError if the topic
        does not exist, MetaConflictError after ``config.max_cas_attempts`` lost
        races, MetaValidationError if ``change`` renames the topic or the
        result is invalid, and whatever ``change`` raises (nothing written).
        """
        key = self.keys.topic(topic)
        for attempt in range(self.config.max_cas_attempts):
            kv = await self._session.get(key)
            if kv is None:
                raise TopicNotFoundError(topic)
            current = TopicConfig.from_json(kv.value, topic_name=topic)
            updated = change(current)
            if updated.topic_name != topic:
                raise MetaValidationError(
                    f"update_topic({topic!r}) may not rename it to {updated.topic_name!r}"
                )
            if updated == current:
                return current
            if await self._session.compare_and_put(key, updated.to_json(), kv.mod_revision):
                log.info("topic %s updated: %s", topic, updated.to_json().decode())
                return updated
            self.cas_conflicts += 1
            # Jittered so that racing writers stop colliding.
            await asyncio.sleep(random.uniform(0, min(_CAS_BACKOFF_MAX_S, 0.001 * 2**attempt)))
        raise MetaConflictError(key, self.config.max_cas_attempts)

    async def delete_topic(self, topic: str) -> bool:
        """Delete the topic's config; False if there was none."""
        deleted = await self._session.delete(self.keys.topic(topic))
        if deleted:
            log.info("topic %s deleted", topic)
        return deleted

    async def ensure_topic(
        self,
        topic: str,
        *,
        broker: str,
        default_queue_nums: int = DEFAULT_TOPIC_QUEUE_NUMS,
        perm: Perm = Perm.RW,
    ) -> TopicConfig:
        """RocketMQ's autoCreateTopicEnable: make sure ``topic`` exists and lists ``broker``.

        Creates it with ``default_queue_nums`` read and write queues if absent;
        adds ``broker`` to its brokers (compare-and-swap) if missing. Safe to
        race with other store-nodes and admins. Returns the stored config.
        """
        check_topic_name(topic)
        for _ in range(self.config.max_cas_attempts):
            current = await self.get_topic(topic)
            if current is None:
                fresh = TopicConfig(
                    topic_name=topic,
                    read_queue_nums=default_queue_nums,
                    write_queue_nums=default_queue_nums,
                    perm=perm,
                    brokers=(broker,),
                )
                with contextlib.suppress(TopicExistsError):  # another node was faster
                    return await self.create_topic(fresh)
                continue
            if broker in current.brokers:
                return current
            with contextlib.suppress(TopicNotFoundError):  # deleted meanwhile: create it
                return await self.update_topic(topic, lambda c: c.with_broker(broker))
        raise MetaConflictError(self.keys.topic(topic), self.config.max_cas_attempts)

    # -- registrations --------------------------------------------------------------------

    async def register(
        self, value: Registrable, *, ttl_s: int | None = None, wait: bool = True
    ) -> Registration:
        """Put ``value`` at its key under a lease kept alive in the background.

        ``ttl_s`` defaults to ``config.lease_ttl_s``. With ``wait`` (default) the
        key is in etcd on return, or MetaUnavailableError is raised and nothing
        keeps running; without it registration is retried in the background
        until etcd answers. ``close()`` the registration (or this client) to
        revoke it.
        """
        registration = Registration(
            self._session,
            self.keys,
            value,
            self.config.lease_ttl_s if ttl_s is None else ttl_s,
            on_closed=self._registrations.discard,
        )
        await registration.start(wait=wait)
        self._registrations.add(registration)
        return registration

    async def list_brokers(self) -> dict[str, BrokerRegistration]:
        """The live store-nodes by broker name."""
        return await self._list(
            self.keys.brokers, lambda name, raw: BrokerRegistration.from_json(raw, broker_name=name)
        )

    async def list_pull_services(self) -> dict[str, PullServiceRegistration]:
        """The live pull-services by id."""
        return await self._list(
            self.keys.pull_services,
            lambda name, raw: PullServiceRegistration.from_json(raw, pull_service_id=name),
        )

    async def list_consumers(self, group: str) -> dict[str, ConsumerRegistration]:
        """The live consumers of ``group`` by client id."""
        return await self._list(
            self.keys.consumer_group(group),
            lambda name, raw: ConsumerRegistration.from_json(raw, group=group, client_id=name),
        )

    async def list_all_consumers(self) -> dict[str, ConsumerRegistration]:
        """Every group's live consumers, by ``group/client_id``."""
        return await self._list(self.keys.consumers, decode_consumer)

    # -- broker groups (docs/replication.md; changes: basalt.services.meta.groups) -------

    async def list_groups(self) -> dict[str, tuple[GroupState, dict[int, MemberRegistration]]]:
        """Every replicated broker group with a state: broker name -> (its state,
        its live members by id). Malformed values are logged and left out."""
        _, kvs = await self._session.get_prefix(self.keys.groups)
        states: dict[str, GroupState] = {}
        members: dict[str, dict[int, MemberRegistration]] = {}
        for kv in kvs:
            broker, _, name = kv.key[len(self.keys.groups) :].partition("/")
            try:
                entry = decode_group_entry(broker, name, kv.value)
            except MetaError as e:
                log.warning("ignoring %s: %s", kv.key, e)
                continue
            if isinstance(entry, GroupState):
                states[broker] = entry
            else:
                members.setdefault(broker, {})[entry.broker_id] = entry
        return {b: (state, members.get(b, {})) for b, state in sorted(states.items())}

    async def get_group(
        self, broker_name: str
    ) -> tuple[GroupState | None, dict[int, MemberRegistration]]:
        """One group read now: its state (None: not a replicated group, or never
        bootstrapped) and its live members by id."""
        prefix = self.keys.group(broker_name)
        entries = await self._list(
            prefix, lambda name, raw: decode_group_entry(broker_name, name, raw)
        )
        state = entries.pop("state", None)
        members = {e.broker_id: e for e in entries.values() if isinstance(e, MemberRegistration)}
        return (state if isinstance(state, GroupState) else None), members

    def group_cache(self, broker_name: str) -> MetaWatcher[GroupEntry]:
        """A watcher of one group's keys: ``state`` and ``members/<id>``."""
        return self._watcher(
            self.keys.group(broker_name),
            lambda name, raw: decode_group_entry(broker_name, name, raw),
            f"group {broker_name}",
        )

    # -- queue locks ------------------------------------------------------------------------

    async def lock_queues(
        self, group: str, client_id: str, queues: Sequence[QueueKey], lease_id: int
    ) -> list[bool]:
        """Lock each of ``queues`` for ``client_id`` under ``lease_id`` (concurrently);
        True where the consumer holds it now, False where another one does.
        MetaValidationError for a bad name, MetaUnavailableError when etcd is away."""
        owner = check_name(client_id, "client id").encode()
        keys = [self.keys.queue_lock(group, *q) for q in queues]
        return list(await asyncio.gather(*(self._session.hold(k, owner, lease_id) for k in keys)))

    async def unlock_queues(
        self, group: str, client_id: str, queues: Sequence[QueueKey]
    ) -> list[bool]:
        """Release each of ``queues`` that ``client_id`` holds; True where it did."""
        owner = check_name(client_id, "client id").encode()
        keys = [self.keys.queue_lock(group, *q) for q in queues]
        return list(await asyncio.gather(*(self._session.release(k, owner) for k in keys)))

    async def queue_lock_owners(self, group: str) -> dict[QueueKey, str]:
        """Who holds each locked queue of ``group`` now: (topic, broker, queue id) -> client id."""
        prefix = self.keys.queue_locks(group)
        _, kvs = await self._session.get_prefix(prefix)
        owners: dict[QueueKey, str] = {}
        for kv in kvs:
            topic, broker, queue_id = kv.key[len(prefix) :].split("/")
            owners[(topic, broker, int(queue_id))] = kv.value.decode()
        return owners

    # -- users and ACLs (opaque values: basalt.services.auth owns their form) -------------

    async def put_auth(self, kind: str, username: str, raw: bytes, *, create: bool) -> bool:
        """Write a user or ACL (``kind``: ``users``/``acls``). With ``create``, only
        if absent (False when it exists); otherwise only if present (False when
        absent). Raises MetaUnavailableError."""
        key = self.keys.auth_entry(kind, username)
        if create:
            return await self._session.create(key, raw)
        if await self._session.get(key) is None:
            return False
        await self._session.put(key, raw)
        return True

    async def get_auth(self, kind: str, username: str) -> bytes | None:
        kv = await self._session.get(self.keys.auth_entry(kind, username))
        return None if kv is None else kv.value

    async def delete_auth(self, kind: str, username: str) -> bool:
        """Delete a user or ACL; False if there was none."""
        return await self._session.delete(self.keys.auth_entry(kind, username))

    async def list_auth(self, kind: str) -> dict[str, bytes]:
        """Every user or ACL, raw, by username."""
        return await self._list(self.keys.auth(kind), lambda name, raw: raw)

    def auth_cache(self, kind: str, decode: Callable[[str, bytes], V]) -> MetaWatcher[V]:
        """A watcher of the users or ACLs; ``decode`` raises MetaError for a bad value."""
        return self._watcher(self.keys.auth(kind), decode, kind)

    async def _list(self, prefix: str, decode: Callable[[str, bytes], V]) -> dict[str, V]:
        _, kvs = await self._session.get_prefix(prefix)
        return _decode_all(prefix, kvs, decode)

    # -- watch caches (start them with ``await cache.start()``) ---------------------------

    def topic_cache(self) -> MetaWatcher[TopicConfig]:
        """A watcher of every topic config (by topic name)."""
        return self._watcher(
            self.keys.topics,
            lambda name, raw: TopicConfig.from_json(raw, topic_name=name),
            "topic configs",
        )

    def broker_cache(self) -> MetaWatcher[BrokerRegistration]:
        """A watcher of the live store-nodes (by broker name)."""
        return self._watcher(
            self.keys.brokers,
            lambda name, raw: BrokerRegistration.from_json(raw, broker_name=name),
            "broker registrations",
        )

    def pull_service_cache(self) -> MetaWatcher[PullServiceRegistration]:
        """A watcher of the live pull-services (by id)."""
        return self._watcher(
            self.keys.pull_services,
            lambda name, raw: PullServiceRegistration.from_json(raw, pull_service_id=name),
            "pull-service registrations",
        )

    def front_cache(self) -> MetaWatcher[FrontRegistration]:
        """A watcher of the store-nodes' own RocketMQ 5 fronts (by ``broker/id``)."""
        return self._watcher(
            self.keys.rocketmq_v2_fronts,
            lambda name, raw: FrontRegistration.from_json(raw, name=name),
            "RocketMQ 5 fronts",
        )

    def consumer_cache(self, group: str) -> MetaWatcher[ConsumerRegistration]:
        """A watcher of one group's live consumers (by client id)."""
        return self._watcher(
            self.keys.consumer_group(group),
            lambda name, raw: ConsumerRegistration.from_json(raw, group=group, client_id=name),
            f"consumers of {group}",
        )

    def _watcher(self, prefix: str, decode: Callable[[str, bytes], V], what: str) -> MetaWatcher[V]:
        watcher = MetaWatcher(self.config, prefix, decode, what=what, tls=self.tls)
        # Closed with the client; the list holds them only for that.
        self._watchers.append(watcher)
        return watcher


def _decode_all(
    prefix: str, kvs: list[KeyValue], decode: Callable[[str, bytes], V]
) -> dict[str, V]:
    out: dict[str, V] = {}
    for kv in kvs:
        name = kv.key[len(prefix) :]
        try:
            out[name] = decode(name, kv.value)
        except MetaError as e:
            log.warning("ignoring %s: %s", kv.key, e)
    return out


def decode_consumer(name: str, raw: bytes) -> ConsumerRegistration:
    """A registration under ``consumers/``, named ``group/client_id``."""
    group, _, client_id = name.partition("/")
    return ConsumerRegistration.from_json(raw, group=group, client_id=client_id)
