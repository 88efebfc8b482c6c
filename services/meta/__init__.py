"""Basalt's cluster metadata on etcd (docs/architecture.md#etcd-keys): the one import services need.

Keys under ``/basalt/<cluster>/`` (:class:`MetaKeys`):

- ``topics/<topic>``: :class:`TopicConfig` JSON, durable, changed only by
  compare-and-swap on mod_revision (:meth:`MetaClient.update_topic`);
- ``brokers/<broker_name>``: :class:`BrokerRegistration`, under the store-node's lease;
- ``pull-services/<id>``: :class:`PullServiceRegistration`, under its lease;
- ``rocketmq-v2/<broker_name>/<broker_id>``: :class:`FrontRegistration`, a
  store-node's own RocketMQ 5 front, under the store-node's lease;
- ``consumers/<group>/<client_id>``: :class:`ConsumerRegistration`, under the
  lease of the pull-service holding the session.
- ``groups/<broker>/state``: :class:`GroupState`, durable, CAS only, and
  ``groups/<broker>/members/<id>``: :class:`MemberRegistration`, under the
  member's lease: a replicated broker group (:class:`BrokerGroup`,
  docs/replication.md); its master publishes ``brokers/<broker_name>``;
- ``users/<name>``, ``acls/<name>``: users (secrets sealed) and ACLs, durable;
  their form is basalt.services.auth's (:meth:`MetaClient.put_auth`, ``auth_cache``).

Typical use, on the service's event loop::

    meta = MetaClient(MetaConfig(endpoints=("127.0.0.1:2379",), cluster="c1"))
    await meta.connect()
    reg = await meta.register(BrokerRegistration(broker_name="broker-a", ...))
    topics = meta.topic_cache()
    await topics.start()
    topics.get("T")                       # never raises, serves through etcd outages
    await meta.ensure_topic("T", broker="broker-a")   # auto-create on first send
    await meta.close()                    # revokes the lease: broker-a disappears

The pieces are this package's modules: values and their JSON (``model``,
``fields``), config and key layout (``config``), the aetcd seam (``session``),
leases (``lease``), caches (``watch``), the client (``client``), errors
(``errors``).

The values, the config and the errors import without etcd's client: what
talks to etcd (:class:`MetaClient`, :class:`Registration`, :class:`MetaWatcher`,
:class:`MetaChange`) is imported on first use, so a client-side command of a
base install (aetcd comes with the ``server`` extra) can still use a
:class:`TopicConfig`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from basalt.services.meta.config import MIN_LEASE_TTL_S, MetaConfig, MetaKeys, parse_endpoints
from basalt.services.meta.errors import (
    ElectionRefusedError,
    GroupNotFoundError,
    MetaConflictError,
    MetaError,
    MetaUnavailableError,
    MetaValidationError,
    TopicExistsError,
    TopicNotFoundError,
)
from basalt.services.meta.model import (
    DEFAULT_QUEUE_NUMS,
    DEFAULT_TOPIC_QUEUE_NUMS,
    MAX_QUEUE_NUMS,
    BrokerRegistration,
    ConsumerRegistration,
    ExpressionType,
    FrontRegistration,
    GroupState,
    MemberRegistration,
    MemberRole,
    Perm,
    PullServiceRegistration,
    Registrable,
    Subscription,
    TopicConfig,
    TopicFilterType,
)

if TYPE_CHECKING:
    from basalt.services.meta.client import MetaClient
    from basalt.services.meta.groups import BrokerGroup, GroupWatch
    from basalt.services.meta.lease import Registration
    from basalt.services.meta.watch import MetaChange, MetaWatcher

    #: The cache services keep of topic configs.
    TopicCache = MetaWatcher[TopicConfig]

#: The names that need etcd's client, by the module that defines them.
_ETCD_NAMES = {
    "BrokerGroup": "groups",
    "GroupWatch": "groups",
    "MetaClient": "client",
    "Registration": "lease",
    "MetaChange": "watch",
    "MetaWatcher": "watch",
}


def __getattr__(name: str) -> object:
    """:data:`_ETCD_NAMES` imported on first use (PEP 562), and ``TopicCache``."""
    if name == "TopicCache":
        from basalt.services.meta.watch import MetaWatcher

        value: object = MetaWatcher[TopicConfig]
    elif name in _ETCD_NAMES:
        value = getattr(importlib.import_module(f"{__name__}.{_ETCD_NAMES[name]}"), name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


__all__ = [
    "DEFAULT_QUEUE_NUMS",
    "DEFAULT_TOPIC_QUEUE_NUMS",
    "MAX_QUEUE_NUMS",
    "MIN_LEASE_TTL_S",
    "BrokerGroup",
    "BrokerRegistration",
    "ConsumerRegistration",
    "ElectionRefusedError",
    "ExpressionType",
    "FrontRegistration",
    "GroupNotFoundError",
    "GroupState",
    "GroupWatch",
    "MemberRegistration",
    "MemberRole",
    "MetaChange",
    "MetaClient",
    "MetaConfig",
    "MetaConflictError",
    "MetaError",
    "MetaKeys",
    "MetaUnavailableError",
    "MetaValidationError",
    "MetaWatcher",
    "Perm",
    "PullServiceRegistration",
    "Registrable",
    "Registration",
    "Subscription",
    "TopicCache",
    "TopicConfig",
    "TopicExistsError",
    "TopicFilterType",
    "TopicNotFoundError",
    "parse_endpoints",
]
