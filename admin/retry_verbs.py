"""``basalt admin`` verbs of a consumer group's retries and dead letters (docs/retry.md).

::

    basalt admin retryStatus -g G
    basalt admin resendDlq -g G [-i MSG_ID ...]

``retryStatus``: per queue of ``%RETRY%<group>`` the messages stored (min and
max offset), the group's committed offset and the depth (what waits for the
group there: max offset - the committed offset, or - the min offset before the
group committed any); per queue of ``%DLQ%<group>`` the messages it holds. A
retry still waiting for its delay level is in ``SCHEDULE_TOPIC_XXXX``, not
counted here. A topic the group has not made yet shows one row, "(none)".

``resendDlq``: every message of ``%DLQ%<group>`` (or those whose id is given:
the producer's message id (UNIQ_KEY), the dead letter's offset message id, or
the original's ORIGIN_MESSAGE_ID) sent again to its original topic
(RETRY_TOPIC, else DLQ_ORIGIN_TOPIC) with its body, flag, tag, keys, UNIQ_KEY
and user properties, round robin over the topic's writable queues, one row
per message and a last row saying how many. At least once: the dead letters
stay where they are, so running it again sends them again (a consumer
dedupes on the UNIQ_KEY), and every group subscribed to the original topic
gets them. An id given that is not in the topic, or an original topic that
does not exist, fails the verb before anything is sent.

Both take ``--etcd``, ``--cluster`` and ``--json`` as every verb
(:mod:`basalt.admin.verbs`, which registers these).
"""

from __future__ import annotations

import argparse
import itertools
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from basalt.admin.errors import AdminError
from basalt.admin.ops import (
    CALL_TIMEOUT_S,
    _call,
    _store_node,
    committed_offset,
    queue_bounds,
    read_queue_at,
)
from basalt.admin.topics import topic_config
from basalt.common.message import (
    PROPERTY_ORIGIN_MESSAGE_ID,
    MessageRecord,
    dlq_topic,
    restored_message,
    retry_topic,
)
from basalt.common.record import decode_records
from basalt.v1 import common_pb2 as pb
from basalt.v1 import store_node_pb2 as sn
from basalt.v1 import store_node_pb2_grpc as sn_grpc

if TYPE_CHECKING:
    from basalt.services.meta import MetaClient

#: Records per read of a dead-letter queue.
READ_BATCH = 64

Table = tuple[list[str], list[list[Any]]]
RetryVerb = Callable[["MetaClient", argparse.Namespace], Coroutine[Any, Any, Table]]


@dataclass(frozen=True, slots=True)
class QueueDepth:
    """retryStatus' row: one queue of a group's retry or dead-letter topic."""

    topic: str
    broker_name: str
    queue_id: int
    min_offset: int
    max_offset: int
    #: The group's committed offset (retry topic; -1: none); None for the DLQ.
    consumer_offset: int | None

    @property
    def depth(self) -> int:
        start = self.min_offset
        if self.consumer_offset is not None:
            start = max(start, self.consumer_offset)
        return max(0, self.max_offset - start)


async def retry_status(meta: MetaClient, group: str) -> dict[str, list[QueueDepth]]:
    """Per topic (``%RETRY%<group>``, ``%DLQ%<group>``) its queues' depths; an
    empty list for a topic that does not exist."""
    brokers = await meta.list_brokers()
    out: dict[str, list[QueueDepth]] = {}
    for topic, committed in ((retry_topic(group), True), (dlq_topic(group), False)):
        rows = out[topic] = []
        config = await meta.get_topic(topic)
        for name in config.brokers if config else ():
            async with _store_node(meta.tls, brokers, name) as stub:
                for q in range(config.read_queue_nums if config else 0):
                    bounds = await queue_bounds(stub, name, topic, q)
                    offset = None
                    if committed:
                        offset = await committed_offset(stub, name, group, topic, q)
                    rows.append(
                        QueueDepth(topic, name, q, bounds.min_offset, bounds.max_offset, offset)
                    )
    return out


@dataclass(frozen=True, slots=True)
class Resent:
    """resendDlq's row: a dead letter and where its copy went."""

    letter: MessageRecord
    queue: pb.MessageQueue
    offset_msg_id: str


async def dead_letters(meta: MetaClient, group: str) -> list[tuple[str, MessageRecord]]:
    """Every message of ``%DLQ%<group>``, as (broker, record); AdminError when
    the group has no dead-letter topic."""
    topic = dlq_topic(group)
    config = await meta.get_topic(topic)
    if config is None:
        raise AdminError(f"group {group!r} has no dead-letter topic {topic!r}: nothing to resend")
    brokers = await meta.list_brokers()
    out: list[tuple[str, MessageRecord]] = []
    for name in config.brokers:
        async with _store_node(meta.tls, brokers, name) as stub:
            for q in range(config.read_queue_nums):
                out += [(name, r) for r in await _read_queue(stub, name, topic, q)]
    return out


