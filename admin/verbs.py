"""``basalt admin <verb>``: mqadmin's verbs and flags, over :mod:`basalt.admin.ops`.

::

    basalt admin updateTopic -t T [-r N] [-w N] [-p 6|4|2] [-b broker ...]
    basalt admin deleteTopic -t T
    basalt admin topicList
    basalt admin topicRoute -t T
    basalt admin topicStatus -t T
    basalt admin consumerProgress -g G [-t T]
    basalt admin clusterList
    basalt admin consumerConnection -g G
    basalt admin queryMsgByKey -t T -k KEY
    basalt admin queryMsgById -i OFFSET_MSG_ID|MSG_ID [-t T]
    basalt admin brokerStatus -b BROKER
    basalt admin scheduleStatus [-b BROKER ...] [-t T] [--next N]   (basalt.admin.schedule_verbs)
    basalt admin electMaster -b BROKER -n BROKER_ID [--unclean]
    basalt admin shrinkTopic -t T -n N [--wait-s S] [-g offline-group ...]
    basalt admin resetOffsetByTime -g G -t T -s now|MILLIS|-1|yyyy-MM-dd#HH:mm:ss:SSS [-f BOOL]

Every verb takes ``--etcd host:port[,host:port]`` (default: env ``BASALT_ETCD``,
else the etcd of the cluster ``basalt cluster up`` started in the nearest
``.basalt`` directory at or above the current one:
:func:`basalt.common.local_cluster.discover`), ``--cluster`` and ``--json``
(one JSON document instead of an aligned table: a list of one object per
row; consumerProgress's ``{"queues": [...], "total": {...}}``). Tables show
times as ISO-8601 UTC dates with their milliseconds; ``--json`` has the date
and the epoch milliseconds both. Exit status 0, 1 when the
operation failed (the reason on stderr: an unknown topic or group, a
store-node or etcd that did not answer; for resetOffsetByTime, a store-node
that failed or a consumer that did not confirm, with the table of what was
done), 2 for bad usage. Calls are signed with ``--credentials FILE`` (default:
env ``BASALT_CREDENTIALS``, else the local cluster's admin user; none: unsigned),
and the user and ACL verbs live in :mod:`basalt.admin.auth_verbs`.

The verbs the admin service offers (updateTopic, deleteTopic, topicList,
resetOffsetByTime) also take ``--server [HOST:PORT]``: run through that admin
service instead of over etcd from here (a bare ``--server``: the local
cluster's, from the nearest ``.basalt/cluster.json``). Same tables, same exit
statuses; the one difference is admin.proto's: a reset some store-node
failed prints the service's error naming it, not the partial table
(:mod:`basalt.admin.backends`).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any

from basalt.admin import auth_verbs, extras, groups, ops, retry_verbs, schedule_verbs, topics
from basalt.admin.backends import DirectAdmin, ServiceAdmin, TopicAdmin
from basalt.admin.errors import AdminError, BrokerNotRegisteredError, PeerCallError
from basalt.common import dial
from basalt.common.local_cluster import ClusterNotFoundError, discover, discover_tls
from basalt.common.message import MessageRecord
from basalt.services.meta import MetaConfig, MetaError, Perm, TopicConfig, parse_endpoints
from basalt.v1 import pull_service_pb2 as ps

if TYPE_CHECKING:
    # etcd's client comes with the server extra: a verb run over etcd imports it
    # then (_meta_client); through the admin service (--server) none is needed.
    from basalt.services.meta import MetaClient

EXIT_FAILED = 1
EXIT_USAGE = 2

#: A verb's answer: the table's header and its rows.
Table = tuple[list[str], list[list[Any]]]
#: A verb run over etcd and the store-nodes from here.
Verb = Callable[["MetaClient", argparse.Namespace], Coroutine[Any, Any, Table]]
#: A verb the admin service offers: run against a TopicAdmin, here or there.
ServedVerb = Callable[[TopicAdmin, argparse.Namespace], Coroutine[Any, Any, Table]]


@dataclass(frozen=True, slots=True)
class Served:
    """Marks a verb the admin service offers (it takes ``--server``)."""

    operation: ServedVerb


async def _update_topic(admin: TopicAdmin, a: argparse.Namespace) -> Table:
    write = await admin.update_topic(
        a.topic,
        topics.TopicChange(
            read_queue_nums=a.read_queue_nums,
            write_queue_nums=a.write_queue_nums,
            perm=Perm(a.perm) if a.perm is not None else None,
            brokers=tuple(a.broker or ()),
            keep_read_queues=True,
        ),
    )
    result = "created" if write.created else "updated"
    kept = write.config.read_queue_nums
    if a.read_queue_nums is not None and kept > a.read_queue_nums:
        # The safe shrink (docs/admin.md#shrinktopic-and-updatetopic): the read
        # queues go only once drained.
        result += (
            f"; read_queue_nums kept at {kept} until queues >= {a.read_queue_nums} are "
            f"drained: basalt admin shrinkTopic -t {a.topic} -n {a.read_queue_nums} --wait-s 60"
            " (and -g GROUP for each group that reads it while not connected)"
        )
    return _topic_rows(write.config, result)


async def _delete_topic(admin: TopicAdmin, a: argparse.Namespace) -> Table:
    await admin.delete_topic(a.topic)
    return ["topic", "result"], [[a.topic, "deleted"]]


async def _topic_list(admin: TopicAdmin, a: argparse.Namespace) -> Table:
    return ["topic"], [[name] for name in await admin.topic_names()]


async def _topic_route(meta: MetaClient, a: argparse.Namespace) -> Table:
    config = await topics.topic_config(meta, a.topic)
    brokers = await meta.list_brokers()
    rows = [
        [
            name,
            brokers[name].address if name in brokers else "(not registered)",
            config.read_queue_nums,
            config.write_queue_nums,
            int(config.perm),
        ]
        for name in config.brokers
    ]
    return ["broker", "address", "read_queue_nums", "write_queue_nums", "perm"], rows


async def _topic_status(meta: MetaClient, a: argparse.Namespace) -> Table:
    rows = await ops.topic_status(meta, a.topic)
    return ["broker", "queue", "min_offset", "max_offset", "last_update", "last_update_ms"], [
        [
            r.broker_name,
            r.queue_id,
            r.min_offset,
            r.max_offset,
            iso_time(r.last_update_timestamp_ms),
            r.last_update_timestamp_ms,
        ]
        for r in rows
    ]


async def _consumer_progress(meta: MetaClient, a: argparse.Namespace) -> Table:
    rows = await ops.consumer_progress(meta, a.group, a.topic)
    table = [
        [r.topic, r.broker_name, r.queue_id, r.broker_offset, r.consumer_offset, r.lag]
        for r in rows
    ]
    table.append([TOTAL, "", "", sum(r.broker_offset for r in rows), "", sum(r.lag for r in rows)])
    return ["topic", "broker", "queue", "broker_offset", "consumer_offset", "lag"], table


async def _cluster_list(meta: MetaClient, a: argparse.Namespace) -> Table:
    return groups.CLUSTER_HEADER, await groups.cluster_rows(meta)


async def _reset_offset_by_time(admin: TopicAdmin, a: argparse.Namespace) -> Table:
    force = a.force.strip().lower() == "true"  # Java's Boolean.valueOf, as mqadmin
    timestamp = ops.parse_timestamp(a.timestamp)
    outcome = await admin.reset_offset_by_time(
        a.group, a.topic, timestamp, force=force, ack_timeout_ms=a.timeout_ms
    )
    rows: list[list[Any]] = [
        [o.queue.broker_name, o.queue.queue_id, o.offset, o.reset_epoch, "reset"]
        for o in outcome.offsets
    ]
    rows += [[name, "", "", "", f"FAILED: {why}"] for name, why in sorted(outcome.failed.items())]
    if outcome.failed:
        rows.append(["(consumers)", "", "", "", "not told: a store-node failed; run it again"])
    elif outcome.acks is None:
        rows.append(["(consumers)", "", "", "", "no live consumer: reset on the store-nodes only"])
    else:
        rows += [
            [f"consumer {ack.client_id}", "", "", "", ps.CommandOutcome.Name(ack.outcome)[16:]]
            for ack in outcome.acks
        ]
    unconfirmed = [a.client_id for a in outcome.acks or () if a.outcome != ps.COMMAND_OUTCOME_OK]
    if outcome.failed or unconfirmed:
        raise _Partial(["broker", "queue", "offset", "reset_epoch", "result"], rows)
    return ["broker", "queue", "offset", "reset_epoch", "result"], rows


async def _consumer_connection(meta: MetaClient, a: argparse.Namespace) -> Table:
    rows = [
        [
            c.client_id,
            c.pull_service_id,
            iso_time(c.connected_since_ms),
            c.connected_since_ms,
            "; ".join(f"{s.topic}: {s.subscription.expression or '*'}" for s in c.subscriptions),
            c.client_version,
        ]
        for c in await ops.consumer_connection(meta, a.group)
    ]
    header = ["client_id", "pull_service", "connected_since", "connected_since_ms"]
    return [*header, "subscriptions", "version"], rows


async def _message_rows(meta: MetaClient, found: list[tuple[str, MessageRecord]]) -> Table:
    delivery = await schedule_verbs.delivery_times(meta, found)
    header = [
        "broker",
        "queue",
        "queue_offset",
        "msg_id",
        "offset_msg_id",
        "store_time",
        "store_ms",
        "tags",
        "keys",
        "deliver_time",
        "deliver_ms",
    ]
    return header, [
        [
            broker,
            r.queue_id,
            r.queue_offset,
            r.uniq_key or "",
            r.msg_id,
            iso_time(r.store_timestamp_ms),
            r.store_timestamp_ms,
            r.tags or "",
            " ".join(r.keys),
            note or iso_time(at or 0),
            at,
        ]
        for (broker, r), (at, note) in zip(found, delivery, strict=True)
    ]


async def _query_msg_by_key(meta: MetaClient, a: argparse.Namespace) -> Table:
    return await _message_rows(meta, await ops.query_msg_by_key(meta, a.topic, a.key))


async def _query_msg_by_id(meta: MetaClient, a: argparse.Namespace) -> Table:
    return await _message_rows(meta, await ops.query_msg_by_id(meta, a.msg_id, a.topic))


async def _broker_status(meta: MetaClient, a: argparse.Namespace) -> Table:
    state, members = await meta.get_group(a.broker)
    try:
        info = await ops.broker_status(meta, a.broker)
    except (BrokerNotRegisteredError, PeerCallError) as e:
        if state is None:
            raise
        # A replicated group whose master is down or gone: its group still shows.
        rows: list[list[Any]] = [["brokerName", a.broker], ["storeHost", f"(no answer: {e})"]]
    else:
        rows = [
            ["brokerName", info.broker_name],
            ["storeHost", info.store_host],
            ["bootTimestamp", info.boot_timestamp_ms],
            ["bootTime", iso_time(info.boot_timestamp_ms)],
            ["putTps", f"{info.put_tps:.1f}"],
            ["dispatchBehindBytes", info.dispatch_behind_bytes],
            ["diskUseRatio", f"{info.disk_use_ratio:.3f}"],
            ["commitLogMinOffset", info.commit_log_min_offset],
            ["commitLogMaxOffset", info.commit_log_max_offset],
        ]
        rows += [[k, v] for k, v in sorted(info.extra.items())]
    if state is not None:
        rows += groups.group_status(state, groups.member_rows(a.broker, state, members))
    return ["key", "value"], rows


async def _elect_master(meta: MetaClient, a: argparse.Namespace) -> Table:
    outcome = await groups.elect_master(meta, a.broker, a.broker_id, unclean=a.unclean)
    after = outcome.after
    rows: list[list[Any]] = [
        ["broker", a.broker],
        ["previousMaster", outcome.before.master_id],
        ["previousEpoch", outcome.before.epoch],
        ["master", after.master_id],
        ["epoch", after.epoch],
        ["syncStateSet", ",".join(map(str, sorted(after.sync_state_set)))],
        ["result", "elected" if after != outcome.before else "already the master: unchanged"],
    ]
    if outcome.warning:
        rows.append(["warning", outcome.warning])
    return ["key", "value"], rows


async def _shrink_topic(meta: MetaClient, a: argparse.Namespace) -> Table:
    steps = await ops.change_queue_nums(
        meta, a.topic, a.queue_nums, wait_s=a.wait_s, groups=a.group or ()
    )
    rows: list[list[Any]] = [[step] for step in steps]
    if any("stays" in step for step in steps):
        raise _Partial(["step"], rows)
    return ["step"], rows


class _Partial(Exception):
    """An operation that did part of its work: print the table, exit 1."""

    def __init__(self, header: list[str], rows: list[list[Any]]) -> None:
        super().__init__("partly failed")
        self.header = header
        self.rows = rows


def _topic_rows(config: TopicConfig, result: str) -> Table:
    return ["topic", "read_queue_nums", "write_queue_nums", "perm", "brokers", "result"], [
        [
            config.topic_name,
            config.read_queue_nums,
            config.write_queue_nums,
            int(config.perm),
            ",".join(config.brokers),
            result,
        ]
    ]


#: verb -> (help, argument adder, operation)
VERBS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], object], Verb | Served]] = {
    "updateTopic": (
        "create a topic or update its queue counts, perm or store-nodes",
        lambda p: (
            p.add_argument("-t", "--topic", required=True),
            p.add_argument("-r", "--read-queue-nums", type=int),
            p.add_argument("-w", "--write-queue-nums", type=int),
            p.add_argument("-p", "--perm", type=int, choices=[2, 4, 6]),
            p.add_argument("-b", "--broker", action="append", help="a store-node (repeat)"),
        ),
        Served(_update_topic),
    ),
    "deleteTopic": (
        "delete a topic's config",
        lambda p: p.add_argument("-t", "--topic", required=True),
        Served(_delete_topic),
    ),
    "topicList": ("every topic", lambda p: None, Served(_topic_list)),
    "topicRoute": (
        "a topic's store-nodes and queue counts",
        lambda p: p.add_argument("-t", "--topic", required=True),
        _topic_route,
    ),
    "topicStatus": (
        "a topic's queues: min, max offset and last store time",
        lambda p: p.add_argument("-t", "--topic", required=True),
        _topic_status,
    ),
    "consumerProgress": (
        "a group's offsets and lag, per queue",
        lambda p: (
            p.add_argument("-g", "--group", required=True),
            p.add_argument("-t", "--topic"),
        ),
        _consumer_progress,
    ),
    "clusterList": (
        "every store-node and its runtime figures; each broker group's members, roles, "
        "epoch, in-sync set, offsets and lag",
        lambda p: None,
        _cluster_list,
    ),
    "consumerConnection": (
        "a group's live consumers: their pull-service, subscriptions and connect time",
        lambda p: p.add_argument("-g", "--group", required=True),
        _consumer_connection,
    ),
    "queryMsgByKey": (
        "a topic's messages by key (KEYS or the producer's message id)",
        lambda p: (
            p.add_argument("-t", "--topic", required=True),
            p.add_argument("-k", "--key", required=True),
        ),
        _query_msg_by_key,
    ),
    "queryMsgById": (
        "a message by the id a send printed: its offsetMsgId, or its msgId (UNIQ_KEY)",
        lambda p: (
            p.add_argument("-i", "--msg-id", required=True, help="offsetMsgId or msgId"),
            p.add_argument("-t", "--topic", help="the topic of a msgId (default: every topic)"),
        ),
        _query_msg_by_id,
    ),
    "brokerStatus": (
        "one store-node's runtime figures (and its broker group's members)",
        lambda p: p.add_argument("-b", "--broker", required=True),
        _broker_status,
    ),
    "electMaster": (
        "move a broker group's mastership to one of its in-sync members (--unclean: any "
        "live member, losing what it lacks)",
        lambda p: (
            p.add_argument("-b", "--broker", required=True),
            p.add_argument("-n", "--broker-id", type=int, required=True, help="the new master"),
            p.add_argument(
                "--unclean",
                action="store_true",
                help="allow a member outside the in-sync set (records only the old master "
                "had are lost)",
            ),
        ),
        _elect_master,
    ),
    "shrinkTopic": (
        "change a topic's queue count safely: write first, read once drained (growing: read first)",
        lambda p: (
            p.add_argument("-t", "--topic", required=True),
            p.add_argument("-n", "--queue-nums", type=int, required=True),
            p.add_argument("--wait-s", type=float, default=0.0, help="wait this long to drain"),
            p.add_argument("-g", "--group", action="append", help="an offline group (repeat)"),
        ),
        _shrink_topic,
    ),
    "resetOffsetByTime": (
        "reset a group's offsets of a topic to a time, on the store-nodes and its live consumers",
        lambda p: (
            p.add_argument("-g", "--group", required=True),
            p.add_argument("-t", "--topic", required=True),
            p.add_argument(
                "-s",
                "--timestamp",
                required=True,
                help="now | millis | yyyy-MM-dd#HH:mm:ss:SSS; -1: the max offset. A time past "
                "a queue's last message gives that message's offset (RocketMQ 4.x's rule), so "
                "`now` leaves lag 1 per non-empty queue and its last message is read again; "
                "-1 skips everything",
            ),
            p.add_argument("-f", "--force", default="true", help="true | false (default true)"),
            p.add_argument("--timeout-ms", type=int, default=5000, help="consumers' ack wait"),
        ),
        Served(_reset_offset_by_time),
    ),
}
VERBS.update(retry_verbs.VERBS)
VERBS.update(schedule_verbs.VERBS)


def add_commands(parser: argparse.ArgumentParser) -> None:
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    for name, (help_text, add_arguments, operation) in VERBS.items():
        sub = verbs.add_parser(name, help=help_text, description=help_text)
        add_arguments(sub)
        where = sub.add_mutually_exclusive_group()
        where.add_argument(
            "--etcd",
            help="etcd host:port[,host:port] (default: env BASALT_ETCD, else the local "
            "cluster of the nearest ./.basalt upward)",
        )
        if isinstance(operation, Served):
            where.add_argument(
                "--server",
                nargs="?",
                const=LOCAL_SERVER,
                metavar="HOST:PORT",
                help="through the admin service at HOST:PORT (bare: the local cluster's)",
            )
        sub.add_argument("--cluster", default="DefaultCluster")
        sub.add_argument("--json", action="store_true", help="one JSON document")
        auth_verbs.add_credentials_flag(sub)
        sub.set_defaults(handler=_handler(operation))
    auth_verbs.add_commands(verbs, format_table=format_table)


#: ``--server`` given without an address: the local cluster's admin service.
LOCAL_SERVER = ""


def _handler(operation: Verb | Served) -> Callable[[argparse.Namespace, IO[str], IO[str]], int]:
    def run(args: argparse.Namespace, stdout: IO[str], stderr: IO[str]) -> int:
        # Only served verbs have --server (add_commands).
        server: str | None = args.server if isinstance(operation, Served) else None
        client = None if server is not None else _meta_client(args, operation)
        try:
            if server is not None:
                address = discover("admin", flag="--server address", given=server)
            else:
                address = discover("etcd", flag="--etcd", given=args.etcd, env="BASALT_ETCD")
            auth_verbs.use_credentials(args)
        except (ClusterNotFoundError, OSError, ValueError) as e:
            print(f"basalt admin {args.verb}: {e}", file=stderr)
            return EXIT_USAGE
        status = 0
        try:
            if server is not None:
                assert isinstance(operation, Served)
                header, rows = asyncio.run(_through_service(address, args, operation))
            else:
                assert client is not None
                header, rows = asyncio.run(_with_meta(client, address, args, operation))
        except _Partial as partial:
            header, rows, status = partial.header, partial.rows, EXIT_FAILED
        except (AdminError, MetaError, ValueError) as e:
            print(f"basalt admin {args.verb}: {e}", file=stderr)
            return EXIT_FAILED
        if args.json:
            json.dump(json_document(header, rows), stdout, indent=2)
            stdout.write("\n")
        else:
            stdout.write(format_table(header, rows))
        return status

    return run


def _meta_client(args: argparse.Namespace, operation: Verb | Served) -> type[MetaClient]:
    """etcd's client, for a verb run over etcd from here; MissingExtraError
    (basalt.admin.extras) where it is not installed."""
    hint = "or through the admin service: --server [HOST:PORT]"
    with extras.needs_extras(
        f"basalt admin {args.verb}", hint=hint if isinstance(operation, Served) else ""
    ):
        from basalt.services.meta import MetaClient
    return MetaClient


async def _with_meta(
    client: type[MetaClient], etcd: str, args: argparse.Namespace, operation: Verb | Served
) -> Table:
    config = MetaConfig(endpoints=parse_endpoints(etcd), cluster=args.cluster, op_timeout_s=3.0)
    async with client(config, tls=discover_tls()) as meta:
        if isinstance(operation, Served):
            return await operation.operation(DirectAdmin(meta), args)
        return await operation(meta, args)


async def _through_service(address: str, args: argparse.Namespace, operation: Served) -> Table:
    async with dial.channel(address, discover_tls()) as channel:
        return await operation.operation(ServiceAdmin(channel, address), args)


#: A table's last row, in a verb that sums its rows (consumerProgress).
TOTAL = "(total)"
#: Columns only ``--json`` prints: a time in milliseconds, which the table shows
#: as the date in the column before it (scripts get both).
JSON_ONLY = (
    frozenset({"last_update_ms", "connected_since_ms", "store_ms"}) | schedule_verbs.JSON_ONLY
)


def iso_time(ms: int) -> str:
    """Epoch milliseconds as ISO-8601 UTC with the milliseconds kept
    (``2026-11-24T17:24:18.123Z``); ``""`` for 0 or less (never set: an empty queue)."""
    if ms <= 0:
        return ""
    # Seconds and milliseconds as integers: exact, with no float in between.
    moment = datetime.datetime.fromtimestamp(ms // 1000, datetime.UTC).replace(
        microsecond=ms % 1000 * 1000
    )
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def json_document(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> Any:
    """``--json``'s document: a list of one object per row; a verb whose last
    row is its :data:`TOTAL` gives ``{"queues": [...], "total": {...}}`` instead,
    so a script reading the per-queue list never meets the sum (the total
    keeps only its summed columns)."""
    objects = [dict(zip(header, row, strict=True)) for row in rows]
    if not rows or rows[-1][0] != TOTAL:
        return objects
    total = {k: v for k, v in objects[-1].items() if k != header[0] and v != ""}
    return {"queues": objects[:-1], "total": total}


def format_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """An aligned table: numbers right-aligned, text left; the :data:`JSON_ONLY`
    columns left out."""
    shown = [i for i, name in enumerate(header) if name not in JSON_ONLY]
    header = [header[i] for i in shown]
    rows = [[row[i] for i in shown] for row in rows]
    cells = [list(header)] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    numeric = [
        all(_is_number(r[i]) for r in cells[1:]) and len(cells) > 1 for i in range(len(header))
    ]

    def line(row: Sequence[str]) -> str:
        return "  ".join(
            c.rjust(w) if num else c.ljust(w)
            for c, w, num in zip(row, widths, numeric, strict=True)
        ).rstrip()

    return (
        "\n".join([line(cells[0]), line(["-" * w for w in widths]), *map(line, cells[1:])]) + "\n"
    )


def _is_number(text: str) -> bool:
    return text.lstrip("-").replace(".", "", 1).isdigit() or text == ""
