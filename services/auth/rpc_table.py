"""Every RPC's authorization: the resources it touches and the action it needs.

One table for both protocols (basalt.v1's StoreNode, PullService and Admin,
apache.rocketmq.v2's MessagingService), keyed by gRPC method path. A
:class:`Need` reads its resource names from the request by a field path
(``messages[].topic.name``: ``[]`` walks a repeated field; empty values are
skipped - a producer's Heartbeat names no group) and is met when the caller
may do *any one* of its actions there (QueryRoute serves both producers and
consumers: Pub or Sub). A :class:`Rule` is met when every need is, for every
resource named. A rule with no needs asks only that the caller be a known user
(stream housekeeping: heartbeats, telemetry, client termination); a
``super_only`` rule is met by super users alone (user and ACL management, as
RocketMQ reserves it to its admin).

For a client-streaming method the rule is checked on every message the stream
carries (the signature once, when the stream opens). A method absent from
the table is refused: a new RPC is closed until someone maps it
(tests/security/test_auth_rpc_table.py fails on an unmapped method).

docs/security.md renders this table (:func:`render_markdown`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

from google.protobuf.message import Message

from basalt.services.auth.model import Action, Resource, ResourceType

PUB = frozenset({Action.PUB})
SUB = frozenset({Action.SUB})
PUB_OR_SUB = frozenset({Action.PUB, Action.SUB})
GET = frozenset({Action.GET})
SUB_OR_GET = frozenset({Action.SUB, Action.GET})
LIST = frozenset({Action.LIST})
CREATE = frozenset({Action.CREATE})
UPDATE = frozenset({Action.UPDATE})
DELETE = frozenset({Action.DELETE})


@dataclasses.dataclass(frozen=True, slots=True)
class Need:
    """Any one of ``actions`` on each resource of ``type`` named at ``path`` (no
    path: the Cluster)."""

    type: ResourceType
    actions: frozenset[Action]
    path: str = ""

    def resources(self, request: Message) -> list[Resource]:
        if self.type is ResourceType.CLUSTER:
            # With a path, the Cluster only when the request names something
            # there (a SendStream item that ends a transaction).
            if self.path and not any(field_values(request, self.path)):
                return []
            return [Resource(ResourceType.CLUSTER)]
        return [Resource(self.type, name) for name in field_values(request, self.path) if name]


@dataclasses.dataclass(frozen=True, slots=True)
class Rule:
    needs: tuple[Need, ...] = ()
    super_only: bool = False


def field_values(message: Message, path: str) -> Iterator[str]:
    """The string values at ``path`` in ``message`` (``a.b[].c``)."""
    head, _, rest = path.partition(".")
    repeated = head.endswith("[]")
    value = getattr(message, head.removesuffix("[]"))
    for item in value if repeated else (value,):
        if rest:
            yield from field_values(item, rest)
        else:
            yield str(item)


def topic(actions: frozenset[Action], path: str = "topic") -> Need:
    return Need(ResourceType.TOPIC, actions, path)


def group(actions: frozenset[Action], path: str = "group") -> Need:
    return Need(ResourceType.GROUP, actions, path)


def cluster(actions: frozenset[Action]) -> Need:
    return Need(ResourceType.CLUSTER, actions)


def consume(topic_path: str = "topic", group_path: str = "group") -> Rule:
    """RocketMQ 5's consumption: Sub on the topic and on the group."""
    return Rule((topic(SUB, topic_path), group(SUB, group_path)))


AUTHENTICATED = Rule()
SUPER_ONLY = Rule(super_only=True)

_STORE = "/basalt.v1.StoreNode/"
_PULL = "/basalt.v1.PullService/"
_ADMIN = "/basalt.v1.Admin/"
_V2 = "/apache.rocketmq.v2.MessagingService/"

