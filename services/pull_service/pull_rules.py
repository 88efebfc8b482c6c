"""What the pull-service decides before and after a store-node read, without the network.

Before (:func:`check_pull`), RocketMQ's PullMessageProcessor checks in its
order, the first failure refusing the pull (pull_service.proto's table)::

    0. arguments: a valid group, offset >= 0, max_nums >= 1,
       suspend_timeout_ms >= 0                 INVALID_ARGUMENT   INVALID_PARAMETER
    1. the broker is registered                UNAVAILABLE        BROKER_NOT_EXIST
    2. the broker is readable                  PERMISSION_DENIED  NO_PERMISSION
    3. the topic exists                        NOT_FOUND          TOPIC_NOT_EXIST
    4. the topic is readable                   PERMISSION_DENIED  NO_PERMISSION
    5. 0 <= queue_id < read_queue_nums         INVALID_ARGUMENT   INVALID_PARAMETER
    6. the subscription parses                 INVALID_ARGUMENT   SUBSCRIPTION_PARSE_FAILED

Step 0 comes first as RocketMQ's header decoding does. RocketMQ answers
SYSTEM_ERROR at step 5; Basalt answers INVALID_PARAMETER (common.proto says
why). Step 3 asks whether the topic has an etcd config, not whether its
``brokers`` list names the broker: the store-node serves any configured topic
(it auto-creates on send before the list is updated), so the pull-service is
no stricter than the node that holds the data.

Steps 0 and 3-6 are :mod:`basalt.services.checks`' (``check_read_arguments``,
``readable_queue``, ``subscription_filter``), which the store-node runs on
every GetMessage and GetMessages entry too: the SDK's consumers read
store-nodes directly and are refused there exactly what a Pull is refused
here, with the same codes and messages. Steps 1-2 are the pull-service's own
(a store-node that answers is registered to itself).

After, :func:`basalt.services.errors.pull_response` answers a store-node's read
in the client's terms: the code and PullStatus of its GetMessageStatus
(RocketMQ's PullMessageProcessor and MQClientAPIImpl tables); the store-node
does the same for each entry of GetMessages.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from basalt.services.checks import (
    check_broker_perm,
    check_read_arguments,
    readable_queue,
    subscription_filter,
)
from basalt.services.errors import Refusal, invalid
from basalt.services.meta.model import BrokerRegistration, TopicConfig
from basalt.store.sql92 import MAX_SQL92_LENGTH
from basalt.v1 import common_pb2 as pb
from basalt.v1 import pull_service_pb2 as ps


def check_pull(
    request: ps.PullRequest,
    broker_of: Callable[[str], BrokerRegistration | None],
    topic_of: Callable[[str], TopicConfig | None],
) -> BrokerRegistration:
    """Run the module's checks 0-6 on ``request`` against the caches; returns the
    broker to read from. Raises the first failing check's Refusal."""
    check_read_arguments(request.group, request.offset, request.max_nums, max_field="max_nums")
    if request.suspend_timeout_ms < 0:
        raise invalid(f"suspend_timeout_ms {request.suspend_timeout_ms} is negative")
    q = request.queue
    broker = broker_of(q.broker_name)
    if broker is None:
        raise Refusal(
            pb.RESPONSE_CODE_BROKER_NOT_EXIST, f"broker {q.broker_name!r} is not registered"
        )
    check_broker_perm(q.broker_name, broker.perm, write=False)
    readable_queue(topic_of(q.topic), q.topic, q.queue_id)
    if request.HasField("subscription"):
        check_subscription(request.subscription)
    return broker


def check_subscription(sub: pb.Subscription) -> None:
    """SUBSCRIPTION_PARSE_FAILED (naming the position) unless ``sub`` parses."""
    # The cache keeps its keys: an expression longer than any SQL92 one
    # accepted skips it (a SQL92 one is refused on its length, a TAG one parses
    # in linear time), so distinct megabyte expressions cannot fill it.
    parse: Callable[..., tuple[int, str] | None] = _parse_refusal
    if len(sub.expression) > MAX_SQL92_LENGTH:
        parse = _parse_refusal.__wrapped__
    refused = parse(sub.type, sub.expression)
    if refused is not None:
        raise Refusal(*refused)


@functools.lru_cache(maxsize=4096)
def _parse_refusal(kind: pb.ExpressionType.ValueType, expression: str) -> tuple[int, str] | None:
    """The (response code, message) of the refusal of a subscription that does not
    parse, None when it parses. Consumers send the same few expressions with
    every pull: each is parsed once (the store-node parses again to filter, on
    its own cache of filters). The cache keeps the refusal's text, not the
    exception: a cached exception would keep its traceback's frames alive and
    gather one more with every raise."""
    try:
        subscription_filter(pb.Subscription(type=kind, expression=expression))
    except Refusal as r:
        return r.code, r.message
    return None


def topic_route(
    config: TopicConfig,
    broker_of: Callable[[str], BrokerRegistration | None],
    store_hosts: dict[str, str],
) -> pb.TopicRoute:
    """The TopicRoute of ``config``: one QueueData per hosting broker, one
    BrokerData per hosting broker that is registered (a missing one is down),
    ``store_hosts`` giving each broker's STOREHOSTADDRESS when known."""
    route = pb.TopicRoute(topic=config.topic_name, order=config.order)
    for name in config.brokers:
        route.queue_datas.append(
            pb.QueueData(
                broker_name=name,
                read_queue_nums=config.read_queue_nums,
                write_queue_nums=config.write_queue_nums,
                perm=int(config.perm),
            )
        )
        broker = broker_of(name)
        if broker is not None:
            route.broker_datas.append(
                pb.BrokerData(
                    broker_name=name,
                    # Clients dial the client address; this service, ``address``.
                    address=broker.client_address or broker.address,
                    perm=int(broker.perm),
                    store_host=store_hosts.get(name, ""),
                )
            )
    return route