async def _read_queue(
    stub: sn_grpc.StoreNodeAsyncStub, broker: str, topic: str, queue_id: int
) -> list[MessageRecord]:
    bounds = await queue_bounds(stub, broker, topic, queue_id)
    records: list[MessageRecord] = []
    offset = bounds.min_offset
    while offset < bounds.max_offset:
        got = await read_queue_at(stub, broker, topic, queue_id, offset, READ_BATCH)
        records += decode_records(got.records.data)
        if got.next_begin_offset <= offset:
            break  # nothing more readable (expired meanwhile)
        offset = got.next_begin_offset
    return records


def _ids_of(record: MessageRecord) -> set[str]:
    ids = {record.msg_id, record.properties.get(PROPERTY_ORIGIN_MESSAGE_ID, "")}
    return (ids | {record.uniq_key or ""}) - {""}


async def resend_dlq(meta: MetaClient, group: str, ids: Sequence[str] = ()) -> list[Resent]:
    """Send ``group``'s dead letters (all, or those ``ids`` name) to their
    original topics (module docstring); AdminError, nothing sent, when an id is
    not among them or an original topic does not exist."""
    letters = [r for _, r in await dead_letters(meta, group)]
    if ids:
        wanted = set(ids)
        found = set().union(*(_ids_of(r) for r in letters)) if letters else set()
        missing = sorted(wanted - found)
        if missing:
            raise AdminError(
                f"not in {dlq_topic(group)!r}: {', '.join(missing)} (give a message id, "
                "offset message id or ORIGIN_MESSAGE_ID that retryStatus's topic holds)"
            )
        letters = [r for r in letters if _ids_of(r) & wanted]
    messages = [restored_message(r) for r in letters]
    queues: dict[str, itertools.cycle[tuple[str, int]]] = {}
    for topic in sorted({m.topic for m in messages}):
        config = await topic_config(meta, topic)  # TopicNotFoundError: the verb fails
        queues[topic] = itertools.cycle(
            [(b, q) for b in config.brokers for q in range(config.write_queue_nums)]
        )
    brokers = await meta.list_brokers()
    out: list[Resent] = []
    for letter, message in zip(letters, messages, strict=True):
        broker, queue_id = next(queues[message.topic])
        wire = pb.Message(
            topic=message.topic,
            body=message.body,
            tags=message.tags or "",
            keys=list(message.keys),
            properties=message.properties,
            flag=message.flag,
            born_timestamp_ms=message.born_timestamp_ms,
            born_host=message.born_host,
        )
        async with _store_node(meta.tls, brokers, broker) as stub:
            sent = await _call(
                broker,
                stub.SendMessage(
                    sn.SendMessageRequest(message=wire, queue_id=queue_id), timeout=CALL_TIMEOUT_S
                ),
            )
        out.append(Resent(letter, sent.result.queue, sent.result.offset_msg_ids[0]))
    return out


# -- the verbs ------------------------------------------------------------------------


async def _retry_status(meta: MetaClient, a: argparse.Namespace) -> Table:
    header = ["topic", "broker", "queue", "min_offset", "max_offset", "consumer_offset", "depth"]
    rows: list[list[Any]] = []
    for topic, queues in (await retry_status(meta, a.group)).items():
        if not queues:
            rows.append([topic, "(none)", "", "", "", "", 0])
        rows += [
            [
                q.topic,
                q.broker_name,
                q.queue_id,
                q.min_offset,
                q.max_offset,
                "" if q.consumer_offset is None else q.consumer_offset,
                q.depth,
            ]
            for q in queues
        ]
    return header, rows


async def _resend_dlq(meta: MetaClient, a: argparse.Namespace) -> Table:
    resent = await resend_dlq(meta, a.group, a.msg_id or ())
    header = ["msg_id", "dlq_offset_msg_id", "topic", "broker", "queue", "offset_msg_id"]
    rows: list[list[Any]] = [
        [
            r.letter.uniq_key or "",
            r.letter.msg_id,
            r.queue.topic,
            r.queue.broker_name,
            r.queue.queue_id,
            r.offset_msg_id,
        ]
        for r in resent
    ]
    rows.append([f"({len(resent)} re-sent)", "", "", "", "", ""])
    return header, rows


#: verb -> (help, argument adder, operation), as basalt.admin.verbs.VERBS.
VERBS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], object], RetryVerb]] = {
    "retryStatus": (
        # No "%" here: argparse formats help with it.
        "a group's retry and dead-letter depth, per queue of its retry and dead-letter topics",
        lambda p: p.add_argument("-g", "--group", required=True),
        _retry_status,
    ),
    "resendDlq": (
        "send a group's dead letters (all, or by id) again to their original topics",
        lambda p: (
            p.add_argument("-g", "--group", required=True),
            p.add_argument(
                "-i",
                "--msg-id",
                action="append",
                help="a message id, dead letter's offset message id or ORIGIN_MESSAGE_ID "
                "(repeat; default: every dead letter)",
            ),
        ),
        _resend_dlq,
    ),
}
