"""Request checks the store-node, the pull-service and the admin service share.

One definition each of what a valid consumer group, a valid topic name, an
existing topic, a readable queue and a parsable subscription mean on the
wire, so the services answer the same input with the same status and code:
a consumer reading a store-node directly (the SDK) is refused exactly what
one pulling through the pull-service is (:func:`check_read_arguments`,
:func:`readable_queue`). Each raises a
:class:`basalt.services.errors.Refusal` naming why; its gRPC status comes
from that module's table.
"""

from __future__ import annotations

from collections.abc import Sequence

from basalt.services import validation
from basalt.services.errors import Refusal, as_refusal, invalid
from basalt.services.meta.errors import MetaValidationError
from basalt.services.meta.fields import check_group_name
from basalt.services.meta.model import Perm, TopicConfig
from basalt.store.message_filter import MessageFilter, UnknownFilterTypeError, build_filter
from basalt.store.sql92 import Sql92ParseError
from basalt.v1 import common_pb2 as pb

_EXPRESSION_TYPES = {pb.EXPRESSION_TYPE_TAG: "TAG", pb.EXPRESSION_TYPE_SQL92: "SQL92"}


def no_such_topic(topic: str) -> Refusal:
    return Refusal(pb.RESPONSE_CODE_TOPIC_NOT_EXIST, f"topic {topic!r} does not exist")


def check_group(group: str) -> None:
    """INVALID_PARAMETER unless ``group`` is a consumer group name (RocketMQ's rule)."""
    if not group:
        raise invalid("group must not be empty")
    try:
        check_group_name(group)
    except MetaValidationError as e:
        raise invalid(str(e)) from None


def check_topic(topic: str) -> None:
    """The request limits' topic rule (basalt.services.validation.TOPIC, the
    store's): what the store-node answers a send to it, and admin a request
    naming it."""
    try:
        validation.check_topic(topic)
    except validation.LimitError as e:
        raise e.refusal() from None


def check_read_arguments(group: str, offset: int, max_nums: int, *, max_field: str) -> None:
    """A read's own arguments, in RocketMQ's header-decoding order, one
    INVALID_PARAMETER each: a valid ``group``, ``offset`` >= 0, ``max_nums``
    >= 1 (``max_field`` names it as the request does: ``max_nums`` in a Pull,
    ``max_msg_nums`` in a GetMessage)."""
    check_group(group)
    if offset < 0:
        raise invalid(f"offset {offset} is negative")
    if max_nums < 1:
        raise invalid(f"{max_field} {max_nums} must be at least 1")


def check_broker_perm(broker_name: str, perm: Perm, *, write: bool) -> None:
    """NO_PERMISSION, with RocketMQ's wording, when the broker's permission
    (``brokerPermission``, set in its registration) forbids reading or, with
    ``write``, sending."""
    if not (perm.writable if write else perm.readable):
        action = "sending" if write else "pulling"
        raise Refusal(
            pb.RESPONSE_CODE_NO_PERMISSION,
            f"the broker {broker_name!r} {action} message is forbidden (perm {int(perm)})",
        )


def readable_queue(config: TopicConfig | None, topic: str, queue_id: int) -> TopicConfig:
    """``config`` (the topic's, None when it has none) when ``queue_id`` of
    ``topic`` may be read; else, in this order, TOPIC_NOT_EXIST, NO_PERMISSION
    (the topic is not readable) or INVALID_PARAMETER (``queue_id`` outside
    ``0..read_queue_nums - 1``; RocketMQ answers SYSTEM_ERROR, common.proto
    says why not)."""
    if config is None:
        raise no_such_topic(topic)
    if not config.readable:
        raise Refusal(
            pb.RESPONSE_CODE_NO_PERMISSION, f"the topic {topic!r} pulling message is forbidden"
        )
    if not 0 <= queue_id < config.read_queue_nums:
        raise invalid(
            f"queue id {queue_id} is out of range: topic {topic!r} has "
            f"{config.read_queue_nums} read queues"
        )
    return config


def subscription_filter(sub: pb.Subscription) -> MessageFilter:
    """The store's filter for a subscription; SUBSCRIPTION_PARSE_FAILED when it
    does not parse (the message names the position)."""
    kind = _EXPRESSION_TYPES.get(sub.type)
    try:
        if kind is None:
            raise UnknownFilterTypeError(str(sub.type))
        return build_filter(kind, sub.expression)
    except (Sql92ParseError, UnknownFilterTypeError) as e:
        raise as_refusal(e, "subscription_filter") from e


def check_batch_entries(
    call: str, noun: str, verb: str, limit: int, entries: Sequence[tuple[str, int, int]]
) -> None:
    """The whole-call checks of a batched read (StoreNode.GetMessages,
    PullService.PullBatch), one INVALID_PARAMETER each: 1..``limit`` entries,
    none with a suspend_timeout_ms of its own (the call's applies), no queue
    twice. ``entries`` are (topic, queue id, suspend_timeout_ms); ``noun`` and
    ``verb`` name them in messages ("reads", "read")."""
    if not 1 <= len(entries) <= limit:
        raise invalid(f"{len(entries)} {noun}: a {call} reads 1..{limit} queues")
    queues: set[tuple[str, int]] = set()
    for topic, queue_id, suspend_timeout_ms in entries:
        if suspend_timeout_ms:
            raise invalid(f"a {call} entry has no suspend_timeout_ms: the call's applies")
        if (topic, queue_id) in queues:
            raise invalid(f"queue {topic}/{queue_id} is {verb} twice")
        queues.add((topic, queue_id))
