"""``basalt admin scheduleStatus``: what is scheduled on each store-node, and the
delivery times ``queryMsgById`` / ``queryMsgByKey`` show (issue 30)::

    basalt admin scheduleStatus [-b BROKER ...] [-t TOPIC] [--next N]

RocketMQ 5's mqadmin has no verb for its timers (``brokerStatus`` prints
``timerReadBehind`` and ``timerCongestNum``, the broker keeps per-topic
``timingCount`` in ``config/timermetrics``); the name follows its
``brokerStatus`` / ``topicStatus``. Each registered store-node (a broker
group's master: only it delivers) is asked ``GetScheduleStatus``; the table
has one row per delay level (its delay, the parked messages not yet
delivered, the next one's due time), one per topic with pending timers (with
its next ``--next`` due times, default 1), and one ``(all topics)`` row per
store-node with every pending timer and how far the timer's scan has come
(``read_to``: what is due before it has been delivered). ``-t TOPIC`` lists
that topic's timers only (delay levels are shared by every topic: left
out). ``--json`` has one object per row, the times in epoch ms too
(``next_due_ms`` a list). A store-node that does not answer (or refuses: a
``--next`` over its limit of 1000) is a row ``(failed: why)`` and exit
status 1, the others' rows printed.

The delivery time of one message is :func:`basalt.common.delivery.delivery_time_ms`
over the store-node's delay table (from the same call).
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import grpc

from basalt.admin import ops
from basalt.admin.errors import AdminError, BrokerNotRegisteredError, PeerCallError
from basalt.common.delivery import delay_level, delivery_time_ms
from basalt.common.message import PROPERTY_DELAY_TIME_LEVEL, MessageRecord
from basalt.v1 import store_node_pb2 as sn

if TYPE_CHECKING:
    from basalt.admin.verbs import Table
    from basalt.services.meta import MetaClient

#: The columns only ``--json`` prints (verbs.JSON_ONLY holds them too).
JSON_ONLY = frozenset({"next_due_ms", "read_to_ms", "deliver_ms"})
SCHEDULE_HEADER = [
    "broker",
    "kind",
    "name",
    "delay",
    "pending",
    "next_due",
    "next_due_ms",
    "read_to",
    "read_to_ms",
]
#: A store-node's row for all its timers (``name``).
ALL_TOPICS = "(all topics)"
_UNITS = (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000))


def delay_text(delay_ms: int) -> str:
    """A level's delay as ``message_delay_level`` writes it (``10s``, ``2h``), in
    the largest unit that divides it; ms otherwise."""
    for unit, size in _UNITS:
        if delay_ms > 0 and delay_ms % size == 0:
            return f"{delay_ms // size}{unit}"
    return f"{delay_ms}ms"


async def schedule_status(
    meta: MetaClient, brokers: Sequence[str], topic: str, max_next_due: int
) -> list[tuple[str, sn.GetScheduleStatusResponse | AdminError]]:
    """Each of ``brokers`` (every registered store-node when empty, by name) and
    its GetScheduleStatus answer, or the error it failed with. An unknown broker
    name raises BrokerNotRegisteredError."""
    registered = await meta.list_brokers()
    names = sorted(set(brokers)) if brokers else sorted(registered)
    unknown = [name for name in names if name not in registered]
    if unknown:
        raise BrokerNotRegisteredError(unknown, f"store-node(s) not registered: {unknown}")
    request = sn.GetScheduleStatusRequest(topic=topic, max_next_due=max_next_due)

    async def one(name: str) -> sn.GetScheduleStatusResponse | AdminError:
        async with ops._store_node(meta.tls, registered, name) as stub:
            try:
                return await ops._call(
                    name, stub.GetScheduleStatus(request, timeout=ops.CALL_TIMEOUT_S)
                )
            except PeerCallError as e:
                return e

    return list(zip(names, await asyncio.gather(*(one(n) for n in names)), strict=True))


def status_rows(
    broker: str,
    status: sn.GetScheduleStatusResponse,
    *,
    levels: bool,
    iso_time: Callable[[int], str],
) -> list[list[Any]]:
    """One store-node's rows of :data:`SCHEDULE_HEADER`."""
    rows: list[list[Any]] = []
    if levels:
        for level in status.levels:
            due = [level.next_due_ms] if level.next_due_ms > 0 else []
            rows.append(
                [
                    broker,
                    "level",
                    str(level.level),
                    delay_text(level.delay_ms),
                    level.pending,
                    " ".join(map(iso_time, due)),
                    due,
                    "",
                    None,
                ]
            )
    for timers in status.timer_topics:
        due = list(timers.next_due_ms)
        rows.append(
            [
                broker,
                "timer",
                timers.topic,
                "",
                timers.pending,
                " ".join(map(iso_time, due)),
                due,
                "",
                None,
            ]
        )
    read_to = status.timer_read_ms
    earliest = min((t.next_due_ms[0] for t in status.timer_topics if t.next_due_ms), default=0)
    rows.append(
        [
            broker,
            "timer",
            ALL_TOPICS,
            "",
            status.timer_pending,
            iso_time(earliest),
            [earliest] if earliest > 0 else [],
            iso_time(read_to),
            read_to or None,
        ]
    )
    return rows


