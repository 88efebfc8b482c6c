"""A PushConsumer with the official RocketMQ 5 Python client (run as a script,
never imported: the client registers apache.rocketmq.v2 in protobuf's pool).

    python push.py ENDPOINTS < spec.json

``spec.json``: ``{"topic": T, "group": G, "succeed": N, "fail_prefix": P,
"settle_s": S}``. The listener fails every message whose body starts with P
and takes the others; the consumer runs until N messages were taken and then
S seconds more (retries and dead letters happen meanwhile), at most 40 s.
Prints one JSON list: every listener call as ``{"id", "body", "attempt",
"group"}``, in call order.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any

from rocketmq import (
    ClientConfiguration,
    ConsumeResult,
    Credentials,
    FilterExpression,
    MessageListener,
    PushConsumer,
)


class Listener(MessageListener):
    def __init__(self, fail_prefix: str) -> None:
        self.fail_prefix = fail_prefix
        self.calls: list[dict[str, Any]] = []
        self.taken = 0
        self.lock = threading.Lock()

    def consume(self, message: Any) -> ConsumeResult:
        body = message.body.decode()
        with self.lock:
            self.calls.append({"id": message.message_id, "body": body,
                               "attempt": message.delivery_attempt,
                               "group": message.message_group})  # fmt: skip
            if self.fail_prefix and body.startswith(self.fail_prefix):
                return ConsumeResult.FAILURE
            self.taken += 1
            return ConsumeResult.SUCCESS


def main() -> int:
    spec = json.load(sys.stdin)
    listener = Listener(spec["fail_prefix"])
    consumer = PushConsumer(
        ClientConfiguration(sys.argv[1], Credentials(), request_timeout=5),
        spec["group"], listener, {spec["topic"]: FilterExpression("*")},
        consumption_thread_count=4,
    )  # fmt: skip
    consumer.startup()
    try:
        deadline = time.monotonic() + 40
        while listener.taken < spec["succeed"] and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(min(spec["settle_s"], max(0.0, deadline - time.monotonic())))
    finally:
        consumer.shutdown()
    with listener.lock:
        print(json.dumps(listener.calls), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
