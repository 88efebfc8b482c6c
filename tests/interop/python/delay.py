"""Timer (DELAY) messages and recall with the official RocketMQ 5 Python Producer
(run as a script, never imported: the client registers apache.rocketmq.v2 in
protobuf's pool).

    python delay.py ENDPOINTS < spec.json

``spec.json``: ``{"topic": T, "messages": [{"body": str, "delay_s": int}],
"recall": [index]}``. Sends each message with ``delivery_timestamp`` = now +
``delay_s`` (the client takes whole seconds), then recalls the messages whose
index ``recall`` lists, each twice (the store-node decides whether the
second is taken: docs/timers.md).
Prints one JSON list, per message ``{"message_id", "recall_handle",
"deliver_at_ms", "recalled", "recall_again"}`` (``recalled`` the message id
the recall answered; ``recall_again`` the second recall's error text, null
when it was taken or there was none), or ``{"error": str}`` when its send was refused.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from rocketmq import ClientConfiguration, Credentials, Message, Producer


def _error(e: Exception) -> str:
    return f"{type(e).__name__}: {e}"


def main() -> int:
    spec = json.load(sys.stdin)
    topic = spec["topic"]
    config = ClientConfiguration(sys.argv[1], Credentials(), request_timeout=5)
    producer = Producer(config, (topic,))
    producer.startup()
    out: list[dict[str, Any]] = []
    try:
        for m in spec["messages"]:
            message = Message()
            message.topic = topic
            message.body = m["body"].encode()
            due_s = int(time.time()) + m["delay_s"]
            message.delivery_timestamp = due_s
            try:
                receipt = producer.send(message)
            except Exception as e:
                out.append({"error": _error(e)})
                continue
            out.append({
                "message_id": receipt.message_id, "recall_handle": receipt.recall_handle,
                "deliver_at_ms": due_s * 1000, "recalled": None, "recall_again": None,
            })  # fmt: skip
        for i in spec.get("recall", []):
            entry = out[i]
            entry["recalled"] = producer.recall_message(topic, entry["recall_handle"])
            try:
                producer.recall_message(topic, entry["recall_handle"])
            except Exception as e:
                entry["recall_again"] = _error(e)
    finally:
        producer.shutdown()
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