async def _schedule_status(meta: MetaClient, a: argparse.Namespace) -> Table:
    # verbs imports this module to register the verb: its helpers load on use.
    from basalt.admin.verbs import _Partial, iso_time

    if a.next < 0:
        raise ValueError(f"--next {a.next}: 0 or more due times per topic")
    answers = await schedule_status(meta, a.broker or (), a.topic or "", a.next)
    rows: list[list[Any]] = []
    for broker, status in answers:
        if isinstance(status, AdminError):
            rows.append([broker, f"(failed: {status})", "", "", "", "", [], "", None])
        else:
            rows += status_rows(broker, status, levels=not a.topic, iso_time=iso_time)
    if any(isinstance(status, AdminError) for _, status in answers):
        raise _Partial(SCHEDULE_HEADER, rows)
    return SCHEDULE_HEADER, rows


# -- a message's delivery time (queryMsgById, queryMsgByKey) ----------------------------


async def delivery_times(
    meta: MetaClient, found: Sequence[tuple[str, MessageRecord]]
) -> list[tuple[int | None, str]]:
    """Per (broker, record) of ``found``: its delivery time in Unix ms
    (:func:`~basalt.common.delivery.delivery_time_ms`; None: not scheduled) and
    a note when it could not be told (a delay level whose store-node did not
    give its delay table)."""
    tables: dict[str, tuple[int, ...] | str] = {}
    needed = sorted(
        {b for b, r in found if delay_level(r.properties.get(PROPERTY_DELAY_TIME_LEVEL)) > 0}
    )
    if needed:
        registered = await meta.list_brokers()
        for name in needed:
            tables[name] = await _delay_table(meta, registered, name)
    out: list[tuple[int | None, str]] = []
    for broker, record in found:
        table = tables.get(broker, ())
        delays = table if isinstance(table, tuple) else ()
        at = delivery_time_ms(record.properties, record.store_timestamp_ms, delays)
        level = record.properties.get(PROPERTY_DELAY_TIME_LEVEL)
        note = f"level {level}: {table}" if isinstance(table, str) and at is None else ""
        out.append((at, note))
    return out


async def _delay_table(
    meta: MetaClient, registered: dict[str, Any], name: str
) -> tuple[int, ...] | str:
    """Store-node ``name``'s delay table (level i's delay at index i - 1), or why
    it is unknown."""
    try:
        async with ops._store_node(meta.tls, registered, name) as stub:
            status = await stub.GetScheduleStatus(
                sn.GetScheduleStatusRequest(), timeout=ops.CALL_TIMEOUT_S
            )
    except BrokerNotRegisteredError:
        return f"store-node {name!r} is not registered"
    except grpc.aio.AioRpcError as e:
        return f"no delay table from store-node {name!r}: {e.details() or e.code().name}"
    ordered = sorted(status.levels, key=lambda level: level.level)
    return tuple(level.delay_ms for level in ordered)


#: verb -> (help, argument adder, operation), as verbs.VERBS.
VERBS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], object], Any]] = {
    "scheduleStatus": (
        "what each store-node has scheduled: per delay level and per topic of the timers, "
        "how many are pending and when the next are due",
        lambda p: (
            p.add_argument("-b", "--broker", action="append", help="a store-node (repeat)"),
            p.add_argument("-t", "--topic", help="only this topic's timers (no delay levels)"),
            p.add_argument(
                "--next", type=int, default=1, metavar="N", help="due times listed per topic"
            ),
        ),
        _schedule_status,
    ),
}
