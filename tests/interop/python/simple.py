"""A SimpleConsumer scenario with the official RocketMQ 5 Python client (run as a
script, never imported: the client registers apache.rocketmq.v2 in protobuf's pool).

    python simple.py ENDPOINTS < spec.json

``spec.json``: ``{"topic": T, "group": G, "expect": N, "invisible_s": S}``.
Receives until N messages came (each invisible S seconds: long enough that
none comes again while the receives run); changes the first one's invisible
duration to 1 s and acks with its old handle (refused: stale); changes the
second one's to 1 s; acks all but the first two; receives until those two come again, acks them;
acks one of them once more (refused). Prints one JSON object: ``first`` and
``again`` (messages as ``{"id", "body", "attempt", "tag", "keys",
"properties", "group"}``), ``stale_ack`` and ``double_ack`` (the error text,
or null when the ack was taken).
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from rocketmq import ClientConfiguration, Credentials, FilterExpression, SimpleConsumer


def _view(m: Any) -> dict[str, Any]:
    return {
        "id": m.message_id, "body": m.body.decode(), "attempt": m.delivery_attempt,
        "tag": m.tag, "keys": sorted(m.keys), "properties": dict(m.properties),
        "group": m.message_group,
    }  # fmt: skip


def _receive(consumer: SimpleConsumer, want: int, invisible_s: int) -> list[Any]:
    got: list[Any] = []
    deadline = time.monotonic() + 25
    while len(got) < want and time.monotonic() < deadline:
        got += consumer.receive(16, invisible_s) or []
    return got


def _refused(consumer: SimpleConsumer, message: Any) -> str | None:
    try:
        consumer.ack(message)
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return None


def main() -> int:
    spec = json.load(sys.stdin)
    config = ClientConfiguration(sys.argv[1], Credentials(), request_timeout=5)
    consumer = SimpleConsumer(
        config, spec["group"], {spec["topic"]: FilterExpression("*")}, await_duration=2
    )
    consumer.startup()
    try:
        first = _receive(consumer, spec["expect"], spec["invisible_s"])
        out: dict[str, Any] = {"first": [_view(m) for m in first]}
        m0 = first[0]
        old = m0.receipt_handle
        consumer.change_invisible_duration(m0, 1)
        new = m0.receipt_handle
        m0.receipt_handle = old
        out["stale_ack"] = _refused(consumer, m0)
        m0.receipt_handle = new
        # the second held-back message comes back after 1 s too, not after the
        # receive's (long) invisible time
        consumer.change_invisible_duration(first[1], 1)
        for m in first[2:]:
            consumer.ack(m)
        again = _receive(consumer, 2, spec["invisible_s"])
        for m in again:
            consumer.ack(m)
        out["again"] = [_view(m) for m in again]
        out["double_ack"] = _refused(consumer, again[0])
    finally:
        consumer.shutdown()
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
