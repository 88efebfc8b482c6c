"""Request checks the store-node and the pull-service share, as Refusals.

One definition each of what a valid consumer group, an existing topic and a
parsable subscription mean on the wire, so both services answer the same
input with the same status and code.
"""

from __future__ import annotations

from basalt.v1 import common_pb2 as pb
from services.errors import Refusal, invalid
from services.meta_errors import MetaValidationError
from services.meta_fields import check_group_name
from store.message_filter import MessageFilter, UnknownFilterTypeError, build_filter
from store.sql92 import Sql92ParseError

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


def subscription_filter(sub: pb.Subscription) -> MessageFilter:
    """The store's filter for a subscription; SUBSCRIPTION_PARSE_FAILED when it
    does not parse (the message names the position)."""
    kind = _EXPRESSION_TYPES.get(sub.type)
    try:
        if kind is None:
            raise UnknownFilterTypeError(str(sub.type))
        return build_filter(kind, sub.expression)
    except (Sql92ParseError, UnknownFilterTypeError) as e:
        raise Refusal(pb.RESPONSE_CODE_SUBSCRIPTION_PARSE_FAILED, str(e)) from e