#: Method path -> rule. Kept in proto order per service.
RPC_TABLE: dict[str, Rule] = {
    # -- StoreNode: producers send here directly; the pull-service and the admin
    # service call the rest as the internal (super) user.
    _STORE + "SendMessage": Rule((topic(PUB, "message.topic"),)),
    _STORE + "SendBatch": Rule((topic(PUB),)),
    _STORE + "SendStream": Rule(
        (
            topic(PUB, "items[].message.message.topic"),
            topic(PUB, "items[].batch.topic"),
            # An item ending a transaction: EndTransaction's rule.
            Need(ResourceType.CLUSTER, PUB, "items[].end_transaction.producer_group"),
        )
    ),
    _STORE + "GetMessage": consume(),
    _STORE + "GetMessages": consume("reads[].topic", "reads[].group"),
    _STORE + "GetMessagesStream": consume(
        "items[].fetch.reads[].topic", "items[].fetch.reads[].group"
    ),
    # Where a consumer starts and what it committed: its own reads (Sub), or an
    # operator's (Get), as RocketMQ 5 maps getMaxOffset and queryConsumerOffset.
    _STORE + "GetMinMaxOffset": Rule((topic(SUB_OR_GET),)),
    _STORE + "SearchOffset": Rule((topic(SUB_OR_GET),)),
    _STORE + "QueryConsumerOffset": Rule((topic(SUB_OR_GET), group(SUB_OR_GET))),
    _STORE + "UpdateConsumerOffset": consume(),
    _STORE + "QueryMessage": Rule((topic(GET),)),
    # The topic is known only once the message is read: the whole cluster's Get.
    _STORE + "ViewMessage": Rule((cluster(GET),)),
    _STORE + "ResetOffset": Rule((topic(GET), group(UPDATE))),
    _STORE + "GetRuntimeInfo": Rule((cluster(GET),)),
    _STORE + "PopMessages": consume(),
    _STORE + "AckMessages": consume(),
    _STORE + "ChangeInvisibleDuration": consume(),
    # Cancelling a timer message is its topic's producer's (RocketMQ 5.3: Pub).
    _STORE + "RecallMessage": Rule((topic(PUB),)),
    _STORE + "GetScheduleStatus": Rule((cluster(GET),)),
    # A consumer gives back what it read: its group's Sub on the topic it read.
    _STORE + "ConsumerSendMsgBack": consume("origin_topic", "group"),
    # A transaction ends on the half's real topic, known once the half is read:
    # the producers' cluster-wide Pub, as RocketMQ's END_TRANSACTION.
    _STORE + "EndTransaction": Rule((cluster(PUB),)),
    _STORE + "WatchTransactionChecks": Rule((cluster(PUB),)),
    # -- PullService: what consumers and the admin service call.
    _PULL + "QueryRoute": Rule((topic(PUB_OR_SUB),)),
    _PULL + "Pull": consume("queue.topic"),
    _PULL + "PullBatch": consume("pulls[].queue.topic", "pulls[].group"),
    _PULL + "Session": consume("open.subscriptions[].topic", "open.group"),
    # A consumer's rebalance lists its group's members: Sub does; so does Get.
    _PULL + "ListConsumers": Rule((group(SUB_OR_GET),)),
    _PULL + "NotifyConsumers": Rule((group(UPDATE),)),
    _PULL + "LockQueues": consume("queues[].topic"),
    _PULL + "UnlockQueues": consume("queues[].topic"),
    # A consumer's start and commits through the pull-service: as the
    # store-node's QueryConsumerOffset and UpdateConsumerOffset they stand for.
    _PULL + "QueryOffset": Rule((topic(SUB_OR_GET, "queue.topic"), group(SUB_OR_GET))),
    _PULL + "CommitOffset": consume("queue.topic"),
    # -- Admin: mqadmin's verbs.
    _ADMIN + "UpdateTopic": Rule((topic(UPDATE, "config.topic"),)),
    _ADMIN + "DeleteTopic": Rule((topic(DELETE),)),
    _ADMIN + "TopicList": Rule((cluster(LIST),)),
    _ADMIN + "GetTopic": Rule((topic(GET),)),
    _ADMIN + "ResetOffsetByTime": Rule((topic(GET), group(UPDATE))),
    _ADMIN + "CreateUser": SUPER_ONLY,
    _ADMIN + "UpdateUser": SUPER_ONLY,
    _ADMIN + "DeleteUser": SUPER_ONLY,
    _ADMIN + "ListUser": SUPER_ONLY,
    _ADMIN + "CreateAcl": SUPER_ONLY,
    _ADMIN + "UpdateAcl": SUPER_ONLY,
    _ADMIN + "DeleteAcl": SUPER_ONLY,
    _ADMIN + "ListAcl": SUPER_ONLY,
    # -- apache.rocketmq.v2.MessagingService: the official clients.
    _V2 + "QueryRoute": Rule((topic(PUB_OR_SUB, "topic.name"),)),
    _V2 + "Heartbeat": Rule((group(SUB, "group.name"),)),
    _V2 + "SendMessage": Rule((topic(PUB, "messages[].topic.name"),)),
    _V2 + "QueryAssignment": consume("topic.name", "group.name"),
    _V2 + "ReceiveMessage": consume("message_queue.topic.name", "group.name"),
    _V2 + "AckMessage": consume("topic.name", "group.name"),
    _V2 + "ForwardMessageToDeadLetterQueue": consume("topic.name", "group.name"),
    _V2 + "PullMessage": consume("message_queue.topic.name", "group.name"),
    _V2 + "UpdateOffset": consume("message_queue.topic.name", "group.name"),
    _V2 + "GetOffset": Rule(
        (
            topic(SUB_OR_GET, "message_queue.topic.name"),
            group(SUB_OR_GET, "group.name"),
        )
    ),
    _V2 + "QueryOffset": Rule((topic(SUB_OR_GET, "message_queue.topic.name"),)),
    _V2 + "EndTransaction": Rule((topic(PUB, "topic.name"),)),
    # Settings and server commands only; each send or receive it leads to is
    # checked on its own call.
    _V2 + "Telemetry": AUTHENTICATED,
    _V2 + "NotifyClientTermination": Rule((group(SUB, "group.name"),)),
    _V2 + "ChangeInvisibleDuration": consume("topic.name", "group.name"),
    _V2 + "RecallMessage": Rule((topic(PUB, "topic.name"),)),
    _V2 + "SyncLiteSubscription": consume("topic.name", "group.name"),
}

#: Services every server also carries and that stay open: probes (Kubernetes'
#: gRPC health checks carry no signature) and reflection (names, no data).
EXEMPT_SERVICES = frozenset({"grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"})


def is_exempt(method: str) -> bool:
    return method.lstrip("/").partition("/")[0] in EXEMPT_SERVICES


def _describe(rule: Rule) -> str:
    if rule.super_only:
        return "super user only"
    if not rule.needs:
        return "any authenticated user"
    parts = []
    for need in rule.needs:
        actions = " or ".join(sorted(a.value for a in need.actions))
        if not need.path:
            where = need.type.value
        elif need.type is ResourceType.CLUSTER:
            where = f"{need.type.value} (when the request has <{need.path}>)"
        else:
            where = f"{need.type.value}:<{need.path}>"
        parts.append(f"{actions} on {where}")
    return "; ".join(parts)


def render_markdown() -> str:
    """The table as Markdown (docs/security.md)."""
    lines = ["| RPC | needs |", "| --- | --- |"]
    lines.extend(f"| `{m.lstrip('/')}` | {_describe(r)} |" for m, r in RPC_TABLE.items())
    return "\n".join(lines) + "\n"
