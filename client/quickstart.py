"""``basalt produce`` and ``basalt consume``: RocketMQ's quickstart Producer and
Consumer, on the SDK.

::

    basalt produce -t TopicTest -n 1000 [--tags a,b] [--size 1024] [--batch 100]
    basalt consume -t TopicTest -g G [-s "tagA || tagB" | --sql "a > 5"] [--count N]

Both reach the cluster through a pull-service: ``--endpoints host:port``, else
env ``BASALT_ENDPOINTS``, else the one ``basalt cluster up`` started in the
nearest ``.basalt`` directory at or above the current one
(:func:`basalt.common.local_cluster.discover`).
``produce`` prints one line per send (or batch) and a summary; ``consume``
reads every queue of the topic from the group's committed offsets (from the
first offset for a new group), prints one line per message (its store-node,
queue, offset, tags, msgId and up to 64 bytes of its body, a longer one marked
``... (N bytes)``), commits, and stops after ``--count`` messages or
``--idle-ms`` of silence. ``--sql`` is checked by the pull-service once,
before any fetch. Calls are signed with ``--credentials FILE`` (default: env
``BASALT_CREDENTIALS``, else the local cluster's admin user; none: unsigned).
Exit status 0,
1 when a send or pull failed (the error on stderr), 2 for bad usage.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import time
from collections.abc import Callable, Coroutine
from typing import IO, Any

from basalt.client.errors import ClientError
from basalt.client.lite_pull_consumer import ConsumeFromWhere, LitePullConfig, LitePullConsumer
from basalt.client.producer import Producer, deliver_after
from basalt.common import auth
from basalt.common.local_cluster import (
    CREDENTIALS_HELP,
    ClusterNotFoundError,
    discover,
    discover_credentials,
    discover_tls,
)
from basalt.common.message import Message

EXIT_FAILED = 1
EXIT_USAGE = 2
ENDPOINTS_HELP = (
    "a pull-service host:port (default: env BASALT_ENDPOINTS, else the local cluster "
    "of the nearest ./.basalt upward)"
)


def _endpoints(args: argparse.Namespace, stderr: IO[str]) -> str | None:
    try:
        return discover(
            "pull-service", flag="--endpoints", given=args.endpoints, env="BASALT_ENDPOINTS"
        )
    except ClusterNotFoundError as e:
        print(f"basalt {args.group}: {e}", file=stderr)
        return None


async def produce(args: argparse.Namespace, endpoints: str, out: IO[str]) -> int:
    tags = [t for t in args.tags.split(",") if t] if args.tags else [""]
    body = b"x" * args.size
    started = time.monotonic()
    sent = 0
    deliver_ms = _deliver_time(args)
    async with Producer(endpoints, group=args.group_name, tls=discover_tls()) as producer:
        while sent < args.count:
            n = min(args.batch, args.count - sent)
            messages = [
                Message(
                    args.topic,
                    body,
                    tags=tags[(sent + k) % len(tags)] or None,
                    keys=(f"key-{sent + k}",),
                    delay_time_level=args.delay_level,
                    deliver_time_ms=deliver_ms,
                )
                for k in range(n)
            ]
            results = (
                await producer.send_batch(messages) if n > 1 else [await producer.send(messages[0])]
            )
            for r in results if args.verbose else results[:1]:
                print(
                    f"SendResult [status={'SEND_OK' if r.ok else 'FLUSH_DISK_TIMEOUT'}, "
                    f"msgId={r.msg_id}, offsetMsgId={r.offset_msg_id}, "
                    f"queue={r.broker_name}/{r.queue_id}, queueOffset={r.queue_offset}"
                    + (f", recallHandle={r.recall_handle}" if r.recall_handle else "")
                    + "]"
                    + (f" (+{n - 1} in this batch)" if n > 1 and not args.verbose else ""),
                    file=out,
                )
            sent += n
    secs = time.monotonic() - started
    print(f"sent {sent} messages to {args.topic} in {secs:.2f} s", file=out)
    return 0


def _deliver_time(args: argparse.Namespace) -> int:
    """--deliver-at (Unix ms, or an ISO 8601 time; no zone: UTC) or --deliver-after
    (seconds from now) as a deliver_time_ms; 0 for neither."""
    if args.deliver_after is not None:
        return deliver_after(args.deliver_after)
    return int(args.deliver_at or 0)


def parse_deliver_at(text: str) -> int:
    """Unix ms, or an ISO 8601 time (no zone: UTC), as Unix ms. Raises ValueError."""
    if text.isdigit():
        return int(text)
    when = datetime.datetime.fromisoformat(text)
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return int(when.timestamp() * 1000)


def _deliver_at_arg(text: str) -> int:
    try:
        return parse_deliver_at(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither Unix ms nor an ISO 8601 time (2030-01-02T03:04:05)"
        ) from None


async def consume(args: argparse.Namespace, endpoints: str, out: IO[str]) -> int:
    config = LitePullConfig(
        consumer_group=args.consumer_group,
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
        subscription=args.sql or args.subscription,
        sql92=args.sql is not None,
    )
    received = 0
    async with LitePullConsumer(endpoints, config=config, tls=discover_tls()) as consumer:
        queues = await consumer.queues_of(args.topic)
        if args.sql is not None and queues:
            # Once, before the fetches: each queue's would fail alike.
            await consumer.check_subscription(queues[0], args.sql, sql92=True)
        await consumer.assign(queues)
        brokers = await consumer.brokers_by_store_host()
        while args.count is None or received < args.count:
            left = None if args.count is None else args.count - received
            records = await consumer.poll(timeout_ms=args.idle_ms, max_records=left)
            if not records:
                break
            for r in records:
                broker = brokers.get(r.store_host, r.store_host)
                print(
                    f"{r.topic} broker={broker} queue={r.queue_id} offset={r.queue_offset} "
                    f"tags={r.tags or ''} msgId={r.uniq_key or ''} body={shown_body(r.body)}",
                    file=out,
                )
            received += len(records)
    print(f"received {received} messages from {args.topic}", file=out)
    return 0


#: ``consume`` prints at most this many bytes of a body.
BODY_SHOWN = 64


def shown_body(body: bytes) -> str:
    """``body`` as a bytes literal, its first :data:`BODY_SHOWN` bytes only; a
    longer one says so and how long it is (``b'xx...' ... (1024 bytes)``)."""
    if len(body) <= BODY_SHOWN:
        return repr(body)
    return f"{body[:BODY_SHOWN]!r}... ({len(body)} bytes)"


def add_produce(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-t", "--topic", required=True)
    parser.add_argument("-n", "--count", type=int, default=1000, help="messages to send")
    parser.add_argument("--tags", help="tags, comma separated, used in turn")
    parser.add_argument("--size", type=int, default=1024, help="body bytes")
    parser.add_argument("--batch", type=int, default=1, help="messages per send (one queue)")
    parser.add_argument(
        "--delay-level",
        type=int,
        default=0,
        help="RocketMQ delay level: 1 = 1s, 2 = 5s, ... 18 = 2h (the store's "
        "message_delay_level); needs --batch 1",
    )
    when = parser.add_mutually_exclusive_group()
    when.add_argument(
        "--deliver-at",
        metavar="TIME",
        type=_deliver_at_arg,
        help="RocketMQ 5 timer: deliver at this time, Unix ms or ISO 8601 "
        "(2030-01-02T03:04:05, UTC unless a zone is given); needs --batch 1; "
        "the SendResult lines show each message's recall handle (docs/timers.md)",
    )
    when.add_argument(
        "--deliver-after",
        metavar="SECONDS",
        type=float,
        help="RocketMQ 5 timer: deliver this many seconds after the send; needs --batch 1",
    )
    parser.add_argument("--group-name", default="quickstart-producer", help="producer group")
    parser.add_argument("-v", "--verbose", action="store_true", help="one line per message")
    parser.add_argument("--endpoints", help=ENDPOINTS_HELP)
    parser.add_argument("--credentials", metavar="FILE", help=CREDENTIALS_HELP)
    parser.set_defaults(handler=_run(produce))


def add_consume(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-t", "--topic", required=True)
    parser.add_argument("-g", "--consumer-group", required=True)
    parser.add_argument("-s", "--subscription", default="*", help='TAG expression, e.g. "a || b"')
    parser.add_argument("--sql", help='an SQL92 filter instead, e.g. "a > 5"')
    parser.add_argument("--count", type=int, help="stop after this many messages")
    parser.add_argument("--idle-ms", type=int, default=3000, help="stop after this long idle")
    parser.add_argument("--endpoints", help=ENDPOINTS_HELP)
    parser.add_argument("--credentials", metavar="FILE", help=CREDENTIALS_HELP)
    parser.set_defaults(handler=_run(consume))


Command = Callable[[argparse.Namespace, str, IO[str]], Coroutine[Any, Any, int]]


def _run(command: Command) -> Callable[[argparse.Namespace, IO[str], IO[str]], int]:
    def handler(args: argparse.Namespace, stdout: IO[str], stderr: IO[str]) -> int:
        if getattr(args, "count", 1) is not None and getattr(args, "count", 1) < 1:
            print(f"basalt {args.group}: --count must be at least 1", file=stderr)
            return EXIT_USAGE
        if getattr(args, "batch", 1) < 1 or getattr(args, "size", 0) < 0:
            print(f"basalt {args.group}: --batch must be >= 1 and --size >= 0", file=stderr)
            return EXIT_USAGE
        endpoints = _endpoints(args, stderr)
        if endpoints is None:
            return EXIT_USAGE
        try:
            # Signs every call of the command's clients (a cluster with auth on).
            auth.use_process_credentials(discover_credentials(args.credentials))
        except (OSError, ValueError) as e:
            print(f"basalt {args.group}: --credentials: {e}", file=stderr)
            return EXIT_USAGE
        try:
            return asyncio.run(command(args, endpoints, stdout))
        except (ClientError, ValueError) as e:
            print(f"basalt {args.group}: {e}", file=stderr)
            return EXIT_FAILED

    return handler
